//! A round's hand-off steps: acknowledging the pending view once drained (two tries of the
//! acknowledgement's compare-and-set), activating it once the others did, and writing a lost
//! acknowledgement again.

use super::super::super::records::{AckRecord, Holder};
use super::super::super::MAX_LEASE_TTL;
use super::super::decide::{drain_timed_out, settled_at_or_past};
use super::super::{Engine, WrittenAck, ACK_TTLS};
use super::{AckWrite, Call, Ready, Round, Step, Then, Wait};
use crate::error::Result;

impl Engine {
    /// Acknowledges the pending epoch once drained (asking for the acknowledgement's write),
    /// then activates it once the others have (or right away when the live slots did not
    /// change, so nothing moves to this member). Gives the lease up when the grants did not
    /// drain within the drain timeout.
    pub(super) fn progress(&mut self, round: &mut Round) -> Then {
        // An acknowledgement the store lost is written again by `reassert`.
        let (pending, drained, same_assignment) = {
            let st = self.shared.lock();
            let Some(p) = st.pending.clone() else {
                return Then::Next;
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
                    let holder = claim_holder(st.holder);
                    st.held(|h| pending.owned_by(h, holder))
                };
                tracing::warn!(group = self.cfg.layout.group(), member = %self.cfg.member, epoch, key_hashes = ?keys, share, "grants did not drain within the drain timeout: giving up the lease (the keys named by hash, and the whole share when `share` is true, were still held)");
                self.cfg.metrics.drain_cut("timeout");
                self.claims.abandoned = true;
            }
            return Then::Next;
        }
        let Some(claim) = self.claims.current.clone() else {
            return Then::Next;
        };
        if self.claims.abandoned {
            return Then::Next;
        }
        let ready = Ready {
            pending: pending.clone(),
            same_assignment,
            claim: claim.clone(),
        };
        if self.has_acked(&pending) {
            self.activate_if_ready(round, ready);
            return Then::Next;
        }
        let ack = AckRecord {
            nonce: claim.record.nonce,
            acked: epoch,
            view: pending.digest,
        };
        self.write_ack(claim.slot, ack, Some(ready))
    }

    /// Activates the pending view, acknowledged, once it is settled, every other live slot of a
    /// fresh table acknowledged it, or nothing moved.
    pub(super) fn activate_if_ready(&mut self, round: &Round, ready: Ready) {
        let Ready {
            pending,
            same_assignment,
            claim,
        } = ready;
        let epoch = pending.epoch();
        // Settled: every slot live when the settling member read the acknowledgements had
        // acknowledged (a slot claimed since holds nothing from before). Members that
        // acknowledge in their slot records (a fresh claim) are read from the table directly.
        let settled = self
            .cache
            .settled
            .is_some_and(|m| m.settles(epoch, pending.digest));
        let others_acked = round.fresh_table().is_some_and(|t| {
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

    /// Starts writing `ack` at the slot's acknowledgement key, replacing whatever is there
    /// (only this slot's holder writes it; an earlier claim's acknowledgement counts for
    /// nothing), then goes on with `then`.
    pub(super) fn write_ack(&mut self, slot: u32, ack: AckRecord, then: Option<Ready>) -> Then {
        let expected = self
            .claims
            .ack
            .as_ref()
            .filter(|a| a.record.nonce == ack.nonce)
            .map(|a| a.text.clone());
        let write = AckWrite {
            slot,
            text: ack.to_string(),
            ack,
            sent: self.cfg.clock.monotonic(),
            expected,
            tries: 0,
            then,
        };
        self.try_ack(write)
    }

    /// One try of an acknowledgement's compare-and-set.
    pub(super) fn try_ack(&self, write: AckWrite) -> Then {
        let call = Call::Cas {
            key: self.cfg.layout.ack(write.slot),
            expected: write.expected.clone(),
            new: write.text.clone(),
            ttl: Some((self.cfg.ttl * ACK_TTLS).min(MAX_LEASE_TTL)),
        };
        Then::Call(call, Box::new(Wait::Ack(write)))
    }

    /// The acknowledgement's compare-and-set answered: written, or refused (then read what the
    /// store holds and try once more against it).
    pub(super) fn ack_written(
        &mut self,
        round: &mut Round,
        write: AckWrite,
        result: Result<bool>,
    ) -> Then {
        match result {
            Ok(true) => {
                self.claims.ack = Some(WrittenAck {
                    record: write.ack,
                    text: write.text,
                    at: write.sent,
                });
                if let Some(ready) = write.then {
                    round.steps.push_front(Step::Activate(ready));
                }
                Then::Next
            }
            Ok(false) => {
                let key = self.cfg.layout.ack(write.slot);
                Then::Call(Call::Get { key }, Box::new(Wait::Ack(write)))
            }
            Err(e) => {
                self.set_error(Some(&e));
                Then::Next
            }
        }
    }

    /// What the store holds at the acknowledgement key, after a refused write: the second try
    /// expects it (an earlier claim's acknowledgement, or none when the store lost ours).
    pub(super) fn ack_read(&mut self, mut write: AckWrite, result: Result<Option<String>>) -> Then {
        match result {
            Ok(now) => {
                write.expected = now;
                write.tries += 1;
                if write.tries < 2 {
                    self.try_ack(write)
                } else {
                    Then::Next
                }
            }
            Err(e) => {
                self.set_error(Some(&e));
                Then::Next
            }
        }
    }

    /// Writes this member's acknowledgement again when the published view is one it
    /// acknowledged and has stayed unsettled for a heartbeat since the last write: the store
    /// may have lost it (a rollback, an expiry during a long hand-off, a late write of an earlier
    /// claim of the slot), and the others wait for it.
    pub(super) fn reassert(&mut self, round: &mut Round) -> Then {
        let Some(table) = round.table.clone() else {
            return Then::Next;
        };
        let (Some(view), Some(claim)) = (&table.view, self.claims.current.clone()) else {
            return Then::Next;
        };
        let digest = view.digest();
        if self.claims.abandoned || settled_at_or_past(self.cache.settled, view.epoch, digest) {
            return Then::Next;
        }
        let Some(ack) = self.claims.ack.clone() else {
            return Then::Next;
        };
        let stale = self.cfg.clock.monotonic().saturating_sub(ack.at) >= self.cfg.heartbeat;
        if ack.record.nonce == claim.record.nonce
            && ack.record.has_acked_digest(view.epoch, digest)
            && stale
        {
            return self.write_ack(claim.slot, ack.record, None);
        }
        Then::Next
    }
}

/// The member's holder, or one that owns nothing.
fn claim_holder(holder: Option<Holder>) -> Holder {
    holder.unwrap_or(Holder {
        slot: u32::MAX,
        nonce: 0,
    })
}
