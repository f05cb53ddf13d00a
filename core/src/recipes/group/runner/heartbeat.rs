//! A full heartbeat (renew, and read what changed), a watching wake between heartbeats, a poll
//! of the settled mark, and the table their answers stand for.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::super::records::SettledRecord;
use super::super::table::SlotTable;
use super::super::view::ViewState;
use super::decide::lists_before_dropping;
use super::round::Round;
use super::{Claim, Engine, Runner, SlotsSeen};
use crate::error::{Error, Result};
use crate::store::RenewedListing;

/// What a heartbeat heard from the store.
pub(super) struct Heard {
    /// Whether the lease was renewed.
    renewed: bool,
    /// The table the answers stand for.
    table: Arc<SlotTable>,
    /// Whether it differs from the last one.
    changed: bool,
    /// Whether its slots were read in this heartbeat, after its view (not kept from an earlier
    /// one): only then may the member compare them with the view, publish or settle.
    fresh: bool,
    /// Whether its slots came from a listing in this heartbeat, not from the copy held (which
    /// the store's version said was still current).
    listed: bool,
}

impl Heard {
    /// A table read whole in this heartbeat.
    fn listed(renewed: bool, table: SlotTable) -> Heard {
        Heard {
            renewed,
            table: Arc::new(table),
            changed: true,
            fresh: true,
            listed: true,
        }
    }
}

impl Runner {
    /// One heartbeat: renew and read the table, or claim again when the lease is gone. The
    /// engine decides what it does ([`Engine::open_beat`], [`Engine::relist`],
    /// [`Engine::on_heard`]); this makes the calls.
    pub(super) async fn beat(&mut self) -> Result<()> {
        let (claim, sent) = match self.open_beat() {
            Opening::Nothing => return Ok(()),
            Opening::Claim => {
                let sent = self.cfg.clock.monotonic();
                return match self.list().await {
                    Ok(table) => {
                        self.store_answered(sent);
                        self.reclaim(&table).await
                    }
                    Err(e) => {
                        self.beat_failed(&e);
                        Ok(())
                    }
                };
            }
            Opening::Renew { claim, sent } => (claim, sent),
        };
        let result = if self.cfg.change_checks {
            self.renew_and_read_changes(claim.slot, &claim.record.to_string())
                .await
        } else {
            self.renew_and_read_all(claim.slot, &claim.record.to_string())
                .await
        };
        self.cfg.metrics.heartbeat(
            self.cfg.clock.monotonic().saturating_sub(sent),
            result.as_ref().err(),
        );
        let result = match result {
            Ok(heard) => match self.relist(&heard) {
                Some(renewed) => self.list().await.map(|t| Heard::listed(renewed, t)),
                None => Ok(heard),
            },
            Err(e) => Err(e),
        };
        let heard = match result {
            Ok(heard) => heard,
            Err(e) => {
                self.beat_failed(&e);
                return Ok(());
            }
        };
        self.store_answered(sent);
        match self.on_heard(&claim, sent, &heard) {
            Closing::Done => Ok(()),
            Closing::Reclaim => self.reclaim(&heard.table).await,
            Closing::Round => {
                if heard.fresh {
                    self.check_twin(&heard.table, claim.slot).await?;
                }
                self.check_view_assignor(&heard.table)?;
                self.run_round(Round::of_table(heard.table.clone(), false, heard.fresh))
                    .await;
                Ok(())
            }
        }
    }

    /// A heartbeat without change checks: the view directory first, then the renewal and the
    /// slots (see [`Runner::list`]), every listing read whole.
    async fn renew_and_read_all(&mut self, slot: u32, text: &str) -> Result<Heard> {
        let (store, key, ttl) = (
            self.store.clone(),
            self.cfg.layout.slot(slot),
            self.cfg.slot_ttl,
        );
        let (views_dir, slots_dir) = (self.cfg.layout.views.clone(), self.cfg.layout.slots.clone());
        let held = self.held_views();
        let layout = self.engine.cfg.layout.clone();
        let record_cost = self.cfg.change_record_cost;
        let call = async {
            let viewed = store.list(&views_dir).await?;
            let (renewed, listed) = store.renew_and_list(&key, text, ttl, &slots_dir).await?;
            let mut table = SlotTable::parse(&slots_dir, listed);
            table.set_view(&views_dir, viewed);
            let resolved = table
                .resolve(&store, &layout, &held.views(), record_cost)
                .await?;
            Ok::<_, Error>((Heard::listed(renewed, table), resolved))
        };
        let (heard, resolved) = self.before_lapse(call).await?;
        if resolved {
            return Ok(heard);
        }
        // The long view's snapshot went with a newer view published meanwhile: read again.
        Ok(Heard::listed(heard.renewed, self.list().await?))
    }

