//! [`MemoryStore`]: the whole [`Store`](crate::Store) contract in process memory, on an injectable [`Clock`].
//!
//! Use it to unit-test code that uses headcount without a server, and to run the recipes under a
//! [`ManualClock`](crate::ManualClock) (the seeded simulation does, with the test kit's `sim`
//! module). It passes the same conformance suite as the real backends (`headcount-conformance`,
//! backend `memory`).
//!
//! * Every operation is atomic (one mutex) and linearizable; nothing is shared across processes.
//! * TTLs run on the injected clock's *wall* time, as a real store's run on its host's clock, so
//!   stepping that clock forward expires keys early, exactly as a clock step on a store host does.
//! * Listing a prefix is a range scan of an ordered map: O(log n + keys under the prefix).
//! * [`MemoryStore::snapshot`] and [`MemoryStore::restore`] roll the data back, as a store that
//!   fails over to a replica that missed the last writes would.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> headcount_core::Result<()> {
//! use headcount_core::memory::MemoryStore;
//! use headcount_core::Store;
//!
//! let store = MemoryStore::new();
//! assert_eq!(store.incr("hc:{g}:n", None).await?, 1);
//! assert!(store.compare_and_set("hc:{g}:k", None, "v", None).await?);
//! assert_eq!(store.list("hc:{g}:").await?.len(), 2);
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::backend::{self, direct_entries, listing_digest, parse_counter};
use crate::clock::{Clock, SystemClock};
use crate::error::Result;
use crate::notify::{Notifications, NotifyHub};
use crate::store::{Capabilities, Durability};

pub(crate) use self::data::{expiry, Data, Entry};

const BACKEND: &str = "memory";

/// The map behind a [`MemoryStore`] and the operations its backend and the simulation's store
/// models build on. Public only within the crate, and to those models through
/// `store_models` (cargo feature `store-models`).
pub(crate) mod data {
    use std::collections::BTreeMap;
    use std::ops::Bound;
    use std::time::{Duration, SystemTime};

    use crate::backend::parse_counter;
    use crate::error::{Error, Result};

    /// How many writes between two sweeps of expired keys (each sweep is O(keys), so the amortized
    /// cost per write stays constant).
    const SWEEP_EVERY: u64 = 1024;

    /// A value and its expiry.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Entry {
        /// The value, as stored.
        pub value: String,
        /// When it expires, on the store's wall clock; never when `None`.
        pub expires: Option<SystemTime>,
    }

    impl Entry {
        /// Whether the entry is live at `now`.
        pub fn live(&self, now: SystemTime) -> bool {
            self.expires.is_none_or(|e| now < e)
        }
    }

    /// Every key of a store.
    #[derive(Debug, Default, Clone)]
    pub struct Data {
        /// Every key (live, or expired and not yet swept) and its entry.
        pub map: BTreeMap<String, Entry>,
        writes: u64,
    }

    impl Data {
        /// The live entry at `key`, dropping it first when it has expired.
        pub fn live(&mut self, key: &str, now: SystemTime) -> Option<&mut Entry> {
            if self.map.get(key).is_some_and(|e| !e.live(now)) {
                self.map.remove(key);
            }
            self.map.get_mut(key)
        }

        /// Resets the TTL of `key` if it holds `holder`; whether it did.
        pub fn renew(&mut self, key: &str, holder: &str, ttl: Duration, now: SystemTime) -> bool {
            match self.live(key, now) {
                Some(e) if e.value == holder => {
                    e.expires = expiry(now, Some(ttl));
                    true
                }
                _ => false,
            }
        }

        /// Writes `key`, sweeping expired keys every [`SWEEP_EVERY`] writes.
        pub fn put(
            &mut self,
            key: &str,
            value: String,
            expires: Option<SystemTime>,
            now: SystemTime,
        ) {
            self.writes += 1;
            if self.writes.is_multiple_of(SWEEP_EVERY) {
                self.map.retain(|_, e| e.live(now));
            }
            self.map.insert(key.to_owned(), Entry { value, expires });
        }

        /// Adds `by` to the counter at `key` (0 when absent), giving a new key `ttl`.
        pub fn incr_by(
            &mut self,
            key: &str,
            by: i64,
            ttl: Option<Duration>,
            now: SystemTime,
        ) -> Result<i64> {
            let (current, expires) = match self.live(key, now) {
                Some(e) => (parse_counter(key, &e.value)?, e.expires),
                None => (0, expiry(now, ttl)),
            };
            let next = current.checked_add(by).ok_or_else(|| {
                Error::foreign(
                    key,
                    "a decimal integer that stays within an i64",
                    &current.to_string(),
                )
            })?;
            self.put(key, next.to_string(), expires, now);
            Ok(next)
        }

        /// The live keys under `prefix` and their values, sorted.
        pub fn list(&mut self, prefix: &str, now: SystemTime) -> Vec<(String, String)> {
            self.map
                .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
                .take_while(|(k, _)| k.starts_with(prefix))
                .filter(|(_, e)| e.live(now))
                .map(|(k, e)| (k.clone(), e.value.clone()))
                .collect()
        }

        /// [`Data::list`] with each key's time left (`None` for a key without a TTL).
        pub fn list_with_ttl(
            &mut self,
            prefix: &str,
            now: SystemTime,
        ) -> Vec<(String, String, Option<Duration>)> {
            self.map
                .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
                .take_while(|(k, _)| k.starts_with(prefix))
                .filter(|(_, e)| e.live(now))
                .map(|(k, e)| {
                    let left = e.expires.map(|t| t.duration_since(now).unwrap_or_default());
                    (k.clone(), e.value.clone(), left)
                })
                .collect()
        }
    }

    /// When a key written at `now` with `ttl` expires.
    pub fn expiry(now: SystemTime, ttl: Option<Duration>) -> Option<SystemTime> {
        // A TTL is at most a year (check_ttl), so this cannot overflow a SystemTime in practice;
        // saturate anyway rather than panic.
        ttl.map(|t| now.checked_add(t).unwrap_or(now))
    }
}

