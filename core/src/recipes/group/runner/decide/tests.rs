//! Unit tests of the runner's decisions.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use super::{
    acks_due, awaits_returning, charge, choose_slot, coalesces, drain_timed_out, left_out,
    lists_before_dropping, next_view, notice_due, notice_period, others_joining, publishes, refund,
    settled_at_or_past, unsettled, view_is_stale, view_needs_slots, view_slot_gone, Between, Facts,
    Seen,
};
use crate::assign::{Assignor, AssignorKind, Balanced, KeySet, Topology};
use crate::recipes::group::records::{Holder, SettledRecord, SlotRecord, ViewRecord, MAX_EPOCH};
use crate::recipes::group::runner::notices::{ACK_GAP_DIVISOR, NOTICE_BURST, NOTICE_GAP_DIVISOR};
use crate::recipes::group::runner::{
    Claim, Discrepancy, Handoff, Settler, SlotsSeen, TableCache, REREAD_AFTER,
};
use crate::recipes::group::table::SlotTable;

const HB: Duration = Duration::from_millis(300);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn record(nonce: u64) -> SlotRecord {
    SlotRecord {
        member: format!("m{nonce}"),
        nonce,
        since_ms: 0,
        ttl_ms: 900,
        acked: 0,
        view: 0,
        parked: None,
        grace: None,
    }
}

/// A table whose live slots are `slots` (nonce = slot + 100), with `view` published.
fn table(slots: &[u32], view: Option<(u64, &[u32])>) -> SlotTable {
    let mut t = SlotTable::default();
    for &s in slots {
        t.slots.insert(s, record(u64::from(s) + 100));
    }
    t.view = view.map(|(epoch, held)| ViewRecord {
        epoch,
        holders: held
            .iter()
            .map(|&s| Holder {
                slot: s,
                nonce: u64::from(s) + 100,
            })
            .collect(),
        assignor: None,
        owners: None,
    });
    t
}

fn claim(slot: u32) -> Claim {
    Claim {
        slot,
        record: record(u64::from(slot) + 100),
    }
}

fn cache_with(t: SlotTable) -> TableCache {
    TableCache {
        slots: Some(SlotsSeen {
            version: "1".into(),
            table: Arc::new(t),
        }),
        ..TableCache::default()
    }
}

/// Facts of a steady member: claimed `slot` of a table with `slots` live, no hand-off.
struct Fixture {
    claim: Option<Claim>,
    cache: TableCache,
    handoff: Option<Handoff>,
    settler: Settler,
    discrepancy: Option<Discrepancy>,
    abandoned: bool,
    pending_acked: bool,
    failing: bool,
    listening: bool,
    now: Duration,
}

impl Fixture {
    fn steady(slot: u32, slots: &[u32]) -> Fixture {
        Fixture {
            claim: Some(claim(slot)),
            cache: cache_with(table(slots, Some((1, slots)))),
            handoff: None,
            settler: Settler::default(),
            discrepancy: None,
            abandoned: false,
            pending_acked: false,
            failing: false,
            listening: false,
            now: ms(10_000),
        }
    }

    fn facts(&self) -> Facts<'_> {
        Facts {
            claim: self.claim.as_ref(),
            abandoned: self.abandoned,
            cache: &self.cache,
            handoff: self.handoff.as_ref(),
            settler: &self.settler,
            discrepancy: self.discrepancy.as_ref(),
            pending_acked: self.pending_acked,
            change_checks: true,
            listening: self.listening,
            failing: self.failing,
            heartbeat: HB,
            now: self.now,
        }
    }
}

#[test]
fn the_two_lowest_live_slots_watch_the_table() {
    let slots = [0, 3, 5, 9];
    assert!(Fixture::steady(0, &slots).facts().watches_slots());
    assert!(Fixture::steady(3, &slots).facts().watches_slots());
    assert!(!Fixture::steady(5, &slots).facts().watches_slots());
    let mut unclaimed = Fixture::steady(0, &slots);
    unclaimed.claim = None;
    assert!(!unclaimed.facts().watches_slots());
}

#[test]
fn a_member_in_the_middle_reads_the_slots_one_beat_in_four_when_nothing_is_under_way() {
    let slots = [0, 1, 2, 3, 4, 5, 6];
    let mut f = Fixture::steady(6, &slots);
    let reads: Vec<bool> = (0..8)
        .map(|beats| {
            f.cache.beats = beats;
            f.facts().reads_slots(6)
        })
        .collect();
    // Slot 6 reads at the beats congruent to 6 mod 4.
    assert_eq!(
        reads,
        [false, false, true, false, false, false, true, false]
    );
    // During a hand-off it does not (a burst of joins would make everyone read).
    f.handoff = Some(Handoff {
        since: f.now,
        adopted_at: f.now,
    });
    f.cache.beats = 2;
    assert!(!f.facts().reads_slots(6));
}

