//! [`EtcdModel`]: a store that answers listings and directory versions the way the etcd backend
//! does, over a [`MemoryStore`], so the simulation runs the group on etcd's change detection and
//! on the one fault that breaks it: a restore that hands out revisions again.
//!
//! The etcd backend (`backend-etcd/src/store.rs`) answers a directory's version from a keys-only
//! range: the number of keys under the directory (deeper ones too) and the newest `mod_revision`
//! among them, with the generation of its handle's [`RevisionWatch`]. The model keeps what that
//! needs and the in-memory store does not:
//!
//! * a store-wide revision, one more for every call that changes something (a put, a delete, a
//!   lease revocation that deletes keys), and each live key's `mod_revision`;
//! * whether a key is on a lease of its own: a renewed slot's heartbeat is a keep-alive of that
//!   lease and writes nothing, while the first renewal after a claim (or after a write that put
//!   the key on a shared lease) puts the key again, changing its directory's version;
//! * the revision every response carries, seen by each handle's [`RevisionWatch`] as the
//!   backend sees it ([`EtcdModel::handle`]: one per process), and the two requests of
//!   `renew_and_list_if_changed` when the version changed (the renewal with the version, then
//!   the listing, with the version answered from the second);
//! * `renew_and_versions` as one request: the renewal with one version's range per directory,
//!   as the backend's one transaction.
//!
//! [`EtcdModel::restore`] rolls the data, the keys' revisions and the store's revision back
//! together, as `etcdutl snapshot restore` without `--bump-revision` (or an older copy of the
//! data directory) does: the lost revisions are handed out again, to other writes.
//! [`EtcdModel::restore_bumped`] is the restore etcd recommends, with `--bump-revision`: the
//! revision moves on past every lost one. [`EtcdModel::with_watch`]`(false)` answers versions
//! without watching the revisions (so a restore's repeated revisions pass unnoticed), to show
//! what the simulation finds without that watch.
//!
//! Change notifications: the etcd backend keeps one watch stream per handle, with a prefix
//! watch per directory subscribed, which sees every put and delete (a lease revocation's
//! deletes too) of a key under it. The model notifies the directory of every key a call puts
//! or deletes (not a keep-alive, which writes nothing) to the subscribers of the shared
//! in-memory store, in every process of the simulation, after the call; a restore sends
//! [`Notice::MayHaveMissed`](headcount_core::notify::Notice), as the watch stream that a restore cuts
//! does when the backend opens it again.
//!
//! Left out, on purpose: compaction (it drops only history, and the backend reads none: no
//! watch, no range at an old revision; `--mark-compacted` matters only to watchers), and etcd's
//! whole-second leases (the model keeps the in-memory store's exact TTLs, since the simulation's
//! TTL is below a second).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::lock;
use headcount_core::backend::{
    self, direct_entries, listing_digest, parse_counter, revision_version, RevisionWatch,
};
use headcount_core::error::Result;
use headcount_core::memory::{MemoryStore, Snapshot};
use headcount_core::notify::Notifications;
use headcount_core::store::{Capabilities, Durability, RenewedListing};
use headcount_core::store_models::{expiry, restore_into, snapshot_of, Data, MemoryInternals as _};

const BACKEND: &str = "etcd-model";
/// The cluster id the model's versions carry.
const CLUSTER: u64 = 0xe7cd;

/// What etcd keeps beside the keys' values: rolled back with them.
#[derive(Debug, Clone, Default)]
struct Keyspace {
    /// The store's revision.
    revision: i64,
    /// Each live key's `mod_revision`, and whether it is on a lease of its own.
    keys: BTreeMap<String, KeyMeta>,
}

#[derive(Debug, Clone, Copy)]
struct KeyMeta {
    mod_revision: i64,
    own_lease: bool,
}

/// A [`MemoryStore`] with etcd's revisions: a [`Store`](headcount_core::Store) whose directory versions
/// are the count and newest `mod_revision` of the keys under a directory, as the etcd backend
/// answers them, and which can be restored from a snapshot with its revision
/// ([`restore`](Self::restore), reusing revisions) or past it
/// ([`restore_bumped`](Self::restore_bumped)). Clones share the store and the client;
/// [`handle`](Self::handle) is another client of the same store.
#[derive(Debug, Clone)]
pub struct EtcdModel {
    data: MemoryStore,
    keyspace: Arc<Mutex<Keyspace>>,
    client: Arc<Client>,
    /// Every version a client answered for other contents than it answered it for before:
    /// not rolled back.
    broken: Arc<Mutex<Broken>>,
}

