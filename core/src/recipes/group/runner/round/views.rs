//! A round's first steps: whether the table calls for a view and this member publishes it,
//! the view's compare-and-set, adopting the newest view; and its last: polling for the settled
//! mark of a view just published.

use super::super::super::records::{ViewRecord, MAX_EPOCH};
use super::super::decide::{
    awaits_returning, coalesces, others_joining, publishes, unsettled, view_is_stale,
    view_needs_slots, view_slot_gone,
};
use super::super::views::newer_version;
use super::super::{Claim, Discrepancy, Engine};
use super::{Call, Round, Then, Wait};
use crate::error::{Error, Result};

impl Engine {
    /// Decides whether the table calls for a new view and whether this member publishes it
    /// now; asks for the view's compare-and-set if so. Notes the newest view for
    /// [`Engine::adopt_newest`]. `fresh` (the slots were read after the view, in this
    /// heartbeat) is required to compare the slots with the view, publish or settle: a copy
    /// from an earlier heartbeat may lack claims the view already names.
    pub(super) fn views(&mut self, round: &mut Round) -> Then {
        let Some(table) = round.table.clone() else {
            return Then::Next;
        };
        if let Err(e) = self.check_view_assignor(&table) {
            // Other live members work under a view of another assignor: publishing over it
            // would have them publish over ours in turn, for ever. The heartbeat ends this
            // member with the reason.
            self.set_error(Some(&e));
            return Then::Stop;
        }
        let fresh = round.fresh;
        let live = table.live();
        let my_slot = self.claims.current.as_ref().map(|c| c.slot);
        round.newest = table.view.clone();
        // The floor counts the acknowledgements too: a member that never saw the view (it was
        // lost or overwritten) still must not publish an epoch some member already acted on.
        let floor = self.cache.highest.max(table.highest_epoch());
        // A claim taken back from a restart or a crash activates no view at or below the epochs
        // its previous process granted under (`Claims::floor`): a view there, even one naming
        // this claim (a store that went back re-minted it), is replaced by one above it, or the
        // member would wait for ever.
        let wanted = if self.claims.floor > 0 {
            floor.max(self.claims.floor + 1)
        } else {
            floor
        };
        let twin_epoch = self.note_twins(&table);
        // A view a later version wrote is neither replaced nor adopted while a holder it names
        // is live (see `ViewRecord::newer_version`): this member keeps its own and says why.
        let newer = table.newer_view_in_use();
        if let Some(epoch) = newer {
            self.set_error(Some(&newer_version(epoch)));
        }
        let stale =
            newer.is_none() && view_is_stale(table.view.as_ref(), &live, wanted, twin_epoch);
        self.cache.highest = floor;
        // A view that went back, is missing or took this member's epoch needs a view above it,
        // which only a member that read the slots publishes: read them at the next beat.
        self.cache.need_slots =
            !fresh && newer.is_none() && view_needs_slots(table.view.as_ref(), wanted, twin_epoch);
        let now = self.cfg.clock.monotonic();
        if self.outage.grace_until.is_some_and(|u| now >= u) {
            self.outage.grace_until = None;
            self.outage.last_view = None;
        }
        if !fresh {
            // Adopt the published view as it is; what the slots call for is decided by the
            // members that read them. A discrepancy left to the lowest slot ends when a view
            // names every claim this member saw live: the lowest published it. Not a view to
            // repair (below an epoch seen, or minted twice): it names those claims too, and
            // clearing would restart the heartbeat after which this member publishes above it.
            if !self.cache.need_slots
                && self.discrepancy.as_ref().is_some_and(|d| {
                    !d.fast
                        && table
                            .view
                            .as_ref()
                            .is_some_and(|v| d.live.iter().all(|h| v.names(h)))
                })
            {
                self.discrepancy = None;
            }
            return Then::Next;
        }
        if !stale {
            self.discrepancy = None;
            return Then::Next;
        }
        let lowest = table.working().next() == my_slot && my_slot.is_some();
        let mine = self.claims.current.as_ref().map(Claim::holder);
        // Back from an outage of the store: the members of the last view claim their slots
        // again before anyone publishes a view without them. Not a view that must be replaced
        // whatever the slots (one below an epoch some member acted on, or an epoch minted
        // twice): that repair waits for nobody.
        let repair = twin_epoch || table.view.as_ref().is_some_and(|v| v.epoch < wanted);
        // A joiner leaves a burst of joins to the lowest slot (a join that lost a race for a
        // slot knows of another under way), but not a view to repair: one below an epoch it
        // saw (a store that went back), which it would otherwise adopt.
        // In a large group, a join that comes while the published view is still handed off
        // waits for the lowest slot's next view too: every view costs each member a
        // read and an acknowledgement, so a burst of joins must make a few views, not one each.
        let own_alone = round.own_change
            && (repair
                || (!round.raced
                    && !others_joining(table.view.as_ref(), &live, mine)
                    && !coalesces(
                        live.len(),
                        self.cfg.coalesce_from,
                        table.view.as_ref(),
                        table.settled,
                    )));
        let returning = !repair
            && awaits_returning(
                self.outage.grace_until,
                now,
                self.outage.last_view.as_ref().map(|v| v.record()),
                table.view.as_ref(),
                &live,
            );
        let since = match &self.discrepancy {
            Some(d) if d.live == live => d.since,
            _ => now,
        };
        // A slot of the view is gone (a crash, a lapse): every member watches closely, in
        // case the lowest slot is the one gone. New claims alone publish their own view.
        let fast = lowest || view_slot_gone(&table);
        let lasted = now.saturating_sub(since);
        let discrepancy = Discrepancy {
            live: live.clone(),
            since,
            fast,
        };
        match self.view_after(&table, self.cache.highest, live) {
            // Unreachable: the configuration check makes sure the keys are at hand.
            None if self.cache.highest < MAX_EPOCH => {
                let e = Error::config(format!(
                    "the `{}` assignor could not compute an assignment: its declared keys are not at hand",
                    self.cfg.assignor
                ));
                self.set_error(Some(&e));
                self.discrepancy = Some(discrepancy);
                Then::Next
            }
            None => {
                let e = Error::foreign(
                    &self.cfg.layout.view,
                    "an epoch below the largest one (a view or acknowledgement holds it: stop every member and delete the group's keys to start again)",
                    &self.cache.highest.to_string(),
                );
                self.set_error(Some(&e));
                self.discrepancy = Some(discrepancy);
                Then::Next
            }
            Some(next)
                if !returning
                    && publishes(
                        own_alone,
                        lowest,
                        self.settler.published_at.map(|t| now.saturating_sub(t)),
                        lasted,
                        self.cfg.heartbeat,
                        table.slots.len(),
                    ) =>
            {
                // A compare-and-set against the text read, so of the members that try exactly
                // one wins and the epoch is minted by the store.
                let publication = self.publication(&table, &next);
                let call = if publication.is_whole() {
                    Call::Cas {
                        key: self.cfg.layout.view.clone(),
                        expected: table.view_text.clone(),
                        new: publication.current,
                        ttl: None,
                    }
                } else {
                    Call::Publish {
                        expected: table.view_text.clone(),
                        publication,
                    }
                };
                Then::Call(call, Box::new(Wait::View { next, discrepancy }))
            }
            Some(_) => {
                self.discrepancy = Some(discrepancy);
                Then::Next
            }
        }
    }

