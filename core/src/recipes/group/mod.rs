//! Group membership: stable slots held with a lease, views and epochs minted by the store,
//! cooperative hand-off, and a fencing token on every grant. headcount's default mode.
//!
//! # Membership
//!
//! A member claims the lowest free slot `hc:{group}:slot:{i}` with a compare-and-set "only if
//! absent" and the lease TTL, and renews it every TTL/3 in one
//! [`Store::renew_and_list`](crate::Store::renew_and_list) round trip: renew the slot, and read
//! the slot table and the published view. By default (see [`GroupConfig::with_change_checks`])
//! the round trip is
//! [`Store::renew_and_list_if_changed`](crate::Store::renew_and_list_if_changed), which
//! sends the table only when the store's version of it changed since the member last read it (a
//! claim, a leave, an acknowledgement, a view, or a lease running out); an unchanged table is
//! taken from the member's copy, so a steady group costs each member constant work and bytes per
//! heartbeat on a backend that keeps versions. A member that leaves
//! gracefully stops its work, deletes its slot and publishes the view without it, so the others
//! move on at their next heartbeat instead of waiting for the TTL. A member whose renewal fails
//! (its slot expired, or someone overwrote it) stops all work at once and claims a slot again
//! (its old number if still free); so does one whose lease deadline passes on its own monotonic
//! clock without a successful renewal: the deadline is the renewal's *send* time plus the TTL
//! less a tenth, so it passes before the store expires the slot.
//!
//! Slots are stable ordinals: a member keeps its number across the others' joins and leaves, and
//! a member restarted with the same member id gets its number back if it is still free (it waits
//! up to one TTL for its previous incarnation's lease to expire; if the slot is still held after
//! that, another live process uses the same member id and the join fails with
//! [`Error::Rejected`]).
//!
//! # Views and epochs
//!
//! The live slots (with the nonce of each claim) form the *view*. A member that sees the live
//! slots differ from the published view `hc:{group}:slot:view` publishes `{epoch + 1, slots}`
//! with a compare-and-set against the view it read, so exactly one of the members that try wins
//! and the epoch is minted by the store. The lowest live slot publishes at once; any other member
//! polls at a quarter heartbeat while it sees a difference (so it adopts the new view soon after
//! it is published) and publishes itself when the same difference outlasts a heartbeat (the
//! lowest may be the one that died); a member that joins or leaves publishes its own change. The new epoch is one
//! above the highest the publisher has seen in any view *or in any live member's
//! acknowledgement*, so a view that does not decode, was deleted, or went back (a store that
//! lost its data) is replaced by one above every epoch a live member acted on: epochs only
//! increase as long as one member survives. Epochs above `i64::MAX - 1` are foreign values.
//!
//! # Ownership and grants
//!
//! The [assignor](crate::assign) (default: JumpBackHash with RavenDB's failover, which moves
//! only the changed slot's keys on a join or leave and depends only on the live slots) maps each
//! key to a live slot of the view. A view counts a member only when it names the member's own
//! claim, slot *and* nonce: a member that claimed its slot number again (a restart with the same
//! member id, a lapsed lease) owns nothing under a view that names the number under its earlier
//! claim. The view records the publisher's assignor, and a member configured with another one
//! is refused at join. [`Member::owns`] returns a [`Grant`] carrying the epoch as its
//! fencing token while the key is this member's; the grant stays in flight until dropped.
//! [`Member::watch`] gives the member's [`Assignment`] (`slot`, and the articles' 1-based
//! `(index, replicas)` pair: the member's rank among the live slots and their count), and
//! [`Member::changes`] a [`Change`] per activated view, which tells the keys gained and lost.
//!
//! # Cooperative hand-off
//!
//! When a member adopts a newer view:
//!
//! * keys it owns in both its active view and the new one never pause;
//! * keys it no longer owns are revoked at once ([`Member::owns`] says no, [`Grant::is_valid`]
//!   turns false); when no grant for them is in flight any more, the member *acknowledges* the
//!   new view by writing its epoch and digest into its own slot record (`acked=`, `view=`),
//!   which every member reads at its next heartbeat anyway, and writes it again if the store
//!   loses it;
//! * keys it gains start only once every other live slot has acknowledged that epoch (a slot
//!   that is gone from the store has either released everything before deleting itself, or its
//!   lease expired and its holder stopped on its own clock). Until then [`Member::owns`] says no
//!   for them.
//!
//! **Guarantee**: a key is granted under one epoch to at most one member (the view is a
//! function of the epoch, and the assignor of the view); and a member starts granting a key it
//! gained only after every member that could still hold a grant for it has acknowledged letting
//! go, or lost its lease, provided (a) clocks run at the same rate within 10% over one TTL (the
//! member's deadline is 10% short of the store's expiry), (b) nobody but headcount deletes slot
//! keys, and (c) a member is not paused between checking a grant and using it for longer than
//! the rest of its lease. When (b) or (c) fails (a slot deleted or overwritten by hand, a process
//! paused past its TTL), the old holder's grants carry an older epoch: a sink that checks
//! tokens with a [`Fence`](crate::fence::Fence) (or the PostgreSQL and Redis fences of the
//! backend crates) rejects its late writes once the new owner has written.
//!
//! A store that loses acknowledged writes (a failover to an asynchronous replica, a restore from
//! a backup) voids the guarantee until the leases renewed before the loss have run out: a lost
//! renewal lets a slot expire before its holder's deadline, and a lost view lets another member
//! mint the same epoch for other holders. Members detect both (the renewal is refused; a view
//! with their own epoch and other holders is replaced by one above both) and the guarantee holds
//! again within about one TTL. A member whose view compare-and-set loses adopts nothing from the
//! listing it read before and lists again.
//!
//! A member whose in-flight grants do not drain within the drain timeout (one TTL by default)
//! stops renewing, so its lease expires and the others proceed without its acknowledgement.
//!
//! # Keys
//!
//! | key | value | TTL |
//! |---|---|---|
//! | `slot:{i}` | `v1 member=<id> nonce=<hex> since=<unix ms> ttl=<ms> acked=<epoch> view=<hex>` | the lease TTL |
//! | `slot:view` | `v1 epoch=<E> assignor=<name> slots=<slot>@<nonce>,...` | none |

