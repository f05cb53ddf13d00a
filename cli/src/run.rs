//! `headcount run`: join a group and print one JSON line per change.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use headcount::recipes::interval::{IntervalConfig, IntervalIndexer};
use headcount::recipes::{IntervalStatus, Phase};
use headcount::{DynStore, Error};

use crate::util::rfc3339;

/// How `run` coordinates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Group membership with stable slots (not available yet).
    Group,
    /// The interval indexer of the "Distributed Peer Indexing" articles, with the safe transition.
    Interval,
}

/// The arguments of `run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The group to join.
    #[arg(long)]
    pub group: String,
    /// How to coordinate. `group` lands with group membership; until then only `interval` works.
    #[arg(long, value_enum, default_value = "interval")]
    pub mode: Mode,
    /// The interval of `--mode interval` (500ms, 5s, 1m...).
    #[arg(long, default_value = "5s", value_parser = crate::util::parse_duration)]
    pub interval: Duration,
    /// The lease TTL of `--mode group`; the interval indexer's keys always live three intervals.
    #[arg(long, value_parser = crate::util::parse_duration)]
    pub ttl: Option<Duration>,
    /// This peer's capacity: a peer of capacity 2 owns twice the share.
    #[arg(long, default_value_t = 1)]
    pub capacity: u32,
    /// The member id shown in health records (random by default).
    #[arg(long)]
    pub member: Option<String>,
}

/// Joins and prints one line per change until SIGINT or SIGTERM, then leaves.
pub async fn run(store: DynStore, args: RunArgs) -> Result<ExitCode, Error> {
    match args.mode {
        Mode::Group => {
            return Err(Error::invalid(
                "--mode group is not available yet; use --mode interval",
            ))
        }
        Mode::Interval => {}
    }
    if args.ttl.is_some() {
        return Err(Error::invalid(
            "--ttl applies to --mode group; the interval indexer's keys live three intervals",
        ));
    }
    let mut config =
        IntervalConfig::new(args.group.clone(), args.interval).with_capacity(args.capacity);
    if let Some(member) = &args.member {
        config = config.with_member(member.clone());
    }
    let peer = IntervalIndexer::join(store, config).await?;
    tracing::info!(member = peer.member(), skew = ?peer.skew(), "joined");
    let mut watch = peer.watch();
    let mut last_printed = None;
    let mut stop = Box::pin(shutdown_signal());
    loop {
        let status = watch.borrow_and_update().clone();
        let key = (status.pair.map(|p| (p.index, p.replicas)), status.phase);
        if last_printed != Some(key) {
            let live = peer.live_peers().await.map(|l| l.len()).ok();
            print_line(&args.group, &status, live);
            last_printed = Some(key);
        }
        tokio::select! {
            changed = watch.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            signal = &mut stop => {
                signal?;
                break;
            }
        }
    }
    let member = peer.member().to_owned();
    let last = peer.status();
    let stopped = peer.stop().await;
    print_line(
        &args.group,
        &IntervalStatus {
            member,
            phase: Phase::Stopped,
            ..last
        },
        None,
    );
    stopped?;
    Ok(ExitCode::SUCCESS)
}

fn print_line(group: &str, status: &IntervalStatus, live: Option<usize>) {
    let pair = status.pair;
    let line = serde_json::json!({
        "group": group,
        "member": status.member,
        "mode": "interval",
        "index": pair.map(|p| p.index),
        "replicas": pair.map(|p| p.replicas),
        "epoch": pair.map(|p| p.epoch).or(status.last_tick),
        "live": live,
        "at": rfc3339(SystemTime::now()),
        "phase": status.phase.as_str(),
        "error": status.last_error,
    });
    println!("{line}");
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() -> Result<(), Error> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())
            .map_err(|e| Error::config(format!("cannot listen for SIGTERM: {e}")))?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.map_err(|e| Error::config(format!("cannot listen for SIGINT: {e}"))),
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c()
            .await
            .map_err(|e| Error::config(format!("cannot listen for Ctrl-C: {e}")))
    }
}
