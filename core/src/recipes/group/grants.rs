//! Grants: the member's shared state, what a [`Grant`] covers, and when it is valid.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{broadcast, watch, Notify};

use super::records::Holder;
use super::view::{Assignment, Change, GroupPhase, ViewState};
use crate::clock::Clock;
use crate::fence::FencingToken;

/// What a grant covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    /// One key, by hash.
    Key(u64),
    /// The member's whole share: valid while its `(index, replicas)` pair stays the same.
    Share,
}

/// The key grants in flight for one key: how many, and the fencing token of the first of them
/// since the count was last zero.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub(super) count: usize,
    pub(super) token: u64,
}

/// What a grant taken now would carry.
#[derive(Debug, Clone, Copy)]
pub(super) struct Grantable {
    pub(super) slot: u32,
    pub(super) epoch: u64,
    pub(super) token: u64,
}

#[derive(Default)]
pub(super) struct State {
    /// The member's current claim: its slot and the claim's nonce.
    pub(super) holder: Option<Holder>,
    /// Monotonic instant after which the lease may have expired.
    pub(super) deadline: Option<Duration>,
    /// Bumped whenever the lease is lost: older grants are invalid.
    pub(super) generation: u64,
    pub(super) active: Option<Arc<ViewState>>,
    pub(super) pending: Option<Arc<ViewState>>,
    /// Views adopted as pending and superseded before they became active. The member may have
    /// acknowledged one of them (releasing what it did not own there) and another member may
    /// have started work under it, so what the member keeps granting during the hand-off must
    /// be its own in every one of them.
    pub(super) skipped: Vec<Arc<ViewState>>,
    /// The views adopted since the member's claim (oldest first, at most [`State::HISTORY`]
    /// views and [`State::HISTORY_ENTRIES`] assignment entries): a key's fencing token is the
    /// first epoch of the unbroken run of consecutive epochs, up to the newest, in which the key
    /// was the member's. A run longer than the history starts at its oldest view: a newer
    /// token, which a fence still orders after every other owner's, while a grant still in
    /// flight from earlier keeps its older token for the new grants of its key (see
    /// [`State::key_token`]).
    pub(super) history: VecDeque<Arc<ViewState>>,
    /// Key grants in flight, by key hash: how many, and the token of the first of them since
    /// the count was last zero (a key with a grant in flight all along stayed the member's: a
    /// hand-off that moves it waits for the count to drop to zero).
    pub(super) in_flight: HashMap<u64, InFlight>,
    /// The lowest epoch a fencing token may come from once a run is in question: one above
    /// an epoch this member saw minted twice (a store that lost writes published the member's
    /// epoch again for other holders, whose grants carry it too). Runs never reach below it,
    /// so the member's grants under the view that replaces the twins fence off both.
    pub(super) run_floor: u64,
    pub(super) share_in_flight: usize,
    pub(super) leaving: bool,
    /// The member is leaving for a restart ([`Member::leave_for_restart`]): it parks its claim
    /// instead of deleting it.
    ///
    /// [`Member::leave_for_restart`]: super::Member::leave_for_restart
    pub(super) restart: bool,
}

impl State {
    /// The most views [`State::history`] keeps.
    pub(super) const HISTORY: usize = 64;

    /// The most assignment entries ([`ViewState::weight`]: slots, and declared keys) the views
    /// of [`State::history`] hold together, beyond the newest two: a group of a few thousand
    /// members keeps 64 views, one with 65,536 declared keys about four, so a member's memory
    /// does not grow with the views it saw.
    pub(super) const HISTORY_ENTRIES: usize = 1 << 18;

    /// Records a view the member adopted.
    pub(super) fn remember(&mut self, view: Arc<ViewState>) {
        self.history.push_back(view);
        let mut weight: usize = self.history.iter().map(|v| v.weight()).sum();
        while self.history.len() > Self::HISTORY
            || (self.history.len() > 2 && weight > Self::HISTORY_ENTRIES)
        {
            if let Some(old) = self.history.pop_front() {
                weight -= old.weight();
            }
        }
    }

    /// Forgets what the member owned: its lease lapsed or it left, so ownership starts over.
    pub(super) fn forget_history(&mut self) {
        self.history.clear();
    }

    /// Stops granting: every grant taken so far turns invalid, the views are dropped and the
    /// lease deadline forgotten. What a revocation and a leave have in common.
    pub(super) fn stop_granting(&mut self) {
        self.generation += 1;
        self.active = None;
        self.pending = None;
        self.skipped.clear();
        self.forget_history();
        self.deadline = None;
    }

