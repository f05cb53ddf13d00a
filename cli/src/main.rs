//! The `headcount` command line.

#[macro_use]
mod exit;
mod demo;
mod distributor;
mod exec;
mod http;
mod ids;
mod lifecycle;
mod observe;
mod page;
mod run;
mod status;
mod timeline;
mod util;

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use headcount::redact_url;
use headcount_conformance::{Outcome, Report, SuiteOptions};

use crate::exit::{emit, CliError};

/// The store used when neither `--store` nor `HEADCOUNT_STORE` is given (see [`store_url`]).
const DEFAULT_STORE: &str = "sqlite://headcount.db";

/// Replica index, count and work ownership over the store you already run.
#[derive(Debug, Parser)]
#[command(name = "headcount", after_help = exit::EXIT_CODES_HELP)]
struct Cli {
    /// Store URL: sqlite://PATH.db, sqlite::memory:, postgres://, redis://, rediss://,
    /// redis+cluster://, redis+sentinel://, etcd://, memory://
    ///
    /// The store URL, by scheme: sqlite://relative/path.db, sqlite:///absolute/path.db,
    /// sqlite::memory: (this process only); postgres://user:password@host:5432/db (or
    /// postgresql://); redis://:password@host:6379/0, rediss://host:6380 (TLS),
    /// redis+cluster://h1:7000,h2:7001 (or rediss+cluster://);
    /// redis+sentinel://s1:26379,s2:26379/mymaster (or rediss+sentinel://); etcd://h1:2379,h2:2379 (or
    /// etcds://; needs the `etcd` build feature); memory:// (this process only). `--version`
    /// lists the backends of this build.
    ///
    /// run, exec and distributor refuse to start without a store when stdin is not a terminal
    /// (a service manager or a container): the fallback, sqlite://headcount.db in the current
    /// directory, is shared only by processes on one machine, and a fleet would see every
    /// instance as 1 of 1. From a terminal they warn and use it; pass
    /// `--store sqlite://headcount.db` to choose it explicitly. `demo` uses a fresh file in a
    /// temporary directory.
    #[arg(
        long,
        global = true,
        env = "HEADCOUNT_STORE",
        hide_env_values = true,
        value_name = "URL"
    )]
    store: Option<String>,

    /// Log lines on stderr as `text` or `json` (one object per line) [default: text]
    #[arg(
        long,
        global = true,
        env = "HEADCOUNT_LOG_FORMAT",
        value_name = "text|json"
    )]
    log_format: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Join a group; print one JSON line per change of index, replicas or phase
    ///
    /// Join a group and print one JSON line per change of index, replicas or phase; SIGINT,
    /// SIGTERM, SIGHUP or SIGQUIT leaves the group and exits 0 (SIGUSR1/SIGUSR2 are ignored).
    ///
    /// A line with a non-null `index` is printed only once the member holds that
    /// (index, replicas) share, and the share is held until the next line: no two members'
    /// newest lines claim overlapping modulo shares (task t belongs to index
    /// t % replicas + 1). Work on the newest line's pair; stop at a line whose index is null.
    Run(run::RunArgs),
    /// Run a command with this member's HEADCOUNT_INDEX/REPLICAS/EPOCH; restart it on a change
    ///
    /// Run a command with HEADCOUNT_INDEX, HEADCOUNT_REPLICAS and HEADCOUNT_EPOCH of this
    /// member's share; stop it (SIGTERM, then SIGKILL after --grace) and restart it when the
    /// share changes. Exits with the command's code when it exits on its own. Its own events
    /// go to stderr (or --events FILE), never into the command's stdout.
    Exec(exec::ExecArgs),
    /// Show a group's members, leases, published view and key ownership
    ///
    /// Show a group's members, leases, published view, ownership of a sample of keys and, with
    /// `--key`, the owner of each key named. It only reads: a store that does not exist yet (a
    /// missing SQLite file) is an error.
    Status(status::StatusArgs),
    /// Delete a stopped group's keys (its view, settled mark and acknowledgements)
    ///
    /// Delete what a group leaves behind once every member has stopped: the published view, the
    /// settled mark and the acknowledgements (slot records expire with their leases). Refuses,
    /// with status 1, while any member is live. A group joined again afterwards starts at epoch
    /// 1, so fencing tokens start over.
    RemoveGroup(status::RemoveGroupArgs),
    /// Peers join, scale, leave, crash and pause while tasks flow; print a summary
    ///
    /// Peers join in stages, scale up, one leaves, one crashes, one pauses past its lease,
    /// while task ids flow to them; prints progress on stderr and a summary (processed,
    /// duplicates, lost, convergence).
    Demo(demo::DemoArgs),
    /// The Distributor: match work units to services, ping them, redistribute on failure
    ///
    /// The Distributor: match work units to services, ping them every poll interval
    /// (gRPC health checking, or a TTL heartbeat) and redistribute when one fails. With a
    /// command: register a service, run one, manage work units, print the table.
    Distributor(distributor::DistributorArgs),
    /// Monotonic IDs (fencing tokens) agreed by a majority of independent stores
    ///
    /// Monotonically increasing IDs (fencing tokens) agreed by a majority of independent stores
    /// (`--stores`, not `--store`); fails closed without a majority.
    #[command(subcommand)]
    Ids(ids::IdsCommand),
    /// Run the store conformance suite against the store; print pass/fail and latencies
    ///
    /// Run the store conformance suite against the store and print a pass/fail table with the
    /// p50/p99 latency of each primitive. A --filter that matches no case is a usage error.
    Conformance {
        /// Print one JSON object per case and per primitive (JSON lines) instead of a table.
        #[arg(long)]
        json: bool,
        /// Run only the cases whose name contains this text.
        #[arg(long)]
        filter: Option<String>,
    },
    /// The watchdog `exec` starts beside its command (internal): kills the command's process
    /// group when exec stops reporting a live lease.
    #[command(name = "exec-watchdog", hide = true)]
    ExecWatchdog {
        /// The command's process group.
        pgid: u32,
        /// Milliseconds of lease left when it starts.
        left_ms: u64,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    ///
    /// Print a completion script for SHELL on stdout, e.g.
    /// `headcount completions bash > ~/.local/share/bash-completion/completions/headcount`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The backends compiled into this build, for `--version`.
fn version() -> String {
    let mut on = Vec::new();
    let mut off = Vec::new();
    for (enabled, name) in [
        (cfg!(feature = "sqlite"), "sqlite"),
        (cfg!(feature = "postgres"), "postgres"),
        (
            cfg!(feature = "redis"),
            "redis (rediss, redis+cluster, redis+sentinel)",
        ),
        (cfg!(feature = "etcd"), "etcd"),
    ] {
        if enabled {
            on.push(name);
        } else {
            off.push(name);
        }
    }
    on.push("memory");
    let mut text = format!("{}\nbackends: {}", env!("CARGO_PKG_VERSION"), on.join(", "));
    if !off.is_empty() {
        text.push_str(&format!(
            "\nnot in this build: {} (cargo features of the same names, or `full`)",
            off.join(", ")
        ));
    }
    text
}

/// The clap command with the runtime parts (the version text).
fn cli_command() -> clap::Command {
    Cli::command()
        .version(version())
        .mut_subcommands(|sub| sub.after_help(exit::EXIT_CODES_HELP))
}

fn main() -> ExitCode {
    // Before clap: its own errors are printed in the chosen format too.
    exit::json_lines(json_asked_for());
    let cli = match cli_command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => return clap_error(&e),
    };
    // The distributor logs each change (a service down or back, units moved) at info.
    let default_filter = match cli.command {
        Command::Distributor(_) => "warn,headcount_core=info,headcount=info",
        _ => "warn",
    };
    if let Command::ExecWatchdog { pgid, left_ms } = cli.command {
        return exec::watchdog(pgid, Duration::from_millis(left_ms));
    }
    let is_exec = matches!(cli.command, Command::Exec(_));
    let log_format = match observe::LogFormat::parse(cli.log_format.as_deref()) {
        Ok(f) => f,
        Err(e) => {
            let code = if is_exec {
                exit::EXEC_FAILED
            } else {
                exit::USAGE
            };
            exit::json_lines(false);
            exit::print_error(&e, code);
            return ExitCode::from(code);
        }
    };
    exit::json_lines(log_format == observe::LogFormat::Json);
    // Logs on stderr; stdout is reserved for the command's output. No colours when stderr is
    // not a terminal. The metrics line says where the endpoint listens (port 0 picks one).
    let default_filter = format!("{default_filter},{}=info", observe::METRICS_LOG_TARGET);
    observe::init_logging(log_format, &default_filter);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return exit::report(
                &CliError::Exit {
                    code: exit::FAILURE,
                    message: format!("cannot start the async runtime: {e}"),
                },
                is_exec,
            )
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => exit::report(&e, is_exec),
    }
}

