//! Claims: joining (waiting out a previous incarnation's lease, then claiming a slot), claiming
//! again after the lease was lost, the check that the group uses this member's assignor, and
//! twins (another live process with this member id).

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::super::header::ViewHeader;
use super::super::records::{Holder, SlotRecord, ViewRecord};
use super::super::table::SlotTable;
use super::super::MIN_LEASE_TTL;
use super::decide::choose_slot;
use super::round::Round;
use super::{Claim, Engine, Phase, Runner, CLAIM_ATTEMPTS, RELIST_EVERY};
use crate::error::{Error, Result};

impl Runner {
    /// The join: takes back a claim this member id parked for a restart, or waits out a
    /// previous incarnation's lease ([`Engine::join_step`]), then claims.
    pub(in crate::recipes::group) async fn first_claim(&mut self) -> Result<()> {
        let mut table = self.list().await?;
        self.check_assignor(&table)?;
        let mut join = Join::default();
        loop {
            match self.join_step(&table, &mut join)? {
                JoinStep::Claim => break,
                JoinStep::TakeBack(slot, parked) => {
                    if self.resume(&table, slot, parked).await? {
                        return Ok(());
                    }
                    // Taken by another process with this id (a twin, which the loop then
                    // waits out), or changed or expired since the listing.
                    let pause = self.take_back_lost(&mut join, slot)?;
                    self.cfg.clock.sleep(pause).await;
                }
                JoinStep::Wait(pause) => self.cfg.clock.sleep(pause).await,
            }
            table = self.list().await?;
        }
        // Slots lost to another claim since the table was read: the next try picks another
        // free slot of the same listing, and the table is read again only every
        // [`RELIST_EVERY`]th try, so a burst of k joins does not have each joiner read the
        // whole table about log k times.
        let mut lost = Vec::new();
        for attempt in 0..CLAIM_ATTEMPTS {
            let skip = self.claim_skip(attempt);
            match self.claim(&table, &lost, skip).await? {
                None => return Ok(()),
                Some(slot) => lost.push(slot),
            }
            if (attempt + 1) % RELIST_EVERY == 0 {
                table = self.list().await?;
                lost.clear();
            }
        }
        Err(Error::contended(
            &self.cfg.layout.slots,
            format!("lost the race for a free slot {CLAIM_ATTEMPTS} times in a row"),
        ))
    }