    /// Records that `epoch` was minted twice: no fencing token of a later grant comes from it
    /// or from before it, since another member's grants may carry it.
    pub(super) fn break_runs_at(&mut self, epoch: u64) {
        self.run_floor = self.run_floor.max(epoch.saturating_add(1));
    }

    /// The fencing token of key hash `h`, which is `holder`'s in `target`: the first epoch of the
    /// unbroken run of consecutive epochs, ending at `target`'s, of views this member adopted
    /// with `h` its own. No other member can have been granted `h` under an epoch of that run
    /// (each of those views gave it to this member), so every other owner's token is older
    /// than the run or newer than `target`: a fence still orders owners, while this member's
    /// grants from earlier in the run are not refused once a later one wrote (Kafka's KIP-1251
    /// fixed the same false fencing with an assignment epoch).
    ///
    /// While a grant of `h` is in flight the key stays the member's without a break (a hand-off
    /// that moves it waits for the grant, even through views that were superseded before they
    /// became active), so a new grant takes the token of the first grant in flight when that is
    /// older.
    fn key_token(&self, h: u64, holder: Holder, target: &ViewState) -> u64 {
        if let Some(&InFlight { count, token }) = self.in_flight.get(&h) {
            if count > 0 && token >= self.run_floor {
                return token.min(self.run_start(h, holder, target));
            }
        }
        self.run_start(h, holder, target)
    }

    /// The first epoch of the run described at [`State::key_token`].
    fn run_start(&self, h: u64, holder: Holder, target: &ViewState) -> u64 {
        let mut token = target.epoch();
        for v in self.history.iter().rev() {
            if v.epoch() >= token {
                continue;
            }
            if v.epoch() + 1 != token || v.epoch() < self.run_floor || !v.owned_by(h, holder) {
                break;
            }
            token = v.epoch();
        }
        token
    }

    pub(super) fn target(&self) -> Option<&Arc<ViewState>> {
        self.pending.as_ref().or(self.active.as_ref())
    }

    pub(super) fn pair_in(&self, view: Option<&Arc<ViewState>>) -> Option<(u32, u32)> {
        view.and_then(|v| v.pair_of(self.holder?))
    }

    /// Whether a grant of `scope` taken under `generation` may still be used.
    pub(super) fn valid(&self, scope: Scope, generation: u64, now: Duration) -> bool {
        if generation != self.generation || self.leaving {
            return false;
        }
        if self.deadline.is_none_or(|d| now >= d) {
            return false;
        }
        let (Some(holder), Some(target)) = (self.holder, self.target()) else {
            return false;
        };
        match scope {
            Scope::Key(h) => target.owned_by(h, holder),
            Scope::Share => {
                self.active.is_some()
                    && self.pair_in(self.active.as_ref()) == self.pair_in(Some(target))
                    && self.pair_in(Some(target)).is_some()
            }
        }
    }

    /// The grants in flight that `kept` does not cover, for a log line: the keys by hash (as
    /// [`hash_bytes`](crate::assign::hash_bytes) gives them, sorted), and whether the whole
    /// share is held too.
    pub(super) fn held(&self, kept: impl Fn(u64) -> bool) -> (Vec<String>, bool) {
        let mut keys: Vec<String> = self
            .in_flight
            .iter()
            .filter(|(&h, f)| f.count > 0 && !kept(h))
            .map(|(h, _)| format!("{h:016x}"))
            .collect();
        keys.sort_unstable();
        (keys, self.share_in_flight > 0)
    }

    /// Whether any grant is in flight.
    pub(super) fn busy(&self) -> bool {
        self.in_flight.values().any(|f| f.count > 0) || self.share_in_flight > 0
    }

    /// Whether every grant in flight is still valid under the pending view.
    pub(super) fn drained(&self) -> bool {
        let (Some(holder), Some(pending)) = (self.holder, self.pending.as_ref()) else {
            return true;
        };
        let keys_ok = self
            .in_flight
            .iter()
            .all(|(&h, f)| f.count == 0 || pending.owned_by(h, holder));
        let share_ok = self.share_in_flight == 0
            || self.pair_in(self.active.as_ref()) == self.pair_in(Some(pending));
        keys_ok && share_ok
    }
}

