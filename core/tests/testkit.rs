//! The test kit itself: a whole group on the manual clock, crashed, paused, restarted and left,
//! in milliseconds of real time.

// Tests fail by panicking.
#![allow(clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use headcount_core::assign::AssignorKind;
use headcount_core::recipes::group::GroupPhase;
use headcount_core::testkit::{KitError, MemberState, TestGroup};

fn keys() -> Vec<String> {
    (0..128).map(|i| format!("order-{i}")).collect()
}

/// Every key is granted by exactly one member.
fn assert_all_owned(group: &TestGroup, keys: &[String]) {
    for k in keys {
        assert_eq!(group.granters(k).len(), 1, "{k}: {:?}", group.granters(k));
    }
}

/// Simulated minutes must cost little real time, even in a debug build on a busy machine.
fn assert_fast(started: Instant) {
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?} of real time",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_started_group_has_converged_and_shares_every_key() {
    let started = Instant::now();
    let group = TestGroup::start("g", 3).await.expect("starts");
    assert!(group.is_converged());
    let keys = keys();
    assert_all_owned(&group, &keys);
    let mut owners: Vec<usize> = keys.iter().filter_map(|k| group.owner_of(k)).collect();
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(owners, [0, 1, 2], "every member owns some of 128 keys");
    let live = group.member(0).assignment().live;
    assert_eq!(live.len(), 3);
    for i in 0..3 {
        assert_eq!(group.id(i), format!("m{i}"));
        assert_eq!(group.member(i).assignment().live, live);
    }
    assert_fast(started);
}

#[tokio::test]
async fn a_crashed_members_keys_move_only_after_its_lease_runs_out() {
    let started = Instant::now();
    let mut group = TestGroup::start("g", 3).await.expect("starts");
    let keys = keys();
    let crashed = 1;
    let its: Vec<&String> = keys
        .iter()
        .filter(|k| group.owner_of(k) == Some(crashed))
        .collect();
    assert!(!its.is_empty());
    let t0 = group.elapsed();
    group.crash(crashed);
    assert_eq!(group.state(crashed), MemberState::Crashed);
    assert!(group.try_member(crashed).is_none());
    // Its last renewal was at most a heartbeat (TTL/3) before the crash, so its lease runs at
    // least 2/3 TTL more: nobody else may take its keys meanwhile.
    group.advance(group.ttl() / 2).await;
    for k in &its {
        assert_eq!(group.granters(k), Vec::<usize>::new(), "{k} taken early");
    }
    let done = group.converged().await.expect("converges without it");
    assert_eq!(done.live.len(), 2);
    let took = group.elapsed() - t0;
    assert!(took >= group.ttl() * 2 / 3, "keys moved after {took:?}");
    assert!(took <= group.ttl() * 3, "keys moved only after {took:?}");
    assert_all_owned(&group, &keys);
    assert_eq!(group.running(), [0, 2]);
    assert_fast(started);
}

#[tokio::test]
async fn a_members_keys_move_at_once_when_it_leaves() {
    let started = Instant::now();
    let mut group = TestGroup::start("g", 3).await.expect("starts");
    let keys = keys();
    let t0 = group.elapsed();
    group.leave(0).await.expect("leaves");
    assert_eq!(group.state(0), MemberState::Left);
    let done = group.converged().await.expect("converges");
    assert_eq!(done.live.len(), 2);
    let took = group.elapsed() - t0;
    assert!(
        took < group.ttl() / 2,
        "a leave took {took:?} of simulated time, as long as a lease"
    );
    assert_all_owned(&group, &keys);
    assert_fast(started);
}

#[tokio::test]
async fn a_paused_members_grants_turn_invalid_and_no_key_is_granted_twice() {
    let started = Instant::now();
    let mut group = TestGroup::start("g", 3).await.expect("starts");
    let keys = keys();
    let paused = 2;
    let key = keys
        .iter()
        .find(|k| group.owner_of(k) == Some(paused))
        .expect("member 2 owns a key")
        .clone();
    let grant = group.member(paused).owns(&key).expect("granted");
    group.pause(paused);
    assert_eq!(group.state(paused), MemberState::Paused);
    // Step past the lease and well beyond, checking at every step that no key is granted twice.
    let step = group.ttl() / 20;
    for _ in 0..60 {
        group.advance(step).await;
        group.assert_exclusive(&keys);
    }
    assert!(!grant.is_valid(), "a grant outlived its lease while paused");
    assert!(group.member(paused).would_grant(&key).is_none());
    assert_eq!(
        group.member(paused).assignment().phase,
        GroupPhase::Rejoining
    );
    // The others converged without it and took its keys.
    group.converged().await.expect("converges without it");
    assert_eq!(group.member(0).assignment().live.len(), 2);
    assert_all_owned(&group, &keys);
    drop(grant);
    // Resumed, it claims again and the three converge.
    group.resume(paused);
    let done = group.converged().await.expect("converges with it");
    assert_eq!(done.live.len(), 3);
    assert_all_owned(&group, &keys);
    assert_fast(started);
}

