//! `headcount exec`: run a command under the member's `(index, replicas)` share, restarting it
//! when the share changes.
//!
//! The command runs only while this member holds a share grant ([`Member::share`]). When the
//! grant stops being valid (the pair changes, or the lease is lost), the command's process group
//! gets SIGTERM, then SIGKILL after `--grace`; only once it is gone is the grant dropped, which
//! is what lets the hand-off proceed. A view change that keeps the pair (only the epoch moves)
//! does not restart the command.
//!
//! A watchdog process runs beside the command, in its process group ([`watchdog`]): exec tells
//! it the lease time left at every check, and when that runs out without news (exec stopped
//! with SIGSTOP, frozen, or gone) it kills the group itself. A paused exec cannot renew, so its
//! lease lapses and another member may start the share: without the watchdog its command would
//! run on beside the new owner's.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::{Duration, SystemTime};

use headcount::recipes::group::{Assignment, Grant, Group, GroupPhase, Member};
use headcount::Error;
use tokio::process::{Child, Command};
use tokio::sync::watch;

use crate::exit::{CliError, EXEC_FAILED, NOT_EXECUTABLE, NOT_FOUND};
use crate::util::{group_config, rfc3339, AssignorArg, Shutdown, UserSignals};

/// How often a running command's grant is re-checked between assignment changes: the lease
/// deadline passes on the local clock without any notification.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// The longest `--grace`: the member's drain timeout (grace plus a heartbeat) must stay within
/// the recipe's one-hour limit.
const MAX_GRACE: Duration = Duration::from_secs(30 * 60);

/// The arguments of `exec`.
#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The group to join.
    #[arg(long, env = "HEADCOUNT_GROUP")]
    pub group: String,
    /// The lease TTL, renewed every TTL/3 [default: 6s].
    #[arg(long, env = "HEADCOUNT_TTL", value_parser = crate::util::parse_duration)]
    pub ttl: Option<Duration>,
    /// The member id (random by default): a restarted member with the same id gets its slot back
    /// if it is still free. In Kubernetes, set HEADCOUNT_MEMBER from the pod name.
    #[arg(long, env = "HEADCOUNT_MEMBER")]
    pub member: Option<String>,
    /// Join a Redis that may evict keys under memory pressure (a `maxmemory` limit with a
    /// `maxmemory-policy` other than `noeviction`), which is refused by default: an evicted lease
    /// lets two members hold one key until the next renewal.
    #[arg(long)]
    pub allow_eviction: bool,
    /// How keys map to slots [default: jumpback]; only the member's own keys depend on it,
    /// `HEADCOUNT_INDEX` does not.
    #[arg(long, value_enum)]
    pub assignor: Option<AssignorArg>,
    /// Append exec's own JSON events (start, stop) to this file instead of stderr; stdout is
    /// the command's alone.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
    /// How long the command has to exit after SIGTERM before its process group gets SIGKILL.
    #[arg(long, default_value = "10s", value_parser = crate::util::parse_duration)]
    pub grace: Duration,
    #[command(flatten)]
    pub lifecycle: crate::lifecycle::LifecycleArgs,
    #[command(flatten)]
    pub metrics: crate::observe::MetricsArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Why a running command was stopped, or stopped by itself.
enum CommandEnd {
    /// The grant stopped being valid: restart under the next one.
    Revoked,
    /// A stop signal to headcount (SIGINT, SIGTERM, SIGHUP, SIGQUIT).
    Signal,
    /// The command exited on its own.
    Exited(ExitStatus),
}