mod records;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use tokio::sync::{broadcast, watch, Notify};
use tokio::task::JoinHandle;

use crate::assign::{hash_bytes, Assignor, AssignorKind, Topology};
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::keys::{Keyspace, DEFAULT_PREFIX};
use crate::store::RenewedListing;
use crate::DynStore;

pub use records::{Holder, SlotRecord, Table, ViewRecord, MAX_EPOCH};

/// The shortest lease TTL accepted.
pub const MIN_TTL: Duration = Duration::from_millis(30);

/// The longest lease TTL accepted: a member dead this long before anyone notices is almost
/// certainly a unit mistake.
pub const MAX_TTL: Duration = Duration::from_secs(3600);

/// The default limit on slot numbers (members in one group).
pub const DEFAULT_MAX_SLOTS: u32 = 4096;

/// How to join a group.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    group: String,
    prefix: String,
    ttl: Duration,
    member: Option<String>,
    assignor: AssignorKind,
    clock: Arc<dyn Clock>,
    max_slots: u32,
    drain_timeout: Option<Duration>,
    change_checks: bool,
}

impl GroupConfig {
    /// A configuration for `group` with lease `ttl` (renewed every `ttl / 3`), a random member
    /// id, the system clock and the assignor [`JumpBackFailover`](crate::assign::JumpBackFailover)
    /// (JumpBackHash with RavenDB's failover, named `jumpback`): as minimal and balanced as jump
    /// consistent hash with the same failover ([`AssignorKind::JumpFailover`], `jump`, the default
    /// before it) and several times faster, but a different assignment. Every member of a group
    /// must use the same assignor, so a group with members that default to `jump` must set it
    /// with [`with_assignor`](Self::with_assignor) on the others.
    pub fn new(group: impl Into<String>, ttl: Duration) -> Self {
        GroupConfig {
            group: group.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            ttl,
            member: None,
            assignor: AssignorKind::JumpBackFailover,
            clock: Arc::new(SystemClock::new()),
            max_slots: DEFAULT_MAX_SLOTS,
            drain_timeout: None,
            change_checks: true,
        }
    }

    /// Uses another key prefix than `hc`.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The member's stable id (1 to 64 characters of `A-Z a-z 0-9 _ - .`): a restarted member
    /// with the same id gets its slot back if it is still free.
    pub fn with_member(mut self, member: impl Into<String>) -> Self {
        self.member = Some(member.into());
        self
    }

    /// The assignor mapping keys to live slots; every member of a group must use the same one.
    pub fn with_assignor(mut self, assignor: AssignorKind) -> Self {
        self.assignor = assignor;
        self
    }

    /// Injects a clock (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The highest slot number plus one that this member may claim (default
    /// [`DEFAULT_MAX_SLOTS`]).
    pub fn with_max_slots(mut self, max: u32) -> Self {
        self.max_slots = max;
        self
    }

    /// How long in-flight grants of revoked keys may take to drain before the member gives up its
    /// lease so the others can proceed (default: the TTL).
    pub fn with_drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = Some(timeout);
        self
    }

    /// Whether heartbeats ask the store if the slot table changed
    /// ([`Store::renew_and_list_if_changed`](crate::Store::renew_and_list_if_changed), the
    /// default) and read it only then, or read it at every heartbeat
    /// ([`Store::renew_and_list`](crate::Store::renew_and_list), `false`). The protocol is the
    /// same. On Redis a steady group costs the server a constant amount per heartbeat whatever
    /// its size (a third of the commands and a seventh of the script time of `false` at 300
    /// members, with the same convergence); on a backend without native change versions the
    /// store lists the table and compares a digest, the cost of `false`. `false` is kept to
    /// measure the two side by side.
    pub fn with_change_checks(mut self, on: bool) -> Self {
        self.change_checks = on;
        self
    }

    /// Replaces the lease TTL.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn check(&self) -> Result<Keyspace> {
        let keys = Keyspace::with_prefix(&self.prefix, &self.group)?;
        if self.ttl < MIN_TTL || self.ttl > MAX_TTL {
            return Err(Error::invalid(format!(
                "lease TTL {:?} is outside {MIN_TTL:?}..={MAX_TTL:?}",
                self.ttl
            )));
        }
        if self.max_slots == 0 || self.max_slots > crate::assign::MAX_SLOTS {
            return Err(Error::invalid(format!(
                "max slots {} is outside 1..={}",
                self.max_slots,
                crate::assign::MAX_SLOTS
            )));
        }
        if let Some(d) = self.drain_timeout {
            if d.is_zero() || d > MAX_TTL {
                return Err(Error::invalid(format!(
                    "drain timeout {d:?} is outside (0, {MAX_TTL:?}]"
                )));
            }
        }
        if let Some(member) = &self.member {
            crate::recipes::interval::check_member(member)?;
        }
        Ok(keys)
    }
}

/// Where a member stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GroupPhase {
    /// Claimed a slot, waiting for its first view to become active.
    Joining,
    /// Working under its active view.
    Active,
    /// A newer view was adopted: revoked keys are draining or the others' acknowledgements are
    /// awaited; kept keys keep working.
    Handoff,
    /// Lost its lease (renewal failed or the deadline passed): all work stopped, claiming again.
    Rejoining,
    /// Left the group.
    Stopped,
    /// Gave up for good (another live process uses the same member id).
    Failed,
}