#[test]
fn in_a_large_group_about_eight_members_read_the_slots_per_beat() {
    // 400 slots: each member reads one beat in 50, so 8 of them read at each beat, and a
    // change costs each member a constant, not the group's size.
    let slots: Vec<u32> = (0..400).collect();
    let mut readers = vec![0u32; 50];
    for slot in [2u32, 7, 77, 399] {
        let mut f = Fixture::steady(slot, &slots);
        let reads: Vec<u64> = (0..100)
            .filter(|&beats| {
                f.cache.beats = beats;
                f.facts().reads_slots(slot)
            })
            .collect();
        assert_eq!(reads.len(), 2, "slot {slot}: {reads:?}");
        assert_eq!(reads[1] - reads[0], 50);
    }
    for slot in 2..400u32 {
        let mut f = Fixture::steady(slot, &slots);
        for (beats, n) in readers.iter_mut().enumerate() {
            f.cache.beats = beats as u64;
            *n += u32::from(f.facts().reads_slots(slot));
        }
    }
    // Slots 0 and 1 watch the table at every beat instead.
    assert!(readers.iter().all(|&n| (7..=8).contains(&n)), "{readers:?}");
}

#[test]
fn anything_under_way_makes_a_member_read_the_slots() {
    let slots = [0, 1, 2, 3, 4, 5, 6];
    let base = || {
        let mut f = Fixture::steady(6, &slots);
        f.cache.beats = 1;
        f
    };
    assert!(!base().facts().reads_slots(6));
    let mut f = base();
    f.cache.slots = None;
    assert!(f.facts().reads_slots(6), "no copy of the table");
    let mut f = base();
    f.cache.need_slots = true;
    assert!(f.facts().reads_slots(6), "the view asks for a look");
    let mut f = base();
    f.discrepancy = Some(Discrepancy {
        live: Vec::new(),
        since: f.now,
        fast: true,
    });
    assert!(f.facts().reads_slots(6), "a discrepancy it publishes from");
    let mut f = base();
    f.discrepancy = Some(Discrepancy {
        live: Vec::new(),
        since: f.now,
        fast: false,
    });
    assert!(
        !f.facts().reads_slots(6),
        "a discrepancy left to the lowest slot (a joiner in a burst)"
    );
    f.discrepancy = Some(Discrepancy {
        live: Vec::new(),
        since: f.now - HB,
        fast: false,
    });
    assert!(
        f.facts().reads_slots(6),
        "a discrepancy the lowest did not end within a heartbeat"
    );
    let mut f = base();
    f.settler.settling = true;
    assert!(f.facts().reads_slots(6), "settling");
    let mut f = base();
    f.claim = None;
    assert!(f.facts().reads_slots(6), "claiming");
    let mut f = base();
    f.settler.published = Some(1);
    assert!(!f.facts().reads_slots(6), "its own view, settled");
    f.cache.unsettled = true;
    assert!(f.facts().reads_slots(6), "its own view unsettled");
    f.settler.published = Some(0);
    assert!(!f.facts().reads_slots(6), "someone else's view unsettled");
    let mut f = base();
    f.handoff = Some(Handoff {
        since: f.now - 2 * HB,
        adopted_at: f.now - 2 * HB,
    });
    assert!(f.facts().reads_slots(6), "a hand-off overdue");
    let mut f = Fixture::steady(1, &slots);
    f.cache.beats = 2;
    assert!(f.facts().reads_slots(1), "a watcher");
}

#[test]
fn a_hand_off_is_overdue_after_two_heartbeats_once_a_heartbeat() {
    let mut f = Fixture::steady(6, &[0, 6]);
    assert!(!f.facts().settle_overdue(), "no hand-off");
    f.handoff = Some(Handoff {
        since: f.now - 5 * HB,
        adopted_at: f.now - 2 * HB + ms(1),
    });
    assert!(
        !f.facts().settle_overdue(),
        "adopted under two heartbeats ago"
    );
    f.handoff = Some(Handoff {
        since: f.now - 5 * HB,
        adopted_at: f.now - 2 * HB,
    });
    assert!(f.facts().settle_overdue());
    f.settler.acks_read = Some(f.now - HB + ms(1));
    assert!(
        !f.facts().settle_overdue(),
        "read the acknowledgements lately"
    );
    f.settler.acks_read = Some(f.now - HB);
    assert!(f.facts().settle_overdue());
}

#[test]
fn a_long_wait_reads_the_table_whole_once_per_stretch() {
    let long = HB * REREAD_AFTER;
    let mut f = Fixture::steady(6, &[0, 6]);
    assert!(!f.facts().rereads_whole(), "nothing to wait on");
    f.handoff = Some(Handoff {
        since: f.now - 2 * long,
        adopted_at: f.now - long + ms(1),
    });
    assert!(!f.facts().rereads_whole(), "the pending view is recent");
    f.handoff = Some(Handoff {
        since: f.now - 2 * long,
        adopted_at: f.now - long,
    });
    assert!(f.facts().rereads_whole());
    f.cache.whole_read = Some(f.now - long + ms(1));
    assert!(!f.facts().rereads_whole(), "read whole lately");
    f.cache.whole_read = Some(f.now - long);
    assert!(f.facts().rereads_whole());
    // A discrepancy that lasts counts the same, from the earlier of the two.
    f.handoff = None;
    f.cache.whole_read = None;
    f.discrepancy = Some(Discrepancy {
        live: Vec::new(),
        since: f.now - long,
        fast: false,
    });
    assert!(f.facts().rereads_whole());
}