/// One client of the store (a process's handle).
#[derive(Debug)]
struct Client {
    /// Its watch of the responses' revisions, kept also when its versions leave out the
    /// generation (`watch` false), to tell which hidden changes the watch would have seen.
    revisions: RevisionWatch,
    watch: bool,
    /// The contents (a digest of the entries directly under the directory) each version it
    /// answered stood for, and the generation it was answered in, by directory and version.
    answered: Mutex<HashMap<(String, String), (String, u64)>>,
}

impl Client {
    fn new(watch: bool) -> Arc<Client> {
        Arc::new(Client {
            revisions: RevisionWatch::new(),
            watch,
            answered: Mutex::default(),
        })
    }
}

/// The versions answered for other contents than before (see [`EtcdModel::hidden`]).
#[derive(Debug, Default)]
struct Broken {
    seen: Vec<String>,
    unseen: Vec<String>,
}

/// The data, the keys' revisions and the store's revision of an [`EtcdModel`] at one instant.
#[derive(Debug, Clone)]
pub struct EtcdSnapshot {
    data: Snapshot,
    keyspace: Keyspace,
}

/// One call, holding the data and the keyspace: a transaction, whose writes share one revision.
struct Txn<'a> {
    data: &'a mut Data,
    keyspace: &'a mut Keyspace,
    now: SystemTime,
    /// The revision of this call's writes, once it wrote.
    wrote: Option<i64>,
    /// The keys this call put or deleted, whose directories' watches see an event.
    events: Vec<String>,
}

impl Txn<'_> {
    /// Deletes the keys whose lease ran out, in one revision (the leader revokes leases in a
    /// loop; the model does it when the next call comes).
    fn expire(&mut self) {
        let gone: Vec<String> = self
            .keyspace
            .keys
            .keys()
            .filter(|k| self.data.live(k, self.now).is_none())
            .cloned()
            .collect();
        if gone.is_empty() {
            return;
        }
        self.keyspace.revision += 1;
        for k in gone {
            self.keyspace.keys.remove(&k);
            self.events.push(k);
        }
    }

    fn revision(&mut self) -> i64 {
        *self.wrote.get_or_insert_with(|| {
            self.keyspace.revision += 1;
            self.keyspace.revision
        })
    }

    fn value(&mut self, k: &str) -> Option<String> {
        self.data.live(k, self.now).map(|e| e.value.clone())
    }

    /// A put of `value` with a TTL (on a shared lease) or none.
    fn put(&mut self, k: &str, value: String, ttl: Option<Duration>) {
        let at = expiry(self.now, ttl);
        self.data.put(k, value, at, self.now);
        self.touch(k, false);
    }

    /// Gives `k` a new `mod_revision`, on a lease of its own or not.
    fn touch(&mut self, k: &str, own_lease: bool) {
        let mod_revision = self.revision();
        self.events.push(k.to_owned());
        self.keyspace.keys.insert(
            k.to_owned(),
            KeyMeta {
                mod_revision,
                own_lease,
            },
        );
    }

    fn delete(&mut self, k: &str) -> bool {
        if self.value(k).is_none() {
            return false;
        }
        self.data.map.remove(k);
        self.keyspace.keys.remove(k);
        self.revision();
        self.events.push(k.to_owned());
        true
    }

    /// The renewal: a keep-alive of the key's own lease when it is on one (no write), else a
    /// put onto a lease of its own; either only when it holds `holder`.
    fn renew(&mut self, k: &str, holder: &str, ttl: Duration) -> bool {
        if self.value(k).as_deref() != Some(holder) {
            return false;
        }
        let own = self.keyspace.keys.get(k).is_some_and(|m| m.own_lease);
        self.data.renew(k, holder, ttl, self.now);
        if !own {
            self.touch(k, true);
        }
        true
    }

    /// The keys-only range of a directory's version: how many keys under `dir`, and the newest
    /// `mod_revision` among them; and the entries directly under `dir`, which the version
    /// stands for.
    fn range(&mut self, dir: &str) -> Range {
        let under = self
            .keyspace
            .keys
            .range::<str, _>((std::ops::Bound::Included(dir), std::ops::Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(dir));
        let (count, newest) = under.fold((0, 0), |(n, newest), (_, m)| {
            (n + 1, newest.max(m.mod_revision))
        });
        Range {
            count,
            newest,
            entries: direct_entries(dir, self.data.list(dir, self.now)),
        }
    }
}

/// A directory's count and newest revision, and its entries.
struct Range {
    count: i64,
    newest: i64,
    entries: Vec<(String, String)>,
}

impl EtcdModel {
    /// A model over `data` (whose clock runs the TTLs), whose client watches the revisions.
    pub fn new(data: MemoryStore) -> Self {
        EtcdModel {
            data,
            keyspace: Arc::default(),
            client: Client::new(true),
            broken: Arc::default(),
        }
    }

