//! The heartbeat runner: renewals, reading the slot table, publishing and adopting views, acknowledgements and hand-off.

use super::*;
use tracing::Instrument as _;

/// The most stalled slots one beat re-applies a lease TTL to ([`Runner::expire_stalled`]).
pub(super) const NUDGES_PER_BEAT: usize = 8;

/// Live slots that disagree with the published view.
pub(super) struct Discrepancy {
    /// The live holders of the listing.
    pub(super) live: Vec<Holder>,
    /// Since when (monotonic).
    pub(super) since: Duration,
    /// Whether the member polls at a quarter heartbeat meanwhile: the lowest slot (which
    /// publishes), and every member when a slot of the view is gone (the lowest may be the one
    /// gone). A new claim publishes the view with itself, so the others need not poll for it.
    pub(super) fast: bool,
}

/// The background heartbeat.
pub(super) struct Runner {
    /// The member's metrics (`docs/observability.md`).
    pub(super) metrics: crate::metrics::GroupMetrics,
    pub(super) store: DynStore,
    pub(super) shared: Arc<Shared>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) keys: Keyspace,
    /// `hc:{group}:slot:`, the directory of the slot records.
    pub(super) listing: String,
    /// `hc:{group}:view:`, the directory of the published view and the settled mark.
    pub(super) view_listing: String,
    /// `hc:{group}:view:current`.
    pub(super) view_key: String,
    pub(super) member: String,
    pub(super) ttl: Duration,
    pub(super) effective_ttl: Duration,
    pub(super) heartbeat: Duration,
    pub(super) assignor: AssignorKind,
    pub(super) max_slots: u32,
    pub(super) drain_timeout: Duration,
    /// Read the table only when the store reports a change (see
    /// [`GroupConfig::with_change_checks`]).
    pub(super) change_checks: bool,
    /// The store answers two directories' versions in one call
    /// ([`Capabilities::native_renew_and_versions`](crate::Capabilities)): a member that reads
    /// both at a heartbeat asks for both versions first, and reads only what changed.
    pub(super) one_call_versions: bool,
    /// The current claim: slot and record as stored.
    pub(super) record: Option<(u32, SlotRecord)>,
    pub(super) preferred: Option<u32>,
    /// The highest epoch seen in any view.
    pub(super) highest: u64,
    /// The live holders of a listing that disagreed with the published view, and since when
    /// (monotonic): while it lasts the member polls at a quarter heartbeat so it adopts the view
    /// the lowest slot publishes soon after, and publishes itself when it outlasts a heartbeat.
    pub(super) last_discrepancy: Option<Discrepancy>,
    pub(super) pending_since: Option<Duration>,
    /// When the pending view was adopted (monotonic): unlike `pending_since`, it restarts when
    /// a newer view replaces the pending one, so a burst of views (joins one after another)
    /// does not count as one long hand-off.
    pub(super) adopted_at: Option<Duration>,
    /// When the last full heartbeat started (monotonic).
    pub(super) last_beat: Option<Duration>,
    /// Gave up renewing (drain timeout): waits for its lease to pass, then claims again.
    pub(super) abandoned: bool,
    /// The nonces of every claim this process attempted.
    pub(super) own_nonces: Vec<u64>,
    /// The claims (slot, nonce) whose lease TTL this member re-applied while waiting for their
    /// acknowledgement of the pending view's epoch (see [`Runner::expire_stalled`]).
    pub(super) nudged: Vec<(u32, u64, u64)>,
    /// The pending epoch whose hand-off [`Runner::expire_stalled`] times, and since when.
    pub(super) stalled_since: Option<(u64, Duration)>,
    /// The slot table as last read and the store's version of the slot directory: a heartbeat
    /// whose version is the same reads nothing and works from this copy. Its view is the one
    /// of [`Runner::view_seen`].
    pub(super) seen: Option<(String, Arc<Table>)>,
    /// The store's version of the view directory the table's view was read at.
    pub(super) view_seen: Option<String>,
    /// The copy of the table was replaced outside a heartbeat (see [`Runner::watch`]): the next
    /// heartbeat counts it as changed.
    pub(super) unseen_change: bool,
    /// Full heartbeats so far: every [`SLOT_READS`]th one reads the slot directory.
    pub(super) beats: u64,
    /// The view calls for a look at the slot table (it went back, or another view took this
    /// member's epoch) and the member's copy may be stale: read it at the next beat.
    pub(super) need_slots: bool,
    /// The published view in the last table read is newer than the newest settled mark: a
    /// heartbeat must look at the table again even when it did not change (to write a lost
    /// acknowledgement again, see [`Runner::reassert`]).
    pub(super) unsettled: bool,
    /// `hc:{group}:ack:`, the directory of the acknowledgements.
    pub(super) ack_listing: String,
    /// `hc:{group}:view:settled`.
    pub(super) settled_key: String,
    /// The acknowledgement this member last wrote, as stored, and when (monotonic).
    pub(super) ack: Option<(AckRecord, String, Duration)>,
    /// The newest settled mark read (from the table or a poll).
    pub(super) settled: Option<SettledRecord>,
    /// This member settles: its slot is the lowest live one and the published view is not
    /// settled yet, so it polls the acknowledgements at an eighth of a heartbeat.
    pub(super) settling: bool,
    /// The epoch of the view this member last published: it settles that view too (without
    /// waiting for the lowest slot to read the view at its next heartbeat).
    pub(super) published: Option<u64>,
    /// When this member last read the acknowledgements (monotonic).
    pub(super) acks_read: Option<Duration>,
}

/// A member that does not watch the slot table (see [`Runner::reads_slots`]) reads it at every
/// this many heartbeats, at a beat set by its slot, so in a large group the reads spread out.
const SLOT_READS: u64 = 4;

/// How many times a join tries to claim a slot before it reports contention.
const CLAIM_ATTEMPTS: u32 = 32;

/// How long an acknowledgement lives, in lease TTLs: it matters only until its view is settled,
/// and a member whose view stays unsettled writes it again every heartbeat.
const ACK_TTLS: u32 = 4;

impl Runner {
    pub(super) fn slot_key(&self, slot: u32) -> String {
        self.keys.slot(slot)
    }

    fn ack_key(&self, slot: u32) -> String {
        format!("{}{slot}", self.ack_listing)
    }

    /// Whether this member's current claim has acknowledged `view`: in its slot record (a fresh
    /// claim has let go of everything up to the epoch it claimed at) or in its acknowledgement.
    pub(super) fn has_acked(&self, view: &ViewState) -> bool {
        let Some((_, record)) = &self.record else {
            return false;
        };
        view.acked_by(record)
            || self.ack.as_ref().is_some_and(|(a, _, _)| {
                a.nonce == record.nonce && a.has_acked_digest(view.epoch(), view.digest)
            })
    }

