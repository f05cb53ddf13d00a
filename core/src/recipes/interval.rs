//! The interval indexer: every peer learns its `(index, replicas)` once per interval from one
//! shared counter per interval, exactly as in the "Distributed Peer Indexing" articles, plus the
//! safe index transition they leave out.
//!
//! # The algorithm ("Distributed Peer Indexing", Gurtovoi)
//!
//! With `I` the interval, each peer ticks once per interval, at the interval's start plus its own
//! constant skew `s` (drawn once in `[0, 7I/16)`, or fixed below `I/2` by
//! [`IntervalConfig::with_skew`]):
//!
//! 1. `n = ⌈now / I⌉` on the peer's (injected) clock, an instant exactly on a boundary counting as
//!    the start of the interval it opens (so `n = ⌊now / I⌋ + 1`);
//! 2. in **one round trip** ([`Store::incr_and_get`](crate::Store::incr_and_get)): add the peer's capacity `w` (1 unless
//!    weighted) to the counter of interval `n` and read the **sealed** count of interval `n - 1`
//!    (below; the first peer to tick `n` seals it, in two or three more round trips);
//! 3. the increment's result is the peer's draw for interval `n`: it holds the slots
//!    `result - w + 1 ..= result`;
//! 4. if the peer also drew in interval `n - 1`, the pair for interval `n` is its first slot of
//!    `n - 1` as **index** and the sealed count of `n - 1` as **replicas**: both describe the
//!    same interval, which is over, so every peer that ticked in `n - 1` holds a distinct index
//!    in `1..=replicas`. That is the "Distributed Peer Indexing" article's
//!    "emit (index, replicas) once both are known".
//!
//! # The sealed count
//!
//! The articles read the counter of `n - 1` directly. An increment that lands late (sent in
//! time, then held up by a stalled connection or a paused process) can then land *between* two
//! peers' reads: one pairs with `replicas = c`, another with `c + 1`, under the same epoch, and
//! both take some of the same tasks. Here the first peer that needs the count of `n - 1` copies
//! the counter into `interval:seal:{n-1}` with a create-if-absent compare-and-set and everyone
//! uses the seal. A draw that landed after the seal was taken is above it, so it owns nothing
//! that interval (the `index > replicas` rule) and its peer owes no acknowledgement for it.
//!
//! A peer also takes nothing from a tick whose reply arrives three quarters of an interval or
//! more after the interval's start on its clock: the seal of `n` is taken no earlier than the
//! start of `n + 1` on another peer's clock, so only a reply before that proves the increment is
//! in the seal. Such a draw counts for an acknowledgement only once the seal shows it does.
//!
//! A peer increments the counter of `n` only in the first half of interval `n` on its own clock:
//! its skewed tick always is, but a join or a tick that wakes late (a paused process, a slow
//! store) may not be, and an increment after another peer read the count (at its tick of `n + 1`)
//! would give two peers pairs of the same epoch from different counts. Such a tick skips `n`
//! without drawing (a late tick keeps its pair until it expires and reports it, like a failed
//! one) and the peer draws at its next tick. So the first pair arrives at the second tick that
//! draws: between half an interval and two intervals after the join.
//!
//! Counter keys expire after three intervals. The longer "Distributed Peer Indexing" article's
//! table instead pairs the index drawn in `n` with the count of `n - 1` (so C, in its first
//! interval, "emits (1,2)" and B "emits (3,2)"): that mixes two memberships, contradicts the
//! first article's caveat that the first result takes an interval, and is not what this module
//! does; the conformance suite tests the table as the
//! algorithm above produces it.
//!
//! # Keys
//!
//! Under the group's [`Keyspace`] (`hc:{group}:`):
//!
//! | key | value | TTL |
//! |---|---|---|
//! | `interval:{n}` | the counter of interval `n` (sum of the capacities of the peers that ticked) | 3 intervals |
//! | `interval:seal:{n}` | the count of interval `n` as the pairs of interval `n + 1` use it | 3 intervals |
//! | `interval:transition:{n}` | acknowledgements of the move to interval `n`'s pairs (sum of capacities) | 3 intervals |
//! | `interval:health:{member}` | `epoch=… index=… replicas=… capacity=…` of one live peer | 2 intervals |
//!
//! The article keys health by index (`{name}:health:{index}`); indices are re-drawn every
//! interval, so two peers would overwrite each other's record, and the member id is stable.
//!
//! # Task ownership
//!
//! [`Pair::owns`]: task `t` belongs to slot `t mod replicas + 1` (1-based), and a peer owns the
//! slots `index ..= index + capacity - 1`. With capacity 1 this is the article's
//! `t % replicas == index - 1`, written against the pair's own `replicas` (the sketch reads an
//! undefined `totalReplicas`) and its 1-based index (the sketch compares a 1-based index with a
//! 0-based residue only after subtracting one; its `index > replicas` guard is kept): a peer whose
//! index is above `replicas` owns nothing that interval.
//!
//! # Weighted partitioning
//!
//! A peer with capacity `w` adds `w` to the interval's counter instead of 1 (an `INCRBY`), so it
//! draws `w` consecutive slots and `replicas` is the total capacity of the interval: a peer of
//! capacity 2 owns twice the share of one of capacity 1, in the same single round trip.
//!
//! # The safe index transition
//!
//! Every peer that drew in interval `n - 1` owes an acknowledgement for interval `n`: it adds its
//! capacity to `interval:transition:{n}` once it holds no pair that could conflict with interval
//! `n`'s pairs. At its tick of `n`:
//!
//! * if its new pair owns exactly what its active pair owned, it keeps working and acknowledges
//!   at once;
//! * otherwise it stops taking new tasks ([`Ownership::begin`] and [`Ownership::should_process`]
//!   say no), waits for its in-flight tasks ([`TaskGuard`]s) to finish, acknowledges, and takes
//!   tasks under the new pair only once the acknowledgements reach `replicas` (every peer of
//!   interval `n - 1`, which are exactly the peers that may still hold an older pair, has let go).
//!   There is no timeout in the normal case: a peer that does not acknowledge (a task running past
//!   the interval, a pause) stalls the peers whose pairs changed until it does, a crashed one until
//!   the counters no longer count it (up to two intervals). Only a peer whose next tick has not
//!   run one interval after it adopted the pair (its own work held up: a stalled acknowledgement
//!   send, a pause, its wall clock falling behind its monotonic clock) takes the pending pair
//!   without every acknowledgement; that pair expires a quarter interval after the due time of
//!   the tick that should have replaced it.
//!
//! A peer leaving with [`IntervalPeer::stop`] drains and acknowledges the transitions it owes
//! before it goes, so the others need not wait for the counters to stop counting it.
//!
//! An acknowledgement is an increment, so it is sent at most once: the peer forgets it owes it
//! before sending, and a failed send (which may have applied) is not retried. A lost one only
//! makes the peers waiting for it wait for the next interval; a retried one could count a
//! capacity twice and let them activate before a peer still holding an old pair let go.
//!
//! **Guarantee**: at any instant, no two peers hold active pairs that own the same task, provided
//! (a) every peer either acknowledges or is dead (crashed, stopped), (b) the clocks of the peers
//! are within a quarter interval of each other, and (c) no peer is paused (GC, SIGSTOP,
//! VM migration) between [`Ownership::begin`] returning a guard and its task finishing for
//! longer than the rest of the interval. An active pair also expires on the peer's own clock a quarter
//! interval after the tick that should have replaced it, so a peer cut off from the store stops
//! on its own; the others take its tasks once the counters no longer count it.
//!
//! **Limits**: a peer paused longer than that (or whose clock is off by more) can still finish a
//! task the others consider theirs: nothing can tell a paused peer from a dead one. Make
//! the sink reject stale work with the epoch ([`TaskGuard::epoch`]) as a fencing token when that
//! matters. Tasks owned by a crashed peer are not taken by anyone until the counters no longer
//! include it (up to two intervals); a peer that stops taking tasks during a transition leaves
//! them for later, so a queue re-offering untaken tasks loses nothing.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::keys::{Keyspace, DEFAULT_PREFIX};
use crate::store::parse_counter;
use crate::DynStore;

