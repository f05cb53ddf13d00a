//! A round's settling steps: reading the acknowledgements, writing the settled mark, and
//! re-applying a lease TTL to the slots that stall a hand-off.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::super::super::records::{parse_acks, AckRecord, SettledRecord, SlotRecord};
use super::super::super::table::SlotTable;
use super::super::super::view::ViewState;
use super::super::super::{MAX_LEASE_TTL, MIN_LEASE_TTL};
use super::super::decide::settled_at_or_past;
use super::super::{Engine, Nudge, Stall, NUDGES_PER_BEAT};
use super::{Call, Nudging, Round, Step, Then, Wait};
use crate::error::Result;

impl Engine {
    /// Settles the published view when this member's slot is the lowest live one, or it
    /// published the view (or, as a fallback for a lowest slot that does not, when its own
    /// hand-off is overdue: see `Facts::settle_overdue`): asks for the acknowledgements.
    pub(super) fn settle(&mut self, round: &mut Round) -> Then {
        self.settler.settling = false;
        let Some(table) = round.table.clone() else {
            return Then::Next;
        };
        let Some(own) = self.claims.current.as_ref().map(|c| c.slot) else {
            return Then::Next;
        };
        if self.claims.abandoned {
            return Then::Next;
        }
        let Some(view) = &table.view else {
            return Then::Next;
        };
        let Some(target) = self.target().filter(|t| t.epoch() == view.epoch) else {
            return Then::Next;
        };
        let (epoch, digest) = (target.epoch(), target.digest);
        if settled_at_or_past(self.cache.settled, epoch, digest) {
            self.settler.stalled = None;
            return Then::Next;
        }
        // The same epoch for other holders or owners: a store that lost writes minted it twice,
        // and `views` replaces it.
        if !target.record().same_assignment(view) || !self.has_acked(&target) {
            return Then::Next;
        }
        let lowest = table.working().next() == Some(own);
        let publisher = self.settler.published == Some(epoch);
        self.settler.settling = lowest || publisher;
        let overdue = self.facts().settle_overdue();
        if !lowest && !publisher && !overdue {
            return Then::Next;
        }
        self.settler.acks_read = Some(self.cfg.clock.monotonic());
        let call = Call::List {
            dir: self.cfg.layout.acks.clone(),
        };
        Then::Call(call, Box::new(Wait::Acks { target, own }))
    }

    /// The acknowledgements read: once every live slot acknowledged the view, asks for the
    /// settled mark's compare-and-set; otherwise nudges the slots that stall it.
    pub(super) fn acks_read(
        &mut self,
        round: &mut Round,
        target: &ViewState,
        own: u32,
        result: Result<Vec<(String, String)>>,
    ) -> Then {
        let Some(table) = round.table.clone() else {
            return Then::Next;
        };
        let acks = match result {
            Ok(listing) => parse_acks(&self.cfg.layout.acks, listing),
            Err(e) => {
                self.set_error(Some(&e));
                return Then::Next;
            }
        };
        let (epoch, digest) = (target.epoch(), target.digest);
        // An acknowledgement above the published view (the store lost the view it acknowledged)
        // raises the floor of the next epoch this member publishes.
        let acked = acks.values().map(|a| a.acked).max().unwrap_or(0);
        self.cache.highest = self.cache.highest.max(acked);
        // This member's own acknowledgement is what it did, whatever the store kept of it.
        let all = table
            .slots
            .keys()
            .all(|&s| s == own || table.slot_acked(s, &acks, epoch, digest));
        if !all {
            if self.settler.settling {
                return self.expire_stalled(&table, &acks, target, own);
            }
            return Then::Next;
        }
        let mark = SettledRecord {
            epoch,
            view: digest,
        };
        let call = Call::Cas {
            key: self.cfg.layout.settled.clone(),
            expected: table.settled_text.clone(),
            new: mark.to_string(),
            ttl: None,
        };
        Then::Call(call, Box::new(Wait::Mark(mark)))
    }

    /// The settled mark's compare-and-set answered. Once written, the round progresses again
    /// (the pending view may now activate).
    pub(super) fn mark_written(
        &mut self,
        round: &mut Round,
        mark: SettledRecord,
        result: Result<bool>,
    ) -> Then {
        match result {
            Ok(true) => {
                tracing::debug!(group = self.cfg.layout.group(), member = %self.cfg.member, epoch = mark.epoch, "every live slot acknowledged the view: settled it");
                // Read the table at the next beat even if its version is the one held: a
                // store that rolls back to exactly that table must not leave this member
                // believing its write stuck.
                self.forget_seen();
                self.cache.settled = Some(mark);
                self.settler.settling = false;
                self.settler.stalled = None;
                self.cache.unsettled = false;
                round.steps.push_front(Step::Progress);
            }
            // Changed since the listing: read the view directory again at the next beat,
            // whatever version the store answers (as after a lost view write).
            Ok(false) => self.forget_seen(),
            Err(e) => {
                self.forget_seen();
                self.set_error(Some(&e));
            }
        }
        Then::Next
    }