/// Runs the command under the member's share until it exits, or a stop signal (SIGINT,
/// SIGTERM, SIGHUP, SIGQUIT: the command gets SIGTERM and its grace). Everything that can be
/// checked without the group (the group name, member id and TTL, the command exists and is
/// executable, the events file opens) is checked before connecting, so a typo is a usage error
/// even with the store down, and costs the others no view change.
pub async fn exec(url: String, args: ExecArgs) -> Result<ExitCode, CliError> {
    let Some(program) = args.command.first() else {
        return Err(Error::invalid(
            "exec needs a command after `--`: headcount exec --group G -- CMD ARGS...",
        )
        .into());
    };
    if args.grace > MAX_GRACE {
        return Err(
            Error::invalid(format!("--grace {:?} is above {MAX_GRACE:?}", args.grace)).into(),
        );
    }
    let ttl = args.ttl.unwrap_or(crate::util::DEFAULT_GROUP_TTL);
    // The grant is held while the command stops: let the hand-off wait for the whole grace (and
    // a heartbeat to reap it) before the member gives up its lease, instead of one TTL.
    args.lifecycle.check(args.member.as_deref())?;
    let config = args
        .lifecycle
        .configure(group_config(
            &args.group,
            args.ttl,
            args.member.as_deref(),
            args.assignor,
            None,
        ))
        .with_eviction_allowed(args.allow_eviction)
        .with_drain_timeout(ttl.max(args.grace.saturating_add(ttl / 3)));
    config.validate()?;
    check_command(program)?;
    let events = Events::open(args.events.as_deref())?;
    let store = headcount::connect(&url).await?;
    crate::page::install_beside_metrics(&store, &args.group, args.assignor, &args.metrics);
    let mut shutdown = Shutdown::new()?;
    let mut user_signals = UserSignals::new()?;
    let member = Group::join(store, config).await?;
    tracing::info!(member = member.member(), "joined");
    let readiness = crate::lifecycle::Readiness::track(&member, args.lifecycle.ready_file.clone());
    let mut watch = member.watch();
    let event = |kind, a: &Assignment, grant: &Grant, pid, reason, status| {
        events.write(&event_line(
            kind,
            &args.group,
            a,
            grant,
            pid,
            reason,
            status,
        ));
    };
    let code = loop {
        let Some((grant, assignment)) =
            wait_for_share(&member, &mut watch, &mut shutdown, &mut user_signals).await
        else {
            break stopped_code(&member);
        };
        let mut child = match spawn(&args, &assignment, &grant) {
            Ok(child) => child,
            Err(e) => {
                drop(grant);
                let _ = member.leave().await;
                return Err(e);
            }
        };
        let pid = child.id();
        let mut dog = Watchdog::start(pid, &grant);
        event("start", &assignment, &grant, pid, None, None);
        let ended = supervise(
            &mut child,
            &grant,
            &mut dog,
            &mut watch,
            &mut shutdown,
            &mut user_signals,
        )
        .await;
        // A command killed by the watchdog while exec was stopped looks like one that exited by
        // itself: the lapsed lease tells the two apart, and the share is revoked, not left.
        let ended = match ended {
            CommandEnd::Exited(_) if grant.lease_lapsed() => CommandEnd::Revoked,
            other => other,
        };
        let status = match ended {
            CommandEnd::Exited(status) => {
                // The command is gone, but what it started in its group is not: nothing may
                // keep working once the grant is dropped.
                if let Some(pid) = pid {
                    signal_group(pid, Signal::Kill);
                }
                status
            }
            // A lapsed lease (the member could not renew in time) is no cooperative hand-off:
            // the others stop waiting for this grant once the slot expires, so the command
            // gets no grace period. Asked of the grant, not of the member's phase: a member
            // that lapsed and quickly became active again is no longer `rejoining`, but this
            // grant is still the lapsed lease's.
            CommandEnd::Revoked if grant.lease_lapsed() => {
                tracing::warn!("the lease lapsed: stopping the command at once");
                terminate(&mut child, Duration::ZERO, &grant, &mut dog).await
            }
            CommandEnd::Revoked | CommandEnd::Signal => {
                terminate(&mut child, args.grace, &grant, &mut dog).await
            }
        };
        dog.stop().await;
        let reason = match ended {
            CommandEnd::Revoked => "revoked",
            CommandEnd::Signal => "signal",
            CommandEnd::Exited(_) => "exited",
        };
        event("stop", &assignment, &grant, pid, Some(reason), Some(status));
        // Dropping the grant is the acknowledgement: the hand-off may proceed.
        drop(grant);
        match ended {
            CommandEnd::Revoked => continue,
            CommandEnd::Signal => break ExitCode::SUCCESS,
            CommandEnd::Exited(status) => break exit_code(status),
        }
    };
    // The code is decided: the command's own status, 0 after a stop signal, 125 when the
    // member gave up. A failure to leave (the store is down) changes none of them: it is
    // logged, and the others take the slot over when its lease expires.
    drop(readiness);
    if let Err(e) = args.lifecycle.leave(member).await {
        tracing::warn!(
            error = %e,
            "stopped without leaving: the others take the slot over when its lease expires"
        );
    }
    Ok(code)
}

