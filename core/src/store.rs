//! The [`Store`] trait: the few primitives every coordination store provides, with exactly the
//! semantics below, proven for each backend on a real server by `headcount-conformance`.
//!
//! * Values are text. Counters are stored as decimal text, so a person can read them with the
//!   store's own client (`redis-cli GET`, `psql`, `sqlite3`).
//! * TTLs run on the store's clock (Redis `PX`, etcd leases, PostgreSQL `now()`, the SQLite host's
//!   clock), never on the caller's. A TTL finer than the backend's [granularity](Capabilities::ttl_granularity)
//!   is rounded up; `None` means the key never expires.
//! * A key that has expired is indistinguishable from one that was never written.
//! * A value of the wrong shape where a counter is expected is [`Error::ForeignValue`], and
//!   nothing is written.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;

#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::notify::Notifications;

/// The shortest TTL accepted. Zero is rejected; anything below a backend's granularity is rounded
/// up to it.
pub const MIN_TTL: Duration = Duration::from_millis(1);

/// The longest TTL accepted (366 days). Longer ones are almost certainly a unit mistake; use `None`
/// for a key that must never expire.
pub const MAX_TTL: Duration = Duration::from_secs(366 * 24 * 3600);

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 4096;

/// The longest value accepted, in bytes. Coordination records are small; this keeps every backend
/// (etcd's request limit is 1.5 MiB) able to store whatever another one accepted.
pub const MAX_VALUE_LEN: usize = 512 * 1024;

/// What a backend can do and how precisely, so callers and the conformance suite can adapt and
/// report instead of passing quietly.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Short backend name: `sqlite`, `postgres`, `redis`, `etcd`.
    pub backend: &'static str,
    /// TTLs are rounded up to a multiple of this (1 ms for most backends, 1 s for etcd leases).
    pub ttl_granularity: Duration,
    /// The shortest TTL the server honours; shorter ones are raised to it.
    pub min_ttl: Duration,
    /// Whether [`Store::set_max`] is one atomic round trip (true) or the CAS loop of the provided
    /// method (false).
    pub native_set_max: bool,
    /// Whether several processes (possibly on several machines) can share this store. False for
    /// `sqlite::memory:`.
    pub shared: bool,
    /// Whether [`Store::incr_and_get`] is one atomic round trip (true) or the two calls of the
    /// provided method (false).
    pub native_incr_and_get: bool,
    /// Whether [`Store::renew_and_list`] is one atomic round trip (true) or the two calls of the
    /// provided method (false).
    pub native_renew_and_list: bool,
    /// Whether [`Store::compare_and_delete`] removes the key at once (true) or lets it expire
    /// within the backend's shortest TTL, as the provided method does (false).
    pub native_compare_and_delete: bool,
    /// Whether [`Store::renew_and_list_if_changed`] keeps a version of each directory, so an
    /// unchanged directory costs the server and the wire a constant amount whatever it holds
    /// (true), or lists the directory every time and compares a digest, as the provided method
    /// does (false).
    pub native_change_version: bool,
    /// Whether [`Store::renew_and_versions`] answers every directory's version in one round trip
    /// (true) or makes one [`Store::renew_and_list_if_changed`] call per directory, as the
    /// provided method does (false).
    pub native_renew_and_versions: bool,
    /// Whether [`Store::subscribe`] hands out notifications that fire (true) or
    /// [`Notifications::never`], as the provided method does (false): callers then learn of a
    /// change only by polling. For SQLite and the in-memory store, only the writes of this
    /// process are notified. See [`crate::notify`] for what a notification promises and what
    /// each backend does.
    pub native_notifications: bool,
    /// Whether [`Store::list_with_ttl`] answers each key's remaining time to live (true) or
    /// [`Error::Unsupported`], as the provided method does (false).
    pub ttl_reads: bool,
}

