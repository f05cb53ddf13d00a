//! The seeded simulation of the interval indexer (the articles' algorithm with the safe
//! transition): peers join, stop gracefully and crash on the in-memory store, on a
//! single-threaded Tokio runtime with paused time, each with its own constant skew below half
//! the interval.
//!
//! Peers' store calls also stall for a while (a stopped process, a frozen connection), so a
//! call sent before the stall lands when it ends, possibly intervals later.
//!
//! Checked every 10 ms of virtual time: no task is owned by two peers at once. Checked at the
//! end: within four intervals of the last change, once a transition under way has finished (one
//! interval at most), every task has exactly one owner.
//!
//! The indexer's guarantee assumes that a tick's increment lands early in its interval (the
//! module docs' assumption (c)); the default run therefore injects no delays.
//! `HEADCOUNT_SIM_DELAYS=MS` delays store calls by up to MS milliseconds, which breaks that
//! assumption. `HEADCOUNT_SIM_SEEDS=N` runs N seeds (default 150), `HEADCOUNT_SIM_SEED=S`
//! replays one.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use headcount_core::memory::MemoryStore;
use headcount_core::recipes::interval::{
    IntervalConfig, IntervalIndexer, IntervalPeer, IntervalPhase,
};
use headcount_core::sim::{FaultRates, Faults, FaultyStore, SimClock};
use headcount_core::{Clock, DynStore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const INTERVAL: Duration = Duration::from_secs(1);
const TASKS: u64 = 32;
const TICK: Duration = Duration::from_millis(10);

struct Peer {
    label: String,
    faults: Arc<Faults>,
    /// When a pause of this peer's store calls ends.
    paused_until: Option<tokio::time::Instant>,
    peer: Option<IntervalPeer>,
    joining: Option<tokio::task::JoinHandle<headcount_core::Result<IntervalPeer>>>,
}

async fn run_seed(seed: u64, delays: Option<Duration>) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let clock = SimClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    let clock_dyn: Arc<dyn Clock> = Arc::new(clock.clone());
    let store = MemoryStore::with_clock(clock_dyn.clone());
    let mut peers: Vec<Peer> = Vec::new();
    let mut log: Vec<String> = Vec::new();
    let mut last_change = tokio::time::Instant::now();
    let run = Duration::from_millis(rng.random_range(6_000..15_000));
    let start = tokio::time::Instant::now();
    let fail = |log: &[String], why: String| {
        let tail: Vec<&str> = log
            .iter()
            .rev()
            .take(30)
            .rev()
            .map(String::as_str)
            .collect();
        Err(format!(
            "seed {seed}: {why}\nlast events:\n  {}\nreplay: HEADCOUNT_SIM_SEED={seed} cargo test -p headcount-core --test interval_simulation",
            tail.join("\n  ")
        ))
    };
    loop {
        let now = tokio::time::Instant::now();
        let faulty = now < start + run;
        if !faulty && now > last_change + INTERVAL * 4 {
            break;
        }
        tokio::time::sleep(TICK).await;
        let at = (tokio::time::Instant::now() - start).as_secs_f64();
        for p in peers.iter_mut() {
            if p.joining.as_ref().is_some_and(|j| j.is_finished()) {
                if let Some(j) = p.joining.take() {
                    match j.await {
                        Ok(Ok(peer)) => p.peer = Some(peer),
                        Ok(Err(e)) => log.push(format!("{at:.3}s {} join failed: {e}", p.label)),
                        Err(e) => log.push(format!("{at:.3}s {} join died: {e}", p.label)),
                    }
                }
            }
        }
        for p in peers.iter_mut() {
            if p.paused_until
                .is_some_and(|t| tokio::time::Instant::now() >= t)
            {
                p.paused_until = None;
                p.faults.resume();
                last_change = tokio::time::Instant::now();
                log.push(format!("{at:.3}s {} resumes", p.label));
            }
        }
        let live: Vec<usize> = (0..peers.len())
            .filter(|&i| peers[i].peer.is_some() || peers[i].joining.is_some())
            .collect();
        if faulty && rng.random_bool(0.01) {
            last_change = tokio::time::Instant::now();
            match rng.random_range(0..12) {
                0..5 if live.len() < 6 => {
                    let label = format!("p{}", peers.len());
                    let faults = Faults::new(seed ^ peers.len() as u64);
                    if let Some(max) = delays {
                        faults.set_rates(FaultRates {
                            delay: 0.5,
                            max_delay: max,
                            ..FaultRates::NONE
                        });
                    }
                    let handle: DynStore = Arc::new(FaultyStore::new(
                        Arc::new(store.clone()),
                        faults.clone(),
                        clock_dyn.clone(),
                    ));
                    let skew = Duration::from_millis(
                        rng.random_range(0..(INTERVAL.as_millis() as u64 / 2 - 1)),
                    );
                    let config = IntervalConfig::new("sim", INTERVAL)
                        .with_member(label.clone())
                        .with_skew(skew)
                        .with_clock(clock_dyn.clone());
                    log.push(format!("{at:.3}s {label} joins (skew {skew:?})"));
                    peers.push(Peer {
                        label,
                        faults,
                        paused_until: None,
                        peer: None,
                        joining: Some(tokio::spawn(IntervalIndexer::join(handle, config))),
                    });
                }
                5..8 if live.len() > 1 => {
                    let i = live[rng.random_range(0..live.len())];
                    log.push(format!("{at:.3}s {} stops", peers[i].label));
                    if let Some(peer) = peers[i].peer.take() {
                        tokio::spawn(peer.leave());
                    }
                    if let Some(j) = peers[i].joining.take() {
                        j.abort();
                    }
                }
                8..10 if live.len() > 1 => {
                    let i = live[rng.random_range(0..live.len())];
                    log.push(format!("{at:.3}s {} crashes", peers[i].label));
                    peers[i].peer = None;
                    if let Some(j) = peers[i].joining.take() {
                        j.abort();
                    }
                }
                10..12 if !live.is_empty() => {
                    // The store calls of one peer stall (SIGSTOP, a frozen connection): a call
                    // sent before the pause lands when it ends, possibly intervals later.
                    let i = live[rng.random_range(0..live.len())];
                    if peers[i].paused_until.is_none() {
                        let pause = Duration::from_millis(rng.random_range(200..2_500));
                        log.push(format!(
                            "{at:.3}s {} store calls stall for {pause:?}",
                            peers[i].label
                        ));
                        peers[i].faults.pause();
                        peers[i].paused_until = Some(tokio::time::Instant::now() + pause);
                    }
                }
                _ => {}
            }
        }
        if let Some(why) = owned_twice(&peers, at) {
            return fail(&log, why);
        }
    }
    // A transition under way at the end finishes first: a peer whose pair changed owns nothing
    // from its tick until its first poll after the last acknowledgement (peers that tick at the
    // same instant can swap indices at every interval). One interval at most; a peer still
    // draining or waiting then is a liveness failure.
    let settle = tokio::time::Instant::now() + INTERVAL;
    while tokio::time::Instant::now() < settle
        && peers.iter().filter_map(|p| p.peer.as_ref()).any(|x| {
            matches!(
                x.status().phase,
                IntervalPhase::Draining | IntervalPhase::Waiting
            )
        })
    {
        tokio::time::sleep(TICK).await;
        let at = (tokio::time::Instant::now() - start).as_secs_f64();
        if let Some(why) = owned_twice(&peers, at) {
            return fail(&log, why);
        }
    }
    let alive = peers.iter().filter(|p| p.peer.is_some()).count();
    if alive > 0 {
        for task in 0..TASKS {
            let owners = peers
                .iter()
                .filter(|p| p.peer.as_ref().is_some_and(|x| x.should_process(task)))
                .count();
            if owners != 1 {
                let states: Vec<String> = peers
                    .iter()
                    .filter_map(|p| {
                        let x = p.peer.as_ref()?;
                        Some(format!("{} {:?} {:?}", p.label, x.status().phase, x.pair()))
                    })
                    .collect();
                return fail(
                    &log,
                    format!(
                        "task {task} has {owners} owners four intervals after the last change \
                         (and a transition's end); peers: {}",
                        states.join(", ")
                    ),
                );
            }
        }
    }
    Ok(())
}

