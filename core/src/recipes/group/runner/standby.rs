//! Standing by and handing over: a member that joined with
//! [`GroupConfig::with_standby`](super::super::GroupConfig::with_standby) waits outside the view
//! for a leaving member to hand it its slot, and a member that leaves gracefully hands its slot
//! to the oldest standby.
//!
//! The hand-over is a take-back ([`Runner::resume`]) under another member id: the leaving member,
//! drained, first marks the standby's record as its heir (one compare-and-set, so two leaving
//! members never pick one standby), then parks its claim under the standby's member id; the
//! standby sees the mark at its next poll, finds the slot parked for it and takes it back as a
//! returning member does. The slots stay the same, so only the leaving member's keys move, once,
//! in one view change.

use tokio::sync::watch;

use super::super::records::{SlotRecord, StandbyRecord};
use super::super::view::GroupPhase;
use super::{Claim, Runner};
use crate::error::{Error, Result};

/// How many standbys a leaving member tries to mark before it leaves as usual.
const HEIR_ATTEMPTS: usize = 3;

impl Runner {
    /// Writes this member's standby record and reports the phase `standby`. Errors as the
    /// store's.
    pub(in crate::recipes::group) async fn begin_standby(&mut self) -> Result<StandbyRecord> {
        let record = StandbyRecord {
            nonce: rand::random(),
            since_ms: self.now_ms(),
            heir_of: None,
        };
        let key = self.cfg.keys.standby(&self.cfg.member);
        // A record of this id an earlier process left (it expires within a TTL) is replaced.
        let old = self.cfg.store.get(&key).await?;
        let text = record.to_string();
        let written = self
            .cfg
            .store
            .compare_and_set(&key, old.as_deref(), &text, Some(self.cfg.ttl))
            .await?;
        if !written {
            return Err(Error::contended(
                &key,
                "another process wrote a standby record with this member id at the same time",
            ));
        }
        self.shared.publish(|a| a.phase = GroupPhase::Standby);
        tracing::info!(group = self.cfg.keys.group(), member = %self.cfg.member, wait = ?self.cfg.standby, "standing by for a leaving member's slot");
        Ok(record)
    }

    /// The whole life of a member that joined as a standby: stands by, then claims (the slot
    /// handed to it, or a free one once the wait ended) and heartbeats like any member until
    /// `stop` changes.
    pub(in crate::recipes::group) async fn run_standby(
        mut self,
        record: StandbyRecord,
        mut stop: watch::Receiver<bool>,
    ) -> Result<()> {
        let _ended = super::leaving::Ended(self.shared.clone());
        if !self.stand_by(record, &mut stop).await {
            self.shared.publish(|a| a.phase = GroupPhase::Stopped);
            return Ok(());
        }
        if let Err(e) = self.first_claim().await {
            self.fail(&e).await;
            return Err(e);
        }
        self.run(stop).await
    }

    /// Stands by until a leaving member hands this one its slot or the wait ends (true: claim
    /// now), or until `stop` changes (false, with the standby record deleted).
    async fn stand_by(
        &mut self,
        mut record: StandbyRecord,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let key = self.cfg.keys.standby(&self.cfg.member);
        let until = self.cfg.clock.monotonic() + self.cfg.standby.unwrap_or_default();
        let poll = self.cfg.heartbeat / 4;
        loop {
            if *stop.borrow() {
                let _ = self
                    .cfg
                    .store
                    .compare_and_delete(&key, &record.to_string())
                    .await;
                tracing::info!(group = self.cfg.keys.group(), member = %self.cfg.member, "stopped while standing by");
                return false;
            }
            let text = record.to_string();
            // Renewing with the exact text, or deleting it once the wait is over, fails only
            // when a leaving member marked the record (or it expired, or another process of
            // this id replaced it): exclusive with a leaving member's choice of this standby.
            let done = self.cfg.clock.monotonic() >= until;
            let unchanged = if done {
                self.cfg.store.compare_and_delete(&key, &text).await
            } else {
                self.cfg
                    .store
                    .compare_and_set(&key, Some(&text), &text, Some(self.cfg.ttl))
                    .await
            };
            match unchanged {
                Ok(true) if done => {
                    tracing::info!(group = self.cfg.keys.group(), member = %self.cfg.member, "no member left while standing by: joining as a new member");
                    return true;
                }
                Ok(true) => {}
                Ok(false) => match self.cfg.store.get(&key).await {
                    Ok(Some(now)) => match StandbyRecord::parse(&now) {
                        Some(r) if r.nonce == record.nonce => {
                            if let Some(slot) = r.heir_of {
                                if self.inherit(slot).await {
                                    let _ = self.cfg.store.compare_and_delete(&key, &now).await;
                                    return true;
                                }
                            }
                            // Not handed over after all: stand by again, unmarked.
                            record.heir_of = None;
                            if let Err(e) = self
                                .cfg
                                .store
                                .compare_and_set(
                                    &key,
                                    Some(&now),
                                    &record.to_string(),
                                    Some(self.cfg.ttl),
                                )
                                .await
                            {
                                self.set_error(Some(&e));
                            }
                        }
                        // Another process stands by with this member id, or the key holds
                        // something else: join now, where the usual rule for two processes of
                        // one id applies.
                        _ => {
                            tracing::warn!(group = self.cfg.keys.group(), member = %self.cfg.member, "the standby record was replaced by another process's: joining now");
                            return true;
                        }
                    },
                    // Expired (the process was paused past its TTL): write it again.
                    Ok(None) => {
                        if let Err(e) = self
                            .cfg
                            .store
                            .compare_and_set(&key, None, &text, Some(self.cfg.ttl))
                            .await
                        {
                            self.set_error(Some(&e));
                        }
                    }
                    Err(e) => self.set_error(Some(&e)),
                },
                Err(e) => self.set_error(Some(&e)),
            }
            tokio::select! {
                biased;
                _ = stop.changed() => {}
                _ = self.cfg.clock.sleep(poll) => {}
            }
        }
    }

