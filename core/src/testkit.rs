//! A test kit for code that uses a [group](crate::recipes::group): run a whole group in memory on
//! a [`ManualClock`], crash, pause, restart and leave its members, and wait until it has
//! converged, in milliseconds of real time and without a real sleep.
//!
//! It is compiled only with the cargo feature `testkit`, which a service turns on for its tests
//! alone:
//!
//! ```toml
//! [dev-dependencies]
//! headcount = { version = "0.1", features = ["testkit"] }
//! ```
//!
//! # Using it
//!
//! Start a [`TestGroup`] of `n` members in your test and wait for it to converge; then do to the
//! members what production will do to your service, and check what your code does:
//!
//! * [`TestGroup::start`] joins `n` members (ids `m0`, `m1`, ...) on one [`MemoryStore`] and
//!   waits until they converge; [`TestGroup::builder`] sets the lease TTL, the assignor, the
//!   member ids or anything else of the [`GroupConfig`];
//! * [`TestGroup::member`] is the `i`-th member's [`Member`] handle, as your service holds it:
//!   pass it to the code under test, or ask it [`Member::owns`];
//! * [`TestGroup::crash`] kills a member without leaving (its keys move once its lease runs out
//!   on the manual clock), [`TestGroup::pause`] stalls it as `SIGSTOP` would (its heartbeats
//!   stop, its handle lives on, its grants turn invalid at its lease deadline),
//!   [`TestGroup::resume`] lets it go on, [`TestGroup::restart`] crashes it and joins again with
//!   the same member id, [`TestGroup::leave`] leaves gracefully (its keys move at once) and
//!   [`TestGroup::join`] adds a member ([`TestGroup::join_with`] one with a configuration of its
//!   own: a standby, a crash grace);
//! * [`TestGroup::leave_for_restart`] then [`TestGroup::restart`] is a static restart (its place
//!   waits, no key moves), [`TestGroup::crash`] then [`TestGroup::restart`] a crash-restart (with
//!   [`GroupConfig::with_crash_grace`] in [`TestGroupBuilder::configure`], no key moves either),
//!   and [`TestGroup::store_down`] / [`TestGroup::store_up`] an outage of the store;
//! * [`TestGroup::converged`] moves the manual clock in small steps until every running member
//!   is active under one view whose live slots are exactly the running members, or fails with
//!   [`KitError::NotConverged`] naming those that are not, after a bound of simulated time
//!   ([`TestGroupBuilder::limit`]);
//! * [`TestGroup::wait_until`] moves the clock the same way until a condition of yours holds
//!   (your service processed a key, a member reports a phase);
//! * [`TestGroup::advance`] lets simulated time pass (in the same small steps, so the members
//!   keep renewing), [`TestGroup::owner_of`] says which member would grant a key now, and
//!   [`TestGroup::assert_exclusive`] that no key is granted by two members at once.
//!
//! In a test, `#[tokio::test] async fn failover() -> Result<(), KitError>` runs this:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), headcount_core::testkit::KitError> {
//! use std::time::Duration;
//!
//! use headcount_core::testkit::TestGroup;
//!
//! let mut group = TestGroup::start("orders", 3).await?;
//! let keys: Vec<String> = (0..64).map(|i| format!("order-{i}")).collect();
//! let before = group.owner_of("order-7").expect("a converged group grants every key");
//!
//! // The owner of order-7 crashes: nobody grants it until its lease runs out (6 s of simulated
//! // time, no real time), then another member does.
//! group.crash(before);
//! group.advance(Duration::from_secs(1)).await;
//! assert_eq!(group.owner_of("order-7"), None);
//! group.converged().await?;
//! let after = group.owner_of("order-7").expect("taken over");
//! assert_ne!(after, before);
//! group.assert_exclusive(&keys);
//!
//! // It comes back with the same member id.
//! group.restart(before).await?;
//! group.converged().await?;
//! assert_eq!(group.running().len(), 3);
//! # Ok(())
//! # }
//! ```
//!
//! # Runtime
//!
//! Run the kit on Tokio's current-thread runtime, the default of `#[tokio::test]`; it panics on
//! a multi-thread one. The members' heartbeats are ordinary Tokio tasks sleeping on the manual
//! clock: after each step of the clock the kit yields until none of them has touched the store
//! for a while, so they have all done what that step woke them for before the next step. On
//! other worker threads they would run beside the kit instead, fall behind the clock and lose
//! leases that they would not lose in production. Tokio's paused time (`start_paused = true`)
//! is not needed, and does no harm.
//!
//! Your own tasks (a worker per member, say) run between the steps too, woken by the members'
//! watches as in production. Their calls through [`TestGroup::store`] count as activity as the
//! members' do; other work of theirs gets the same quiet period of yields but is not watched,
//! so after a change call [`TestGroup::run_pending`] (or [`TestGroup::advance`]) before you check
//! what they did. A timer on Tokio's own time does not follow the manual clock: give your
//! service the kit's clock ([`TestGroup::clock`]) wherever it sleeps.
//!
//! Dropping the kit drops its handles: the members stop without leaving, as in a crash.
//!
//! The members share one [`MemoryStore`] on the same manual clock, so leases expire on
//! simulated time too; each member reaches it through a layer of its own, which is how
//! [`TestGroup::pause`] stalls one member's calls and no other's.

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::assign::AssignorKind;
use crate::clock::{Clock, ManualClock};
use crate::decorated::{Decorated, Hooks};
use crate::error::{Error, Result};
use crate::memory::MemoryStore;
use crate::recipes::group::{
    Assignment, Group, GroupConfig, GroupPhase, Member, DEFAULT_GROUP_TTL,
};
use crate::{DynStore, Op};

