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

mod crash_grace {
    use std::time::Duration;

    use headcount_core::recipes::group::{
        Change, Group, GroupConfig, GroupPhase, MAX_RESTART_WINDOW,
    };
    use headcount_core::testkit::{TestGroup, TestGroupBuilder};
    use headcount_core::ErrorKind;

    const TTL: Duration = Duration::from_secs(6);
    const GRACE: Duration = Duration::from_secs(20);

    fn keys() -> Vec<String> {
        (0..128).map(|i| format!("p{i}")).collect()
    }

    /// Which member owns each key now.
    fn owners(group: &TestGroup) -> Vec<Option<usize>> {
        keys().iter().map(|k| group.owner_of(k)).collect()
    }

    fn builder() -> TestGroupBuilder {
        TestGroup::builder("g")
            .members(3)
            .ttl(TTL)
            .configure(|c| c.with_crash_grace(GRACE))
    }

    /// The keys the members other than `i` gained or lost in the views they activated since
    /// `receivers` were taken (one per member, `None` for `i`).
    fn moved(receivers: &mut [Option<tokio::sync::broadcast::Receiver<Change>>]) -> Vec<String> {
        let keys = keys();
        let mut moved = Vec::new();
        for rx in receivers.iter_mut().flatten() {
            while let Ok(change) = rx.try_recv() {
                moved.extend(change.lost(&keys).into_iter().cloned());
                moved.extend(change.gained(&keys).into_iter().cloned());
            }
        }
        moved
    }

    fn survivors(
        group: &TestGroup,
        but: usize,
    ) -> Vec<Option<tokio::sync::broadcast::Receiver<Change>>> {
        (0..group.len())
            .map(|j| (j != but).then(|| group.member(j).changes()))
            .collect()
    }

    /// `kill -9` and the same id started again 1 to 18 s later (with a 6 s TTL: before and
    /// long after its lease ran out), ten times over: the process started again takes its
    /// slot over and no key moves, every time (the others gain and lose nothing); none is
    /// granted twice.
    #[tokio::test]
    async fn a_crash_and_restart_within_the_grace_moves_nothing_every_time() {
        let mut group = builder().start().await.expect("starts");
        let before = owners(&group);
        for run in 0..10 {
            let i = run % 3;
            let mut others = survivors(&group, i);
            group.crash(i);
            let away = [1, 2, 4, 6, 8, 10, 12, 14, 16, 18][run];
            group.advance(Duration::from_secs(away)).await;
            group.restart(i).await.expect("restarts");
            group.converged().await.expect("converges");
            group.assert_exclusive(&keys());
            assert_eq!(moved(&mut others), Vec::<String>::new(), "away {away} s");
            assert_eq!(owners(&group), before, "away {away} s");
        }
    }

    /// A member that crashed and never came back costs its keys the grace plus a lease.
    #[tokio::test]
    async fn a_real_crash_costs_the_grace_plus_a_lease() {
        let mut group = builder().start().await.expect("starts");
        let theirs: Vec<String> = keys()
            .into_iter()
            .filter(|k| group.owner_of(k) == Some(2))
            .collect();
        group.crash(2);
        let held = group
            .wait_until("the crashed member's keys have a new owner", |g| {
                theirs.iter().all(|k| g.owner_of(k).is_some())
            })
            .await
            .expect("moves after the grace");
        assert!(
            held >= GRACE + TTL - TTL / 3 && held <= GRACE + TTL + TTL,
            "{held:?}"
        );
    }

    /// A process frozen for ten seconds (SIGSTOP), within its grace, finds its slot its own
    /// when it goes on: no key moves.
    #[tokio::test]
    async fn a_pause_within_the_grace_moves_nothing() {
        let mut group = builder().start().await.expect("starts");
        let before = owners(&group);
        let mut others = survivors(&group, 1);
        group.pause(1);
        group.advance(Duration::from_secs(10)).await;
        group.resume(1);
        group.converged().await.expect("converges");
        assert_eq!(moved(&mut others), Vec::<String>::new());
        assert_eq!(owners(&group), before);
    }

    /// Two live processes with one id: the newer one replaces the older, which ends with
    /// `Rejected`.
    #[tokio::test]
    async fn a_second_process_with_the_id_replaces_the_first() {
        let group = builder().members(2).start().await.expect("starts");
        let first = group.member(1).clone();
        let config = GroupConfig::new("g", TTL)
            .with_member(group.id(1))
            .with_crash_grace(GRACE)
            .with_clock(std::sync::Arc::new(group.clock().clone()));
        let store = group.store();
        let second = tokio::spawn(async move { Group::join(store, config).await });
        group
            .wait_until("the first process yields", |_| {
                first.assignment().phase == GroupPhase::Failed
            })
            .await
            .expect("yields");
        let error = first.assignment().last_error.unwrap_or_default();
        assert!(error.contains("took over"), "{error}");
        group
            .wait_until("the second joins", |_| second.is_finished())
            .await
            .expect("joins");
        let second = second.await.unwrap().expect("joined");
        group
            .wait_until("the second is active", |_| {
                second.assignment().phase == GroupPhase::Active
            })
            .await
            .expect("active");
        assert_eq!(
            second.assignment().slot,
            first.assignment().slot.or(Some(1))
        );
    }

    #[test]
    fn a_grace_needs_a_member_id_and_a_bound() {
        let e = GroupConfig::new("g", TTL)
            .with_crash_grace(GRACE)
            .validate()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        assert!(e.to_string().contains("member id"), "{e}");
        let e = GroupConfig::new("g", TTL)
            .with_member("a")
            .with_crash_grace(MAX_RESTART_WINDOW + Duration::from_secs(1))
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("crash grace"), "{e}");
        let e = GroupConfig::new("g", TTL)
            .with_outage_grace(MAX_RESTART_WINDOW * 2)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("outage grace"), "{e}");
        GroupConfig::new("g", TTL)
            .with_member("a")
            .with_crash_grace(GRACE)
            .with_outage_grace(Duration::ZERO)
            .validate()
            .unwrap();
    }
}