    /// A heartbeat with change checks: the view directory, then (when this member watches it)
    /// the slot directory, both renewing the lease and each answering its entries only when
    /// they changed since the copy held.
    async fn renew_and_read_changes(&mut self, slot: u32, text: &str) -> Result<Heard> {
        let reads_slots = self.facts().reads_slots(slot);
        let store = self.store.clone();
        let (key, ttl) = (self.cfg.layout.slot(slot), self.cfg.slot_ttl);
        let (views_dir, slots_dir) = (self.cfg.layout.views.clone(), self.cfg.layout.slots.clone());
        let view_since = self.cache.view_version.clone();
        let slot_since = self.cache.slots.as_ref().map(|s| s.version.clone());
        // A store that answers both directories' versions in one call: when neither changed
        // (the steady state), that call is the whole heartbeat.
        let both = match (&view_since, &slot_since) {
            (Some(v), Some(s)) if reads_slots && self.cfg.one_call_versions => {
                Some((v.clone(), s.clone()))
            }
            _ => None,
        };
        let call = async {
            if let Some((v, s)) = &both {
                let dirs = [
                    (views_dir.as_str(), Some(v.as_str())),
                    (slots_dir.as_str(), Some(s.as_str())),
                ];
                let (renewed, versions) = store.renew_and_versions(&key, text, ttl, &dirs).await?;
                if renewed && versions.first() == Some(v) {
                    // The view is unchanged: the slots alone are listed if they changed, after
                    // the view's version was read, so the table's slots are still newer than
                    // its view.
                    let slots = if versions.get(1) == Some(s) {
                        RenewedListing::new(true, s.clone(), None)
                    } else {
                        store
                            .renew_and_list_if_changed(&key, text, ttl, &slots_dir, Some(s))
                            .await?
                    };
                    return Ok::<_, Error>((
                        RenewedListing::new(true, v.clone(), None),
                        Some(slots),
                    ));
                }
            }
            let viewed = store
                .renew_and_list_if_changed(&key, text, ttl, &views_dir, view_since.as_deref())
                .await?;
            let slots = if reads_slots {
                Some(
                    store
                        .renew_and_list_if_changed(
                            &key,
                            text,
                            ttl,
                            &slots_dir,
                            slot_since.as_deref(),
                        )
                        .await?,
                )
            } else {
                None
            };
            Ok::<_, Error>((viewed, slots))
        };
        let (viewed, slots) = self.before_lapse(call).await?;
        self.table_of(viewed, slots).await
    }

