//! [`RedisModel`]: a store that answers listings and directory versions the way the Redis
//! backend does, over a [`MemoryStore`], so the simulation runs the group on Redis's change
//! detection and not only on the in-memory store's content digests.
//!
//! The Redis backend lists the names of its key index (a sorted set beside the data, not the
//! keyspace), keeps a counter-like version per directory that each write bumps, and notices
//! expiries only when a sweep (every write, every listing, and a heartbeat once the quiet marker
//! ends) finds a due name gone (`backend-redis/README.md`, "Data layout"). [`script`] follows
//! its scripts function for function. What the model adds are the faults a real Redis meets and
//! the in-memory store cannot show:
//!
//! * an index entry lost ([`RedisModel::lose_index_entry`]) or the whole index
//!   ([`RedisModel::lose_index`]: `DEL`, an eviction), or every piece of metadata
//!   ([`RedisModel::lose_metadata`]: the keys copied to a server without the index);
//! * a version bump dropped ([`ModelFaults::drop_bumps`]) and counters reused after a rollback
//!   ([`ModelFaults::reuse_counters`]: a version minted from a clock that lags), both breaking
//!   the version contract on purpose, to show what a protocol does when a change goes unseen;
//! * an index that does not heal itself ([`RedisModel::with_repair`]`(false)`: a live key
//!   missing from the index is re-added without a new version of its directory), to show that
//!   the simulation finds the missed change that the repair prevents.
//!
//! [`RedisModel::snapshot`] and [`RedisModel::restore`] roll the data, the index and the
//! versions back together, as a failover to a replica does; the nonces that keep versions from
//! repeating (the Redis scripts' random suffix) are not rolled back.
//!
//! Change notifications: the Redis backend's scripts `PUBLISH` on a directory's channel when
//! they bump its version, and one pub/sub connection per handle hands them to every process.
//! The model notifies every directory a call bumped (a write that changes a key, an expiry a
//! sweep finds; not a dropped bump) to the subscribers of the shared in-memory store, in every
//! process of the simulation, after the call; a restore sends
//! [`Notice::MayHaveMissed`](headcount_core::notify::Notice), as the pub/sub connection that a failover
//! cuts does when it reconnects.

mod script;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::SeedableRng;

use self::script::Script;
use crate::lock;
use headcount_core::backend::{self, direct_entries, parse_counter};
use headcount_core::error::Result;
use headcount_core::memory::{MemoryStore, Snapshot};
use headcount_core::notify::Notifications;
use headcount_core::store::{Capabilities, Durability, RenewedListing};
use headcount_core::store_models::{expiry, restore_into, snapshot_of, MemoryInternals as _};

const BACKEND: &str = "redis-model";

/// The shortest life of a heartbeat's quiet marker (the Redis backend's `sweep_period`).
fn sweep_period(ttl: Duration) -> Duration {
    (ttl / 12).clamp(Duration::from_millis(10), Duration::from_millis(500))
}

/// The Redis metadata beside the data: rolled back with it.
#[derive(Debug, Clone, Default)]
struct Meta {
    /// `headcount:index`: the names listings read.
    index: BTreeSet<String>,
    /// `headcount:expiry`: the expiry score of each name with a TTL.
    expiry: BTreeMap<String, SystemTime>,
    /// `headcount:version:<dir>`: each directory's counter and the text last answered for it.
    versions: BTreeMap<String, (u64, String)>,
    /// `headcount:quiet`: the server time of the last heartbeat's sweep and the marker's end.
    quiet: Option<(SystemTime, SystemTime)>,
}

/// The model's faults: how often a version bump is dropped, and whether versions are bare
/// counters (reused after a rollback) instead of counters with a nonce no rollback brings back.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ModelFaults {
    /// The chance that a version bump is dropped: the directory keeps its version.
    pub drop_bumps: f64,
    /// Versions are bare counters, so a rollback hands out versions already answered again.
    pub reuse_counters: bool,
}

/// What the model does besides the data, and its random draws: not rolled back.
#[derive(Debug)]
struct Control {
    repair: bool,
    drop_bumps: f64,
    reuse_counters: bool,
    rng: StdRng,
    /// The last nonce given to a version.
    nonce: u64,
}