    /// Claims the slot [`choose_slot`] picks (none of `lost`, slots this member lost to other
    /// claims since `table` was read); on success publishes the view with this member in it.
    /// Returns the slot it lost, `None` when it claimed.
    async fn claim(&mut self, table: &SlotTable, lost: &[u32], skip: u32) -> Result<Option<u32>> {
        let (slot, record) = self.new_claim(table, lost, skip)?;
        let sent = self.cfg.clock.monotonic();
        let key = self.cfg.layout.slot(slot);
        if !self
            .store
            .compare_and_set(&key, None, &record.to_string(), Some(self.cfg.slot_ttl))
            .await?
        {
            return Ok(Some(slot));
        }
        tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, slot, "claimed a slot");
        // A slot lost to another claim since `table` was read: that claim is missing from it, so
        // this join is not alone and leaves the view to the lowest slot.
        self.hold(slot, record, sent, table, !lost.is_empty()).await;
        Ok(None)
    }

    /// Takes back the slot of the claim `parked`, which this member id parked at `slot` for a
    /// restart ([`SlotRecord::parked`]): one compare-and-set from the parked record, as stored, to
    /// a claim of this process's own on the same slot (a fresh nonce), acknowledging everything up
    /// to the highest epoch seen since it holds nothing. Then it publishes the same slots under
    /// the next epoch when it can ([`Runner::republish`]) and goes on like a fresh claim. Returns
    /// whether it took the slot (not when another process with this id took it first, or the
    /// record changed or expired).
    ///
    /// With a crash grace ([`GroupConfig::with_crash_grace`]) the claim taken over may be live:
    /// a process of this id that crashed, or is frozen and may still grant until its lease
    /// deadline. The compare-and-set stops its renewals, and this process then waits one lease
    /// TTL (by which that deadline has passed) before it goes on. Until then its record keeps
    /// the previous claim's acknowledgements, not more: the previous process may still hold what
    /// it held, so no view may count this slot as having let go of anything.
    ///
    /// [`GroupConfig::with_crash_grace`]: super::super::GroupConfig::with_crash_grace
    async fn resume(&mut self, table: &SlotTable, slot: u32, parked: SlotRecord) -> Result<bool> {
        let takeover = !parked.is_parked();
        let record = self.take_back_record(table, &parked);
        let key = self.cfg.layout.slot(slot);
        let Some(stored) = self.stored_text(&key, &parked).await? else {
            return Ok(false);
        };
        let sent = self.cfg.clock.monotonic();
        let written = match self
            .store
            .compare_and_set(
                &key,
                Some(&stored),
                &record.to_string(),
                Some(self.cfg.slot_ttl),
            )
            .await
        {
            Ok(written) => written,
            // The write may have been applied with its reply lost: the slot then holds this
            // process's fresh nonce, and the take-back is done.
            Err(e) => match self.store.get(&key).await {
                Ok(Some(text)) if SlotRecord::parse(&text).as_ref() == Some(&record) => true,
                _ => return Err(e),
            },
        };
        if !written {
            return Ok(false);
        }
        // The previous incarnation granted under views up to the highest epoch seen before the
        // take-over at most: a view published since names this claim, not the previous one.
        self.claims.floor = self.cache.highest;
        let (sent, mut table) = if takeover {
            let sent = self.wait_out_predecessor(slot, &record, &parked).await?;
            let table = self.list().await?;
            // Views were published while it waited: the next one this member mints is above.
            self.cache.highest = self.cache.highest.max(table.highest_epoch());
            (sent, table)
        } else {
            let mut table = table.clone();
            table.slots.insert(slot, record.clone());
            (sent, table)
        };
        let republished = self
            .republish(&table, parked.holder(slot), record.holder(slot))
            .await;
        let epoch = republished.as_ref().map(|v| v.epoch);
        if let Some(next) = republished {
            let current = self.publication(&table, &next).current;
            table.view_header = ViewHeader::parse(&current);
            table.view_text = Some(current);
            table.view = Some(next);
        }
        tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, slot, epoch, "took back the slot of this member id: the same slots, no key moves");
        self.hold(slot, record, sent, &table, false).await;
        Ok(true)
    }

    /// Just after taking over `slot` from the live claim `previous` of this member id as
    /// `record` (see [`Runner::resume`]): waits until the previous process has surely stopped
    /// granting, one lease TTL (the longer of its own and this process's: it stops at its
    /// renewal plus 90% of its TTL, and its last renewal came before the take-over), renewing
    /// `record` every heartbeat meanwhile. Returns when the last renewal was sent, for the lease
    /// deadline. Fails with `Rejected` when another process of this id took the slot over in
    /// turn (the newest wins), or with the store's error when the last renewal cannot be made.
    async fn wait_out_predecessor(
        &mut self,
        slot: u32,
        record: &SlotRecord,
        previous: &SlotRecord,
    ) -> Result<Duration> {
        let wait = self.predecessor_wait(previous);
        tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, slot, wait = ?wait, "took over the slot of this member id's previous process (crash grace): waiting one lease TTL, until that process has surely stopped granting");
        let key = self.cfg.layout.slot(slot);
        let text = record.to_string();
        let end = self.cfg.clock.monotonic() + wait;
        loop {
            let now = self.cfg.clock.monotonic();
            if now < end {
                self.cfg
                    .clock
                    .sleep(self.cfg.heartbeat.min(end - now))
                    .await;
            }
            let sent = self.cfg.clock.monotonic();
            let result = self
                .store
                .compare_and_set(&key, Some(&text), &text, Some(self.cfg.slot_ttl))
                .await;
            match self.predecessor_renewed(end, sent, result)? {
                Waiting::Over => return Ok(sent),
                Waiting::Renewed => {}
                Waiting::Failed { pause } => {
                    if let Some(pause) = pause {
                        self.cfg.clock.sleep(pause).await;
                    }
                }
            }
        }
    }

    /// Just after taking back the parked claim `parked` as `claim` (the same slot, a new
    /// nonce): when the published view in `table` is settled and names exactly the live holders
    /// but for `parked` in place of `claim`, publishes the live holders under the next epoch.
    /// The slots are the same, so no key moves, and this process's fencing tokens come after
    /// every token of its previous incarnation. Returns the view when it did; otherwise the
    /// usual rules publish the view the table calls for. Either way the member activates its
    /// view as every member does, once the others acknowledged it: nothing moves to it, but a
    /// store that lost a first take-back lets a second one publish that same epoch for the same
    /// slots, and only a member that saw the first can tell (it refuses to acknowledge the
    /// second).
    async fn republish(
        &mut self,
        table: &SlotTable,
        parked: Holder,
        claim: Holder,
    ) -> Option<ViewRecord> {
        let next = self.republishing(table, parked, claim)?;
        let result = self.publish(table, &next).await;
        self.republished(next, result)
    }

    /// Starts working with `record`, just written at `slot` (the renewal sent at `sent`): the
    /// member's lease, its published slot, and the table with the claim in it. `raced`: the
    /// claim lost a race for another slot since `table` was read, so another claim the table
    /// lacks is under way.
    async fn hold(
        &mut self,
        slot: u32,
        record: SlotRecord,
        sent: Duration,
        table: &SlotTable,
        raced: bool,
    ) {
        let round = self.holds(slot, record, sent, table, raced);
        self.run_round(round).await;
    }

    /// Claims again after losing the lease. A full group or a store error is retried at the
    /// next beat, never fatal: the member was in the group a moment ago. Fatal only when
    /// another live process holds this member id ([`Engine::replaced_by`]): this one was away
    /// (paused, cut off) while it was replaced, and yields before claiming anything.
    pub(super) async fn reclaim(&mut self, table: &SlotTable) -> Result<()> {
        // A store that lost writes may show this member id's parked slot again (a rollback to
        // before a take-back): take it back rather than claim another slot beside it.
        if let Some((slot, parked)) = self.reclaiming(table)? {
            match self.resume(table, slot, parked).await {
                Ok(true) => {
                    self.set_error(None);
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => {
                    self.set_error(Some(&e));
                    return Ok(());
                }
            }
        }
        match self.claim(table, &[], 0).await {
            Ok(_) => self.set_error(None),
            Err(e) => self.set_error(Some(&e)),
        }
        Ok(())
    }

    /// Another live slot with our member id: the holder of the higher slot yields. Claims this
    /// process made before (a write that timed out but was applied, a lease given up) are ours,
    /// not a twin's: they are shortened to expire soon instead.
    pub(super) async fn check_twin(&mut self, table: &SlotTable, slot: u32) -> Result<()> {
        if self.claims.current.is_none() {
            return Ok(());
        }
        let short = self.store.capabilities().min_ttl.max(MIN_LEASE_TTL);
        for (s, text) in self.own_old_claims(table, slot) {
            let _ = self
                .store
                .compare_and_set(&self.cfg.layout.slot(s), Some(&text), &text, Some(short))
                .await;
        }
        self.yields_to_twin(table, slot)
    }
}