/// The shortest interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

/// The longest interval accepted (one day); longer ones are almost certainly a unit mistake.
pub const MAX_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// The largest capacity a peer may declare.
pub const MAX_CAPACITY: u32 = 1000;

/// How many intervals the counter and acknowledgement keys live.
pub const KEY_INTERVALS: u32 = 3;

/// The longest member id accepted, in characters.
pub const MAX_MEMBER_LEN: usize = 64;

/// How a peer joins: the group, the interval, and the knobs tests and operators turn.
#[derive(Clone)]
#[non_exhaustive]
pub struct IntervalConfig {
    /// The group name (validated as a [`Keyspace`] group).
    pub group: String,
    /// The key prefix, `hc` by default.
    pub prefix: String,
    /// The interval: between [`MIN_INTERVAL`] and [`MAX_INTERVAL`].
    pub interval: Duration,
    /// The peer's constant skew after each interval start; `None` draws it once, uniformly in
    /// `[0, 7 * interval / 16)`: the article's extension draws below half the interval, and the
    /// last sixteenth is left so that a tick waking a little late still falls in the interval's
    /// first half, where it may draw (see the module docs). A fixed one must be below half the
    /// interval.
    pub skew: Option<Duration>,
    /// The declared capacity (1 to [`MAX_CAPACITY`]): how many slots the peer draws.
    pub capacity: u32,
    /// The member id in health records; random when `None`. 1 to [`MAX_MEMBER_LEN`] characters
    /// of `A-Z a-z 0-9 _ - .`.
    pub member: Option<String>,
    /// The clock; [`SystemClock`] by default.
    pub clock: Arc<dyn Clock>,
    /// Whether pair changes go through the safe transition (the default). Without it a peer
    /// adopts every new pair at once, as in the articles, and tasks are duplicated or missed
    /// while peers disagree; kept for measurements and demonstrations.
    pub transition: bool,
    /// Whether the peer writes its health record every tick (the default): one more write per
    /// tick besides the algorithm's single round trip.
    pub heartbeat: bool,
}

impl fmt::Debug for IntervalConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IntervalConfig")
            .field("group", &self.group)
            .field("prefix", &self.prefix)
            .field("interval", &self.interval)
            .field("skew", &self.skew)
            .field("capacity", &self.capacity)
            .field("member", &self.member)
            .field("transition", &self.transition)
            .field("heartbeat", &self.heartbeat)
            .finish_non_exhaustive()
    }
}

impl IntervalConfig {
    /// A configuration for `group` with `interval`, a random skew, capacity 1, a random member
    /// id, the system clock, the transition and the heartbeat.
    pub fn new(group: impl Into<String>, interval: Duration) -> Self {
        IntervalConfig {
            group: group.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            interval,
            skew: None,
            capacity: 1,
            member: None,
            clock: Arc::new(SystemClock::new()),
            transition: true,
            heartbeat: true,
        }
    }

    /// Sets the key prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Fixes the skew instead of drawing it.
    pub fn with_skew(mut self, skew: Duration) -> Self {
        self.skew = Some(skew);
        self
    }

    /// Sets the declared capacity.
    pub fn with_capacity(mut self, capacity: u32) -> Self {
        self.capacity = capacity;
        self
    }

    /// Sets the member id.
    pub fn with_member(mut self, member: impl Into<String>) -> Self {
        self.member = Some(member.into());
        self
    }

    /// Sets the clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Turns the safe transition on or off.
    pub fn with_transition(mut self, on: bool) -> Self {
        self.transition = on;
        self
    }

    /// Turns the health heartbeat on or off.
    pub fn with_heartbeat(mut self, on: bool) -> Self {
        self.heartbeat = on;
        self
    }