    /// Whether this client watches the responses' revisions and starts a new generation of
    /// versions when one goes back (true, the default), or answers versions without a
    /// generation (false: a restore's repeated revisions go unnoticed). Handles made from this one
    /// do the same.
    #[must_use]
    pub fn with_watch(mut self, watch: bool) -> Self {
        self.client = Client::new(watch);
        self
    }

    /// Another client of the same store (another process), which has seen no response yet.
    pub fn handle(&self) -> Self {
        EtcdModel {
            client: Client::new(self.client.watch),
            ..self.clone()
        }
    }

    /// Each time a client answered a version of a directory for other contents than it
    /// answered that version for before (a change it hid, breaking the version contract) while
    /// its revision watch had seen the store go back in between: what was answered, and when.
    /// Empty while the clients watch the revisions (their versions then differ); a restore that
    /// reuses revisions fills it when they do not ([`with_watch`](Self::with_watch)`(false)`).
    pub fn hidden(&self) -> Vec<String> {
        lock(&self.broken).seen.clone()
    }

    /// Each hidden change, as [`hidden`](Self::hidden), that the watch could not see: the
    /// client saw no response of the restored store before it reached the highest revision
    /// the client had seen (the watch's documented limit).
    pub fn unseen(&self) -> Vec<String> {
        lock(&self.broken).unseen.clone()
    }

    /// A version answered in `generation` of the client's watch for `entries`, directly under
    /// `dir`: checked against what it stood for before.
    fn answered(&self, dir: &str, version: &str, generation: u64, entries: &[(String, String)]) {
        let digest = listing_digest(entries);
        let mut answered = lock(&self.client.answered);
        let before = answered
            .entry((dir.to_owned(), version.to_owned()))
            .or_insert_with(|| (digest.clone(), generation));
        if before.0 != digest {
            let what = format!(
                "version {version} of {dir} answered for {entries:?}, which it did not stand for \
                 before (at revision {})",
                self.revision()
            );
            let mut broken = lock(&self.broken);
            if before.1 == generation {
                broken.unseen.push(what);
            } else {
                broken.seen.push(what);
            }
            *before = (digest, generation);
        }
    }

    /// The store's revision.
    pub fn revision(&self) -> i64 {
        lock(&self.keyspace).revision
    }

    /// A copy of the data and the revisions.
    pub fn snapshot(&self) -> EtcdSnapshot {
        let data = self.data.data();
        EtcdSnapshot {
            data: snapshot_of(&data),
            keyspace: lock(&self.keyspace).clone(),
        }
    }

    /// Replaces the data and the revisions with `snapshot`'s, the store's revision too: the
    /// revisions handed out since are handed out again (a restore without `--bump-revision`).
    pub fn restore(&self, snapshot: &EtcdSnapshot) {
        self.restore_bumped(snapshot, 0);
    }

    /// Like [`restore`](Self::restore), then moves the store's revision on by `bump`, as
    /// `etcdutl snapshot restore --bump-revision <bump>` does; the keys keep their revisions.
    pub fn restore_bumped(&self, snapshot: &EtcdSnapshot, bump: i64) {
        {
            let mut data = self.data.data();
            let mut keyspace = lock(&self.keyspace);
            restore_into(&snapshot.data, &mut data);
            *keyspace = snapshot.keyspace.clone();
            keyspace.revision += bump;
        }
        self.data.notify_hub().notify_missed();
    }