impl Capabilities {
    /// Capabilities of a backend with millisecond TTLs, no server minimum, and the provided
    /// `set_max`.
    pub fn new(backend: &'static str) -> Self {
        Capabilities {
            backend,
            ttl_granularity: Duration::from_millis(1),
            min_ttl: Duration::from_millis(1),
            native_set_max: false,
            shared: true,
            native_incr_and_get: false,
            native_renew_and_list: false,
            native_compare_and_delete: false,
            native_change_version: false,
            native_renew_and_versions: false,
            native_notifications: false,
            ttl_reads: false,
        }
    }

    /// The TTL the backend will actually apply for a requested one: rounded up to the granularity
    /// and raised to the minimum.
    pub fn effective_ttl(&self, ttl: Duration) -> Duration {
        let g = self.ttl_granularity.as_nanos().max(1);
        let n = ttl.as_nanos().div_ceil(g) * g;
        let rounded = Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX));
        rounded.max(self.min_ttl)
    }
}

/// A coordination store: the primitives every recipe is written over.
///
/// Every method validates its arguments first (a key or prefix that is empty, too long or holds a
/// control character, a value too long or holding NUL, a TTL of zero or over [`MAX_TTL`]: all
/// [`Error::InvalidArgument`]) and writes nothing when they are bad.
///
/// A backend does not implement this trait: it implements
/// [`Backend`](crate::backend::Backend), whose methods are only ever called with checked
/// arguments, and this trait, which does the checking, is implemented for every `Backend`. So a
/// backend cannot forget a check, and every backend rejects the same inputs with the same errors.
/// Implementations are cheap to share (`Arc<dyn Store>`) and safe to call from many tasks at once.
#[async_trait]
pub trait Store: Send + Sync + Debug + 'static + sealed::Sealed {
    /// What this backend can do and how precisely.
    fn capabilities(&self) -> Capabilities;

    /// Atomically increments the counter at `key` by one and returns the new value. A missing or
    /// expired key counts from 0, so the first call returns 1. `ttl` is applied only when the key
    /// is created; incrementing a live key keeps its expiry.
    ///
    /// Errors with [`Error::ForeignValue`] (writing nothing) when the key holds something that is
    /// not a decimal `i64`.
    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64>;

    /// The current value at `key`, or `None` when it is absent or expired.
    async fn get(&self, key: &str) -> Result<Option<String>>;

    /// Sets the TTL of a live key to `ttl` from now. Returns false (and does nothing) when the key
    /// is absent or expired.
    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool>;

    /// Atomically writes `new` (with `ttl`, replacing any previous expiry) if the key currently
    /// holds `expected`; `expected = None` means "only if absent or expired". Returns whether it
    /// wrote. Linearizable: of many concurrent calls with the same `expected`, exactly one wins.
    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool>;

    /// Removes `key`. Returns whether a live key was removed.
    async fn delete(&self, key: &str) -> Result<bool>;

    /// Every live key that starts with `prefix`, with its value, sorted by key (bytewise).
    /// `prefix` must not be empty.
    ///
    /// On Redis, a listing sees the keys written through headcount: the backend records each
    /// key it writes in an index beside it, so a listing costs O(keys under the prefix) on a
    /// database shared with millions of other keys. A key another client created under the
    /// prefix (`redis-cli SET`), or one the index lost (deleted, evicted, or a copy of the keys
    /// without it), is not listed until a headcount call touches it (a write, a write it
    /// refuses, a renewal), and on Redis Cluster
    /// the prefix must contain a hash tag (`hc:{group}:`), else the listing is
    /// [`Error::Unsupported`]. The other backends list whatever the store holds.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>>;

    /// [`Store::list`], with each key's remaining time to live as the store's clock counts it
    /// (`None` for a key written without a TTL): how long the key lives unless it is renewed,
    /// at most the TTL it was last given, rounded up to the backend's
    /// [granularity](Capabilities::ttl_granularity). `headcount status` shows a member's lease
    /// left with it. One round trip on Redis (`PTTL` in the listing's script), SQLite and
    /// PostgreSQL (`expires_at - now()` in the listing's query); on etcd one range and one
    /// `LeaseTimeToLive` per lease the keys carry, answered in whole seconds rounded down (so a
    /// key in its last second shows 0). For status pages and tools, never a heartbeat.
    ///
    /// The fallback [`Backend`](crate::backend::Backend) provides is
    /// [`Error::Unsupported`]: no other primitive reads a TTL.
    /// Backends that answer it say so in [`Capabilities::ttl_reads`].
    async fn list_with_ttl(&self, prefix: &str) -> Result<Vec<(String, String, Option<Duration>)>>;

    /// Sets the counter at `key` to `value` if it is absent, expired, or holds a smaller number
    /// (the `set_if_less_than` of the majority-IDs algorithm). Returns whether it wrote. `ttl`
    /// applies when it writes. Never moves the stored number backwards.
    ///
    /// A backend without a native form runs a `get` + `compare_and_set` loop; backends that can do
    /// it in one atomic round trip say so in [`Capabilities::native_set_max`].
    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool>;

    /// Atomically adds `by` (at least 1) to the counter at `incr_key` and reads `get_key` (which
    /// must be a different key): returns the new counter value and the value at `get_key`, or
    /// `None` when it is absent or expired. The interval indexer's tick: draw an index in this
    /// interval and read the previous interval's count, in one round trip.
    ///
    /// The increment follows [`Store::incr`]: a missing or expired key counts from 0, `ttl` is
    /// applied when the key is created, a value that is not a decimal `i64` (or would overflow)
    /// is [`Error::ForeignValue`] naming `incr_key` and nothing is written. The value at `get_key`
    /// is returned as stored, whatever its shape: parsing it is the caller's business.
    ///
    /// The fallback [`Backend`](crate::backend::Backend) provides makes two calls (`incr`, then `get`; for `by > 1` a
    /// `get` + `compare_and_set` loop, which re-applies `ttl` on every write instead of only on
    /// creation), so the read is not atomic with the increment. Backends that can do both in one
    /// atomic round trip (one transaction, one statement, one script) override it and say so in
    /// [`Capabilities::native_incr_and_get`]; their read is taken in the same atomic step as the
    /// increment (PostgreSQL: from the statement's snapshot, which may predate a row-lock wait).
    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> Result<(i64, Option<String>)>;

    /// Renews a lease and lists a prefix: if `key` holds `holder`, resets its TTL to `ttl` from
    /// now (keeping the value); then returns whether it did, and every live key under `prefix`
    /// with its value, sorted by key, as [`Store::list`] would. A group member's heartbeat:
    /// renew its slot and read the slot table and the published view in one round trip.
    ///
    /// The listing is taken after the renewal, so when `key` is under `prefix` and the renewal
    /// succeeded, the listing contains it.
    ///
    /// The fallback [`Backend`](crate::backend::Backend) provides makes two calls (`compare_and_set` with the same value, then
    /// `list`). Backends that can do both in one round trip override it and say so in
    /// [`Capabilities::native_renew_and_list`].
    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)>;

    /// Renews a lease and tells whether anything directly under the directory `dir` changed
    /// since `since`: if `key` holds `holder`, resets its TTL to `ttl` from now (keeping the
    /// value); returns whether it did, the directory's current version, and the keys directly
    /// under `dir` with their values (sorted by key, as [`Store::list`] would) **only when the
    /// version differs from `since`** (or `since` is `None`). A group member's heartbeat: renew
    /// its slot, and read the group's view only when one was published or settled (or, for the
    /// members that watch the slot table, read the table only when a claim, a leave or an expiry
    /// changed it).
    ///
    /// `dir` must end with `:`; the keys directly under it are those that start with `dir` and
    /// have no further `:`. A version is opaque text compared for equality only: two calls
    /// return the same version only if the keys directly under `dir` and their values were the
    /// same at both, also across a restart, a flush or a rollback of the store (a renewal, which
    /// changes only a TTL, a rewrite of a key with its own value, and a write to a key deeper
    /// than `dir` may or may not change the version). Like a Redis listing, a Redis
    /// version follows the writes made through headcount and expiries, not another client's
    /// writes.
    ///
    /// The listing is taken after the renewal, as in [`Store::renew_and_list`].
    ///
    /// The fallback [`Backend`](crate::backend::Backend) provides is one [`Store::renew_and_list`] and a digest of the
    /// directory's entries: one round trip, but work and bytes in proportion to the directory.
    /// Backends that keep a version per directory override it and say so in
    /// [`Capabilities::native_change_version`].
    async fn renew_and_list_if_changed(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dir: &str,
        since: Option<&str>,
    ) -> Result<RenewedListing>;

    /// Renews a lease and answers the version of each of several directories, with no listing:
    /// for each `(dir, since)` of `dirs`, the version [`Store::renew_and_list_if_changed`] would
    /// answer for `dir`. A group member that watches two directories (the view and the slot
    /// table) learns in one call whether either changed, and then reads only a directory whose
    /// version differs from the one it holds. Returns whether the key was renewed, and one
    /// version per directory, in order.
    ///
    /// The fallback [`Backend`](crate::backend::Backend) provides makes one [`Store::renew_and_list_if_changed`] call per
    /// directory (passing its `since`, so an unchanged directory sends no listing). Backends that
    /// answer all the versions in one round trip override it and say so in
    /// [`Capabilities::native_renew_and_versions`].
    async fn renew_and_versions(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[(&str, Option<&str>)],
    ) -> Result<(bool, Vec<String>)>;

    /// Atomically removes `key` if it holds `expected`. Returns whether it did; false (and
    /// nothing written) when the key is absent, expired or holds anything else. A group member
    /// leaves with it, so a delayed delete never removes the next holder's claim.
    ///
    /// The fallback [`Backend`](crate::backend::Backend) provides is one [`Store::compare_and_set`] that keeps the value and
    /// sets the backend's shortest TTL, so the key is gone within that TTL (etcd: its shortest
    /// lease). Backends that delete in one atomic step override it and say so in
    /// [`Capabilities::native_compare_and_delete`].
    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool>;

    /// Whether a write this store acknowledged survives a crash of its server or host, as far as
    /// the backend can find out by asking the server (Redis `appendonly`/`appendfsync`,
    /// PostgreSQL `fsync`/`synchronous_commit`, SQLite `synchronous`; etcd always syncs its log).
    /// The majority-IDs recipe refuses a store that is not durable unless told otherwise.
    ///
    /// The fallback [`Backend`](crate::backend::Backend) provides answers "not known to be durable".
    async fn durability(&self) -> Result<Durability>;

    /// Hints that something directly under the directory `dir` changed: a caller that polls
    /// `dir` (with [`Store::renew_and_list_if_changed`], say) looks again when one arrives,
    /// instead of waiting for its next poll. `dir` must end with `:`, as for
    /// [`Store::renew_and_list_if_changed`].
    ///
    /// **Hints only**: a notification may be lost, delayed, duplicated, coalesced with others
    /// or spurious, and expiries are in general not notified, so a caller keeps polling and
    /// never relies on one (see [`crate::notify`]). A write through headcount that changes a
    /// key directly under `dir` (creates, deletes or changes its value; not a renewal) is
    /// notified to every subscriber of `dir`, on a store that notifies at all, within
    /// about a round trip, unless a fault loses it. Notifications of other directories are not
    /// delivered.
    ///
    /// All the subscriptions of one store handle (and of its clones) share one subscription
    /// connection, opened on the first call; dropping the answer unsubscribes. The call itself
    /// does not wait for the server: a subscription that cannot be opened yet is retried in
    /// the background, and one the server refuses makes the notifications silent, said once
    /// in a warning.
    ///
    /// The fallback [`Backend`](crate::backend::Backend) provides hands out
    /// [`Notifications::never`], which never fire and never fail. Backends that push changes
    /// override it and say so in [`Capabilities::native_notifications`].
    async fn subscribe(&self, dir: &str) -> Result<Notifications>;
}

