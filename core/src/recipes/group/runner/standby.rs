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

use std::time::Duration;

use tokio::sync::watch;

use super::super::records::{SlotRecord, StandbyRecord};
use super::decide::Seen;
use super::notices::Waited;
use super::{Claim, Engine, Phase, Runner};
use crate::error::{Error, Result};

/// How many standbys a leaving member tries to mark before it leaves as usual.
const HEIR_ATTEMPTS: usize = 3;

/// How many times a standby that inherited a slot retries a claim that failed with a transient
/// error (the store briefly unreachable) before it gives up.
const CLAIM_RETRIES: u32 = 5;

/// What a slot holds for the heir a leaving member chose ([`Runner::handing`]).
enum Handing {
    /// The leaving member's claim, parked under the heir's member id: its text.
    Parked(String),
    /// The leaving member's claim, still live: it parks it next.
    Pending,
    /// Anything else: the slot is not being handed to the heir.
    Not,
}

/// How an heir's wait for its slot ended.
enum Inherited {
    /// The slot is parked under this member id: the claim that follows takes it back.
    Taken,
    /// The leaving member did not park it (its claim is gone, or another holds the slot).
    NotHanded,
    /// Told to stop meanwhile.
    Stopped,
}

impl Runner {
    /// Writes this member's standby record and reports the phase `standby`; or, when a previous
    /// process of this member id was chosen as an heir and its record still says so, goes on
    /// with that inheritance. Errors as the store's.
    pub(in crate::recipes::group) async fn begin_standby(&mut self) -> Result<StandbyRecord> {
        // A standby that could never take over (another assignor or key set than the group's)
        // is refused now, before a deploy tool reads it as ready and stops a member for it.
        let table = self.list().await?;
        self.check_assignor(&table)?;
        let key = self.cfg.layout.standby(&self.cfg.member);
        let old = self.store.get(&key).await?;
        let record = match self.standby_record(old.as_deref()) {
            Standing::Inheriting(record) => record,
            Standing::New(record) => {
                let text = record.to_string();
                match self
                    .store
                    .compare_and_set(&key, old.as_deref(), &text, Some(self.standby_ttl()))
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => {
                        return Err(Error::contended(
                            &key,
                            "another process wrote a standby record with this member id at the same time",
                        ))
                    }
                    Err(e) => {
                        // Applied with its reply lost, the record would be the oldest standby
                        // of a process that never polls it: take it away again.
                        let _ = self.store.compare_and_delete(&key, &text).await;
                        return Err(e);
                    }
                }
                record
            }
        };
        let phase = self.enter(Phase::StandingBy);
        self.shared.publish(|a| a.phase = phase);
        tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, wait = ?self.cfg.standby, "standing by for a leaving member's slot");
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
        let _ended = super::leaving::EndGuard(self.shared.clone());
        if !self.stand_by(record, &mut stop).await {
            let phase = self.enter(Phase::Stopped);
            self.shared.publish(|a| a.phase = phase);
            return Ok(());
        }
        if let Some(n) = &mut self.notices {
            n.drop_standbys();
        }
        // The caller of `Group::join` heard `Ok` long ago: a store briefly unreachable is
        // retried here rather than ending the member.
        let mut retries = 0;
        loop {
            match self.first_claim().await {
                Ok(()) => break,
                Err(e) if e.is_retryable() && retries < CLAIM_RETRIES => {
                    retries += 1;
                    self.set_error(Some(&e));
                    tokio::select! {
                                biased;
                                _ = stop.changed() => {
                                    let phase = self.enter(Phase::Stopped);
                    self.shared.publish(|a| a.phase = phase);
                                    return Ok(());
                                }
                                _ = self.cfg.clock.sleep(self.cfg.heartbeat / 4) => {}
                            }
                }
                Err(e) => {
                    self.fail(&e).await;
                    return Err(e);
                }
            }
        }
        self.run(stop).await
    }

    /// Stands by until a leaving member hands this one its slot or the wait ends (true: claim
    /// now), or until `stop` changes (false, with the standby record deleted and a slot handed
    /// to it given back).
    async fn stand_by(
        &mut self,
        mut record: StandbyRecord,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let key = self.cfg.layout.standby(&self.cfg.member);
        let until = self.cfg.clock.monotonic() + self.cfg.standby.unwrap_or_default();
        let poll = self.cfg.heartbeat / 4;
        loop {
            if *stop.borrow() {
                self.stop_standing_by(record).await;
                return false;
            }
            if let Some((slot, from)) = record.heir_of {
                match self.inherit(slot, from, stop).await {
                    Inherited::Taken => {
                        let _ = self
                            .store
                            .compare_and_delete(&key, &record.to_string())
                            .await;
                        return true;
                    }
                    Inherited::Stopped => {
                        self.stop_standing_by(record).await;
                        return false;
                    }
                    Inherited::NotHanded => {
                        // Stand by again, unmarked. If the store holds something else by now,
                        // the renewal below fails and reads it.
                        let marked = record.to_string();
                        record.heir_of = None;
                        if let Err(e) = self
                            .store
                            .compare_and_set(
                                &key,
                                Some(&marked),
                                &record.to_string(),
                                Some(self.standby_ttl()),
                            )
                            .await
                        {
                            self.set_error(Some(&e));
                        }
                    }
                }
            }
            let text = record.to_string();
            // Renewing with the exact text, or deleting it once the wait is over, fails only
            // when a leaving member marked the record (or it expired, or another process of
            // this id replaced it): exclusive with a leaving member's choice of this standby.
            let done = self.cfg.clock.monotonic() >= until;
            let unchanged = if done {
                self.store.compare_and_delete(&key, &text).await
            } else {
                self.store
                    .compare_and_set(&key, Some(&text), &text, Some(self.standby_ttl()))
                    .await
            };
            match unchanged {
                Ok(true) if done => {
                    tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, "no member left while standing by: joining as a new member");
                    return true;
                }
                Ok(true) => self.set_error(None),
                Ok(false) => match self.store.get(&key).await {
                    Ok(Some(now)) => match self.standby_refused(&now, &record) {
                        // Marked by a leaving member (handled at the top of the loop).
                        Some(marked) => {
                            record = marked;
                            continue;
                        }
                        // Another process stands by with this member id, or the key holds
                        // something else: join now, where the usual rule for two processes of
                        // one id applies.
                        None => {
                            tracing::warn!(group = self.cfg.layout.group(), member = %self.cfg.member, "the standby record was replaced by another process's: joining now");
                            return true;
                        }
                    },
                    // Expired (the process was paused past its lease): write it again.
                    Ok(None) => {
                        if let Err(e) = self
                            .store
                            .compare_and_set(&key, None, &text, Some(self.standby_ttl()))
                            .await
                        {
                            self.set_error(Some(&e));
                        }
                    }
                    Err(e) => self.set_error(Some(&e)),
                },
                Err(e) => self.set_error(Some(&e)),
            }
            // A leaving member's mark on this record is heard at once where the store notifies.
            self.wait_or_notice(poll, Seen::STANDBYS, stop).await;
        }
    }

    /// Chosen as the heir of `slot` by the claim with nonce `from`: waits (up to one lease TTL,
    /// the time its leaving member has to park it) until the slot is parked under this member
    /// id, so that the claim that follows takes it back.
    async fn inherit(
        &mut self,
        slot: u32,
        from: u64,
        stop: &mut watch::Receiver<bool>,
    ) -> Inherited {
        let key = self.cfg.layout.slot(slot);
        let give_up = self.cfg.clock.monotonic() + self.cfg.ttl;
        loop {
            match self.handing(&key, from).await {
                Ok(Handing::Parked(_)) => {
                    tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, slot, "a leaving member handed its slot to this standby");
                    return Inherited::Taken;
                }
                Ok(Handing::Pending) => {}
                Ok(Handing::Not) => return Inherited::NotHanded,
                Err(e) => self.set_error(Some(&e)),
            }
            if self.cfg.clock.monotonic() >= give_up {
                return Inherited::NotHanded;
            }
            // The park is heard at once where the store notifies.
            let waited = self
                .wait_or_notice(self.cfg.heartbeat / 8, Seen::SLOTS, stop)
                .await;
            if waited == Waited::Stopped {
                return Inherited::Stopped;
            }
        }
    }

    /// Stops standing by: deletes the standby record, and if a leaving member chose this
    /// standby meanwhile, gives its slot back to the group (see [`Runner::give_back`]).
    async fn stop_standing_by(&mut self, mut record: StandbyRecord) {
        let key = self.cfg.layout.standby(&self.cfg.member);
        for _ in 0..3 {
            if let Some((slot, from)) = record.heir_of {
                self.give_back(slot, from).await;
            }
            match self
                .store
                .compare_and_delete(&key, &record.to_string())
                .await
            {
                Ok(false) => match self.store.get(&key).await {
                    // Marked since this member last looked.
                    Ok(Some(now)) => match StandbyRecord::parse(&now) {
                        Some(r) if r.nonce == record.nonce && r != record => record = r,
                        _ => break,
                    },
                    _ => break,
                },
                Ok(true) | Err(_) => break,
            }
        }
        tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, "stopped while standing by");
    }

    /// A standby chosen as the heir of `slot` (by the claim with nonce `from`) that stops
    /// before taking it over: deletes the claim parked for it, which holds nothing, so the
    /// others publish a view without the slot at once instead of waiting a lease TTL for it to
    /// expire. Waits at most a heartbeat for the leaving member to park it.
    async fn give_back(&mut self, slot: u32, from: u64) {
        let key = self.cfg.layout.slot(slot);
        let give_up = self.cfg.clock.monotonic() + self.cfg.heartbeat;
        loop {
            match self.handing(&key, from).await {
                Ok(Handing::Parked(text)) => {
                    let _ = self.store.compare_and_delete(&key, &text).await;
                    tracing::warn!(group = self.cfg.layout.group(), member = %self.cfg.member, slot, "stopped after a leaving member handed this standby its slot: the slot goes back to the group");
                    return;
                }
                Ok(Handing::Pending) => {}
                Ok(Handing::Not) | Err(_) => return,
            }
            if self.cfg.clock.monotonic() >= give_up {
                return;
            }
            self.cfg.clock.sleep(self.cfg.heartbeat / 16).await;
        }
    }

    /// What the slot at `key` holds for this member as the heir the claim with nonce `from`
    /// chose: that claim parked under this member id (with its text), still that claim live (it
    /// parks it next), or anything else.
    async fn handing(&self, key: &str, from: u64) -> Result<Handing> {
        let text = self.store.get(key).await?;
        Ok(self.handing_of(text, from))
    }

    /// Hands `claim` (drained: it holds nothing) to the oldest standby, if there is one: marks
    /// the standby's record as its heir, then parks the claim under the standby's member id for
    /// one lease TTL. No view is published: the claim stays in the view until the standby takes
    /// it back. Returns whether it handed the slot over; otherwise the member leaves as usual.
    pub(super) async fn hand_over(&mut self, claim: &Claim) -> Result<bool> {
        let listing = self.store.list(&self.cfg.layout.standbys).await?;
        let standbys = self.heirs(listing);
        let slot_key = self.cfg.layout.slot(claim.slot);
        let held = claim.record.to_string();
        for (member, text, record) in standbys.into_iter().take(HEIR_ATTEMPTS) {
            let standby_key = self.cfg.layout.standby(&member);
            let marked = StandbyRecord {
                heir_of: Some((claim.slot, claim.record.nonce)),
                ..record
            }
            .to_string();
            if !self
                .store
                .compare_and_set(&standby_key, Some(&text), &marked, Some(self.cfg.ttl))
                .await?
            {
                continue;
            }
            let parked = self.parked_for(claim, &member);
            if self
                .store
                .compare_and_set(
                    &slot_key,
                    Some(&held),
                    &parked.to_string(),
                    Some(self.cfg.ttl),
                )
                .await?
            {
                tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, slot = claim.slot, heir = %member, "left the group, handing the slot to a standby");
                return Ok(true);
            }
            // This member's claim is gone (its lease ran out): unmark the standby, which then
            // stands by again (it also gives up on its own once the slot holds another claim),
            // and leave as usual.
            let _ = self
                .store
                .compare_and_set(&standby_key, Some(&marked), &text, Some(self.standby_ttl()))
                .await;
            return Ok(false);
        }
        Ok(false)
    }
}