    /// A hand-off stalled for three TTLs on a slot that has not acknowledged: re-applies that
    /// slot's own lease TTL to it, once per claim and epoch, with a compare-and-set that keeps
    /// its exact stored text. A live holder renews within a third of its TTL anyway, so this
    /// changes nothing for it; a record that has no expiry (restored by a tool that drops TTLs,
    /// written by hand) expires after that TTL, and the group proceeds without it instead of
    /// waiting forever. Only a settling member (the lowest live slot, the view's publisher)
    /// does it, at most [`NUDGES_PER_BEAT`] slots per beat, so a large group in churn does not
    /// write O(n²).
    pub(super) fn expire_stalled(
        &mut self,
        table: &SlotTable,
        acks: &BTreeMap<u32, AckRecord>,
        pending: &ViewState,
        own: u32,
    ) -> Then {
        let (epoch, digest) = (pending.epoch(), pending.digest);
        let now = self.cfg.clock.monotonic();
        let since = match self.settler.stalled {
            Some(stall) if stall.epoch == epoch => stall.since,
            _ => {
                self.settler.stalled = Some(Stall { epoch, since: now });
                now
            }
        };
        if now.saturating_sub(since) < self.cfg.ttl * 3 {
            return Then::Next;
        }
        let queue: VecDeque<(u32, SlotRecord)> = table
            .slots
            .iter()
            .filter(|(&s, r)| {
                s != own
                    && !table.slot_acked(s, acks, epoch, digest)
                    && !self.settler.nudged.contains(&Nudge {
                        slot: s,
                        nonce: r.nonce,
                        epoch,
                    })
            })
            .take(NUDGES_PER_BEAT)
            .map(|(&s, r)| (s, r.clone()))
            .collect();
        self.nudge_next(table, Nudging { epoch, queue })
    }

    /// Reads the next stalled slot's record, or ends the nudges (bounding what is remembered).
    pub(super) fn nudge_next(&mut self, table: &SlotTable, nudging: Nudging) -> Then {
        match nudging.queue.front() {
            Some(&(s, _)) => {
                let key = self.cfg.layout.slot(s);
                Then::Call(Call::Get { key }, Box::new(Wait::NudgeRead(nudging)))
            }
            None => {
                // Bounded: only the claims of the current table, for the newest epochs.
                if self.settler.nudged.len() > 4 * table.slots.len() + 16 {
                    self.settler.nudged.retain(|n| n.epoch == nudging.epoch);
                }
                Then::Next
            }
        }
    }

    /// A stalled slot's record read: when it is still the claim listed (its exact text),
    /// re-applies its lease TTL.
    pub(super) fn nudge_read(
        &mut self,
        round: &mut Round,
        mut nudging: Nudging,
        result: Result<Option<String>>,
    ) -> Then {
        let Some(table) = round.table.clone() else {
            return Then::Next;
        };
        let Some((s, r)) = nudging.queue.front().cloned() else {
            return Then::Next;
        };
        let nudge = Nudge {
            slot: s,
            nonce: r.nonce,
            epoch: nudging.epoch,
        };
        // The text stored when it parses to the record listed: a compare-and-set against the
        // exact stored text matches even a record written by hand with other spacing or digits,
        // which a re-serialized one would not.
        let text = match result {
            Ok(text) => text.filter(|t| SlotRecord::parse(t).as_ref() == Some(&r)),
            Err(e) => {
                self.set_error(Some(&e));
                return Then::Next;
            }
        };
        let Some(text) = text else {
            // Changed or gone since the listing: nothing to do for this claim.
            self.settler.nudged.push(nudge);
            nudging.queue.pop_front();
            return self.nudge_next(&table, nudging);
        };
        // The lease TTL alone, not the crash grace: a crashed member that stalls a hand-off for
        // three TTLs stops waiting on the grace.
        let ttl = Duration::from_millis(r.ttl_ms).clamp(MIN_LEASE_TTL, MAX_LEASE_TTL);
        let call = Call::Cas {
            key: self.cfg.layout.slot(s),
            expected: Some(text.clone()),
            new: text,
            ttl: Some(ttl),
        };
        Then::Call(call, Box::new(Wait::NudgeWrite(nudging)))
    }

    /// The compare-and-set re-applying a stalled slot's TTL answered; on to the next slot.
    pub(super) fn nudge_written(
        &mut self,
        round: &mut Round,
        mut nudging: Nudging,
        result: Result<bool>,
    ) -> Then {
        let Some(table) = round.table.clone() else {
            return Then::Next;
        };
        let Some((s, r)) = nudging.queue.pop_front() else {
            return Then::Next;
        };
        match result {
            Ok(applied) => {
                self.settler.nudged.push(Nudge {
                    slot: s,
                    nonce: r.nonce,
                    epoch: nudging.epoch,
                });
                if applied {
                    tracing::warn!(group = self.cfg.layout.group(), member = %self.cfg.member, slot = s, epoch = nudging.epoch, "slot has not acknowledged for three TTLs: re-applied its lease TTL, so a record without expiry does not stall the group");
                }
                self.nudge_next(&table, nudging)
            }
            // Not recorded: tried again at the next beat.
            Err(e) => {
                self.set_error(Some(&e));
                Then::Next
            }
        }
    }
}
