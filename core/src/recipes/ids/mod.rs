//! Majority IDs: monotonically increasing IDs (fencing tokens) agreed by a majority of `N`
//! independent stores, any mix of backends, failing closed without a majority
//! (antirez, "Generating unique, monotonically increasing IDs with Redis").
//!
//! # The algorithm
//!
//! One counter key per generator name, `hc:{ids}:id:{name}` (under the [`Keyspace`] of the
//! group `ids`; the prefix is configurable), holding the highest ID proposed to that store, with
//! no TTL. To draw an ID, [`MajorityIds::next`]:
//!
//! 1. sends `get` to all `N` stores at once and waits for the first majority `M = N / 2 + 1` of
//!    answers (an absent key reads as 0);
//! 2. proposes `P = max + 1`;
//!    (the first attempt of a call skips the read when the generator already saw a number, and
//!    proposes one above the largest it saw: with no rival since, that wins in one round trip;
//!    when it loses, the next attempt reads. Safety never rests on the read: see below);
//! 3. sends `set_max(key, P)` to all `N` stores at once and returns `P` as soon as `M` of them
//!    answered `true` (they held less than `P` and now hold `P`);
//! 4. otherwise (too few answers, or proposals lost to larger ones) sleeps a random time in
//!    `[0, min(backoff_max, backoff_base * 2^attempt))` and starts again at 1, until the
//!    deadline, when it fails with [`Error::Unavailable`] saying how many stores answered.
//!
//! Holes in the sequence are allowed (a proposal that lost burns its number); repeats and
//! regressions are not.
//!
//! # Why it is safe
//!
//! *Only `set_max == true` counts.* A store answers `true` to `set_max(P)` only when it held less
//! than `P` and now holds `P`, atomically. So of all the clients proposing the same `P`, at most
//! one hears `true` from any one store: after the first write the store holds `P`, and every
//! later `set_max(P)` there sees `P >= P` and answers `false`. The sets of stores that said `true`
//! to two clients for the same `P` are disjoint, and two disjoint sets cannot both be majorities:
//! **no two calls ever return the same ID**. (A store that already held exactly `P`, written by a
//! rival, answers `false`; counting it would let both rivals return `P`.)
//!
//! *Every ID is greater than every ID returned before its request started.* When a call returned
//! `Q`, a majority held `Q` or more, and stored numbers never decrease (`set_max` never moves
//! backwards, the key has no TTL, and the stores are durable). A call that starts later returns
//! `P` only if a majority answered `true`, that is held less than `P` just before; that majority
//! shares at least one store with the first, which held `Q` or more and less than `P`: `P > Q`.
//!
//! Neither argument uses what the read returned: the read only makes a winning proposal likely.
//! That is why the first attempt may propose from the generator's own hint instead.
//!
//! # Blocks, and group commit
//!
//! [`MajorityIds::next_block`] takes `k` consecutive IDs in one round, and [`MediatedIds`] uses
//! it to serve every caller waiting when a round starts (group commit). `set_max` cannot grant a
//! block: a store that answers `true` to `set_max(P + k - 1)` held less than `P + k - 1`, not
//! less than `P`, so a rival's block or ID inside the range may already be out (the simulation
//! finds such a repeat at its first seed when blocks are built that way). A block round is a
//! compare-and-set instead: for each store it counts, the text the store holds (as this
//! generator last read or wrote it, or read now when that fails), and `base` the largest of
//! those values; it sets each store from its own text to `base + k`, and the block
//! `base + 1 ..= base + k` is the call's once a majority answered `true`.
//!
//! *No overlap.* Each store that answered `true` held at most `base` and now holds `base + k`.
//! Of two blocks (or a block and a single ID) granted by two majorities, a store in both took
//! both writes, one after the other: the second saw the first's value, which is then at most
//! the second's base (a compare-and-set) or below its proposal (`set_max`), so the two ranges
//! are disjoint.
//!
//! *Every ID of a block is greater than every ID returned before the call started*: that ID's
//! majority holds it or more, and shares a store with the block's majority, which held at most
//! `base` before the block's write: the earlier ID is at most `base`, below the whole block.
//!
//! *Group commit is linearizable*: the `k` calls served by one round were all waiting when it
//! started and are all answered after it ended, so they overlap one another and any order among
//! them is allowed, and each of their IDs is greater than every ID returned before the round
//! started, which includes every call that completed before any of them started.
//!
//! Both arguments need the stores to keep what they acknowledged: a store that forgets (restarted
//! without persistence) can let a later majority read a smaller number, and hand out an ID again.
//! Hence the durability check below.
//!
//! # Majority
//!
//! `M = N / 2 + 1` for every `N`: 1 of 1, 2 of 2, 2 of 3, 3 of 4, 3 of 5, 4 of 6. With an even
//! `N` a majority is more than half, so `N = 4` tolerates one unreachable store, like `N = 3`,
//! and `N = 2` tolerates none; odd `N` are the sensible choices.
//!
//! # Durability
//!
//! [`MajorityIds::new`] asks every store [`Store::durability`](crate::Store::durability) (Redis `appendonly yes` with
//! `appendfsync always`, PostgreSQL `fsync` and `synchronous_commit`, SQLite `synchronous=FULL`,
//! etcd always) and, under [`DurabilityPolicy::Require`] (the default), refuses the set with
//! [`Error::InvalidConfig`] when one answers "not durable". A store that cannot be reached at
//! construction is probed again before its first use, and excluded until it answers durable.
//! [`DurabilityPolicy::AllowNonDurable`] uses such stores anyway and logs a warning for each:
//! a crash of one of them can then repeat an ID.
//!
//! # Bad input and faults
//!
//! * An empty store list is [`Error::InvalidArgument`]; so is one store handle passed twice
//!   (the same `Arc`). Two different handles to the same server cannot be told apart here: the
//!   `headcount ids next` command rejects duplicate URLs, a library caller should not pass
//!   them. They cannot break uniqueness (a server answers `true` at most once for a value,
//!   whichever handle asks), but the fault tolerance is not what N suggests: the server behind
//!   two of three handles is a single point of failure.
//! * A store that fails (unreachable, timed out) counts as not answering for that attempt.
//! * A store that holds something other than a decimal integer at the key answers
//!   [`Error::ForeignValue`]: it is logged and counted as not answering, so the other stores keep
//!   serving; when so many stores fail permanently (foreign values, refusals) that no majority
//!   remains, the call fails at once with that error instead of waiting for the deadline.
//! * A counter at `i64::MAX` cannot grow: [`Error::Rejected`].
//!
//! # A store far ahead
//!
//! A store restored from the wrong backup, or edited by hand, can hold a number far above the
//! others (`9223372036854775800`). Proposing one above it would hand out that number, every store
//! of the majority would take it, and the generator would be spent for good, repaired store or
//! not. So when the answers of a read spread over more than [`MAX_JUMP`] (2^40), the read goes on
//! until it can bound what a majority holds: the `M`-th largest of the `N` numbers, taking the
//! stores not heard from as holding more. No ID above that bound was ever returned (it would be
//! held by a majority, and two majorities share a store), so every store more than `MAX_JUMP`
//! above it is left out of the proposal (a warning names each), as long as a majority of answers
//! remains; when every store answered and none is that far above the bound, the spread is a store
//! far *behind*, and the numbers are used as always. When it cannot tell (too few stores answer),
//! the attempt fails and the call fails closed at its deadline. Leaving stores out costs no
//! safety: safety never rests on the read. A store left out is never remembered as holding its
//! number, so a later block round that skips its read cannot propose from it either. A
//! legitimate spread that large would take 2^20 lost proposals stacked on one minority of
//! stores, or a store that lagged while more than 2^40 IDs were handed out.
//!
//! A store left out refuses every proposal until it is repaired, so the set tolerates one failure
//! fewer meanwhile. To repair it, stop the generators, read the counter on **every** other store
//! (all of them must answer), and set the damaged store's counter to the largest of those values
//! (for Redis, `SET hc:{ids}:id:NAME <value>`; for SQL, an `UPDATE` of that key's row). Never
//! delete it, and never set it from some of the others only: an ID may have been granted by a
//! majority that includes the damaged store and a store that is down now, and a value below it
//! would let that ID be handed out again.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use rand::Rng;
use tracing::Instrument;