impl Engine {
    /// The lease of a standby record: one heartbeat (at least the store's shortest lease),
    /// renewed every quarter heartbeat, so a standby that died stops being chosen within a
    /// heartbeat.
    fn standby_ttl(&self) -> Duration {
        self.cfg.heartbeat.max(self.cfg.min_ttl)
    }

    /// The standby record to stand by with, given what the store holds at this member id's
    /// key (`old`): a previous process of this id chosen as an heir goes on with that
    /// inheritance; otherwise a new record, to write over `old`.
    fn standby_record(&self, old: Option<&str>) -> Standing {
        match old
            .and_then(StandbyRecord::parse)
            .filter(|r| r.heir_of.is_some())
        {
            Some(record) => Standing::Inheriting(record),
            None => Standing::New(StandbyRecord {
                nonce: self.cfg.clock.random(),
                since_ms: self.now_ms(),
                heir_of: None,
            }),
        }
    }

    /// The standby record's renewal was refused and the key now holds `now`: the same record
    /// marked by a leaving member (returned), or anything else (`None`: join now).
    fn standby_refused(&self, now: &str, record: &StandbyRecord) -> Option<StandbyRecord> {
        StandbyRecord::parse(now).filter(|r| r.nonce == record.nonce)
    }

    /// What a slot holding `text` holds for this member as the heir the claim with nonce
    /// `from` chose: that claim parked under this member id (with its text), still that claim
    /// live (it parks it next), or anything else.
    fn handing_of(&self, text: Option<String>, from: u64) -> Handing {
        let Some(text) = text else {
            return Handing::Not;
        };
        match SlotRecord::parse(&text) {
            Some(r) if r.nonce == from && r.is_parked() && r.member == self.cfg.member => {
                Handing::Parked(text)
            }
            Some(r) if r.nonce == from && !r.is_parked() => Handing::Pending,
            _ => Handing::Not,
        }
    }