    pub(super) fn set_error(&self, e: Option<&Error>) {
        let msg = e.map(|e| e.to_string());
        self.shared.publish(|a| a.last_error = msg);
    }

    /// Reads the view directory, then the slot directory: every slot a view names was claimed
    /// before the view was published, so it is in the listing unless it is gone.
    pub(super) async fn list(&self) -> Result<Table> {
        let views = self.store.list(&self.view_listing).await?;
        let listing = self.store.list(&self.listing).await?;
        let mut table = Table::parse(&self.listing, listing);
        table.set_view(&self.view_listing, views);
        Ok(table)
    }

    /// Forgets the version of the view directory held, so the next heartbeat reads it: after a
    /// write of this member's own there (a view, a settled mark), a store that rolls back to
    /// exactly the directory held must not leave it believing its write stuck.
    pub(super) fn forget_seen(&mut self) {
        self.view_seen = None;
    }

    /// Whether this member holds one of the two lowest live slots of its copy of the table:
    /// it watches the table at every heartbeat, and halfway between heartbeats while another slot
    /// is live, so it sees a slot expire soon after the store does (two members, whatever the
    /// group's size).
    pub(super) fn watches_slots(&self) -> bool {
        match (&self.seen, &self.record) {
            (Some((_, table)), Some((slot, _))) => table.slots.keys().take(2).any(|s| s == slot),
            _ => false,
        }
    }

    /// Whether this heartbeat reads the slot table (when its version changed) besides the
    /// view. Members in a large group mostly do not: the view tells them what they own, and a
    /// join, a leave or an expiry changes the table without changing the view until a member
    /// that watches the table publishes one. The two lowest live slots watch it at every
    /// heartbeat (the lowest publishes and settles; the second takes over when the lowest is the
    /// one gone), and so does a member that joins, publishes, settles, sees a discrepancy, or
    /// has waited two heartbeats on one pending view (once a heartbeat); every other member reads
    /// it at every [`SLOT_READS`]th heartbeat when no hand-off is under way, for a twin with its
    /// member id and a lowest slot gone too.
    pub(super) fn reads_slots(&self, slot: u32) -> bool {
        let Some((_, table)) = &self.seen else {
            return true;
        };
        let now = self.clock.monotonic();
        self.need_slots
            || self.last_discrepancy.is_some()
            || self.settling
            || self.record.is_none()
            || self.watches_slots()
            || (self.unsettled
                && table
                    .view
                    .as_ref()
                    .is_some_and(|v| self.published == Some(v.epoch)))
            || (self
                .adopted_at
                .is_some_and(|t| now.saturating_sub(t) >= 2 * self.heartbeat)
                && self
                    .acks_read
                    .is_none_or(|t| now.saturating_sub(t) >= self.heartbeat))
            // Not in a hand-off: while views keep coming (a burst of joins) the table keeps
            // changing, and a look by every member would read it n times per change.
            || (self.pending_since.is_none()
                && self.beats % SLOT_READS == u64::from(slot) % SLOT_READS)
    }

    /// The join: waits out a previous incarnation's lease, then claims.
    pub(super) async fn first_claim(&mut self) -> Result<()> {
        let mut table = self.list().await?;
        self.check_assignor(&table)?;
        self.check_legacy(&table)?;
        let mine =
            |t: &Table, m: &str| t.slots.iter().find(|(_, r)| r.member == m).map(|(&s, _)| s);
        if let Some(slot) = mine(&table, &self.member) {
            self.preferred = Some(slot);
            let give_up = self.clock.monotonic() + self.effective_ttl + 2 * self.heartbeat;
            while mine(&table, &self.member).is_some() {
                if self.clock.monotonic() >= give_up {
                    return Err(Error::Rejected {
                        backend: self.store.capabilities().backend,
                        message: format!(
                            "member id `{}` holds slot {slot} and kept it past its lease TTL: another live process uses the same member id",
                            self.member
                        ),
                        source: None,
                    });
                }
                self.clock
                    .sleep(self.heartbeat.min(Duration::from_millis(250)))
                    .await;
                table = self.list().await?;
            }
        }
        // Members started together all want the lowest free slot, and only one wins each
        // round: after a lost race a member picks among the lowest 2, 4, 8, ... free slots at
        // random, so a burst of n joins settles in about log n rounds instead of n.
        for attempt in 0..CLAIM_ATTEMPTS {
            let skip = if attempt == 0 {
                0
            } else {
                rand::random_range(0..1u32 << attempt.min(12))
            };
            if self.claim(&table, skip).await? {
                return Ok(());
            }
            table = self.list().await?;
        }
        Err(Error::contended(
            &self.listing,
            format!("lost the race for a free slot {CLAIM_ATTEMPTS} times in a row"),
        ))
    }

    /// Refuses to join a group whose live members map keys with another assignor: both sides
    /// would grant the same keys.
    pub(super) fn check_assignor(&self, table: &Table) -> Result<()> {
        let Some(view) = &table.view else {
            return Ok(());
        };
        let Some(theirs) = view.assignor.filter(|&a| a != self.assignor) else {
            return Ok(());
        };
        let live = table.live();
        if view.holders.iter().any(|h| live.contains(h)) {
            return Err(Error::config(format!(
                "group `{}` is working with the `{}` assignor and this member is configured with `{}`: every member of a group must use the same one",
                self.keys.group(),
                theirs.name(),
                self.assignor.name()
            )));
        }
        Ok(())
    }

    /// Claims the preferred slot if free, else the lowest free one after skipping `skip` free
    /// ones; on success publishes the view with this member in it. Returns whether it claimed.
    pub(super) async fn claim(&mut self, table: &Table, skip: u32) -> Result<bool> {
        let slot = match self.preferred {
            Some(p)
                if skip == 0
                    && !table.slots.contains_key(&p)
                    && !table.foreign.contains_key(&p) =>
            {
                p
            }
            _ => {
                // Skipping past the last free slot below the maximum would call the group full
                // while it is not: the skip wraps around the free slots there are.
                let first = table.lowest_free(0);
                let mut free = 1u32;
                let mut s = first;
                while free <= skip {
                    s = table.lowest_free(s + 1);
                    if s >= self.max_slots {
                        break;
                    }
                    free += 1;
                }
                let skip = skip % free;
                (0..skip).fold(first, |s, _| table.lowest_free(s + 1))
            }
        };
        if slot >= self.max_slots {
            return Err(Error::Rejected {
                backend: self.store.capabilities().backend,
                message: format!(
                    "group `{}` is full: every slot below {} is held",
                    self.keys.group(),
                    self.max_slots
                ),
                source: None,
            });
        }
        self.highest = self.highest.max(table.highest_epoch());
        let record = SlotRecord {
            member: self.member.clone(),
            nonce: rand::random(),
            since_ms: self
                .clock
                .now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            ttl_ms: self.ttl.as_millis() as u64,
            // Holding nothing, it has let go of everything under any view up to this one.
            acked: self.highest,
            view: 0,
        };
        if self.own_nonces.len() >= 64 {
            self.own_nonces.remove(0);
        }
        self.own_nonces.push(record.nonce);
        let sent = self.clock.monotonic();
        let key = self.slot_key(slot);
        if !self
            .store
            .compare_and_set(&key, None, &record.to_string(), Some(self.ttl))
            .await?
        {
            return Ok(false);
        }
        {
            let mut st = self.shared.lock();
            st.holder = Some(record.holder(slot));
            st.deadline = Some(self.deadline(sent));
        }
        self.preferred = Some(slot);
        self.record = Some((slot, record.clone()));
        self.ack = None;
        self.shared.publish(|a| {
            a.slot = Some(slot);
            a.phase = GroupPhase::Joining;
        });
        tracing::info!(group = self.keys.group(), member = %self.member, slot, "claimed a slot");
        let mut table = table.clone();
        table.slots.insert(slot, record);
        self.on_table(&table, true, true).await;
        Ok(true)
    }