pub(super) struct Shared {
    pub(super) clock: Arc<dyn Clock>,
    pub(super) state: Mutex<State>,
    /// Woken when a grant is dropped, so a drain finishes without waiting for a heartbeat.
    pub(super) released: Notify,
    pub(super) assignment: watch::Sender<Assignment>,
    pub(super) changes: broadcast::Sender<Change>,
    /// Views adopted that change what the member owns, before it acknowledges them
    /// ([`Member::revocations`](super::Member::revocations)).
    pub(super) revocations: broadcast::Sender<Change>,
    /// Bumped whenever a grant may have stopped being valid other than by its lease deadline (a
    /// view adopted, all work stopped, a leave): [`Grant::revoked`] waits on it.
    pub(super) revoking: watch::Sender<u64>,
}

impl Shared {
    /// The state of `member` before it joins: no slot, no view, phase `joining`.
    pub(super) fn new(clock: Arc<dyn Clock>, member: String) -> Shared {
        let (assignment, _) = watch::channel(Assignment {
            member,
            slot: None,
            index: None,
            replicas: 0,
            epoch: 0,
            live: Vec::new(),
            phase: GroupPhase::Joining,
            last_error: None,
        });
        let (changes, _) = broadcast::channel(64);
        let (revocations, _) = broadcast::channel(64);
        let (revoking, _) = watch::channel(0);
        Shared {
            clock,
            state: Mutex::new(State::default()),
            released: Notify::new(),
            assignment,
            changes,
            revocations,
            revoking,
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn grant(self: &Arc<Self>, scope: Scope) -> Option<Grant> {
        let now = self.clock.monotonic();
        let mut st = self.lock();
        let Grantable { slot, epoch, token } = st.grantable(scope, now)?;
        match scope {
            Scope::Key(h) => {
                st.in_flight
                    .entry(h)
                    .or_insert(InFlight { count: 0, token })
                    .count += 1
            }
            Scope::Share => st.share_in_flight += 1,
        }
        Some(Grant {
            shared: self.clone(),
            scope,
            epoch,
            token,
            slot,
            generation: st.generation,
        })
    }

    /// Wakes every [`Grant::revoked`] to look again.
    pub(super) fn wake_revoked(&self) {
        self.revoking.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub(super) fn publish(&self, update: impl FnOnce(&mut Assignment)) {
        self.assignment.send_if_modified(|a| {
            let before = a.clone();
            update(a);
            *a != before
        });
    }
}

impl State {
    /// The slot, epoch and fencing token a grant of `scope` would carry now, or `None` when it
    /// may not be granted.
    pub(super) fn grantable(&self, scope: Scope, now: Duration) -> Option<Grantable> {
        if !self.valid(scope, self.generation, now) {
            return None;
        }
        let slot = self.holder?.slot;
        // In a hand-off, only what the active view already granted keeps going: a key or share
        // gained in the pending view waits for the others' acknowledgements.
        if self.pending.is_some() && !self.valid_in_active(scope) {
            return None;
        }
        let target = self.target()?;
        let token = match (scope, self.holder) {
            (Scope::Key(h), Some(holder)) => self.key_token(h, holder, target),
            _ => target.epoch(),
        };
        Some(Grantable {
            slot,
            epoch: target.epoch(),
            token,
        })
    }

    /// Whether `scope` was granted by the active view and stayed the member's in every view
    /// adopted since (the pending one is checked by [`State::valid`]).
    pub(super) fn valid_in_active(&self, scope: Scope) -> bool {
        let (Some(holder), Some(active)) = (self.holder, self.active.as_ref()) else {
            return false;
        };
        let owns = |v: &ViewState| match scope {
            Scope::Key(h) => v.owned_by(h, holder),
            Scope::Share => {
                v.pair_of(holder).is_some() && v.pair_of(holder) == active.pair_of(holder)
            }
        };
        owns(active) && self.skipped.iter().all(|v| owns(v))
    }
}

/// The right to work on a key (or on the member's whole share) under one epoch, with the fencing
/// token to hand to the sink ([`Grant::token`]). The grant is in flight until dropped: a hand-off
/// waits for it.
pub struct Grant {
    pub(super) shared: Arc<Shared>,
    pub(super) scope: Scope,
    pub(super) epoch: u64,
    pub(super) token: u64,
    pub(super) slot: u32,
    pub(super) generation: u64,
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("scope", &self.scope)
            .field("epoch", &self.epoch)
            .field("token", &self.token)
            .field("slot", &self.slot)
            .finish()
    }
}

impl Grant {
    /// The fencing token. For a key: the epoch since which this member has owned it without a
    /// break (the first of the consecutive views it adopted that gave it the key), so a key that
    /// stays the member's across view changes keeps its token and an older grant of it is not
    /// refused by a fence once a newer one wrote; a key that moved carries a token newer than
    /// every token of its earlier owners. For the whole share: the epoch of the view it was
    /// taken under.
    pub fn token(&self) -> FencingToken {
        FencingToken::new(self.token)
    }

    /// The epoch of the view the grant was taken under (at least [`Grant::token`]).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The slot of the member holding it.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Whether the grant may still be used: the member's lease is alive on its own clock and the
    /// key (or share) is still its own in the newest view it adopted. Check it before each
    /// side effect; a sink should still check the token with a fence.
    pub fn is_valid(&self) -> bool {
        let now = self.shared.clock.monotonic();
        self.shared.lock().valid(self.scope, self.generation, now)
    }

    /// Resolves once the grant is no longer valid ([`Grant::is_valid`]): the member adopted a
    /// view that moves the key (or changes the share's pair) away, lost its lease, or is leaving.
    /// This is the revocation hook: select on it beside your work, and when it fires finish or
    /// checkpoint the key and drop the grant. A cooperative hand-off waits for that drop (up to
    /// the drain timeout, one TTL by default, [`GroupConfig::with_drain_timeout`]) before the new
    /// owner starts the key; a lapsed lease ([`Grant::lease_lapsed`]) waits for nobody, so stop
    /// at once then.
    ///
    /// ```
    /// # async fn work(_: &str) {}
    /// # async fn example(member: headcount_core::recipes::group::Member) {
    /// if let Some(grant) = member.owns("order-42") {
    ///     tokio::select! {
    ///         () = work("order-42") => {}
    ///         () = grant.revoked() => { /* checkpoint, then let the grant go */ }
    ///     }
    /// }
    /// # }
    /// ```
    ///
    /// [`GroupConfig::with_drain_timeout`]: super::GroupConfig::with_drain_timeout
    pub async fn revoked(&self) {
        let mut woken = self.shared.revoking.subscribe();
        loop {
            let deadline = {
                let now = self.shared.clock.monotonic();
                let st = self.shared.lock();
                if !st.valid(self.scope, self.generation, now) {
                    return;
                }
                st.deadline
            };
            let Some(deadline) = deadline else { return };
            tokio::select! {
                changed = woken.changed() => if changed.is_err() { return },
                () = self.shared.clock.sleep_until(deadline) => {}
            }
        }
    }

    /// How long the member's lease has left on its own clock (until its deadline: the last
    /// renewal's send time plus 90% of the TTL), or `None` once it lapsed since this grant was
    /// taken. For a watchdog outside the process (`headcount exec` has one) that must stop the
    /// work by the deadline even if this process is frozen.
    pub fn lease_remaining(&self) -> Option<Duration> {
        let now = self.shared.clock.monotonic();
        let st = self.shared.lock();
        if st.generation != self.generation {
            return None;
        }
        st.deadline
            .and_then(|d| d.checked_sub(now))
            .filter(|left| !left.is_zero())
    }

    /// Whether the member's lease lapsed (its renewal failed or its deadline passed on its
    /// clock) since this grant was taken, even if it has claimed a slot and become active again
    /// since. The others
    /// then no longer wait for this grant: its work must stop at once, with no grace period.
    /// An invalid grant whose lease did not lapse was revoked by a cooperative hand-off, which
    /// waits for it to be dropped.
    pub fn lease_lapsed(&self) -> bool {
        let now = self.shared.clock.monotonic();
        let st = self.shared.lock();
        // The deadline counts as soon as it passes on the member's clock, before the heartbeat
        // task notices and revokes (which bumps the generation).
        st.generation != self.generation || st.deadline.is_none_or(|d| now >= d)
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            if st.generation == self.generation {
                match self.scope {
                    Scope::Key(h) => {
                        if let Some(f) = st.in_flight.get_mut(&h) {
                            f.count = f.count.saturating_sub(1);
                            if f.count == 0 {
                                st.in_flight.remove(&h);
                            }
                        }
                    }
                    Scope::Share => st.share_in_flight = st.share_in_flight.saturating_sub(1),
                }
            }
        }
        self.shared.released.notify_one();
    }
}