use crate::clock::{timeout_at, Clock, SystemClock};
use crate::error::{Error, Result};

#[cfg(feature = "grpc")]
pub mod service;
use crate::keys::{validate_group, Keyspace, DEFAULT_PREFIX};
use crate::metrics as m;
use crate::store::parse_counter;
use crate::DynStore;
#[cfg(feature = "grpc")]
pub use service::{serve, IdsClient, IdsServer, IdsService, RunningIdsServer};

/// The name errors of this recipe give as their `backend`.
const RECIPE: &str = "majority ids";

/// The group under which every generator's key lives: `hc:{ids}:id:{name}`.
pub const IDS_GROUP: &str = "ids";

/// Default for [`IdsConfig::with_deadline`].
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// Default first backoff bound of [`IdsConfig::with_backoff`].
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(1);

/// Default largest backoff of [`IdsConfig::with_backoff`].
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The most IDs one [`MajorityIds::next_block`] call takes.
pub const MAX_BLOCK: u64 = 1 << 20;

/// How far above a majority of the other stores one store's counter may stand before a read
/// takes it for damage (a bad restore) and leaves it out of proposals: 2^40, a million times
/// [`MAX_BLOCK`]. See "A store far ahead" in the module docs.
pub const MAX_JUMP: i64 = 1 << 40;

/// `count` as a block size, if it is one.
fn check_block(count: u64) -> Result<i64> {
    if count == 0 || count > MAX_BLOCK {
        return Err(Error::invalid(format!(
            "an ID block of {count}: take 1 to {MAX_BLOCK} IDs at once"
        )));
    }
    Ok(i64::try_from(count).unwrap_or(1))
}

/// What to do with a store that is not known to be durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DurabilityPolicy {
    /// Refuse it: [`MajorityIds::new`] fails, a store probed later is excluded. The default.
    #[default]
    Require,
    /// Use it and log a warning: a crash of such a store can make a later ID repeat an earlier
    /// one.
    AllowNonDurable,
}

/// The configuration of a [`MajorityIds`] generator.
#[derive(Debug, Clone)]
pub struct IdsConfig {
    name: String,
    prefix: String,
    deadline: Duration,
    backoff_base: Duration,
    backoff_max: Duration,
    durability: DurabilityPolicy,
    clock: Arc<dyn Clock>,
}

impl IdsConfig {
    /// The generator `name` (the alphabet of a group name: `A-Z a-z 0-9 _ - .`), with the
    /// defaults: prefix `hc`, deadline 5 s, backoff from 1 ms up to 100 ms, durability required.
    pub fn new(name: impl Into<String>) -> Self {
        IdsConfig {
            name: name.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            deadline: DEFAULT_DEADLINE,
            backoff_base: DEFAULT_BACKOFF_BASE,
            backoff_max: DEFAULT_BACKOFF_MAX,
            durability: DurabilityPolicy::Require,
            clock: Arc::new(SystemClock::new()),
        }
    }

    /// The clock that times deadlines and backoff pauses instead of the system's (tests drive a
    /// [`ManualClock`](crate::ManualClock)).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The key prefix instead of `hc`.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long [`MajorityIds::next`] (and the durability probe of [`MajorityIds::new`]) may
    /// take before it gives up.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The randomized exponential backoff between attempts: attempt `k` (from 0) sleeps a
    /// uniform random time below `min(max, base * 2^k)`.
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// What to do with stores that are not durable.
    pub fn with_durability(mut self, policy: DurabilityPolicy) -> Self {
        self.durability = policy;
        self
    }