    pub(super) fn deadline(&self, sent: Duration) -> Duration {
        sent + self.ttl - self.ttl / 10
    }

    pub(super) async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<()> {
        // However this task ends, a caller waiting on the assignment (`Member::active`) hears
        // of it: a panic (a store or hook that panicked) or an abort publishes `Failed`.
        let _ended = Ended(self.shared.clone());
        let mut next = self.clock.monotonic() + self.heartbeat;
        loop {
            let fast = self.pending_since.is_some()
                || self.record.is_none()
                || self.need_slots
                || self.settling
                || self.last_discrepancy.as_ref().is_some_and(|d| d.fast);
            // Settling polls twice as often: one small read each (the settled mark, or the
            // settling member's listing of the acknowledgements), and it is the last step of
            // every hand-off.
            let step = if self.settling || self.only_settling_awaited() {
                self.heartbeat / 8
            } else {
                self.heartbeat / 4
            };
            let wake = if fast {
                next.min(self.clock.monotonic() + step)
            } else if self.only_watching() {
                // The two lowest slots look at the slot table halfway between heartbeats too:
                // one small call each, two members whatever the group's size.
                next.min(self.clock.monotonic() + self.heartbeat / 2)
            } else {
                next
            };
            // Biased: a fixed order of readiness checks keeps a simulation run reproducible.
            let drained_wake = tokio::select! {
                biased;
                _ = stop.changed() => break,
                _ = self.clock.sleep_until(wake) => false,
                _ = self.shared.released.notified(), if self.pending_since.is_some() => true,
            };
            if *stop.borrow() {
                break;
            }
            if drained_wake {
                // A grant was dropped during a hand-off: acknowledge now if that was the last.
                self.progress(None).await;
                continue;
            }
            let full = self.clock.monotonic() >= next;
            if full {
                next = self.clock.monotonic() + self.heartbeat;
            }
            let span = tracing::debug_span!(
                "group.heartbeat",
                group = self.keys.group(),
                slot = self.record.as_ref().map(|(s, _)| *s),
                full
            );
            let result = if full {
                self.beat().instrument(span).await
            } else if self.only_settling_awaited() {
                self.poll_settled().instrument(span).await
            } else if self.only_watching() {
                self.watch().instrument(span).await
            } else {
                self.beat().instrument(span).await
            };
            if let Err(e) = result {
                if e.kind() == crate::ErrorKind::Rejected {
                    self.fail(&e).await;
                    return Err(e);
                }
            }
        }
        self.leave().await
    }

    /// Whether this member wakes between heartbeats only to watch the slot table (one of the two
    /// lowest slots, nothing else under way). A member alone in its copy of the table does not:
    /// there is no other slot whose expiry it must notice, and a join is seen at its next
    /// heartbeat.
    fn only_watching(&self) -> bool {
        self.change_checks
            && self.watches_slots()
            && self
                .seen
                .as_ref()
                .is_some_and(|(_, table)| table.slots.len() >= 2)
            && self.pending_since.is_none()
            && !self.need_slots
            && !self.settling
            && !self.abandoned
            && self.last_discrepancy.is_none()
    }

    /// A watching wake: one call that renews and answers the slot table only if it changed
    /// since the copy held; a full heartbeat follows only then. Between heartbeats a watcher
    /// thus costs the store one small call, not the two of a heartbeat.
    pub(super) async fn watch(&mut self) -> Result<()> {
        let (Some((slot, record)), Some((since, _))) = (self.record.clone(), self.seen.clone())
        else {
            return self.beat().await;
        };
        let (store, key, text, listing, ttl) = (
            self.store.clone(),
            self.slot_key(slot),
            record.to_string(),
            self.listing.clone(),
            self.ttl,
        );
        let call = store.renew_and_list_if_changed(&key, &text, ttl, &listing, Some(&since));
        match self.before_lapse(call).await {
            Ok(answer) if answer.renewed && answer.version == since => Ok(()),
            Ok(answer) => {
                // Keep what came: the heartbeat that follows reads the view and then asks the
                // slot directory again, which answers "unchanged" unless it changed once more.
                if let (Some(listing), Some((_, held))) = (answer.listing, &self.seen) {
                    let mut table = Table::parse(&self.listing, listing);
                    table.take_view(held);
                    self.seen = Some((answer.version, Arc::new(table)));
                    self.unseen_change = true;
                }
                self.beat().await
            }
            Err(e) => {
                self.set_error(Some(&e));
                Ok(())
            }
        }
    }

    /// Whether all this member awaits between heartbeats is the settled mark of the view it
    /// acknowledged: then it polls that small key instead of renewing and reading the table, so
    /// a hand-off costs it a constant number of table reads however many members acknowledge.
    fn only_settling_awaited(&self) -> bool {
        if self.record.is_none() || self.abandoned || self.settling {
            return false;
        }
        if self.last_discrepancy.as_ref().is_some_and(|d| d.fast) {
            return false;
        }
        let pending = self.shared.lock().pending.clone();
        pending.is_some_and(|p| self.has_acked(&p))
    }

    /// Reads the settled mark: activates the pending view once it is settled, and reads the
    /// table at once when a newer view was settled.
    pub(super) async fn poll_settled(&mut self) -> Result<()> {
        // Like a heartbeat, a poll that hangs past the lease deadline stops all work at that
        // instant, not when the call returns.
        let (store, key) = (self.store.clone(), self.settled_key.clone());
        let text = match self.before_lapse(store.get(&key)).await {
            Ok(text) => text,
            Err(e) => {
                self.set_error(Some(&e));
                return Ok(());
            }
        };
        let Some(mark) = text.as_deref().and_then(SettledRecord::parse) else {
            return Ok(());
        };
        let pending = self.shared.lock().pending.clone();
        let Some(pending) = pending else {
            return Ok(());
        };
        if mark.settles(pending.epoch(), pending.digest) {
            self.settled = Some(mark);
            self.progress(None).await;
            Ok(())
        } else if mark.epoch > pending.epoch() {
            // A newer view was settled: read it, but at most twice a heartbeat, so a burst of
            // views (joins one after another) does not make every member read each one.
            let now = self.clock.monotonic();
            if self
                .last_beat
                .is_some_and(|t| now.saturating_sub(t) < self.heartbeat)
            {
                return Ok(());
            }
            self.beat().await
        } else {
            Ok(())
        }
    }