impl Engine {
    /// Refuses to join a group whose live members map keys with another assignor: both sides
    /// would grant the same keys.
    pub(super) fn check_assignor(&self, table: &SlotTable) -> Result<()> {
        if let Some(epoch) = table.newer_view_in_use() {
            return Err(super::views::newer_version(epoch));
        }
        self.check_view_assignor(table)
    }

    /// Refuses a published view of another assignor (or key set) that live members other
    /// than this one work under: the group has its assignor, and this member can never adopt
    /// its views.
    pub(super) fn check_view_assignor(&self, table: &SlotTable) -> Result<()> {
        let Some(view) = &table.view else {
            return Ok(());
        };
        let Some(theirs) = view.assignor.filter(|&a| a != self.cfg.assignor) else {
            return Ok(());
        };
        // Live members other than this one work under it: the group has its assignor. (A view
        // that names only this member is its own business: it keeps its view and says why.)
        let live = table.live();
        let mine = self.claims.current.as_ref().map(Claim::holder);
        if view
            .holders
            .iter()
            .any(|h| live.contains(h) && Some(*h) != mine)
        {
            return Err(Error::config(format!(
                "group `{}` is working with the `{}` assignor and this member is configured with `{}`: every member of a group must use the same one (and for `sticky` or `balanced`, declare the same keys: `<name>:<count>:<digest>`)",
                self.cfg.layout.group(),
                theirs,
                self.cfg.assignor
            )));
        }
        Ok(())
    }

    /// The crash grace as a slot record carries it.
    fn grace_ms(&self) -> Option<u64> {
        let grace = self.cfg.crash_grace;
        (!grace.is_zero()).then_some(grace.as_millis() as u64)
    }