/// Prints a clap error in our one-line format (help and version as clap prints them), with the
/// status of a usage error (125 for `exec`, as `env` does).
fn clap_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind as K;
    match e.kind() {
        K::DisplayHelp | K::DisplayVersion => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        K::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(exit::USAGE);
        }
        _ => {}
    }
    let sub = subcommand_in_args();
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("invalid usage");
    let mut message = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    for line in text.lines().map(str::trim) {
        if let Some(tip) = line.strip_prefix("tip: ") {
            message.push_str("; ");
            message.push_str(tip);
        } else if line.starts_with("[possible values") {
            message.push(' ');
            message.push_str(line);
        }
    }
    match &sub {
        Some(sub) => message.push_str(&format!(" (see `headcount {sub} --help`)")),
        None => message.push_str(" (see `headcount --help`)"),
    }
    let exec = sub.as_deref() == Some("exec");
    let code = if exec { exit::EXEC_FAILED } else { exit::USAGE };
    exit::print_error(&message, code);
    ExitCode::from(code)
}

/// Whether `--log-format json` (or `HEADCOUNT_LOG_FORMAT=json`) is asked for, found without
/// clap, for the lines printed before clap has parsed the command line (or when it fails to).
fn json_asked_for() -> bool {
    let mut asked = std::env::var("HEADCOUNT_LOG_FORMAT").is_ok_and(|v| v.trim() == "json");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            // What follows is `exec`'s command's.
            "--" => break,
            "--log-format" => asked = args.next().is_some_and(|v| v.trim() == "json"),
            _ => {
                if let Some(v) = arg.strip_prefix("--log-format=") {
                    asked = v.trim() == "json";
                }
            }
        }
    }
    asked
}

