//! The round's handlers, one at a time: for a member in a given phase and a table it read, the
//! store call each step asks for, and what the answer changes (as openraft's engine tests assert
//! the commands its engine emits). No store is involved: the test plays the driver.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use super::super::fixture::{holder, nonce, record, table, view, Member, HB, TTL};
use super::{Answer, Call, Round};
use crate::error::Error;
use crate::recipes::group::records::{AckRecord, SettledRecord, ViewRecord};
use crate::recipes::group::table::SlotTable;
use crate::recipes::group::view::GroupPhase;

fn of_table(t: SlotTable, fresh: bool) -> Round {
    Round::of_table(Arc::new(t), false, fresh)
}

fn cas_key(call: &Option<Call>) -> &str {
    match call {
        Some(Call::Cas { key, .. }) => key,
        other => panic!("expected a compare-and-set, got {other:?}"),
    }
}

// ---- views: publishing the next view ----

/// Event: a fresh table with a live slot the view lacks. Phase: active, lowest live slot.
/// Effect: the view's compare-and-set, expecting the text read, naming both slots one epoch up.
#[test]
fn the_lowest_slot_publishes_a_view_for_a_new_claim() {
    let v1 = view(1, &[0]);
    let mut m = Member::active(0, &v1);
    let mut round = of_table(table(&[0, 1], 1, Some(v1.clone())), true);
    match m.start(&mut round) {
        Some(Call::Cas {
            key,
            expected,
            new,
            ttl,
        }) => {
            assert_eq!(key, "hc:{g}:view:current");
            assert_eq!(expected, Some(v1.to_string()));
            let next = ViewRecord::parse(&new).unwrap();
            assert_eq!(next.epoch, 2);
            assert_eq!(next.holders, vec![holder(0), holder(1)]);
            assert_eq!(ttl, None);
        }
        other => panic!("expected the view's compare-and-set, got {other:?}"),
    }
    // Written: the member adopts it (a hand-off) and settles it as its publisher.
    let next = m.answer(&mut round, Answer::Cas(Ok(true)));
    assert_eq!(m.engine.settler.published, Some(2));
    assert!(m.engine.discrepancy.is_none());
    assert_eq!(m.engine.pending().map(|p| p.epoch()), Some(2));
    assert_eq!(m.phase(), GroupPhase::Handoff);
    // Nothing moved from it (modulo, a slot added): it acknowledges the new view at once.
    assert_eq!(cas_key(&next), "hc:{g}:ack:0");
}

/// Event: the same table. Phase: active, not the lowest slot, the discrepancy just seen.
/// Effect: none; the discrepancy is noted, so the member publishes only if it lasts a heartbeat.
#[test]
fn another_slot_waits_a_heartbeat_before_publishing() {
    let v1 = view(1, &[0, 1]);
    let mut m = Member::active(1, &v1);
    let mut round = of_table(table(&[0, 1, 2], 1, Some(v1.clone())), true);
    let first = m.start(&mut round);
    assert!(
        !matches!(&first, Some(Call::Cas { key, .. }) if key == "hc:{g}:view:current"),
        "{first:?}"
    );
    let d = m.engine.discrepancy.as_ref().expect("a discrepancy noted");
    assert_eq!(d.live.len(), 3);
    // A heartbeat later, the same discrepancy: it publishes (the lowest may be gone).
    m.clock.advance(HB);
    let mut round = of_table(table(&[0, 1, 2], 1, Some(v1)), true);
    assert_eq!(cas_key(&m.start(&mut round)), "hc:{g}:view:current");
}

/// Event: a table whose slots were kept from an earlier heartbeat (not fresh), with no view.
/// Effect: none; the member reads the slots at its next beat.
#[test]
fn a_table_not_read_fresh_publishes_nothing_and_asks_for_the_slots() {
    let mut m = Member::at(0);
    let mut round = of_table(table(&[0], 0, None), false);
    assert_eq!(m.start(&mut round), None);
    assert!(m.engine.cache.need_slots);
}