    /// One heartbeat: renew and read the table, or claim again when the lease is gone.
    pub(super) async fn beat(&mut self) -> Result<()> {
        let now = self.clock.monotonic();
        let expired = self.shared.lock().deadline.is_some_and(|d| now >= d);
        if expired {
            self.revoke("lapsed", "the lease deadline passed without a renewal");
        }
        let Some((slot, record)) = self.record.clone() else {
            let table = match self.list().await {
                Ok(t) => t,
                Err(e) => {
                    self.set_error(Some(&e));
                    return Ok(());
                }
            };
            self.reclaim(&table).await;
            return Ok(());
        };
        if self.abandoned {
            if expired {
                // The lease has run out on our clock: claim afresh.
                self.abandoned = false;
                self.record = None;
            }
            return Ok(());
        }
        let sent = self.clock.monotonic();
        self.beats += 1;
        self.last_beat = Some(sent);
        let store = self.store.clone();
        let (key, text, listing, views, ttl) = (
            self.slot_key(slot),
            record.to_string(),
            self.listing.clone(),
            self.view_listing.clone(),
            self.ttl,
        );
        let result = if !self.change_checks {
            // The view first, then the renewal and the slots (see `list`).
            let call = async {
                let viewed = store.list(&views).await?;
                let (renewed, listed) = store.renew_and_list(&key, &text, ttl, &listing).await?;
                Ok::<_, Error>((viewed, renewed, listed))
            };
            self.before_lapse(call)
                .await
                .map(|(viewed, renewed, listed)| {
                    let mut table = Table::parse(&listing, listed);
                    table.set_view(&views, viewed);
                    (renewed, Arc::new(table), true, true)
                })
        } else {
            let reads_slots = self.reads_slots(slot);
            let view_since = self.view_seen.clone();
            let slot_since = self.seen.as_ref().map(|(v, _)| v.clone());
            // A store that answers both directories' versions in one call: when neither
            // changed (the steady state), that call is the whole heartbeat.
            let both = match (&view_since, &slot_since) {
                (Some(v), Some(s)) if reads_slots && self.one_call_versions => {
                    Some((v.clone(), s.clone()))
                }
                _ => None,
            };
            // The view directory, then (when this member watches it) the slot directory, both
            // renewing the lease and each answering its entries only when they changed.
            let call = async {
                if let Some((v, s)) = &both {
                    let dirs = [
                        (views.as_str(), Some(v.as_str())),
                        (listing.as_str(), Some(s.as_str())),
                    ];
                    let (renewed, versions) =
                        store.renew_and_versions(&key, &text, ttl, &dirs).await?;
                    if renewed && versions.first() == Some(v) && versions.get(1) == Some(s) {
                        return Ok::<_, Error>((
                            RenewedListing::new(true, v.clone(), None),
                            Some(RenewedListing::new(true, s.clone(), None)),
                        ));
                    }
                }
                let viewed = store
                    .renew_and_list_if_changed(&key, &text, ttl, &views, view_since.as_deref())
                    .await?;
                let slots = if reads_slots {
                    Some(
                        store
                            .renew_and_list_if_changed(
                                &key,
                                &text,
                                ttl,
                                &listing,
                                slot_since.as_deref(),
                            )
                            .await?,
                    )
                } else {
                    None
                };
                Ok::<_, Error>((viewed, slots))
            };
            match self.before_lapse(call).await {
                Ok((viewed, slots)) => self.table_of(viewed, slots).await,
                Err(e) => Err(e),
            }
        };
        self.metrics.heartbeat(
            self.clock.monotonic().saturating_sub(sent),
            result.as_ref().err(),
        );
        let result = match result {
            // A renewal refused on a copy of the table: read the table itself to decide.
            Ok((false, _, _, false)) => match self.list().await {
                Ok(table) => Ok((false, Arc::new(table), true, true)),
                Err(e) => Err(e),
            },
            other => other,
        };
        match result {
            Err(e) => {
                self.set_error(Some(&e));
                Ok(())
            }
            Ok((false, table, _, _)) => {
                // A write of ours that reported an error may have been applied after all (an
                // acknowledgement that timed out): the slot then holds our claim with other
                // text. It is still ours; take its text and renew at the next beat.
                if let Some(r) = table.slots.get(&slot) {
                    if r.member == self.member && r.nonce == record.nonce {
                        self.record = Some((slot, r.clone()));
                        return Ok(());
                    }
                }
                self.metrics.heartbeat_failed("lost");
                self.revoke("lost", "the slot was no longer ours at renewal");
                self.record = None;
                self.preferred = Some(slot);
                self.reclaim(&table).await;
                Ok(())
            }
            Ok((true, table, changed, fresh)) => {
                {
                    let mut st = self.shared.lock();
                    st.deadline = Some(self.deadline(sent));
                    st.holder = Some(record.holder(slot));
                }
                self.set_error(None);
                // The same table as at the last beat, an active view (a lapse revokes it: the
                // member adopts the view again), and nothing that waits on time: the table
                // would decide nothing new, so a steady member does constant work.
                let idle = !changed
                    && self.shared.lock().active.is_some()
                    && self.last_discrepancy.is_none()
                    && self.pending_since.is_none()
                    && !self.need_slots
                    && !self.settling
                    && !self.unsettled;
                if idle {
                    return Ok(());
                }
                if fresh {
                    self.check_twin(&table, slot).await?;
                    self.check_legacy(&table)?;
                }
                self.on_table(&table, false, fresh).await;
                Ok(())
            }
        }
    }