impl GroupPhase {
    /// Lower-case name for logs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupPhase::Joining => "joining",
            GroupPhase::Active => "active",
            GroupPhase::Handoff => "handoff",
            GroupPhase::Rejoining => "rejoining",
            GroupPhase::Stopped => "stopped",
            GroupPhase::Failed => "failed",
        }
    }
}

/// A member's place in the group under its active view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The member id.
    pub member: String,
    /// The member's stable slot, while it holds one.
    pub slot: Option<u32>,
    /// The articles' index: the member's 1-based rank among the live slots of the active view
    /// (`None` when it is not in it).
    pub index: Option<u32>,
    /// The number of live slots in the active view.
    pub replicas: u32,
    /// The active view's epoch (0 before the first).
    pub epoch: u64,
    /// The live slots of the active view, ascending.
    pub live: Vec<u32>,
    /// Where the member stands.
    pub phase: GroupPhase,
    /// The last error met while renewing or publishing, cleared by the next success.
    pub last_error: Option<String>,
}

impl Assignment {
    /// The articles' `(index, replicas)`: task `t` belongs to this member when
    /// `t % replicas == index - 1`.
    pub fn pair(&self) -> Option<(u32, u32)> {
        self.index.map(|i| (i, self.replicas))
    }
}

/// A view with its assignor built.
pub struct ViewState {
    record: ViewRecord,
    assignor: Option<Box<dyn Assignor>>,
    /// The record's digest, computed once: acknowledgements are checked against it per slot.
    digest: u64,
}

impl fmt::Debug for ViewState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ViewState")
            .field("epoch", &self.record.epoch)
            .field("live", &self.record.holders.len())
            .finish()
    }
}

impl ViewState {
    fn build(record: ViewRecord, kind: AssignorKind) -> Result<ViewState> {
        let assignor = if record.holders.is_empty() {
            None
        } else {
            let topology = Topology::from_live_slots(record.slots())?;
            Some(kind.build(&topology)?)
        };
        let digest = record.digest();
        Ok(ViewState {
            record,
            assignor,
            digest,
        })
    }

    /// Whether `slot_record` acknowledged this view (see [`SlotRecord::has_acked`]).
    fn acked_by(&self, slot_record: &SlotRecord) -> bool {
        slot_record.has_acked_digest(self.record.epoch, self.digest)
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.record.epoch
    }

    /// The published record.
    pub fn record(&self) -> &ViewRecord {
        &self.record
    }

    /// The slot owning a key hash, if any slot is live.
    pub fn owner(&self, hash: u64) -> Option<u32> {
        self.assignor.as_ref().map(|a| a.owner(hash))
    }

    /// `slot`'s 1-based rank and the live count.
    pub fn pair(&self, slot: u32) -> Option<(u32, u32)> {
        let live = self.record.holders.len() as u32;
        self.record
            .holders
            .binary_search_by_key(&slot, |h| h.slot)
            .ok()
            .map(|i| (i as u32 + 1, live))
    }

    /// `holder`'s 1-based rank and the live count, when the view names exactly this holder (the
    /// slot *and* the claim): a view that names the slot under an earlier claim is not this
    /// holder's, whoever holds the number now.
    pub fn pair_of(&self, holder: Holder) -> Option<(u32, u32)> {
        let live = self.record.holders.len() as u32;
        self.record
            .holders
            .binary_search_by_key(&holder.slot, |h| h.slot)
            .ok()
            .filter(|&i| self.record.holders[i] == holder)
            .map(|i| (i as u32 + 1, live))
    }

    /// Whether the key hash belongs to `holder` in this view.
    pub fn owned_by(&self, hash: u64, holder: Holder) -> bool {
        self.pair_of(holder).is_some() && self.owner(hash) == Some(holder.slot)
    }

    /// Whether both views name the same holders (only the epoch differs: a view republished
    /// after it was lost or garbled), so no key changes hands between them.
    fn same_holders(&self, other: &ViewState) -> bool {
        self.record.holders == other.record.holders
    }
}

/// A view change as one member lived it: emitted when it activates a new view.
#[derive(Debug, Clone)]
pub struct Change {
    /// The view active before (none on the first).
    pub from: Option<Arc<ViewState>>,
    /// The view now active.
    pub to: Arc<ViewState>,
    /// The member's slot.
    pub slot: u32,
    /// The member's claim of that slot.
    holder: Holder,
}

impl Change {
    /// The epoch now active.
    pub fn epoch(&self) -> u64 {
        self.to.epoch()
    }

    /// Of `keys`, those this member owns now and did not before.
    pub fn gained<'a, K: AsRef<[u8]> + ?Sized + 'a>(
        &self,
        keys: impl IntoIterator<Item = &'a K>,
    ) -> Vec<&'a K> {
        keys.into_iter()
            .filter(|k| {
                let h = hash_bytes(k.as_ref());
                self.to.owned_by(h, self.holder)
                    && !self
                        .from
                        .as_ref()
                        .is_some_and(|f| f.owned_by(h, self.holder))
            })
            .collect()
    }

    /// Of `keys`, those this member owned before and does not now.
    pub fn lost<'a, K: AsRef<[u8]> + ?Sized + 'a>(
        &self,
        keys: impl IntoIterator<Item = &'a K>,
    ) -> Vec<&'a K> {
        keys.into_iter()
            .filter(|k| {
                let h = hash_bytes(k.as_ref());
                self.from
                    .as_ref()
                    .is_some_and(|f| f.owned_by(h, self.holder))
                    && !self.to.owned_by(h, self.holder)
            })
            .collect()
    }
}

