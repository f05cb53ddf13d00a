//! Ending work: revoking every grant when the lease is lost, failing for good, and leaving the
//! group gracefully (drain, then hand the slot to a standby, or park it for a restart, or delete
//! the claim and publish the view without it).

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use super::super::grants::Shared;
use super::super::records::SlotRecord;
use super::super::view::{Cause, Change, GroupPhase};
use super::decide::view_is_stale;
use super::{Claim, Engine, Runner};
use crate::error::{Error, Result};

impl Runner {
    /// Ends with an error: leaves the slot to others and reports.
    pub(super) async fn fail(&mut self, e: &Error) {
        tracing::error!(group = self.cfg.keys.group(), member = %self.cfg.member, "{e}");
        // A member that fails (a twin yielding) hands nothing to a standby.
        self.failing = true;
        let _ = self.leave().await;
        let msg = e.to_string();
        self.shared.publish(|a| {
            a.phase = GroupPhase::Failed;
            a.last_error = Some(msg);
        });
    }

    /// Waits until no grant is in flight, at most the drain timeout, renewing the lease every
    /// heartbeat meanwhile: the others wait for the drain (the leaving member stays in the view
    /// and its slot stays live), however long it takes within the timeout. Returns whether
    /// every grant was dropped; a claim given up for a hand-off's drain timeout is not renewed.
    /// A drain cut short (the timeout, the slot lost, the lease run out
    /// while the store did not answer) is logged with the keys it cut and counted.
    async fn drain(&mut self) -> bool {
        let start = self.cfg.clock.monotonic();
        let give_up = start + self.cfg.drain_timeout;
        let mut renew_at = self
            .cache
            .last_beat
            .map_or(start, |b| b + self.cfg.heartbeat)
            .max(start);
        loop {
            if !self.shared.lock().busy() {
                return true;
            }
            // What was held before a renewal, for the log line of a cut: a lapse while it is in
            // flight revokes every grant (and forgets them) before the cut is seen.
            let mut held_before = None;
            let now = self.cfg.clock.monotonic();
            let deadline = self.shared.lock().deadline;
            let lapsed = deadline.is_none_or(|d| now >= d);
            let renews = !self.claims.abandoned;
            let cut = if now >= give_up {
                Some("timeout")
            } else if lapsed {
                Some("lapsed")
            } else if renews && now >= renew_at {
                renew_at = now + self.cfg.heartbeat;
                held_before = Some(self.shared.lock().held(|_| false));
                match self.renew_while_leaving().await {
                    // The deadline passed while the renewal was in flight: every grant was
                    // revoked, which is no drain.
                    _ if self.shared.lock().deadline.is_none() => Some("lapsed"),
                    Ok(true) => None,
                    Ok(false) => Some("lost"),
                    Err(e) => {
                        self.set_error(Some(&e));
                        // Again soon: the lease has until its deadline.
                        renew_at = now + self.cfg.heartbeat / 4;
                        None
                    }
                }
            } else {
                None
            };
            if let Some(reason) = cut {
                let (keys, share) =
                    held_before.unwrap_or_else(|| self.shared.lock().held(|_| false));
                let why = match reason {
                    "timeout" => "the drain timeout passed",
                    "lost" => "the slot was no longer this member's",
                    _ => "the store did not answer the renewals before the lease ran out",
                };
                tracing::warn!(group = self.cfg.keys.group(), member = %self.cfg.member, reason, key_hashes = ?keys, share, waited = ?now.saturating_sub(start), "leaving with grants still in flight ({why}): the others take the keys named by hash (and the whole share when `share` is true) once the lease has expired, and a fence refuses the cut work's later writes");
                self.cfg.metrics.drain_cut(reason);
                return false;
            }
            // A given-up claim is not renewed: it waits for the grants, the timeout or its
            // deadline, whichever comes first.
            let mut wake = give_up.min(deadline.unwrap_or(give_up));
            if renews {
                wake = wake.min(renew_at);
            }
            tokio::select! {
                biased;
                _ = self.shared.released.notified() => {}
                _ = self.cfg.clock.sleep_until(wake) => {}
            }
        }
    }