/// Waits for a share grant whose pair the published assignment agrees with; `None` on a
/// signal or when the member gave up. SIGUSR1 and SIGUSR2 meanwhile find no command to pass
/// them on to: they are dropped, not kept for the next command.
async fn wait_for_share(
    member: &Member,
    watch: &mut watch::Receiver<Assignment>,
    shutdown: &mut Shutdown,
    user_signals: &mut UserSignals,
) -> Option<(Grant, Assignment)> {
    loop {
        let assignment = watch.borrow_and_update().clone();
        if matches!(assignment.phase, GroupPhase::Failed | GroupPhase::Stopped) {
            tracing::error!(error = ?assignment.last_error, "the member gave up");
            return None;
        }
        if let Some(grant) = member.share() {
            // The assignment is published just after the state changes: take the pair from it
            // only when it describes the grant's own view.
            if assignment.phase == GroupPhase::Active
                && assignment.epoch == grant.epoch()
                && assignment.index.is_some()
                && grant.is_valid()
            {
                return Some((grant, assignment));
            }
        }
        tokio::select! {
            changed = watch.changed() => {
                if changed.is_err() {
                    return None;
                }
            }
            () = tokio::time::sleep(CHECK_EVERY) => {}
            () = shutdown.recv() => return None,
            sig = user_signals.recv() => {
                tracing::info!(signal = sig, "no command is running to pass the signal on to");
            }
        }
    }
}

/// Waits until the command exits, the grant stops being valid, or a stop signal comes; tells
/// the watchdog the lease time left at every check, and passes SIGUSR1 and SIGUSR2 on to the
/// command's process group.
async fn supervise(
    child: &mut Child,
    grant: &Grant,
    dog: &mut Watchdog,
    watch: &mut watch::Receiver<Assignment>,
    shutdown: &mut Shutdown,
    user_signals: &mut UserSignals,
) -> CommandEnd {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watching = true;
    loop {
        if !grant.is_valid() {
            return CommandEnd::Revoked;
        }
        dog.feed(grant).await;
        tokio::select! {
            status = child.wait() => {
                return match status {
                    Ok(status) => CommandEnd::Exited(status),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot wait for the command");
                        CommandEnd::Revoked
                    }
                };
            }
            changed = watch.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                }
            }
            _ = tick.tick() => {}
            () = shutdown.recv() => return CommandEnd::Signal,
            sig = user_signals.recv() => {
                if let Some(pid) = child.id() {
                    signal_group(pid, Signal::User(sig));
                }
            }
        }
    }
}

/// Where exec's own events go: stderr, or a file opened (appending) before joining.
enum Events {
    Stderr,
    File(std::fs::File, PathBuf),
}

impl Events {
    fn open(path: Option<&Path>) -> Result<Events, CliError> {
        let Some(path) = path else {
            return Ok(Events::Stderr);
        };
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map(|f| Events::File(f, path.to_owned()))
            .map_err(|e| CliError::Exit {
                code: EXEC_FAILED,
                message: format!("cannot open --events {}: {e}", path.display()),
            })
    }

    /// Writes one event line; a failure is logged, never fatal (the command is what matters).
    fn write(&self, line: &serde_json::Value) {
        let written = match self {
            Events::Stderr => writeln!(std::io::stderr().lock(), "{line}"),
            Events::File(file, _) => {
                let mut file: &std::fs::File = file;
                writeln!(file, "{line}")
            }
        };
        if let Err(e) = written {
            let target = match self {
                Events::Stderr => "stderr".to_owned(),
                Events::File(_, path) => path.display().to_string(),
            };
            tracing::warn!(error = %e, %target, "cannot write an exec event");
        }
    }
}