    /// The table a heartbeat's answers stand for: the listings they carry, or the copies kept
    /// from the last ones when the store's versions are unchanged.
    async fn table_of(
        &mut self,
        viewed: RenewedListing,
        slots: Option<RenewedListing>,
    ) -> Result<Heard> {
        // The view directory did not come with the answer, and the member holds no copy of it
        // to go on with: the store answered "unchanged" for a version this member does not hold
        // (it asked with the one it holds, so only a faulty store does), or the copy went with
        // the table's (dropped for a whole read). Read the table whole, the view first: reading
        // the view alone now would pair it with slots read before it, and every decision on a
        // table assumes its slots were read after its view (a view published in between may
        // name claims the slots lack, and a member paused between the two reads would publish
        // a view from slots older than the view it replaces).
        // Only a view that came with the answer may need resolving.
        let held_views = viewed.listing.is_some().then(|| self.held_views());
        let kept = self.cache.view_version.as_deref() == Some(viewed.version.as_str())
            && self.cache.slots.is_some();
        if viewed.listing.is_none() && !kept {
            let renewed = slots.as_ref().map_or(viewed.renewed, |s| s.renewed);
            self.forget_seen();
            self.cache.slots = None;
            return Ok(Heard::listed(renewed, self.list().await?));
        }
        let dirs = &self.engine.cfg.layout;
        let views = viewed.listing;
        let mut renewed = viewed.renewed;
        let fresh = slots.is_some();
        let mut slot_version = self.cache.slots.as_ref().map(|s| s.version.clone());
        let mut rebuilt: Option<SlotTable> = None;
        if let Some(answer) = slots {
            renewed = answer.renewed;
            match answer.listing {
                Some(listing) => rebuilt = Some(SlotTable::parse(&dirs.slots, listing)),
                None if slot_version.as_deref() == Some(answer.version.as_str()) => {}
                None => {
                    let listing = self.store.list(&dirs.slots).await?;
                    rebuilt = Some(SlotTable::parse(&dirs.slots, listing));
                }
            }
            slot_version = Some(answer.version);
        }
        // Taken out of the cache, the copy is usually the only reference to the table, so a new
        // view is set in place instead of on a clone of every slot record.
        let held = self.engine.cache.slots.take().map(|s| s.table);
        // With no copy held, the slots are listed below whatever the store answered.
        let listed = rebuilt.is_some() || held.is_none();
        let (table, changed) = match (rebuilt, held) {
            (None, Some(held)) => match views {
                None => (held, std::mem::take(&mut self.engine.cache.unseen_change)),
                Some(views) => {
                    let mut table = held;
                    Arc::make_mut(&mut table).set_view(&dirs.views, views);
                    (table, true)
                }
            },
            (rebuilt, held) => {
                // No copy held: `reads_slots` read the slots, unless the store misbehaved.
                let mut table = match rebuilt {
                    Some(t) => t,
                    None => SlotTable::parse(&dirs.slots, self.store.list(&dirs.slots).await?),
                };
                match (views, &held) {
                    (Some(views), _) => table.set_view(&dirs.views, views),
                    (None, Some(held)) => table.take_view(held),
                    // Ruled out above: with no listing of the view, a copy is held.
                    (None, None) => {}
                }
                (Arc::new(table), true)
            }
        };
        // A long view's header: resolved from the views held by its changes, or from its
        // snapshot; when that is gone (a newer view replaced it meanwhile), read the table whole.
        let mut table = table;
        if table.view_header.is_some() && table.view.is_none() {
            let held = held_views.as_ref().map(|h| h.views()).unwrap_or_default();
            let t = Arc::make_mut(&mut table);
            if !t
                .resolve(
                    &self.store,
                    &self.engine.cfg.layout,
                    &held,
                    self.engine.cfg.change_record_cost,
                )
                .await?
            {
                self.forget_seen();
                self.cache.slots = None;
                return Ok(Heard::listed(renewed, self.list().await?));
            }
        }
        self.cache.unseen_change = false;
        self.cache.view_version = Some(viewed.version);
        self.cache.slots = slot_version.map(|version| SlotsSeen {
            version,
            table: table.clone(),
        });
        Ok(Heard {
            renewed,
            table,
            changed,
            fresh,
            listed,
        })
    }

    /// A watching wake: one call that renews and answers the slot table only if it changed
    /// since the copy held; a full heartbeat follows only then. Between heartbeats a watcher
    /// thus costs the store one small call, not the two of a heartbeat.
    pub(super) async fn watch(&mut self) -> Result<()> {
        let (Some(claim), Some(seen)) = (self.claims.current.clone(), self.cache.slots.clone())
        else {
            return self.beat().await;
        };
        let (store, key, text, ttl) = (
            self.store.clone(),
            self.cfg.layout.slot(claim.slot),
            claim.record.to_string(),
            self.cfg.slot_ttl,
        );
        let slots_dir = self.cfg.layout.slots.clone();
        let call =
            store.renew_and_list_if_changed(&key, &text, ttl, &slots_dir, Some(&seen.version));
        match self.before_lapse(call).await {
            Ok(answer) if answer.renewed && answer.version == seen.version => Ok(()),
            Ok(answer) => {
                // Keep what came: the heartbeat that follows reads the view and then asks the
                // slot directory again, which answers "unchanged" unless it changed once more.
                if let (Some(listing), Some(held)) = (answer.listing, &self.cache.slots) {
                    let mut table = SlotTable::parse(&self.cfg.layout.slots, listing);
                    table.take_view(&held.table);
                    self.cache.slots = Some(SlotsSeen {
                        version: answer.version,
                        table: Arc::new(table),
                    });
                    self.cache.unseen_change = true;
                }
                self.beat().await
            }
            Err(e) => {
                self.set_error(Some(&e));
                Ok(())
            }
        }
    }