    /// The view's compare-and-set answered.
    pub(super) fn view_written(
        &mut self,
        round: &mut Round,
        next: ViewRecord,
        discrepancy: Discrepancy,
        result: Result<bool>,
    ) {
        match result {
            Ok(true) => {
                tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, epoch = next.epoch, live = next.holders.len(), "published a view");
                // As after settling: the next beat reads the table this write changed.
                self.forget_seen();
                self.settler.published = Some(next.epoch);
                self.settler.published_at = Some(self.cfg.clock.monotonic());
                self.cache.highest = next.epoch;
                round.newest = Some(next);
                self.discrepancy = None;
            }
            // Someone else changed the view since this listing (or the reply was lost): the
            // view in the listing is stale, so adopt nothing and list again at the next
            // (quarter-heartbeat) beat. Read it then whatever version the store answers: the
            // refusal proves the view changed, and a store whose version missed that change
            // would answer "unchanged" for ever.
            Ok(false) => {
                round.newest = None;
                self.forget_seen();
                self.discrepancy = Some(discrepancy);
            }
            Err(e) => {
                round.newest = None;
                self.forget_seen();
                self.set_error(Some(&e));
                self.discrepancy = Some(discrepancy);
            }
        }
    }

    /// Adopts the newest view as pending, and notes whether the published view is settled.
    pub(super) fn adopt_newest(&mut self, round: &mut Round) {
        let Some(table) = round.table.clone() else {
            return;
        };
        // A view below an epoch this member has seen (the store went back, or the view was read
        // before a newer one) is not adopted: a member that holds nothing any more would make it
        // active and go back in epochs. A view above it replaces it (this member publishes one
        // itself once the difference outlasts a heartbeat).
        if let Some(v) = round
            .newest
            .take()
            .filter(|v| v.epoch >= self.cache.highest)
        {
            self.adopt(v);
        }
        self.cache.settled = table.settled;
        self.cache.unsettled = unsettled(table.view.as_ref(), self.cache.settled);
    }

    /// A view this member just published is not in this table yet: poll (reading the table,
    /// then the acknowledgements) until it is settled.
    pub(super) fn mark_settling(&mut self, round: &Round) {
        let Some(table) = &round.table else {
            return;
        };
        if self
            .settler
            .published
            .is_some_and(|e| table.view.as_ref().is_none_or(|v| v.epoch < e))
        {
            self.settler.settling = true;
        }
    }
}