    /// One renewal of the current claim while it drains (a compare-and-set of its exact text
    /// onto itself with the lease TTL): whether the slot still held it. The lease deadline moves
    /// on when it did.
    async fn renew_while_leaving(&mut self) -> Result<bool> {
        let Some(claim) = self.claims.current.clone() else {
            return Ok(false);
        };
        let text = claim.record.to_string();
        let key = self.cfg.keys.slot(claim.slot);
        let sent = self.cfg.clock.monotonic();
        let store = self.store.clone();
        let renewed = self
            .before_lapse(store.compare_and_set(&key, Some(&text), &text, Some(self.cfg.slot_ttl)))
            .await?;
        if renewed {
            let mut st = self.shared.lock();
            if st.deadline.is_some() {
                st.deadline = Some(self.deadline(sent));
            }
        }
        Ok(renewed)
    }

    /// Stops granting, drains, deletes the slot and publishes the view without it; or, when
    /// leaving for a restart, parks the claim (see [`Runner::park`]).
    pub(super) async fn leave(&mut self) -> Result<()> {
        self.tell_revoked(Cause::Leave);
        let restart = {
            let mut st = self.shared.lock();
            st.leaving = true;
            st.restart
        };
        self.shared.wake_revoked();
        let drained = self.drain().await;
        let mut result = Ok(());
        let parking = restart && drained && !self.claims.abandoned;
        let claim = self.claims.current.take();
        if let Some(claim) = claim.as_ref().filter(|_| parking) {
            match self.park(claim).await {
                Ok(true) => {
                    tracing::info!(group = self.cfg.keys.group(), member = %self.cfg.member, slot = claim.slot, window = ?self.cfg.restart_window, "left for a restart: the claim is parked for the restart window")
                }
                Ok(false) => {
                    tracing::warn!(group = self.cfg.keys.group(), member = %self.cfg.member, slot = claim.slot, "left for a restart, but the slot was no longer this member's claim: nothing to park")
                }
                Err(e) => result = Err(e),
            }
        } else if let Some(claim) = claim {
            // A standby waiting for a slot takes this one over: its keys move once, to it. A
            // store error here (the standby marked, the park maybe not) ends in the usual leave:
            // the delete then fails harmlessly if the park was applied, and otherwise the
            // standby finds the slot gone and stands by again.
            let handed = drained
                && !self.claims.abandoned
                && !self.failing
                && {
                    match self.hand_over(&claim).await {
                        Ok(handed) => handed,
                        Err(e) => {
                            tracing::debug!(group = self.cfg.keys.group(), member = %self.cfg.member, error = %e, "could not hand the slot to a standby: leaving as usual");
                            false
                        }
                    }
                };
            if !handed {
                // Delete only our own claim (one atomic compare-and-delete, so a delayed delete
                // never removes the next holder's claim), and only once nothing is in flight:
                // with grants still out, the others must wait for the lease to expire, not for a
                // delete.
                let key = self.cfg.keys.slot(claim.slot);
                let text = claim.record.to_string();
                if drained {
                    if let Err(e) = self.store.compare_and_delete(&key, &text).await {
                        result = Err(e);
                    }
                } else if !self.cfg.crash_grace.is_zero() {
                    // The others wait for the lease of the grants cut short, not for the crash
                    // grace too: this member is not coming back. Best effort: the record
                    // expires after the grace otherwise.
                    let _ = self
                        .store
                        .compare_and_set(&key, Some(&text), &text, Some(self.cfg.ttl))
                        .await;
                }
                if result.is_ok() {
                    self.publish_without(claim.slot).await;
                }
                tracing::info!(group = self.cfg.keys.group(), member = %self.cfg.member, slot = claim.slot, "left the group");
            }
        }
        {
            let mut st = self.shared.lock();
            st.stop_granting();
            st.holder = None;
        }
        self.cfg.metrics.grants_revoked("left");
        self.cfg.metrics.members_live(0);
        if self.cfg.declared.is_some() {
            self.cfg.metrics.keys_owned(0);
        }
        self.shared.publish(|a| {
            a.slot = None;
            a.index = None;
            a.phase = GroupPhase::Stopped;
        });
        result
    }

