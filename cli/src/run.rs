//! `headcount run`: join a group and print one JSON line per change.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use headcount::recipes::group::{Assignment, Grant, Group, GroupPhase};
use headcount::recipes::interval::{IntervalConfig, IntervalIndexer};
use headcount::recipes::{IntervalPhase, IntervalStatus};
use headcount::{DynStore, Error};

use crate::exit::{emit, CliError};
use crate::util::{group_config, rfc3339, AssignorArg, Shutdown};

/// The interval of `--mode interval` when `--interval` is not given.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// How `run` coordinates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Group membership: stable slots held with a lease, epochs minted by the store (default).
    Group,
    /// The interval indexer of the "Distributed Peer Indexing" articles, with the safe transition.
    Interval,
}

/// The arguments of `run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The group to join.
    #[arg(long, env = "HEADCOUNT_GROUP")]
    pub group: String,
    /// How to coordinate.
    #[arg(long, value_enum, default_value = "group")]
    pub mode: Mode,
    /// The interval of `--mode interval` (500ms, 5s, 1m...) [default: 5s].
    #[arg(long, value_parser = crate::util::parse_duration)]
    pub interval: Option<Duration>,
    /// The lease TTL of `--mode group`, renewed every TTL/3 [default: 6s].
    #[arg(long, env = "HEADCOUNT_TTL", value_parser = crate::util::parse_duration)]
    pub ttl: Option<Duration>,
    /// How `--mode group` maps keys to slots [default: jumpback]; every member of a group must
    /// use the same one.
    #[arg(long, value_enum)]
    pub assignor: Option<AssignorArg>,
    /// Declares N partitions, named 0 to N-1, and assigns them with the sticky assignor
    /// (shares within one of each other, and the fewest moves that allows on a change); each
    /// line then lists the partitions this member owns. Every member of the group must give
    /// the same N.
    #[arg(long, value_name = "N", conflicts_with = "assignor")]
    pub partitions: Option<u32>,
    /// This peer's capacity in `--mode interval`: a peer of capacity 2 owns twice the share
    /// [default: 1].
    #[arg(long)]
    pub capacity: Option<u32>,
    /// The member id (random by default); in group mode a restarted member with the same id
    /// gets its slot back if it is still free. In Kubernetes, set HEADCOUNT_MEMBER from the pod
    /// name.
    #[arg(long, env = "HEADCOUNT_MEMBER")]
    pub member: Option<String>,
    /// Join a Redis that may evict keys under memory pressure (a `maxmemory` limit with a
    /// `maxmemory-policy` other than `noeviction`), which is refused by default: an evicted lease
    /// lets two members hold one key until the next renewal.
    #[arg(long)]
    pub allow_eviction: bool,
    #[command(flatten)]
    pub lifecycle: crate::lifecycle::LifecycleArgs,
    #[command(flatten)]
    pub metrics: crate::observe::MetricsArgs,
}

/// Refuses the flags of the other mode and checks the configuration (group name, member id,
/// TTL or interval), before any store is opened: a usage error stays one when the store is down.
pub fn check(args: &RunArgs) -> Result<(), Error> {
    match args.mode {
        Mode::Group => {
            refuse(
                &[
                    (args.interval.is_some(), "--interval"),
                    (args.capacity.is_some(), "--capacity"),
                ],
                "applies to --mode interval; group mode takes --ttl",
            )?;
            args.lifecycle.check(args.member.as_deref())?;
            group_mode_config(args).validate()
        }
        Mode::Interval => {
            refuse(
                &[
                    (args.ttl.is_some(), "--ttl (or HEADCOUNT_TTL)"),
                    (args.assignor.is_some(), "--assignor"),
                    (args.partitions.is_some(), "--partitions"),
                    (args.allow_eviction, "--allow-eviction"),
                    (
                        args.lifecycle.on_stop != crate::lifecycle::OnStop::Leave,
                        "--on-stop (or HEADCOUNT_ON_STOP)",
                    ),
                    (
                        args.lifecycle.restart_window.is_some(),
                        "--restart-window (or HEADCOUNT_RESTART_WINDOW)",
                    ),
                    (
                        args.lifecycle.ready_file.is_some(),
                        "--ready-file (or HEADCOUNT_READY_FILE)",
                    ),
                    (
                        args.lifecycle.standby_for.is_some(),
                        "--standby-for (or HEADCOUNT_STANDBY_FOR)",
                    ),
                    (
                        args.lifecycle.crash_grace.is_some(),
                        "--crash-grace (or HEADCOUNT_CRASH_GRACE)",
                    ),
                    (
                        args.lifecycle.outage_grace.is_some(),
                        "--outage-grace (or HEADCOUNT_OUTAGE_GRACE)",
                    ),
                ],
                "applies to --mode group; the interval indexer's keys live three intervals",
            )?;
            interval_config(args).validate()
        }
    }
}

/// The group's configuration of `run` in group mode.
fn group_mode_config(args: &RunArgs) -> headcount::recipes::group::GroupConfig {
    let config = group_config(
        &args.group,
        args.ttl,
        args.member.as_deref(),
        args.assignor,
        args.partitions,
    );
    args.lifecycle
        .configure(config)
        .with_eviction_allowed(args.allow_eviction)
}