/// What a grant covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// One key, by hash.
    Key(u64),
    /// The member's whole share: valid while its `(index, replicas)` pair stays the same.
    Share,
}

#[derive(Default)]
struct State {
    /// The member's current claim: its slot and the claim's nonce.
    holder: Option<Holder>,
    /// Monotonic instant after which the lease may have expired.
    deadline: Option<Duration>,
    /// Bumped whenever the lease is lost: older grants are invalid.
    generation: u64,
    active: Option<Arc<ViewState>>,
    pending: Option<Arc<ViewState>>,
    /// Views adopted as pending and superseded before they became active. The member may have
    /// acknowledged one of them (releasing what it did not own there) and another member may
    /// have started work under it, so what the member keeps granting during the hand-off must
    /// be its own in every one of them.
    skipped: Vec<Arc<ViewState>>,
    in_flight: HashMap<u64, usize>,
    share_in_flight: usize,
    leaving: bool,
}

impl State {
    fn target(&self) -> Option<&Arc<ViewState>> {
        self.pending.as_ref().or(self.active.as_ref())
    }

    fn pair_in(&self, view: Option<&Arc<ViewState>>) -> Option<(u32, u32)> {
        view.and_then(|v| v.pair_of(self.holder?))
    }

    /// Whether a grant of `scope` taken under `generation` may still be used.
    fn valid(&self, scope: Scope, generation: u64, now: Duration) -> bool {
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

    /// Whether every grant in flight is still valid under the pending view.
    fn drained(&self) -> bool {
        let (Some(holder), Some(pending)) = (self.holder, self.pending.as_ref()) else {
            return true;
        };
        let keys_ok = self
            .in_flight
            .iter()
            .all(|(&h, &n)| n == 0 || pending.owned_by(h, holder));
        let share_ok = self.share_in_flight == 0
            || self.pair_in(self.active.as_ref()) == self.pair_in(Some(pending));
        keys_ok && share_ok
    }
}

struct Shared {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// Woken when a grant is dropped, so a drain finishes without waiting for a heartbeat.
    released: Notify,
    assignment: watch::Sender<Assignment>,
    changes: broadcast::Sender<Change>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn grant(self: &Arc<Self>, scope: Scope) -> Option<Grant> {
        let now = self.clock.monotonic();
        let mut st = self.lock();
        let (slot, epoch) = st.grantable(scope, now)?;
        match scope {
            Scope::Key(h) => *st.in_flight.entry(h).or_insert(0) += 1,
            Scope::Share => st.share_in_flight += 1,
        }
        Some(Grant {
            shared: self.clone(),
            scope,
            epoch,
            slot,
            generation: st.generation,
        })
    }

    fn publish(&self, update: impl FnOnce(&mut Assignment)) {
        self.assignment.send_if_modified(|a| {
            let before = a.clone();
            update(a);
            *a != before
        });
    }
}

impl State {
    /// The slot and token a grant of `scope` would carry now, or `None` when it may not be
    /// granted.
    fn grantable(&self, scope: Scope, now: Duration) -> Option<(u32, u64)> {
        if !self.valid(scope, self.generation, now) {
            return None;
        }
        let slot = self.holder?.slot;
        // In a hand-off, only what the active view already granted keeps going: a key or share
        // gained in the pending view waits for the others' acknowledgements.
        if self.pending.is_some() && !self.valid_in_active(scope) {
            return None;
        }
        Some((slot, self.target()?.epoch()))
    }

    /// Whether `scope` was granted by the active view and stayed the member's in every view
    /// adopted since (the pending one is checked by [`State::valid`]).
    fn valid_in_active(&self, scope: Scope) -> bool {
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

/// The right to work on a key (or on the member's whole share) under one epoch. The epoch is the
/// fencing token to hand to the sink. The grant is in flight until dropped: a hand-off waits for
/// it.
pub struct Grant {
    shared: Arc<Shared>,
    scope: Scope,
    epoch: u64,
    slot: u32,
    generation: u64,
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("scope", &self.scope)
            .field("epoch", &self.epoch)
            .field("slot", &self.slot)
            .finish()
    }
}

impl Grant {
    /// The fencing token: the epoch of the view the grant was taken under.
    pub fn token(&self) -> u64 {
        self.epoch
    }