    /// The table a heartbeat's answers stand for: the listings they carry, or the copies kept
    /// from the last ones when the store's versions are unchanged. Returns whether the lease was
    /// renewed, the table, whether it differs from the last one, and whether its slots were
    /// read in this heartbeat (after its view), not kept from an earlier one.
    pub(super) async fn table_of(
        &mut self,
        viewed: RenewedListing,
        slots: Option<RenewedListing>,
    ) -> Result<(bool, Arc<Table>, bool, bool)> {
        // The store answered "unchanged" for a version this member does not hold (it asked with
        // the one it holds, so only a faulty store does): read the directory.
        let views = match viewed.listing {
            Some(listing) => Some(listing),
            None if self.view_seen.as_deref() == Some(viewed.version.as_str()) => None,
            None => Some(self.store.list(&self.view_listing).await?),
        };
        let mut renewed = viewed.renewed;
        let fresh = slots.is_some();
        let mut slot_version = self.seen.as_ref().map(|(v, _)| v.clone());
        let mut rebuilt: Option<Table> = None;
        if let Some(answer) = slots {
            renewed = answer.renewed;
            match answer.listing {
                Some(listing) => rebuilt = Some(Table::parse(&self.listing, listing)),
                None if slot_version.as_deref() == Some(answer.version.as_str()) => {}
                None => {
                    let listing = self.store.list(&self.listing).await?;
                    rebuilt = Some(Table::parse(&self.listing, listing));
                }
            }
            slot_version = Some(answer.version);
        }
        // Taken out of `seen`, the copy is usually the only reference to the table, so a new
        // view is set in place instead of on a clone of every slot record.
        let held = self.seen.take().map(|(_, t)| t);
        let (table, changed) = match (rebuilt, held) {
            (None, Some(held)) => match views {
                None => (held, std::mem::take(&mut self.unseen_change)),
                Some(views) => {
                    let mut table = held;
                    Arc::make_mut(&mut table).set_view(&self.view_listing, views);
                    (table, true)
                }
            },
            (rebuilt, held) => {
                // No copy held: `reads_slots` read the slots, unless the store misbehaved.
                let mut table = match rebuilt {
                    Some(t) => t,
                    None => Table::parse(&self.listing, self.store.list(&self.listing).await?),
                };
                match (views, &held) {
                    (Some(views), _) => table.set_view(&self.view_listing, views),
                    (None, Some(held)) => table.take_view(held),
                    (None, None) => {
                        let views = self.store.list(&self.view_listing).await?;
                        table.set_view(&self.view_listing, views);
                    }
                }
                (Arc::new(table), true)
            }
        };
        self.unseen_change = false;
        self.view_seen = Some(viewed.version);
        self.seen = slot_version.map(|v| (v, table.clone()));
        Ok((renewed, table, changed, fresh))
    }

    /// Awaits a store call; if the lease deadline passes first, stops all work at that instant
    /// (the assignment turns `rejoining` then, not when the call finally returns) and goes on
    /// waiting for the call.
    pub(super) async fn before_lapse<T>(
        &mut self,
        call: impl std::future::Future<Output = T>,
    ) -> T {
        let deadline = self.shared.lock().deadline;
        let Some(deadline) = deadline else {
            return call.await;
        };
        tokio::pin!(call);
        tokio::select! {
            biased;
            v = &mut call => return v,
            _ = self.clock.sleep_until(deadline) => {}
        }
        self.revoke(
            "lapsed",
            "the lease deadline passed while a renewal was in flight",
        );
        call.await
    }

    /// Claims again after losing the lease. A full group or a store error is retried at the
    /// next beat, never fatal: the member was in the group a moment ago.
    pub(super) async fn reclaim(&mut self, table: &Table) {
        match self.claim(table, 0).await {
            Ok(_) => self.set_error(None),
            Err(e) => self.set_error(Some(&e)),
        }
    }

    /// A view that names a live claim where earlier versions published views: an older
    /// version of headcount published it after that claim and is running in this group. The
    /// two versions read views in different places and would grant the same keys, so this one
    /// stops. This is a tripwire, not a protocol between versions: the older member may have
    /// granted keys before this member read the slot table (docs/group.md, "Upgrading").
    pub(super) fn check_legacy(&self, table: &Table) -> Result<()> {
        if !table.legacy_member() {
            return Ok(());
        }
        Err(Error::Rejected {
            backend: self.store.capabilities().backend,
            message: format!(
                "group `{}` has a member running an earlier version of headcount (it published a view at `{}`): stop every member and start them all with one version",
                self.keys.group(),
                self.keys.key("slot:view")
            ),
            source: None,
        })
    }

    /// Another live slot with our member id: the holder of the higher slot yields. Claims this
    /// process made before (a write that timed out but was applied, a lease given up) are ours,
    /// not a twin's: they are shortened to expire soon instead.
    pub(super) async fn check_twin(&mut self, table: &Table, slot: u32) -> Result<()> {
        let Some((_, mine)) = &self.record else {
            return Ok(());
        };
        let mine = mine.nonce;
        for (&s, r) in &table.slots {
            if s != slot && r.member == self.member && self.own_nonces.contains(&r.nonce) {
                let short = self.store.capabilities().min_ttl.max(MIN_TTL);
                let text = r.to_string();
                let _ = self
                    .store
                    .compare_and_set(&self.slot_key(s), Some(&text), &text, Some(short))
                    .await;
            }
        }
        match table.slots.iter().find(|(&s, r)| {
            r.member == self.member
                && r.nonce != mine
                && !self.own_nonces.contains(&r.nonce)
                && s < slot
        }) {
            Some((&other, _)) => Err(Error::Rejected {
                backend: self.store.capabilities().backend,
                message: format!(
                    "member id `{}` is also held by slot {other}, a live process: this one (slot {slot}) yields",
                    self.member
                ),
                source: None,
            }),
            None => Ok(()),
        }
    }

    /// Stops all work at once: every grant turns invalid.
    /// Stops all work at once; `reason` is the metric's label (`lapsed`, `lost`), `why` the log's.
    pub(super) fn revoke(&mut self, reason: &'static str, why: &str) {
        let had = {
            let mut st = self.shared.lock();
            let had = st.active.is_some() || st.pending.is_some() || st.deadline.is_some();
            st.generation += 1;
            st.active = None;
            st.pending = None;
            st.skipped.clear();
            st.forget_history();
            st.deadline = None;
            st.in_flight.clear();
            st.share_in_flight = 0;
            had
        };
        self.pending_since = None;
        self.adopted_at = None;
        if had {
            self.metrics.grants_revoked(reason);
            tracing::warn!(group = self.keys.group(), member = %self.member, "{why}: stopped all work");
        }
        self.shared.publish(|a| {
            a.index = None;
            a.phase = GroupPhase::Rejoining;
        });
    }