    /// Runs one request atomically, after the leases that ran out are revoked, and shows its
    /// response's revision to this client's watch: returns the answer and the watch's
    /// generation after it. The keys it put or deleted are notified after it.
    fn txn<R>(&self, f: impl FnOnce(&mut Txn<'_>) -> R) -> (R, u64) {
        let sent = self.client.revisions.send();
        let now = self.data.wall_now();
        let (out, revision, events) = {
            let mut data = self.data.data();
            let mut keyspace = lock(&self.keyspace);
            let mut t = Txn {
                data: &mut data,
                keyspace: &mut keyspace,
                now,
                wrote: None,
                events: Vec::new(),
            };
            t.expire();
            let out = f(&mut t);
            let events = t.events;
            (out, keyspace.revision, events)
        };
        for key in events {
            self.data.notify_hub().notify_key(&key);
        }
        (out, self.client.revisions.receive(sent, revision))
    }

    /// The version of `range`, answered in `generation` of the client's watch: without it when
    /// the client does not watch.
    fn version(&self, generation: u64, range: &Range) -> String {
        let generation = if self.client.watch { generation } else { 0 };
        revision_version(CLUSTER, generation, range.count, range.newest)
    }

    /// The answer of one request, without its generation.
    fn run<R>(&self, f: impl FnOnce(&mut Txn<'_>) -> R) -> R {
        self.txn(f).0
    }
}

#[async_trait]
impl backend::Backend for EtcdModel {
    /// The etcd backend's, with the in-memory store's TTLs.
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(BACKEND);
        caps.native_incr_and_get = true;
        caps.native_renew_and_list = true;
        caps.native_compare_and_delete = true;
        caps.native_change_version = true;
        caps.native_renew_and_versions = true;
        caps.native_notifications = true;
        caps.ttl_reads = true;
        caps
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        self.incr_and_get(key, 1, ttl, key).await.map(|(n, _)| n)
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        Ok(self.run(|t| t.value(key)))
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        Ok(self.run(|t| match t.value(key) {
            Some(v) => {
                t.put(key, v, Some(ttl));
                true
            }
            None => false,
        }))
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        Ok(self.run(|t| {
            if t.value(key).as_deref() != expected {
                return false;
            }
            t.put(key, new.to_owned(), ttl);
            true
        }))
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        Ok(self.run(|t| t.delete(key)))
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        Ok(self.run(|t| t.value(key).as_deref() == Some(expected) && t.delete(key)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        Ok(self.run(|t| t.data.list(prefix, t.now)))
    }

    /// As etcd's `LeaseTimeToLive` answers: whole seconds, rounded down.
    async fn list_with_ttl(&self, prefix: &str) -> Result<Vec<(String, String, Option<Duration>)>> {
        Ok(self.run(|t| {
            t.data
                .list_with_ttl(prefix, t.now)
                .into_iter()
                .map(|(k, v, left)| (k, v, left.map(|d| Duration::from_secs(d.as_secs()))))
                .collect()
        }))
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        self.run(|t| {
            if let Some(v) = t.value(key) {
                if parse_counter(key, &v)? >= value {
                    return Ok(false);
                }
            }
            t.put(key, value.to_string(), ttl);
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
        self.run(|t| {
            // The write keeps the key's lease (`ignore_lease`): the TTL is set on creation.
            let own = t.keyspace.keys.get(incr_key).is_some_and(|m| m.own_lease);
            let n = t.data.incr_by(incr_key, by, ttl, t.now)?;
            t.touch(incr_key, own);
            Ok((n, t.value(get_key)))
        })
    }

    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        Ok(self.run(|t| (t.renew(key, holder, ttl), t.data.list(prefix, t.now))))
    }

    /// The renewal with the version's range; only when the version differs from `since`, a
    /// second request that lists the directory and answers the version again.
    async fn renew_and_list_if_changed(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dir: &str,
        since: Option<&str>,
    ) -> Result<RenewedListing> {
        let ((renewed, range), generation) =
            self.txn(|t| (t.renew(key, holder, ttl), t.range(dir)));
        let version = self.version(generation, &range);
        self.answered(dir, &version, generation, &range.entries);
        if since == Some(version.as_str()) {
            return Ok(RenewedListing::new(renewed, version, None));
        }
        // Two requests: other calls may come between them.
        tokio::task::yield_now().await;
        let (range, generation) = self.txn(|t| t.range(dir));
        let version = self.version(generation, &range);
        self.answered(dir, &version, generation, &range.entries);
        let listing = (since != Some(version.as_str())).then_some(range.entries);
        Ok(RenewedListing::new(renewed, version, listing))
    }

    /// One request: the renewal and every directory's version range, as the backend's one
    /// transaction.
    async fn renew_and_versions(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[(&str, Option<&str>)],
    ) -> Result<(bool, Vec<String>)> {
        let ((renewed, ranges), generation) = self.txn(|t| {
            let renewed = t.renew(key, holder, ttl);
            let ranges: Vec<Range> = dirs.iter().map(|(dir, _)| t.range(dir)).collect();
            (renewed, ranges)
        });
        let versions = dirs
            .iter()
            .zip(&ranges)
            .map(|((dir, _), range)| {
                let version = self.version(generation, range);
                self.answered(dir, &version, generation, &range.entries);
                version
            })
            .collect();
        Ok((renewed, versions))
    }

    /// What the backend's prefix watches see, one per directory (see the module docs).
    async fn subscribe(&self, dir: &str) -> Result<Notifications> {
        Ok(self.data.notify_hub().subscribe(dir))
    }

    async fn durability(&self) -> Result<Durability> {
        Ok(Durability::not_durable(
            "the etcd model keeps its data in this process only",
        ))
    }
}

#[cfg(test)]
mod tests;