    /// Wall-clock milliseconds since the Unix epoch, as records carry them.
    pub(super) fn now_ms(&self) -> u64 {
        self.cfg
            .clock
            .now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    /// The slot of a live, working claim with this member id that this process did not make:
    /// a newer process with the same id.
    fn replaced_by(&self, table: &SlotTable) -> Option<u32> {
        self.twins(table).next()
    }

    /// The slots of live, working claims with this member id that this process did not make
    /// (neither its current claim nor one it made before), ascending.
    fn twins<'a>(&'a self, table: &'a SlotTable) -> impl Iterator<Item = u32> + 'a {
        let mine = self.claims.current.as_ref().map(|c| c.record.nonce);
        table
            .slots
            .iter()
            .filter(move |(_, r)| {
                r.member == self.cfg.member
                    && !r.is_parked()
                    && Some(r.nonce) != mine
                    && !self.claims.own_nonces.contains(&r.nonce)
            })
            .map(|(&s, _)| s)
    }

    /// How many free slots a claim skips on its `attempt`th try: none at first; after a lost
    /// race a random number among the lowest 2, 4, 8, ... free slots, so members started
    /// together, who all want the lowest free slot, settle in about log n rounds instead of n.
    fn claim_skip(&self, attempt: u32) -> u32 {
        if attempt == 0 {
            return 0;
        }
        // Below 2^12: the cast keeps every bit.
        (self.cfg.clock.random() % (1u64 << attempt.min(12))) as u32
    }

    /// A join's next step on `table`: claim a slot when no claim of this member id is live;
    /// take back its claim when it is parked (or live, with a crash grace: the process that
    /// held it crashed or is frozen); otherwise wait for it to expire, a previous process's
    /// lease (and crash grace) plus two heartbeats at most, past which another live process
    /// uses this id.
    fn join_step(&mut self, table: &SlotTable, join: &mut Join) -> Result<JoinStep> {
        let Some((slot, record)) = table
            .slots
            .iter()
            .find(|(_, r)| r.member == self.cfg.member)
            .map(|(&s, r)| (s, r.clone()))
        else {
            return Ok(JoinStep::Claim);
        };
        let now = self.cfg.clock.monotonic();
        let give_up = *join.give_up.get_or_insert_with(|| {
            // The previous process's record outlives its lease by its crash grace, if it had
            // one.
            let grace = record.grace.map_or(Duration::ZERO, Duration::from_millis);
            now + self.cfg.effective_ttl + grace + 2 * self.cfg.heartbeat
        });
        self.claims.preferred = Some(slot);
        if record.is_parked() || !self.cfg.crash_grace.is_zero() {
            return Ok(JoinStep::TakeBack(slot, record));
        }
        if now >= give_up {
            return Err(self.rejected(format!(
                "member id `{}` holds slot {slot} and kept it past its lease TTL: another live process uses the same member id",
                self.cfg.member
            )));
        }
        Ok(JoinStep::Wait(JOIN_POLL.min(self.cfg.heartbeat)))
    }

    /// A take-back of `slot` lost (another process of this id took it, or the record changed):
    /// how long to pause before looking again; an error after [`CLAIM_ATTEMPTS`] in a row.
    fn take_back_lost(&self, join: &mut Join, slot: u32) -> Result<Duration> {
        join.take_backs += 1;
        if join.take_backs >= CLAIM_ATTEMPTS {
            return Err(Error::contended(
                &self.cfg.layout.slot(slot),
                format!("lost the race for this member id's parked slot {CLAIM_ATTEMPTS} times in a row"),
            ));
        }
        Ok(JOIN_POLL.min(self.cfg.heartbeat) / 4)
    }

    /// The slot a claim tries ([`choose_slot`], skipping `skip` free ones) and the record it
    /// writes there: a fresh nonce, acknowledging every epoch seen (holding nothing, it has let
    /// go of everything up to them). An error when the group is full.
    fn new_claim(
        &mut self,
        table: &SlotTable,
        lost: &[u32],
        skip: u32,
    ) -> Result<(u32, SlotRecord)> {
        let mut slot = self.cfg.max_slots;
        if !lost.is_empty() {
            // The slots lost count as held; the free ones of the listing are tried first.
            let mut held = table.clone();
            held.foreign
                .extend(lost.iter().map(|&s| (s, String::new())));
            slot = choose_slot(&held, self.claims.preferred, skip, self.cfg.max_slots);
        }
        if slot >= self.cfg.max_slots {
            slot = choose_slot(table, self.claims.preferred, skip, self.cfg.max_slots);
        }
        if slot >= self.cfg.max_slots {
            return Err(self.rejected(format!(
                "group `{}` is full: every slot below {} is held",
                self.cfg.layout.group(),
                self.cfg.max_slots
            )));
        }
        self.cache.highest = self.cache.highest.max(table.highest_epoch());
        let record = SlotRecord {
            member: self.cfg.member.clone(),
            nonce: self.cfg.clock.random(),
            since_ms: self.now_ms(),
            ttl_ms: self.cfg.ttl.as_millis() as u64,
            // Holding nothing, it has let go of everything under any view up to this one.
            acked: self.cache.highest,
            view: 0,
            parked: None,
            grace: self.grace_ms(),
        };
        self.claims.remember_nonce(record.nonce);
        self.claims.floor = 0;
        Ok((slot, record))
    }

    /// The record that takes back `parked` (see [`Runner::resume`]): a claim of this
    /// process's own, with a fresh nonce, so two processes that took back one parked claim (a
    /// twin after a rollback restored the parked record) never hold records a renewal could
    /// take for its own, and a late renewal of the process that parked never matches it. A
    /// parked claim held nothing: it acknowledges every epoch seen. A live one taken over keeps
    /// the previous claim's acknowledgements, no more: that process may still hold what it held.
    fn take_back_record(&mut self, table: &SlotTable, parked: &SlotRecord) -> SlotRecord {
        let takeover = !parked.is_parked();
        self.cache.highest = self.cache.highest.max(table.highest_epoch());
        let record = SlotRecord {
            nonce: self.cfg.clock.random(),
            since_ms: self.now_ms(),
            ttl_ms: self.cfg.ttl.as_millis() as u64,
            acked: if takeover {
                parked.acked
            } else {
                parked.acked.max(self.cache.highest)
            },
            view: if takeover { parked.view } else { 0 },
            parked: None,
            grace: self.grace_ms(),
            member: parked.member.clone(),
        };
        self.claims.remember_nonce(record.nonce);
        record
    }

    /// The view a take-back publishes (see [`Runner::republish`]): when the published view in
    /// `table` is settled and names exactly the live holders but for `parked` in place of
    /// `claim`, the live holders under the next epoch.
    fn republishing(&self, table: &SlotTable, parked: Holder, claim: Holder) -> Option<ViewRecord> {
        let view = table.view.as_ref()?;
        let settled = table
            .settled
            .is_some_and(|m| m.settles(view.epoch, view.digest()));
        let swapped: Vec<Holder> = view
            .holders
            .iter()
            .map(|&h| if h == parked { claim } else { h })
            .collect();
        if !settled || !view.holders.contains(&parked) || swapped != table.live() {
            return None;
        }
        self.view_after(table, self.cache.highest, table.live())
    }

    /// The take-back's view `next` written (`Ok(true)`: returned) or not.
    fn republished(&mut self, next: ViewRecord, result: Result<bool>) -> Option<ViewRecord> {
        match result {
            Ok(true) => {
                self.forget_seen();
                self.cache.highest = next.epoch;
                self.settler.published = Some(next.epoch);
                tracing::debug!(group = self.cfg.layout.group(), member = %self.cfg.member, epoch = next.epoch, "published the same slots with this claim, above the previous incarnation's epochs");
                Some(next)
            }
            Ok(false) => None,
            Err(e) => {
                self.set_error(Some(&e));
                None
            }
        }
    }

    /// Starts working with `record`, just written at `slot` (the renewal sent at `sent`): the
    /// member's lease, its published slot, phase `joining`; returns the round of the table with
    /// the claim in it: this member's own change, not its alone if it `raced` (see
    /// [`Runner::hold`]).
    fn holds(
        &mut self,
        slot: u32,
        record: SlotRecord,
        sent: Duration,
        table: &SlotTable,
        raced: bool,
    ) -> Round {
        {
            let mut st = self.shared.lock();
            st.holder = Some(record.holder(slot));
            st.deadline = Some(self.deadline(sent));
        }
        self.claims.preferred = Some(slot);
        self.claims.current = Some(Claim {
            slot,
            record: record.clone(),
        });
        self.claims.ack = None;
        let phase = self.enter(Phase::Member);
        self.shared.publish(|a| {
            a.slot = Some(slot);
            a.phase = phase;
        });
        let mut table = table.clone();
        table.slots.insert(slot, record);
        Round::of_table(Arc::new(table), true, true).after_race(raced)
    }

    /// Claiming again after losing the lease: an error when another live process holds this
    /// member id ([`Engine::replaced_by`]: this one was away, paused or cut off, while it was
    /// replaced, and yields); this id's parked claim when the table shows one, to take back.
    fn reclaiming(&self, table: &SlotTable) -> Result<Option<(u32, SlotRecord)>> {
        if let Some(slot) = self.replaced_by(table) {
            return Err(self.rejected(format!(
                "member id `{}` is held by slot {slot}, a live process that took over while this one was away (its lease lapsed): this one yields",
                self.cfg.member
            )));
        }
        Ok(table
            .slots
            .iter()
            .find(|(_, r)| r.member == self.cfg.member && r.is_parked())
            .map(|(&s, r)| (s, r.clone())))
    }

    /// Claims this process made before beside its current one at `slot` (a write that timed
    /// out but was applied, a lease given up), with their text: they are ours, not a twin's,
    /// and are shortened to expire soon.
    fn own_old_claims(&self, table: &SlotTable, slot: u32) -> Vec<(u32, String)> {
        table
            .slots
            .iter()
            .filter(|(&s, r)| {
                s != slot
                    && r.member == self.cfg.member
                    && self.claims.own_nonces.contains(&r.nonce)
            })
            .map(|(&s, r)| (s, r.to_string()))
            .collect()
    }

    /// Another live slot with our member id, below ours: this one (the higher slot) yields. A
    /// parked record of this id is no live process: it is taken back at the next claim.
    fn yields_to_twin(&self, table: &SlotTable, slot: u32) -> Result<()> {
        match self.twins(table).find(|&s| s < slot) {
            Some(other) => Err(self.rejected(format!(
                "member id `{}` is also held by slot {other}, a live process: this one (slot {slot}) yields",
                self.cfg.member
            ))),
            None => Ok(()),
        }
    }
}

impl Engine {
    /// How long a take-over waits for the previous process of this id to stop granting: one
    /// lease TTL, the longer of its own and this process's (it stops at its renewal plus 90% of
    /// its TTL, and its last renewal came before the take-over).
    fn predecessor_wait(&self, previous: &SlotRecord) -> Duration {
        self.cfg.ttl.max(Duration::from_millis(previous.ttl_ms))
    }