/// Keeps [`Store`] implemented only through [`Backend`](crate::backend::Backend).
pub(crate) mod sealed {
    pub trait Sealed {}
}

/// The answer of [`Store::durability`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Durability {
    /// True when every acknowledged write is on stable storage before the acknowledgement.
    pub durable: bool,
    /// What the server reported, for a person: `appendonly yes, appendfsync always`.
    pub detail: String,
    /// Names of the servers (or replicated data sets) that hold this store's data, as far as
    /// the backend can ask: Redis `master_replid` (one per primary of a Cluster; shared by a
    /// server's databases and by a primary and its replicas), the PostgreSQL server's start time
    /// and port (shared by its databases), the etcd endpoints (`host:port`), the
    /// SQLite file's path. Two stores that share a name are one failure domain: majority IDs
    /// refuse them as two members of one set. Empty when the backend cannot tell.
    pub servers: Vec<String>,
    /// Why the store may delete keys on its own before they expire, when it may: a Redis whose
    /// `maxmemory` is set with a `maxmemory-policy` other than `noeviction` evicts keys under
    /// memory pressure (leases included, and with `allkeys-*` keys without a TTL too). A group
    /// refuses such a store unless told otherwise
    /// ([`GroupConfig::with_eviction_allowed`](crate::recipes::group::GroupConfig::with_eviction_allowed)).
    /// `None` when the store never evicts, or the backend cannot tell.
    pub evicts: Option<String>,
}

