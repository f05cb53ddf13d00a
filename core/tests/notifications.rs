//! Planned changes seen through the store's change notifications, on the in-memory store (which
//! notifies its own writes in-process) and Tokio's paused time, at the default lease TTL of 6 s:
//! a join, a graceful leave, a hand-over to a standby and a restart's take-back each converge
//! within a few milliseconds of virtual time, where a member that only polls
//! ([`GroupConfig::with_notifications`]`(false)`) takes a good part of a heartbeat. A crash is
//! still seen when the lease runs out.
// Tests fail by panicking.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use headcount_core::decorated::{Decorated, Hooks};
use headcount_core::recipes::group::{Group, GroupConfig, GroupPhase, Member};
use headcount_core::{DynStore, Op, Result};
use tokio::time::Instant;

mod paused_group;
use paused_group::Fixture;

/// The default lease TTL (a heartbeat every 2 s).
const TTL: Duration = Duration::from_secs(6);
/// What a change seen through notifications may take in virtual time: a handful of the 8 ms
/// gaps between notice-driven calls (store calls take no virtual time here).
const FAST: Duration = Duration::from_millis(100);
/// What a change seen by polling takes at least: the settled mark is polled at an eighth of a
/// heartbeat.
const SLOW: Duration = Duration::from_millis(250);

/// Measures a change with notifications and then polling only: the first within [`FAST`], the
/// second no faster than [`SLOW`] (both printed).
async fn fast_with_notices_slow_without<F, Fut>(measure: F)
where
    F: Fn(bool) -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    let fast = measure(true).await;
    eprintln!("notices {fast:?}");
    assert!(fast <= FAST, "with notifications: {fast:?}");
    let slow = measure(false).await;
    eprintln!("polling {slow:?}");
    assert!(slow >= SLOW, "polling only: {slow:?}");
}

fn config(f: &Fixture, id: &str, notices: bool) -> GroupConfig {
    GroupConfig::new("g", TTL)
        .with_member(id)
        .with_clock(f.clock.clone())
        .with_notifications(notices)
}

