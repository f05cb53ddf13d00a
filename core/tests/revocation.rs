//! The revocation hooks on the in-memory store, on Tokio's paused time: `Member::revocations`
//! names the keys a member is about to lose before it acknowledges the hand-off,
//! `Grant::revoked` fires for exactly those grants, and the new owner starts a key only once its
//! grant was dropped.
// Tests fail by panicking.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::FutureExt as _;
use headcount_core::memory::MemoryStore;
use headcount_core::recipes::group::{Group, GroupConfig, GroupPhase};
use headcount_core::sim::SimClock;
use headcount_core::{Clock, DynStore};

const TTL: Duration = Duration::from_millis(900);

#[tokio::test(start_paused = true)]
async fn a_member_hears_which_keys_it_loses_before_the_new_owner_starts_them() {
    let clock: Arc<dyn Clock> = Arc::new(SimClock::new(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    ));
    let store: DynStore = Arc::new(MemoryStore::with_clock(clock.clone()));
    let config = |id: &str| {
        GroupConfig::new("g", TTL)
            .with_member(id)
            .with_clock(clock.clone())
    };
    let a = Group::join(store.clone(), config("a")).await.unwrap();
    a.wait_ready().await.unwrap();
    let keys: Vec<String> = (0..64).map(|k| format!("k{k}")).collect();
    let grants: Vec<_> = keys.iter().map(|k| a.owns(k).expect("alone")).collect();
    let mut revocations = a.revocations();

    let b = Group::join(store.clone(), config("b")).await.unwrap();
    let change = tokio::time::timeout(TTL, revocations.recv())
        .await
        .expect("told in time")
        .unwrap();
    let lost: Vec<&String> = change.lost(&keys);
    assert!(!lost.is_empty() && lost.len() < keys.len(), "{lost:?}");
    assert!(change.gained(&keys).is_empty());
    // Exactly the lost keys' grants are revoked; the kept ones keep going.
    tokio::task::yield_now().await;
    for (k, g) in keys.iter().zip(&grants) {
        let fired = g.revoked().now_or_never().is_some();
        assert_eq!(fired, lost.contains(&k), "{k}");
        assert_eq!(g.is_valid(), !fired, "{k}");
    }
    // The hand-off waits for the lost keys' grants, however long (within the drain timeout).
    tokio::time::sleep(TTL / 2).await;
    assert_eq!(
        b.assignment().phase,
        GroupPhase::Joining,
        "{:?}",
        b.assignment()
    );
    for k in &lost {
        assert!(
            b.would_grant(k).is_none(),
            "{k} started before it was released"
        );
    }
    let (released, kept): (Vec<_>, Vec<_>) =
        keys.iter().zip(grants).partition(|(k, _)| lost.contains(k));
    drop(released);
    b.wait_ready().await.unwrap();
    for k in &lost {
        assert!(b.would_grant(k).is_some(), "{k}");
    }
    // A graceful leave revokes every grant still held.
    let (_, still) = &kept[0];
    let leaving = tokio::spawn(a.clone().leave());
    tokio::time::timeout(TTL, still.revoked())
        .await
        .expect("revoked by the leave");
    drop(kept);
    leaving.await.unwrap().unwrap();
    b.leave().await.unwrap();
}