    /// The generator name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The deadline of one call.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    fn check(&self) -> Result<()> {
        validate_group(&self.name).map_err(|e| match e {
            Error::InvalidArgument { message } => {
                Error::invalid(message.replacen("group name", "ID generator name", 1))
            }
            other => other,
        })?;
        if self.deadline.is_zero() {
            return Err(Error::invalid("the deadline of majority IDs is zero"));
        }
        if self.backoff_base.is_zero() || self.backoff_max < self.backoff_base {
            return Err(Error::invalid(format!(
                "backoff base {:?} must be positive and at most the maximum {:?}",
                self.backoff_base, self.backoff_max
            )));
        }
        Ok(())
    }
}

/// Counters of a generator since it was made, for benchmarks and monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct IdsStats {
    /// IDs returned.
    pub ids: u64,
    /// Rounds of read + propose, successful or not.
    pub attempts: u64,
    /// Rounds that returned IDs (one, or a block of them).
    pub won: u64,
    /// Calls that failed (deadline or permanent errors).
    pub failures: u64,
}

impl IdsStats {
    /// Attempts that returned no ID, per attempt: 0 without contention or faults.
    pub fn retry_rate(&self) -> f64 {
        if self.attempts == 0 {
            return 0.0;
        }
        self.attempts.saturating_sub(self.won) as f64 / self.attempts as f64
    }
}

#[derive(Debug, Default)]
struct Stats {
    ids: AtomicU64,
    attempts: AtomicU64,
    won: AtomicU64,
    failures: AtomicU64,
}

/// One store of the set.
struct Node {
    store: DynStore,
    /// Whether the store passed the durability check (always true under `AllowNonDurable`).
    checked: AtomicBool,
    /// What this generator last read or wrote at the store's counter (`Some(None)`: absent),
    /// when it still believes it: a block proposal compares against it (see [`MajorityIds::next_block`]).
    known: std::sync::Mutex<Option<Option<String>>>,
}

impl Node {
    fn known(&self) -> Option<Option<String>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_known(&self, value: Option<Option<String>>) {
        *self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = value;
    }
}

/// A generator of monotonically increasing IDs agreed by a majority of independent stores; see
/// the [module docs](self) for the algorithm and why it is safe.
///
/// Cheap to share behind an `Arc`; any number of tasks (and processes) may call
/// [`next`](Self::next) at once: concurrent calls contend, and lose attempts to each other, so a
/// busy process should put one [`MediatedIds`] in front of them.
pub struct MajorityIds {
    nodes: Vec<Node>,
    majority: usize,
    key: String,
    config: IdsConfig,
    stats: Stats,
    /// The largest counter value this generator has read or had accepted; 0 before any.
    hint: AtomicI64,
    /// The servers that hold each store's data ([`crate::Durability::servers`]), as probed
    /// (empty for a store not probed yet): compared and recorded under one lock, so two late
    /// probes cannot both pass as distinct.
    servers: std::sync::Mutex<Vec<Vec<String>>>,
}

