//! The `headcount` command line.

mod demo;
mod distributor;
mod exec;
mod ids;
mod run;
mod status;
mod util;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use headcount::{redact_url, Error};
use headcount_conformance::{Outcome, Report, SuiteOptions};

/// The store used when neither `--store` nor `HEADCOUNT_STORE` is given.
const DEFAULT_STORE: &str = "sqlite://headcount.db";

#[derive(Debug, Parser)]
#[command(
    name = "headcount",
    version,
    about = "Replica index, count and work ownership over the store you already run"
)]
struct Cli {
    /// Store URL: sqlite://path.db, sqlite:///abs/path.db, sqlite::memory:, postgres://user:pass@host:port/db
    /// [default: sqlite://headcount.db; `demo` uses a fresh file in a temp dir]
    #[arg(long, global = true, env = "HEADCOUNT_STORE", hide_env_values = true)]
    store: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Join a group and print one JSON line per change of index, replicas or phase; SIGINT or
    /// SIGTERM leaves the group and exits.
    Run(run::RunArgs),
    /// Run a command with HEADCOUNT_INDEX, HEADCOUNT_REPLICAS and HEADCOUNT_EPOCH of this
    /// member's share; stop it (SIGTERM, then SIGKILL after --grace) and restart it when the
    /// share changes. Exits with the command's code when it exits on its own.
    Exec(exec::ExecArgs),
    /// Show a group's members, leases, published view and ownership of a sample of keys.
    Status(status::StatusArgs),
    /// Peers join in stages, scale up, one leaves, one crashes, while task ids flow to them;
    /// prints progress on stderr and a summary (processed, duplicates, lost, convergence).
    Demo(demo::DemoArgs),
    /// The Distributor (seed 003): match work units to services, ping them every poll interval
    /// (gRPC health checking, or a TTL heartbeat) and redistribute when one fails. With a
    /// command: register a service, run one, manage work units, print the table.
    Distributor(distributor::DistributorArgs),
    /// Monotonically increasing IDs (fencing tokens) agreed by a majority of independent stores
    /// (`--stores`, not `--store`); fails closed without a majority.
    #[command(subcommand)]
    Ids(ids::IdsCommand),
    /// Run the store conformance suite against the store and print a pass/fail table with the
    /// p50/p99 latency of each primitive.
    Conformance {
        /// Print one JSON object per case and per primitive (JSON lines) instead of a table.
        #[arg(long)]
        json: bool,
        /// Run only the cases whose name contains this text.
        #[arg(long)]
        filter: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The distributor logs each change (a service down or back, units moved) at info.
    let default_filter = match cli.command {
        Command::Distributor(_) => "warn,headcount_core=info,headcount=info",
        _ => "warn",
    };
    // Logs on stderr; stdout is reserved for the command's output.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => fail(&e.to_string()),
    }
}

/// Prints one line on stderr and returns the usage/connection error status.
fn fail(message: &str) -> ExitCode {
    eprintln!("headcount: error: {message}");
    ExitCode::from(2)
}

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    let store = cli.store.as_deref();
    match cli.command {
        Command::Conformance { json, filter } => {
            conformance(store.unwrap_or(DEFAULT_STORE), json, filter).await
        }
        Command::Run(args) => {
            let store = headcount::connect(store.unwrap_or(DEFAULT_STORE)).await?;
            run::run(store, args).await
        }
        Command::Exec(args) => {
            let store = headcount::connect(store.unwrap_or(DEFAULT_STORE)).await?;
            exec::exec(store, args).await
        }
        Command::Status(args) => {
            let store = headcount::connect(store.unwrap_or(DEFAULT_STORE)).await?;
            status::status(store, args).await
        }
        Command::Demo(args) => demo::demo(store, args).await,
        Command::Distributor(args) => {
            let store = headcount::connect(store.unwrap_or(DEFAULT_STORE)).await?;
            distributor::distributor(store, args).await
        }
        Command::Ids(command) => ids::ids(command).await,
    }
}

async fn conformance(url: &str, json: bool, filter: Option<String>) -> Result<ExitCode, Error> {
    let store = headcount::connect(url).await?;
    if !json {
        let caps = store.capabilities();
        println!("store: {} ({})", redact_url(url), caps.backend);
    }
    let report = headcount_conformance::run_suite(
        store,
        SuiteOptions {
            filter,
            ..SuiteOptions::default()
        },
    )
    .await;
    if json {
        print_json(&report);
    } else {
        print_table(&report);
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_json(report: &Report) {
    for case in &report.cases {
        let (outcome, detail) = outcome_parts(&case.outcome);
        let line = serde_json::json!({
            "type": "case",
            "case": case.name,
            "outcome": outcome,
            "detail": detail,
            "ms": millis(case.duration),
        });
        println!("{line}");
    }
    for p in &report.latency {
        let line = serde_json::json!({
            "type": "latency",
            "primitive": p.primitive,
            "calls": p.calls,
            "p50_us": p.p50.as_micros(),
            "p99_us": p.p99.as_micros(),
        });
        println!("{line}");
    }
    let (passed, failed, skipped) = counts(report);
    println!(
        "{}",
        serde_json::json!({"type": "summary", "passed": passed, "failed": failed, "skipped": skipped})
    );
}

fn print_table(report: &Report) {
    let width = report
        .cases
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!();
    println!("{:<width$}  {:<6}  {:>9}  detail", "case", "result", "time");
    for case in &report.cases {
        let (outcome, detail) = outcome_parts(&case.outcome);
        println!(
            "{:<width$}  {:<6}  {:>7.1}ms  {}",
            case.name,
            outcome,
            millis(case.duration),
            detail.unwrap_or("")
        );
    }
    println!();
    println!(
        "{:<16}  {:>7}  {:>10}  {:>10}",
        "primitive", "calls", "p50", "p99"
    );
    for p in &report.latency {
        println!(
            "{:<16}  {:>7}  {:>8.3}ms  {:>8.3}ms",
            p.primitive,
            p.calls,
            millis(p.p50),
            millis(p.p99)
        );
    }
    let (passed, failed, skipped) = counts(report);
    println!();
    println!("{passed} passed, {failed} failed, {skipped} skipped");
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
