//! Views: deciding from a table whether to publish the next view, publishing it, adopting the
//! newest view as pending, and activating it once the hand-off allows.

use std::sync::Arc;

use super::super::records::{Holder, ViewRecord, MAX_EPOCH};
use super::super::table::Table;
use super::super::view::{Cause, Change, GroupPhase, ViewState};
use super::decide::{
    awaits_returning, left_out, next_view, publishes, unsettled, view_is_stale, view_needs_slots,
    view_slot_gone,
};
use super::{Claim, Discrepancy, Engine, Handoff, Runner};
use crate::error::{Error, Result};

/// Why a member does not touch a view a later version of headcount wrote.
pub(super) fn newer_version(epoch: u64) -> Error {
    Error::config(format!(
        "the group's view (epoch {epoch}) was written by a later version of headcount: this member neither replaces nor adopts it, and keeps its own; run every member of a group on one version"
    ))
}

impl Runner {
    /// Publishes a view when the table calls for one, adopts the newest view, and moves the
    /// hand-off along. `fresh` says the slots were read after the view, in this heartbeat: only
    /// then does the member compare them (a copy from an earlier heartbeat may lack claims the
    /// view already names), publish, or settle.
    pub(super) async fn on_table(&mut self, table: &Table, own_change: bool, fresh: bool) {
        if let Err(e) = self.check_view_assignor(table) {
            // Other live members work under a view of another assignor: publishing over it
            // would have them publish over ours in turn, for ever. The heartbeat ends this
            // member with the reason.
            self.set_error(Some(&e));
            return;
        }
        let live = table.live();
        let my_slot = self.claims.current.as_ref().map(|c| c.slot);
        let mut newest = table.view.clone();
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
        let twin_epoch = self.note_twins(table);
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
            // members that read them.
        } else if stale {
            let lowest = table.working().next() == my_slot && my_slot.is_some();
            // Back from an outage of the store: the members of the last view claim their slots
            // again before anyone publishes a view without them.
            // Not a view that must be replaced whatever the slots (one below an epoch some
            // member acted on, or an epoch minted twice): that repair waits for nobody.
            let repair = twin_epoch || table.view.as_ref().is_some_and(|v| v.epoch < wanted);
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
            let fast = lowest || view_slot_gone(table);
            let lasted = now.saturating_sub(since);
            let discrepancy = Discrepancy {
                live: live.clone(),
                since,
                fast,
            };
            match self.next_view(table, self.cache.highest, live) {
                // Unreachable: the configuration check makes sure the keys are at hand.
                None if self.cache.highest < MAX_EPOCH => {
                    let e = Error::config(format!(
                        "the `{}` assignor could not compute an assignment: its declared keys are not at hand",
                        self.cfg.assignor
                    ));
                    self.set_error(Some(&e));
                    self.discrepancy = Some(discrepancy);
                }
                None => {
                    let e = Error::foreign(
                        &self.cfg.keys.view,
                        "an epoch below the largest one (a view or acknowledgement holds it: stop every member and delete the group's keys to start again)",
                        &self.cache.highest.to_string(),
                    );
                    self.set_error(Some(&e));
                    self.discrepancy = Some(discrepancy);
                }
                Some(next)
                    if !returning && publishes(own_change, lowest, lasted, self.cfg.heartbeat) =>
                {
                    match self.publish(table, &next).await {
                        Ok(true) => {
                            tracing::info!(group = self.cfg.keys.group(), member = %self.cfg.member, epoch = next.epoch, live = next.holders.len(), "published a view");
                            // As after settling: the next beat reads the table this write
                            // changed.
                            self.forget_seen();
                            self.settler.published = Some(next.epoch);
                            self.cache.highest = next.epoch;
                            newest = Some(next);
                            self.discrepancy = None;
                        }
                        // Someone else changed the view since this listing (or the reply was
                        // lost): the view in the listing is stale, so adopt nothing and list
                        // again at the next (quarter-heartbeat) beat. Read it then whatever
                        // version the store answers: the refusal proves the view changed, and
                        // a store whose version missed that change would answer "unchanged"
                        // for ever.
                        Ok(false) => {
                            newest = None;
                            self.forget_seen();
                            self.discrepancy = Some(discrepancy);
                        }
                        Err(e) => {
                            newest = None;
                            self.forget_seen();
                            self.set_error(Some(&e));
                            self.discrepancy = Some(discrepancy);
                        }
                    }
                }
                Some(_) => self.discrepancy = Some(discrepancy),
            }
        } else {
            self.discrepancy = None;
        }
        if let Some(v) = newest {
            self.adopt(v);
        }
        self.cache.settled = table.settled;
        self.cache.unsettled = unsettled(table.view.as_ref(), self.cache.settled);
        // Other slots' records count as acknowledgements only when read after the view.
        let fresh_table = fresh.then_some(table);
        self.progress(fresh_table).await;
        if fresh && self.settle(table).await {
            self.cache.unsettled = false;
            self.progress(fresh_table).await;
        }
        self.reassert(table).await;
        // A view this member just published is not in this table yet: poll (reading the
        // table, then the acknowledgements) until it is settled.
        if self
            .settler
            .published
            .is_some_and(|e| table.view.as_ref().is_none_or(|v| v.epoch < e))
        {
            self.settler.settling = true;
        }
    }

    /// Publishes `next` over the view `table` holds, with a compare-and-set against its text, so
    /// of the members that try exactly one wins and the epoch is minted by the store. Returns
    /// whether it wrote.
    pub(super) async fn publish(&self, table: &Table, next: &ViewRecord) -> Result<bool> {
        self.store
            .compare_and_set(
                &self.cfg.keys.view,
                table.view_text.as_deref(),
                &next.to_string(),
                None,
            )
            .await
    }
}

