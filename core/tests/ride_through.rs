//! Riding through what is not planned, on the in-memory store and Tokio's paused time: a leave
//! whose grants take longer than a lease to drain, a store outage longer than a lease, and a
//! crash with the same member id back within its crash grace.
// Tests fail by panicking.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

use std::time::Duration;

use headcount_core::recipes::group::{Grant, GroupPhase, Member};

mod paused_group;
use paused_group::{converged, owners, Fixture, KEYS, TTL};

/// Grants for every key `member` owns now.
fn grant_all(member: &Member) -> Vec<(usize, Grant)> {
    (0..KEYS)
        .filter_map(|k| member.owns(format!("k{k}")).map(|g| (k, g)))
        .collect()
}

/// Samples, every 10 ms for `span`, which of `members` would grant each key, and fails on a key
/// two of them would grant at once.
async fn exclusive_for(members: &[&Member], span: Duration) {
    let end = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < end {
        for (k, o) in owners(members).iter().enumerate() {
            assert!(o.len() <= 1, "key {k} granted by {o:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_leave_drains_for_its_whole_timeout_and_nobody_takes_the_keys_meanwhile() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b").with_drain_timeout(TTL * 5)).await;
    converged(&[&a, &b]).await;
    let held = grant_all(&b);
    assert!(!held.is_empty());
    let slot = b.assignment().slot.unwrap();

    // The checkpoint takes three leases: the leave waits for it, renewing its lease.
    let leaving = tokio::spawn(b.clone().leave());
    exclusive_for(&[&a, &b], TTL * 3).await;
    for (k, _) in &held {
        assert!(
            a.would_grant(format!("k{k}")).is_none(),
            "k{k} moved before its grant was dropped"
        );
    }
    assert!(f.slot_record(slot).await.is_some(), "the slot stays live");
    drop(held);
    tokio::time::timeout(TTL, leaving)
        .await
        .expect("leaves once drained")
        .unwrap()
        .unwrap();
    a.wait_ready().await.unwrap();
    assert_eq!(owners(&[&a]).iter().filter(|o| o.is_empty()).count(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_leave_for_restart_with_a_long_checkpoint_keeps_its_slot() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let config = || {
        f.config("b")
            .with_drain_timeout(TTL * 5)
            .with_restart_window(TTL * 4)
    };
    let b = f.join(config()).await;
    let epoch = converged(&[&a, &b]).await;
    let before = owners(&[&a, &b]);
    let held = grant_all(&b);
    let slot = b.assignment().slot.unwrap();

    let leaving = tokio::spawn(b.clone().leave_for_restart());
    tokio::time::sleep(TTL * 2).await;
    drop(held);
    leaving.await.unwrap().unwrap();
    assert!(
        f.slot_record(slot).await.is_some_and(|r| r.is_parked()),
        "parked after the drain"
    );
    let b2 = f.join(config()).await;
    converged(&[&a, &b2]).await;
    assert!(a.assignment().epoch > epoch);
    assert_eq!(b2.assignment().slot, Some(slot));
    assert_eq!(owners(&[&a, &b2]), before, "no key moved");
}

#[tokio::test(start_paused = true)]
async fn a_drain_cut_by_its_timeout_still_leaves() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b").with_drain_timeout(TTL * 2)).await;
    converged(&[&a, &b]).await;
    let held = grant_all(&b);
    let started = tokio::time::Instant::now();
    b.clone().leave().await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= TTL * 2 && waited < TTL * 3,
        "waited {waited:?} for a drain timeout of {:?}",
        TTL * 2
    );
    assert_eq!(b.assignment().phase, GroupPhase::Stopped);
    for (_, g) in &held {
        assert!(!g.is_valid());
    }
    // The slot was not deleted (grants were still out): the others take the keys once it
    // expires.
    a.wait_ready().await.unwrap();
    converged(&[&a]).await;
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn a_standby_is_handed_the_slot_after_a_drain_longer_than_a_lease() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b").with_drain_timeout(TTL * 5)).await;
    let epoch = converged(&[&a, &b]).await;
    let before = owners(&[&a, &b]);
    let slot = b.assignment().slot.unwrap();
    let c = f.join(f.config("c").with_standby(TTL * 20)).await;
    assert_eq!(c.assignment().phase, GroupPhase::Standby);
    let held = grant_all(&b);

    let leaving = tokio::spawn(b.clone().leave());
    exclusive_for(&[&a, &b, &c], TTL * 3).await;
    assert_eq!(c.assignment().phase, GroupPhase::Standby, "still waiting");
    drop(held);
    leaving.await.unwrap().unwrap();
    let back = c.active(0).await.expect("inherits");
    assert_eq!((back.epoch, back.slot), (epoch + 1, Some(slot)), "{back:?}");
    converged(&[&a, &c]).await;
    assert_eq!(owners(&[&a, &c]), before, "b's keys moved once, to c");
}