    /// Publishes a view when the table calls for one, adopts the newest view, and moves the
    /// hand-off along. `fresh` says the slots were read after the view, in this heartbeat: only
    /// then does the member compare them (a copy from an earlier heartbeat may lack claims the
    /// view already names), publish, or settle.
    pub(super) async fn on_table(&mut self, table: &Table, own_change: bool, fresh: bool) {
        let live = table.live();
        let my_slot = self.record.as_ref().map(|(s, _)| *s);
        let mut newest = table.view.clone();
        // The floor counts the acknowledgements too: a member that never saw the view (it was
        // lost or overwritten) still must not publish an epoch some member already acted on.
        let floor = self.highest.max(table.highest_epoch());
        // A view with the epoch this member works towards but other holders: a store that lost
        // writes minted that epoch twice. Equal tokens would pass every fence, so it is
        // replaced by a view above both.
        let twin_epoch = {
            let mut st = self.shared.lock();
            let twin = match (st.target(), &table.view) {
                (Some(t), Some(v)) => t.epoch() == v.epoch && t.record().holders != v.holders,
                _ => false,
            };
            if let (true, Some(v)) = (twin, &table.view) {
                st.break_runs_at(v.epoch);
            }
            // An acknowledgement of one of this member's epochs under another view's digest is
            // the same sign, left by a member that adopted the twin (which may already be
            // replaced by a view above both).
            if fresh {
                let mine: HashMap<u64, u64> =
                    st.history.iter().map(|v| (v.epoch(), v.digest())).collect();
                let twins: Vec<u64> = table
                    .slots
                    .values()
                    .filter(|r| r.view != 0)
                    .filter_map(|r| {
                        mine.get(&r.acked)
                            .is_some_and(|d| *d != r.view)
                            .then_some(r.acked)
                    })
                    .collect();
                for e in twins {
                    st.break_runs_at(e);
                }
            }
            twin
        };
        let stale = match &table.view {
            Some(v) => v.holders != live || v.epoch < floor || twin_epoch,
            None => true,
        };
        self.highest = floor;
        if fresh {
            self.need_slots = false;
        } else {
            // A view that went back, is missing or took this member's epoch needs a view above
            // it, which only a member that read the slots publishes: read them at the next beat.
            self.need_slots = table
                .view
                .as_ref()
                .is_none_or(|v| v.epoch < floor || twin_epoch);
        }
        if !fresh {
            // Adopt the published view as it is; what the slots call for is decided by the
            // members that read them.
        } else if stale {
            let lowest = live.first().map(|h| h.slot) == my_slot && my_slot.is_some();
            let now = self.clock.monotonic();
            let since = match &self.last_discrepancy {
                Some(d) if d.live == live => d.since,
                _ => now,
            };
            // A slot of the view is gone (a crash, a lapse): every member watches closely, in
            // case the lowest slot is the one gone. New claims alone publish their own view.
            let fast = lowest
                || table.view.as_ref().is_none_or(|v| {
                    v.holders
                        .iter()
                        .any(|h| table.slots.get(&h.slot).is_none_or(|r| r.nonce != h.nonce))
                });
            let again = now.saturating_sub(since) >= self.heartbeat;
            if self.highest >= MAX_EPOCH {
                let e = Error::foreign(
                    &self.view_key,
                    "an epoch below the largest one (a view or acknowledgement holds it: stop every member and delete the group's keys to start again)",
                    &self.highest.to_string(),
                );
                self.set_error(Some(&e));
                self.last_discrepancy = Some(Discrepancy { live, since, fast });
            } else if own_change || lowest || again {
                let next = ViewRecord {
                    epoch: self.highest.saturating_add(1),
                    holders: live.clone(),
                    assignor: Some(self.assignor),
                };
                match self
                    .store
                    .compare_and_set(
                        &self.view_key,
                        table.view_text.as_deref(),
                        &next.to_string(),
                        None,
                    )
                    .await
                {
                    Ok(true) => {
                        tracing::info!(group = self.keys.group(), member = %self.member, epoch = next.epoch, live = next.holders.len(), "published a view");
                        // As after settling: the next beat reads the table this write changed.
                        self.forget_seen();
                        self.published = Some(next.epoch);
                        self.highest = next.epoch;
                        newest = Some(next);
                        self.last_discrepancy = None;
                    }
                    // Someone else changed the view since this listing (or the reply was lost):
                    // the view in the listing is stale, so adopt nothing and list again at the
                    // next (quarter-heartbeat) beat.
                    Ok(false) => {
                        newest = None;
                        self.last_discrepancy = Some(Discrepancy { live, since, fast });
                    }
                    Err(e) => {
                        newest = None;
                        self.set_error(Some(&e));
                        self.last_discrepancy = Some(Discrepancy { live, since, fast });
                    }
                }
            } else {
                self.last_discrepancy = Some(Discrepancy { live, since, fast });
            }
        } else {
            self.last_discrepancy = None;
        }
        if let Some(v) = newest {
            self.adopt(v);
        }
        self.settled = table.settled;
        // Compared by digest too: after a rollback one epoch can stand for two views, and a mark
        // for the other one settles nothing here.
        self.unsettled = table.view.as_ref().is_some_and(|v| {
            self.settled
                .is_none_or(|m| m.epoch < v.epoch || (m.epoch == v.epoch && m.view != v.digest()))
        });
        // Other slots' records count as acknowledgements only when read after the view.
        let fresh_table = fresh.then_some(table);
        self.progress(fresh_table).await;
        if fresh && self.settle(table).await {
            self.unsettled = false;
            self.progress(fresh_table).await;
        }
        self.reassert(table).await;
        // A view this member just published is not in this table yet: poll (reading the
        // table, then the acknowledgements) until it is settled.
        if self
            .published
            .is_some_and(|e| table.view.as_ref().is_none_or(|v| v.epoch < e))
        {
            self.settling = true;
        }
    }

