//! Static membership on the in-memory store, on Tokio's paused time: a member that leaves for a
//! restart parks its claim, and the same member id coming back within the restart window takes
//! its slot back: the same slots under the next epoch (so a fence orders its tokens after its
//! previous incarnation's), no key moved, active as soon as the others acknowledged that epoch;
//! too late, it rejoins as after a crash.
// Tests fail by panicking.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

use std::time::Duration;

use headcount_core::fence::FencingToken;
use headcount_core::recipes::group::{Group, GroupConfig, GroupPhase, Member, MAX_RESTART_WINDOW};
use headcount_core::ErrorKind;

mod paused_group;
use paused_group::{converged, owners, Fixture, KEYS, TTL};

#[tokio::test(start_paused = true)]
async fn a_member_back_within_the_window_takes_its_place_back_and_no_key_moves() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b")).await;
    let c = f.join(f.config("c").with_restart_window(TTL * 4)).await;
    let epoch = converged(&[&a, &b, &c]).await;
    let slot = c.assignment().slot.expect("a slot");
    let before = owners(&[&a, &b, &c]);
    let mine: Vec<usize> = (0..KEYS).filter(|&k| before[k] == [2]).collect();
    assert!(!mine.is_empty(), "c owns some keys: {before:?}");

    c.leave_for_restart().await.expect("parks");
    let parked = f.slot_record(slot).await.expect("the slot stays held");
    assert!(parked.is_parked(), "{parked:?}");

    // Away for three TTLs: far longer than a lease, well within the window.
    tokio::time::sleep(TTL * 3).await;
    for m in [&a, &b] {
        let x = m.assignment();
        assert_eq!((x.phase, x.epoch), (GroupPhase::Active, epoch), "{x:?}");
    }
    // Nobody took the away member's keys; the others kept theirs.
    let away = owners(&[&a, &b]);
    for k in 0..KEYS {
        if mine.contains(&k) {
            assert!(
                away[k].is_empty(),
                "key {k} moved while its owner restarted"
            );
        } else {
            assert_eq!(away[k], before[k], "key {k}");
        }
    }

    let tokens = |m: &Member| -> Vec<Option<FencingToken>> {
        (0..KEYS).map(|k| m.would_grant(format!("k{k}"))).collect()
    };
    let kept = (tokens(&a), tokens(&b));
    let started = tokio::time::Instant::now();
    let c2 = f.join(f.config("c").with_restart_window(TTL * 4)).await;
    let back = c2.active(0).await.expect("active");
    // Active once the others acknowledged the republished view: each sees it at its next
    // heartbeat (a third of the TTL), and the returning member reads their acknowledgements an
    // eighth of a heartbeat later at most.
    let heartbeat = TTL / 3;
    assert!(
        started.elapsed() <= heartbeat + heartbeat / 8 + Duration::from_millis(20),
        "{:?}",
        started.elapsed()
    );
    // The same slots under the next epoch: its keys' tokens are above its previous
    // incarnation's, so a fence orders the two.
    assert_eq!((back.epoch, back.slot), (epoch + 1, Some(slot)), "{back:?}");
    assert_eq!(back.live, [0, 1, 2]);
    for k in &mine {
        let token = c2.would_grant(format!("k{k}")).expect("its key again");
        assert!(token.get() > epoch, "key {k}: token {token}");
    }
    assert_eq!(converged(&[&a, &b, &c2]).await, epoch + 1);
    assert_eq!(owners(&[&a, &b, &c2]), before, "every key where it was");
    // The others' keys kept their tokens: no grant of theirs is fenced off.
    assert_eq!((tokens(&a), tokens(&b)), kept);
    let record = f.slot_record(slot).await.unwrap();
    // The same slot, under a claim of the returning process's own (a fresh nonce).
    assert!(
        !record.is_parked() && record.nonce != parked.nonce,
        "{record:?}"
    );
    for m in [a, b, c2] {
        m.leave().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_member_back_after_the_window_rejoins_as_after_a_crash() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b")).await;
    let epoch = converged(&[&a, &b]).await;
    b.leave_for_restart().await.expect("parks");
    // The window (one TTL by default) runs out: the slot expires and `a` takes every key.
    tokio::time::sleep(TTL * 3).await;
    let x = a.assignment();
    assert!(x.epoch > epoch && x.live.len() == 1, "{x:?}");
    assert!(owners(&[&a]).iter().all(|o| o == &[0]));
    let b2 = f.join(f.config("b")).await;
    let later = converged(&[&a, &b2]).await;
    assert!(later > x.epoch, "a new view for the new claim");
    a.leave().await.unwrap();
    b2.leave().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_join_while_a_member_is_away_does_not_wait_for_it() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b").with_restart_window(TTL * 10)).await;
    converged(&[&a, &b]).await;
    b.leave_for_restart().await.expect("parks");
    let started = tokio::time::Instant::now();
    let c = f.join(f.config("c")).await;
    c.active(0).await.expect("active");
    // The parked claim counts as having acknowledged: the hand-off settles at once, not
    // after the ten-TTL window.
    assert!(started.elapsed() < TTL * 2, "{:?}", started.elapsed());
    let x = c.assignment();
    assert_eq!(
        x.live.len(),
        3,
        "the away member keeps its slot in the view: {x:?}"
    );
    // Every key has at most one owner; the away member's have none.
    assert!(owners(&[&a, &c]).iter().all(|o| o.len() <= 1));
    let b2 = f.join(f.config("b").with_restart_window(TTL * 10)).await;
    let epoch = converged(&[&a, &b2, &c]).await;
    assert_eq!(epoch, x.epoch + 1, "the same slots under the next epoch");
    assert_eq!(b2.assignment().live, x.live);
    assert!(owners(&[&a, &b2, &c]).iter().all(|o| o.len() == 1));
    for m in [a, b2, c] {
        m.leave().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn twins_returning_with_one_id_one_takes_the_claim_and_the_other_is_refused() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b").with_restart_window(TTL * 4)).await;
    let epoch = converged(&[&a, &b]).await;
    b.leave_for_restart().await.expect("parks");
    let one = Group::join(f.store.clone(), f.config("b"));
    let two = Group::join(f.store.clone(), f.config("b"));
    let (one, two) = tokio::join!(one, two);
    let (won, lost) = match (one, two) {
        (Ok(m), Err(e)) | (Err(e), Ok(m)) => (m, e),
        (one, two) => panic!("exactly one twin joins: {one:?} {two:?}"),
    };
    assert_eq!(lost.kind(), ErrorKind::Rejected, "{lost}");
    assert!(lost.to_string().contains("another live process"), "{lost}");
    assert_eq!(converged(&[&a, &won]).await, epoch + 1);
    a.leave().await.unwrap();
    won.leave().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_member_with_a_random_id_leaves_for_good_and_says_why() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f
        .join(GroupConfig::new("g", TTL).with_clock(f.clock.clone()))
        .await;
    let epoch = converged(&[&a, &b]).await;
    let err = b
        .leave_for_restart()
        .await
        .expect_err("no id to come back as");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("with_member"), "{err}");
    // It left: `a` takes every key at once, not after a window.
    let x = a.active(epoch + 1).await.expect("active");
    assert_eq!(x.live.len(), 1, "{x:?}");
    a.leave().await.unwrap();
}