/// Waits (in paused time, looking every millisecond) until every member is active under one
/// epoch naming exactly them all; answers that epoch.
async fn converged(members: &[&Member]) -> u64 {
    for _ in 0..60_000 {
        let a: Vec<_> = members.iter().map(|m| m.assignment()).collect();
        let epoch = a[0].epoch;
        if a.iter().all(|x| {
            x.phase == GroupPhase::Active && x.epoch == epoch && x.live.len() == members.len()
        }) {
            return epoch;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "never converged: {:?}",
        members.iter().map(|m| m.assignment()).collect::<Vec<_>>()
    );
}

/// Five members, settled and a few heartbeats into their steady state.
async fn five(f: &Fixture, notices: bool) -> Vec<Member> {
    let mut members = Vec::new();
    for i in 0..5 {
        members.push(f.join(config(f, &format!("m{i}"), notices)).await);
    }
    converged(&members.iter().collect::<Vec<_>>()).await;
    tokio::time::sleep(TTL).await;
    members
}

/// How long (virtual) a join of a sixth member takes to converge, and the epochs it took.
async fn join_takes(notices: bool) -> (Duration, u64) {
    let f = Fixture::new();
    let mut members = five(&f, notices).await;
    let before = converged(&members.iter().collect::<Vec<_>>()).await;
    let started = Instant::now();
    members.push(f.join(config(&f, "new", notices)).await);
    let after = converged(&members.iter().collect::<Vec<_>>()).await;
    let took = started.elapsed();
    for m in members {
        m.leave().await.unwrap();
    }
    (took, after - before)
}

/// How long (virtual) a graceful leave of a member in the middle takes to converge.
async fn leave_takes(notices: bool) -> Duration {
    let f = Fixture::new();
    let mut members = five(&f, notices).await;
    let started = Instant::now();
    members.remove(2).leave().await.unwrap();
    converged(&members.iter().collect::<Vec<_>>()).await;
    let took = started.elapsed();
    for m in members {
        m.leave().await.unwrap();
    }
    took
}

#[tokio::test(start_paused = true)]
async fn a_join_converges_within_milliseconds_where_polling_takes_part_of_a_heartbeat() {
    let (fast, epochs) = join_takes(true).await;
    assert_eq!(epochs, 1, "one view change");
    eprintln!("notices {fast:?}");
    assert!(fast <= FAST, "with notifications: {fast:?}");
    let (slow, _) = join_takes(false).await;
    eprintln!("polling {slow:?}");
    assert!(slow >= SLOW, "polling only: {slow:?}");
}

#[tokio::test(start_paused = true)]
async fn a_graceful_leave_converges_within_milliseconds_where_polling_takes_part_of_a_heartbeat() {
    fast_with_notices_slow_without(leave_takes).await;
}

/// A standby inherits a leaving member's slot: from the start of the leave to the standby
/// active with every other member, in virtual time.
async fn hand_over_takes(notices: bool) -> Duration {
    let f = Fixture::new();
    let mut members = five(&f, notices).await;
    let standby = f
        .join(config(&f, "standby", notices).with_standby(TTL * 10))
        .await;
    assert_eq!(standby.assignment().phase, GroupPhase::Standby);
    let started = Instant::now();
    members.remove(4).leave().await.unwrap();
    members.push(standby);
    converged(&members.iter().collect::<Vec<_>>()).await;
    let took = started.elapsed();
    for m in members {
        m.leave().await.unwrap();
    }
    took
}

#[tokio::test(start_paused = true)]
async fn a_standby_takes_a_leaving_members_slot_within_milliseconds() {
    fast_with_notices_slow_without(hand_over_takes).await;
}

/// A member leaves for a restart (static membership) and its process comes back `restart`
/// later: from its return to every member active, in virtual time.
async fn take_back_takes(notices: bool) -> Duration {
    let f = Fixture::new();
    let window = TTL * 10;
    let mut members = Vec::new();
    for i in 0..5 {
        let cfg = config(&f, &format!("m{i}"), notices).with_restart_window(window);
        members.push(f.join(cfg).await);
    }
    converged(&members.iter().collect::<Vec<_>>()).await;
    tokio::time::sleep(TTL).await;
    let leaving = members.remove(1);
    let (slot, epoch) = (leaving.assignment().slot, leaving.assignment().epoch);
    leaving.leave_for_restart().await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    let cfg = config(&f, "m1", notices).with_restart_window(window);
    members.push(f.join(cfg).await);
    let back = converged(&members.iter().collect::<Vec<_>>()).await;
    let took = started.elapsed();
    // Taken back: the same slot, one epoch on.
    assert_eq!(members[4].assignment().slot, slot);
    assert_eq!(back, epoch + 1);
    for m in members {
        m.leave().await.unwrap();
    }
    took
}

#[tokio::test(start_paused = true)]
async fn a_restarted_member_is_back_within_milliseconds() {
    fast_with_notices_slow_without(take_back_takes).await;
}

#[tokio::test(start_paused = true)]
async fn a_crash_is_still_seen_when_the_lease_runs_out() {
    let f = Fixture::new();
    let mut members = five(&f, true).await;
    let started = Instant::now();
    // Dropped without leaving: the heartbeat stops, the slot expires after its TTL.
    drop(members.remove(3));
    converged(&members.iter().collect::<Vec<_>>()).await;
    let took = started.elapsed();
    assert!(took >= TTL - TTL / 10, "{took:?}");
    assert!(took <= TTL * 2, "{took:?}");
    for m in members {
        m.leave().await.unwrap();
    }
}

/// Counts the calls that reach the store.
#[derive(Debug, Default)]
struct Count(Arc<AtomicU64>);

#[async_trait]
impl Hooks for Count {
    async fn before(&self, _op: Op) -> Result<()> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_storm_of_notifications_costs_a_bounded_number_of_calls_and_changes_nothing() {
    let f = Fixture::new();
    let calls = Arc::new(AtomicU64::new(0));
    let counted: DynStore = Arc::new(Decorated::with(f.store.clone(), Count(calls.clone())));
    let mut members = Vec::new();
    for i in 0..3 {
        let m = Group::join(counted.clone(), config(&f, &format!("m{i}"), true))
            .await
            .unwrap();
        members.push(m);
    }
    let refs: Vec<&Member> = members.iter().collect();
    let epoch = converged(&refs).await;
    tokio::time::sleep(TTL).await;

    // Three heartbeats of the steady state.
    let window = TTL;
    let before = calls.load(Ordering::Relaxed);
    tokio::time::sleep(window).await;
    let steady = calls.load(Ordering::Relaxed) - before;

    // The same three heartbeats with a key of the view directory (one the group ignores)
    // rewritten every 2 ms: 500 notifications a second to every member.
    let noisy = f.store.clone();
    let storm = tokio::spawn(async move {
        let mut previous: Option<String> = None;
        for i in 0..(window.as_millis() / 2) {
            let value = format!("noise {i}");
            noisy
                .compare_and_set("hc:{g}:view:noise", previous.as_deref(), &value, None)
                .await
                .unwrap();
            previous = Some(value);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let before = calls.load(Ordering::Relaxed);
    tokio::time::sleep(window).await;
    let stormy = calls.load(Ordering::Relaxed) - before;
    storm.await.unwrap();
    eprintln!("calls in three heartbeats: {steady} steady, {stormy} in the storm");

    // Each member answers a burst of 8 notices, then one per eighth of a heartbeat (the pace of
    // a hand-off's polling), each with one heartbeat's calls (at most three: both directories'
    // versions, then each directory that changed).
    let bound = steady + 3 * (8 + 3 * 8 + 1) * 3;
    assert!(
        stormy <= bound,
        "{stormy} calls in the storm, bound {bound}"
    );
    assert!(
        stormy > steady,
        "the notices were answered: {stormy} vs {steady}"
    );
    // Nothing changed for the group.
    assert_eq!(converged(&refs).await, epoch);
    for m in members {
        m.leave().await.unwrap();
    }
}
