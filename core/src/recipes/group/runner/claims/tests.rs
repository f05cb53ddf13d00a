//! The join's and the claim's decisions, one at a time: what a join does on the table it read,
//! the record a claim or a take-back writes, the view a take-back publishes, and what a member
//! does about twins of its id.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use super::super::fixture::{holder, nonce, record, table, view, Member, HB, TTL};
use super::{Join, JoinStep, CLAIM_ATTEMPTS, JOIN_POLL};
use crate::error::ErrorKind;
use crate::recipes::group::records::{SettledRecord, SlotRecord};
use crate::recipes::group::table::SlotTable;

/// A member joining, its claim not made yet.
fn joining(member_slot: u32) -> Member {
    let mut m = Member::at(member_slot);
    m.engine.claims.current = None;
    m
}

/// `t` with slot `slot` held by this member's id (`m{member_slot}`), parked or live.
fn with_own(mut t: SlotTable, slot: u32, member_slot: u32, parked: bool) -> SlotTable {
    let mut r = record(slot, 1);
    r.member = format!("m{member_slot}");
    r.parked = parked.then_some(1);
    t.slots.insert(slot, r);
    t
}

#[test]
fn a_join_with_no_claim_of_its_id_claims() {
    let mut m = joining(9);
    let mut join = Join::default();
    let t = table(&[0, 1], 1, Some(view(1, &[0, 1])));
    assert!(matches!(
        m.engine.join_step(&t, &mut join),
        Ok(JoinStep::Claim)
    ));
}

#[test]
fn a_join_takes_back_a_parked_claim_of_its_id() {
    let mut m = joining(9);
    let mut join = Join::default();
    let t = with_own(table(&[0], 1, None), 3, 9, true);
    assert!(matches!(
        m.engine.join_step(&t, &mut join),
        Ok(JoinStep::TakeBack(3, _))
    ));
    assert_eq!(m.engine.claims.preferred, Some(3));
    // Lost to another process of the id: looks again soon, and gives up after many in a row.
    for _ in 1..CLAIM_ATTEMPTS {
        assert_eq!(
            m.engine.take_back_lost(&mut join, 3).unwrap(),
            JOIN_POLL.min(HB) / 4
        );
    }
    let e = m.engine.take_back_lost(&mut join, 3).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Contended);
}

/// A live claim of its id, without a crash grace: the join waits for its lease to pass, then
/// says another live process uses the id.
#[test]
fn a_join_waits_out_a_live_claim_of_its_id_then_refuses() {
    let mut m = joining(9);
    let mut join = Join::default();
    let t = with_own(table(&[0], 1, None), 3, 9, false);
    assert!(matches!(
        m.engine.join_step(&t, &mut join),
        Ok(JoinStep::Wait(d)) if d == JOIN_POLL.min(HB)
    ));
    m.clock.advance(TTL + 2 * HB);
    let e = match m.engine.join_step(&t, &mut join) {
        Err(e) => e,
        Ok(_) => panic!("a join past the lease must refuse"),
    };
    assert_eq!(e.kind(), ErrorKind::Rejected);
}

/// With a crash grace, a live claim of its id is taken over at once.
#[test]
fn with_a_crash_grace_a_join_takes_over_a_live_claim_of_its_id() {
    let mut m = joining(9);
    m.engine.cfg.crash_grace = Duration::from_secs(20);
    let mut join = Join::default();
    let t = with_own(table(&[0], 1, None), 3, 9, false);
    assert!(matches!(
        m.engine.join_step(&t, &mut join),
        Ok(JoinStep::TakeBack(3, _))
    ));
}

/// A claim prefers the slot it held last, acknowledges every epoch seen, and is refused when
/// the group is full.
#[test]
fn a_claim_takes_the_preferred_free_slot_and_acknowledges_what_was_seen() {
    let mut m = joining(9);
    m.engine.claims.preferred = Some(4);
    let t = table(&[0, 1], 1, Some(view(5, &[0, 1])));
    let (slot, r) = m.engine.new_claim(&t, &[], 0).unwrap();
    assert_eq!(slot, 4);
    assert_eq!(r.acked, 5);
    assert_eq!(r.member, "m9");
    assert!(m.engine.claims.own_nonces.contains(&r.nonce));
    m.engine.cfg.max_slots = 2;
    m.engine.claims.preferred = None;
    let e = m.engine.new_claim(&t, &[], 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Rejected);
}

/// After losing a race, a claim tries the free slots of the same listing that it has not lost;
/// when it lost them all it tries the listing's own choice (the group is not full: the table
/// is read again later).
#[test]
fn a_claim_that_lost_a_race_tries_another_free_slot_of_the_listing() {
    let mut m = joining(9);
    let t = table(&[0, 1], 1, Some(view(5, &[0, 1])));
    assert_eq!(m.engine.new_claim(&t, &[], 0).unwrap().0, 2);
    assert_eq!(m.engine.new_claim(&t, &[2], 0).unwrap().0, 3);
    assert_eq!(m.engine.new_claim(&t, &[2, 3], 0).unwrap().0, 4);
    m.engine.cfg.max_slots = 3;
    assert_eq!(m.engine.new_claim(&t, &[2], 0).unwrap().0, 2);
}