/// Finds `program` as the spawn will (a path, or a search of `PATH`): 127 when it is nowhere,
/// 126 when what is there cannot be executed.
fn check_command(program: &str) -> Result<(), CliError> {
    use std::os::unix::fs::PermissionsExt as _;
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![PathBuf::from(program)]
    } else {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| {
                if dir.as_os_str().is_empty() {
                    PathBuf::from(".").join(program)
                } else {
                    dir.join(program)
                }
            })
            .collect()
    };
    let mut not_executable = None;
    for candidate in candidates {
        match std::fs::metadata(&candidate) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => return Ok(()),
            Ok(_) => {
                not_executable.get_or_insert(candidate);
            }
            Err(_) => {}
        }
    }
    Err(match not_executable {
        Some(path) => CliError::Exit {
            code: NOT_EXECUTABLE,
            message: format!("cannot run `{}`: not an executable file", path.display()),
        },
        None if program.contains('/') => CliError::Exit {
            code: NOT_FOUND,
            message: format!("`{program}` not found"),
        },
        None => CliError::Exit {
            code: NOT_FOUND,
            message: format!("`{program}` not found in PATH"),
        },
    })
}

fn spawn(args: &ExecArgs, a: &Assignment, grant: &Grant) -> Result<Child, CliError> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Error::invalid("exec needs a command after `--`"))?;
    let (index, replicas) = a.pair().unwrap_or((0, 0));
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("HEADCOUNT_INDEX", index.to_string())
        .env("HEADCOUNT_REPLICAS", replicas.to_string())
        .env("HEADCOUNT_EPOCH", grant.epoch().to_string())
        .env("HEADCOUNT_SLOT", grant.slot().to_string())
        .env("HEADCOUNT_MEMBER", &a.member)
        .env("HEADCOUNT_GROUP", &args.group)
        .stdin(Stdio::null())
        // Its own process group, so a stop reaches everything it started, and a terminal's
        // Ctrl-C reaches headcount only (which then stops it in order).
        .process_group(0)
        .kill_on_drop(true);
    #[cfg(target_os = "linux")]
    die_with_parent(&mut command);
    command.spawn().map_err(|e| CliError::Exit {
        code: match e.kind() {
            std::io::ErrorKind::NotFound => NOT_FOUND,
            std::io::ErrorKind::PermissionDenied => NOT_EXECUTABLE,
            _ => EXEC_FAILED,
        },
        message: format!("cannot start `{program}`: {e}"),
    })
}

/// Asks Linux to SIGKILL the command when headcount dies (kill -9, OOM): it must not work on
/// without a grant. The parent is the thread that forks: `exec` runs on the main thread (the
/// future given to `block_on`), which lives as long as the process.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the hook runs between fork and exec and calls only prctl(2) and getppid(2), both
    // async-signal-safe, touching no memory of the parent.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the prctl: exit instead of running orphaned.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::other("headcount exited"));
            }
            Ok(())
        });
    }
}