impl fmt::Debug for MajorityIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MajorityIds")
            .field("key", &self.key)
            .field("stores", &self.nodes.len())
            .field("majority", &self.majority)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl MajorityIds {
    /// A generator over `stores` (at least one; an odd number is sensible) with `config`, after
    /// checking that every store is durable (see the module docs). Fails with
    /// [`Error::InvalidArgument`] for an empty list, a handle passed twice or a bad name,
    /// [`Error::InvalidConfig`] for a store that is not durable under
    /// [`DurabilityPolicy::Require`].
    pub async fn new(stores: Vec<DynStore>, config: IdsConfig) -> Result<Self> {
        config.check()?;
        if stores.is_empty() {
            return Err(Error::invalid("majority IDs need at least one store"));
        }
        for (i, a) in stores.iter().enumerate() {
            if let Some(j) = stores[..i].iter().position(|b| Arc::ptr_eq(a, b)) {
                return Err(Error::invalid(format!(
                    "store #{j} is passed again as store #{i}: a majority must be of distinct stores"
                )));
            }
        }
        let key = Keyspace::with_prefix(&config.prefix, IDS_GROUP)?
            .key(format_args!("id:{}", config.name));
        let majority = stores.len() / 2 + 1;
        let allow = config.durability == DurabilityPolicy::AllowNonDurable;
        let deadline = config.clock.monotonic() + config.deadline;
        let (clock, within) = (config.clock.as_ref(), config.deadline);
        let probes = stores.iter().map(|s| async move {
            timeout_at(clock, deadline, s.durability())
                .await
                .unwrap_or_else(|| Err(deadline_error("durability", within)))
        });
        let answers = futures::future::join_all(probes).await;
        let servers: Vec<Vec<String>> = answers
            .iter()
            .map(|a| a.as_ref().map(|d| d.servers.clone()).unwrap_or_default())
            .collect();
        for i in 0..servers.len() {
            if let Some((j, server)) = same_server(&servers, i) {
                return Err(one_server(j, i, server));
            }
        }
        let mut nodes = Vec::with_capacity(stores.len());
        for (i, (store, answer)) in stores.into_iter().zip(answers).enumerate() {
            let backend = store.capabilities().backend;
            let checked = match answer {
                Ok(d) if d.durable => true,
                Ok(d) if allow => {
                    tracing::warn!(
                        store = i,
                        backend,
                        detail = %d.detail,
                        "majority IDs use a store that is not durable, as told: a crash of it can repeat an ID"
                    );
                    true
                }
                Ok(d) => {
                    return Err(Error::config(format!(
                        "store #{i} ({backend}) is not durable: {}; majority IDs need every acknowledged write on disk (or opt out explicitly: AllowNonDurable, --allow-non-durable)",
                        d.detail
                    )))
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(store = i, backend, error = %e,
                        "cannot check whether this ID store is durable yet; it is checked again before its first use");
                    allow
                }
                Err(e) => return Err(e),
            };
            nodes.push(Node {
                store,
                checked: AtomicBool::new(checked),
                known: std::sync::Mutex::new(None),
            });
        }
        Ok(MajorityIds {
            nodes,
            majority,
            key,
            config,
            stats: Stats::default(),
            hint: AtomicI64::new(0),
            servers: std::sync::Mutex::new(servers),
        })
    }

    /// The key every store holds the counter at: `hc:{ids}:id:{name}`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How many stores must store an ID: `N / 2 + 1`.
    pub fn majority(&self) -> usize {
        self.majority
    }

    /// How many stores the generator runs over.
    pub fn stores(&self) -> usize {
        self.nodes.len()
    }

    /// Counters since the generator was made.
    pub fn stats(&self) -> IdsStats {
        IdsStats {
            ids: self.stats.ids.load(Ordering::Relaxed),
            attempts: self.stats.attempts.load(Ordering::Relaxed),
            won: self.stats.won.load(Ordering::Relaxed),
            failures: self.stats.failures.load(Ordering::Relaxed),
        }
    }

    /// The next ID: greater than every ID any caller got before this call started, and never
    /// returned to anyone else. Fails closed, returning no ID, when no majority stored one within
    /// the deadline ([`Error::Unavailable`], retryable), or at once when so many stores fail
    /// permanently that no majority can answer (their error, such as [`Error::ForeignValue`]).
    pub async fn next(&self) -> Result<i64> {
        let span = tracing::debug_span!("ids.next", key = %self.key, stores = self.nodes.len());
        let out = self
            .next_until(self.config.clock.monotonic() + self.config.deadline)
            .instrument(span)
            .await;
        match &out {
            Ok(_) => ::metrics::counter!(m::IDS_GENERATED).increment(1),
            Err(e) => {
                ::metrics::counter!(m::IDS_FAILURES, "kind" => m::error_label(e)).increment(1)
            }
        }
        out
    }

    /// `count` consecutive IDs at once, in one majority round while no rival writes: every one
    /// of them greater than every ID any caller got before this call started, and none ever
    /// returned to anyone else (see "Blocks" in the module docs). `count` is 1 to
    /// [`MAX_BLOCK`]; fails like [`MajorityIds::next`].
    pub async fn next_block(&self, count: u64) -> Result<std::ops::RangeInclusive<i64>> {
        let k = check_block(count)?;
        let span = tracing::debug_span!("ids.next_block", key = %self.key, count);
        let out = self
            .next_range_until(self.config.clock.monotonic() + self.config.deadline, k)
            .instrument(span)
            .await;
        match &out {
            Ok(_) => ::metrics::counter!(m::IDS_GENERATED).increment(count),
            Err(e) => {
                ::metrics::counter!(m::IDS_FAILURES, "kind" => m::error_label(e)).increment(1)
            }
        }
        out
    }

    /// [`MajorityIds::next`] with the deadline given as an instant.
    async fn next_until(&self, deadline: Duration) -> Result<i64> {
        self.next_range_until(deadline, 1).await.map(|r| *r.start())
    }

    /// `k` IDs (one: [`MajorityIds::attempt`], more: [`MajorityIds::attempt_block`]) by the
    /// deadline.
    async fn next_range_until(
        &self,
        deadline: Duration,
        k: i64,
    ) -> Result<std::ops::RangeInclusive<i64>> {
        let mut attempt: u32 = 0;
        loop {
            self.stats.attempts.fetch_add(1, Ordering::Relaxed);
            let round = async {
                if k == 1 {
                    self.attempt(deadline, attempt == 0).await.map(|id| id..=id)
                } else {
                    self.attempt_block(deadline, attempt == 0, k).await
                }
            };
            let outcome = round
                .instrument(tracing::debug_span!("ids.round", attempt))
                .await;
            let lost = match outcome {
                Ok(ids) => {
                    self.stats
                        .ids
                        .fetch_add(u64::try_from(k).unwrap_or(0), Ordering::Relaxed);
                    self.stats.won.fetch_add(1, Ordering::Relaxed);
                    ::metrics::counter!(m::IDS_ROUNDS, "result" => "id").increment(1);
                    return Ok(ids);
                }
                Err(Lost::Permanent(e)) => {
                    self.stats.failures.fetch_add(1, Ordering::Relaxed);
                    ::metrics::counter!(m::IDS_ROUNDS, "result" => "failed").increment(1);
                    return Err(e);
                }
                Err(Lost::Retry(lost)) => lost,
            };
            let now = self.config.clock.monotonic();
            let bound = self
                .config
                .backoff_base
                .saturating_mul(1u32 << attempt.min(20))
                .min(self.config.backoff_max);
            let pause = rand::rng().random_range(Duration::ZERO..=bound);
            if now + pause >= deadline {
                ::metrics::counter!(m::IDS_ROUNDS, "result" => "failed").increment(1);
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                return Err(Error::Unavailable {
                    backend: RECIPE,
                    message: format!(
                        "no majority ({} of {}) stored an ID within {:?} ({} attempts); last attempt: {}",
                        self.majority,
                        self.nodes.len(),
                        self.config.deadline,
                        attempt + 1,
                        lost
                    ),
                    source: None,
                });
            }
            ::metrics::counter!(m::IDS_ROUNDS, "result" => "retry").increment(1);
            ::metrics::counter!(m::IDS_RETRIES).increment(1);
            self.config.clock.sleep(pause).await;
            attempt = attempt.saturating_add(1);
        }
    }

    /// One round: read a majority, propose the maximum plus one to every store.
    async fn attempt(
        &self,
        deadline: Duration,
        optimistic: bool,
    ) -> std::result::Result<i64, Lost> {
        let mut summary = Summary::default();
        let hint = self.hint.load(Ordering::Relaxed);
        let max = if optimistic && hint > 0 {
            // The largest number this generator saw: with no rival since, the majority holds
            // exactly it, and proposing one more wins in one round trip.
            hint
        } else {
            let reads = self.read_majority(deadline, &mut summary).await?;
            let max = reads.iter().map(|r| r.value).max().unwrap_or(0).max(0);
            self.hint.fetch_max(max, Ordering::Relaxed);
            max
        };
        let Some(proposal) = max.checked_add(1) else {
            return Err(Lost::Permanent(Error::Rejected {
                backend: RECIPE,
                message: format!("the ID counter `{}` reached i64::MAX", self.key),
                source: None,
            }));
        };
        let writes: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| async move { (i, self.write(node, proposal, deadline).await) })
            .collect();
        // Only `true` counts: see "Why it is safe" in the module docs.
        let writes = self.first_majority(writes, |wrote| *wrote).await;
        if writes.counted >= self.majority {
            self.hint.fetch_max(proposal, Ordering::Relaxed);
            return Ok(proposal);
        }
        Err(self.lost_proposal(summary, writes))
    }

    /// A proposal too few stores accepted.
    fn lost_proposal(&self, mut summary: Summary, writes: Answers<bool>) -> Lost {
        summary.accepted = writes.counted;
        summary.refused = writes.ok.len() - writes.counted;
        summary.errors = writes.errors;
        summary.unawaited = writes.unawaited;
        summary.proposed = true;
        self.lost(summary)
    }

    /// One round for a block of `k` IDs: compare-and-set every store that counts from the text
    /// it holds (as this generator last saw it when `optimistic` and it knows a majority, else
    /// read now) to `base + k`, where `base` is the largest of those values; the block
    /// `base + 1 ..= base + k` is this call's once a majority of them answered `true`.
    async fn attempt_block(
        &self,
        deadline: Duration,
        optimistic: bool,
        k: i64,
    ) -> std::result::Result<std::ops::RangeInclusive<i64>, Lost> {
        let mut summary = Summary::default();
        let known: Vec<(usize, Option<String>)> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((i, n.known()?)))
            .collect();
        // What a node is known to hold is always a number (a read that passed, or this
        // generator's own write); one that does not parse is taken as unknown.
        let values: Option<Vec<i64>> = known
            .iter()
            .map(|(_, text)| {
                text.as_deref()
                    .map_or(Ok(0), |t| parse_counter(&self.key, t))
                    .ok()
            })
            .collect();
        let (expected, base) = match values {
            Some(values) if optimistic && known.len() >= self.majority => {
                (known, values.into_iter().max().unwrap_or(0).max(0))
            }
            _ => {
                let reads = self.read_majority(deadline, &mut summary).await?;
                let base = reads.iter().map(|r| r.value).max().unwrap_or(0).max(0);
                let expected = reads.into_iter().map(|r| (r.node, r.text)).collect();
                (expected, base)
            }
        };
        self.hint.fetch_max(base, Ordering::Relaxed);
        let Some(last) = base.checked_add(k) else {
            return Err(Lost::Permanent(Error::Rejected {
                backend: RECIPE,
                message: format!(
                    "the ID counter `{}` cannot grow by {k} past {base}: i64::MAX",
                    self.key
                ),
                source: None,
            }));
        };
        let new = last.to_string();
        // A store whose answer is not awaited (a majority came first) may or may not take the
        // write: this generator no longer knows what it holds.
        for (i, _) in &expected {
            self.nodes[*i].set_known(None);
        }
        let writes: FuturesUnordered<_> = expected
            .into_iter()
            .map(|(i, text)| {
                let node = &self.nodes[i];
                let new = new.as_str();
                async move {
                    let cas = node
                        .store
                        .compare_and_set(&self.key, text.as_deref(), new, None);
                    let answer = timeout_at(self.config.clock.as_ref(), deadline, cas)
                        .await
                        .unwrap_or_else(|| {
                            Err(deadline_error("compare_and_set", self.config.deadline))
                        });
                    node.set_known(match answer {
                        Ok(true) => Some(Some(new.to_owned())),
                        _ => None,
                    });
                    (i, answer)
                }
            })
            .collect();
        // Only `true` counts: each such store held at most `base` and now holds `last`.
        let writes = self.first_majority(writes, |wrote| *wrote).await;
        if writes.counted >= self.majority {
            self.hint.fetch_max(last, Ordering::Relaxed);
            return Ok(base + 1..=last);
        }
        Err(self.lost_proposal(summary, writes))
    }

    /// A lost attempt: permanent when the stores that failed for good leave no majority.
    fn lost(&self, mut summary: Summary) -> Lost {
        let permanent = summary
            .errors
            .iter()
            .filter(|(_, e)| !e.is_retryable())
            .count();
        if permanent > 0 && self.nodes.len() - permanent < self.majority {
            if let Some(at) = summary.errors.iter().position(|(_, e)| !e.is_retryable()) {
                let (i, e) = summary.errors.swap_remove(at);
                tracing::warn!(store = i, error = %e, "majority IDs: too many stores fail for good");
                return Lost::Permanent(e);
            }
        }
        Lost::Retry(summary)
    }

    /// The durability check a node still owes, if it does: durable, and not one server with
    /// another store of the set.
    async fn check_durable(&self, i: usize, node: &Node) -> Result<()> {
        if !node.checked.load(Ordering::Acquire) {
            let d = node.store.durability().await?;
            if !d.durable {
                return Err(Error::Rejected {
                    backend: node.store.capabilities().backend,
                    message: format!("not durable: {}", d.detail),
                    source: None,
                });
            }
            {
                let mut servers = lock(&self.servers);
                servers[i] = d.servers;
                if let Some((j, server)) = same_server(&servers, i) {
                    let e = one_server(j, i, server);
                    servers[i].clear();
                    return Err(Error::Rejected {
                        backend: node.store.capabilities().backend,
                        message: e.to_string(),
                        source: None,
                    });
                }
            }
            node.checked.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// `get` on one node (after its durability check, if it still owes one): the text and its
    /// value (0 when absent).
    async fn read(&self, i: usize, node: &Node, deadline: Duration) -> Result<Read> {
        let work = async {
            self.check_durable(i, node).await?;
            node.store.get(&self.key).await
        };
        let text = timeout_at(self.config.clock.as_ref(), deadline, work)
            .await
            .unwrap_or_else(|| Err(deadline_error("get", self.config.deadline)))?;
        let value = match &text {
            None => 0,
            Some(t) => parse_counter(&self.key, t).inspect_err(|_| node.set_known(None))?,
        };
        Ok(Read {
            node: i,
            text,
            value,
        })
    }

    /// Reads until a majority answered, and returns their answers less any store that holds a
    /// number absurdly far above a majority of the stores (see "A store far ahead" in the
    /// module docs): when the largest answer stands more than [`MAX_JUMP`] above the next, it
    /// reads on until a majority of the other stores are seen to hold that much less (the
    /// store is left out) or not (it is kept); it fails the attempt when it cannot tell.
    async fn read_majority(
        &self,
        deadline: Duration,
        summary: &mut Summary,
    ) -> std::result::Result<Vec<Read>, Lost> {
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| async move { (i, self.read(i, node, deadline).await) })
            .collect();
        let mut reads = Answers::default();
        self.collect(&mut pending, &mut reads, self.majority, |_| true)
            .await;
        summary.answered = Some(reads.counted);
        if reads.counted < self.majority {
            summary.errors = reads.errors;
            summary.unawaited = reads.unawaited;
            return Err(self.lost(std::mem::take(summary)));
        }
        loop {
            let mut values: Vec<i64> = reads.ok.iter().map(|r| r.value.max(0)).collect();
            values.sort_unstable_by(|a, b| b.cmp(a));
            let (top, bottom) = (values[0], values[values.len() - 1]);
            if top.saturating_sub(bottom) <= MAX_JUMP {
                // The usual case: every answer within MAX_JUMP of the others.
                return Ok(self.accept(reads.ok));
            }
            // The number a majority holds is the M-th largest of all N; taking the stores not
            // heard from as holding more, it is at most `bound`, and no ID above it was ever
            // returned (it would be held by a majority, and two majorities share a store).
            let unknown = self.nodes.len() - values.len();
            if let Some(&bound) = self
                .majority
                .checked_sub(unknown + 1)
                .and_then(|at| values.get(at))
            {
                let far = |v: i64| v.max(0).saturating_sub(bound) > MAX_JUMP;
                let kept = reads.ok.iter().filter(|r| !far(r.value)).count();
                if kept < reads.ok.len() && kept >= self.majority {
                    let (out, kept): (Vec<Read>, Vec<Read>) =
                        reads.ok.into_iter().partition(|r| far(r.value));
                    for r in &out {
                        self.nodes[r.node].set_known(None);
                        tracing::warn!(
                            store = r.node,
                            holds = r.value,
                            majority_holds_at_most = bound,
                            key = %self.key,
                            "majority IDs: a store holds a number far above what a majority of \
                             the stores hold (a bad restore?); it is left out of proposals until \
                             repaired (see the module docs, \"A store far ahead\")"
                        );
                    }
                    return Ok(self.accept(kept));
                }
                if kept == reads.ok.len() && unknown == 0 {
                    // Every store answered and a majority holds the largest numbers: a store far
                    // behind, which proposals raise.
                    return Ok(self.accept(reads.ok));
                }
            }
            if pending.is_empty() {
                summary.errors = reads.errors;
                let at = reads
                    .ok
                    .iter()
                    .find(|r| r.value.max(0) == top)
                    .map_or(0, |r| r.node);
                summary.errors.push((
                    at,
                    Error::Unavailable {
                        backend: RECIPE,
                        message: format!(
                            "holds {top}, more than {MAX_JUMP} above another store's {bottom}: \
                             too few stores answered to tell what a majority holds"
                        ),
                        source: None,
                    },
                ));
                return Err(self.lost(std::mem::take(summary)));
            }
            let want = reads.counted + 1;
            self.collect(&mut pending, &mut reads, want, |_| true).await;
        }
    }

    /// The reads a proposal goes on: each node remembers what it read as [`Node::known`] (a
    /// store left out as far ahead never is, so an optimistic block round cannot use it).
    fn accept(&self, reads: Vec<Read>) -> Vec<Read> {
        for r in &reads {
            self.nodes[r.node].set_known(Some(r.text.clone()));
        }
        reads
    }

    /// `set_max(proposal)` on one node, if it passed its durability check.
    async fn write(&self, node: &Node, proposal: i64, deadline: Duration) -> Result<bool> {
        if !node.checked.load(Ordering::Acquire) {
            return Err(Error::Unavailable {
                backend: node.store.capabilities().backend,
                message: "not used until it answers the durability check".into(),
                source: None,
            });
        }
        // Unknown while the write is out (its answer may never be awaited), the proposal once
        // the store took it: a block round compares against what the store holds.
        node.set_known(None);
        let answer = timeout_at(
            self.config.clock.as_ref(),
            deadline,
            node.store.set_max(&self.key, proposal, None),
        )
        .await
        .unwrap_or_else(|| Err(deadline_error("set_max", self.config.deadline)));
        if matches!(answer, Ok(true)) {
            node.set_known(Some(Some(proposal.to_string())));
        }
        answer
    }

    /// Collects answers until `M` of them count (`counts`) or too few remain for that.
    async fn first_majority<T, F>(
        &self,
        mut pending: FuturesUnordered<F>,
        counts: impl Fn(&T) -> bool,
    ) -> Answers<T>
    where
        F: std::future::Future<Output = (usize, Result<T>)>,
    {
        let mut out = Answers::default();
        self.collect(&mut pending, &mut out, self.majority, counts)
            .await;
        out
    }

    /// Adds answers to `out` until `want` of them count (`counts`) or too few remain for that.
    async fn collect<T, F>(
        &self,
        pending: &mut FuturesUnordered<F>,
        out: &mut Answers<T>,
        want: usize,
        counts: impl Fn(&T) -> bool,
    ) where
        F: std::future::Future<Output = (usize, Result<T>)>,
    {
        while out.counted < want && out.counted + pending.len() >= want {
            let Some((i, answer)) = pending.next().await else {
                break;
            };
            match answer {
                Ok(v) => {
                    out.counted += usize::from(counts(&v));
                    out.ok.push(v);
                }
                Err(e) => {
                    self.log_node_error(i, &e);
                    out.errors.push((i, e));
                }
            }
        }
        out.unawaited = pending.len();
    }

    fn log_node_error(&self, i: usize, e: &Error) {
        if e.is_retryable() {
            tracing::debug!(store = i, error = %e, "majority IDs: a store did not answer");
        } else {
            tracing::warn!(store = i, error = %e, "majority IDs: a store fails for good");
        }
    }
}