    /// A renewal sent at `sent` while waiting out a predecessor until `end` answered: the wait
    /// is over once a renewal sent at or after `end` went through; another process of this id
    /// that took the slot over in turn wins (the newest does, as this one did), and this one
    /// yields with `Rejected`; a store error is tried again (soon, once the wait is over), and
    /// is the join's error a lease TTL past the end.
    fn predecessor_renewed(
        &self,
        end: Duration,
        sent: Duration,
        result: Result<bool>,
    ) -> Result<Waiting> {
        match result {
            Ok(true) if sent >= end => Ok(Waiting::Over),
            Ok(true) => Ok(Waiting::Renewed),
            Ok(false) => Err(self.rejected(format!(
                "member id `{}` was taken over by another process while this one waited for its predecessor's lease: this one yields (give each instance its own member id)",
                self.cfg.member
            ))),
            Err(e) if sent >= end + self.cfg.ttl => Err(e),
            Err(e) => {
                self.set_error(Some(&e));
                Ok(Waiting::Failed {
                    pause: (sent >= end).then_some(self.cfg.heartbeat / 4),
                })
            }
        }
    }
}

/// A take-over's wait for its predecessor after one renewal ([`Engine::predecessor_renewed`]).
#[derive(Debug, PartialEq, Eq)]
enum Waiting {
    /// Over: the predecessor has surely stopped granting.
    Over,
    /// Renewed; the wait goes on.
    Renewed,
    /// The renewal failed; tried again after `pause` (none: at the next heartbeat).
    Failed { pause: Option<Duration> },
}

/// How often a join looks again at a claim of its member id that is in the way (at most; a
/// heartbeat when shorter).
const JOIN_POLL: Duration = Duration::from_millis(250);

/// A join waiting on a claim of its member id ([`Engine::join_step`]).
#[derive(Default)]
struct Join {
    /// When it gives up waiting (monotonic): set when it first sees the claim.
    give_up: Option<Duration>,
    /// Take-backs lost so far.
    take_backs: u32,
}

/// A join's next step ([`Engine::join_step`]).
enum JoinStep {
    /// Claim a free slot.
    Claim,
    /// Take back this member id's claim of the slot.
    TakeBack(u32, SlotRecord),
    /// Look again after this long.
    Wait(Duration),
}

#[cfg(test)]
mod tests;