/// Event: the view's compare-and-set refused (another member published first). Effect: none
/// adopted, and the view directory is read again whatever version the store answers.
#[test]
fn a_refused_view_is_not_adopted_and_the_directory_is_read_again() {
    let v1 = view(1, &[0]);
    let mut m = Member::active(0, &v1);
    m.engine.cache.view_version = Some("7".into());
    let mut round = of_table(table(&[0, 1], 1, Some(v1)), true);
    assert_eq!(cas_key(&m.start(&mut round)), "hc:{g}:view:current");
    m.answer(&mut round, Answer::Cas(Ok(false)));
    assert_eq!(m.engine.cache.view_version, None);
    assert!(m.engine.discrepancy.is_some());
    assert_eq!(m.engine.target().map(|t| t.epoch()), Some(1));
    assert_eq!(m.phase(), GroupPhase::Active);
}

/// Event: a view published with another assignor. Effect: the round stops with the reason,
/// asking for nothing.
#[test]
fn a_view_of_another_assignor_stops_the_round() {
    let mut m = Member::at(0);
    let mut other = view(1, &[0]);
    other.assignor = Some(crate::assign::AssignorKind::Memento);
    let mut round = of_table(table(&[0], 0, Some(other)), true);
    assert_eq!(m.start(&mut round), None);
    let error = m.engine.shared.assignment.borrow().last_error.clone();
    assert!(error.is_some_and(|e| e.contains("assignor")));
}

/// The round of a join's own claim at `slot`, which lost a race for another slot if `raced`.
fn of_join(t: SlotTable, raced: bool) -> Round {
    Round::of_table(Arc::new(t), true, true).after_race(raced)
}

/// Event: a join's own claim, the only slot the view lacks. Phase: joining, not the lowest
/// slot. Effect: the joiner publishes the view at once, unless its claim lost a race for another
/// slot (a claim its table lacks is under way): then it leaves the view to the lowest slot.
#[test]
fn a_join_publishes_its_own_view_unless_it_lost_a_race() {
    let v1 = view(1, &[0, 1]);
    let mut m = Member::at(2);
    let mut round = of_join(table(&[0, 1, 2], 1, Some(v1.clone())), false);
    assert_eq!(cas_key(&m.start(&mut round)), "hc:{g}:view:current");

    let mut m = Member::at(2);
    let mut round = of_join(table(&[0, 1, 2], 1, Some(v1)), true);
    let first = m.start(&mut round);
    assert!(
        !matches!(&first, Some(Call::Cas { key, .. }) if key == "hc:{g}:view:current"),
        "{first:?}"
    );
    assert!(m.engine.discrepancy.is_some());
}

/// Event: a join's own claim, the only slot the view lacks, in a group large enough to coalesce
/// (here from 3 live slots). Phase: joining, not the lowest slot. Effect: while the view is not
/// settled (a hand-off under way, as in a burst of joins), the joiner leaves its view to the
/// lowest slot; once it is settled, the joiner publishes at once as in a small group.
#[test]
fn a_join_in_a_large_group_leaves_its_view_to_the_lowest_during_a_hand_off() {
    let v1 = view(1, &[0, 1]);
    let mut m = Member::at(2);
    m.engine.cfg.coalesce_from = 3;
    let mut round = of_join(table(&[0, 1, 2], 1, Some(v1.clone())), false);
    let first = m.start(&mut round);
    assert!(
        !matches!(&first, Some(Call::Cas { key, .. }) if key == "hc:{g}:view:current"),
        "{first:?}"
    );
    assert!(m.engine.discrepancy.is_some());

    let mut m = Member::at(2);
    m.engine.cfg.coalesce_from = 3;
    let mut t = table(&[0, 1, 2], 1, Some(v1.clone()));
    t.settled = Some(SettledRecord {
        epoch: 1,
        view: v1.digest(),
    });
    let mut round = of_join(t, false);
    assert_eq!(cas_key(&m.start(&mut round)), "hc:{g}:view:current");

    // Below the size, unsettled or not: at once.
    let mut m = Member::at(2);
    m.engine.cfg.coalesce_from = 4;
    let mut round = of_join(table(&[0, 1, 2], 1, Some(v1)), false);
    assert_eq!(cas_key(&m.start(&mut round)), "hc:{g}:view:current");
}