/// The interval indexer's configuration of `run --mode interval`.
fn interval_config(args: &RunArgs) -> IntervalConfig {
    let mut config = IntervalConfig::new(
        args.group.clone(),
        args.interval.unwrap_or(DEFAULT_INTERVAL),
    )
    .with_capacity(args.capacity.unwrap_or(1));
    if let Some(member) = &args.member {
        config = config.with_member(member.clone());
    }
    config
}

/// Joins and prints one line per change until a stop signal (see [`Shutdown`]), then leaves. A
/// closed stdout
/// ends it the same way (quietly); another write error after leaving, with status 1.
pub async fn run(store: DynStore, args: RunArgs) -> Result<ExitCode, CliError> {
    match args.mode {
        Mode::Group => run_group(store, args).await,
        Mode::Interval => run_interval(store, args).await,
    }
}

/// The first given flag of `flags` as an error: it belongs to the other mode.
fn refuse(flags: &[(bool, &str)], why: &str) -> Result<(), Error> {
    match flags.iter().find(|(given, _)| *given) {
        Some((_, flag)) => Err(Error::invalid(format!("{flag} {why}"))),
        None => Ok(()),
    }
}

async fn run_group(store: DynStore, args: RunArgs) -> Result<ExitCode, CliError> {
    let mut shutdown = Shutdown::new()?;
    let config = group_mode_config(&args);
    crate::page::install_beside_metrics(&store, &args.group, args.assignor, &args.metrics);
    let member = match Group::join(store, config).await {
        Ok(member) => member,
        Err(e) => {
            // A member that cannot join for a store's reason (its id is in use, the group is
            // full, the store is down) says so on stdout too, like one that gives up later.
            if crate::exit::code_of(&e) != crate::exit::USAGE {
                let failed = Assignment {
                    member: args.member.clone().unwrap_or_default(),
                    slot: None,
                    index: None,
                    replicas: 0,
                    epoch: 0,
                    live: Vec::new(),
                    phase: GroupPhase::Failed,
                    last_error: Some(e.to_string()),
                };
                let _ = emit(group_line(&args.group, &failed, None));
            }
            return Err(e.into());
        }
    };
    tracing::info!(member = member.member(), "joined");
    let readiness = crate::lifecycle::Readiness::track(&member, args.lifecycle.ready_file.clone());
    let mut watch = member.watch();
    let mut output = Ok(());
    // The share grant of the pair the last line printed: held until the next line is printed,
    // so the hand-off that moves the pair (or part of it) to another member waits for that line.
    let mut held: Option<Grant> = None;
    let mut last_line: Option<serde_json::Value> = None;
    let ended = loop {
        let assignment = watch.borrow_and_update().clone();
        let keep = held.as_ref().is_some_and(Grant::is_valid);
        let fresh = if keep {
            None
        } else {
            member.share().filter(|g| {
                assignment.phase == GroupPhase::Active
                    && assignment.index.is_some()
                    && g.epoch() == assignment.epoch
                    && g.is_valid()
            })
        };
        let holds = keep || fresh.is_some();
        let owned = args.partitions.map(|n| {
            (0..n)
                .filter(|p| member.would_grant(p.to_string()).is_some())
                .collect::<Vec<u32>>()
        });
        // An active member whose share is not held (yet, or any more) is in a hand-off.
        let shown = Assignment {
            index: assignment.index.filter(|_| holds),
            phase: match assignment.phase {
                GroupPhase::Active if !holds => GroupPhase::Handoff,
                phase => phase,
            },
            ..assignment.clone()
        };
        let line = group_line(&args.group, &shown, owned);
        if last_line.as_ref() != Some(&without_time(&line)) {
            output = emit(line.clone());
            if output.is_err() {
                break RunEnd::Output;
            }
            last_line = Some(without_time(&line));
        }
        // Only now, after the line that says so, is a grant of a pair no longer shown let go.
        if !keep {
            held = fresh;
        }
        if assignment.phase == GroupPhase::Failed {
            break RunEnd::Failed;
        }
        // A share not granted yet (the pair's previous holders are finishing) is asked for
        // again every SHARE_CHECK. A held one is watched by its `revoked()`, which also wakes at
        // the lease's deadline on this process's clock (at once for a process resumed after a
        // SIGSTOP, within a quarter second of a host's resume), so a held share costs no
        // wake-ups of its own; but with `--partitions` the line's partitions can change under a
        // held share (a view adopted during a hand-off moves keys and keeps the pair, and the
        // assignment does not change), so they are looked at again every SHARE_CHECK.
        let waiting = assignment.phase == GroupPhase::Active && !holds;
        let recount = held.is_some() && args.partitions.is_some();
        tokio::select! {
            changed = watch.changed() => {
                if changed.is_err() {
                    break RunEnd::Failed;
                }
            }
            () = async {
                match &held {
                    Some(g) => g.revoked().await,
                    None => std::future::pending().await,
                }
            } => {}
            () = tokio::time::sleep(SHARE_CHECK), if waiting || recount => {}
            () = shutdown.recv() => break RunEnd::Signal,
        }
    };
    // A member that showed a pair says it stops using it before it lets the share go and
    // leaves: the others may take the pair as soon as it left.
    if held.is_some() && output.is_ok() {
        let mut line = group_line(&args.group, &member.assignment(), None);
        line["index"] = serde_json::Value::Null;
        line["phase"] = "leaving".into();
        if args.partitions.is_some() {
            line["partitions"] = serde_json::json!([]);
        }
        output = emit(line);
    }
    drop(held);
    let last = member.assignment();
    // Not ready from the moment it stops: a probe must not send work to a member leaving.
    drop(readiness);
    let left = args.lifecycle.leave(member).await;
    output?;
    let error = match &left {
        Err(e) => Some(e.to_string()),
        Ok(()) => last.last_error.clone(),
    };
    emit(group_line(
        &args.group,
        &Assignment {
            phase: GroupPhase::Stopped,
            index: None,
            last_error: error,
            ..last
        },
        args.partitions.map(|_| Vec::new()),
    ))?;
    match ended {
        RunEnd::Signal => stopped_anyway(left),
        RunEnd::Output | RunEnd::Failed => left?,
    }
    Ok(if ended == RunEnd::Failed {
        ExitCode::from(crate::exit::FAILURE)
    } else {
        ExitCode::SUCCESS
    })
}

