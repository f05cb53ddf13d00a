//! The generator: [`MajorityIds`], its stores ([`Node`]) and counters ([`IdsStats`]), how it is
//! made (the durability check) and the retry loop around its rounds (in `round.rs`).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tracing::Instrument;

use super::answers::{deadline_error, one_server, same_server, Lost};
use super::{check_block, DurabilityPolicy, IdsConfig, IDS_GROUP, RECIPE};
use crate::clock::timeout_at;
use crate::error::{Error, Result};
use crate::keys::Keyspace;
use crate::metrics as m;
use crate::DynStore;

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
pub(super) struct Stats {
    pub(super) ids: AtomicU64,
    pub(super) attempts: AtomicU64,
    pub(super) won: AtomicU64,
    pub(super) failures: AtomicU64,
}

/// One store of the set.
pub(super) struct Node {
    pub(super) store: DynStore,
    /// Whether the store passed the durability check (always true under `AllowNonDurable`).
    pub(super) checked: AtomicBool,
    /// What this generator believes the store holds at the counter: a block proposal compares
    /// against it (see [`MajorityIds::next_block`]).
    pub(super) known: std::sync::Mutex<Known>,
}

/// What a generator believes one store holds at the counter key.
#[derive(Debug, Clone)]
pub(super) enum Known {
    /// Nothing it can rely on: never read, a write whose answer it did not await or that was
    /// not `true`, a read that did not parse, or a store left out as far ahead.
    Unknown,
    /// The text it last read there or wrote there itself, as [`Store::get`](crate::Store::get)
    /// gives it (`None`: no key).
    Holds(Option<String>),
}

impl Node {
    pub(super) fn known(&self) -> Known {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set_known(&self, value: Known) {
        *self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = value;
    }
}

/// A generator of monotonically increasing IDs agreed by a majority of independent stores; see
/// the [module docs](super) for the algorithm and why it is safe.
///
/// Cheap to share behind an `Arc`; any number of tasks (and processes) may call
/// [`next`](Self::next) at once: concurrent calls contend, and lose attempts to each other, so a
/// busy process should put one [`MediatedIds`](super::MediatedIds) in front of them.
pub struct MajorityIds {
    pub(super) nodes: Vec<Node>,
    pub(super) majority: usize,
    pub(super) key: String,
    pub(super) config: IdsConfig,
    pub(super) stats: Stats,
    /// The largest counter value this generator has read or had accepted; 0 before any.
    pub(super) hint: AtomicI64,
    /// The servers that hold each store's data ([`crate::Durability::servers`]), as probed
    /// (empty for a store not probed yet): compared and recorded under one lock, so two late
    /// probes cannot both pass as distinct.
    pub(super) servers: std::sync::Mutex<Vec<Vec<String>>>,
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
                known: std::sync::Mutex::new(Known::Unknown),
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
    /// [`MAX_BLOCK`](super::MAX_BLOCK); fails like [`MajorityIds::next`].
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
    pub(super) async fn next_range_until(
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

    /// The durability check a node still owes, if it does: durable, and not one server with
    /// another store of the set.
    pub(super) async fn check_durable(&self, i: usize, node: &Node) -> Result<()> {
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
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::IdsStats;

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