    /// Parks `claim` for a restart: one compare-and-set from the record as held to the same claim
    /// marked parked ([`SlotRecord::parked`]), acknowledging everything it saw, with the restart
    /// window for its TTL. Called only once every grant drained: a parked claim holds nothing,
    /// so the others settle views without waiting for it, and the process that takes it back
    /// starts from nothing. No view is published: the claim stays in the view. Returns whether
    /// it parked (not when the slot no longer holds this claim).
    async fn park(&mut self, claim: &Claim) -> Result<bool> {
        let now_ms = self
            .cfg
            .clock
            .now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let record = SlotRecord {
            acked: claim.record.acked.max(self.cache.highest),
            view: 0,
            parked: Some(now_ms),
            ..claim.record.clone()
        };
        self.store
            .compare_and_set(
                &self.cfg.keys.slot(claim.slot),
                Some(&claim.record.to_string()),
                &record.to_string(),
                Some(self.cfg.restart_window),
            )
            .await
    }

    /// After deleting its claim of `slot`: publishes the view of the live slots when the
    /// published one still names `slot`, so the others move on at their next heartbeat instead
    /// of waiting for a member that watches the table. Best effort: a member that reads the
    /// table publishes it otherwise.
    async fn publish_without(&mut self, slot: u32) {
        let Ok(table) = self.list().await else {
            return;
        };
        let live = table.live();
        let highest = self.cache.highest.max(table.highest_epoch());
        // A view of another assignor is never replaced by this one's: its members publish.
        let names_slot = table.view.as_ref().is_some_and(|v| {
            v.slots().any(|s| s == slot) && v.assignor.is_none_or(|a| a == self.cfg.assignor)
        });
        if !names_slot || !view_is_stale(table.view.as_ref(), &live, 0, false) {
            return;
        }
        if let Some(next) = self.next_view(&table, highest, live) {
            let _ = self.publish(&table, &next).await;
        }
    }
}

/// Publishes `Failed` when the heartbeat task ends without having published `Stopped` or
/// `Failed` itself: it panicked, or it was aborted (every handle dropped). The assignment's
/// sender lives in the member's shared state, so its receivers would otherwise wait forever.
pub(super) struct Ended(pub(super) Arc<Shared>);

impl Drop for Ended {
    fn drop(&mut self) {
        let why = if std::thread::panicking() {
            "its heartbeat task panicked"
        } else {
            "its heartbeat task ended"
        };
        self.0.publish(|a| {
            if !matches!(a.phase, GroupPhase::Stopped | GroupPhase::Failed) {
                a.phase = GroupPhase::Failed;
                a.last_error = Some(why.to_owned());
            }
        });
    }
}

impl Engine {
    /// Stops all work at once: every grant turns invalid and the member claims again. `reason`
    /// is the metric's label (`lapsed`, `lost`), `why` the log's.
    pub(super) fn revoke(&mut self, reason: &'static str, why: &str) {
        self.tell_revoked(Cause::Lapse);
        let had = {
            let mut st = self.shared.lock();
            let had = st.active.is_some() || st.pending.is_some() || st.deadline.is_some();
            st.stop_granting();
            st.in_flight.clear();
            st.share_in_flight = 0;
            had
        };
        self.shared.wake_revoked();
        self.handoff = None;
        if had {
            self.cfg.metrics.grants_revoked(reason);
            tracing::warn!(group = self.cfg.keys.group(), member = %self.cfg.member, "{why}: stopped all work");
        }
        self.shared.publish(|a| {
            a.index = None;
            a.phase = GroupPhase::Rejoining;
        });
    }

    /// Tells [`Member::revocations`](super::super::Member::revocations) that the member loses
    /// every key it owns under its active view, for `cause`; nothing when it owns nothing.
    fn tell_revoked(&self, cause: Cause) {
        let change = {
            let st = self.shared.lock();
            match (&st.active, st.holder) {
                (Some(active), Some(holder)) if active.pair_of(holder).is_some() => {
                    Some(Change::losing_all(active.clone(), holder, cause))
                }
                _ => None,
            }
        };
        if let Some(change) = change {
            let _ = self.shared.revocations.send(change);
        }
    }
}