#[tokio::test]
async fn a_restarted_member_comes_back_with_its_id_and_slot() {
    let started = Instant::now();
    let mut group = TestGroup::builder("g")
        .members(3)
        .member_ids(["alpha", "beta", "gamma"])
        .assignor(AssignorKind::JumpFailover)
        .start()
        .await
        .expect("starts");
    let keys = keys();
    let slot = group.member(1).assignment().slot.expect("a slot");
    let epoch = group.member(1).assignment().epoch;
    group.restart(1).await.expect("rejoins");
    assert_eq!(group.state(1), MemberState::Running);
    assert_eq!(group.member(1).member(), "beta");
    let done = group.converged().await.expect("converges");
    assert!(done.epoch > epoch);
    assert_eq!(done.live.len(), 3);
    assert_eq!(group.member(1).assignment().slot, Some(slot));
    assert_all_owned(&group, &keys);
    assert_fast(started);
}

#[tokio::test]
async fn a_member_joins_a_running_group() {
    let mut group = TestGroup::start("g", 2).await.expect("starts");
    let keys = keys();
    let i = group.join().await.expect("joins");
    assert_eq!(i, 2);
    assert_eq!(group.id(i), "m2");
    // While it joins, keys are handed off, never granted twice.
    for _ in 0..40 {
        group.advance(group.ttl() / 20).await;
        group.assert_exclusive(&keys);
    }
    let done = group.converged().await.expect("converges");
    assert_eq!(done.live.len(), 3);
    assert!(keys.iter().any(|k| group.owner_of(k) == Some(i)));
}

#[tokio::test]
async fn a_group_that_cannot_converge_in_time_names_who_is_behind() {
    let mut group = TestGroup::builder("g")
        .members(2)
        .limit(Duration::from_secs(2))
        .start()
        .await
        .expect("starts");
    // Member 1 stalls: until its 6 s lease runs out member 0 keeps it in the view, so 2 s is
    // too short for the group to converge without it.
    group.pause(1);
    let err = group.converged().await.expect_err("too soon");
    let KitError::NotConverged(e) = &err else {
        panic!("{err}");
    };
    assert_eq!(e.laggards.len(), 1, "{e}");
    assert_eq!(e.laggards[0].0, 0);
    assert_eq!(e.laggards[0].1.live.len(), 2, "{e}");
    assert!(err.to_string().contains("member 0 (`m0`)"), "{err}");
    // A condition of one's own that never holds is named too.
    let err = group
        .wait_until("member 1 back", |g| g.state(1) == MemberState::Running)
        .await
        .expect_err("it stays paused");
    assert!(
        matches!(&err, KitError::Timeout { what, waited } if what == "member 1 back" && *waited >= Duration::from_secs(2)),
        "{err}"
    );
}