/// The data of a [`MemoryStore`] at one instant, for [`MemoryStore::restore`].
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub(crate) map: BTreeMap<String, Entry>,
}

impl Snapshot {
    /// How many keys (live or not yet swept) the snapshot holds.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// An in-memory [`Store`](crate::Store). Clones share the same data.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    data: Arc<Mutex<Data>>,
    clock: Arc<dyn Clock>,
    /// In-process change notifications: every write that changes a key wakes the subscribers
    /// of its directory (clones share them, as they share the data).
    pub(crate) hub: NotifyHub,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock::new()))
    }

    /// An empty store whose TTLs run on `clock`'s wall time.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            data: Arc::new(Mutex::new(Data::default())),
            clock,
            hub: NotifyHub::new(),
        }
    }

    /// The process-wide store called `name`, created empty on first use: what
    /// `memory://name` URLs connect to, so two handles in one process share data.
    pub fn named(name: &str) -> MemoryStore {
        static NAMED: OnceLock<Mutex<HashMap<String, MemoryStore>>> = OnceLock::new();
        let mut named = NAMED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        named.entry(name.to_owned()).or_default().clone()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Data> {
        // Every operation leaves the map consistent before it can panic, so a poisoned lock
        // still guards valid data.
        self.data.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// A copy of every key and its expiry.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            map: self.lock().map.clone(),
        }
    }

    /// Replaces all data with `snapshot`'s: every write since it was taken is lost, as on a
    /// store that failed over to a replica that had not received them.
    pub fn restore(&self, snapshot: &Snapshot) {
        self.lock().map = snapshot.map.clone();
        self.hub.notify_missed();
    }

    /// Removes every key.
    pub fn clear(&self) {
        self.lock().map.clear();
        self.hub.notify_missed();
    }

    /// How many live keys the store holds.
    pub fn len(&self) -> usize {
        let now = self.now();
        self.lock().map.values().filter(|e| e.live(now)).count()
    }

    /// Whether the store holds no live key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl backend::Backend for MemoryStore {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(BACKEND);
        caps.native_set_max = true;
        caps.native_incr_and_get = true;
        caps.native_renew_and_list = true;
        caps.native_compare_and_delete = true;
        caps.native_renew_and_versions = true;
        caps.native_notifications = true;
        caps.ttl_reads = true;
        caps.shared = false;
        caps
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        let now = self.now();
        let n = self.lock().incr_by(key, 1, ttl, now)?;
        self.hub.notify_key(key);
        Ok(n)
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        let now = self.now();
        Ok(self.lock().live(key, now).map(|e| e.value.clone()))
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        let now = self.now();
        Ok(match self.lock().live(key, now) {
            Some(e) => {
                e.expires = expiry(now, Some(ttl));
                true
            }
            None => false,
        })
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        let now = self.now();
        let mut data = self.lock();
        let current = data.live(key, now).map(|e| e.value.as_str());
        if current != expected {
            return Ok(false);
        }
        data.put(key, new.to_owned(), expiry(now, ttl), now);
        drop(data);
        // A renewal through compare-and-set changes no value.
        if expected != Some(new) {
            self.hub.notify_key(key);
        }
        Ok(true)
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let now = self.now();
        let mut data = self.lock();
        let was = data.live(key, now).is_some();
        data.map.remove(key);
        drop(data);
        if was {
            self.hub.notify_key(key);
        }
        Ok(was)
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        let now = self.now();
        let mut data = self.lock();
        if data.live(key, now).is_some_and(|e| e.value == expected) {
            data.map.remove(key);
            drop(data);
            self.hub.notify_key(key);
            return Ok(true);
        }
        Ok(false)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let now = self.now();
        Ok(self.lock().list(prefix, now))
    }

    async fn list_with_ttl(&self, prefix: &str) -> Result<Vec<(String, String, Option<Duration>)>> {
        let now = self.now();
        Ok(self.lock().list_with_ttl(prefix, now))
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        let now = self.now();
        let mut data = self.lock();
        if let Some(e) = data.live(key, now) {
            if parse_counter(key, &e.value)? >= value {
                return Ok(false);
            }
        }
        data.put(key, value.to_string(), expiry(now, ttl), now);
        drop(data);
        self.hub.notify_key(key);
        Ok(true)
    }

    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> Result<(i64, Option<String>)> {
        let now = self.now();
        let mut data = self.lock();
        let n = data.incr_by(incr_key, by, ttl, now)?;
        let read = data.live(get_key, now).map(|e| e.value.clone());
        drop(data);
        self.hub.notify_key(incr_key);
        Ok((n, read))
    }

    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        let now = self.now();
        let mut data = self.lock();
        let renewed = data.renew(key, holder, ttl, now);
        Ok((renewed, data.list(prefix, now)))
    }

    /// Atomic: the renewal and every directory's digest under one lock.
    async fn renew_and_versions(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[(&str, Option<&str>)],
    ) -> Result<(bool, Vec<String>)> {
        let now = self.now();
        let mut data = self.lock();
        let renewed = data.renew(key, holder, ttl, now);
        let versions = dirs
            .iter()
            .map(|(dir, _)| listing_digest(&direct_entries(dir, data.list(dir, now))))
            .collect();
        Ok((renewed, versions))
    }

    /// In-process: a write through this store or a clone of it wakes the subscribers of its
    /// directory at once; another process (there is none: the data lives in this one) or
    /// an expiry does not.
    async fn subscribe(&self, dir: &str) -> Result<Notifications> {
        Ok(self.hub.subscribe(dir))
    }

    async fn durability(&self) -> Result<Durability> {
        // Clones share their data, so they are one store.
        Ok(
            Durability::not_durable("the in-memory store keeps its data in this process only")
                .with_servers(vec![format!("memory store {:p}", Arc::as_ptr(&self.data))]),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::MemoryStore;
    use crate::clock::{Clock, ManualClock};
    use crate::error::{Error, Result};
    use crate::Store;

    fn manual() -> (ManualClock, MemoryStore) {
        let clock = ManualClock::at_unix_secs(1_000_000);
        let store = MemoryStore::with_clock(Arc::new(clock.clone()));
        (clock, store)
    }

    #[tokio::test]
    async fn keys_expire_on_the_injected_clock() -> Result<()> {
        let (clock, store) = manual();
        assert!(
            store
                .compare_and_set("p:{a}:1", None, "x", Some(Duration::from_secs(2)))
                .await?
        );
        clock.advance(Duration::from_millis(1999));
        assert_eq!(store.get("p:{a}:1").await?.as_deref(), Some("x"));
        clock.advance(Duration::from_millis(1));
        assert_eq!(store.get("p:{a}:1").await?, None);
        Ok(())
    }

    #[tokio::test]
    async fn a_forward_step_of_the_store_clock_expires_leases_at_once() -> Result<()> {
        let (clock, store) = manual();
        store.incr("p:{a}:n", Some(Duration::from_secs(60))).await?;
        clock.set_wall(clock.now() + Duration::from_secs(61));
        assert_eq!(store.get("p:{a}:n").await?, None);
        Ok(())
    }

    #[tokio::test]
    async fn listing_is_a_sorted_range_of_live_keys() -> Result<()> {
        let (clock, store) = manual();
        store.incr("p:{a}:b", None).await?;
        store.incr("p:{a}:a", None).await?;
        store.incr("p:{a}x", None).await?;
        store
            .compare_and_set("p:{a}:c", None, "gone", Some(Duration::from_secs(1)))
            .await?;
        clock.advance(Duration::from_secs(1));
        let keys: Vec<String> = store
            .list("p:{a}:")
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, ["p:{a}:a", "p:{a}:b"]);
        Ok(())
    }

    #[tokio::test]
    async fn restore_rolls_back_later_writes() -> Result<()> {
        let (_, store) = manual();
        store.incr("k", None).await?;
        let snap = store.snapshot();
        store.incr("k", None).await?;
        store.incr("other", None).await?;
        store.restore(&snap);
        assert_eq!(store.get("k").await?.as_deref(), Some("1"));
        assert_eq!(store.get("other").await?, None);
        Ok(())
    }

    #[tokio::test]
    async fn foreign_values_and_overflow_write_nothing() -> Result<()> {
        let (_, store) = manual();
        store.compare_and_set("k", None, "abc", None).await?;
        assert!(matches!(
            store.incr("k", None).await,
            Err(Error::ForeignValue { .. })
        ));
        store.set_max("m", i64::MAX, None).await?;
        assert!(store.incr("m", None).await.is_err());
        assert_eq!(store.get("m").await?, Some(i64::MAX.to_string()));
        Ok(())
    }

    #[test]
    fn named_stores_share_data() {
        let a = MemoryStore::named("shared-test");
        let b = MemoryStore::named("shared-test");
        assert!(Arc::ptr_eq(&a.data, &b.data));
        assert!(!Arc::ptr_eq(&a.data, &MemoryStore::named("other").data));
    }
}