/// How many yields in a row without a store call count as "every task is waiting".
const QUIET_YIELDS: u32 = 16;

/// The most yields after one step of the clock, whatever the tasks do.
const MAX_YIELDS: u32 = 20_000;

/// What a member of a [`TestGroup`] is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemberState {
    /// Heartbeating normally.
    Running,
    /// Stalled by [`TestGroup::pause`]: its store calls wait until [`TestGroup::resume`].
    Paused,
    /// Killed by [`TestGroup::crash`]: its handle is gone and its lease runs out.
    Crashed,
    /// Left by [`TestGroup::leave`].
    Left,
}

/// Why a [`TestGroup`] call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KitError {
    /// [`Group::join`] or [`Member::leave`] failed.
    #[error("member {index} (`{member}`) could not {action}: {source}")]
    Group {
        /// The member's index in the kit.
        index: usize,
        /// The member id.
        member: String,
        /// `join` or `leave`.
        action: &'static str,
        /// The group's error.
        source: Error,
    },
    /// A join or a leave did not finish within the kit's bound of simulated time.
    #[error("member {index} (`{member}`) did not {action} within {waited:?} of simulated time")]
    Stuck {
        /// The member's index in the kit.
        index: usize,
        /// The member id.
        member: String,
        /// `join` or `leave`.
        action: &'static str,
        /// The simulated time waited.
        waited: Duration,
    },
    /// A [`TestGroup::wait_until`] condition did not hold within the kit's bound of simulated
    /// time.
    #[error("not {what} within {waited:?} of simulated time")]
    Timeout {
        /// What was waited for, as the caller named it.
        what: String,
        /// The simulated time waited.
        waited: Duration,
    },
    /// The group did not converge within the kit's bound of simulated time.
    #[error(transparent)]
    NotConverged(#[from] NotConverged),
}

/// The group did not converge: who was not where, when [`TestGroup::converged`] gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotConverged {
    /// The simulated time waited.
    pub waited: Duration,
    /// The slots of the running members.
    pub expected: Vec<u32>,
    /// The running members that were not active under a view of exactly those slots, or not
    /// under the same epoch as the others: `(index, assignment)`.
    pub laggards: Vec<(usize, Assignment)>,
}