mod service_api {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use headcount_core::assign::KeySet;
    use headcount_core::recipes::group::{Cause, Change, GroupPhase};
    use headcount_core::testkit::TestGroup;
    use tokio::sync::broadcast::Receiver;

    const TTL: Duration = Duration::from_secs(6);

    fn names() -> Vec<String> {
        [
            "orders", "payments", "refunds", "invoices", "audit", "search", "mail", "sms",
        ]
        .iter()
        .flat_map(|t| (0..8).map(move |p| format!("{t}-{p}")))
        .collect()
    }

    async fn group(n: usize, grace: Option<Duration>) -> TestGroup {
        let keys = KeySet::new(names()).unwrap();
        TestGroup::builder("svc")
            .members(n)
            .ttl(TTL)
            .configure(move |c| {
                let c = c.with_keys(keys.clone());
                match grace {
                    Some(g) => c.with_outage_grace(g),
                    None => c,
                }
            })
            .start()
            .await
            .expect("starts")
    }

    /// Every change `rx` got: the keys each lost, with its cause.
    fn drained(rx: &mut Receiver<Change>) -> Vec<(Cause, usize)> {
        let keys = names();
        let mut out = Vec::new();
        while let Ok(c) = rx.try_recv() {
            out.push((c.cause, c.lost(&keys).len()));
        }
        out
    }

    /// `owned()` names the declared keys by the names the service gave them; the members'
    /// snapshots split the set exactly.
    #[tokio::test]
    async fn owned_names_the_keys_of_the_service() {
        let group = group(3, None).await;
        let mut seen = BTreeSet::new();
        for i in 0..3 {
            let owned = group.member(i).owned();
            assert!(!owned.is_empty());
            for k in owned {
                assert!(group.member(i).owns(&k).is_some(), "{k}");
                assert!(seen.insert(k.clone()), "{k} owned twice");
            }
        }
        assert_eq!(seen, names().into_iter().collect());
    }

    /// A leave and a lapse reach `revocations()` with every key the member owned, and why.
    #[tokio::test]
    async fn revocations_tell_a_leave_and_a_lapse() {
        let mut group = group(3, None).await;
        let owned = group.member(1).owned().len();
        let mut rx = group.member(1).revocations();
        group.leave(1).await.expect("leaves");
        assert_eq!(drained(&mut rx), vec![(Cause::Leave, owned)]);

        let owned = group.member(2).owned().len();
        let mut rx = group.member(2).revocations();
        group.pause(2);
        group.advance(TTL).await;
        assert_eq!(group.member(2).assignment().phase, GroupPhase::Rejoining);
        assert_eq!(drained(&mut rx), vec![(Cause::Lapse, owned)]);
    }

    /// The store down three leases and back with its data: every lease lapsed, yet the members
    /// take their own slots back and no key moves (the outage grace); with the grace off, the
    /// first member back takes every key and hands them back.
    #[tokio::test]
    async fn a_store_outage_moves_nothing_within_the_outage_grace() {
        for (grace, moves) in [(None, false), (Some(Duration::ZERO), true)] {
            let group = group(3, grace).await;
            let keys = names();
            let before: Vec<Option<usize>> = keys.iter().map(|k| group.owner_of(k)).collect();
            let mut rx: Vec<_> = (0..3).map(|i| group.member(i).changes()).collect();
            group.store_down();
            group.advance(TTL * 3).await;
            assert!(
                keys.iter().all(|k| group.owner_of(k).is_none()),
                "all lapsed"
            );
            group.store_up();
            group.converged().await.expect("converges");
            let after: Vec<Option<usize>> = keys.iter().map(|k| group.owner_of(k)).collect();
            if !moves {
                assert_eq!(after, before);
            }
            let gained: usize = rx
                .iter_mut()
                .map(|rx| {
                    let mut n = 0;
                    while let Ok(c) = rx.try_recv() {
                        n += c.gained(&keys).len();
                    }
                    n
                })
                .sum();
            // Each key is gained once, by its owner, back from nothing; more is a move.
            assert_eq!(
                gained > keys.len(),
                moves,
                "grace {grace:?}: {gained} gains"
            );
        }
    }

    /// A static restart and a standby through the kit: neither moves a key it need not.
    #[tokio::test]
    async fn static_restarts_and_standbys_in_the_kit() {
        let mut group = group(3, None).await;
        let keys = names();
        let before: Vec<Option<usize>> = keys.iter().map(|k| group.owner_of(k)).collect();
        group.leave_for_restart(1).await.expect("parks");
        group.advance(TTL / 2).await;
        group.restart(1).await.expect("back");
        group.converged().await.expect("converges");
        let after: Vec<Option<usize>> = keys.iter().map(|k| group.owner_of(k)).collect();
        assert_eq!(after, before, "a static restart moves nothing");

        let standby = group
            .join_with(|c| c.with_standby(TTL * 10))
            .await
            .expect("stands by");
        assert_eq!(
            group.member(standby).assignment().phase,
            GroupPhase::Standby
        );
        assert!(group.member(standby).ready() && !group.member(standby).working());
        group.leave(2).await.expect("leaves");
        group.converged().await.expect("converges");
        for (k, was) in keys.iter().zip(&before) {
            let now = group.owner_of(k);
            let expected = if *was == Some(2) { Some(standby) } else { *was };
            assert_eq!(now, expected, "{k}");
        }
        assert!(group.member(standby).working());
    }
}