    /// The epoch (same as [`Grant::token`]).
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
}

impl Drop for Grant {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            if st.generation == self.generation {
                match self.scope {
                    Scope::Key(h) => {
                        if let Some(n) = st.in_flight.get_mut(&h) {
                            *n = n.saturating_sub(1);
                            if *n == 0 {
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

/// Joins groups.
#[derive(Debug, Clone, Copy)]
pub struct Group;

impl Group {
    /// Claims a slot in the group (its previous one when `config` names a member id whose slot
    /// is still free) and starts heartbeating in the background. Returns once the slot is
    /// claimed; the first view becomes active shortly after (watch [`Member::watch`]).
    ///
    /// Errors: [`Error::InvalidArgument`] for a bad group, prefix, member id, TTL (also one below
    /// the store's shortest lease) or slot limit; [`Error::Rejected`] when another live process
    /// holds a slot with the same member id, or the group is full; the store's own error when it
    /// cannot be reached.
    pub async fn join(store: DynStore, config: GroupConfig) -> Result<Member> {
        let keys = config.check()?;
        let caps = store.capabilities();
        if config.ttl < caps.min_ttl {
            return Err(Error::invalid(format!(
                "lease TTL {:?} is shorter than the {} store's shortest lease of {:?}",
                config.ttl, caps.backend, caps.min_ttl
            )));
        }
        let member = config
            .member
            .clone()
            .unwrap_or_else(|| format!("{:016x}", rand::random::<u64>()));
        let (assignment, _) = watch::channel(Assignment {
            member: member.clone(),
            slot: None,
            index: None,
            replicas: 0,
            epoch: 0,
            live: Vec::new(),
            phase: GroupPhase::Joining,
            last_error: None,
        });
        let (changes, _) = broadcast::channel(64);
        let shared = Arc::new(Shared {
            clock: config.clock.clone(),
            state: Mutex::new(State::default()),
            released: Notify::new(),
            assignment,
            changes,
        });
        let heartbeat = config.ttl / 3;
        let mut runner = Runner {
            store,
            shared: shared.clone(),
            clock: config.clock.clone(),
            listing: keys.key("slot:"),
            view_key: keys.key("slot:view"),
            keys,
            member: member.clone(),
            ttl: config.ttl,
            effective_ttl: caps.effective_ttl(config.ttl),
            heartbeat,
            assignor: config.assignor,
            max_slots: config.max_slots,
            drain_timeout: config.drain_timeout.unwrap_or(config.ttl),
            change_checks: config.change_checks,
            record: None,
            preferred: None,
            highest: 0,
            last_discrepancy: None,
            pending_since: None,
            abandoned: false,
            own_nonces: Vec::new(),
            seen: None,
        };
        runner.first_claim().await?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(runner.run(stop_rx));
        Ok(Member {
            shared,
            member,
            task: Arc::new(Heartbeat {
                stop: stop_tx,
                task: tokio::sync::Mutex::new(Some(task)),
            }),
        })
    }
}

/// A member of a group: ask it which keys it owns; it heartbeats in the background until
/// [`Member::leave`]. Clones are handles to the same member (one heartbeat, one slot): the
/// heartbeat stops when one of them leaves, or when the last one is dropped.
#[derive(Clone)]
pub struct Member {
    shared: Arc<Shared>,
    member: String,
    task: Arc<Heartbeat>,
}

/// The member's background task, shared by its handles.
struct Heartbeat {
    stop: watch::Sender<bool>,
    task: tokio::sync::Mutex<Option<JoinHandle<Result<()>>>>,
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        // Every handle dropped without leave(): stop heartbeating; the slot expires after the
        // TTL.
        if let Some(task) = self.task.get_mut().take() {
            task.abort();
        }
    }
}

impl fmt::Debug for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Member")
            .field("member", &self.member)
            .field("assignment", &*self.shared.assignment.borrow())
            .finish()
    }
}

impl Member {
    /// The member id.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// A grant for `key` when it is this member's now (see the [module docs](self) for when a
    /// key is), `None` otherwise. Hold the grant while working on the key.
    pub fn owns(&self, key: impl AsRef<[u8]>) -> Option<Grant> {
        self.shared.grant(Scope::Key(hash_bytes(key.as_ref())))
    }

    /// The token [`Member::owns`] would grant `key` under right now, without taking a grant
    /// (nothing is in flight afterwards): for monitoring and for tests that check who owns what.
    pub fn would_grant(&self, key: impl AsRef<[u8]>) -> Option<u64> {
        let now = self.shared.clock.monotonic();
        let scope = Scope::Key(hash_bytes(key.as_ref()));
        self.shared
            .lock()
            .grantable(scope, now)
            .map(|(_, epoch)| epoch)
    }

    /// [`Member::owns`] for a key that is already a hash (see [`crate::assign::hash_u64`]).
    pub fn owns_hash(&self, hash: u64) -> Option<Grant> {
        self.shared.grant(Scope::Key(hash))
    }

    /// A grant for the member's whole share, valid while its `(index, replicas)` pair stays the
    /// same: for programs that split work by the pair themselves (`headcount exec`).
    pub fn share(&self) -> Option<Grant> {
        self.shared.grant(Scope::Share)
    }

    /// The current assignment. A member whose lease deadline passed while its heartbeat task
    /// could not run (a paused process) reports `Rejoining` at once, before that task catches
    /// up and publishes it.
    pub fn assignment(&self) -> Assignment {
        let mut a = self.shared.assignment.borrow().clone();
        let now = self.shared.clock.monotonic();
        let lapsed = self.shared.lock().deadline.is_some_and(|d| now >= d);
        if lapsed && matches!(a.phase, GroupPhase::Active | GroupPhase::Handoff) {
            a.phase = GroupPhase::Rejoining;
            a.index = None;
        }
        a
    }

    /// A watch of the assignment.
    pub fn watch(&self) -> watch::Receiver<Assignment> {
        self.shared.assignment.subscribe()
    }

    /// A stream of activated view changes (a lagging receiver skips the oldest).
    pub fn changes(&self) -> broadcast::Receiver<Change> {
        self.shared.changes.subscribe()
    }

    /// Waits until the member is active under a view of at least `epoch` (0: any view) that
    /// includes its slot.
    pub async fn active(&self, epoch: u64) -> Result<Assignment> {
        let mut rx = self.watch();
        loop {
            {
                let a = rx.borrow_and_update();
                if a.phase == GroupPhase::Active && a.epoch >= epoch && a.index.is_some() {
                    return Ok(a.clone());
                }
                if matches!(a.phase, GroupPhase::Stopped | GroupPhase::Failed) {
                    return Err(Error::Unavailable {
                        backend: "group",
                        message: format!(
                            "member {} is {}: {}",
                            a.member,
                            a.phase.as_str(),
                            a.last_error.as_deref().unwrap_or("it left the group")
                        ),
                        source: None,
                    });
                }
            }
            if rx.changed().await.is_err() {
                return Err(Error::Unavailable {
                    backend: "group",
                    message: "the member's heartbeat task ended".into(),
                    source: None,
                });
            }
        }
    }

    /// Leaves gracefully: stops granting, waits (up to the drain timeout) for grants in flight,
    /// deletes the slot and publishes the view without it. Returns the error that ended the
    /// member early, if one did (another process with the same member id). Any handle may
    /// leave; a second call, from another handle, waits for the first and returns `Ok`.
    pub async fn leave(self) -> Result<()> {
        let _ = self.task.stop.send(true);
        // The lock is held until the task ended, so a second leave waits for the first.
        let mut task = self.task.task.lock().await;
        match task.take() {
            Some(task) => task
                .await
                .map_err(|e| Error::config(format!("the heartbeat task failed: {e}")))?,
            None => Ok(()),
        }
    }
}

/// The background heartbeat.
struct Runner {
    store: DynStore,
    shared: Arc<Shared>,
    clock: Arc<dyn Clock>,
    keys: Keyspace,
    listing: String,
    view_key: String,
    member: String,
    ttl: Duration,
    effective_ttl: Duration,
    heartbeat: Duration,
    assignor: AssignorKind,
    max_slots: u32,
    drain_timeout: Duration,
    /// Read the table only when the store reports a change (see
    /// [`GroupConfig::with_change_checks`]).
    change_checks: bool,
    /// The current claim: slot and record as stored.
    record: Option<(u32, SlotRecord)>,
    preferred: Option<u32>,
    /// The highest epoch seen in any view.
    highest: u64,
    /// The live holders of a listing that disagreed with the published view, and since when
    /// (monotonic): while it lasts the member polls at a quarter heartbeat so it adopts the view
    /// the lowest slot publishes soon after, and publishes itself when it outlasts a heartbeat.
    last_discrepancy: Option<(Vec<Holder>, Duration)>,
    pending_since: Option<Duration>,
    /// Gave up renewing (drain timeout): waits for its lease to pass, then claims again.
    abandoned: bool,
    /// The nonces of every claim this process attempted.
    own_nonces: Vec<u64>,
    /// The slot table as last read and the store's version of it: a heartbeat whose version
    /// is the same reads nothing and works from this copy.
    seen: Option<(String, Table)>,
}

impl Runner {
    fn slot_key(&self, slot: u32) -> String {
        self.keys.slot(slot)
    }

    fn set_error(&self, e: Option<&Error>) {
        let msg = e.map(|e| e.to_string());
        self.shared.publish(|a| a.last_error = msg);
    }

    async fn list(&self) -> Result<Table> {
        let listing = self.store.list(&self.listing).await?;
        Ok(Table::parse(&self.listing, listing))
    }

    /// The join: waits out a previous incarnation's lease, then claims.
    async fn first_claim(&mut self) -> Result<()> {
        let mut table = self.list().await?;
        self.check_assignor(&table)?;
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
        for _ in 0..16 {
            if self.claim(&table).await? {
                return Ok(());
            }
            table = self.list().await?;
        }
        Err(Error::unavailable(
            self.store.capabilities().backend,
            "lost the race for a free slot 16 times in a row",
            "contention",
        ))
    }

    /// Refuses to join a group whose live members map keys with another assignor: both sides
    /// would grant the same keys.
    fn check_assignor(&self, table: &Table) -> Result<()> {
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

    /// Claims the preferred slot if free, else the lowest free one; on success publishes the
    /// view with this member in it. Returns whether it claimed.
    async fn claim(&mut self, table: &Table) -> Result<bool> {
        let slot = match self.preferred {
            Some(p) if !table.slots.contains_key(&p) && !table.foreign.contains_key(&p) => p,
            _ => table.lowest_free(0),
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
        self.shared.publish(|a| {
            a.slot = Some(slot);
            a.phase = GroupPhase::Joining;
        });
        tracing::info!(group = self.keys.group(), member = %self.member, slot, "claimed a slot");
        let mut table = table.clone();
        table.slots.insert(slot, record);
        self.on_table(table, true).await;
        Ok(true)
    }

    fn deadline(&self, sent: Duration) -> Duration {
        sent + self.ttl - self.ttl / 10
    }

    async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<()> {
        let mut next = self.clock.monotonic() + self.heartbeat;
        loop {
            let fast = self.pending_since.is_some()
                || self.record.is_none()
                || self.last_discrepancy.is_some();
            let wake = if fast {
                next.min(self.clock.monotonic() + self.heartbeat / 4)
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
            if self.clock.monotonic() >= next {
                next = self.clock.monotonic() + self.heartbeat;
            }
            if let Err(e) = self.beat().await {
                if e.kind() == crate::ErrorKind::Rejected {
                    self.fail(&e).await;
                    return Err(e);
                }
            }
        }
        self.leave().await
    }

    /// One heartbeat: renew and read the table, or claim again when the lease is gone.
    async fn beat(&mut self) -> Result<()> {
        let now = self.clock.monotonic();
        let expired = self.shared.lock().deadline.is_some_and(|d| now >= d);
        if expired {
            self.revoke("the lease deadline passed without a renewal");
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
        let store = self.store.clone();
        let (key, text, listing) = (
            self.slot_key(slot),
            record.to_string(),
            self.listing.clone(),
        );
        let result = if !self.change_checks {
            let renewal = store.renew_and_list(&key, &text, self.ttl, &listing);
            self.before_lapse(renewal)
                .await
                .map(|(renewed, listed)| (renewed, Table::parse(&self.listing, listed)))
        } else {
            let since = self.seen.as_ref().map(|(v, _)| v.clone());
            let renewal =
                store.renew_and_list_if_changed(&key, &text, self.ttl, &listing, since.as_deref());
            match self.before_lapse(renewal).await {
                Ok(answer) => self.table_of(answer).await,
                Err(e) => Err(e),
            }
        };
        match result {
            Err(e) => {
                self.set_error(Some(&e));
                Ok(())
            }
            Ok((false, table)) => {
                // A write of ours that reported an error may have been applied after all (an
                // acknowledgement that timed out): the slot then holds our claim with other
                // text. It is still ours; take its text and renew at the next beat.
                if let Some(r) = table.slots.get(&slot) {
                    if r.member == self.member && r.nonce == record.nonce {
                        self.record = Some((slot, r.clone()));
                        return Ok(());
                    }
                }
                self.revoke("the slot was no longer ours at renewal");
                self.record = None;
                self.preferred = Some(slot);
                self.reclaim(&table).await;
                Ok(())
            }
            Ok((true, table)) => {
                {
                    let mut st = self.shared.lock();
                    st.deadline = Some(self.deadline(sent));
                    st.holder = Some(record.holder(slot));
                }
                self.set_error(None);
                self.check_twin(&table, slot).await?;
                self.on_table(table, false).await;
                Ok(())
            }
        }
    }

    /// The slot table a heartbeat's answer stands for: the listing it carries, or the copy kept
    /// from the last one when the store's version of the table is unchanged. Whether the
    /// renewal succeeded comes along.
    async fn table_of(&mut self, answer: RenewedListing) -> Result<(bool, Table)> {
        let table = match answer.listing {
            Some(listing) => Table::parse(&self.listing, listing),
            None => match &self.seen {
                Some((version, table)) if *version == answer.version => table.clone(),
                // The store answered "unchanged" for a version this member does not hold
                // (it asked with the one it holds, so only a faulty store does): read it.
                _ => {
                    self.seen = None;
                    self.list().await?
                }
            },
        };
        self.seen = Some((answer.version, table.clone()));
        Ok((answer.renewed, table))
    }

    /// Awaits a store call; if the lease deadline passes first, stops all work at that instant
    /// (the assignment turns `rejoining` then, not when the call finally returns) and goes on
    /// waiting for the call.
    async fn before_lapse<T>(&mut self, call: impl std::future::Future<Output = T>) -> T {
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
        self.revoke("the lease deadline passed while a renewal was in flight");
        call.await
    }

    /// Claims again after losing the lease. A full group or a store error is retried at the
    /// next beat, never fatal: the member was in the group a moment ago.
    async fn reclaim(&mut self, table: &Table) {
        match self.claim(table).await {
            Ok(_) => self.set_error(None),
            Err(e) => self.set_error(Some(&e)),
        }
    }

    /// Another live slot with our member id: the holder of the higher slot yields. Claims this
    /// process made before (a write that timed out but was applied, a lease given up) are ours,
    /// not a twin's: they are shortened to expire soon instead.
    async fn check_twin(&mut self, table: &Table, slot: u32) -> Result<()> {
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
    fn revoke(&mut self, why: &str) {
        let had = {
            let mut st = self.shared.lock();
            let had = st.active.is_some() || st.pending.is_some() || st.deadline.is_some();
            st.generation += 1;
            st.active = None;
            st.pending = None;
            st.skipped.clear();
            st.deadline = None;
            st.in_flight.clear();
            st.share_in_flight = 0;
            had
        };
        self.pending_since = None;
        if had {
            tracing::warn!(group = self.keys.group(), member = %self.member, "{why}: stopped all work");
        }
        self.shared.publish(|a| {
            a.index = None;
            a.phase = GroupPhase::Rejoining;
        });
    }

    /// Publishes a view when the table calls for one, adopts the newest view, and moves the
    /// hand-off along.
    async fn on_table(&mut self, table: Table, own_change: bool) {
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
            let st = self.shared.lock();
            match (st.target(), &table.view) {
                (Some(t), Some(v)) => t.epoch() == v.epoch && t.record().holders != v.holders,
                _ => false,
            }
        };
        let stale = match &table.view {
            Some(v) => v.holders != live || v.epoch < floor || twin_epoch,
            None => true,
        };
        self.highest = floor;
        if stale {
            let lowest = live.first().map(|h| h.slot) == my_slot && my_slot.is_some();
            let now = self.clock.monotonic();
            let since = match &self.last_discrepancy {
                Some((seen, since)) if *seen == live => *since,
                _ => now,
            };
            let again = now.saturating_sub(since) >= self.heartbeat;
            if self.highest >= MAX_EPOCH {
                let e = Error::foreign(
                    &self.view_key,
                    "an epoch below the largest one (a view or acknowledgement holds it: stop every member and delete the group's keys to start again)",
                    &self.highest.to_string(),
                );
                self.set_error(Some(&e));
                self.last_discrepancy = Some((live, since));
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
                        self.highest = next.epoch;
                        newest = Some(next);
                        self.last_discrepancy = None;
                    }
                    // Someone else changed the view since this listing (or the reply was lost):
                    // the view in the listing is stale, so adopt nothing and list again at the
                    // next (quarter-heartbeat) beat.
                    Ok(false) => {
                        newest = None;
                        self.last_discrepancy = Some((live, since));
                    }
                    Err(e) => {
                        newest = None;
                        self.set_error(Some(&e));
                        self.last_discrepancy = Some((live, since));
                    }
                }
            } else {
                self.last_discrepancy = Some((live, since));
            }
        } else {
            self.last_discrepancy = None;
        }
        if let Some(v) = newest {
            self.adopt(v);
        }
        self.progress(Some(&table)).await;
    }

    /// Makes `view` the pending view when it is newer than what the member has.
    fn adopt(&mut self, view: ViewRecord) {
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
            if let Some(old) = st.pending.replace(state) {
                st.skipped.push(old);
            }
            st.active.is_some()
        };
        if self.pending_since.is_none() {
            self.pending_since = Some(self.clock.monotonic());
        }
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
    async fn progress(&mut self, table: Option<&Table>) {
        let (pending, active) = {
            let st = self.shared.lock();
            (st.pending.clone(), st.active.clone())
        };
        if pending.is_none() {
            // An acknowledgement the store lost (it rolled back, or a write timed out and was
            // not applied) is written again: the others wait for it.
            if let Some(active) = active {
                let lost = self
                    .record
                    .as_ref()
                    .is_some_and(|(_, r)| !active.acked_by(r));
                if lost && !self.abandoned {
                    self.acknowledge(&active).await;
                }
            }
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
        if !pending.acked_by(&record) && !self.acknowledge(&pending).await {
            return;
        }
        let others_acked = match table {
            Some(t) => t
                .slots
                .iter()
                .all(|(&s, r)| s == slot || pending.acked_by(r)),
            None => false,
        };
        if same_holders || others_acked {
            self.activate(pending, record.holder(slot));
        }
    }

    /// Writes the acknowledgement of `view` into the member's slot record. Returns whether it
    /// did.
    async fn acknowledge(&mut self, view: &ViewState) -> bool {
        let Some((slot, record)) = self.record.clone() else {
            return false;
        };
        let acked = SlotRecord {
            acked: view.epoch(),
            view: view.digest,
            ..record.clone()
        };
        let sent = self.clock.monotonic();
        match self
            .store
            .compare_and_set(
                &self.slot_key(slot),
                Some(&record.to_string()),
                &acked.to_string(),
                Some(self.ttl),
            )
            .await
        {
            Ok(true) => {
                self.record = Some((slot, acked));
                self.shared.lock().deadline = Some(self.deadline(sent));
                true
            }
            Ok(false) => {
                // An earlier acknowledgement whose reply was lost may have been applied: the
                // slot then holds this very text, and the claim is still ours.
                if let Ok(Some(now)) = self.store.get(&self.slot_key(slot)).await {
                    if now == acked.to_string() {
                        self.record = Some((slot, acked));
                        return true;
                    }
                }
                self.revoke("the slot was no longer ours at acknowledgement");
                self.record = None;
                self.preferred = Some(slot);
                false
            }
            Err(e) => {
                self.set_error(Some(&e));
                false
            }
        }
    }

    fn activate(&mut self, view: Arc<ViewState>, holder: Holder) {
        let from = {
            let mut st = self.shared.lock();
            if st.pending.as_ref().map(|p| p.epoch()) != Some(view.epoch()) {
                return;
            }
            st.pending = None;
            st.skipped.clear();
            st.active.replace(view.clone())
        };
        self.pending_since = None;
        let slot = holder.slot;
        let pair = view.pair_of(holder);
        let live: Vec<u32> = view.record.slots().collect();
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
    async fn fail(&mut self, e: &Error) {
        tracing::error!(group = self.keys.group(), member = %self.member, "{e}");
        let _ = self.leave().await;
        let msg = e.to_string();
        self.shared.publish(|a| {
            a.phase = GroupPhase::Failed;
            a.last_error = Some(msg);
        });
    }

    /// Stops granting, drains, deletes the slot and publishes the view without it.
    async fn leave(&mut self) -> Result<()> {
        self.shared.lock().leaving = true;
        let give_up = self.clock.monotonic() + self.drain_timeout;
        let drained = loop {
            let busy = {
                let st = self.shared.lock();
                st.in_flight.values().any(|&n| n > 0) || st.share_in_flight > 0
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
            st.deadline = None;
            st.holder = None;
        }
        self.shared.publish(|a| {
            a.slot = None;
            a.index = None;
            a.phase = GroupPhase::Stopped;
        });
        result
    }
}

/// What `headcount status` shows: the slot table, the published view and ownership of a
/// sample of keys.
#[derive(Debug, Clone)]
pub struct GroupStatus {
    /// The parsed slot table.
    pub table: Table,
    /// Whether the published view names exactly the live slots.
    pub view_current: bool,
    /// For each live slot of the published view, how many of the sampled keys it owns.
    pub sample_owned: Vec<(u32, u64)>,
}

/// Reads a group's slot table and view, and counts which slot owns each of the keys `0..sample`
/// (as decimal strings) under the published view with the assignor it names (`assignor` for a
/// view that names none).
pub async fn status(
    store: &DynStore,
    prefix: &str,
    group: &str,
    assignor: AssignorKind,
    sample: u64,
) -> Result<GroupStatus> {
    let keys = Keyspace::with_prefix(prefix, group)?;
    let listing_prefix = keys.key("slot:");
    let table = Table::parse(&listing_prefix, store.list(&listing_prefix).await?);
    let view_current = table
        .view
        .as_ref()
        .is_some_and(|v| v.holders == table.live());
    let mut sample_owned = Vec::new();
    if let Some(v) = &table.view {
        // The view names the assignor its publisher used; `assignor` is for older views.
        let state = ViewState::build(v.clone(), v.assignor.unwrap_or(assignor))?;
        let mut counts: std::collections::BTreeMap<u32, u64> = v.slots().map(|s| (s, 0)).collect();
        for k in 0..sample {
            if let Some(owner) = state.owner(hash_bytes(k.to_string().as_bytes())) {
                *counts.entry(owner).or_insert(0) += 1;
            }
        }
        sample_owned = counts.into_iter().collect();
    }
    Ok(GroupStatus {
        table,
        view_current,
        sample_owned,
    })
}