impl fmt::Display for NotConverged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the group did not converge within {:?} of simulated time (running slots {:?}):",
            self.waited, self.expected
        )?;
        for (i, a) in &self.laggards {
            write!(
                f,
                " member {i} (`{}`) is {} at epoch {} with live slots {:?}{}{};",
                a.member,
                a.phase.as_str(),
                a.epoch,
                a.live,
                a.slot.map(|s| format!(", slot {s}")).unwrap_or_default(),
                a.last_error
                    .as_deref()
                    .map(|e| format!(", last error: {e}"))
                    .unwrap_or_default()
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for NotConverged {}

/// A converged group: the view every running member is active under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converged {
    /// The view's epoch.
    pub epoch: u64,
    /// Its live slots, ascending.
    pub live: Vec<u32>,
    /// The simulated time it took.
    pub waited: Duration,
}

/// How a [`TestGroup`] is made: see [`TestGroup::builder`].
#[must_use]
pub struct TestGroupBuilder {
    name: String,
    members: usize,
    ttl: Duration,
    assignor: Option<AssignorKind>,
    ids: Vec<String>,
    step: Option<Duration>,
    limit: Option<Duration>,
    configure: Option<Configure>,
    layer: Option<Layer>,
}

type Configure = Arc<dyn Fn(GroupConfig) -> GroupConfig + Send + Sync>;

type Layer = Arc<dyn Fn(usize, DynStore, Arc<dyn Clock>) -> DynStore + Send + Sync>;

impl fmt::Debug for TestGroupBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestGroupBuilder")
            .field("name", &self.name)
            .field("members", &self.members)
            .field("ttl", &self.ttl)
            .field("assignor", &self.assignor)
            .field("ids", &self.ids)
            .field("step", &self.step)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl TestGroupBuilder {
    /// How many members to start with (default 1).
    pub fn members(mut self, n: usize) -> Self {
        self.members = n;
        self
    }

    /// The lease TTL (default [`DEFAULT_GROUP_TTL`], 6 s of simulated time: it costs no real
    /// time, so keep the one production uses).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The assignor every member uses (default: [`GroupConfig::new`]'s).
    pub fn assignor(mut self, assignor: AssignorKind) -> Self {
        self.assignor = Some(assignor);
        self
    }

    /// The member ids of the first members, in order; those not named are `m{index}`.
    pub fn member_ids<I: IntoIterator<Item = S>, S: Into<String>>(mut self, ids: I) -> Self {
        self.ids = ids.into_iter().map(Into::into).collect();
        self
    }

    /// Changes every member's [`GroupConfig`] further, after the kit set the group, TTL, clock,
    /// member id and assignor: a drain timeout, a slot limit, ...
    pub fn configure(
        mut self,
        f: impl Fn(GroupConfig) -> GroupConfig + Send + Sync + 'static,
    ) -> Self {
        self.configure = Some(Arc::new(f));
        self
    }

    /// Puts a layer of yours between each member and the shared store: `f` gets the member's
    /// index, the store it would use and the kit's clock, and returns the store it uses
    /// instead. For faults the kit does not make itself: a store that is down for one member
    /// ([`FaultyStore`](crate::sim::FaultyStore) with [`Faults::set_down`](crate::sim::Faults::set_down)),
    /// delayed or lost replies (time the delays on the clock given), a store that misbehaves
    /// as a backend might. A restarted member gets a new layer.
    pub fn layer(
        mut self,
        f: impl Fn(usize, DynStore, Arc<dyn Clock>) -> DynStore + Send + Sync + 'static,
    ) -> Self {
        self.layer = Some(Arc::new(f));
        self
    }

    /// How far the manual clock moves in one step (default a twentieth of the TTL). Every
    /// member runs between two steps.
    pub fn step(mut self, step: Duration) -> Self {
        self.step = Some(step);
        self
    }

    /// How much simulated time [`TestGroup::converged`], [`TestGroup::wait_until`], a join and a
    /// leave wait before they give up (default 20 TTLs).
    pub fn limit(mut self, limit: Duration) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Joins the members one after the other and waits until the group has converged.
    pub async fn start(self) -> std::result::Result<TestGroup, KitError> {
        let mut group = self.build();
        for _ in 0..group.initial {
            group.join().await?;
        }
        group.converged().await?;
        Ok(group)
    }

    /// The group with no member yet: add them with [`TestGroup::join`].
    ///
    /// # Panics
    ///
    /// On a multi-thread Tokio runtime (see [Runtime](self#runtime)).
    #[track_caller]
    pub fn build(self) -> TestGroup {
        refuse_multi_thread();
        let clock = ManualClock::at_unix_secs(1_700_000_000);
        let clock_dyn: Arc<dyn Clock> = Arc::new(clock.clone());
        let step = self
            .step
            .unwrap_or(self.ttl / 20)
            .max(Duration::from_millis(1));
        TestGroup {
            name: self.name,
            store: MemoryStore::with_clock(clock_dyn),
            clock,
            ttl: self.ttl,
            assignor: self.assignor,
            ids: self.ids,
            configure: self.configure,
            layer: self.layer,
            step,
            limit: self.limit.unwrap_or(self.ttl * 20),
            calls: Arc::new(AtomicU64::new(0)),
            down: Arc::new(AtomicBool::new(false)),
            members: Vec::new(),
            initial: self.members,
        }
    }
}

/// Panics on a multi-thread runtime, where the kit cannot tell when the members are done.
#[allow(clippy::panic)] // A test set up on the wrong runtime: said at once, not as a flaky stall.
#[track_caller]
fn refuse_multi_thread() {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        if rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            panic!(
                "headcount's TestGroup needs Tokio's current-thread runtime (`#[tokio::test]`, \
                 not `flavor = \"multi_thread\"`): on other worker threads the members fall \
                 behind the manual clock and lose their leases"
            );
        }
    }
}