/// A [`MemoryStore`] with Redis's key index and directory versions: a [`Store`](headcount_core::Store)
/// whose listings read an index beside the data, whose directory versions are counters that
/// writes bump, and whose expiries change a version only when a sweep finds them, as the Redis
/// backend's scripts do. It can lose its index ([`lose_index_entry`](Self::lose_index_entry),
/// [`lose_index`](Self::lose_index), [`lose_metadata`](Self::lose_metadata)), drop version
/// bumps or reuse counters after a rollback ([`ModelFaults`]), and run the index as it was
/// before it healed itself ([`with_repair`](Self::with_repair)). Clones share everything.
#[derive(Debug, Clone)]
pub struct RedisModel {
    data: MemoryStore,
    meta: Arc<Mutex<Meta>>,
    ctl: Arc<Mutex<Control>>,
}

/// The data, index and versions of a [`RedisModel`] at one instant.
#[derive(Debug, Clone)]
pub struct ModelSnapshot {
    data: Snapshot,
    meta: Meta,
}

impl RedisModel {
    /// A model over `data` (whose clock runs the TTLs), with the index that heals itself, no
    /// faults, and draws seeded with `seed`.
    pub fn new(data: MemoryStore, seed: u64) -> Self {
        RedisModel {
            data,
            meta: Arc::new(Mutex::new(Meta::default())),
            ctl: Arc::new(Mutex::new(Control {
                repair: true,
                drop_bumps: 0.0,
                reuse_counters: false,
                rng: StdRng::seed_from_u64(seed),
                nonce: 0,
            })),
        }
    }

    /// Whether a live key missing from the index is put back with a new version of its
    /// directory by whatever touches it (true, the default), or only re-added, without a new
    /// version, by a heartbeat's sweep of its own key (false: a change the members never see).
    #[must_use]
    pub fn with_repair(self, repair: bool) -> Self {
        lock(&self.ctl).repair = repair;
        self
    }

    /// Replaces the faults.
    pub fn set_faults(&self, faults: ModelFaults) {
        let mut ctl = lock(&self.ctl);
        ctl.drop_bumps = faults.drop_bumps;
        ctl.reuse_counters = faults.reuse_counters;
    }

    /// Drops the `n`th name (modulo their number) from the index, as a hand-edited or partly
    /// restored index would; returns it.
    pub fn lose_index_entry(&self, n: usize) -> Option<String> {
        let mut meta = lock(&self.meta);
        let name = script::nth(&meta.index, n)?;
        meta.index.remove(&name);
        Some(name)
    }

    /// Deletes the index and the expiry index (`DEL headcount:index headcount:expiry`, or an
    /// eviction of both).
    pub fn lose_index(&self) {
        let mut meta = lock(&self.meta);
        meta.index.clear();
        meta.expiry.clear();
    }

    /// Loses every piece of metadata (index, expiry index, versions, quiet marker), as a copy
    /// of the data keys alone to another server does.
    pub fn lose_metadata(&self) {
        *lock(&self.meta) = Meta::default();
    }

    /// A copy of the data, the index and the versions.
    pub fn snapshot(&self) -> ModelSnapshot {
        let data = self.data.data();
        let meta = lock(&self.meta);
        ModelSnapshot {
            data: snapshot_of(&data),
            meta: meta.clone(),
        }
    }

    /// Replaces the data, the index and the versions with `snapshot`'s, and tells every
    /// subscriber that notices may have been missed.
    pub fn restore(&self, snapshot: &ModelSnapshot) {
        {
            let mut data = self.data.data();
            let mut meta = lock(&self.meta);
            restore_into(&snapshot.data, &mut data);
            *meta = snapshot.meta.clone();
        }
        self.data.notify_hub().notify_missed();
    }