/// Event: a join that lost a race for a slot, whose table's view is below an epoch the member
/// saw (a store that went back). Phase: joining, not the lowest slot. Effect: the joiner
/// publishes a view above that epoch at once: a view to repair waits for no one.
#[test]
fn a_join_that_lost_a_race_still_repairs_a_view_below_an_epoch_seen() {
    let v1 = view(1, &[0, 1]);
    let mut m = Member::at(2);
    m.engine.cache.highest = 5;
    let mut round = of_join(table(&[0, 1, 2], 1, Some(v1.clone())), true);
    match m.start(&mut round) {
        Some(Call::Cas {
            key, expected, new, ..
        }) => {
            assert_eq!(key, "hc:{g}:view:current");
            assert_eq!(expected, Some(v1.to_string()));
            assert!(ViewRecord::parse(&new).unwrap().epoch > 5);
        }
        other => panic!("expected the view's compare-and-set, got {other:?}"),
    }
}

// ---- progress: acknowledging and activating ----

/// Event: a dropped grant. Phase: joining, its first view pending and drained. Effect: the
/// acknowledgement's compare-and-set; once written, the view activates when settled.
#[test]
fn a_drained_view_is_acknowledged_then_activated_once_settled() {
    let v1 = view(1, &[0, 1]);
    let mut m = Member::at(0);
    m.engine.adopt(v1.clone());
    let digest = m.engine.pending().unwrap().digest;
    m.engine.cache.settled = Some(SettledRecord {
        epoch: 1,
        view: digest,
    });
    let mut round = Round::progress();
    match m.start(&mut round) {
        Some(Call::Cas {
            key,
            expected,
            new,
            ttl,
        }) => {
            assert_eq!(key, "hc:{g}:ack:0");
            assert_eq!(expected, None);
            let ack = AckRecord::parse(&new).unwrap();
            assert_eq!((ack.nonce, ack.acked, ack.view), (nonce(0), 1, digest));
            assert_eq!(ttl, Some(TTL * 4));
        }
        other => panic!("expected the acknowledgement, got {other:?}"),
    }
    assert_eq!(m.answer(&mut round, Answer::Cas(Ok(true))), None);
    assert!(m.engine.claims.ack.is_some());
    assert_eq!(m.phase(), GroupPhase::Active);
}

/// Event: a member that holds no view any more (it lost its lease, or is leaving) and has seen
/// epoch 3 reads a table whose view is epoch 2 (the store went back). Phase: not the lowest
/// slot, no change of its own. Effect: it neither publishes yet nor adopts the view below what
/// it saw, so it never goes back from an active epoch 3 to 2 (simulation seed 45938 of the
/// memory model did, with a leave for a restart and a rollback).
#[test]
fn a_view_below_an_epoch_seen_is_not_adopted() {
    let mut m = Member::at(1);
    m.engine.cache.highest = 3;
    let mut round = of_table(table(&[0, 1], 2, Some(view(2, &[0, 1]))), true);
    assert_eq!(m.start(&mut round), None);
    assert!(m.engine.pending().is_none());
    assert!(
        m.engine.discrepancy.is_some(),
        "it publishes above after a heartbeat"
    );
    // A heartbeat that did not read the slots keeps the discrepancy (the view names every live
    // claim, but is below the epoch seen): clearing it would restart the heartbeat for ever.
    m.clock.advance(HB / 2);
    let mut round = of_table(table(&[0, 1], 2, Some(view(2, &[0, 1]))), false);
    assert_eq!(m.start(&mut round), None);
    assert!(m.engine.discrepancy.is_some(), "kept through a stale round");
    // A heartbeat after it first saw the view, a fresh read: it publishes epoch 4.
    m.clock.advance(HB / 2);
    let mut round = of_table(table(&[0, 1], 2, Some(view(2, &[0, 1]))), true);
    match m.start(&mut round) {
        Some(Call::Cas { new, .. }) => assert_eq!(ViewRecord::parse(&new).unwrap().epoch, 4),
        other => panic!("expected the repair's compare-and-set, got {other:?}"),
    }
}