    /// Settles the published view when this member's slot is the lowest live one (or, as a
    /// fallback for a lowest slot that does not, when its own hand-off has waited two
    /// heartbeats, at most once a heartbeat): reads the acknowledgements and, once every live
    /// slot acknowledged the view, writes the settled mark the others poll. Returns whether it
    /// wrote it.
    pub(super) async fn settle(&mut self, table: &Table) -> bool {
        self.settling = false;
        let Some((own, _)) = self.record.clone() else {
            return false;
        };
        if self.abandoned {
            return false;
        }
        let Some(view) = &table.view else {
            return false;
        };
        let target = self.shared.lock().target().cloned();
        let Some(target) = target.filter(|t| t.epoch() == view.epoch) else {
            return false;
        };
        let (epoch, digest) = (target.epoch(), target.digest);
        if self
            .settled
            .is_some_and(|m| m.epoch > epoch || m.settles(epoch, digest))
        {
            self.stalled_since = None;
            return false;
        }
        // The same epoch for other holders: a store that lost writes minted it twice, and
        // `on_table` replaces it.
        if target.record().holders != view.holders || !self.has_acked(&target) {
            return false;
        }
        let now = self.clock.monotonic();
        let lowest = table.slots.keys().next() == Some(&own);
        let publisher = self.published == Some(epoch);
        self.settling = lowest || publisher;
        let fallback = self
            .adopted_at
            .is_some_and(|t| now.saturating_sub(t) >= 2 * self.heartbeat)
            && self
                .acks_read
                .is_none_or(|t| now.saturating_sub(t) >= self.heartbeat);
        if !lowest && !publisher && !fallback {
            return false;
        }
        self.acks_read = Some(now);
        let acks = match self.store.list(&self.ack_listing).await {
            Ok(listing) => parse_acks(&self.ack_listing, listing),
            Err(e) => {
                self.set_error(Some(&e));
                return false;
            }
        };
        // An acknowledgement above the published view (the store lost the view it acknowledged)
        // raises the floor of the next epoch this member publishes.
        let acked = acks.values().map(|a| a.acked).max().unwrap_or(0);
        self.highest = self.highest.max(acked);
        // This member's own acknowledgement is what it did, whatever the store kept of it.
        let all = table
            .slots
            .keys()
            .all(|&s| s == own || table.slot_acked(s, &acks, epoch, digest));
        if !all {
            if self.settling {
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
                &self.settled_key,
                table.settled_text.as_deref(),
                &mark.to_string(),
                None,
            )
            .await
        {
            Ok(true) => {
                tracing::debug!(group = self.keys.group(), member = %self.member, epoch, "every live slot acknowledged the view: settled it");
                // Read the table at the next beat even if its version is the one held: a
                // store that rolls back to exactly that table must not leave this member
                // believing its write stuck.
                self.forget_seen();
                self.settled = Some(mark);
                self.settling = false;
                self.stalled_since = None;
                true
            }
            // Changed since the listing: read again at the next beat.
            Ok(false) => false,
            Err(e) => {
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
        let (Some(view), Some((slot, record))) = (&table.view, self.record.clone()) else {
            return;
        };
        let digest = view.digest();
        if self.abandoned
            || self
                .settled
                .is_some_and(|m| m.epoch > view.epoch || m.settles(view.epoch, digest))
        {
            return;
        }
        let Some((ack, _, written)) = self.ack.clone() else {
            return;
        };
        let stale = self.clock.monotonic().saturating_sub(written) >= self.heartbeat;
        if ack.nonce == record.nonce && ack.has_acked_digest(view.epoch, digest) && stale {
            self.write_ack(slot, ack).await;
        }
    }

    /// Makes `view` the pending view when it is newer than what the member has.
    pub(super) fn adopt(&mut self, view: ViewRecord) {
        let current = {
            let st = self.shared.lock();
            st.target().map(|v| v.epoch())
        };
        if current.is_some_and(|e| e >= view.epoch) {
            return;
        }
        let state = match ViewState::build(view, self.assignor) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                self.set_error(Some(&e));
                return;
            }
        };
        let has_active = {
            let mut st = self.shared.lock();
            if let Some(old) = st.pending.replace(state.clone()) {
                st.skipped.push(old);
            }
            st.remember(state);
            st.active.is_some()
        };
        let now = self.clock.monotonic();
        if self.pending_since.is_none() {
            self.pending_since = Some(now);
        }
        self.adopted_at = Some(now);
        self.shared.publish(|a| {
            a.phase = if has_active {
                GroupPhase::Handoff
            } else {
                GroupPhase::Joining
            }
        });
    }

    /// Acknowledges the pending epoch once drained, and activates it once the others have (or
    /// right away when the live slots did not change, so nothing moves to this member). With no
    /// table (woken by a dropped grant) it only acknowledges.
    pub(super) async fn progress(&mut self, table: Option<&Table>) {
        let pending = self.shared.lock().pending.clone();
        // An acknowledgement the store lost is written again by `reassert`.
        if pending.is_none() {
            return;
        }
        let (pending, drained, same_holders) = {
            let st = self.shared.lock();
            let Some(p) = st.pending.clone() else {
                return;
            };
            // Nothing moves to or from this member when the holders stayed the same, unless a
            // view in between moved something away and back (then another member may have
            // started it: wait for everyone's acknowledgement).
            let same = match (&st.active, st.holder) {
                (Some(a), Some(h)) => {
                    st.skipped.is_empty() && a.same_holders(&p) && p.pair_of(h).is_some()
                }
                _ => false,
            };
            (p, st.drained(), same)
        };
        let epoch = pending.epoch();
        if !drained {
            let since = self.pending_since.unwrap_or_else(|| self.clock.monotonic());
            if self.clock.monotonic().saturating_sub(since) > self.drain_timeout && !self.abandoned
            {
                tracing::warn!(group = self.keys.group(), member = %self.member, epoch, "grants did not drain within the drain timeout: giving up the lease");
                self.abandoned = true;
            }
            return;
        }
        let Some((slot, record)) = self.record.clone() else {
            return;
        };
        if self.abandoned {
            return;
        }
        if !self.has_acked(&pending) && !self.acknowledge(&pending).await {
            return;
        }
        // Settled: every slot live when the settling member read the acknowledgements had
        // acknowledged (a slot claimed since holds nothing from before). Members that still
        // acknowledge in their slot records (a fresh claim; an earlier version of headcount)
        // are read from the table directly.
        let settled = self
            .settled
            .is_some_and(|m| m.settles(epoch, pending.digest));
        let others_acked = table.is_some_and(|t| {
            t.slots
                .iter()
                .all(|(&s, r)| s == slot || pending.acked_by(r))
        });
        if same_holders || settled || others_acked {
            self.activate(pending, record.holder(slot));
        }
    }

    /// A hand-off stalled for three TTLs on a slot that has not acknowledged: re-applies that
    /// slot's own lease TTL to it, once per claim and epoch, with a compare-and-set that keeps
    /// its exact stored text. A live holder renews within a third of its TTL anyway, so this
    /// changes nothing for it; a record that has no expiry (restored by a tool that drops TTLs,
    /// written by hand) expires after that TTL, and the group proceeds without it instead of
    /// waiting forever. Only a settling member (the lowest live slot, the view's publisher) does it, at most
    /// [`NUDGES_PER_BEAT`] slots per beat, so a large group in churn does not write O(n²).
    pub(super) async fn expire_stalled(
        &mut self,
        table: &Table,
        acks: &BTreeMap<u32, AckRecord>,
        pending: &ViewState,
        own: u32,
    ) {
        let (epoch, digest) = (pending.epoch(), pending.digest);
        let now = self.clock.monotonic();
        let since = match self.stalled_since {
            Some((e, t)) if e == epoch => t,
            _ => {
                self.stalled_since = Some((epoch, now));
                now
            }
        };
        if now.saturating_sub(since) < self.ttl * 3 {
            return;
        }
        let stalled: Vec<(u32, SlotRecord)> = table
            .slots
            .iter()
            .filter(|(&s, r)| {
                s != own
                    && !table.slot_acked(s, acks, epoch, digest)
                    && !self.nudged.contains(&(s, r.nonce, epoch))
            })
            .take(NUDGES_PER_BEAT)
            .map(|(&s, r)| (s, r.clone()))
            .collect();
        for (s, r) in stalled {
            let key = self.slot_key(s);
            // The exact stored text: a record written by hand may parse to the same claim with
            // other spacing or digits, which a re-serialized one would not match.
            let text = match self.store.get(&key).await {
                Ok(Some(text)) if SlotRecord::parse(&text).as_ref() == Some(&r) => text,
                Ok(_) => {
                    // Changed or gone since the listing: nothing to do for this claim.
                    self.nudged.push((s, r.nonce, epoch));
                    continue;
                }
                Err(e) => {
                    self.set_error(Some(&e));
                    return;
                }
            };
            let ttl = Duration::from_millis(r.ttl_ms).clamp(MIN_TTL, MAX_TTL);
            match self
                .store
                .compare_and_set(&key, Some(&text), &text, Some(ttl))
                .await
            {
                Ok(applied) => {
                    self.nudged.push((s, r.nonce, epoch));
                    if applied {
                        tracing::warn!(group = self.keys.group(), member = %self.member, slot = s, epoch, "slot has not acknowledged for three TTLs: re-applied its lease TTL, so a record without expiry does not stall the group");
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
        if self.nudged.len() > 4 * table.slots.len() + 16 {
            self.nudged.retain(|&(_, _, e)| e == epoch);
        }
    }

    /// Writes the acknowledgement of `view` (`hc:{group}:ack:{slot}`). Returns whether it did.
    pub(super) async fn acknowledge(&mut self, view: &ViewState) -> bool {
        let Some((slot, record)) = self.record.clone() else {
            return false;
        };
        let ack = AckRecord {
            nonce: record.nonce,
            acked: view.epoch(),
            view: view.digest,
        };
        self.write_ack(slot, ack).await
    }

    /// Stores `ack` at the slot's acknowledgement key, replacing whatever is there (only this
    /// slot's holder writes it; an earlier claim's acknowledgement counts for nothing). Returns
    /// whether it did.
    pub(super) async fn write_ack(&mut self, slot: u32, ack: AckRecord) -> bool {
        let key = self.ack_key(slot);
        let text = ack.to_string();
        let ttl = (self.ttl * ACK_TTLS).min(MAX_TTL);
        let sent = self.clock.monotonic();
        let mut expected = self
            .ack
            .as_ref()
            .filter(|(a, _, _)| a.nonce == ack.nonce)
            .map(|(_, t, _)| t.clone());
        // Two tries: what this member last wrote, then what the store holds (an earlier claim's
        // acknowledgement, or none when the store lost ours).
        for _ in 0..2 {
            match self
                .store
                .compare_and_set(&key, expected.as_deref(), &text, Some(ttl))
                .await
            {
                Ok(true) => {
                    self.ack = Some((ack, text, sent));
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
        if let Some(since) = self.pending_since {
            self.metrics
                .handoff(self.clock.monotonic().saturating_sub(since));
        }
        self.pending_since = None;
        self.adopted_at = None;
        let slot = holder.slot;
        let pair = view.pair_of(holder);
        let live: Vec<u32> = view.record.slots().collect();
        self.metrics.view_changed(view.epoch(), live.len());
        // A view that names a holder the previous one did not (a join, a replacement) takes
        // keys from the members that held them: count it as moving this member's keys away
        // when it held a share before.
        if let Some(old) = from.as_ref().filter(|old| old.pair_of(holder).is_some()) {
            if view
                .record
                .holders
                .iter()
                .any(|h| !old.record.holders.contains(h))
            {
                self.metrics.grants_revoked("moved");
            }
        }
        tracing::info!(group = self.keys.group(), member = %self.member, epoch = view.epoch(), slot, index = ?pair.map(|p| p.0), replicas = live.len(), "view active");
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
            holder,
        });
    }

    /// Ends with an error: leaves the slot to others and reports.
    pub(super) async fn fail(&mut self, e: &Error) {
        tracing::error!(group = self.keys.group(), member = %self.member, "{e}");
        let _ = self.leave().await;
        let msg = e.to_string();
        self.shared.publish(|a| {
            a.phase = GroupPhase::Failed;
            a.last_error = Some(msg);
        });
    }

    /// Stops granting, drains, deletes the slot and publishes the view without it.
    pub(super) async fn leave(&mut self) -> Result<()> {
        self.shared.lock().leaving = true;
        let give_up = self.clock.monotonic() + self.drain_timeout;
        let drained = loop {
            let busy = {
                let st = self.shared.lock();
                st.in_flight.values().any(|&(n, _)| n > 0) || st.share_in_flight > 0
            };
            if !busy {
                break true;
            }
            if self.clock.monotonic() >= give_up {
                tracing::warn!(group = self.keys.group(), member = %self.member, "grants still in flight after the drain timeout: leaving the lease to expire instead of deleting the slot");
                break false;
            }
            tokio::select! {
                biased;
                _ = self.shared.released.notified() => {}
                _ = self.clock.sleep(self.heartbeat / 4) => {}
            }
        };
        let mut result = Ok(());
        if let Some((slot, record)) = self.record.take() {
            let key = self.slot_key(slot);
            let text = record.to_string();
            // Delete only our own claim (one atomic compare-and-delete, so a delayed delete
            // never removes the next holder's claim), and only once nothing is in flight: with
            // grants still out, the others must wait for the lease to expire, not for a delete.
            if drained {
                if let Err(e) = self.store.compare_and_delete(&key, &text).await {
                    result = Err(e);
                }
            }
            if result.is_ok() {
                if let Ok(table) = self.list().await {
                    let live = table.live();
                    let stale = table.view.as_ref().is_none_or(|v| v.holders != live);
                    if stale
                        && self.highest.max(table.highest_epoch()) < MAX_EPOCH
                        && table
                            .view
                            .as_ref()
                            .is_some_and(|v| v.slots().any(|s| s == slot))
                    {
                        let epoch = self.highest.max(table.highest_epoch()).saturating_add(1);
                        let next = ViewRecord {
                            epoch,
                            holders: live,
                            assignor: Some(self.assignor),
                        };
                        let _ = self
                            .store
                            .compare_and_set(
                                &self.view_key,
                                table.view_text.as_deref(),
                                &next.to_string(),
                                None,
                            )
                            .await;
                    }
                }
            }
            tracing::info!(group = self.keys.group(), member = %self.member, slot, "left the group");
        }
        {
            let mut st = self.shared.lock();
            st.generation += 1;
            st.active = None;
            st.pending = None;
            st.skipped.clear();
            st.forget_history();
            st.deadline = None;
            st.holder = None;
        }
        self.metrics.grants_revoked("left");
        self.metrics.members_live(0);
        self.shared.publish(|a| {
            a.slot = None;
            a.index = None;
            a.phase = GroupPhase::Stopped;
        });
        result
    }
}

/// Publishes `Failed` when the heartbeat task ends without having published `Stopped` or
/// `Failed` itself: it panicked, or it was aborted (every handle dropped). The assignment's
/// sender lives in the member's shared state, so its receivers would otherwise wait forever.
struct Ended(Arc<Shared>);

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