/// The first task two live peers own at once, as a failure message.
fn owned_twice(peers: &[Peer], at: f64) -> Option<String> {
    for task in 0..TASKS {
        let owners: Vec<&str> = peers
            .iter()
            .filter(|p| p.peer.as_ref().is_some_and(|x| x.should_process(task)))
            .map(|p| p.label.as_str())
            .collect();
        if owners.len() > 1 {
            let pairs: Vec<String> = peers
                .iter()
                .filter_map(|p| {
                    p.peer
                        .as_ref()
                        .map(|x| format!("{} {:?}", p.label, x.pair()))
                })
                .collect();
            return Some(format!(
                "task {task} owned by {owners:?} at {at:.3}s; pairs: {}",
                pairs.join(", ")
            ));
        }
    }
    None
}

#[test]
fn interval_simulation() {
    let delays = std::env::var("HEADCOUNT_SIM_DELAYS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_millis);
    let (seeds, _) = common::seeds(150);
    let mut failures = Vec::new();
    for seed in seeds {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        if let Err(e) = rt.block_on(run_seed(seed, delays)) {
            failures.push(e);
        }
    }
    if let Some(first) = failures.first() {
        let twice = failures.iter().filter(|f| f.contains(" owned by ")).count();
        panic!(
            "{} seeds failed ({twice} with a task owned twice); the first:\n{first}",
            failures.len()
        );
    }
}