/// How often `run` asks again for a share not granted yet (its previous holders are finishing),
/// and, with `--partitions`, looks again at the partitions of a share it holds.
const SHARE_CHECK: Duration = Duration::from_millis(100);

/// A line without its `at`, to tell whether anything else changed.
fn without_time(line: &serde_json::Value) -> serde_json::Value {
    let mut line = line.clone();
    if let Some(o) = line.as_object_mut() {
        o.remove("at");
    }
    line
}

/// Why `run` stopped following the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunEnd {
    /// A stop signal: the stop was asked for.
    Signal,
    /// Stdout failed (closed by its reader, or full).
    Output,
    /// The member gave up.
    Failed,
}

/// After a stop that was asked for, a failure to leave (the store is down) is logged, not the
/// command's failure: the process did stop, and a supervisor that sees a "retry" status for
/// it would start it again. The others take the slot over when its lease expires.
fn stopped_anyway(left: Result<(), Error>) {
    if let Err(e) = left {
        tracing::warn!(
            error = %e,
            "stopped without leaving: the others take the slot over when its lease expires"
        );
    }
}

/// One line of `run --mode group`, with the partitions owned under `--partitions`.
fn group_line(group: &str, a: &Assignment, partitions: Option<Vec<u32>>) -> serde_json::Value {
    let mut line = serde_json::json!({
        "group": group,
        "member": a.member,
        "mode": "group",
        "slot": a.slot,
        "index": a.index,
        "replicas": a.replicas,
        "epoch": a.epoch,
        "live": a.live.len(),
        "phase": a.phase.as_str(),
        "at": rfc3339(SystemTime::now()),
        "error": a.last_error,
    });
    if let Some(owned) = partitions {
        line["partitions"] = owned.into();
    }
    line
}

async fn run_interval(store: DynStore, args: RunArgs) -> Result<ExitCode, CliError> {
    let mut shutdown = Shutdown::new()?;
    let peer = IntervalIndexer::join(store, interval_config(&args)).await?;
    tracing::info!(member = peer.member(), skew = ?peer.skew(), "joined");
    let mut watch = peer.watch();
    let mut last_printed = None;
    let mut output = Ok(());
    let mut asked = false;
    loop {
        let status = watch.borrow_and_update().clone();
        let key = (status.pair.map(|p| (p.index, p.replicas)), status.phase);
        if last_printed != Some(key) {
            let live = peer.live_peers().await.map(|l| l.len()).ok();
            output = emit(interval_line(&args.group, &status, live));
            if output.is_err() {
                break;
            }
            last_printed = Some(key);
        }
        tokio::select! {
            changed = watch.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            () = shutdown.recv() => {
                asked = true;
                break;
            }
        }
    }
    let member = peer.member().to_owned();
    let last = peer.status();
    let stopped = peer.leave().await;
    output?;
    emit(interval_line(
        &args.group,
        &IntervalStatus {
            member,
            phase: IntervalPhase::Stopped,
            ..last
        },
        None,
    ))?;
    if asked {
        stopped_anyway(stopped);
    } else {
        stopped?;
    }
    Ok(ExitCode::SUCCESS)
}

fn interval_line(group: &str, status: &IntervalStatus, live: Option<usize>) -> serde_json::Value {
    let pair = status.pair;
    serde_json::json!({
        "group": group,
        "member": status.member,
        "mode": "interval",
        "index": pair.map(|p| p.index),
        "replicas": pair.map(|p| p.replicas),
        // The pair's epoch, and apart from it the interval number: one field for each.
        "epoch": pair.map(|p| p.epoch),
        "tick": status.last_tick,
        "live": live,
        "at": rfc3339(SystemTime::now()),
        "phase": status.phase.as_str(),
        "error": status.last_error,
    })
}