    /// Reads the settled mark: activates the pending view once it is settled, and reads the
    /// table at once when a newer view was settled.
    pub(super) async fn poll_settled(&mut self) -> Result<()> {
        // Like a heartbeat, a poll that hangs past the lease deadline stops all work at that
        // instant, not when the call returns.
        let (store, key) = (self.store.clone(), self.cfg.layout.settled.clone());
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
        let Some(pending) = self.pending() else {
            return Ok(());
        };
        if mark.settles(pending.epoch(), pending.digest) {
            self.cache.settled = Some(mark);
            self.run_round(Round::progress()).await;
            Ok(())
        } else if mark.epoch > pending.epoch() {
            // A newer view was settled: read it, but at most twice a heartbeat, so a burst of
            // views (joins one after another) does not make every member read each one.
            let now = self.cfg.clock.monotonic();
            if self
                .cache
                .last_beat
                .is_some_and(|t| now.saturating_sub(t) < self.cfg.heartbeat)
            {
                return Ok(());
            }
            self.beat().await
        } else {
            Ok(())
        }
    }

    /// Awaits a store call; if the lease deadline passes first, stops all work at that instant
    /// (the assignment turns `rejoining` then, not when the call finally returns) and goes on
    /// waiting for the call.
    pub(super) async fn before_lapse<T>(&mut self, call: impl Future<Output = T>) -> T {
        let deadline = self.shared.lock().deadline;
        let Some(deadline) = deadline else {
            return call.await;
        };
        tokio::pin!(call);
        tokio::select! {
            biased;
            v = &mut call => return v,
            _ = self.cfg.clock.sleep_until(deadline) => {}
        }
        self.revoke(
            "lapsed",
            "the lease deadline passed while a renewal was in flight",
        );
        call.await
    }
}

impl Engine {
    /// A heartbeat met a store error: the first of a run remembers when, and the view the
    /// member worked towards then.
    fn store_failed(&mut self) {
        if self.outage.failing_since.is_some() {
            return;
        }
        self.outage.failing_since = Some(self.cfg.clock.monotonic());
        // The view it works towards, else the one last read (built only then: for a large
        // declared set that is the whole assignment).
        self.outage.last_view = self.target().or_else(|| {
            let view = self.cache.slots.as_ref()?.table.view.clone()?;
            ViewState::build_with(view, self.cfg.assignor, self.cfg.declared.as_ref())
                .ok()
                .map(Arc::new)
        });
    }

    /// A heartbeat sent at `sent` reached the store. After failures for a heartbeat or more,
    /// leases may have run out in the store meanwhile, the others' as well as this
    /// member's: the outage grace starts ([`GroupConfig::with_outage_grace`]).
    ///
    /// [`GroupConfig::with_outage_grace`]: super::super::GroupConfig::with_outage_grace
    fn store_answered(&mut self, sent: Duration) {
        let Some(since) = self.outage.failing_since.take() else {
            return;
        };
        // From the first failure: one failed call answered at the next try is no outage.
        let away = sent.saturating_sub(since);
        if away < self.cfg.heartbeat || self.cfg.outage_grace.is_zero() {
            self.outage.last_view = None;
            return;
        }
        let now = self.cfg.clock.monotonic();
        self.outage.grace_until = Some(now + self.cfg.outage_grace);
        tracing::info!(group = self.cfg.layout.group(), member = %self.cfg.member, away = ?away, grace = ?self.cfg.outage_grace, "the store answers again: waiting up to the outage grace for the members of the last view to claim their slots again before publishing a view without them");
    }
}

/// How a heartbeat starts ([`Engine::open_beat`]).
pub(super) enum Opening {
    /// Nothing this beat: the member gave its lease up and waits for it to pass.
    Nothing,
    /// No claim: read the table and claim a slot.
    Claim,
    /// Renew `claim`, sent at `sent`, and read what changed.
    Renew { claim: Claim, sent: Duration },
}

