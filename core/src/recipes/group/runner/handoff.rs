//! The hand-off: acknowledging the pending view once drained, settling it once every live slot
//! acknowledged, writing a lost acknowledgement again, and re-applying a lease TTL to a slot
//! that stalls the hand-off.

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::records::{parse_acks, AckRecord, SettledRecord, SlotRecord};
use super::super::table::Table;
use super::super::view::ViewState;
use super::super::{MAX_LEASE_TTL, MIN_LEASE_TTL};
use super::decide::{drain_timed_out, settled_at_or_past};
use super::{Nudge, Runner, Stall, WrittenAck, ACK_TTLS, NUDGES_PER_BEAT};

impl Runner {
    /// Acknowledges the pending epoch once drained, and activates it once the others have (or
    /// right away when the live slots did not change, so nothing moves to this member). With no
    /// table (woken by a dropped grant) it only acknowledges.
    pub(super) async fn progress(&mut self, table: Option<&Table>) {
        // An acknowledgement the store lost is written again by `reassert`.
        let (pending, drained, same_assignment) = {
            let st = self.shared.lock();
            let Some(p) = st.pending.clone() else {
                return;
            };
            // Nothing moves to or from this member when the holders and owners stayed the same,
            // unless a view in between moved something away and back (then another member may
            // have started it: wait for everyone's acknowledgement).
            let same = match (&st.active, st.holder) {
                (Some(a), Some(h)) => {
                    st.skipped.is_empty() && a.same_assignment(&p) && p.pair_of(h).is_some()
                }
                // A claim taken back from a restart is no exception although nothing moves to
                // it: the view it published waits for the others' acknowledgements like any
                // other. A store that lost a first take-back (and its view) lets a second
                // process of the id publish that same epoch again for the same slots; a member
                // that saw the first refuses to acknowledge the second, so the two processes
                // never grant one key under one token.
                _ => false,
            };
            (p, st.drained(), same)
        };
        let epoch = pending.epoch();
        if !drained {
            let now = self.cfg.clock.monotonic();
            let since = self.handoff.map_or(now, |h| h.since);
            if drain_timed_out(since, now, self.cfg.drain_timeout) && !self.claims.abandoned {
                // Say which grants held it up: the application knows its keys by hash too
                // (`assign::hash_bytes`); the whole share is named as such.
                let (keys, share) = {
                    let st = self.shared.lock();
                    let holder = claim_holder(&st);
                    st.held(|h| pending.owned_by(h, holder))
                };
                tracing::warn!(group = self.cfg.keys.group(), member = %self.cfg.member, epoch, key_hashes = ?keys, share, "grants did not drain within the drain timeout: giving up the lease (the keys named by hash, and the whole share when `share` is true, were still held)");
                self.cfg.metrics.drain_cut("timeout");
                self.claims.abandoned = true;
            }
            return;
        }
        let Some(claim) = self.claims.current.clone() else {
            return;
        };
        if self.claims.abandoned {
            return;
        }
        if !self.has_acked(&pending) && !self.acknowledge(&pending).await {
            return;
        }
        // Settled: every slot live when the settling member read the acknowledgements had
        // acknowledged (a slot claimed since holds nothing from before). Members that
        // acknowledge in their slot records (a fresh claim) are read from the table directly.
        let settled = self
            .cache
            .settled
            .is_some_and(|m| m.settles(epoch, pending.digest));
        let others_acked = table.is_some_and(|t| {
            t.slots
                .iter()
                .all(|(&s, r)| s == claim.slot || pending.acked_by(r))
        });
        // A claim taken back from a restart activates no view its previous incarnation may have
        // granted under (a view naming its new nonce is always above them).
        if epoch <= self.claims.floor {
            return;
        }
        if same_assignment || settled || others_acked {
            self.activate(pending, claim.holder());
        }
    }