    fn check(&self) -> Result<Keyspace> {
        let keys = Keyspace::with_prefix(&self.prefix, &self.group)?;
        if self.interval < MIN_INTERVAL {
            return Err(Error::invalid(format!(
                "interval of {:?} is shorter than the minimum of {MIN_INTERVAL:?}",
                self.interval
            )));
        }
        if self.interval > MAX_INTERVAL {
            return Err(Error::invalid(format!(
                "interval of {:?} is longer than the limit of {MAX_INTERVAL:?}",
                self.interval
            )));
        }
        if let Some(skew) = self.skew {
            if skew >= self.interval / 2 {
                return Err(Error::invalid(format!(
                    "skew of {skew:?} is not below half the interval ({:?})",
                    self.interval / 2
                )));
            }
        }
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return Err(Error::invalid(format!(
                "capacity {} is outside 1..={MAX_CAPACITY}",
                self.capacity
            )));
        }
        if let Some(member) = &self.member {
            check_member(member)?;
        }
        Ok(keys)
    }
}

pub(crate) fn check_member(member: &str) -> Result<()> {
    let len = member.chars().count();
    if len == 0 || len > MAX_MEMBER_LEN {
        return Err(Error::invalid(format!(
            "member id is {len} characters long; it must have 1 to {MAX_MEMBER_LEN}"
        )));
    }
    if let Some(c) = member
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(Error::invalid(format!(
            "member id {:?} contains {c:?}; only ASCII letters, digits, '_', '-' and '.' are allowed",
            member.escape_debug().to_string()
        )));
    }
    Ok(())
}

/// What a peer learned for one interval: its index, the replicas, and the slots it owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pair {
    /// The interval number during which this pair is in force (the article's `n` of the tick that
    /// produced it); also the fencing epoch.
    pub epoch: u64,
    /// The peer's first slot, 1-based: its index among the peers of interval `epoch - 1`.
    pub index: u64,
    /// The total capacity of interval `epoch - 1`: the number of peers when every capacity is 1.
    pub replicas: u64,
    /// How many consecutive slots from `index` the peer owns.
    pub capacity: u64,
}

impl Pair {
    /// Whether the peer owns nothing in this interval (`index > replicas`).
    pub fn is_idle(&self) -> bool {
        self.index == 0 || self.index > self.replicas
    }

    /// Whether this pair owns `task_id`: its slot `task_id mod replicas + 1` is one of
    /// `index ..= index + capacity - 1`.
    pub fn owns(&self, task_id: u64) -> bool {
        if self.is_idle() {
            return false;
        }
        let slot = task_id % self.replicas + 1;
        slot >= self.index && slot - self.index < self.capacity
    }

    /// Whether two pairs own exactly the same tasks (the epoch aside).
    pub fn same_ownership(&self, other: &Pair) -> bool {
        (self.is_idle() && other.is_idle())
            || (self.index, self.replicas, self.capacity)
                == (other.index, other.replicas, other.capacity)
    }
}

/// Where a peer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// Joined; no pair yet (the first arrives at the second tick).
    Warming,
    /// Taking tasks under [`IntervalStatus::pair`].
    Active,
    /// A new pair arrived: not taking new tasks, waiting for in-flight ones to finish.
    Draining,
    /// Drained and acknowledged: waiting for the other peers' acknowledgements.
    Waiting,
    /// The last tick could not be confirmed (store fault, foreign value, or it ran in the second
    /// half of its interval and skipped drawing): the pair shown is the last confirmed one, and
    /// it stops owning tasks when it expires.
    Faulted,
    /// Stopped.
    Stopped,
}

impl Phase {
    /// A short lower-case name: `warming`, `active`, `draining`, `waiting`, `faulted`, `stopped`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Warming => "warming",
            Phase::Active => "active",
            Phase::Draining => "draining",
            Phase::Waiting => "waiting",
            Phase::Faulted => "faulted",
            Phase::Stopped => "stopped",
        }
    }
}

/// The value a peer publishes on its watch channel whenever it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntervalStatus {
    /// The member id.
    pub member: String,
    /// The last pair the peer confirmed (kept through faults); whether it owns tasks right now is
    /// [`Ownership::pair`].
    pub pair: Option<Pair>,
    /// Where the peer stands.
    pub phase: Phase,
    /// The interval number of the last tick attempted.
    pub last_tick: Option<u64>,
    /// The last error, cleared by the next clean tick.
    pub last_error: Option<String>,
}

/// One live peer, from its health record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerHealth {
    /// The member id.
    pub member: String,
    /// The interval of its last tick.
    pub epoch: u64,
    /// Its pair at that tick, if it had one: `(index, replicas)`.
    pub pair: Option<(u64, u64)>,
    /// Its declared capacity.
    pub capacity: u64,
}

/// The keys of one group's interval indexer.
#[derive(Debug, Clone)]
struct Keys {
    space: Keyspace,
}

impl Keys {
    fn counter(&self, n: u64) -> String {
        self.space.key(format_args!("interval:{n}"))
    }

    fn transition(&self, n: u64) -> String {
        self.space.key(format_args!("interval:transition:{n}"))
    }

    fn seal(&self, n: u64) -> String {
        self.space.key(format_args!("interval:seal:{n}"))
    }

    fn health_prefix(&self) -> String {
        self.space.key("interval:health:")
    }

    fn health(&self, member: &str) -> String {
        self.space.key(format_args!("interval:health:{member}"))
    }
}

/// The pair a peer takes tasks under, and until when on its own clock.
#[derive(Debug, Clone, Copy)]
struct Active {
    pair: Pair,
    valid_until: Duration,
}

#[derive(Debug)]
struct Shared {
    clock: Arc<dyn Clock>,
    active: Mutex<Option<Active>>,
    in_flight: AtomicUsize,
    idle_until: Mutex<Option<Duration>>,
}

impl Shared {
    fn active(&self) -> std::sync::MutexGuard<'_, Option<Active>> {
        self.active.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_active(&self, active: Option<Active>) {
        *self.active() = active;
    }