/// What a heartbeat does with its answer ([`Engine::on_heard`]).
pub(super) enum Closing {
    /// Nothing more: the answer changed nothing that calls for work.
    Done,
    /// The slot is no longer this member's: claim again.
    Reclaim,
    /// Run a round on the table ([`super::round`]), after looking for twins on a fresh one.
    Round,
}

impl Engine {
    /// How this heartbeat starts: a lease that ran out on this member's clock stops all work;
    /// a member with no claim claims; one that gave its lease up claims afresh once it ran out;
    /// otherwise it renews, reading both directories whole when it waited long.
    pub(super) fn open_beat(&mut self) -> Opening {
        let now = self.cfg.clock.monotonic();
        let expired = self.shared.lock().deadline.is_some_and(|d| now >= d);
        if expired {
            self.revoke("lapsed", "the lease deadline passed without a renewal");
        }
        let Some(claim) = self.claims.current.clone() else {
            return Opening::Claim;
        };
        if self.claims.abandoned {
            if expired {
                // The lease has run out on our clock: claim afresh.
                self.claims.abandoned = false;
                self.claims.current = None;
            }
            return Opening::Nothing;
        }
        let sent = self.cfg.clock.monotonic();
        if self.facts().rereads_whole() {
            tracing::debug!(
                group = self.cfg.layout.group(),
                member = %self.cfg.member,
                "waited long on a hand-off or a discrepancy: reading the table whole"
            );
            self.forget_seen();
            self.cache.slots = None;
            self.cache.whole_read = Some(sent);
        }
        self.cache.beats += 1;
        self.cache.last_beat = Some(sent);
        Opening::Renew { claim, sent }
    }

    /// Whether the heartbeat's answer must be checked against a listing of the table before
    /// the member acts on it, and with which renewal outcome (`Some(renewed)`):
    ///
    /// * a renewal refused, judged on a table not listed in this heartbeat (a copy, or a
    ///   version that says nothing changed although the slot did): the table itself decides,
    ///   and the directories are read whole at the next beat;
    /// * a slot of the view missing from slots kept from the copy ([`lists_before_dropping`]).
    pub(super) fn relist(&mut self, heard: &Heard) -> Option<bool> {
        if !heard.renewed && !heard.listed {
            self.forget_seen();
            self.cache.slots = None;
            return Some(false);
        }
        if lists_before_dropping(heard.fresh, heard.listed, &heard.table) {
            self.cache.slots = None;
            return Some(heard.renewed);
        }
        None
    }

    /// A heartbeat met a store error: the outage ride-through starts counting, and the member
    /// reports the error.
    pub(super) fn beat_failed(&mut self, e: &Error) {
        self.store_failed();
        self.set_error(Some(e));
    }

    /// The heartbeat of `claim`, sent at `sent`, answered `heard`: a refused renewal is either a
    /// write of ours applied after all (the slot holds our claim with other text: still ours)
    /// or a lost slot (stop all work and claim again); a renewed one extends the lease, and
    /// the table calls for a round unless nothing changed.
    pub(super) fn on_heard(&mut self, claim: &Claim, sent: Duration, heard: &Heard) -> Closing {
        if !heard.renewed {
            // A write of ours that reported an error may have been applied after all (an
            // acknowledgement that timed out): the slot then holds our claim with other
            // text. It is still ours; take its text and renew at the next beat.
            if let Some(r) = heard.table.slots.get(&claim.slot) {
                if r.member == self.cfg.member && r.nonce == claim.record.nonce {
                    self.claims.current = Some(Claim {
                        slot: claim.slot,
                        record: r.clone(),
                    });
                    return Closing::Done;
                }
            }
            self.cfg.metrics.heartbeat_failed("lost");
            self.revoke("lost", "the slot was no longer ours at renewal");
            self.claims.current = None;
            self.claims.preferred = Some(claim.slot);
            return Closing::Reclaim;
        }
        {
            let mut st = self.shared.lock();
            st.deadline = Some(self.deadline(sent));
            st.holder = Some(claim.holder());
        }
        self.set_error(None);
        let active = self.shared.lock().active.is_some();
        if self.facts().idle(heard.changed, active) {
            return Closing::Done;
        }
        Closing::Round
    }
}

#[cfg(test)]
mod tests;