/// The subcommand named on the command line, found without clap (which just failed).
fn subcommand_in_args() -> Option<String> {
    let names: Vec<String> = Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--" {
            return None;
        }
        if arg == "--store" {
            args.next();
            continue;
        }
        if arg.starts_with('-') {
            continue;
        }
        return names.contains(&arg).then_some(arg);
    }
    None
}

/// The store URL of a command: `--store`, else `HEADCOUNT_STORE` (clap reads both), else the
/// local default. Where a fleet would silently split into instances that each see "1 of 1"
/// (`service`), the default is refused when stdin is not a terminal, and announced loudly when
/// it is.
fn store_url(store: Option<&str>, service: bool) -> Result<String, CliError> {
    if let Some(url) = store {
        return Ok(url.to_owned());
    }
    if service && !std::io::stdin().is_terminal() {
        return Err(CliError::usage(format!(
            "no store given (--store URL or HEADCOUNT_STORE) and stdin is not a terminal: \
             refusing the local default {DEFAULT_STORE}, which every instance on another \
             machine would not share (each would be 1 of 1); pass --store {DEFAULT_STORE} to \
             mean it"
        )));
    }
    if service {
        exit::print_warning(&format!(
            "no --store or HEADCOUNT_STORE: using {DEFAULT_STORE} in the current directory. \
             Only processes on this machine, in this directory, share it: instances elsewhere \
             will each be 1 of 1 and do all the work."
        ));
    } else {
        exit::print_warning(&format!(
            "no --store or HEADCOUNT_STORE: using {DEFAULT_STORE} in the current directory"
        ));
    }
    Ok(DEFAULT_STORE.to_owned())
}