impl Engine {
    /// Looks for signs that a store which lost writes minted one of this member's epochs twice,
    /// or that the group moved on without waiting for it ([`left_out`]), and breaks its token
    /// runs there (see `State::break_runs_at`). Returns whether the
    /// published view is such a twin: the epoch this member works towards, with other holders.
    /// Equal tokens would pass every fence, so the caller replaces it by a view above both.
    fn note_twins(&self, table: &Table) -> bool {
        let mut st = self.shared.lock();
        let twin = match (st.target(), &table.view) {
            (Some(t), Some(v)) => t.epoch() == v.epoch && !t.record().same_assignment(v),
            _ => false,
        };
        if let (true, Some(v)) = (twin, &table.view) {
            st.break_runs_at(v.epoch);
        }
        let holder = self.claims.current.as_ref().map(Claim::holder);
        let target = st.target().map(|t| t.epoch());
        if let Some(epoch) = left_out(table.view.as_ref(), target, holder) {
            st.break_runs_at(epoch);
        }
        twin
    }

    /// The view to publish over `highest` for the `live` holders (see [`next_view`]): a sticky
    /// assignment starts from the view `table` holds, or else from this member's newest.
    pub(super) fn next_view(
        &self,
        table: &Table,
        highest: u64,
        live: Vec<Holder>,
    ) -> Option<ViewRecord> {
        let own = self.target();
        // Back from an outage that took the view with it (a store that restarted empty), a
        // sticky assignment starts from the view the member worked under before.
        let before = self.outage.last_view.as_ref().map(|v| v.record());
        next_view(
            highest,
            live,
            self.cfg.assignor,
            self.cfg.declared.as_ref(),
            &[
                table.view.as_ref(),
                own.as_ref().map(|v| v.record()),
                before,
            ],
        )
    }

