//! The heartbeat's decisions, one at a time: how a beat opens for a member in a given state,
//! and what it does with the store's answer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use super::super::fixture::{holder, record, table, view, Member, TTL};
use super::{Closing, Heard, Opening};
use crate::recipes::group::runner::{Claim, SlotsSeen};
use crate::recipes::group::table::SlotTable;
use crate::recipes::group::view::GroupPhase;

fn heard(renewed: bool, t: SlotTable, listed: bool) -> Heard {
    Heard {
        renewed,
        table: Arc::new(t),
        changed: true,
        fresh: true,
        listed,
    }
}

fn claim_of(m: &Member) -> Claim {
    m.engine.claims.current.clone().unwrap()
}

/// Phase: active, its lease deadline passed on its own clock. Event: the heartbeat's timer.
/// Effect: all work stops (phase `rejoining`) before the renewal is sent.
#[test]
fn a_beat_past_the_lease_deadline_stops_all_work_then_renews() {
    let mut m = Member::active(0, &view(1, &[0]));
    m.engine.shared.lock().deadline = Some(m.clock_now());
    assert!(matches!(m.engine.open_beat(), Opening::Renew { .. }));
    assert_eq!(m.phase(), GroupPhase::Rejoining);
}

/// Phase: gave its lease up (a drain timeout). Event: the heartbeat's timer, before and after
/// the lease ran out. Effect: nothing, then a claim afresh.
#[test]
fn a_member_that_gave_its_lease_up_waits_for_it_to_pass_then_claims() {
    let mut m = Member::active(0, &view(1, &[0]));
    m.engine.claims.abandoned = true;
    m.engine.shared.lock().deadline = Some(m.clock_now() + TTL);
    assert!(matches!(m.engine.open_beat(), Opening::Nothing));
    assert!(m.engine.claims.current.is_some());
    m.clock.advance(TTL);
    assert!(matches!(m.engine.open_beat(), Opening::Nothing));
    assert!(m.engine.claims.current.is_none());
    assert!(!m.engine.claims.abandoned);
    assert!(matches!(m.engine.open_beat(), Opening::Claim));
}

/// Event: a refused renewal judged on the table kept from an earlier beat. Effect: the table
/// is listed before deciding, and the directories are read whole at the next beat.
#[test]
fn a_refused_renewal_on_a_kept_table_is_checked_against_a_listing() {
    let mut m = Member::active(0, &view(1, &[0]));
    m.engine.cache.view_version = Some("3".into());
    m.engine.cache.slots = Some(SlotsSeen {
        version: "4".into(),
        table: Arc::new(table(&[0], 1, Some(view(1, &[0])))),
    });
    let answer = heard(false, table(&[0], 1, Some(view(1, &[0]))), false);
    assert_eq!(m.engine.relist(&answer), Some(false));
    assert!(m.engine.cache.view_version.is_none());
    assert!(m.engine.cache.slots.is_none());
    // Listed in this beat already: decided on as it is.
    let answer = heard(false, table(&[0], 1, Some(view(1, &[0]))), true);
    assert_eq!(m.engine.relist(&answer), None);
}

/// Event: a refused renewal whose listing shows this claim with other text (a write of ours
/// applied after its error). Effect: the claim takes that text, keeps working, claims nothing.
#[test]
fn a_refused_renewal_of_a_claim_still_ours_takes_its_text() {
    let mut m = Member::active(0, &view(1, &[0]));
    let claim = claim_of(&m);
    let mut t = table(&[0], 1, Some(view(1, &[0])));
    t.slots.insert(0, record(0, 1));
    let sent = m.clock_now();
    assert!(matches!(
        m.engine.on_heard(&claim, sent, &heard(false, t, true)),
        Closing::Done
    ));
    assert_eq!(claim_of(&m).record.acked, 1);
    assert_eq!(m.phase(), GroupPhase::Active);
}

/// Event: a refused renewal whose listing shows another claim in the slot. Effect: all work
/// stops, the slot is preferred for the claim that follows.
#[test]
fn a_lost_slot_stops_all_work_and_claims_again() {
    let mut m = Member::active(0, &view(1, &[0]));
    let claim = claim_of(&m);
    let mut t = table(&[0], 1, Some(view(1, &[0])));
    let mut theirs = record(0, 1);
    theirs.nonce = 7;
    theirs.member = "other".into();
    t.slots.insert(0, theirs);
    let sent = m.clock_now();
    assert!(matches!(
        m.engine.on_heard(&claim, sent, &heard(false, t, true)),
        Closing::Reclaim
    ));
    assert!(m.engine.claims.current.is_none());
    assert_eq!(m.engine.claims.preferred, Some(0));
    assert_eq!(m.phase(), GroupPhase::Rejoining);
}

/// Event: a renewal answered with the table unchanged. Phase: active. Effect: the lease is
/// extended from when the renewal was sent, and nothing else is done.
#[test]
fn a_renewed_steady_beat_extends_the_lease_and_does_nothing_else() {
    let mut m = Member::active(0, &view(1, &[0]));
    let claim = claim_of(&m);
    let sent = m.clock_now();
    let mut answer = heard(true, table(&[0], 1, Some(view(1, &[0]))), false);
    answer.changed = false;
    answer.fresh = false;
    assert!(matches!(
        m.engine.on_heard(&claim, sent, &answer),
        Closing::Done
    ));
    assert_eq!(m.engine.shared.lock().deadline, Some(sent + TTL - TTL / 10));
    assert_eq!(m.engine.shared.lock().holder, Some(holder(0)));
    // A changed table calls for a round.
    answer.changed = true;
    assert!(matches!(
        m.engine.on_heard(&claim, sent, &answer),
        Closing::Round
    ));
}