/// SIGTERM to the command's process group, SIGKILL after `grace`, and a SIGKILL to whatever is
/// left of the group once the command is gone, so nothing it started works on without a grant.
async fn terminate(
    child: &mut Child,
    grace: Duration,
    grant: &Grant,
    dog: &mut Watchdog,
) -> ExitStatus {
    let pid = child.id();
    if let Some(pid) = pid {
        signal_group(pid, Signal::Term);
    }
    // The grace lasts only while the lease does: once it lapses nobody waits for this grant, and
    // the next owner may already run the share.
    let lapsed = async {
        while !grant.lease_lapsed() {
            dog.feed(grant).await;
            tokio::time::sleep(CHECK_EVERY).await;
        }
    };
    let status = tokio::select! {
        waited = tokio::time::timeout(grace, child.wait()) => match waited {
            Ok(Ok(status)) => Some(status),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot wait for the command");
                None
            }
            Err(_) => {
                tracing::warn!(?grace, "the command outlived its grace period: SIGKILL");
                None
            }
        },
        () = lapsed => {
            tracing::warn!("the lease lapsed during the grace period: SIGKILL");
            None
        }
    };
    if let Some(pid) = pid {
        signal_group(pid, Signal::Kill);
    }
    match status {
        Some(status) => status,
        None => {
            let _ = child.start_kill();
            match child.wait().await {
                Ok(status) => status,
                Err(e) => {
                    tracing::error!(error = %e, "cannot reap the command");
                    std::os::unix::process::ExitStatusExt::from_raw(libc::SIGKILL)
                }
            }
        }
    }
}

/// exec's side of the watchdog: the process, and the pipe that tells it the lease time left.
struct Watchdog {
    child: Option<Child>,
    stdin: Option<tokio::process::ChildStdin>,
}

impl Watchdog {
    /// Starts `headcount exec-watchdog` in the process group of the command `pgid` (so a stop
    /// of the command's group reaches it too), with the lease time `grant` has left. A watchdog
    /// that cannot start is logged, not fatal: exec still stops the command itself while it
    /// runs.
    fn start(pgid: Option<u32>, grant: &Grant) -> Watchdog {
        let none = Watchdog {
            child: None,
            stdin: None,
        };
        let Some(pgid) = pgid else { return none };
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(e) => {
                tracing::warn!(error = %e, "cannot find headcount's own binary: no watchdog");
                return none;
            }
        };
        let left = grant.lease_remaining().unwrap_or(Duration::ZERO);
        let spawned = Command::new(exe)
            .arg("exec-watchdog")
            .arg(pgid.to_string())
            .arg(left.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(i32::try_from(pgid).unwrap_or(0))
            .kill_on_drop(true)
            .spawn();
        match spawned {
            Ok(mut child) => Watchdog {
                stdin: child.stdin.take(),
                child: Some(child),
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the watchdog");
                none
            }
        }
    }

    /// Tells the watchdog the lease time left (none once it lapsed: the watchdog then kills at
    /// once, as exec does).
    ///
    /// Never blocks: a watchdog that stopped reading (stopped with the command's group) must not
    /// stop exec's supervision, so a line that does not fit in the pipe is dropped.
    async fn feed(&mut self, grant: &Grant) {
        let Some(stdin) = self.stdin.as_mut() else {
            return;
        };
        let left = grant.lease_remaining().unwrap_or(Duration::ZERO);
        let line = format!("{}\n", left.as_millis());
        use futures::FutureExt as _;
        use tokio::io::AsyncWriteExt as _;
        // One poll: a full pipe answers Pending having written nothing (a line this short is
        // written whole or not at all, PIPE_BUF).
        match stdin.write(line.as_bytes()).now_or_never() {
            None | Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the watchdog is gone");
                self.stdin = None;
            }
        }
    }

    /// Ends the watchdog once the command's group is gone (the group's SIGKILL usually took it
    /// already): kills and reaps it, then closes its pipe.
    async fn stop(&mut self) {
        // Killed before its pipe closes: a closed pipe alone would make it kill the group.
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        self.stdin = None;
    }
}