    /// Settles the published view when this member's slot is the lowest live one, or it
    /// published the view (or, as a fallback for a lowest slot that does not, when its own
    /// hand-off is overdue: see `Facts::settle_overdue`): reads the acknowledgements and, once
    /// every live slot acknowledged the view, writes the settled mark the others poll. Returns
    /// whether it wrote it.
    pub(super) async fn settle(&mut self, table: &Table) -> bool {
        self.settler.settling = false;
        let Some(own) = self.claims.current.as_ref().map(|c| c.slot) else {
            return false;
        };
        if self.claims.abandoned {
            return false;
        }
        let Some(view) = &table.view else {
            return false;
        };
        let Some(target) = self.target().filter(|t| t.epoch() == view.epoch) else {
            return false;
        };
        let (epoch, digest) = (target.epoch(), target.digest);
        if settled_at_or_past(self.cache.settled, epoch, digest) {
            self.settler.stalled = None;
            return false;
        }
        // The same epoch for other holders or owners: a store that lost writes minted it twice,
        // and `on_table` replaces it.
        if !target.record().same_assignment(view) || !self.has_acked(&target) {
            return false;
        }
        let lowest = table.working().next() == Some(own);
        let publisher = self.settler.published == Some(epoch);
        self.settler.settling = lowest || publisher;
        let overdue = self.facts().settle_overdue();
        if !lowest && !publisher && !overdue {
            return false;
        }
        let now = self.cfg.clock.monotonic();
        self.settler.acks_read = Some(now);
        let acks = match self.store.list(&self.cfg.keys.acks).await {
            Ok(listing) => parse_acks(&self.cfg.keys.acks, listing),
            Err(e) => {
                self.set_error(Some(&e));
                return false;
            }
        };
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
                self.expire_stalled(table, &acks, &target, own).await;
            }
            return false;
        }
        let mark = SettledRecord {
            epoch,
            view: digest,
        };
        match self
            .store
            .compare_and_set(
                &self.cfg.keys.settled,
                table.settled_text.as_deref(),
                &mark.to_string(),
                None,
            )
            .await
        {
            Ok(true) => {
                tracing::debug!(group = self.cfg.keys.group(), member = %self.cfg.member, epoch, "every live slot acknowledged the view: settled it");
                // Read the table at the next beat even if its version is the one held: a
                // store that rolls back to exactly that table must not leave this member
                // believing its write stuck.
                self.forget_seen();
                self.cache.settled = Some(mark);
                self.settler.settling = false;
                self.settler.stalled = None;
                true
            }
            // Changed since the listing: read the view directory again at the next beat,
            // whatever version the store answers (as after a lost view write).
            Ok(false) => {
                self.forget_seen();
                false
            }
            Err(e) => {
                self.forget_seen();
                self.set_error(Some(&e));
                false
            }
        }
    }

    /// Writes this member's acknowledgement again when the published view is one it
    /// acknowledged and has stayed unsettled for a heartbeat since the last write: the store
    /// may have lost it (a rollback, an expiry during a long hand-off, a late write of an earlier
    /// claim of the slot), and the others wait for it.
    pub(super) async fn reassert(&mut self, table: &Table) {
        let (Some(view), Some(claim)) = (&table.view, self.claims.current.clone()) else {
            return;
        };
        let digest = view.digest();
        if self.claims.abandoned || settled_at_or_past(self.cache.settled, view.epoch, digest) {
            return;
        }
        let Some(ack) = self.claims.ack.clone() else {
            return;
        };
        let stale = self.cfg.clock.monotonic().saturating_sub(ack.at) >= self.cfg.heartbeat;
        if ack.record.nonce == claim.record.nonce
            && ack.record.has_acked_digest(view.epoch, digest)
            && stale
        {
            self.write_ack(claim.slot, ack.record).await;
        }
    }

    /// A hand-off stalled for three TTLs on a slot that has not acknowledged: re-applies that
    /// slot's own lease TTL to it, once per claim and epoch, with a compare-and-set that keeps
    /// its exact stored text. A live holder renews within a third of its TTL anyway, so this
    /// changes nothing for it; a record that has no expiry (restored by a tool that drops TTLs,
    /// written by hand) expires after that TTL, and the group proceeds without it instead of
    /// waiting forever. Only a settling member (the lowest live slot, the view's publisher)
    /// does it, at most [`NUDGES_PER_BEAT`] slots per beat, so a large group in churn does not
    /// write O(n²).
    async fn expire_stalled(
        &mut self,
        table: &Table,
        acks: &BTreeMap<u32, AckRecord>,
        pending: &ViewState,
        own: u32,
    ) {
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
            return;
        }
        let stalled: Vec<(u32, SlotRecord)> = table
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
        for (s, r) in stalled {
            let nudge = Nudge {
                slot: s,
                nonce: r.nonce,
                epoch,
            };
            let key = self.cfg.keys.slot(s);
            let text = match self.stored_text(&key, &r).await {
                Ok(Some(text)) => text,
                Ok(None) => {
                    // Changed or gone since the listing: nothing to do for this claim.
                    self.settler.nudged.push(nudge);
                    continue;
                }
                Err(e) => {
                    self.set_error(Some(&e));
                    return;
                }
            };
            // The lease TTL alone, not the crash grace: a crashed member that stalls a
            // hand-off for three TTLs stops waiting on the grace.
            let ttl = Duration::from_millis(r.ttl_ms).clamp(MIN_LEASE_TTL, MAX_LEASE_TTL);
            match self
                .store
                .compare_and_set(&key, Some(&text), &text, Some(ttl))
                .await
            {
                Ok(applied) => {
                    self.settler.nudged.push(nudge);
                    if applied {
                        tracing::warn!(group = self.cfg.keys.group(), member = %self.cfg.member, slot = s, epoch, "slot has not acknowledged for three TTLs: re-applied its lease TTL, so a record without expiry does not stall the group");
                    }
                }
                // Not recorded: tried again at the next beat.
                Err(e) => {
                    self.set_error(Some(&e));
                    return;
                }
            }
        }
        // Bounded: only the claims of the current table, for the newest epochs.
        if self.settler.nudged.len() > 4 * table.slots.len() + 16 {
            self.settler.nudged.retain(|n| n.epoch == epoch);
        }
    }

    /// Writes the acknowledgement of `view` (`hc:{group}:ack:{slot}`). Returns whether it did.
    async fn acknowledge(&mut self, view: &ViewState) -> bool {
        let Some(claim) = self.claims.current.clone() else {
            return false;
        };
        let ack = AckRecord {
            nonce: claim.record.nonce,
            acked: view.epoch(),
            view: view.digest,
        };
        self.write_ack(claim.slot, ack).await
    }

    /// Stores `ack` at the slot's acknowledgement key, replacing whatever is there (only this
    /// slot's holder writes it; an earlier claim's acknowledgement counts for nothing). Returns
    /// whether it did.
    async fn write_ack(&mut self, slot: u32, ack: AckRecord) -> bool {
        let key = self.cfg.keys.ack(slot);
        let text = ack.to_string();
        let ttl = (self.cfg.ttl * ACK_TTLS).min(MAX_LEASE_TTL);
        let sent = self.cfg.clock.monotonic();
        let mut expected = self
            .claims
            .ack
            .as_ref()
            .filter(|a| a.record.nonce == ack.nonce)
            .map(|a| a.text.clone());
        // Two tries: what this member last wrote, then what the store holds (an earlier claim's
        // acknowledgement, or none when the store lost ours).
        for _ in 0..2 {
            match self
                .store
                .compare_and_set(&key, expected.as_deref(), &text, Some(ttl))
                .await
            {
                Ok(true) => {
                    self.claims.ack = Some(WrittenAck {
                        record: ack,
                        text,
                        at: sent,
                    });
                    return true;
                }
                Ok(false) => match self.store.get(&key).await {
                    Ok(now) => expected = now,
                    Err(e) => {
                        self.set_error(Some(&e));
                        return false;
                    }
                },
                Err(e) => {
                    self.set_error(Some(&e));
                    return false;
                }
            }
        }
        false
    }
}

/// The member's holder in `st`, or one that owns nothing.
fn claim_holder(st: &super::super::grants::State) -> super::super::records::Holder {
    st.holder.unwrap_or(super::super::records::Holder {
        slot: u32::MAX,
        nonce: 0,
    })
}