/// Event: the acknowledgement's compare-and-set refused twice. Effect: a read of what the
/// store holds after each, a second try against it, then nothing: the view stays pending.
#[test]
fn a_refused_acknowledgement_is_tried_once_more_against_what_is_stored() {
    let mut m = Member::at(0);
    m.engine.adopt(view(1, &[0]));
    let mut round = Round::progress();
    assert_eq!(cas_key(&m.start(&mut round)), "hc:{g}:ack:0");
    let read = m.answer(&mut round, Answer::Cas(Ok(false)));
    assert_eq!(
        read,
        Some(Call::Get {
            key: "hc:{g}:ack:0".into()
        })
    );
    match m.answer(&mut round, Answer::Get(Ok(Some("theirs".into())))) {
        Some(Call::Cas { expected, .. }) => assert_eq!(expected.as_deref(), Some("theirs")),
        other => panic!("expected a second try, got {other:?}"),
    }
    assert!(matches!(
        m.answer(&mut round, Answer::Cas(Ok(false))),
        Some(Call::Get { .. })
    ));
    assert_eq!(m.answer(&mut round, Answer::Get(Ok(None))), None);
    assert!(m.engine.claims.ack.is_none());
    assert_eq!(m.phase(), GroupPhase::Joining);
}

/// Event: a dropped grant while a grant still held is not owned under the pending view, past
/// the drain timeout. Effect: no call; the member gives its lease up.
#[test]
fn grants_that_outlast_the_drain_timeout_give_the_lease_up() {
    let v1 = view(1, &[0]);
    let mut m = Member::active(0, &v1);
    let grant = m
        .engine
        .shared
        .grant(crate::recipes::group::grants::Scope::Share)
        .expect("a share granted");
    m.engine.adopt(view(2, &[0, 1]));
    m.clock.advance(TTL * 2);
    let mut round = Round::progress();
    assert_eq!(m.start(&mut round), None);
    assert!(m.engine.claims.abandoned);
    drop(grant);
}

// ---- settle: the settled mark ----

/// Event: a fresh table where every live slot acknowledged the published view. Phase: hand-off,
/// lowest slot. Effects: the acknowledgements' listing, then the settled mark's compare-and-set
/// against the mark read; once written the view activates.
#[test]
fn the_lowest_slot_settles_a_view_every_slot_acknowledged() {
    let v2 = view(2, &[0, 1]);
    let mut m = Member::acked(0, &view(1, &[0]), &v2);
    let digest = m.target_digest();
    let mut t = table(&[0, 1], 1, Some(v2));
    t.settled_text = Some("old".into());
    let mut round = of_table(t, true);
    assert_eq!(
        m.start(&mut round),
        Some(Call::List {
            dir: "hc:{g}:ack:".into()
        })
    );
    let theirs = AckRecord {
        nonce: nonce(1),
        acked: 2,
        view: digest,
    };
    let listing = vec![("hc:{g}:ack:1".to_string(), theirs.to_string())];
    match m.answer(&mut round, Answer::List(Ok(listing))) {
        Some(Call::Cas {
            key, expected, new, ..
        }) => {
            assert_eq!(key, "hc:{g}:view:settled");
            assert_eq!(expected.as_deref(), Some("old"));
            assert_eq!(
                SettledRecord::parse(&new),
                Some(SettledRecord {
                    epoch: 2,
                    view: digest
                })
            );
        }
        other => panic!("expected the settled mark, got {other:?}"),
    }
    assert_eq!(m.phase(), GroupPhase::Handoff);
    assert_eq!(m.answer(&mut round, Answer::Cas(Ok(true))), None);
    assert_eq!(m.phase(), GroupPhase::Active);
    assert!(!m.engine.settler.settling);
}

/// Event: a slot that has not acknowledged for three TTLs. Phase: the settling lowest slot.
/// Effects: a read of that slot's record, then a compare-and-set of the same text with the
/// record's own lease TTL; once per claim and epoch.
#[test]
fn a_slot_that_stalls_the_hand_off_for_three_ttls_gets_its_lease_ttl_again() {
    let v2 = view(2, &[0, 1]);
    let mut m = Member::acked(0, &view(1, &[0]), &v2);
    let stalled = |m: &mut Member| {
        let mut round = of_table(table(&[0, 1], 1, Some(v2.clone())), true);
        let list = m.start(&mut round);
        assert!(matches!(list, Some(Call::List { .. })), "{list:?}");
        let next = m.answer(&mut round, Answer::List(Ok(Vec::new())));
        (round, next)
    };
    // The first time: the stall starts.
    let (_, next) = stalled(&mut m);
    assert!(!matches!(next, Some(Call::Get { .. })), "{next:?}");
    m.clock.advance(TTL * 3);
    let (mut round, next) = stalled(&mut m);
    assert_eq!(
        next,
        Some(Call::Get {
            key: "hc:{g}:slot:1".into()
        })
    );
    let text = record(1, 1).to_string();
    match m.answer(&mut round, Answer::Get(Ok(Some(text.clone())))) {
        Some(Call::Cas {
            key,
            expected,
            new,
            ttl,
        }) => {
            assert_eq!(key, "hc:{g}:slot:1");
            assert_eq!(expected.as_deref(), Some(text.as_str()));
            assert_eq!(new, text);
            assert_eq!(ttl, Some(TTL));
        }
        other => panic!("expected the TTL re-applied, got {other:?}"),
    }
    m.answer(&mut round, Answer::Cas(Ok(true)));
    // Once per claim and epoch.
    let (_, next) = stalled(&mut m);
    assert!(!matches!(next, Some(Call::Get { .. })), "{next:?}");
}

