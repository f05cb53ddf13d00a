//! Ending work: revoking every grant when the lease is lost, failing for good, and leaving the
//! group gracefully (drain, then hand the slot to a standby, or park it for a restart, or delete
//! the claim and publish the view without it).

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::super::grants::Shared;
use super::super::records::{SlotRecord, ViewRecord};
use super::super::table::SlotTable;
use super::super::view::{Cause, Change, GroupPhase};
use super::decide::view_is_stale;
use super::{Claim, Engine, Phase, Runner};
use crate::error::{Error, Result};

impl Runner {
    /// Ends with an error: leaves the slot to others and reports.
    pub(super) async fn fail(&mut self, e: &Error) {
        tracing::error!(group = self.cfg.layout.group(), member = %self.cfg.member, "{e}");
        // A member that fails (a twin yielding) hands nothing to a standby.
        self.failing = true;
        let _ = self.leave().await;
        let msg = e.to_string();
        let phase = self.enter(Phase::Failed);
        self.shared.publish(|a| {
            a.phase = phase;
            a.last_error = Some(msg);
        });
    }

    /// Waits until no grant is in flight, at most the drain timeout, renewing the lease every
    /// heartbeat meanwhile: the others wait for the drain (the leaving member stays in the view
    /// and its slot stays live), however long it takes within the timeout. Returns whether
    /// every grant was dropped; a claim given up for a hand-off's drain timeout is not renewed.
    /// The engine decides each step ([`Engine::drain_step`]).
    async fn drain(&mut self) -> bool {
        let mut drain = self.drain_begins();
        loop {
            let wake = match self.drain_step(&mut drain) {
                DrainStep::Drained => return true,
                DrainStep::Cut(reason) => {
                    self.drain_cut(&drain, reason, None);
                    return false;
                }
                DrainStep::Wait(wake) => wake,
                DrainStep::Renew { now, deadline } => {
                    // What was held before the renewal, for the log line of a cut: a lapse
                    // while it is in flight revokes every grant (and forgets them) before the
                    // cut is seen.
                    let held = self.shared.lock().held(|_| false);
                    let result = self.renew_while_leaving().await;
                    if let Some(reason) = self.drain_renewed(&mut drain, now, result) {
                        self.drain_cut(&drain, reason, Some(held));
                        return false;
                    }
                    self.drain_wake(&drain, deadline)
                }
            };
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
        let key = self.cfg.layout.slot(claim.slot);
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

    /// Stops granting, drains, then ends the claim as [`Engine::exit`] says: parks it for a
    /// restart ([`Runner::park`]), hands it to a standby, or deletes it and publishes the view
    /// without it.
    pub(super) async fn leave(&mut self) -> Result<()> {
        let restart = self.leave_begins();
        let drained = self.drain().await;
        let mut result = Ok(());
        match self.exit(restart, drained) {
            Exit::Nothing => {}
            Exit::Park(claim) => match self.park(&claim).await {
                Ok(true) => {
                    tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, slot = claim.slot, window = ?self.cfg.restart_window, "left for a restart: the claim is parked for the restart window")
                }
                Ok(false) => {
                    tracing::warn!(group = self.cfg.layout.group(), member = %self.cfg.member, slot = claim.slot, "left for a restart, but the slot was no longer this member's claim: nothing to park")
                }
                Err(e) => result = Err(e),
            },
            Exit::Leave {
                claim,
                hand_over,
                drained,
            } => {
                // A standby waiting for a slot takes this one over: its keys move once, to it.
                // A store error here (the standby marked, the park maybe not) ends in the usual
                // leave: the delete then fails harmlessly if the park was applied, and
                // otherwise the standby finds the slot gone and stands by again.
                let handed = hand_over
                    && {
                        match self.hand_over(&claim).await {
                            Ok(handed) => handed,
                            Err(e) => {
                                tracing::debug!(group = self.cfg.layout.group(), member = %self.cfg.member, error = %e, "could not hand the slot to a standby: leaving as usual");
                                false
                            }
                        }
                    };
                if !handed {
                    // Delete only our own claim (one atomic compare-and-delete, so a delayed
                    // delete never removes the next holder's claim), and only once nothing is
                    // in flight: with grants still out, the others must wait for the lease to
                    // expire, not for a delete.
                    let key = self.cfg.layout.slot(claim.slot);
                    let text = claim.record.to_string();
                    if drained {
                        if let Err(e) = self.store.compare_and_delete(&key, &text).await {
                            result = Err(e);
                        }
                    } else if !self.cfg.crash_grace.is_zero() {
                        // The others wait for the lease of the grants cut short, not for the
                        // crash grace too: this member is not coming back. Best effort: the
                        // record expires after the grace otherwise.
                        let _ = self
                            .store
                            .compare_and_set(&key, Some(&text), &text, Some(self.cfg.ttl))
                            .await;
                    }
                    if result.is_ok() {
                        self.publish_without(claim.slot).await;
                    }
                    tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, slot = claim.slot, "left the group");
                }
            }
        }
        self.left();
        result
    }