/// The same failure for another caller of one round: the kind kept where the error says what
/// happened to the call (unavailable, timed out), the message kept otherwise.
fn copy_error(e: &Error) -> Error {
    match e {
        Error::Timeout { backend, op, after } => Error::Timeout {
            backend,
            op,
            after: *after,
        },
        e if e.is_retryable() => Error::Unavailable {
            backend: RECIPE,
            message: e.to_string(),
            source: None,
        },
        e => Error::Rejected {
            backend: RECIPE,
            message: e.to_string(),
            source: None,
        },
    }
}

fn deadline_error(op: &'static str, after: Duration) -> Error {
    Error::Timeout {
        backend: RECIPE,
        op,
        after,
    }
}

/// One store's answer to a read.
struct Read {
    node: usize,
    text: Option<String>,
    value: i64,
}

/// The first other store that shares a server with store `i`, and that server.
fn same_server(servers: &[Vec<String>], i: usize) -> Option<(usize, &str)> {
    servers.iter().enumerate().find_map(|(j, other)| {
        if j == i {
            return None;
        }
        servers[i]
            .iter()
            .find(|s| other.contains(s))
            .map(|s| (j, s.as_str()))
    })
}

fn one_server(j: usize, i: usize, server: &str) -> Error {
    let (j, i) = (j.min(i), j.max(i));
    Error::invalid(format!(
        "stores #{j} and #{i} are one server ({server}): a majority must be of independent \
         stores, or one failure (or one lost disk) takes several votes"
    ))
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The answers of one phase: the values, how many of them count toward the majority, the
/// failures.
struct Answers<T> {
    ok: Vec<T>,
    counted: usize,
    errors: Vec<(usize, Error)>,
    /// Stores whose answer was not awaited: a majority came first, or could no longer come.
    unawaited: usize,
}

impl<T> Default for Answers<T> {
    fn default() -> Self {
        Answers {
            ok: Vec::new(),
            counted: 0,
            errors: Vec::new(),
            unawaited: 0,
        }
    }
}

/// What one lost attempt saw, for the error at the deadline.
#[derive(Default)]
struct Summary {
    /// How many stores answered the read; `None` when the attempt proposed from its hint.
    answered: Option<usize>,
    accepted: usize,
    refused: usize,
    errors: Vec<(usize, Error)>,
    /// Stores still to answer when the phase stopped (no majority was possible any more).
    unawaited: usize,
    /// Whether the attempt got as far as proposing.
    proposed: bool,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.answered {
            Some(n) => write!(f, "{n} stores answered the read, ")?,
            None => write!(f, "proposed one above the last ID seen without a read, ")?,
        }
        if self.proposed {
            write!(
                f,
                "{} accepted the proposal, {} held as much or more",
                self.accepted, self.refused
            )?;
        } else {
            write!(f, "too few for a proposal")?;
        }
        if self.unawaited > 0 {
            write!(
                f,
                ", {} not awaited (no majority was possible any more)",
                self.unawaited
            )?;
        }
        if let Some((i, e)) = self.errors.first() {
            write!(f, "; store #{i}: {e}")?;
            if self.errors.len() > 1 {
                write!(f, " (and {} more failed)", self.errors.len() - 1)?;
            }
        }
        Ok(())
    }
}