    /// Chosen as the heir of `slot`: waits (up to one lease TTL, the time its leaving member
    /// has to park it) until the slot is parked under this member id, so that the claim that
    /// follows takes it back. Returns false when it is not (the leaving member lost its claim,
    /// or gave up): the member stands by again.
    async fn inherit(&mut self, slot: u32) -> bool {
        let key = self.cfg.keys.slot(slot);
        let give_up = self.cfg.clock.monotonic() + self.cfg.ttl;
        loop {
            match self.cfg.store.get(&key).await {
                Ok(Some(text)) => match SlotRecord::parse(&text) {
                    Some(r) if r.is_parked() && r.member == self.cfg.member => {
                        tracing::info!(group = self.cfg.keys.group(), member = %self.cfg.member, slot, "a leaving member handed its slot to this standby");
                        return true;
                    }
                    // Still its leaving member's live claim: it parks it next.
                    Some(r) if !r.is_parked() => {}
                    _ => return false,
                },
                Ok(None) => return false,
                Err(e) => self.set_error(Some(&e)),
            }
            if self.cfg.clock.monotonic() >= give_up {
                return false;
            }
            self.cfg.clock.sleep(self.cfg.heartbeat / 8).await;
        }
    }

    /// Hands `claim` (drained: it holds nothing) to the oldest standby, if there is one: marks
    /// the standby's record as its heir, then parks the claim under the standby's member id for
    /// one lease TTL. No view is published: the claim stays in the view until the standby takes
    /// it back. Returns whether it handed the slot over; otherwise the member leaves as usual.
    pub(super) async fn hand_over(&mut self, claim: &Claim) -> Result<bool> {
        let listing = self.cfg.store.list(&self.cfg.keys.standbys).await?;
        let mut standbys: Vec<(String, String, StandbyRecord)> = listing
            .into_iter()
            .filter_map(|(key, text)| {
                let member = key.strip_prefix(&self.cfg.keys.standbys)?.to_owned();
                let record = StandbyRecord::parse(&text)?;
                let fits = record.heir_of.is_none()
                    && member != self.cfg.member
                    && crate::recipes::interval::check_member(&member).is_ok();
                fits.then_some((member, text, record))
            })
            .collect();
        standbys.sort_by(|a, b| (a.2.since_ms, &a.0).cmp(&(b.2.since_ms, &b.0)));
        let slot_key = self.cfg.keys.slot(claim.slot);
        let held = claim.record.to_string();
        for (member, text, record) in standbys.into_iter().take(HEIR_ATTEMPTS) {
            let standby_key = self.cfg.keys.standby(&member);
            let marked = StandbyRecord {
                heir_of: Some(claim.slot),
                ..record
            }
            .to_string();
            if !self
                .cfg
                .store
                .compare_and_set(&standby_key, Some(&text), &marked, Some(self.cfg.ttl))
                .await?
            {
                continue;
            }
            let parked = SlotRecord {
                member: member.clone(),
                acked: claim.record.acked.max(self.cache.highest),
                view: 0,
                parked: Some(self.now_ms()),
                ..claim.record.clone()
            };
            if self
                .cfg
                .store
                .compare_and_set(
                    &slot_key,
                    Some(&held),
                    &parked.to_string(),
                    Some(self.cfg.ttl),
                )
                .await?
            {
                tracing::info!(group = self.cfg.keys.group(), member = %self.cfg.member, slot = claim.slot, heir = %member, "left the group, handing the slot to a standby");
                return Ok(true);
            }
            // This member's claim is gone (its lease ran out): unmark the standby, which then
            // stands by again, and leave as usual.
            let _ = self
                .cfg
                .store
                .compare_and_set(&standby_key, Some(&marked), &text, Some(self.cfg.ttl))
                .await;
            return Ok(false);
        }
        Ok(false)
    }
}