/// A parked claim taken back acknowledges every epoch seen; a live one taken over keeps the
/// previous process's acknowledgements.
#[test]
fn a_take_back_acknowledges_only_what_its_predecessor_let_go_of() {
    let mut m = joining(9);
    let t = table(&[0], 1, Some(view(6, &[0])));
    let mut parked = record(3, 2);
    parked.parked = Some(1);
    let back = m.engine.take_back_record(&t, &parked);
    assert_eq!((back.acked, back.view), (6, 0));
    assert_ne!(back.nonce, parked.nonce);
    let mut live = record(3, 2);
    live.view = 42;
    let over = m.engine.take_back_record(&t, &live);
    assert_eq!((over.acked, over.view), (2, 42));
}

/// A take-back republishes the settled view's slots, its new claim in place of the parked one,
/// above the previous epochs; nothing when the view is not settled.
#[test]
fn a_take_back_republishes_the_same_slots_above_a_settled_view() {
    let mut m = joining(1);
    // The take-back saw epoch 3 (`take_back_record`).
    m.engine.cache.highest = 3;
    let v = view(3, &[0, 1]);
    let mut t = table(&[0], 3, Some(v.clone()));
    let claim = SlotRecord {
        nonce: 77,
        ..record(1, 3)
    };
    t.slots.insert(1, claim.clone());
    let parked = holder(1);
    let new = claim.holder(1);
    assert!(m.engine.republishing(&t, parked, new).is_none());
    t.settled = Some(SettledRecord {
        epoch: 3,
        view: v.digest(),
    });
    let next = m.engine.republishing(&t, parked, new).expect("republished");
    assert_eq!(next.epoch, 4);
    assert_eq!(next.holders, vec![holder(0), new]);
}

/// Claiming again after a lapse: another live process of the id means this one yields; a
/// parked claim of the id is taken back.
#[test]
fn a_reclaim_yields_to_a_live_twin_and_takes_back_a_parked_claim() {
    let m = Member::at(0);
    let twin = with_own(table(&[1], 1, None), 2, 0, false);
    assert_eq!(
        m.engine.reclaiming(&twin).unwrap_err().kind(),
        ErrorKind::Rejected
    );
    let parked = with_own(table(&[1], 1, None), 2, 0, true);
    assert!(matches!(m.engine.reclaiming(&parked), Ok(Some((2, _)))));
    assert!(matches!(
        m.engine.reclaiming(&table(&[0, 1], 1, None)),
        Ok(None)
    ));
}

/// An old claim this process made is shortened, not yielded to; a live twin below yields
/// this one.
#[test]
fn twins_of_the_id_below_make_this_claim_yield_and_own_old_claims_expire() {
    let mut m = Member::at(5);
    let mut old = record(2, 1);
    old.member = "m5".into();
    m.engine.claims.remember_nonce(old.nonce);
    let mut t = table(&[5], 1, None);
    t.slots.insert(2, old.clone());
    assert_eq!(m.engine.own_old_claims(&t, 5), vec![(2, old.to_string())]);
    assert!(m.engine.yields_to_twin(&t, 5).is_ok());
    let twin = with_own(table(&[5], 1, None), 1, 5, false);
    assert_eq!(
        m.engine.yields_to_twin(&twin, 5).unwrap_err().kind(),
        ErrorKind::Rejected
    );
    let _ = nonce(0);
}

/// Waiting out a predecessor (crash grace): renewals until the wait is over; another process
/// of the id taking the slot makes this one yield; a store error is retried, and ends the join
/// a lease TTL past the wait.
#[test]
fn a_take_over_waits_out_its_predecessor_renewing_and_yields_to_a_newer_process() {
    use super::Waiting;
    use crate::error::Error;
    let m = Member::at(0);
    let mut slow = record(0, 0);
    slow.ttl_ms = 5_000;
    assert_eq!(m.engine.predecessor_wait(&slow), Duration::from_secs(5));
    assert_eq!(m.engine.predecessor_wait(&record(0, 0)), TTL);
    let end = Duration::from_secs(20);
    let down = || Error::Unavailable {
        backend: "memory",
        message: "down".into(),
        source: None,
    };
    let early = end - HB;
    assert_eq!(
        m.engine.predecessor_renewed(end, early, Ok(true)).unwrap(),
        Waiting::Renewed
    );
    assert_eq!(
        m.engine.predecessor_renewed(end, end, Ok(true)).unwrap(),
        Waiting::Over
    );
    assert_eq!(
        m.engine
            .predecessor_renewed(end, early, Ok(false))
            .unwrap_err()
            .kind(),
        ErrorKind::Rejected
    );
    assert_eq!(
        m.engine
            .predecessor_renewed(end, early, Err(down()))
            .unwrap(),
        Waiting::Failed { pause: None }
    );
    assert_eq!(
        m.engine.predecessor_renewed(end, end, Err(down())).unwrap(),
        Waiting::Failed {
            pause: Some(HB / 4)
        }
    );
    assert!(m
        .engine
        .predecessor_renewed(end, end + TTL, Err(down()))
        .is_err());
}
