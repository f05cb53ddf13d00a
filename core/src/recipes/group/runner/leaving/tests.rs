//! The leave's decisions, one at a time: each step of a drain, how the claim ends, and the view
//! published after it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::super::fixture::{holder, record, table, view, Member, HB, TTL};
use super::{DrainStep, Exit};
use crate::error::Error;
use crate::recipes::group::grants::{Grant, Scope};
use crate::recipes::group::view::GroupPhase;

fn down() -> Error {
    Error::Unavailable {
        backend: "memory",
        message: "down".into(),
        source: None,
    }
}

/// A member active under a view of `slots`, its lease renewed now, leaving.
fn leaving(slot: u32, slots: &[u32]) -> Member {
    let mut m = Member::active(slot, &view(1, slots));
    m.engine.shared.lock().deadline = Some(m.clock_now() + TTL - TTL / 10);
    m.engine.cache.last_beat = Some(m.clock_now());
    m
}

/// A member leaving while it holds its share: its drain has a grant to wait for.
fn draining() -> (Member, Grant) {
    let mut m = leaving(0, &[0]);
    let grant = m
        .engine
        .shared
        .grant(Scope::Share)
        .expect("a share granted");
    m.engine.leave_begins();
    (m, grant)
}

/// Phase: leaving, nothing in flight. Effect: the drain is over at once.
#[test]
fn a_drain_with_nothing_in_flight_is_over_at_once() {
    let mut m = leaving(0, &[0]);
    m.engine.leave_begins();
    let mut drain = m.engine.drain_begins();
    assert_eq!(m.engine.drain_step(&mut drain), DrainStep::Drained);
}

/// Phase: leaving with a grant held. Events: the timer, a heartbeat on, then past the drain
/// timeout. Effects: wait until the next renewal, renew (the lease is kept while it drains),
/// then cut the drain.
#[test]
fn a_drain_renews_every_heartbeat_until_its_timeout() {
    let (mut m, grant) = draining();
    assert_eq!(m.phase(), GroupPhase::Active);
    let mut drain = m.engine.drain_begins();
    let start = m.clock_now();
    assert_eq!(m.engine.drain_step(&mut drain), DrainStep::Wait(start + HB));
    m.clock.advance(HB);
    let now = m.clock_now();
    let deadline = m.engine.shared.lock().deadline;
    assert_eq!(
        m.engine.drain_step(&mut drain),
        DrainStep::Renew { now, deadline }
    );
    // Renewed: the drain goes on.
    m.engine.shared.lock().deadline = Some(now + TTL - TTL / 10);
    assert_eq!(m.engine.drain_renewed(&mut drain, now, Ok(true)), None);
    // A store error: tried again at a quarter heartbeat.
    assert_eq!(m.engine.drain_renewed(&mut drain, now, Err(down())), None);
    assert_eq!(
        m.engine.drain_step(&mut drain),
        DrainStep::Wait(now + HB / 4)
    );
    // The default drain timeout is one TTL.
    m.clock.advance(TTL);
    assert_eq!(m.engine.drain_step(&mut drain), DrainStep::Cut("timeout"));
    drop(grant);
}

/// Event: the drain's renewal refused (the slot is another's). Effect: the drain is cut, `lost`.
#[test]
fn a_drain_whose_renewal_is_refused_is_cut() {
    let (mut m, _grant) = draining();
    let mut drain = m.engine.drain_begins();
    m.clock.advance(HB);
    let now = m.clock_now();
    assert!(matches!(
        m.engine.drain_step(&mut drain),
        DrainStep::Renew { .. }
    ));
    assert_eq!(
        m.engine.drain_renewed(&mut drain, now, Ok(false)),
        Some("lost")
    );
}

/// Event: the lease deadline passes while a grant is held (the store does not answer). Effect:
/// the drain is cut, `lapsed`.
#[test]
fn a_drain_past_the_lease_deadline_is_cut() {
    let (mut m, _grant) = draining();
    m.engine.claims.abandoned = true;
    let mut drain = m.engine.drain_begins();
    // A given-up claim is not renewed: it waits for the grants or its deadline.
    let deadline = m.engine.shared.lock().deadline.unwrap();
    assert_eq!(m.engine.drain_step(&mut drain), DrainStep::Wait(deadline));
    // At the deadline, before the drain timeout (one TTL).
    m.clock.advance(TTL - TTL / 10);
    assert_eq!(m.engine.drain_step(&mut drain), DrainStep::Cut("lapsed"));
}

/// How the claim ends: parked for a restart when drained; handed over or deleted otherwise;
/// a failing member hands nothing over; a cut drain neither parks nor hands over.
#[test]
fn a_leave_parks_hands_over_or_deletes_its_claim() {
    let mut m = leaving(0, &[0]);
    assert!(matches!(m.engine.exit(true, true), Exit::Park(c) if c.slot == 0));
    assert!(matches!(m.engine.exit(true, true), Exit::Nothing));
    // (restart, drained, failing) -> (hand over, drained)
    for ((restart, drained, failing), want) in [
        ((false, true, false), (true, true)),
        ((true, false, false), (false, false)),
        ((false, true, true), (false, true)),
    ] {
        let mut m = leaving(0, &[0]);
        m.engine.failing = failing;
        match m.engine.exit(restart, drained) {
            Exit::Leave {
                hand_over, drained, ..
            } => assert_eq!((hand_over, drained), want),
            _ => panic!("expected a leave"),
        }
    }
}

/// A parked claim acknowledges every epoch it saw and says when it parked.
#[test]
fn a_parked_claim_acknowledges_what_it_saw() {
    let mut m = leaving(0, &[0]);
    m.engine.cache.highest = 7;
    let claim = m.engine.claims.current.clone().unwrap();
    let parked = m.engine.parked(&claim);
    assert_eq!(parked.acked, 7);
    assert_eq!(parked.nonce, claim.record.nonce);
    assert!(parked.parked.is_some());
}

/// After deleting its claim: the view of the live slots when the published one still names
/// the slot, nothing when it does not.
#[test]
fn the_view_after_a_leave_leaves_the_slot_out() {
    let m = leaving(0, &[0, 1]);
    let next = m
        .engine
        .view_without(&table(&[1], 1, Some(view(1, &[0, 1]))), 0)
        .expect("a view without slot 0");
    assert_eq!(next.epoch, 2);
    assert_eq!(next.holders, vec![holder(1)]);
    assert!(m
        .engine
        .view_without(&table(&[1], 1, Some(view(2, &[1]))), 0)
        .is_none());
    let _ = record(0, 0);
}

/// The leave is over: no grant, no slot, phase `stopped`.
#[test]
fn a_finished_leave_reports_stopped() {
    let mut m = leaving(0, &[0]);
    m.engine.left();
    assert_eq!(m.phase(), GroupPhase::Stopped);
    assert!(m.engine.shared.lock().holder.is_none());
}