    fn current(&self) -> Option<Pair> {
        let now = wall(self.clock.as_ref());
        self.active()
            .filter(|a| now < a.valid_until)
            .map(|a| a.pair)
    }
}

/// Wall-clock time since the Unix epoch (zero before it).
fn wall(clock: &dyn Clock) -> Duration {
    clock
        .now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// The interval number of wall time `t`: `⌈t / I⌉`, a boundary belonging to the interval it
/// starts.
pub fn interval_number(t: Duration, interval: Duration) -> u64 {
    let i = interval.as_nanos().max(1);
    u64::try_from(t.as_nanos() / i + 1).unwrap_or(u64::MAX)
}

/// The wall time at which interval `n` starts: `(n - 1) * I`.
fn interval_start(n: u64, interval: Duration) -> Duration {
    let nanos = u128::from(n.saturating_sub(1)) * interval.as_nanos();
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Decides ownership for one peer; cheap to clone and share between tasks.
#[derive(Debug, Clone)]
pub struct Ownership {
    shared: Arc<Shared>,
    status: watch::Receiver<IntervalStatus>,
}

impl Ownership {
    /// The pair the peer takes tasks under right now: `None` while warming up, during a
    /// transition, after its pair expired unconfirmed, or once stopped.
    pub fn pair(&self) -> Option<Pair> {
        self.shared.current()
    }

    /// Whether this peer should process `task_id` now (see [`Pair::owns`]). False whenever
    /// [`pair`](Self::pair) is `None` and for a peer whose index is above `replicas`.
    pub fn should_process(&self, task_id: u64) -> bool {
        self.pair().is_some_and(|p| p.owns(task_id))
    }

    /// Like [`should_process`](Self::should_process), and registers the task as in flight until
    /// the returned guard is dropped: a transition waits for it before acknowledging.
    pub fn begin(&self, task_id: u64) -> Option<TaskGuard> {
        let now = wall(self.shared.clock.as_ref());
        let active = self.shared.active();
        let pair = active.filter(|a| now < a.valid_until)?.pair;
        if !pair.owns(task_id) {
            return None;
        }
        // Counted under the lock the transition takes to deactivate the pair, so it either sees
        // this task or we see no pair.
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        drop(active);
        Some(TaskGuard {
            shared: self.shared.clone(),
            task_id,
            epoch: pair.epoch,
        })
    }

    /// How many tasks are in flight (guards not yet dropped).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// A receiver of the peer's status, updated on every change.
    pub fn watch(&self) -> watch::Receiver<IntervalStatus> {
        self.status.clone()
    }

    /// The current status.
    pub fn status(&self) -> IntervalStatus {
        self.status.borrow().clone()
    }
}

/// A task taken with [`Ownership::begin`]; dropping it marks the task finished.
#[derive(Debug)]
pub struct TaskGuard {
    shared: Arc<Shared>,
    task_id: u64,
    epoch: u64,
}

impl TaskGuard {
    /// The task.
    pub fn task_id(&self) -> u64 {
        self.task_id
    }

    /// The epoch of the pair the task was taken under: a fencing token for the sink.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Entry point of the recipe.
#[derive(Debug, Clone, Copy)]
pub struct IntervalIndexer;

impl IntervalIndexer {
    /// Validates `config`, ticks once at once (drawing the peer's index for the current
    /// interval if it is in that interval's first half on the peer's clock; otherwise the first
    /// draw waits for the next tick) and starts ticking in the background.
    ///
    /// Errors: [`Error::InvalidArgument`] for a bad group, prefix, member id, interval, skew or
    /// capacity; [`Error::ForeignValue`] when the current interval's counter holds something else;
    /// the store's own error when it cannot be reached.
    pub async fn join(store: DynStore, config: IntervalConfig) -> Result<IntervalPeer> {
        let space = config.check()?;
        let interval = config.interval;
        let skew = match config.skew {
            Some(s) => s,
            None => {
                let most = u64::try_from((interval * 7 / 16).as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(rand::random_range(0..most.max(1)))
            }
        };
        let member = match &config.member {
            Some(m) => m.clone(),
            None => format!("{:016x}", rand::random::<u64>()),
        };
        let clock = config.clock.clone();
        let shared = Arc::new(Shared {
            clock: clock.clone(),
            active: Mutex::new(None),
            in_flight: AtomicUsize::new(0),
            idle_until: Mutex::new(None),
        });
        let (status_tx, status_rx) = watch::channel(IntervalStatus {
            member: member.clone(),
            pair: None,
            phase: Phase::Warming,
            last_tick: None,
            last_error: None,
        });
        let mut ticker = Ticker {
            store: store.clone(),
            keys: Keys { space },
            interval,
            skew,
            capacity: u64::from(config.capacity),
            member: member.clone(),
            transition: config.transition,
            heartbeat: config.heartbeat,
            clock,
            shared: shared.clone(),
            status: status_tx,
            draw: None,
            pending: None,
            owed: BTreeSet::new(),
            last_tick: None,
            health_written: None,
        };
        let keys = ticker.keys.clone();
        let now = wall(ticker.clock.as_ref());
        ticker.tick(interval_number(now, interval)).await?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(ticker.run(stop_rx));
        Ok(IntervalPeer {
            ownership: Ownership {
                shared,
                status: status_rx,
            },
            member,
            skew,
            interval,
            store,
            keys,
            stop: stop_tx,
            task: Some(task),
        })
    }
}

/// One joined peer. Dropping it without [`stop`](IntervalPeer::stop) aborts its background task
/// as a crash would: nothing is acknowledged or deleted.
#[derive(Debug)]
pub struct IntervalPeer {
    ownership: Ownership,
    member: String,
    skew: Duration,
    interval: Duration,
    store: DynStore,
    keys: Keys,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<Result<()>>>,
}

impl IntervalPeer {
    /// The member id.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// The constant skew after each interval start.
    pub fn skew(&self) -> Duration {
        self.skew
    }

    /// The interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// A cheap, cloneable handle deciding ownership, for the tasks that process work.
    pub fn ownership(&self) -> Ownership {
        self.ownership.clone()
    }

    /// See [`Ownership::pair`].
    pub fn pair(&self) -> Option<Pair> {
        self.ownership.pair()
    }

    /// See [`Ownership::should_process`].
    pub fn should_process(&self, task_id: u64) -> bool {
        self.ownership.should_process(task_id)
    }

    /// See [`Ownership::begin`].
    pub fn begin(&self, task_id: u64) -> Option<TaskGuard> {
        self.ownership.begin(task_id)
    }

    /// See [`Ownership::watch`].
    pub fn watch(&self) -> watch::Receiver<IntervalStatus> {
        self.ownership.watch()
    }

    /// See [`Ownership::status`].
    pub fn status(&self) -> IntervalStatus {
        self.ownership.status()
    }

    /// The monotonic instant (on the peer's clock) its background task sleeps until, or `None`
    /// while it is working. Tests driving a [`ManualClock`](crate::ManualClock) use it to know
    /// that a peer has done everything due at the current time: it is idle once this is later
    /// than the clock's monotonic time.
    pub fn idle_until(&self) -> Option<Duration> {
        *self
            .ownership
            .shared
            .idle_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The live peers of the group, from their health records (see [`live_peers`]).
    pub async fn live_peers(&self) -> Result<Vec<PeerHealth>> {
        list_health(self.store.as_ref(), &self.keys.health_prefix()).await
    }

    /// Leaves gracefully: stops ticking and taking tasks, waits (up to one interval) for the
    /// in-flight tasks, acknowledges the transitions the others would wait for, and deletes the
    /// health record. Returns the first store error met on the way, if any.
    pub async fn stop(mut self) -> Result<()> {
        let _ = self.stop.send(true);
        match self.task.take() {
            Some(task) => task.await.map_err(|e| Error::Unavailable {
                backend: "interval",
                message: format!("the peer's background task died: {e}"),
                source: None,
            })?,
            None => Ok(()),
        }
    }
}

impl Drop for IntervalPeer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The live peers of `group`'s interval indexer under `prefix`, from their health records, sorted
/// by member id. Records that do not parse are skipped with a warning.
pub async fn live_peers(store: &DynStore, prefix: &str, group: &str) -> Result<Vec<PeerHealth>> {
    let keys = Keys {
        space: Keyspace::with_prefix(prefix, group)?,
    };
    list_health(store.as_ref(), &keys.health_prefix()).await
}

async fn list_health(store: &dyn crate::Store, prefix: &str) -> Result<Vec<PeerHealth>> {
    let mut out = Vec::new();
    for (key, value) in store.list(prefix).await? {
        let member = key.strip_prefix(prefix).unwrap_or(&key).to_owned();
        match parse_health(&member, &value) {
            Some(h) => out.push(h),
            None => tracing::warn!(%key, %value, "skipping a health record that does not parse"),
        }
    }
    Ok(out)
}

fn health_value(epoch: u64, pair: Option<Pair>, capacity: u64) -> String {
    match pair {
        Some(p) => format!(
            "epoch={epoch} index={} replicas={} capacity={capacity}",
            p.index, p.replicas
        ),
        None => format!("epoch={epoch} index=- replicas=- capacity={capacity}"),
    }
}

fn parse_health(member: &str, value: &str) -> Option<PeerHealth> {
    let mut epoch = None;
    let mut index = None;
    let mut replicas = None;
    let mut capacity = None;
    for part in value.split(' ') {
        let (k, v) = part.split_once('=')?;
        let n = if v == "-" {
            None
        } else {
            Some(v.parse::<u64>().ok()?)
        };
        match k {
            "epoch" => epoch = n,
            "index" => index = n,
            "replicas" => replicas = n,
            "capacity" => capacity = n,
            _ => return None,
        }
    }
    Some(PeerHealth {
        member: member.to_owned(),
        epoch: epoch?,
        pair: index.zip(replicas),
        capacity: capacity?,
    })
}

/// A count of peers' capacities read at `key`: a decimal integer of at least 1.
fn parse_count(key: &str, text: &str) -> Result<u64> {
    match parse_counter(key, text).map(u64::try_from) {
        Ok(Ok(count)) if count >= 1 => Ok(count),
        Ok(_) => Err(Error::foreign(key, "a count of at least 1", text)),
        Err(e) => Err(e),
    }
}

/// The slots a peer drew in one interval.
#[derive(Debug, Clone, Copy)]
struct Draw {
    epoch: u64,
    first: u64,
    /// The counter's value after the increment: the last slot drawn.
    last: u64,
    /// The reply came too late to be sure the increment landed before the interval's count was
    /// sealed: the draw gives no pair, and its acknowledgement is owed only if the seal counts it.
    late: bool,
}

impl Draw {
    /// Whether the sealed count of the draw's interval includes this draw. Increments are
    /// atomic, so a draw is either wholly below the sealed value or wholly above it.
    fn counted_in(&self, sealed: u64) -> bool {
        self.last <= sealed
    }
}

/// A new pair waiting for the drain and the acknowledgements.
#[derive(Debug, Clone, Copy)]
struct Pending {
    pair: Pair,
    since: Duration,
}

struct Ticker {
    store: DynStore,
    keys: Keys,
    interval: Duration,
    skew: Duration,
    capacity: u64,
    member: String,
    transition: bool,
    heartbeat: bool,
    clock: Arc<dyn Clock>,
    shared: Arc<Shared>,
    status: watch::Sender<IntervalStatus>,
    draw: Option<Draw>,
    pending: Option<Pending>,
    /// Intervals whose transition this peer still has to acknowledge.
    owed: BTreeSet<u64>,
    last_tick: Option<u64>,
    health_written: Option<String>,
}

impl Ticker {
    fn ttl(&self) -> Duration {
        self.interval * KEY_INTERVALS
    }

    fn poll_period(&self) -> Duration {
        (self.interval / 20).max(Duration::from_millis(1))
    }

    /// The wall time of the tick of interval `n`: its start plus the skew.
    fn tick_time(&self, n: u64) -> Duration {
        interval_start(n, self.interval) + self.skew
    }

    /// How long a pair of interval `n` stays valid on this peer's clock: a quarter interval past
    /// the tick that should replace it.
    fn valid_until(&self, n: u64) -> Duration {
        self.tick_time(n.saturating_add(1)) + self.interval / 4
    }

    fn publish(&self, f: impl FnOnce(&mut IntervalStatus)) {
        self.status.send_if_modified(|s| {
            let before = s.clone();
            f(s);
            *s != before
        });
    }

    fn set_error(&self, e: &Error) {
        let message = e.to_string();
        tracing::warn!(member = %self.member, error = %message, "interval tick failed");
        self.publish(|s| {
            s.last_error = Some(message);
            if s.phase != Phase::Stopped {
                s.phase = Phase::Faulted;
            }
        });
    }

    fn set_idle(&self, until: Option<Duration>) {
        *self
            .shared
            .idle_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = until;
    }

    async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<()> {
        loop {
            let next = self.last_tick.map_or(1, |n| n.saturating_add(1));
            let now_wall = wall(self.clock.as_ref());
            let until_tick = self.tick_time(next).saturating_sub(now_wall);
            let mut nap = until_tick.min(self.interval / 4);
            if self.pending.is_some() || !self.owed.is_empty() {
                nap = nap.min(self.poll_period());
            }
            let deadline = self.clock.monotonic() + nap.max(Duration::from_nanos(1));
            self.set_idle(Some(deadline));
            tokio::select! {
                _ = self.clock.sleep_until(deadline) => {}
                _ = stop.changed() => break,
            }
            self.set_idle(None);
            if *stop.borrow() {
                break;
            }
            let now_wall = wall(self.clock.as_ref());
            if now_wall >= self.tick_time(next) {
                let n = interval_number(now_wall, self.interval);
                let span = tracing::debug_span!(
                    "interval.tick",
                    group = self.keys.space.group(),
                    interval = n
                );
                let ticked = self.tick(n).instrument(span).await;
                let result = if ticked.is_ok() { "ok" } else { "error" };
                ::metrics::counter!(crate::metrics::INTERVAL_TICKS, "result" => result)
                    .increment(1);
                if let Err(e) = ticked {
                    self.set_error(&e);
                }
            } else {
                self.progress().await;
            }
        }
        self.set_idle(None);
        self.leave().await
    }

    /// One tick of interval `n`. Errors only when the round trip itself failed or the counter is
    /// foreign; the caller reports them.
    async fn tick(&mut self, n: u64) -> Result<()> {
        let joining = self.last_tick.is_none();
        self.last_tick = Some(n);
        self.publish(|s| s.last_tick = Some(n));
        let previous = self.draw.take().filter(|d| d.epoch + 1 == n);
        // Where this tick ends without reading the sealed count of `n - 1`: a draw whose reply
        // came in time is in that count (see `late` below), so it owes `n`'s acknowledgement; a
        // late one may not be, and an acknowledgement from a peer the count leaves out would let
        // the others activate before a counted peer let go.
        let owes_unsealed = previous.is_some_and(|d| !d.late);
        let start = interval_start(n, self.interval);
        if wall(self.clock.as_ref()) >= start + self.interval / 2 {
            // Too late to draw in `n`: the reply could not arrive before the count of `n` is
            // sealed. No draw for `n` (the next tick draws); like a failed tick, the active pair
            // stays until it expires and `n`'s acknowledgement is owed.
            if owes_unsealed {
                self.owed.insert(n);
            }
            let message = format!(
                "the tick of interval {n} ran in the second half of the interval; skipped drawing in it"
            );
            return self.skip(n, joining, message).await;
        }
        let by = i64::try_from(self.capacity).unwrap_or(1);
        let result = self
            .store
            .incr_and_get(
                &self.keys.counter(n),
                by,
                Some(self.ttl()),
                &self.keys.seal(n.saturating_sub(1)),
            )
            .await;
        let (value, sealed) = match result {
            Ok(r) => r,
            Err(e) => {
                // Whether the increment applied is unknown: no draw for `n`. The active pair
                // stays until it expires on its own; the acknowledgement of `n` is owed once it
                // is given up.
                if owes_unsealed {
                    self.owed.insert(n);
                }
                self.pending = None;
                return Err(e);
            }
        };
        let counter = self.keys.counter(n);
        let first = value.saturating_sub(by).saturating_add(1);
        if first < 1 {
            return Err(Error::foreign(
                &counter,
                "a counter that only ever grows from 0",
                &value.to_string(),
            ));
        }
        // The count of `n` is sealed by the first peer that ticks `n + 1`, at the earliest at the
        // start of `n + 1` on its clock, so no earlier than `start + 3I/4` on ours (clocks within
        // a quarter interval). A reply before that proves the increment is in the seal; a later
        // one (a stalled connection, a paused process) proves nothing: the draw gives no pair,
        // and this tick adopts none either, since the others' next transition may not wait for
        // us.
        let late = wall(self.clock.as_ref()) >= start + self.interval * 3 / 4;
        self.draw = Some(Draw {
            epoch: n,
            first: u64::try_from(first).unwrap_or(0),
            last: u64::try_from(value).unwrap_or(0),
            late,
        });
        if late {
            if owes_unsealed {
                self.owed.insert(n);
            }
            let message = format!(
                "the store answered the tick of interval {n} after three quarters of the \
                 interval; took no pair from it"
            );
            return self.skip(n, joining, message).await;
        }

        // The pair needs our draw of n - 1 and that interval's sealed count.
        let pair = match previous {
            None => Ok(None),
            Some(prev) => match self.sealed_count(n - 1, sealed).await {
                Ok(count) => {
                    if prev.counted_in(count) {
                        self.owed.insert(n);
                    }
                    if prev.late || !prev.counted_in(count) {
                        // Drawn after the count was sealed: no slot this interval.
                        Ok(None)
                    } else {
                        Ok(Some(Pair {
                            epoch: n,
                            index: prev.first,
                            replicas: count,
                            capacity: self.capacity,
                        }))
                    }
                }
                Err(e) => {
                    if owes_unsealed {
                        self.owed.insert(n);
                    }
                    Err(e)
                }
            },
        };
        self.pending = None;
        let outcome = match pair {
            Ok(Some(pair)) => {
                self.adopt(pair).await;
                Ok(())
            }
            Ok(None) => {
                self.deactivate();
                self.publish(|s| {
                    s.phase = Phase::Warming;
                    s.last_error = None;
                });
                Ok(())
            }
            Err(e) => {
                // Not confirmed: stop owning, keep the last pair in the status.
                self.deactivate();
                Err(e)
            }
        };
        self.progress().await;
        if self.heartbeat {
            let pair = self.shared.current().or(self.pending.map(|p| p.pair));
            if let Err(e) = self.write_health(n, pair).await {
                tracing::warn!(member = %self.member, error = %e, "health heartbeat failed");
            }
        }
        outcome
    }

    /// Ends a tick of `n` that takes no pair: the active pair stays until it expires, a pending
    /// one is dropped, and the status says why (except on the joining tick).
    async fn skip(&mut self, n: u64, joining: bool, message: String) -> Result<()> {
        self.pending = None;
        if !joining {
            tracing::warn!(member = %self.member, "{message}");
            self.publish(|s| {
                s.last_error = Some(message);
                if s.phase != Phase::Stopped {
                    s.phase = if s.pair.is_some() {
                        Phase::Faulted
                    } else {
                        Phase::Warming
                    };
                }
            });
        }
        self.progress().await;
        if self.heartbeat {
            let pair = self.shared.current();
            if let Err(e) = self.write_health(n, pair).await {
                tracing::warn!(member = %self.member, error = %e, "health heartbeat failed");
            }
        }
        Ok(())
    }

    /// The count of interval `m`, sealed: the first peer to need it after `m` copies the counter
    /// into the seal key (create-if-absent), and every peer uses the seal, so an increment that
    /// lands late (after some peer read the counter) cannot give two peers pairs of one epoch
    /// from different counts. `read` is the seal as the tick's round trip read it.
    async fn sealed_count(&self, m: u64, read: Option<String>) -> Result<u64> {
        let seal = self.keys.seal(m);
        let text = match read {
            Some(text) => text,
            None => {
                let counter = self.keys.counter(m);
                let Some(text) = self.store.get(&counter).await? else {
                    return Err(Error::Unavailable {
                        backend: "interval",
                        message: format!(
                            "the counter of interval {m} vanished before interval {} read it \
                             (expired or deleted)",
                            m + 1
                        ),
                        source: None,
                    });
                };
                let count = parse_count(&counter, &text)?;
                if self
                    .store
                    .compare_and_set(&seal, None, &count.to_string(), Some(self.ttl()))
                    .await?
                {
                    return Ok(count);
                }
                self.store
                    .get(&seal)
                    .await?
                    .ok_or_else(|| Error::Unavailable {
                        backend: "interval",
                        message: format!(
                            "the sealed count of interval {m} vanished as it was read"
                        ),
                        source: None,
                    })?
            }
        };
        parse_count(&seal, &text)
    }

    fn deactivate(&self) {
        self.shared.set_active(None);
    }

    async fn adopt(&mut self, pair: Pair) {
        let valid_until = self.valid_until(pair.epoch);
        // Only a pair still valid on our clock counts: it was confirmed at the previous tick, so
        // it is interval n - 1's, disjoint from both n - 1's and n's other pairs. An expired one
        // goes through the full transition.
        let unchanged = self
            .shared
            .current()
            .is_some_and(|a| a.same_ownership(&pair));
        if unchanged || !self.transition {
            self.shared.set_active(Some(Active { pair, valid_until }));
            self.publish(|s| {
                s.pair = Some(pair);
                s.phase = Phase::Active;
                s.last_error = None;
            });
            return;
        }
        self.deactivate();
        self.pending = Some(Pending {
            pair,
            since: self.clock.monotonic(),
        });
        self.publish(|s| {
            s.pair = Some(pair);
            s.phase = Phase::Draining;
            s.last_error = None;
        });
    }

    /// Sends the acknowledgements owed once drained, and activates a pending pair once every
    /// peer acknowledged (or, when this peer's next tick has not run one interval after it
    /// adopted the pair, then).
    async fn progress(&mut self) {
        if !self.owed.is_empty() {
            let active = self.shared.current();
            let idle = self.shared.in_flight.load(Ordering::SeqCst) == 0;
            let owed: Vec<u64> = self.owed.iter().copied().collect();
            for n in owed {
                // An active pair adopted at or after `n` owns what interval `n`'s pairs say, so
                // neither it nor its in-flight tasks conflict; anything older must be drained.
                let may = match active {
                    Some(a) => a.epoch >= n,
                    None => idle,
                };
                if !may {
                    continue;
                }
                // An acknowledgement is an increment: sent at most once, never retried, since a
                // failure may have applied it. A lost one only makes the others wait for the
                // next interval.
                self.owed.remove(&n);
                if let Err(e) = self.ack(n).await {
                    self.set_error(&e);
                    break;
                }
            }
        }
        let Some(pending) = self.pending else {
            return;
        };
        if self.owed.contains(&pending.pair.epoch) {
            return;
        }
        self.publish(|s| s.phase = Phase::Waiting);
        let timed_out = self.clock.monotonic().saturating_sub(pending.since) >= self.interval;
        let all_acked = if timed_out {
            false
        } else {
            match self.acks(pending.pair.epoch).await {
                Ok(acks) => acks >= pending.pair.replicas,
                Err(e) => {
                    self.set_error(&e);
                    false
                }
            }
        };
        if all_acked || timed_out {
            if timed_out {
                tracing::warn!(
                    member = %self.member,
                    epoch = pending.pair.epoch,
                    "not every peer acknowledged the transition within an interval; taking the new pair"
                );
            }
            let valid_until = self.valid_until(pending.pair.epoch);
            self.shared.set_active(Some(Active {
                pair: pending.pair,
                valid_until,
            }));
            self.pending = None;
            self.publish(|s| {
                s.pair = Some(pending.pair);
                s.phase = Phase::Active;
            });
        }
    }

    async fn ack(&self, n: u64) -> Result<()> {
        let by = i64::try_from(self.capacity).unwrap_or(1);
        self.store
            .incr_and_get(
                &self.keys.transition(n),
                by,
                Some(self.ttl()),
                &self.keys.counter(n),
            )
            .await
            .map(|_| ())
    }

    async fn acks(&self, n: u64) -> Result<u64> {
        let key = self.keys.transition(n);
        match self.store.get(&key).await? {
            None => Ok(0),
            Some(text) => {
                let v = parse_counter(&key, &text)?;
                Ok(u64::try_from(v).unwrap_or(0))
            }
        }
    }

    async fn write_health(&mut self, epoch: u64, pair: Option<Pair>) -> Result<()> {
        let key = self.keys.health(&self.member);
        let value = health_value(epoch, pair, self.capacity);
        let ttl = Some(self.interval * 2);
        let expected = self.health_written.clone();
        let mut wrote = self
            .store
            .compare_and_set(&key, expected.as_deref(), &value, ttl)
            .await?;
        if !wrote && expected.is_some() {
            wrote = self.store.compare_and_set(&key, None, &value, ttl).await?;
        }
        if !wrote {
            // Someone else's value at our key: take it over.
            if let Some(current) = self.store.get(&key).await? {
                wrote = self
                    .store
                    .compare_and_set(&key, Some(&current), &value, ttl)
                    .await?;
            }
        }
        self.health_written = wrote.then_some(value);
        Ok(())
    }

    async fn leave(mut self) -> Result<()> {
        self.deactivate();
        self.pending = None;
        // Wait for the in-flight tasks, at most one interval.
        let give_up = self.clock.monotonic() + self.interval;
        while self.shared.in_flight.load(Ordering::SeqCst) > 0 && self.clock.monotonic() < give_up {
            self.clock.sleep(self.poll_period()).await;
        }
        // A late draw may be missing from its interval's sealed count: acknowledging for it
        // could stand in for a counted peer, so the others wait for the counters to stop
        // counting this peer instead.
        if let Some(draw) = self.draw.filter(|d| !d.late) {
            self.owed.insert(draw.epoch.saturating_add(1));
        }
        let mut first_error = None;
        for n in std::mem::take(&mut self.owed) {
            if let Err(e) = self.ack(n).await {
                first_error.get_or_insert(e);
            }
        }
        if self.heartbeat {
            if let Err(e) = self.store.delete(&self.keys.health(&self.member)).await {
                first_error.get_or_insert(e);
            }
        }
        self.publish(|s| s.phase = Phase::Stopped);
        match first_error {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_numbers_follow_the_article() {
        let i = Duration::from_secs(30);
        assert_eq!(interval_number(Duration::from_secs(1), i), 1);
        assert_eq!(interval_number(Duration::from_secs(29), i), 1);
        // A boundary opens the next interval.
        assert_eq!(interval_number(Duration::from_secs(30), i), 2);
        assert_eq!(interval_number(Duration::from_secs(61), i), 3);
        assert_eq!(interval_start(3, i), Duration::from_secs(60));
    }

    #[test]
    fn ownership_maps_tasks_to_one_based_slots() {
        let p = |index, replicas, capacity| Pair {
            epoch: 1,
            index,
            replicas,
            capacity,
        };
        // The article's modulo: task % replicas == index - 1.
        for t in 0..30u64 {
            let owners: Vec<u64> = (1..=3).filter(|&i| p(i, 3, 1).owns(t)).collect();
            assert_eq!(owners, vec![t % 3 + 1]);
        }
        assert!(p(3, 2, 1).is_idle());
        assert!((0..10).all(|t| !p(3, 2, 1).owns(t)));
        // Capacity 2 owns two slots of three.
        let heavy = p(1, 3, 2);
        assert_eq!((0..300).filter(|&t| heavy.owns(t)).count(), 200);
        assert!(p(1, 3, 1).same_ownership(&Pair {
            epoch: 9,
            ..p(1, 3, 1)
        }));
    }

    #[test]
    fn bad_configs_are_rejected() {
        let ok = IntervalConfig::new("g", Duration::from_secs(5));
        assert!(ok.check().is_ok());
        for bad in [
            IntervalConfig::new("g", Duration::ZERO),
            IntervalConfig::new("g", Duration::from_micros(999)),
            IntervalConfig::new("g", Duration::from_secs(86_401)),
            IntervalConfig::new("a:b", Duration::from_secs(5)),
            IntervalConfig::new("g", Duration::from_secs(5)).with_capacity(0),
            IntervalConfig::new("g", Duration::from_secs(5)).with_skew(Duration::from_millis(2500)),
            IntervalConfig::new("g", Duration::from_secs(5)).with_member("a b"),
        ] {
            assert!(
                matches!(bad.check(), Err(Error::InvalidArgument { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn health_records_round_trip() {
        let pair = Pair {
            epoch: 7,
            index: 2,
            replicas: 3,
            capacity: 1,
        };
        let v = health_value(7, Some(pair), 1);
        assert_eq!(
            parse_health("m", &v),
            Some(PeerHealth {
                member: "m".into(),
                epoch: 7,
                pair: Some((2, 3)),
                capacity: 1
            })
        );
        assert_eq!(
            parse_health("m", &health_value(7, None, 2)).map(|h| h.pair),
            Some(None)
        );
        assert!(parse_health("m", "alive").is_none());
    }
}