    /// Parks `claim` for a restart: one compare-and-set from the record as held to the same claim
    /// marked parked ([`SlotRecord::parked`]), acknowledging everything it saw, with the restart
    /// window for its TTL. Called only once every grant drained: a parked claim holds nothing,
    /// so the others settle views without waiting for it, and the process that takes it back
    /// starts from nothing. No view is published: the claim stays in the view. Returns whether
    /// it parked (not when the slot no longer holds this claim).
    async fn park(&mut self, claim: &Claim) -> Result<bool> {
        let record = self.parked(claim);
        self.store
            .compare_and_set(
                &self.cfg.layout.slot(claim.slot),
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
        if let Some(next) = self.view_without(&table, slot) {
            let _ = self.publish(&table, &next).await;
        }
    }
}

/// Publishes `Failed` when the heartbeat task ends without having published `Stopped` or
/// `Failed` itself: it panicked, or it was aborted (every handle dropped). The assignment's
/// sender lives in the member's shared state, so its receivers would otherwise wait forever.
pub(super) struct EndGuard(pub(super) Arc<Shared>);

impl Drop for EndGuard {
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
            tracing::warn!(group = self.cfg.layout.group(), member = %self.cfg.member, "{why}: stopped all work");
        }
        let phase = self.enter(Phase::Rejoining);
        self.shared.publish(|a| {
            a.index = None;
            a.phase = phase;
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

/// A drain in progress ([`Runner::drain`]): since when, until when, and the next renewal.
pub(super) struct Drain {
    start: Duration,
    give_up: Duration,
    renew_at: Duration,
}

/// The next step of a drain ([`Engine::drain_step`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum DrainStep {
    /// Every grant was dropped.
    Drained,
    /// The drain is cut short, for this reason (`timeout`, `lapsed`): leave with grants out.
    Cut(&'static str),
    /// Renew the claim now (at `now`, with the lease deadline `deadline` before it).
    Renew {
        now: Duration,
        deadline: Option<Duration>,
    },
    /// Wait for a grant to be dropped, or until then.
    Wait(Duration),
}

/// How a leaving member ends its claim ([`Engine::exit`]).
pub(super) enum Exit {
    /// It holds no claim.
    Nothing,
    /// Park it for a restart.
    Park(Claim),
    /// Leave: hand the slot to a standby when `hand_over`, else delete the claim (only when
    /// `drained`) and publish the view without it.
    Leave {
        claim: Claim,
        hand_over: bool,
        drained: bool,
    },
}

impl Engine {
    /// A leave starts: the application is told it loses its keys, no grant is given from now
    /// on. Returns whether it leaves for a restart ([`Member::leave_for_restart`]).
    ///
    /// [`Member::leave_for_restart`]: super::super::Member::leave_for_restart
    pub(super) fn leave_begins(&mut self) -> bool {
        self.tell_revoked(Cause::Leave);
        let restart = {
            let mut st = self.shared.lock();
            st.leaving = true;
            st.restart
        };
        self.shared.wake_revoked();
        restart
    }

    /// A drain starting now: it gives up after the drain timeout and renews the lease a
    /// heartbeat after the last renewal.
    pub(super) fn drain_begins(&self) -> Drain {
        let start = self.cfg.clock.monotonic();
        Drain {
            start,
            give_up: start + self.cfg.drain_timeout,
            renew_at: self
                .cache
                .last_beat
                .map_or(start, |b| b + self.cfg.heartbeat)
                .max(start),
        }
    }

    /// What a drain does now: done when nothing is in flight; cut when the drain timeout
    /// passed or the lease ran out; renew when due (never for a claim given up); else wait for
    /// a dropped grant, the timeout, the deadline or the renewal, whichever comes first.
    pub(super) fn drain_step(&mut self, drain: &mut Drain) -> DrainStep {
        if !self.shared.lock().busy() {
            return DrainStep::Drained;
        }
        let now = self.cfg.clock.monotonic();
        let deadline = self.shared.lock().deadline;
        let renews = !self.claims.abandoned;
        if now >= drain.give_up {
            return DrainStep::Cut("timeout");
        }
        if deadline.is_none_or(|d| now >= d) {
            return DrainStep::Cut("lapsed");
        }
        if renews && now >= drain.renew_at {
            drain.renew_at = now + self.cfg.heartbeat;
            return DrainStep::Renew { now, deadline };
        }
        DrainStep::Wait(self.drain_wake(drain, deadline))
    }

    /// A drain's renewal at `now` answered: the reason to cut the drain, if any (`lapsed`: the
    /// deadline passed while it was in flight, which revoked every grant; `lost`: the slot is
    /// no longer this member's). A store error is tried again at a quarter heartbeat: the lease
    /// has until its deadline.
    pub(super) fn drain_renewed(
        &mut self,
        drain: &mut Drain,
        now: Duration,
        result: Result<bool>,
    ) -> Option<&'static str> {
        if self.shared.lock().deadline.is_none() {
            return Some("lapsed");
        }
        match result {
            Ok(true) => None,
            Ok(false) => Some("lost"),
            Err(e) => {
                self.set_error(Some(&e));
                drain.renew_at = now + self.cfg.heartbeat / 4;
                None
            }
        }
    }

    /// When a drain waits until: the timeout, the lease deadline (as read before a renewal) or
    /// the next renewal, whichever comes first. A given-up claim is not renewed.
    fn drain_wake(&self, drain: &Drain, deadline: Option<Duration>) -> Duration {
        let mut wake = drain.give_up.min(deadline.unwrap_or(drain.give_up));
        if !self.claims.abandoned {
            wake = wake.min(drain.renew_at);
        }
        wake
    }

    /// A drain cut short for `reason`: logged with the keys it cut (those `held` before a
    /// renewal, else those held now) and counted.
    fn drain_cut(&self, drain: &Drain, reason: &'static str, held: Option<(Vec<String>, bool)>) {
        let now = self.cfg.clock.monotonic();
        let (keys, share) = held.unwrap_or_else(|| self.shared.lock().held(|_| false));
        let why = match reason {
            "timeout" => "the drain timeout passed",
            "lost" => "the slot was no longer this member's",
            _ => "the store did not answer the renewals before the lease ran out",
        };
        tracing::warn!(group = self.cfg.layout.group(), member = %self.cfg.member, reason, key_hashes = ?keys, share, waited = ?now.saturating_sub(drain.start), "leaving with grants still in flight ({why}): the others take the keys named by hash (and the whole share when `share` is true) once the lease has expired, and a fence refuses the cut work's later writes");
        self.cfg.metrics.drain_cut(reason);
    }

    /// How a leave ends the claim, once the drain is over: parked for a restart when it drained
    /// and was not given up; handed to a standby when it drained, was not given up and the
    /// member does not fail; otherwise deleted (the claim is taken out of the engine).
    pub(super) fn exit(&mut self, restart: bool, drained: bool) -> Exit {
        let Some(claim) = self.claims.current.take() else {
            return Exit::Nothing;
        };
        let clean = drained && !self.claims.abandoned;
        if restart && clean {
            return Exit::Park(claim);
        }
        Exit::Leave {
            claim,
            hand_over: clean && !self.failing,
            drained,
        }
    }

    /// The claim as parked for a restart ([`SlotRecord::parked`]): acknowledging everything it
    /// saw, marked with the time it parked.
    pub(super) fn parked(&self, claim: &Claim) -> SlotRecord {
        let now_ms = self
            .cfg
            .clock
            .now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        SlotRecord {
            acked: claim.record.acked.max(self.cache.highest),
            view: 0,
            parked: Some(now_ms),
            ..claim.record.clone()
        }
    }

    /// The view to publish after deleting the claim of `slot`, read from `table`: the view of
    /// the live slots when the published one still names `slot` (so the others move on at
    /// their next heartbeat); none when it does not, or was published with another assignor
    /// (its members publish).
    pub(super) fn view_without(&self, table: &SlotTable, slot: u32) -> Option<ViewRecord> {
        let live = table.live();
        let highest = self.cache.highest.max(table.highest_epoch());
        let names_slot = table.view.as_ref().is_some_and(|v| {
            v.slots().any(|s| s == slot) && v.assignor.is_none_or(|a| a == self.cfg.assignor)
        });
        if !names_slot || !view_is_stale(table.view.as_ref(), &live, 0, false) {
            return None;
        }
        self.view_after(table, highest, live)
    }

    /// The leave is over: no grant, no slot, phase `stopped`.
    pub(super) fn left(&mut self) {
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
        let phase = self.enter(Phase::Stopped);
        self.shared.publish(|a| {
            a.slot = None;
            a.index = None;
            a.phase = phase;
        });
    }
}

#[cfg(test)]
mod tests;