#[tokio::test]
async fn a_join_refused_by_the_group_is_a_typed_error() {
    let mut group = TestGroup::builder("g")
        .members(1)
        .configure(|c| c.with_max_slots(1))
        .start()
        .await
        .expect("starts");
    let err = group.join().await.expect_err("the group is full");
    assert!(
        matches!(
            &err,
            KitError::Group {
                index: 1,
                action: "join",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(group.len(), 1, "the refused member is not kept");
}

#[tokio::test]
async fn twenty_members_through_a_crash_a_pause_a_restart_a_leave_and_a_join() {
    let started = Instant::now();
    let mut group = TestGroup::start("g", 20).await.expect("starts");
    let keys: Vec<String> = (0..256).map(|i| format!("p{i:03}")).collect();
    assert_all_owned(&group, &keys);
    group.crash(1);
    group.pause(2);
    for _ in 0..40 {
        group.advance(group.ttl() / 10).await;
        group.assert_exclusive(&keys);
    }
    assert_eq!(
        group.converged().await.expect("without 1 and 2").live.len(),
        18
    );
    assert_all_owned(&group, &keys);
    group.resume(2);
    group.restart(1).await.expect("1 restarts");
    group.leave(0).await.expect("0 leaves");
    let i = group.join().await.expect("one more joins");
    assert_eq!(i, 20);
    for _ in 0..40 {
        group.advance(group.ttl() / 10).await;
        group.assert_exclusive(&keys);
    }
    assert_eq!(group.converged().await.expect("all but 0").live.len(), 20);
    assert_all_owned(&group, &keys);
    assert_fast(started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "current-thread runtime")]
async fn a_multi_thread_runtime_is_refused_at_once() {
    let _ = TestGroup::builder("g").build();
}

/// The way a service is tested with the kit: a worker task per member, as the service runs it,
/// that takes every key its member is granted and records who wrote it with which token; after
/// a crash and a restart, every key was last written by its owner, and no write's token went
/// backwards.
#[tokio::test]
async fn a_service_of_workers_keeps_its_writes_ordered_through_a_crash() {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use headcount_core::fence::{FencingToken, MemoryFence};
    use headcount_core::recipes::group::Member;

    type Sink = Arc<Mutex<BTreeMap<String, (String, FencingToken)>>>;

    /// The service under test: on every assignment change, writes each key it owns to the sink,
    /// through a fence.
    fn spawn_worker(member: Member, keys: Arc<Vec<String>>, sink: Sink, fence: Arc<MemoryFence>) {
        tokio::spawn(async move {
            let mut rx = member.watch();
            loop {
                for k in keys.iter() {
                    if let Some(grant) = member.owns(k) {
                        if fence.admit(k, grant.token()) {
                            let mut sink = sink.lock().expect("sink");
                            sink.insert(k.clone(), (member.member().to_owned(), grant.token()));
                        }
                    }
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    let started = Instant::now();
    let keys = Arc::new(keys());
    let sink: Sink = Arc::default();
    let fence = Arc::new(MemoryFence::new());
    let mut group = TestGroup::start("g", 3).await.expect("starts");
    for i in 0..3 {
        spawn_worker(
            group.member(i).clone(),
            keys.clone(),
            sink.clone(),
            fence.clone(),
        );
    }
    group.run_pending().await;
    assert_eq!(sink.lock().expect("sink").len(), keys.len());
    group.crash(0);
    group.converged().await.expect("without 0");
    group.restart(0).await.expect("0 restarts");
    spawn_worker(
        group.member(0).clone(),
        keys.clone(),
        sink.clone(),
        fence.clone(),
    );
    group.converged().await.expect("with 0 again");
    group.run_pending().await;
    let sink = sink.lock().expect("sink");
    for k in keys.iter() {
        let owner = group.owner_of(k).expect("owned");
        let (writer, token) = sink.get(k).expect("written");
        assert_eq!(writer, group.id(owner), "{k}");
        assert_eq!(Some(*token), group.member(owner).would_grant(k), "{k}");
    }
    assert_fast(started);
}

#[tokio::test]
async fn a_layer_of_ones_own_cuts_one_member_off_the_store() {
    use std::sync::Arc;

    use headcount_core::sim::{Faults, FaultyStore};
    use headcount_core::DynStore;

    let faults = Faults::new(7);
    let cut = faults.clone();
    let mut group = TestGroup::builder("g")
        .members(3)
        .layer(move |i, store, clock| {
            if i == 1 {
                Arc::new(FaultyStore::new(store, cut.clone(), clock)) as DynStore
            } else {
                store
            }
        })
        .start()
        .await
        .expect("starts");
    let keys = keys();
    // The store is down for member 1 alone: it loses its lease, the others take its keys.
    faults.set_down(true);
    group
        .wait_until("member 1 out of the view", |g| {
            g.member(0).assignment().live.len() == 2
        })
        .await
        .expect("in time");
    group.assert_exclusive(&keys);
    assert!(keys.iter().all(|k| group.owner_of(k) != Some(1)));
    assert_ne!(group.member(1).assignment().phase, GroupPhase::Active);
    // Back up: it claims again and the three converge.
    faults.set_down(false);
    assert_eq!(group.converged().await.expect("with 1 again").live.len(), 3);
    assert_all_owned(&group, &keys);
    group.leave(1).await.expect("leaves");
}