/// `headcount exec-watchdog PGID LEFT_MS`: kills process group `pgid` when the lease time exec
/// reports runs out without news, or when exec closes the pipe (it died, or its command
/// ended). Each line on stdin is the lease time left in milliseconds, measured by exec just
/// before writing. It ignores SIGTERM, SIGINT and SIGHUP (a stop of the group is exec's
/// SIGTERM to the command, with a grace period the watchdog must not cut short), so it ends
/// with the group's SIGKILL or by itself.
#[allow(unsafe_code)]
pub fn watchdog(pgid: u32, left: Duration) -> ExitCode {
    use std::io::BufRead as _;
    use std::sync::mpsc::{self, RecvTimeoutError};
    use std::time::Instant;
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: signal(2) with SIG_IGN installs no handler and touches no memory of ours.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    let (tx, rx) = mpsc::channel::<Duration>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if let Ok(ms) = line.trim().parse::<u64>() {
                if tx.send(Duration::from_millis(ms)).is_err() {
                    break;
                }
            }
        }
    });
    let mut deadline = Instant::now() + left;
    let mut news = Instant::now();
    let why = loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(left) => {
                news = Instant::now();
                deadline = news + left;
            }
            Err(RecvTimeoutError::Timeout) => break lapse_cause(news.elapsed()),
            Err(RecvTimeoutError::Disconnected) => break "exec closed the pipe".to_owned(),
        }
    };
    let _ = writeln!(
        std::io::stderr(),
        "headcount exec-watchdog: {why}: SIGKILL to the command's process group {pgid}"
    );
    signal_group(pgid, Signal::Kill);
    ExitCode::SUCCESS
}

/// Why the lease ran out, as the watchdog can tell from when exec last reported: recent news
/// means exec was running and counting the lease down (its renewals did not reach the store in
/// time, which exec reports itself); none for longer than exec's reports take means exec is
/// stopped or stuck, which only the watchdog can say.
fn lapse_cause(since_news: Duration) -> String {
    // exec reports every 100 ms; a few missed reports are a busy machine, not a stopped exec.
    if since_news < Duration::from_millis(500) {
        "the lease ran out (renewals did not reach the store in time)".to_owned()
    } else {
        format!(
            "the lease ran out with no news from exec for {} ms (exec is stopped or stuck)",
            since_news.as_millis()
        )
    }
}

#[derive(Debug, Clone, Copy)]
enum Signal {
    Term,
    Kill,
    /// SIGUSR1 or SIGUSR2, passed on.
    User(libc::c_int),
}

/// Sends a signal to the process group `pgid` (the command's pid: it leads its own group).
// `kill(2)` on a process group has no safe std API; the argument is a pid std gave us.
#[allow(unsafe_code)]
fn signal_group(pgid: u32, signal: Signal) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    if pgid <= 1 {
        return;
    }
    let sig = match signal {
        Signal::Term => libc::SIGTERM,
        Signal::Kill => libc::SIGKILL,
        Signal::User(sig) => sig,
    };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::kill(-pgid, sig) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            tracing::warn!(pgid, ?signal, error = %err, "cannot signal the command's group");
        }
    }
}

/// The command's exit code, or 128 + the signal that ended it (as a shell reports it).
fn exit_code(status: ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt as _;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Exit status when the member ended before a command ran: 0 after a signal, 125 (exec's own
/// failure) when it gave up.
fn stopped_code(member: &Member) -> ExitCode {
    if member.assignment().phase == GroupPhase::Failed {
        ExitCode::from(EXEC_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

fn event_line(
    kind: &str,
    group: &str,
    a: &Assignment,
    grant: &Grant,
    pid: Option<u32>,
    reason: Option<&str>,
    status: Option<ExitStatus>,
) -> serde_json::Value {
    use std::os::unix::process::ExitStatusExt as _;
    serde_json::json!({
        "event": kind,
        "group": group,
        "member": a.member,
        "slot": grant.slot(),
        "index": a.index,
        "replicas": a.replicas,
        "epoch": grant.epoch(),
        "pid": pid,
        "reason": reason,
        "code": status.and_then(|s| s.code()),
        "signal": status.and_then(|s| s.signal()),
        "at": rfc3339(SystemTime::now()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lapse_is_blamed_on_exec_only_when_exec_went_quiet() {
        // exec kept reporting while the lease ran down: the store is to blame, not exec.
        let ran_down = lapse_cause(Duration::from_millis(100));
        assert!(!ran_down.contains("stopped"), "{ran_down}");
        assert!(ran_down.contains("renewals"), "{ran_down}");
        let quiet = lapse_cause(Duration::from_millis(850));
        assert!(
            quiet.contains("stopped or stuck") && quiet.contains("850 ms"),
            "{quiet}"
        );
    }
}