/// The kit's layer between one member and the shared store: counts calls (so the kit knows
/// when every task is waiting) and holds them while the member is paused.
#[derive(Debug)]
struct Gate {
    calls: Arc<AtomicU64>,
    paused: watch::Sender<bool>,
    /// The store is down for every member ([`TestGroup::store_down`]).
    down: Arc<AtomicBool>,
}

impl Gate {
    async fn pass(&self) {
        let mut rx = self.paused.subscribe();
        // The sender lives in `self`, which outlives this call.
        let _ = rx.wait_for(|paused| !*paused).await;
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Hooks for Arc<Gate> {
    async fn before(&self, op: Op) -> Result<()> {
        self.pass().await;
        if self.down.load(Ordering::Relaxed) {
            return Err(Error::Unavailable {
                backend: "memory",
                message: format!("the test kit's store is down (`{op:?}` did not reach it)"),
                source: None,
            });
        }
        Ok(())
    }

    async fn after(&self, _op: Op, _took: Duration) -> Result<()> {
        // A stalled process does not see the reply until it runs again.
        self.pass().await;
        Ok(())
    }
}

/// One member of the kit, across its restarts.
struct Slot {
    id: String,
    handle: Option<Member>,
    gate: Arc<Gate>,
    state: MemberState,
}

/// A group of members on one in-memory store and one [`ManualClock`]: see the
/// [module docs](self).
///
/// Members are numbered from 0 in the order they joined; a number stays the member's through
/// crashes, restarts and leaves.
pub struct TestGroup {
    name: String,
    store: MemoryStore,
    clock: ManualClock,
    ttl: Duration,
    assignor: Option<AssignorKind>,
    ids: Vec<String>,
    configure: Option<Configure>,
    layer: Option<Layer>,
    step: Duration,
    limit: Duration,
    calls: Arc<AtomicU64>,
    /// The store is down for every member ([`TestGroup::store_down`]).
    down: Arc<AtomicBool>,
    members: Vec<Slot>,
    initial: usize,
}

impl fmt::Debug for TestGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("TestGroup");
        d.field("name", &self.name)
            .field("now", &self.clock.monotonic());
        let members: Vec<_> = self
            .members
            .iter()
            .map(|s| (&s.id, s.state, s.handle.as_ref().map(Member::assignment)))
            .collect();
        d.field("members", &members).finish_non_exhaustive()
    }
}

impl TestGroup {
    /// Starts `n` members of group `name` with the kit's defaults and waits until they have
    /// converged.
    pub async fn start(name: impl Into<String>, n: usize) -> std::result::Result<Self, KitError> {
        Self::builder(name).members(n).start().await
    }

    /// A builder for group `name`: set the TTL, the assignor, the member ids, then
    /// [`start`](TestGroupBuilder::start).
    pub fn builder(name: impl Into<String>) -> TestGroupBuilder {
        TestGroupBuilder {
            name: name.into(),
            members: 1,
            ttl: DEFAULT_GROUP_TTL,
            assignor: None,
            ids: Vec::new(),
            step: None,
            limit: None,
            configure: None,
            layer: None,
        }
    }

    /// The manual clock every member and the store run on. Moving it yourself by more than a
    /// step at once skips heartbeats, as a host suspend would; [`TestGroup::advance`] does not.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// The store the members share (no member's pause applies to it; the kit counts your calls
    /// through it as activity, see [Runtime](self#runtime)): for
    /// [`status`](crate::recipes::group::status), or for code under test that needs its own
    /// store handle.
    pub fn store(&self) -> DynStore {
        Arc::new(Decorated::with(
            Arc::new(self.store.clone()) as DynStore,
            self.new_gate(),
        ))
    }