    /// Makes `view` the pending view when it is newer than what the member has.
    fn adopt(&mut self, view: ViewRecord) {
        let current = self.target().map(|v| v.epoch());
        if current.is_some_and(|e| e >= view.epoch) {
            return;
        }
        let state = match ViewState::build_with(view, self.cfg.assignor, self.cfg.declared.as_ref())
        {
            Ok(s) => Arc::new(s),
            Err(e) => {
                self.set_error(Some(&e));
                return;
            }
        };
        let (has_active, revoking) = {
            let mut st = self.shared.lock();
            if let Some(old) = st.pending.replace(state.clone()) {
                st.skipped.push(old);
            }
            st.remember(state.clone());
            // What the member owns changes: tell the application before it acknowledges.
            let revoking = match (&st.active, st.holder) {
                (Some(active), Some(holder)) if state.moves_keys_from(active) => Some(Change {
                    from: Some(active.clone()),
                    to: state,
                    slot: holder.slot,
                    cause: Cause::View,
                    holder,
                }),
                _ => None,
            };
            (st.active.is_some(), revoking)
        };
        self.shared.wake_revoked();
        if let Some(change) = revoking {
            let _ = self.shared.revocations.send(change);
        }
        let now = self.cfg.clock.monotonic();
        match &mut self.handoff {
            Some(h) => h.adopted_at = now,
            None => {
                self.handoff = Some(Handoff {
                    since: now,
                    adopted_at: now,
                })
            }
        }
        self.shared.publish(|a| {
            a.phase = if has_active {
                GroupPhase::Handoff
            } else {
                GroupPhase::Joining
            }
        });
    }

    /// Makes the pending `view` active, ending the hand-off, and tells the member's watchers.
    pub(super) fn activate(&mut self, view: Arc<ViewState>, holder: Holder) {
        let from = {
            let mut st = self.shared.lock();
            if st.pending.as_ref().map(|p| p.epoch()) != Some(view.epoch()) {
                return;
            }
            st.pending = None;
            st.skipped.clear();
            if st.active.is_none() {
                // Nothing was granted under this claim before its first active view, so no token
                // run reaches back past it: after a store rollback re-mints epochs that nobody
                // alive saw twice, a run through views this member only held pending could give
                // a token below one another member already wrote with.
                st.run_floor = st.run_floor.max(view.epoch());
            }
            st.active.replace(view.clone())
        };
        if let Some(h) = self.handoff.take() {
            self.cfg
                .metrics
                .handoff(self.cfg.clock.monotonic().saturating_sub(h.since));
        }
        let slot = holder.slot;
        let pair = view.pair_of(holder);
        let live: Vec<u32> = view.record.slots().collect();
        self.cfg.metrics.view_changed(view.epoch(), live.len());
        if let Some(keys) = &self.cfg.declared {
            let owned = keys
                .hashes()
                .iter()
                .filter(|&&h| view.owned_by(h, holder))
                .count();
            self.cfg.metrics.keys_owned(owned);
        }
        // A view that names a slot the previous one did not (a join, a replacement) takes
        // keys from the members that held them: count it as moving this member's keys away
        // when it held a share before.
        if let Some(old) = from.as_ref().filter(|old| old.pair_of(holder).is_some()) {
            // By slot: a claim taken back from a restart changes the holder of a slot, which
            // moves nothing.
            if view
                .record
                .slots()
                .any(|s| !old.record.slots().any(|o| o == s))
            {
                self.cfg.metrics.grants_revoked("moved");
            }
        }
        tracing::info!(group = self.cfg.keys.group(), member = %self.cfg.member, epoch = view.epoch(), slot, index = ?pair.map(|p| p.0), replicas = live.len(), "view active");
        self.shared.publish(|a| {
            a.slot = Some(slot);
            a.index = pair.map(|p| p.0);
            a.replicas = live.len() as u32;
            a.epoch = view.epoch();
            a.live = live;
            // A view that does not name this claim gives it nothing: it waits for one that does.
            a.phase = if pair.is_some() {
                GroupPhase::Active
            } else {
                GroupPhase::Joining
            };
        });
        let _ = self.shared.changes.send(Change {
            from,
            to: view,
            slot,
            cause: Cause::View,
            holder,
        });
    }
}
