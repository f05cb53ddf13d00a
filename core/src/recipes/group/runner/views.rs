//! Views: the next view to publish, adopting a view as pending, activating it once the
//! hand-off allows, and the signs of a view minted twice. When a table calls for a view, and
//! when a member publishes it, is decided by a round ([`super::round`]).

use std::sync::Arc;

use super::super::header::{Publication, Snapshot, ViewHeader, CHANGE_TTLS, SWEEP_EVERY};
use super::super::records::{Holder, ViewRecord};
use super::super::table::SlotTable;
use super::super::view::{Cause, Change, ViewState};
use super::decide::{left_out, next_view};
use super::{Claim, Engine, Handoff, Phase, Runner};
use crate::error::{Error, Result};

/// Why a member does not touch a view a later version of headcount wrote.
pub(super) fn newer_version(epoch: u64) -> Error {
    Error::config(format!(
        "the group's view (epoch {epoch}) was written by a later version of headcount: this member neither replaces nor adopts it, and keeps its own; run every member of a group on one version"
    ))
}

impl Runner {
    /// Publishes `next` over the view `table` holds, with a compare-and-set against its text, so
    /// of the members that try exactly one wins and the epoch is minted by the store. Returns
    /// whether it wrote.
    pub(super) async fn publish(&self, table: &SlotTable, next: &ViewRecord) -> Result<bool> {
        let publication = self.publication(table, next);
        self.write_publication(table.view_text.as_deref(), &publication)
            .await
    }

    /// Writes `publication` over the view text `expected`: its snapshot first, when it has one,
    /// then the compare-and-set of `view:current`. Once published, it writes the change record
    /// (see [`header`](super::super::header)), when it has one, and deletes the snapshots
    /// nobody needs any more (and, every [`SWEEP_EVERY`] epochs, any left behind); when
    /// refused, it deletes its own snapshot once the view published instead holds its epoch or
    /// a later one (epochs only rise, so this snapshot's view can never be published) and no
    /// header keeps it. Returns whether it wrote.
    pub(super) async fn write_publication(
        &self,
        expected: Option<&str>,
        publication: &Publication,
    ) -> Result<bool> {
        let layout = &self.cfg.layout;
        if let Some((snapshot, text)) = &publication.snapshot {
            let key = layout.base(*snapshot);
            if !self.store.compare_and_set(&key, None, text, None).await? {
                let there = self.store.get(&key).await?;
                if there.as_deref() != Some(text.as_str()) {
                    // Another view under this epoch and digest: the digest names holders and
                    // owners, not the assignor, so a member configured with another assignor
                    // may be publishing it, and its header may follow. Never write over it:
                    // this member lost the epoch (or, when that member died first, tries again
                    // once its claim is gone and the digest differs).
                    if there.as_deref().and_then(ViewRecord::parse).is_some() {
                        return Ok(false);
                    }
                    // Another program's value at this key: the group's key space is ours.
                    if !self
                        .store
                        .compare_and_set(&key, there.as_deref(), text, None)
                        .await?
                    {
                        return Ok(false);
                    }
                }
            }
        }
        let written = self
            .store
            .compare_and_set(&layout.view, expected, &publication.current, None)
            .await?;
        if written {
            if let Some((view, text)) = &publication.change {
                // For members that miss this change and read a later header; one that finds
                // it missing (this write failed, or it expired) reads the snapshot instead.
                let ttl = self.cfg.ttl * CHANGE_TTLS;
                let _ = self
                    .store
                    .compare_and_set(&layout.change(*view), None, text, Some(ttl))
                    .await;
            }
            for stale in &publication.stale {
                // Left behind when this fails: the next sweep or `remove-group` deletes it.
                let _ = self.store.delete(&layout.base(*stale)).await;
            }
            if publication.epoch.is_multiple_of(SWEEP_EVERY) {
                self.sweep_snapshots(publication).await;
            }
        } else if let Some((snapshot, _)) = &publication.snapshot {
            let current = self.store.get(&layout.view).await?;
            let taken = match current.as_deref() {
                None => false,
                Some(text) => match ViewHeader::parse(text) {
                    // A header naming this snapshot (another member published the same view),
                    // or keeping it for the members that read the header before, needs it.
                    Some(h) => {
                        h.epoch >= snapshot.epoch
                            && h.snapshot() != *snapshot
                            && h.prev != Some(*snapshot)
                    }
                    None => ViewRecord::parse(text).is_some_and(|v| v.epoch >= snapshot.epoch),
                },
            };
            if taken {
                let _ = self.store.delete(&layout.base(*snapshot)).await;
            }
        }
        Ok(written)
    }