async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let store = cli.store.as_deref();
    // Before anything touches the store: an address in use fails the command with no effect.
    let metrics = match &cli.command {
        Command::Run(a) => &a.metrics,
        Command::Exec(a) => &a.metrics,
        Command::Distributor(a) => &a.metrics,
        Command::Ids(ids::IdsCommand::Next(a)) => &a.metrics,
        Command::Ids(ids::IdsCommand::Serve(a)) => &a.metrics,
        _ => &observe::MetricsArgs::default(),
    };
    if let Some(addr) = &metrics.metrics_addr {
        observe::serve_metrics(addr).await?;
    }
    match cli.command {
        Command::Conformance { json, filter } => {
            conformance(&store_url(store, false)?, json, filter).await
        }
        Command::Run(args) => {
            run::check(&args)?;
            let store = headcount::connect(&store_url(store, true)?).await?;
            run::run(store, args).await
        }
        Command::Exec(args) => exec::exec(store_url(store, true)?, args).await,
        Command::Status(args) => {
            let declared = status::check(&args)?;
            let url = util::read_only(&store_url(store, false)?);
            let store = headcount::connect(&url).await?;
            status::status(store, args, declared).await
        }
        Command::RemoveGroup(args) => {
            headcount::validate_group(&args.group)?;
            let store = headcount::connect(&store_url(store, false)?).await?;
            status::remove_group(store, args).await
        }
        Command::Demo(args) => demo::demo(store, args).await,
        Command::Distributor(args) => {
            let read_only = args.is_read_only();
            args.check()?;
            let url = store_url(store, !read_only)?;
            let url = if read_only {
                util::read_only(&url)
            } else {
                url
            };
            let store = headcount::connect(&url).await?;
            distributor::distributor(store, args).await
        }
        Command::Ids(command) => ids::ids(command).await,
        // Handled in `main`, before the runtime starts.
        Command::ExecWatchdog { pgid, left_ms } => {
            Ok(exec::watchdog(pgid, Duration::from_millis(left_ms)))
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cli_command(), "headcount", &mut script);
            exit::emit_raw(&script)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn conformance(url: &str, json: bool, filter: Option<String>) -> Result<ExitCode, CliError> {
    let store = headcount::connect(url).await?;
    if !json {
        let caps = store.capabilities();
        emit!("store: {} ({})", redact_url(url), caps.backend)?;
    }
    let report = headcount_conformance::run_suite(
        store,
        SuiteOptions {
            filter: filter.clone(),
            ..SuiteOptions::default()
        },
    )
    .await;
    if report.cases.is_empty() {
        return Err(CliError::usage(format!(
            "--filter {:?} matches no conformance case",
            filter.unwrap_or_default()
        )));
    }
    if json {
        print_json(&report)?;
    } else {
        print_table(&report)?;
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::FAILURE)
    })
}

fn print_json(report: &Report) -> Result<(), CliError> {
    for case in &report.cases {
        let (outcome, detail) = outcome_parts(&case.outcome);
        let line = serde_json::json!({
            "type": "case",
            "case": case.name,
            "outcome": outcome,
            "detail": detail,
            "ms": millis(case.duration),
        });
        emit(line)?;
    }
    for p in &report.latency {
        let line = serde_json::json!({
            "type": "latency",
            "primitive": p.primitive,
            "calls": p.calls,
            "p50_us": p.p50.as_micros(),
            "p99_us": p.p99.as_micros(),
        });
        emit(line)?;
    }
    let (passed, failed, skipped) = counts(report);
    emit(
        serde_json::json!({"type": "summary", "passed": passed, "failed": failed, "skipped": skipped}),
    )
}

fn print_table(report: &Report) -> Result<(), CliError> {
    let width = report
        .cases
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    emit("")?;
    emit!("{:<width$}  {:<6}  {:>9}  detail", "case", "result", "time")?;
    for case in &report.cases {
        let (outcome, detail) = outcome_parts(&case.outcome);
        emit!(
            "{:<width$}  {:<6}  {:>7.1}ms  {}",
            case.name,
            outcome,
            millis(case.duration),
            detail.unwrap_or("")
        )?;
    }
    emit("")?;
    emit!(
        "{:<16}  {:>7}  {:>10}  {:>10}",
        "primitive",
        "calls",
        "p50",
        "p99"
    )?;
    for p in &report.latency {
        emit!(
            "{:<16}  {:>7}  {:>8.3}ms  {:>8.3}ms",
            p.primitive,
            p.calls,
            millis(p.p50),
            millis(p.p99)
        )?;
    }
    let (passed, failed, skipped) = counts(report);
    emit("")?;
    emit!("{passed} passed, {failed} failed, {skipped} skipped")
}

fn outcome_parts(outcome: &Outcome) -> (&'static str, Option<&str>) {
    match outcome {
        Outcome::Passed => ("pass", None),
        Outcome::Failed(why) => ("FAIL", Some(why.as_str())),
        Outcome::Skipped(why) => ("skip", Some(why.as_str())),
    }
}

fn counts(report: &Report) -> (usize, usize, usize) {
    let mut c = (0, 0, 0);
    for case in &report.cases {
        match case.outcome {
            Outcome::Passed => c.0 += 1,
            Outcome::Failed(_) => c.1 += 1,
            Outcome::Skipped(_) => c.2 += 1,
        }
    }
    c
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