#[test]
fn a_steady_member_sleeps_until_the_heartbeat_and_a_watcher_wakes_halfway() {
    let slots = [0, 1, 2, 3];
    let next = ms(10_000) + HB;
    let f = Fixture::steady(3, &slots);
    let w = f.facts().wake(next);
    assert_eq!((w.at, w.between), (next, Between::Beat));
    let f = Fixture::steady(1, &slots);
    let w = f.facts().wake(next);
    assert_eq!((w.at, w.between), (f.now + HB / 2, Between::Watch));
    // Alone in the table: nothing to watch for between heartbeats.
    let f = Fixture::steady(0, &[0]);
    assert!(!f.facts().only_watching());
    assert_eq!(f.facts().wake(next).at, next);
}

#[test]
fn a_hand_off_wakes_at_a_quarter_heartbeat_and_settling_at_an_eighth() {
    let next = ms(10_000) + HB;
    let mut f = Fixture::steady(3, &[0, 1, 2, 3]);
    f.handoff = Some(Handoff {
        since: f.now,
        adopted_at: f.now,
    });
    let w = f.facts().wake(next);
    assert_eq!((w.at, w.between), (f.now + HB / 4, Between::Beat));
    f.pending_acked = true;
    let w = f.facts().wake(next);
    assert_eq!((w.at, w.between), (f.now + HB / 8, Between::PollSettled));
    // A settler polls the acknowledgements with full beats, at an eighth.
    f.settler.settling = true;
    let w = f.facts().wake(next);
    assert_eq!((w.at, w.between), (f.now + HB / 8, Between::Beat));
    // Never past the heartbeat.
    let w = f.facts().wake(f.now + ms(1));
    assert_eq!(w.at, f.now + ms(1));
}

#[test]
fn a_slot_of_the_view_gone_stops_waiting_on_the_settled_mark() {
    let mut f = Fixture::steady(3, &[0, 1, 2, 3]);
    f.pending_acked = true;
    assert!(f.facts().only_settling_awaited());
    f.discrepancy = Some(Discrepancy {
        live: Vec::new(),
        since: f.now,
        fast: true,
    });
    assert!(!f.facts().only_settling_awaited());
    f.discrepancy.as_mut().unwrap().fast = false;
    assert!(f.facts().only_settling_awaited());
    f.abandoned = true;
    assert!(!f.facts().only_settling_awaited());
    f.abandoned = false;
    f.claim = None;
    assert!(!f.facts().only_settling_awaited(), "no claim");
    f.claim = Some(claim(3));
    f.settler.settling = true;
    assert!(!f.facts().only_settling_awaited(), "settling itself");
}

#[test]
fn only_an_unchanged_table_with_nothing_under_way_is_idle() {
    let f = Fixture::steady(3, &[0, 1, 2, 3]);
    assert!(f.facts().idle(false, true));
    assert!(!f.facts().idle(true, true), "changed");
    assert!(!f.facts().idle(false, false), "no active view");
    for (what, change) in under_way() {
        let mut f = Fixture::steady(3, &[0, 1, 2, 3]);
        change(&mut f);
        assert!(!f.facts().idle(false, true), "{what}");
    }
}