enum Lost {
    Retry(Summary),
    Permanent(Error),
}

/// The in-process mediator the seed suggests, with group commit: callers that arrive while a
/// majority round is in flight wait together, and the next round takes one block of IDs for all
/// of them ([`MajorityIds::next_block`]), handed out in their order of arrival. The callers of
/// one process never make each other's proposals lose, and `k` waiting callers cost one round
/// instead of `k`. Calls from other processes still contend as usual.
///
/// Linearizable: the `k` calls served by one round all overlapped it (each was waiting when it
/// started and is answered after it ended), so any order among them is allowed, and every ID
/// of the block is greater than every ID returned before the round started, which includes
/// every call that completed before any of the `k` started.
#[derive(Debug)]
pub struct MediatedIds {
    ids: MajorityIds,
    /// Held by the caller running a round.
    turn: tokio::sync::Mutex<()>,
    /// The most callers one round serves: [`MediatedIds::MAX_BATCH`], or 1 for
    /// [`MediatedIds::one_at_a_time`].
    batch: usize,
    /// The callers waiting for an ID, oldest first.
    queue: std::sync::Mutex<std::collections::VecDeque<Waiter>>,
}

/// A caller of [`MediatedIds::next_block`] waiting for its IDs.
#[derive(Debug)]
struct Waiter {
    deadline: Duration,
    count: i64,
    reply: tokio::sync::oneshot::Sender<Result<std::ops::RangeInclusive<i64>>>,
}