/// Event: the acknowledgements cannot be read. Effect: the error is published, nothing written.
#[test]
fn an_unreadable_acknowledgement_directory_settles_nothing() {
    let v2 = view(2, &[0, 1]);
    let mut m = Member::acked(0, &view(1, &[0]), &v2);
    let mut round = of_table(table(&[0, 1], 1, Some(v2)), true);
    assert!(matches!(m.start(&mut round), Some(Call::List { .. })));
    let down = Error::Unavailable {
        backend: "memory",
        message: "down".into(),
        source: None,
    };
    assert_eq!(m.answer(&mut round, Answer::List(Err(down))), None);
    assert!(m.engine.shared.assignment.borrow().last_error.is_some());
    assert_eq!(m.phase(), GroupPhase::Handoff);
}

// ---- reassert: a lost acknowledgement ----

/// Event: a table whose published view this member acknowledged a heartbeat ago and is still
/// unsettled. Effect: the acknowledgement's compare-and-set again, against what it wrote.
#[test]
fn an_acknowledgement_unsettled_for_a_heartbeat_is_written_again() {
    let v2 = view(2, &[0, 1]);
    let mut m = Member::acked(1, &view(1, &[1]), &v2);
    let ack = m.engine.claims.ack.clone().unwrap().record;
    m.clock.advance(HB);
    // Not fresh: no settling, only the reassertion.
    let mut round = of_table(table(&[0, 1], 1, Some(v2)), false);
    match m.start(&mut round) {
        Some(Call::Cas {
            key, expected, new, ..
        }) => {
            assert_eq!(key, "hc:{g}:ack:1");
            assert_eq!(expected, Some(ack.to_string()));
            assert_eq!(new, ack.to_string());
        }
        other => panic!("expected the acknowledgement again, got {other:?}"),
    }
}

// ---- the published phase ----

/// The phase a member publishes is derived in one place from where it is in its life and the
/// views it holds: joining with no active view naming it, in a hand-off with a view adopted
/// beside an active one, active otherwise; the other phases are its own.
#[test]
fn the_published_phase_follows_the_members_life_and_views() {
    use super::super::Phase;
    let v1 = view(1, &[0]);
    let mut m = Member::at(0);
    assert_eq!(m.engine.enter(Phase::Member), GroupPhase::Joining);
    m.engine.adopt(v1.clone());
    assert_eq!(m.phase(), GroupPhase::Joining);
    let pending = m.engine.pending().unwrap();
    m.engine.activate(pending, holder(0));
    assert_eq!(m.phase(), GroupPhase::Active);
    m.engine.adopt(view(2, &[0, 1]));
    assert_eq!(m.phase(), GroupPhase::Handoff);
    // An active view that does not name the claim gives it nothing.
    let mut other = Member::at(5);
    other.engine.adopt(v1);
    let pending = other.engine.pending().unwrap();
    other.engine.activate(pending, holder(5));
    assert_eq!(other.phase(), GroupPhase::Joining);
    for (phase, published) in [
        (Phase::StandingBy, GroupPhase::Standby),
        (Phase::Rejoining, GroupPhase::Rejoining),
        (Phase::Stopped, GroupPhase::Stopped),
        (Phase::Failed, GroupPhase::Failed),
    ] {
        assert_eq!(m.engine.enter(phase), published);
    }
}