    /// The in-memory store itself (for [`MemoryStore::snapshot`] and
    /// [`MemoryStore::restore`]).
    pub fn memory(&self) -> &MemoryStore {
        &self.store
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How many members were ever added (the next [`TestGroup::join`] gets this index).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether no member was ever added.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`'s state. Panics when there is no member `i`.
    pub fn state(&self, i: usize) -> MemberState {
        self.slot(i).state
    }

    /// Member `i`'s id. Panics when there is no member `i`.
    pub fn id(&self, i: usize) -> &str {
        &self.slot(i).id
    }

    /// The indices of the running members (not paused, crashed or left).
    pub fn running(&self) -> Vec<usize> {
        self.indices(|s| s == MemberState::Running)
    }

    /// The indices of the members with a live handle: running or paused.
    pub fn alive(&self) -> Vec<usize> {
        self.indices(|s| matches!(s, MemberState::Running | MemberState::Paused))
    }

    fn indices(&self, keep: impl Fn(MemberState) -> bool) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| keep(self.members[i].state))
            .collect()
    }

    #[allow(clippy::panic)] // An index out of range is the test's mistake, as with a slice.
    fn slot(&self, i: usize) -> &Slot {
        match self.members.get(i) {
            Some(s) => s,
            None => panic!(
                "test group `{}` has no member {i} (it has {})",
                self.name,
                self.members.len()
            ),
        }
    }

    #[allow(clippy::panic)] // As `slot`.
    fn slot_mut(&mut self, i: usize) -> &mut Slot {
        let (name, len) = (self.name.clone(), self.members.len());
        match self.members.get_mut(i) {
            Some(s) => s,
            None => panic!("test group `{name}` has no member {i} (it has {len})"),
        }
    }

    /// Member `i`'s handle, running or paused. Panics when it crashed or left (see
    /// [`TestGroup::try_member`]).
    #[allow(clippy::panic)] // As indexing a slice: the test asked for a member that is gone.
    pub fn member(&self, i: usize) -> &Member {
        let s = self.slot(i);
        match &s.handle {
            Some(m) => m,
            None => panic!(
                "member {i} (`{}`) of test group `{}` is {:?}: it has no handle",
                s.id, self.name, s.state
            ),
        }
    }

    /// Member `i`'s handle, `None` when it crashed or left or there is no member `i`.
    pub fn try_member(&self, i: usize) -> Option<&Member> {
        self.members.get(i).and_then(|s| s.handle.as_ref())
    }

    /// Joins one more member (id `m{index}` unless [`TestGroupBuilder::member_ids`] named it)
    /// and returns its index. Does not wait for the group to converge.
    pub async fn join(&mut self) -> std::result::Result<usize, KitError> {
        self.join_with(|c| c).await
    }

    /// [`TestGroup::join`] with the member's [`GroupConfig`] changed further by `f`, for this
    /// member alone: a standby (`|c| c.with_standby(wait)`, which waits until a member leaves
    /// or its wait ends), a crash grace. A restart of this member uses the kit's configuration.
    pub async fn join_with(
        &mut self,
        f: impl FnOnce(GroupConfig) -> GroupConfig,
    ) -> std::result::Result<usize, KitError> {
        let i = self.members.len();
        let id = self.ids.get(i).cloned().unwrap_or_else(|| format!("m{i}"));
        self.members.push(Slot {
            id,
            handle: None,
            gate: self.new_gate(),
            state: MemberState::Crashed,
        });
        match self.start_member_with(i, f).await {
            Ok(()) => Ok(i),
            Err(e) => {
                self.members.pop();
                Err(e)
            }
        }
    }

    fn new_gate(&self) -> Arc<Gate> {
        Arc::new(Gate {
            calls: self.calls.clone(),
            paused: watch::Sender::new(false),
            down: self.down.clone(),
        })
    }

    fn config(&self, id: &str) -> GroupConfig {
        let mut c = GroupConfig::new(self.name.clone(), self.ttl)
            .with_clock(Arc::new(self.clock.clone()))
            .with_member(id);
        if let Some(a) = self.assignor {
            c = c.with_assignor(a);
        }
        if let Some(f) = &self.configure {
            c = f(c);
        }
        c
    }

    /// Joins member `i` afresh, through a new gate, with its id.
    async fn start_member(&mut self, i: usize) -> std::result::Result<(), KitError> {
        self.start_member_with(i, |c| c).await
    }

    /// [`TestGroup::start_member`] with the configuration changed by `f`.
    async fn start_member_with(
        &mut self,
        i: usize,
        f: impl FnOnce(GroupConfig) -> GroupConfig,
    ) -> std::result::Result<(), KitError> {
        let gate = self.new_gate();
        let id = self.slot(i).id.clone();
        let mut store = Arc::new(self.store.clone()) as DynStore;
        if let Some(layer) = &self.layer {
            store = layer(i, store, Arc::new(self.clock.clone()));
        }
        let store: DynStore = Arc::new(Decorated::with(store, gate.clone()));
        let config = f(self.config(&id));
        let joined = self
            .drive(i, "join", async move { Group::join(store, config).await })
            .await?;
        let member = joined.map_err(|source| KitError::Group {
            index: i,
            member: id,
            action: "join",
            source,
        })?;
        let slot = self.slot_mut(i);
        slot.handle = Some(member);
        slot.gate = gate;
        slot.state = MemberState::Running;
        Ok(())
    }

    /// Kills member `i` without leaving: its heartbeat stops and the kit drops its handle, so
    /// its lease runs out after the TTL on the manual clock and the others take its keys then.
    /// A clone of its [`Member`] you kept stays cut off from the store. Does nothing to a member
    /// that already crashed or left.
    pub fn crash(&mut self, i: usize) {
        let slot = self.slot_mut(i);
        if matches!(slot.state, MemberState::Crashed | MemberState::Left) {
            return;
        }
        // Held for good: a clone of the handle can never reach the store again.
        slot.gate.paused.send_replace(true);
        slot.handle = None;
        slot.state = MemberState::Crashed;
    }

    /// Stalls member `i` as `SIGSTOP` would: every store call it makes (or has in flight) waits
    /// until [`TestGroup::resume`], so it stops renewing; its handle lives on, and its grants
    /// turn invalid at its lease deadline on the manual clock. Does nothing unless it is
    /// running.
    pub fn pause(&mut self, i: usize) {
        let slot = self.slot_mut(i);
        if slot.state == MemberState::Running {
            slot.gate.paused.send_replace(true);
            slot.state = MemberState::Paused;
        }
    }

    /// Lets a paused member go on: its held calls complete and it renews, or finds its lease
    /// lost and claims again. Does nothing unless it is paused.
    pub fn resume(&mut self, i: usize) {
        let slot = self.slot_mut(i);
        if slot.state == MemberState::Paused {
            slot.gate.paused.send_replace(false);
            slot.state = MemberState::Running;
        }
    }

    /// [`Crashes`](TestGroup::crash) member `i` (unless it is already gone) and joins again with
    /// the same member id, as a restarted process would. The join waits out the old lease on
    /// the manual clock, the others heartbeating meanwhile; it gets its old slot back when that
    /// is still free. Does not wait for the group to converge.
    pub async fn restart(&mut self, i: usize) -> std::result::Result<(), KitError> {
        self.crash(i);
        self.start_member(i).await
    }

    /// Member `i` leaves gracefully ([`Member::leave`]): its grants drain, its slot is deleted
    /// and the view without it published, so the others take its keys without waiting for a
    /// lease to run out. A paused member is resumed first. Does not wait for the group to
    /// converge. Does nothing to a member that crashed or left.
    pub async fn leave(&mut self, i: usize) -> std::result::Result<(), KitError> {
        self.leave_with(i, false).await
    }

    /// Member `i` leaves for a restart ([`Member::leave_for_restart`]): its grants drain and
    /// its claim is parked for the restart window, its keys waiting for it. Start it again with
    /// [`TestGroup::restart`] (within the window: it takes its place back and no key moves).
    /// Needs an explicit member id, which every kit member has. Does nothing to a member that
    /// crashed or left.
    pub async fn leave_for_restart(&mut self, i: usize) -> std::result::Result<(), KitError> {
        self.leave_with(i, true).await
    }

    /// Member `i` leaves, for a restart when `restart` says so.
    async fn leave_with(&mut self, i: usize, restart: bool) -> std::result::Result<(), KitError> {
        self.resume(i);
        let slot = self.slot_mut(i);
        let Some(member) = slot.handle.take() else {
            return Ok(());
        };
        slot.state = MemberState::Left;
        let id = slot.id.clone();
        let left = if restart {
            self.drive(i, "leave", member.leave_for_restart()).await?
        } else {
            self.drive(i, "leave", member.leave()).await?
        };
        left.map_err(|source| KitError::Group {
            index: i,
            member: id,
            action: "leave",
            source,
        })
    }

    /// The store goes down for every member: each of their calls fails with
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable), as when a Redis or a PostgreSQL
    /// restarts or fails over, until [`TestGroup::store_up`]. Its data is kept, and its TTLs run
    /// on (a slot whose lease was not renewed expires meanwhile, as on a real server).
    pub fn store_down(&self) {
        self.down.store(true, Ordering::Relaxed);
    }

    /// The store answers again (see [`TestGroup::store_down`]).
    pub fn store_up(&self) {
        self.down.store(false, Ordering::Relaxed);
    }

    /// Runs `work` in a task of its own, stepping the clock until it finishes.
    async fn drive<T: Send + 'static>(
        &self,
        i: usize,
        action: &'static str,
        work: impl Future<Output = T> + Send + 'static,
    ) -> std::result::Result<T, KitError> {
        let task = tokio::spawn(work);
        let (finished, waited) = self
            .step_until(|_| if task.is_finished() { Ok(()) } else { Err(()) })
            .await;
        if finished.is_ok() {
            match task.await {
                Ok(out) => return Ok(out),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => {}
            }
        } else {
            task.abort();
        }
        Err(KitError::Stuck {
            index: i,
            member: self.slot(i).id.clone(),
            action,
            waited,
        })
    }

    /// Steps the clock, every task running in between, until `check` answers `Ok` (checked
    /// before the first step), or the kit's limit of simulated time passed: then its last `Err`.
    /// Also returns the simulated time waited.
    async fn step_until<T, E>(
        &self,
        mut check: impl FnMut(&Self) -> std::result::Result<T, E>,
    ) -> (std::result::Result<T, E>, Duration) {
        let start = self.clock.monotonic();
        loop {
            self.run_tasks().await;
            let waited = self.clock.monotonic() - start;
            match check(self) {
                Ok(out) => return (Ok(out), waited),
                Err(e) if waited >= self.limit => return (Err(e), waited),
                Err(_) => self.clock.advance(self.step),
            }
        }
    }

    /// Lets every task run until they all wait (on the clock, or on a paused member's gate):
    /// yields until no store call was made for a number of yields in a row.
    async fn run_tasks(&self) {
        let mut last = self.calls.load(Ordering::Relaxed);
        let mut quiet = 0;
        for _ in 0..MAX_YIELDS {
            tokio::task::yield_now().await;
            let now = self.calls.load(Ordering::Relaxed);
            if now == last {
                quiet += 1;
                if quiet >= QUIET_YIELDS {
                    return;
                }
            } else {
                (last, quiet) = (now, 0);
            }
        }
    }

    /// Lets every member run without moving the clock: what they do at once (a leave published,
    /// a view adopted) is done afterwards.
    pub async fn run_pending(&self) {
        self.run_tasks().await;
    }

    /// Lets `d` of simulated time pass, in steps (see [`TestGroupBuilder::step`]) with every
    /// member running in between, so running members keep renewing their leases.
    pub async fn advance(&self, d: Duration) {
        let end = self.clock.monotonic() + d;
        self.run_tasks().await;
        loop {
            let now = self.clock.monotonic();
            if now >= end {
                return;
            }
            self.clock.advance(self.step.min(end - now));
            self.run_tasks().await;
        }
    }

    /// Moves the clock in steps until the group has converged: every running member is
    /// [`Active`](GroupPhase::Active) under the same epoch, and that view's live slots are
    /// exactly the running members' slots (paused members are not counted: once they are out
    /// of the view, the group has converged without them). Fails with
    /// [`KitError::NotConverged`], naming the members that were not, after the kit's limit of
    /// simulated time ([`TestGroupBuilder::limit`]).
    pub async fn converged(&self) -> std::result::Result<Converged, KitError> {
        match self.step_until(Self::check_converged).await {
            (Ok((epoch, live)), waited) => Ok(Converged {
                epoch,
                live,
                waited,
            }),
            (Err((expected, laggards)), waited) => Err(NotConverged {
                waited,
                expected,
                laggards,
            }
            .into()),
        }
    }

    /// Moves the clock in steps, every member running in between, until `done` holds, and
    /// returns the simulated time that took; fails with [`KitError::Timeout`] naming `what`
    /// after the kit's limit of simulated time ([`TestGroupBuilder::limit`]). `done` is checked
    /// before the first step, so a condition that already holds costs nothing. The polling
    /// `wait_until` of a real-time test, on simulated time.
    pub async fn wait_until(
        &self,
        what: impl Into<String>,
        mut done: impl FnMut(&Self) -> bool,
    ) -> std::result::Result<Duration, KitError> {
        match self
            .step_until(|g| if done(g) { Ok(()) } else { Err(()) })
            .await
        {
            (Ok(()), waited) => Ok(waited),
            (Err(()), waited) => Err(KitError::Timeout {
                what: what.into(),
                waited,
            }),
        }
    }

    /// Whether the group has converged (see [`TestGroup::converged`]) right now, without moving
    /// the clock or letting a task run.
    pub fn is_converged(&self) -> bool {
        self.check_converged().is_ok()
    }

    /// The converged view `(epoch, live slots)`, or the running slots and the laggards.
    #[allow(clippy::type_complexity)]
    fn check_converged(
        &self,
    ) -> std::result::Result<(u64, Vec<u32>), (Vec<u32>, Vec<(usize, Assignment)>)> {
        let running: Vec<(usize, Assignment)> = self
            .running()
            .into_iter()
            .filter_map(|i| self.try_member(i).map(|m| (i, m.assignment())))
            .collect();
        let expected: Vec<u32> = running
            .iter()
            .filter_map(|(_, a)| a.slot)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        // The epoch most running members are at: those elsewhere are the laggards.
        let epoch = running
            .iter()
            .map(|(_, a)| a.epoch)
            .max()
            .unwrap_or_default();
        let laggards: Vec<(usize, Assignment)> = running
            .iter()
            .filter(|(_, a)| {
                a.phase != GroupPhase::Active
                    || a.index.is_none()
                    || a.epoch != epoch
                    || a.live != expected
                    || a.slot.is_none()
            })
            .cloned()
            .collect();
        if laggards.is_empty() && expected.len() == running.len() {
            Ok((epoch, expected))
        } else {
            Err((expected, laggards))
        }
    }

    /// The members (running or paused) that would grant `key` right now
    /// ([`Member::would_grant`]), in index order: one in a converged group, none while its
    /// owner is crashed or paused and its lease runs out, never two.
    pub fn granters(&self, key: impl AsRef<[u8]>) -> Vec<usize> {
        let key = key.as_ref();
        self.alive()
            .into_iter()
            .filter(|&i| {
                self.try_member(i)
                    .is_some_and(|m| m.would_grant(key).is_some())
            })
            .collect()
    }

    /// The member that would grant `key` right now, if one does (the lowest index if several
    /// did, which [`TestGroup::assert_exclusive`] reports).
    pub fn owner_of(&self, key: impl AsRef<[u8]>) -> Option<usize> {
        self.granters(key).first().copied()
    }

    /// The keys of `keys` that more than one member would grant right now, with those members.
    pub fn double_grants<'a, K: AsRef<[u8]> + ?Sized + 'a>(
        &self,
        keys: impl IntoIterator<Item = &'a K>,
    ) -> Vec<(&'a K, Vec<usize>)> {
        keys.into_iter()
            .map(|k| (k, self.granters(k)))
            .filter(|(_, g)| g.len() > 1)
            .collect()
    }

    /// Panics when a key of `keys` is granted by more than one member right now, naming the
    /// keys and the members.
    #[allow(clippy::panic)] // An assertion.
    #[track_caller]
    pub fn assert_exclusive<'a, K: AsRef<[u8]> + ?Sized + 'a>(
        &self,
        keys: impl IntoIterator<Item = &'a K>,
    ) {
        let double = self.double_grants(keys);
        if !double.is_empty() {
            let named: Vec<String> = double
                .iter()
                .map(|(k, g)| format!("{} by {g:?}", String::from_utf8_lossy(k.as_ref())))
                .collect();
            panic!(
                "{} keys of test group `{}` granted by two members at once: {}",
                named.len(),
                self.name,
                named.join(", ")
            );
        }
    }

    /// The wall time of the manual clock (the store's TTLs run on it).
    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// Simulated time since the group was built.
    pub fn elapsed(&self) -> Duration {
        self.clock.monotonic()
    }
}
