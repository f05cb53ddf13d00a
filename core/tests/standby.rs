//! Replacements with new member ids on the in-memory store, on Tokio's paused time: a member that
//! joins as a standby ([`GroupConfig::with_standby`]) stays out of the view until a member leaves
//! gracefully and hands it its slot; then only the leaving member's keys move, once, to it, in
//! one view change. With nobody leaving, it joins once its wait ends.
// Tests fail by panicking.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use headcount_core::fence::FencingToken;
use headcount_core::memory::MemoryStore;
use headcount_core::recipes::group::{Group, GroupConfig, GroupPhase, Member, MAX_STANDBY};
use headcount_core::{DynStore, ErrorKind};

mod paused_group;
use paused_group::{converged, owners, Fixture, KEYS, TTL};

/// Writes the standby record of a process that stands by as `id` (and polls no more).
async fn standby_record(f: &Fixture, id: &str) {
    let key = format!("hc:{{g}}:standby:{id}");
    let text = "v1 nonce=00000000000000aa since=1";
    assert!(f
        .store
        .compare_and_set(&key, None, text, Some(TTL))
        .await
        .unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_replacement_inherits_the_leavers_slot_and_only_its_keys_move() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b")).await;
    let c = f.join(f.config("c")).await;
    let epoch = converged(&[&a, &b, &c]).await;
    let slot = c.assignment().slot.unwrap();
    let before = owners(&[&a, &b, &c]);
    let tokens = |m: &Member| -> Vec<Option<FencingToken>> {
        (0..KEYS).map(|k| m.would_grant(format!("k{k}"))).collect()
    };
    let kept = (tokens(&a), tokens(&b));

    // The replacement stands by: ready, outside the view, and nothing changes for the others.
    let d = f.join(f.config("d").with_standby(TTL * 20)).await;
    let x = d.assignment();
    assert_eq!(
        (x.phase, x.slot, x.index),
        (GroupPhase::Standby, None, None)
    );
    assert!(d.ready());
    assert_eq!(d.wait_ready().await.unwrap().phase, GroupPhase::Standby);
    tokio::time::sleep(TTL * 2).await;
    assert_eq!(converged(&[&a, &b, &c]).await, epoch);
    assert_eq!(d.assignment().phase, GroupPhase::Standby);

    // The member it replaces leaves: its slot goes to the standby, under one new epoch.
    let started = tokio::time::Instant::now();
    c.leave().await.unwrap();
    let back = d.active(0).await.expect("inherits");
    let took = started.elapsed();
    assert_eq!((back.epoch, back.slot), (epoch + 1, Some(slot)), "{back:?}");
    // It sees the mark at its next poll (a quarter heartbeat) and is active once the others
    // acknowledged the new epoch (at their next heartbeat).
    assert!(
        took <= TTL / 3 + TTL / 12 + TTL / 8 + Duration::from_millis(50),
        "{took:?}"
    );
    assert_eq!(converged(&[&a, &b, &d]).await, epoch + 1);
    // Only the leaving member's keys moved, all of them straight to its replacement; the others
    // kept their keys and tokens.
    let after = owners(&[&a, &b, &d]);
    assert_eq!(
        after, before,
        "every key of c is d's now, and nothing else moved"
    );
    assert_eq!((tokens(&a), tokens(&b)), kept);
    for (k, owner) in before.iter().enumerate() {
        if owner == &[2] {
            let token = d.would_grant(format!("k{k}")).unwrap();
            assert!(token.get() > epoch, "key {k}: token {token}");
        }
    }
    let record = f.slot_record(slot).await.unwrap();
    assert_eq!(record.member, "d");
    assert!(!record.is_parked(), "{record:?}");
    assert_eq!(f.store.get("hc:{g}:standby:d").await.unwrap(), None);
    for m in [a, b, d] {
        m.leave().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_standby_nobody_leaves_for_joins_when_its_wait_ends() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let epoch = converged(&[&a]).await;
    let started = tokio::time::Instant::now();
    let b = f.join(f.config("b").with_standby(TTL * 3)).await;
    let x = b.active(0).await.expect("joins after its wait");
    assert!(started.elapsed() >= TTL * 3, "{:?}", started.elapsed());
    assert_eq!(x.replicas, 2);
    assert!(converged(&[&a, &b]).await > epoch);
    assert_eq!(f.store.get("hc:{g}:standby:b").await.unwrap(), None);
    for m in [a, b] {
        m.leave().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn two_members_leaving_at_once_hand_over_to_one_standby_and_the_other_leaves() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b")).await;
    let c = f.join(f.config("c")).await;
    converged(&[&a, &b, &c]).await;
    let d = f.join(f.config("d").with_standby(TTL * 20)).await;
    let (lb, lc) = tokio::join!(b.leave(), c.leave());
    lb.unwrap();
    lc.unwrap();
    converged(&[&a, &d]).await;
    let x = d.assignment();
    assert!(x.slot == Some(1) || x.slot == Some(2), "{x:?}");
    assert_eq!(x.replicas, 2);
    let all: Vec<String> = (0..KEYS).map(|k| format!("k{k}")).collect();
    for k in &all {
        let n = [&a, &d]
            .iter()
            .filter(|m| m.would_grant(k).is_some())
            .count();
        assert_eq!(n, 1, "key {k}");
    }
    for m in [a, d] {
        m.leave().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_standby_stopped_while_standing_by_leaves_nothing_behind() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let epoch = converged(&[&a]).await;
    let b = f.join(f.config("b").with_standby(TTL * 20)).await;
    assert!(f.store.get("hc:{g}:standby:b").await.unwrap().is_some());
    b.leave().await.unwrap();
    assert_eq!(f.store.get("hc:{g}:standby:b").await.unwrap(), None);
    // The member that leaves next finds no standby and leaves as usual.
    let c = f.join(f.config("c")).await;
    assert!(converged(&[&a, &c]).await > epoch);
    c.leave().await.unwrap();
    assert_eq!(converged(&[&a]).await, epoch + 2);
    a.leave().await.unwrap();
}

/// A standby that is chosen and never takes the slot (its process died just then): the slot,
/// parked under its id for one lease TTL, expires, and the others take its keys as after a crash.
#[tokio::test(start_paused = true)]
async fn a_chosen_standby_that_never_comes_costs_one_lease_as_a_crash_does() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b")).await;
    let epoch = converged(&[&a, &b]).await;
    // The record a standby process wrote just before it died.
    standby_record(&f, "ghost").await;
    let started = tokio::time::Instant::now();
    b.leave().await.unwrap();
    let parked = f.slot_record(1).await.expect("parked for the standby");
    assert_eq!(
        (parked.member.as_str(), parked.is_parked()),
        ("ghost", true)
    );
    let x = a.active(epoch + 1).await.unwrap();
    assert_eq!(x.replicas, 1);
    assert!(
        started.elapsed() <= TTL + TTL / 3 + TTL / 4,
        "{:?}",
        started.elapsed()
    );
    let all: Vec<String> = (0..KEYS).map(|k| format!("k{k}")).collect();
    assert!(all.iter().all(|k| a.would_grant(k).is_some()));
    a.leave().await.unwrap();
}

#[test]
fn a_standby_wait_outside_the_limits_is_refused() {
    for wait in [Duration::ZERO, MAX_STANDBY + Duration::from_secs(1)] {
        let config = GroupConfig::new("g", TTL).with_standby(wait);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store: DynStore = Arc::new(MemoryStore::new());
        let e = rt
            .block_on(Group::join(store, config))
            .expect_err("refused");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("standby wait"), "{e}");
    }
}

/// A standby stopped just after a leaving member chose it (an aborted rollout scaling the new
/// pods down) gives the slot back: it deletes the claim parked for it, so the others take its
/// keys within a heartbeat or so instead of waiting a lease TTL for the parked claim to expire.
#[tokio::test(start_paused = true)]
async fn a_standby_stopped_after_it_was_chosen_gives_the_slot_back() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b")).await;
    let epoch = converged(&[&a, &b]).await;
    let d = f.join(f.config("d").with_standby(TTL * 20)).await;
    let started = tokio::time::Instant::now();
    b.leave().await.unwrap();
    let parked = f.slot_record(1).await.expect("parked for the standby");
    assert_eq!((parked.member.as_str(), parked.is_parked()), ("d", true));
    // Stopped before its next poll saw the mark.
    d.leave().await.unwrap();
    assert_eq!(
        f.slot_record(1).await,
        None,
        "the parked claim is given back"
    );
    assert_eq!(f.store.get("hc:{g}:standby:d").await.unwrap(), None);
    let x = a.active(epoch + 1).await.unwrap();
    assert_eq!(x.replicas, 1);
    assert!(started.elapsed() < TTL / 2, "{:?}", started.elapsed());
    a.leave().await.unwrap();
}

/// A standby's process restarted (same member id) after a leaving member chose it: the new
/// process finds its record marked and takes the slot over, instead of writing a fresh record
/// and leaving the slot parked.
#[tokio::test(start_paused = true)]
async fn a_chosen_standby_restarted_under_its_id_takes_the_slot_over() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b")).await;
    let epoch = converged(&[&a, &b]).await;
    // The record of a standby process that is about to restart.
    standby_record(&f, "e").await;
    b.leave().await.unwrap();
    let marked = f.store.get("hc:{g}:standby:e").await.unwrap().unwrap();
    assert!(marked.contains(" heir_of=1 from="), "{marked}");
    let e = f.join(f.config("e").with_standby(TTL * 20)).await;
    let x = e.active(0).await.expect("takes the slot over");
    assert_eq!(
        (x.slot, x.epoch, x.replicas),
        (Some(1), epoch + 1, 2),
        "{x:?}"
    );
    assert_eq!(converged(&[&a, &e]).await, epoch + 1);
    assert_eq!(f.store.get("hc:{g}:standby:e").await.unwrap(), None);
    for m in [a, e] {
        m.leave().await.unwrap();
    }
}