    /// Runs one call atomically, as one Lua script: the data, the metadata and the controls
    /// locked for its whole length; then publishes the directories it bumped.
    fn script<R>(&self, f: impl FnOnce(&mut Script<'_>) -> R) -> R {
        let now = self.data.wall_now();
        let (out, published) = {
            let mut data = self.data.data();
            let mut meta = lock(&self.meta);
            let mut ctl = lock(&self.ctl);
            let mut s = Script::new(&mut data, &mut meta, &mut ctl, now);
            let out = f(&mut s);
            (out, std::mem::take(&mut s.published))
        };
        for dir in published {
            self.data.notify_hub().notify(&dir);
        }
        out
    }
}

#[async_trait]
impl backend::Backend for RedisModel {
    /// The in-memory store's, and a version per directory as Redis keeps.
    fn capabilities(&self) -> Capabilities {
        let mut caps = backend::Backend::capabilities(&self.data);
        caps.backend = BACKEND;
        caps.native_change_version = true;
        caps.native_notifications = true;
        caps
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        self.incr_and_get(key, 1, ttl, key).await.map(|(n, _)| n)
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        Ok(self.script(|s| s.value(key)))
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        Ok(self.script(|s| {
            let at = expiry(s.now, Some(ttl));
            let Some(e) = s.data.live(key, s.now) else {
                return false;
            };
            e.expires = at;
            s.track(key, at, true);
            true
        }))
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        Ok(self.script(|s| {
            let current = s.value(key);
            if current.as_deref() != expected {
                if current.is_some() {
                    s.repair(key);
                }
                return false;
            }
            let at = expiry(s.now, ttl);
            s.data.put(key, new.to_owned(), at, s.now);
            if expected != Some(new) {
                s.changed(key);
            }
            s.track(key, at, true);
            true
        }))
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        Ok(self.script(|s| {
            let was = s.value(key).is_some();
            s.data.map.remove(key);
            if !s.untrack(key) && was {
                s.changed(key);
            }
            was
        }))
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        Ok(self.script(|s| {
            match s.value(key) {
                Some(v) if v == expected => {}
                Some(_) => {
                    s.repair(key);
                    return false;
                }
                None => return false,
            }
            s.data.map.remove(key);
            if !s.untrack(key) {
                s.changed(key);
            }
            true
        }))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        Ok(self.script(|s| s.list(prefix)))
    }

    async fn list_with_ttl(&self, prefix: &str) -> Result<Vec<(String, String, Option<Duration>)>> {
        Ok(self.script(|s| s.list_with_ttl(prefix)))
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        self.script(|s| {
            if let Some(v) = s.value(key) {
                if parse_counter(key, &v)? >= value {
                    s.repair(key);
                    return Ok(false);
                }
            }
            let at = expiry(s.now, ttl);
            s.data.put(key, value.to_string(), at, s.now);
            s.changed(key);
            s.track(key, at, true);
            Ok(true)
        })
    }

    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> Result<(i64, Option<String>)> {
        self.script(|s| {
            let before = s.data.live(incr_key, s.now).map(|e| e.expires);
            let n = s.data.incr_by(incr_key, by, ttl, s.now)?;
            let after = s.data.live(incr_key, s.now).and_then(|e| e.expires);
            s.changed(incr_key);
            // A live key keeps its expiry: its score is checked only when it had none.
            let moved = matches!(before, None | Some(None));
            s.track(incr_key, after, moved);
            let read = s.value(get_key);
            if read.is_some() && get_key != incr_key {
                s.repair(get_key);
            }
            Ok((n, read))
        })
    }

    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        Ok(self.script(|s| {
            let renewed = s.data.renew(key, holder, ttl, s.now);
            if renewed {
                s.track(key, expiry(s.now, Some(ttl)), true);
            } else if s.value(key).is_some() {
                s.repair(key);
            }
            (renewed, s.list(prefix))
        }))
    }

    async fn renew_and_list_if_changed(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dir: &str,
        since: Option<&str>,
    ) -> Result<RenewedListing> {
        Ok(self.script(|s| {
            let (renewed, mut versions) = s.heartbeat(key, holder, ttl, &[dir]);
            let version = versions.pop().unwrap_or_default();
            let listing =
                (since != Some(version.as_str())).then(|| direct_entries(dir, s.list(dir)));
            RenewedListing::new(renewed, version, listing)
        }))
    }

    async fn renew_and_versions(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[(&str, Option<&str>)],
    ) -> Result<(bool, Vec<String>)> {
        let dirs: Vec<&str> = dirs.iter().map(|(d, _)| *d).collect();
        Ok(self.script(|s| s.heartbeat(key, holder, ttl, &dirs)))
    }

    /// The directories the scripts bump, as the Redis backend publishes them (see the module
    /// docs).
    async fn subscribe(&self, dir: &str) -> Result<Notifications> {
        Ok(self.data.notify_hub().subscribe(dir))
    }

    async fn durability(&self) -> Result<Durability> {
        Ok(Durability::not_durable(
            "the Redis model keeps its data in this process only",
        ))
    }
}

#[cfg(test)]
mod tests;