    /// The standbys a leaving member may hand its slot to, from the listing of the standby
    /// directory, oldest first: unmarked records of other valid member ids, with their member
    /// id and text.
    fn heirs(&self, listing: Vec<(String, String)>) -> Vec<(String, String, StandbyRecord)> {
        let mut standbys: Vec<(String, String, StandbyRecord)> = listing
            .into_iter()
            .filter_map(|(key, text)| {
                let member = key.strip_prefix(&self.cfg.layout.standbys)?.to_owned();
                let record = StandbyRecord::parse(&text)?;
                let fits = record.heir_of.is_none()
                    && member != self.cfg.member
                    && crate::recipes::interval::check_member(&member).is_ok();
                fits.then_some((member, text, record))
            })
            .collect();
        standbys.sort_by(|a, b| (a.2.since_ms, &a.0).cmp(&(b.2.since_ms, &b.0)));
        standbys
    }

    /// `claim` parked under the heir's member id: acknowledging everything it saw, holding
    /// nothing.
    fn parked_for(&self, claim: &Claim, member: &str) -> SlotRecord {
        SlotRecord {
            member: member.to_owned(),
            acked: claim.record.acked.max(self.cache.highest),
            view: 0,
            parked: Some(self.now_ms()),
            ..claim.record.clone()
        }
    }
}

/// The standby record a standby starts from ([`Engine::standby_record`]).
enum Standing {
    /// A previous process of this id was chosen as an heir: go on with that inheritance.
    Inheriting(StandbyRecord),
    /// A new record, to write.
    New(StandbyRecord),
}

#[cfg(test)]
mod tests;