/// A change to a steady fixture, named.
type Change = (&'static str, fn(&mut Fixture));

/// Each thing that can be under way, as a change to a steady fixture.
fn under_way() -> Vec<Change> {
    vec![
        ("unsettled", |f| f.cache.unsettled = true),
        ("a hand-off", |f| {
            f.handoff = Some(Handoff {
                since: f.now,
                adopted_at: f.now,
            })
        }),
        ("a discrepancy", |f| {
            f.discrepancy = Some(Discrepancy {
                live: Vec::new(),
                since: f.now,
                fast: false,
            })
        }),
        ("the slots needed", |f| f.cache.need_slots = true),
        ("settling", |f| f.settler.settling = true),
    ]
}

#[test]
fn a_watcher_stops_only_watching_when_anything_is_under_way() {
    let slots = [0, 1, 2, 3];
    assert!(Fixture::steady(1, &slots).facts().only_watching());
    for (what, change) in under_way() {
        if what == "unsettled" {
            continue; // the heartbeat deals with it; between heartbeats a watcher watches
        }
        let mut f = Fixture::steady(1, &slots);
        change(&mut f);
        assert!(!f.facts().only_watching(), "{what}");
        assert_ne!(f.facts().wake(f.now + HB).between, Between::Watch, "{what}");
    }
    let mut f = Fixture::steady(1, &slots);
    f.abandoned = true;
    assert!(!f.facts().only_watching(), "abandoned");
    let f = Fixture::steady(1, &slots);
    let mut facts = f.facts();
    facts.change_checks = false;
    assert!(
        !facts.only_watching(),
        "without change checks every heartbeat reads anyway"
    );
}

#[test]
fn what_is_under_way_wakes_at_a_quarter_heartbeat() {
    let next = ms(10_000) + HB;
    for (what, change) in under_way() {
        if what == "unsettled" {
            continue; // waits for the heartbeat, which writes the acknowledgement again
        }
        let mut f = Fixture::steady(5, &[0, 1, 2, 3, 5]);
        change(&mut f);
        let expected = match what {
            "settling" => f.now + HB / 8,
            // A new claim publishes its own view: the others need not poll for it.
            "a discrepancy" => next,
            _ => f.now + HB / 4,
        };
        assert_eq!(f.facts().wake(next).at, expected, "{what}");
    }
    let mut f = Fixture::steady(5, &[0, 1, 2, 3, 5]);
    f.claim = None;
    assert_eq!(f.facts().wake(next).at, f.now + HB / 4, "claiming");
    f.claim = Some(claim(5));
    f.discrepancy = Some(Discrepancy {
        live: Vec::new(),
        since: f.now,
        fast: true,
    });
    assert_eq!(
        f.facts().wake(next).at,
        f.now + HB / 4,
        "a slot of the view gone"
    );
    let mut f = Fixture::steady(5, &[0, 1, 2, 3, 5]);
    f.cache.unsettled = true;
    assert_eq!(f.facts().wake(next).at, next, "unsettled alone");
}

#[test]
fn a_claim_prefers_its_old_slot_and_skips_around_the_free_ones() {
    let t = table(&[0, 1, 3, 6], None);
    assert_eq!(choose_slot(&t, None, 0, 100), 2);
    assert_eq!(
        choose_slot(&t, Some(5), 0, 100),
        5,
        "its previous slot is free"
    );
    assert_eq!(
        choose_slot(&t, Some(3), 0, 100),
        2,
        "its previous slot is taken"
    );
    assert_eq!(choose_slot(&t, Some(5), 1, 100), 4, "a retry skips instead");
    assert_eq!(choose_slot(&t, None, 2, 100), 5);
    assert_eq!(choose_slot(&t, None, 3, 100), 7);
    // Below a limit of 6 the free slots are 2, 4 and 5: a skip of 3 wraps to the first.
    assert_eq!(choose_slot(&t, None, 3, 6), 2);
    assert_eq!(choose_slot(&t, None, 4, 6), 4);
    // Full: every slot below the limit is held.
    let full = table(&[0, 1], None);
    assert_eq!(choose_slot(&full, None, 0, 2), 2);
    assert_eq!(choose_slot(&full, None, 5, 2), 2);
    // A foreign value occupies its slot.
    let mut t = table(&[0], None);
    t.foreign.insert(1, "abc".into());
    assert_eq!(choose_slot(&t, Some(1), 0, 100), 2);
}

#[test]
fn a_view_is_stale_when_its_holders_or_epoch_are_wrong() {
    let t = table(&[0, 1], Some((5, &[0, 1])));
    let live = t.live();
    let view = t.view.as_ref();
    assert!(!view_is_stale(view, &live, 5, false));
    assert!(view_is_stale(view, &live, 6, false), "below the floor");
    assert!(view_is_stale(view, &live, 5, true), "a twin");
    assert!(view_is_stale(view, &live[..1], 5, false), "other holders");
    assert!(view_is_stale(None, &live, 0, false), "no view");
    assert!(!view_needs_slots(view, 5, false));
    assert!(view_needs_slots(view, 6, false));
    assert!(view_needs_slots(view, 5, true));
    assert!(view_needs_slots(None, 0, false));
}

#[test]
fn a_gone_slot_of_the_view_is_seen_by_slot_and_nonce() {
    assert!(!view_slot_gone(&table(&[0, 1], Some((5, &[0, 1])))));
    assert!(view_slot_gone(&table(&[0], Some((5, &[0, 1])))));
    assert!(
        !view_slot_gone(&table(&[0, 1, 2], Some((5, &[0, 1])))),
        "a join"
    );
    let mut t = table(&[0, 1], Some((5, &[0, 1])));
    t.slots.get_mut(&1).unwrap().nonce = 7;
    assert!(view_slot_gone(&t), "claimed again");
    assert!(view_slot_gone(&table(&[0], None)));
}

#[test]
fn a_slot_of_the_view_missing_from_a_kept_copy_is_confirmed_by_a_listing() {
    let gone = table(&[0], Some((5, &[0, 1])));
    let whole = table(&[0, 1], Some((5, &[0, 1])));
    // Read in this heartbeat from the copy the version vouched for, and a slot is missing.
    assert!(lists_before_dropping(true, false, &gone));
    // Listed in this heartbeat: the listing is the evidence.
    assert!(!lists_before_dropping(true, true, &gone));
    // Slots not read in this heartbeat: nothing is published from them anyway.
    assert!(!lists_before_dropping(false, false, &gone));
    // Nothing missing: the steady state lists nothing.
    assert!(!lists_before_dropping(true, false, &whole));
}

#[test]
fn a_joiner_publishes_alone_only_when_no_other_claim_waits() {
    let h = |slot, nonce| Holder { slot, nonce };
    let view = ViewRecord {
        epoch: 3,
        holders: vec![h(0, 1), h(1, 2)],
        assignor: None,
        owners: None,
    };
    // Its own claim is the only change.
    assert!(!others_joining(
        Some(&view),
        &[h(0, 1), h(1, 2), h(2, 3)],
        Some(h(2, 3))
    ));
    // A leave is no join.
    assert!(!others_joining(
        Some(&view),
        &[h(1, 2), h(2, 3)],
        Some(h(2, 3))
    ));
    // Another claim waits too: a burst, which the lowest publishes.
    assert!(others_joining(
        Some(&view),
        &[h(0, 1), h(1, 2), h(2, 3), h(3, 4)],
        Some(h(2, 3))
    ));
    // A slot held under a new claim.
    assert!(others_joining(
        Some(&view),
        &[h(0, 1), h(1, 9), h(2, 3)],
        Some(h(2, 3))
    ));
    // No view yet: every other claim is a join.
    assert!(!others_joining(None, &[h(2, 3)], Some(h(2, 3))));
    assert!(others_joining(None, &[h(0, 1), h(2, 3)], Some(h(2, 3))));
}

#[test]
fn publishing_waits_a_heartbeat_unless_the_member_is_lowest_or_changed_the_table() {
    assert!(publishes(true, false, None, ms(0), HB, 4));
    assert!(publishes(false, true, None, ms(0), HB, 4));
    assert!(!publishes(false, false, None, HB - ms(1), HB, 4));
    assert!(publishes(false, false, None, HB, HB, 4));
    // The lowest publishes a burst of joins at most once per quarter heartbeat.
    assert!(!publishes(false, true, Some(HB / 4 - ms(1)), ms(0), HB, 4));
    assert!(publishes(false, true, Some(HB / 4), ms(0), HB, 4));
    assert!(publishes(false, false, Some(ms(0)), HB, HB, 4));
    // In a larger group, less often: a quarter heartbeat more per 256 slots, a heartbeat at
    // most; a difference that lasted a heartbeat is published by anyone, whatever the size.
    assert!(publishes(false, true, Some(HB / 4), ms(0), HB, 256));
    assert!(!publishes(false, true, Some(HB / 4), ms(0), HB, 257));
    assert!(publishes(false, true, Some(HB / 2), ms(0), HB, 257));
    assert!(!publishes(
        false,
        true,
        Some(HB - ms(1)),
        ms(0),
        HB,
        100_000
    ));
    assert!(publishes(false, true, Some(HB), ms(0), HB, 100_000));
    assert!(publishes(false, false, Some(ms(0)), HB, HB, 100_000));
}

#[test]
fn the_next_view_is_one_above_the_highest_and_never_past_the_largest_epoch() {
    let live = vec![Holder { slot: 0, nonce: 1 }];
    let jb = AssignorKind::JumpBackFailover;
    let v = next_view(7, live.clone(), jb, None, &[]).unwrap();
    assert_eq!((v.epoch, v.holders.clone()), (8, live.clone()));
    assert_eq!((v.assignor, v.owners), (Some(jb), None));
    assert!(next_view(MAX_EPOCH - 1, live.clone(), jb, None, &[]).is_some());
    assert!(next_view(MAX_EPOCH, live, jb, None, &[]).is_none());
}

#[test]
fn a_failing_heartbeat_is_tried_again_at_a_quarter_heartbeat() {
    let next = ms(10_000) + HB;
    let mut f = Fixture::steady(3, &[0, 1, 2, 3]);
    f.pending_acked = true;
    assert_eq!(f.facts().wake(next).between, Between::PollSettled);
    f.failing = true;
    let w = f.facts().wake(next);
    // A renewing heartbeat, not a poll of the settled mark, which renews nothing.
    assert_eq!((w.at, w.between), (f.now + HB / 4, Between::Beat));
}

#[test]
fn a_large_group_that_hears_notices_polls_the_settled_mark_less_often() {
    let next = ms(10_000) + HB;
    let large: Vec<u32> = (0..1000).collect();
    for (slots, listening, step) in [
        (&[0, 1, 2, 3][..], false, HB / 8),
        (&[0, 1, 2, 3][..], true, HB / 8),
        (&large[..256], true, HB / 8 * 2),
        (&large[..], false, HB / 8),
        (&large[..], true, HB),
    ] {
        let mut f = Fixture::steady(3, slots);
        f.pending_acked = true;
        f.listening = listening;
        f.handoff = Some(Handoff {
            since: f.now,
            adopted_at: f.now,
        });
        let w = f.facts().wake(next);
        let what = format!("{} slots, listening: {listening}", slots.len());
        assert_eq!(
            (w.at, w.between),
            (f.now + step, Between::PollSettled),
            "{what}"
        );
    }
    // The settler itself reads the acknowledgements at an eighth of a heartbeat, whatever the
    // group's size.
    let mut f = Fixture::steady(0, &large);
    f.listening = true;
    f.settler.settling = true;
    assert_eq!(f.facts().wake(next).at, f.now + HB / 8);
}

#[test]
fn a_change_of_its_own_is_left_to_the_lowest_only_in_a_large_group_during_a_hand_off() {
    let v = table(&[0, 1, 2], Some((4, &[0, 1, 2]))).view.unwrap();
    let settled = SettledRecord {
        epoch: 4,
        view: v.digest(),
    };
    let older = SettledRecord { epoch: 3, view: 7 };
    // Unsettled, from 64 members on: left to the lowest.
    assert!(coalesces(64, 64, Some(&v), Some(older)));
    assert!(coalesces(64, 64, Some(&v), None));
    // Settled, or a small group: published at once.
    assert!(!coalesces(64, 64, Some(&v), Some(settled)));
    assert!(!coalesces(63, 64, Some(&v), None));
    // No view: nothing is handed off.
    assert!(!coalesces(100, 64, None, None));
    // `usize::MAX`: the design before, every change published by its member.
    assert!(!coalesces(100_000, usize::MAX, Some(&v), None));
}

#[test]
fn back_from_an_outage_a_view_waits_for_the_slots_of_the_last_one_within_the_grace() {
    let before = view(4, &[0, 1, 2]);
    let now = ms(10_000);
    let grace = Some(now + HB);
    // The slots 1 and 2 are not claimed again yet: wait.
    assert!(awaits_returning(
        grace,
        now,
        Some(&before),
        None,
        &holders(&[0])
    ));
    // The published view counts too (a store that kept it while the member remembers none).
    assert!(awaits_returning(
        grace,
        now,
        None,
        Some(&before),
        &holders(&[0, 2])
    ));
    // Every slot is back (under new claims, a newcomer beside them): publish.
    let back: Vec<Holder> = holders(&[0, 1, 2, 5])
        .into_iter()
        .map(|h| Holder {
            nonce: h.nonce + 7,
            ..h
        })
        .collect();
    assert!(!awaits_returning(
        grace,
        now,
        Some(&before),
        Some(&before),
        &back
    ));
    // The grace is over, or there is none: publish whatever is live.
    assert!(!awaits_returning(
        grace,
        now + HB,
        Some(&before),
        None,
        &holders(&[0])
    ));
    assert!(!awaits_returning(
        None,
        now,
        Some(&before),
        None,
        &holders(&[0])
    ));
    // Nothing to wait for.
    assert!(!awaits_returning(grace, now, None, None, &holders(&[0])));
}

fn view(epoch: u64, slots: &[u32]) -> ViewRecord {
    ViewRecord {
        epoch,
        holders: holders(slots),
        assignor: None,
        owners: None,
    }
}

fn holders(slots: &[u32]) -> Vec<Holder> {
    slots
        .iter()
        .map(|&slot| Holder {
            slot,
            nonce: u64::from(slot) + 100,
        })
        .collect()
}

#[test]
fn a_sticky_view_carries_the_assignment_that_moves_fewest_keys_from_the_view_it_replaces() {
    let keys = Arc::new(KeySet::partitions(256).unwrap());
    let kind = AssignorKind::Sticky(keys.id());
    let k = Some(&keys);
    // The first view: the balanced assignment.
    let first = next_view(0, holders(&[0, 1, 2]), kind, k, &[None]).unwrap();
    let owners = first.owners.clone().unwrap();
    let balanced = Balanced::new(&Topology::new(3).unwrap(), keys.clone()).unwrap();
    let expected: Vec<u32> = keys.hashes().iter().map(|&h| balanced.owner(h)).collect();
    assert_eq!(&owners[..], &expected[..]);
    // A join takes exactly the newcomer's share, from the view it replaces.
    let joined = next_view(1, holders(&[0, 1, 2, 3]), kind, k, &[Some(&first)]).unwrap();
    let after = joined.owners.clone().unwrap();
    let moved = owners
        .iter()
        .zip(after.iter())
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(moved, after.iter().filter(|&&o| o == 3).count());
    assert_eq!(moved, 64);
    // The view it replaces comes first; the member's own is the fallback when it is missing
    // or of another assignor.
    let other = next_view(
        1,
        holders(&[0, 1, 2]),
        AssignorKind::JumpBackFailover,
        None,
        &[],
    )
    .unwrap();
    let from_own = next_view(
        2,
        holders(&[0, 1, 2, 3]),
        kind,
        k,
        &[Some(&other), Some(&first)],
    )
    .unwrap();
    assert_eq!(from_own.owners, joined.owners);
    let from_missing =
        next_view(2, holders(&[0, 1, 2, 3]), kind, k, &[None, Some(&first)]).unwrap();
    assert_eq!(from_missing.owners, joined.owners);
    // No live slot: no owners.
    let empty = next_view(3, vec![], kind, k, &[Some(&joined)]).unwrap();
    assert_eq!(empty.owners, None);
    // The assignment is part of the view's identity: same holders, other owners, another
    // digest, so an acknowledgement of one is not one of the other.
    let fresh = next_view(2, holders(&[0, 1, 2, 3]), kind, k, &[]).unwrap();
    assert_eq!(fresh.holders, joined.holders);
    assert_ne!(fresh.owners, joined.owners);
    assert!(!fresh.same_assignment(&joined));
    assert_ne!(fresh.digest(), joined.digest());
    let republished = ViewRecord {
        epoch: 9,
        ..joined.clone()
    };
    assert!(republished.same_assignment(&joined));
    assert_eq!(republished.digest(), joined.digest());
}

#[test]
fn a_view_is_unsettled_until_a_mark_for_it_or_a_newer_one() {
    let t = table(&[0, 1], Some((5, &[0, 1])));
    let view = t.view.as_ref();
    let digest = view.unwrap().digest();
    let mark = |epoch, view| Some(SettledRecord { epoch, view });
    assert!(unsettled(view, None));
    assert!(unsettled(view, mark(4, digest)));
    assert!(!unsettled(view, mark(5, digest)));
    assert!(unsettled(view, mark(5, digest ^ 2)), "a twin's mark");
    assert!(!unsettled(view, mark(6, 1)));
    assert!(!unsettled(None, None));
    assert!(settled_at_or_past(mark(5, digest), 5, digest));
    assert!(!settled_at_or_past(mark(5, digest ^ 2), 5, digest));
    assert!(settled_at_or_past(mark(6, 1), 5, digest));
    assert!(!settled_at_or_past(None, 5, digest));
}

#[test]
fn a_drain_times_out_strictly_after_the_timeout() {
    assert!(!drain_timed_out(ms(100), ms(1100), ms(1000)));
    assert!(drain_timed_out(ms(100), ms(1101), ms(1000)));
    assert!(
        !drain_timed_out(ms(100), ms(50), ms(1000)),
        "clock before the start"
    );
}

#[test]
fn a_changed_view_directory_makes_every_member_look_now() {
    let slots = [0, 1, 2, 3, 4, 5, 6];
    // A steady member in the middle: a heartbeat's reads (the view, and what else it reads).
    let f = Fixture::steady(5, &slots);
    assert_eq!(f.facts().on_notices(Seen::VIEWS), Some(Between::Beat));
    // One that acknowledged the pending view and awaits only its settled mark: that mark.
    let mut f = Fixture::steady(5, &slots);
    f.handoff = Some(Handoff {
        since: f.now,
        adopted_at: f.now,
    });
    f.pending_acked = true;
    assert_eq!(
        f.facts().on_notices(Seen::VIEWS),
        Some(Between::PollSettled)
    );
    // One that gave its lease up waits for it to pass, whatever changed.
    let mut f = Fixture::steady(5, &slots);
    f.abandoned = true;
    assert_eq!(f.facts().on_notices(Seen::VIEWS | Seen::SLOTS), None);
}

#[test]
fn acknowledgements_wake_only_the_member_that_settles() {
    let slots = [0, 1, 2, 3, 4, 5, 6];
    let f = Fixture::steady(0, &slots);
    assert_eq!(f.facts().on_notices(Seen::ACKS), None);
    let mut f = Fixture::steady(5, &slots);
    f.settler.settling = true;
    assert_eq!(f.facts().on_notices(Seen::ACKS), Some(Between::Beat));
    // Settling wins over polling the mark: the settler reads the acknowledgements.
    f.pending_acked = true;
    assert_eq!(
        f.facts().on_notices(Seen::ACKS | Seen::VIEWS),
        Some(Between::Beat)
    );
}

#[test]
fn slot_records_wake_only_the_members_that_read_them() {
    let slots = [0, 1, 2, 3, 4, 5, 6];
    assert_eq!(
        Fixture::steady(0, &slots).facts().on_notices(Seen::SLOTS),
        Some(Between::Beat),
        "the lowest slot"
    );
    assert_eq!(
        Fixture::steady(1, &slots).facts().on_notices(Seen::SLOTS),
        Some(Between::Beat),
        "the second lowest"
    );
    assert_eq!(
        Fixture::steady(5, &slots).facts().on_notices(Seen::SLOTS),
        None,
        "a member in the middle learns of it from the view"
    );
    let mut f = Fixture::steady(5, &slots);
    f.discrepancy = Some(Discrepancy {
        live: Vec::new(),
        since: f.now,
        fast: true,
    });
    assert_eq!(f.facts().on_notices(Seen::SLOTS), Some(Between::Beat));
    let mut f = Fixture::steady(5, &slots);
    f.cache.need_slots = true;
    assert_eq!(f.facts().on_notices(Seen::SLOTS), Some(Between::Beat));
    let mut f = Fixture::steady(5, &slots);
    f.claim = None;
    assert_eq!(f.facts().on_notices(Seen::SLOTS), Some(Between::Beat));
    // Nothing named, or only the standbys: no call.
    assert_eq!(
        Fixture::steady(0, &slots).facts().on_notices(Seen::NONE),
        None
    );
    assert_eq!(
        Fixture::steady(0, &slots)
            .facts()
            .on_notices(Seen::STANDBYS),
        None
    );
}

#[test]
fn notices_are_answered_a_gap_apart_at_once_after_a_quiet_spell_then_at_the_polling_pace() {
    let gap = HB / NOTICE_GAP_DIVISOR;
    let period = notice_period(HB);
    assert_eq!(
        period,
        HB / 8,
        "the pace at which a hand-off polls the settled mark"
    );
    let now = ms(10_000);
    assert_eq!(
        notice_due(None, None, HB),
        Duration::ZERO,
        "the first at once"
    );
    // A quiet spell: the budget is full, only the gap counts.
    let tat = Some(now - HB);
    assert_eq!(notice_due(tat, Some(now - HB), HB), now - HB + gap);
    assert_eq!(
        notice_due(tat, Some(now - gap / 2), HB),
        now - gap / 2 + gap
    );
    // A burst: NOTICE_BURST calls in a row are due as soon as the gap allows, then one per
    // period.
    let (mut tat, mut t) = (None, now);
    let mut times = Vec::new();
    for _ in 0..NOTICE_BURST + 3 {
        t = t.max(notice_due(tat, Some(t).filter(|_| tat.is_some()), HB));
        times.push(t - now);
        tat = Some(charge(tat, t, HB));
    }
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    let burst = usize::try_from(NOTICE_BURST).unwrap();
    assert!(
        gaps[..burst - 1].iter().all(|&g| g == gap),
        "a burst a gap apart: {gaps:?}"
    );
    assert!(
        gaps[burst..].iter().all(|&g| g == period),
        "then one per period: {gaps:?}"
    );
    // Over one heartbeat of a storm a member answers at most the burst plus a heartbeat's worth
    // of periods.
    let answered = times.iter().filter(|&&x| x <= HB).count();
    assert!(answered <= burst + 8 + 1, "{answered} calls in a heartbeat");
}

#[test]
fn seen_is_a_set_of_directories() {
    let both = Seen::VIEWS | Seen::ACKS;
    assert!(both.has(Seen::VIEWS) && both.has(Seen::ACKS));
    assert!(!both.has(Seen::SLOTS));
    assert!(!Seen::NONE.has(Seen::NONE), "nothing is never named");
}

#[test]
fn a_newer_view_without_the_members_claim_breaks_its_token_runs() {
    let me = Holder {
        slot: 1,
        nonce: 101,
    };
    let t = table(&[0, 1], Some((6, &[0])));
    assert_eq!(
        left_out(t.view.as_ref(), Some(4), Some(me)),
        Some(6),
        "a newer view leaves it out"
    );
    let t = table(&[0, 1], Some((6, &[0, 1])));
    assert_eq!(left_out(t.view.as_ref(), Some(4), Some(me)), None, "named");
    let t = table(&[0, 1], Some((4, &[0])));
    assert_eq!(
        left_out(t.view.as_ref(), Some(4), Some(me)),
        None,
        "not newer: a twin, which note_twins handles"
    );
    let other_claim = Holder { slot: 1, nonce: 7 };
    let t = table(&[0, 1], Some((6, &[0, 1])));
    assert_eq!(
        left_out(t.view.as_ref(), Some(4), Some(other_claim)),
        Some(6),
        "the slot under an earlier claim is not this claim"
    );
    assert_eq!(
        left_out(t.view.as_ref(), None, Some(me)),
        None,
        "no view yet"
    );
    assert_eq!(left_out(None, Some(4), Some(me)), None, "no view published");
    assert_eq!(left_out(t.view.as_ref(), Some(4), None), None, "no claim");
}

#[test]
fn a_member_listens_only_to_the_directories_it_acts_on() {
    let slots = [0, 1, 2, 3, 4, 5, 6];
    assert_eq!(
        Fixture::steady(5, &slots).facts().listens(),
        Seen::VIEWS,
        "a member in the middle: the view directory alone"
    );
    assert_eq!(
        Fixture::steady(0, &slots).facts().listens(),
        Seen::VIEWS | Seen::SLOTS,
        "a watcher of the slot table"
    );
    let mut f = Fixture::steady(5, &slots);
    f.discrepancy = Some(Discrepancy {
        live: Vec::new(),
        since: f.now,
        fast: false,
    });
    assert_eq!(
        f.facts().listens(),
        Seen::VIEWS,
        "a discrepancy left to the lowest slot for a heartbeat (a joiner in a burst)"
    );
    f.discrepancy = Some(Discrepancy {
        live: Vec::new(),
        since: f.now,
        fast: true,
    });
    assert_eq!(
        f.facts().listens(),
        Seen::VIEWS | Seen::SLOTS,
        "a slot of the view gone"
    );
    let mut f = Fixture::steady(5, &slots);
    f.settler.settling = true;
    assert_eq!(f.facts().listens(), Seen::VIEWS | Seen::ACKS, "settling");
    f.abandoned = true;
    assert_eq!(f.facts().listens(), Seen::NONE, "gave its lease up");
}

#[test]
fn the_settling_member_reads_acknowledgements_a_short_gap_apart_outside_the_budget() {
    let gap = HB / ACK_GAP_DIVISOR;
    let now = ms(10_000);
    assert_eq!(acks_due(None, HB), Duration::ZERO, "the first at once");
    assert_eq!(acks_due(Some(now), HB), now + gap);
    // Shorter than the budget's pace, longer than the gap of the other notices.
    assert!(gap < notice_period(HB) && gap > HB / NOTICE_GAP_DIVISOR);
}

#[test]
fn a_notice_that_moved_a_change_along_is_not_charged() {
    let now = ms(10_000);
    let charged = charge(None, now, HB);
    assert_eq!(refund(Some(charged), HB), Some(now), "the charge undone");
    assert_eq!(refund(None, HB), None);
    // However many refunds, the budget never holds more than its burst: what is due is never
    // before `now` minus the burst's tolerance, and a charge starts from `now` at the latest.
    let mut tat = Some(charged);
    for _ in 0..100 {
        tat = refund(tat, HB);
    }
    assert_eq!(charge(tat, now, HB), now + notice_period(HB));
}