impl MediatedIds {
    /// The most callers one round serves.
    pub const MAX_BATCH: usize = 4096;

    /// Mediates the calls of `ids`, with group commit.
    pub fn new(ids: MajorityIds) -> Self {
        MediatedIds {
            ids,
            turn: tokio::sync::Mutex::new(()),
            batch: Self::MAX_BATCH,
            queue: std::sync::Mutex::default(),
        }
    }

    /// Mediates the calls of `ids` without group commit: the callers take turns, one majority
    /// round each, in their order of arrival (the seed's mediator as first built, kept to be
    /// measured beside group commit).
    pub fn one_at_a_time(ids: MajorityIds) -> Self {
        MediatedIds {
            batch: 1,
            ..MediatedIds::new(ids)
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Waiter>> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`MajorityIds::next`], mediated: the ID comes from the next round after the call, which
    /// serves every caller waiting when it starts. The deadline runs from the call, waiting
    /// included: a caller queued behind a slow round fails closed within its own deadline.
    pub async fn next(&self) -> Result<i64> {
        self.next_range(1).await.map(|ids| *ids.start())
    }

    /// [`MajorityIds::next_block`], mediated: the block is part of the next round's, which
    /// serves every caller waiting when it starts.
    pub async fn next_block(&self, count: u64) -> Result<std::ops::RangeInclusive<i64>> {
        check_block(count)?;
        self.next_range(count).await
    }

    async fn next_range(&self, count: u64) -> Result<std::ops::RangeInclusive<i64>> {
        let count = i64::try_from(count).unwrap_or(1);
        let deadline = self.ids.config.clock.monotonic() + self.ids.config.deadline;
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        self.queue().push_back(Waiter {
            deadline,
            count,
            reply,
        });
        loop {
            tokio::select! {
                biased;
                got = &mut answer => {
                    if let Ok(got) = got {
                        return got;
                    }
                    // The caller running the round that took this call was cancelled (its
                    // IDs, if stored, are holes): wait for another.
                    let (reply, again) = tokio::sync::oneshot::channel();
                    answer = again;
                    self.queue().push_back(Waiter {
                        deadline,
                        count,
                        reply,
                    });
                }
                turn = timeout_at(self.ids.config.clock.as_ref(), deadline, self.turn.lock()) => {
                    let Some(_turn) = turn else {
                        self.ids.stats.failures.fetch_add(1, Ordering::Relaxed);
                        return Err(Error::Unavailable {
                            backend: RECIPE,
                            message: format!(
                                "no round within {:?}: the rounds ahead of this call took the whole deadline",
                                self.ids.config.deadline
                            ),
                            source: None,
                        });
                    };
                    // This caller runs the next round, for everyone waiting (itself included,
                    // unless an earlier round served it meanwhile: the answer is then ready).
                    self.round().await;
                }
            }
        }
    }

    /// One round for the callers waiting now (at most [`MediatedIds::MAX_BATCH`]).
    async fn round(&self) {
        let batch: Vec<Waiter> = {
            let mut queue = self.queue();
            queue.retain(|w| !w.reply.is_closed());
            // The oldest callers, while their IDs fit in one block (the first always does).
            let (mut n, mut k) = (0, 0i64);
            while n < self.batch.min(queue.len())
                && (n == 0 || k + queue[n].count <= MAX_BLOCK as i64)
            {
                k += queue[n].count;
                n += 1;
            }
            queue.drain(..n).collect()
        };
        let Some(deadline) = batch.iter().map(|w| w.deadline).min() else {
            return;
        };
        let k: i64 = batch.iter().map(|w| w.count).sum();
        match self.ids.next_range_until(deadline, k).await {
            Ok(ids) => {
                let mut next = *ids.start();
                for w in batch {
                    let _ = w.reply.send(Ok(next..=next + w.count - 1));
                    next += w.count;
                }
            }
            Err(e) => {
                let now = self.ids.config.clock.monotonic();
                let retryable = e.is_retryable();
                // A round that ran out of the oldest caller's time did not run out of the
                // others': they wait for the next round.
                let (fail, again): (Vec<Waiter>, Vec<Waiter>) = batch
                    .into_iter()
                    .partition(|w| !retryable || w.deadline <= now);
                let mut errors: Vec<Error> = (1..fail.len()).map(|_| copy_error(&e)).collect();
                errors.push(e);
                for (w, e) in fail.into_iter().zip(errors.into_iter().rev()) {
                    let _ = w.reply.send(Err(e));
                }
                let mut queue = self.queue();
                for w in again.into_iter().rev() {
                    queue.push_front(w);
                }
            }
        }
    }

    /// The generator behind the mediator.
    pub fn inner(&self) -> &MajorityIds {
        &self.ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_checked() {
        assert!(IdsConfig::new("orders").check().is_ok());
        for bad in [
            IdsConfig::new("a:b"),
            IdsConfig::new(""),
            IdsConfig::new("x").with_deadline(Duration::ZERO),
            IdsConfig::new("x").with_backoff(Duration::ZERO, Duration::from_millis(1)),
            IdsConfig::new("x").with_backoff(Duration::from_millis(2), Duration::from_millis(1)),
        ] {
            assert!(
                matches!(bad.check(), Err(Error::InvalidArgument { .. })),
                "{bad:?}"
            );
        }
        let named = IdsConfig::new("a b").check().unwrap_err().to_string();
        assert!(named.contains("ID generator name"), "{named}");
    }

    #[test]
    fn retry_rate_counts_attempts_without_an_id() {
        assert_eq!(IdsStats::default().retry_rate(), 0.0);
        let s = IdsStats {
            ids: 1,
            attempts: 4,
            won: 1,
            failures: 0,
        };
        assert_eq!(s.retry_rate(), 0.75);
    }
}