impl Durability {
    /// A durable store, with what the server reported.
    pub fn durable(detail: impl Into<String>) -> Self {
        Durability {
            durable: true,
            detail: detail.into(),
            servers: Vec::new(),
            evicts: None,
        }
    }

    /// A store whose acknowledged writes may be lost in a crash, with why.
    pub fn not_durable(detail: impl Into<String>) -> Self {
        Durability {
            durable: false,
            detail: detail.into(),
            servers: Vec::new(),
            evicts: None,
        }
    }

    /// The same answer, naming the servers that hold the store's data (see
    /// [`Durability::servers`]).
    #[must_use]
    pub fn with_servers(mut self, servers: Vec<String>) -> Self {
        self.servers = servers;
        self
    }

    /// The same answer, saying the store may evict keys before they expire, and why (see
    /// [`Durability::evicts`]).
    #[must_use]
    pub fn with_eviction(mut self, why: impl Into<String>) -> Self {
        self.evicts = Some(why.into());
        self
    }
}

/// The answer of [`Store::renew_and_list_if_changed`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RenewedListing {
    /// Whether the key held the holder and its TTL was reset.
    pub renewed: bool,
    /// The directory's version: pass it as `since` next time.
    pub version: String,
    /// The keys directly under the directory with their values, sorted by key; `None` when the
    /// version equals `since`.
    pub listing: Option<Vec<(String, String)>>,
}

impl RenewedListing {
    /// An answer (for backends outside this crate).
    pub fn new(renewed: bool, version: String, listing: Option<Vec<(String, String)>>) -> Self {
        RenewedListing {
            renewed,
            version,
            listing,
        }
    }
}

// The crate's own paths to the helpers that moved to the implementors' module.
#[cfg(test)]
pub(crate) use crate::backend::check_key;
pub(crate) use crate::backend::parse_counter;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Capabilities;

    #[test]
    fn effective_ttl_rounds_to_granularity_and_minimum() {
        let mut caps = Capabilities::new("etcd");
        caps.ttl_granularity = Duration::from_secs(1);
        caps.min_ttl = Duration::from_secs(2);
        assert_eq!(
            caps.effective_ttl(Duration::from_millis(10)),
            Duration::from_secs(2)
        );
        assert_eq!(
            caps.effective_ttl(Duration::from_millis(2500)),
            Duration::from_secs(3)
        );
        let ms = Capabilities::new("pg");
        assert_eq!(
            ms.effective_ttl(Duration::from_micros(10)),
            Duration::from_millis(1)
        );
    }
}