#[test]
fn a_restart_window_outside_the_limits_is_refused() {
    for bad in [Duration::ZERO, MAX_RESTART_WINDOW + Duration::from_secs(1)] {
        let err = GroupConfig::new("g", TTL)
            .with_restart_window(bad)
            .validate()
            .expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains("restart window"), "{err}");
    }
    GroupConfig::new("g", TTL)
        .with_restart_window(MAX_RESTART_WINDOW)
        .validate()
        .expect("the longest window is fine");
}

/// A store that loses writes can show a member's parked record again while its returning
/// process runs (a rollback to before the take-back): the process's renewal fails, and it takes
/// the parked slot back again instead of claiming another slot or calling its own parked record
/// a twin.
#[tokio::test(start_paused = true)]
async fn a_parked_record_restored_under_a_running_member_is_taken_back_again() {
    let f = Fixture::new();
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b").with_restart_window(TTL * 10)).await;
    converged(&[&a, &b]).await;
    let slot = b.assignment().slot.unwrap();
    b.leave_for_restart().await.expect("parks");
    let key = format!("hc:{{g}}:slot:{slot}");
    let parked = f.store.get(&key).await.unwrap().expect("parked");
    let b2 = f.join(f.config("b").with_restart_window(TTL * 10)).await;
    let epoch = converged(&[&a, &b2]).await;
    // The rollback: the slot holds the parked record again.
    let live = f.store.get(&key).await.unwrap().expect("taken back");
    assert!(f
        .store
        .compare_and_set(&key, Some(&live), &parked, Some(TTL * 10))
        .await
        .unwrap());
    tokio::time::sleep(TTL).await;
    let later = converged(&[&a, &b2]).await;
    assert!(later > epoch, "{later} after {epoch}");
    let x = b2.assignment();
    assert_eq!((x.slot, x.live.len()), (Some(slot), 2), "{x:?}");
    let record = f.slot_record(slot).await.unwrap();
    assert!(!record.is_parked(), "{record:?}");
    for m in [a, b2] {
        m.leave().await.unwrap();
    }
}

/// A store that loses a take-back (a failover to a replica that had not received it) while the
/// member's process is started again within the window (a crash loop, or two restarts racing):
/// the second take-back publishes the same slots under the same next epoch the first one did. If
/// it activated that view at once, both processes would grant the member's keys under one token,
/// which no fence can order. The take-back waits for the other members' acknowledgements
/// instead, and the member that saw the first view of that epoch refuses to acknowledge the
/// second: at no instant do the two grant one key under one token.
#[tokio::test(start_paused = true)]
async fn a_lost_take_back_taken_again_never_reuses_the_first_ones_tokens() {
    let f = Fixture::new();
    let window = TTL * 10;
    let a = f.join(f.config("a")).await;
    let b = f.join(f.config("b").with_restart_window(window)).await;
    let epoch = converged(&[&a, &b]).await;
    b.leave_for_restart().await.expect("parks");
    let before_take_back = f.memory.snapshot();
    let first = f.join(f.config("b").with_restart_window(window)).await;
    assert_eq!(converged(&[&a, &first]).await, epoch + 1);
    let keys: Vec<String> = (0..KEYS)
        .map(|k| format!("k{k}"))
        .filter(|k| first.would_grant(k).is_some())
        .collect();
    assert!(!keys.is_empty());

    // The store loses the take-back, its view and the acknowledgements; a second process with
    // the same id starts before the first notices.
    f.memory.restore(&before_take_back);
    let second = f.join(f.config("b").with_restart_window(window)).await;
    let mut activated = None;
    for _ in 0..(TTL * 6).as_millis() / 5 {
        for k in &keys {
            if let (Some(x), Some(y)) = (first.would_grant(k), second.would_grant(k)) {
                assert_ne!(x, y, "key {k}: two processes grant it under one token");
            }
        }
        if activated.is_none() && second.assignment().phase == GroupPhase::Active {
            activated = Some(second.assignment().epoch);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The second process went on under a view above both of epoch + 1.
    let activated = activated.expect("the second process became active");
    assert!(activated > epoch + 1, "active under {activated}");
    for m in [a, first, second] {
        let _ = m.leave().await;
    }
}