    /// Deletes the snapshots left behind below the view `publication` just published: by a
    /// publisher that crashed between its snapshot and its header, or whose delete failed.
    /// Listing the snapshots reads them, so it runs once in [`SWEEP_EVERY`] epochs, by the
    /// publisher; it keeps the published view's snapshot and the one its header keeps.
    async fn sweep_snapshots(&self, publication: &Publication) {
        let layout = &self.cfg.layout;
        let Ok(listing) = self.store.list(&layout.bases).await else {
            return;
        };
        for (key, _) in listing {
            let Some(snapshot) = key.strip_prefix(&layout.bases).and_then(Snapshot::parse) else {
                continue;
            };
            if snapshot.epoch <= publication.epoch && !publication.keeps(snapshot) {
                let _ = self.store.delete(&key).await;
            }
        }
    }
}

impl Engine {
    /// How this member writes `next` over the view `table` holds: whole, or as a header and a
    /// snapshot ([`Publication::of`]).
    pub(super) fn publication(&self, table: &SlotTable, next: &ViewRecord) -> Publication {
        Publication::of(
            next,
            table.view.as_ref(),
            table.view_header.as_ref(),
            self.cfg.view_inline_max,
        )
    }

    /// Looks for signs that a store which lost writes minted one of this member's epochs twice,
    /// or that the group moved on without waiting for it ([`left_out`]), and breaks its token
    /// runs there (see `State::break_runs_at`). Returns whether the
    /// published view is such a twin: the epoch this member works towards, with other holders.
    /// Equal tokens would pass every fence, so the caller replaces it by a view above both.
    pub(super) fn note_twins(&self, table: &SlotTable) -> bool {
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
    pub(super) fn view_after(
        &self,
        table: &SlotTable,
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
    pub(super) fn adopt(&mut self, view: ViewRecord) {
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
        let revoking = {
            let mut st = self.shared.lock();
            if let Some(old) = st.pending.replace(state.clone()) {
                st.skipped.push(old);
            }
            st.remember(state.clone());
            // What the member owns changes: tell the application before it acknowledges.
            match (&st.active, st.holder) {
                (Some(active), Some(holder)) if state.moves_keys_from(active) => Some(Change {
                    from: Some(active.clone()),
                    to: state,
                    slot: holder.slot,
                    cause: Cause::View,
                    holder,
                }),
                _ => None,
            }
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
        let phase = self.enter(Phase::Member);
        self.shared.publish(|a| a.phase = phase);
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
            // A set of the old slots: a scan of them for every slot of the new view was
            // O(n²) per activation, and in a group of thousands it took a quarter of the
            // client's CPU while the views of a cold start activated.
            let before: std::collections::HashSet<u32> = old.record.slots().collect();
            if view.record.slots().any(|s| !before.contains(&s)) {
                self.cfg.metrics.grants_revoked("moved");
            }
        }
        tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, epoch = view.epoch(), slot, index = ?pair.map(|p| p.0), replicas = live.len(), "view active");
        let phase = self.enter(Phase::Member);
        self.shared.publish(|a| {
            a.slot = Some(slot);
            a.index = pair.map(|p| p.0);
            a.replicas = live.len() as u32;
            a.epoch = view.epoch();
            a.live = live;
            // A view that does not name this claim gives it nothing: it waits for one that does.
            a.phase = phase;
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
