//! [`EtcdStore`]: building a store over a URL, a configuration or an application's client, and
//! its [`Backend`](backend::Backend) implementation: transactions comparing values and revisions,
//! TTLs through leases ([`leases`](crate::leases)).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KvClient, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, WatchClient,
};
use headcount_core::backend::{
    self, direct_entries, parse_counter, revision_version, RevisionWatch,
};
use headcount_core::notify::{Notifications, NotifyHub, WarnOnce};
use headcount_core::store::RenewedListing;
use headcount_core::{Capabilities, Durability, Error, Op, Result};

use crate::config::EtcdConfig;
use crate::connection::{self, retry_unsent, CLIENT_DEFAULTS};
use crate::endpoints::Endpoints;
use crate::errors::{self, BACKEND};
use crate::leases::{Leases, Owned};

/// The most read-and-compare rounds an `incr` makes before giving up; each failed round means
/// another writer changed the key, so the loop only spins while others make progress.
const INCR_ATTEMPTS: usize = 1000;

/// The most directories `renew_and_versions` reads in its one transaction: etcd refuses a
/// transaction of more operations than its `--max-txn-ops` (128 by default), and the renewal's
/// branches add one. More are answered one `renew_and_list_if_changed` at a time.
const VERSIONS_PER_TXN: usize = 100;

/// A [`Store`](headcount_core::Store) in etcd (v3 API), shared by any number of processes and machines.
///
/// Cloning is cheap and shares the gRPC channel and the lease cache.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    kv: KvClient,
    /// The endpoint calls go to, and the others of the URL.
    endpoints: Arc<Endpoints>,
    leases: Leases,
    owned: Owned,
    config: EtcdConfig,
    counters: Counters,
    /// The highest revision a response carried, and how often one went back (a restore that
    /// reused revisions): the generation every directory version carries.
    revisions: RevisionWatch,
    /// Built over an application's client, whose endpoints this store does not know.
    over_client: bool,
    /// Change notifications: the subscribers, the client the watch stream is opened on, and
    /// the task that holds it (see [`crate::notify`]).
    watch: WatchClient,
    hub: NotifyHub,
    notify_warned: Arc<WarnOnce>,
}

/// What this handle last wrote to a counter: its value and the revision of that write.
type Seen = Option<(i64, i64)>;

/// One async lock per counter key in use, holding what this handle last saw of it.
///
/// etcd has no atomic increment: an increment is a transaction that writes `n + 1` only if the
/// key's `mod_revision` is still the one `n` was read at. Callers of one handle that increment
/// the same key take turns instead of failing each other's comparisons (50 callers would
/// otherwise need ~50 attempts per increment), and the remembered revision lets a turn skip the
/// read: one round trip while no other process writes the key. Other processes are still
/// handled by the comparison, so this is an optimisation, never a correctness requirement.
#[derive(Default)]
struct Counters {
    keys: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Seen>>>>,
}

impl Counters {
    fn slot(&self, key: &str) -> Arc<tokio::sync::Mutex<Seen>> {
        let mut keys = self
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Drop slots no caller holds, so the map stays as small as the set of keys in use.
        if keys.len() > 1024 {
            keys.retain(|_, slot| Arc::strong_count(slot) > 1);
        }
        keys.entry(key.to_owned()).or_default().clone()
    }
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.inner.config)
            .field("min_ttl", &self.inner.leases.min_ttl())
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the cluster named by an `etcd://` or `etcds://` URL (see the crate README),
    /// authenticates, and measures the server's minimum lease TTL. The endpoints are tried one
    /// at a time, starting at a random one, each within the deadline; calls then go to the one
    /// that answered (see the crate README, *URLs*). Fails with [`Error::Rejected`] for bad
    /// credentials, [`Error::Unavailable`] or [`Error::Timeout`] when no endpoint can be reached
    /// in time (after one deadline per endpoint, at most).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(EtcdConfig::from_url(url)?).await
    }

    /// Like [`connect`](Self::connect) with an already parsed configuration.
    pub async fn connect_with(config: EtcdConfig) -> Result<Self> {
        let (kv, watch, leases, endpoints) = connection::open(&config).await?;
        Ok(Self::from_parts(
            kv, watch, leases, endpoints, config, false,
        ))
    }

    /// A store over an `etcd_client::Client` the application already has (re-exported as
    /// [`etcd_client`]), with the default operation timeout: measures the server's minimum
    /// lease TTL, as [`connect`](Self::connect) does. Authentication and TLS are the client's.
    pub async fn from_client(client: Client) -> Result<Self> {
        let config = EtcdConfig::from_url(CLIENT_DEFAULTS)?;
        let leases = connection::measure(&client, &config).await?;
        Ok(Self::from_parts(
            client.kv_client(),
            client.watch_client(),
            leases,
            Endpoints::unmanaged(),
            config,
            true,
        ))
    }

    fn from_parts(
        kv: KvClient,
        watch: WatchClient,
        leases: Leases,
        endpoints: Arc<Endpoints>,
        config: EtcdConfig,
        over_client: bool,
    ) -> Self {
        EtcdStore {
            inner: Arc::new(Inner {
                kv,
                endpoints,
                leases,
                owned: Owned::default(),
                config,
                counters: Counters::default(),
                revisions: RevisionWatch::new(),
                over_client,
                watch,
                hub: NotifyHub::new(),
                notify_warned: Arc::default(),
            }),
        }
    }

    /// The configuration this store was built from.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The shortest lease TTL the server grants, measured when connecting.
    pub fn min_ttl(&self) -> Duration {
        self.inner.leases.min_ttl()
    }

    fn classify(&self, e: etcd_client::Error, op: Op) -> Error {
        errors::classify(
            e,
            op.name(),
            self.inner.config.deadline(),
            self.inner.config.password(),
        )
    }

    /// Sends a key-value request (again while it was never sent, [`retry_unsent`]) and notes
    /// the revision its response carries: one below what this handle saw before sending it means
    /// the store went back in time, and starts a new generation of versions ([`RevisionWatch`]).
    async fn send<R, F, Fut>(&self, mut call: F) -> std::result::Result<R, etcd_client::Error>
    where
        R: Headed,
        F: FnMut(KvClient) -> Fut,
        Fut: Future<Output = std::result::Result<R, etcd_client::Error>>,
    {
        let sent = self.inner.revisions.send();
        let resp = retry_unsent(&self.inner.endpoints, || call(self.inner.kv.clone())).await?;
        if let Some(revision) = resp.revision() {
            self.inner.revisions.receive(sent, revision);
        }
        Ok(resp)
    }

    /// Reads every key under `prefix`, for `op`.
    async fn range(&self, op: Op, prefix: &str) -> Result<etcd_client::GetResponse> {
        self.send(
            |mut kv| async move { kv.get(prefix, Some(GetOptions::new().with_prefix())).await },
        )
        .await
        .map_err(|e| self.classify(e, op))
    }

    /// Runs `work` within the deadline. A call that runs out of time, or that its caller gives
    /// up after half of it, moves the store off the endpoint it went to ([`Endpoints`]).
    async fn deadline<T>(&self, op: Op, work: impl Future<Output = Result<T>>) -> Result<T> {
        let deadline = self.inner.config.deadline();
        let watch = self.inner.endpoints.watch(deadline.after() / 2);
        let result = deadline.run(op.name(), work).await;
        match &result {
            Err(Error::Timeout { .. }) => watch.timed_out().await,
            _ => watch.finished(),
        }
        result
    }

    /// Runs a transaction whose `Put`s attach the lease `lease_for` returns. A put that fails
    /// because its lease is gone (revoked, or lost with a restored cluster) is retried once with
    /// a freshly granted lease.
    async fn txn_with_lease(
        &self,
        op: Op,
        ttl: Option<Duration>,
        build: impl Fn(i64) -> Txn,
    ) -> Result<etcd_client::TxnResponse> {
        let mut fresh = false;
        loop {
            let lease = match ttl {
                Some(ttl) if fresh => self.inner.leases.grant_fresh(ttl).await,
                Some(ttl) => self.inner.leases.lease_for(ttl).await,
                None => Ok(0),
            }
            .map_err(|e| self.classify(e, op))?;
            let txn = build(lease);
            match self
                .send(|mut kv| {
                    let txn = txn.clone();
                    async move { kv.txn(txn).await }
                })
                .await
            {
                Ok(r) => return Ok(r),
                Err(e) if !fresh && ttl.is_some() && errors::is_lease_not_found(&e) => {
                    self.inner.leases.forget(ttl.unwrap_or_default());
                    fresh = true;
                }
                Err(e) => return Err(self.classify(e, op)),
            }
        }
    }
}

/// A range that answers a directory's [version](range_version) in constant bytes: the number of
/// keys under `dir` and the newest of them by revision (keys only, one of them).
fn version_range(dir: &str) -> TxnOp {
    TxnOp::get(
        dir,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_keys_only()
                .with_sort(SortTarget::Mod, SortOrder::Descend)
                .with_limit(1),
        ),
    )
}

/// A directory's version ([`revision_version`]): the cluster, this handle's generation, the
/// number of keys under the directory and the newest `mod_revision` among them. etcd revisions
/// only grow, so a later state with the same count and newest revision holds the same keys at the
/// same revisions (every key at or below that revision was there, unchanged, before; the counts
/// match, so there are no others): the same keys and values. Keys deeper than the directory count
/// too, which only makes the version change more often than the contract requires.
///
/// A snapshot restore that does not move the revision on (`etcdutl snapshot restore` without
/// `--bump-revision`, or a copy of an older data directory) hands the lost revisions out again,
/// to other writes, and would repeat versions for other contents. Every response carries the
/// store's revision: the first one this handle sees below what it saw before starts a new
/// generation ([`RevisionWatch`]), so every version it answered before differs from every one it
/// answers after. A restored store that reaches the revision this handle last saw before this
/// handle's next response is not noticed (see the crate docs, "Snapshot restores"); etcd's own
/// guidance, `etcdutl snapshot restore --bump-revision --mark-compacted`, keeps revisions growing
/// and needs nothing of this.
fn range_version(cluster: u64, generation: u64, range: &etcd_client::GetResponse) -> String {
    let newest = range
        .kvs()
        .iter()
        .map(etcd_client::KeyValue::mod_revision)
        .max()
        .unwrap_or(0);
    revision_version(cluster, generation, range.count(), newest)
}

/// A response whose header carries the store's revision when it was answered.
trait Headed {
    fn revision(&self) -> Option<i64>;
}

macro_rules! headed {
    ($($t:ty),*) => {$(
        impl Headed for $t {
            fn revision(&self) -> Option<i64> {
                self.header().map(etcd_client::ResponseHeader::revision)
            }
        }
    )*};
}

headed!(
    etcd_client::TxnResponse,
    etcd_client::GetResponse,
    etcd_client::DeleteResponse
);

impl EtcdStore {
    /// Forgets `key`'s own lease and closes its keep-alive stream; the lease expires by itself.
    fn forget_owned(&self, key: &str) {
        if let Some(id) = self.inner.owned.forget(key) {
            self.inner.leases.close(id);
        }
    }

    /// Renews `key` if it holds `holder`, then runs `reads`: returns whether it renewed, the
    /// answers of `reads` and the cluster id.
    ///
    /// The key is kept on a lease of its own ([`Owned`]). In the steady state (the key already
    /// on it) the renewal is a keep-alive of that lease sent beside a transaction that only
    /// compares and reads: etcd serves both without a Raft proposal, so a renewal writes nothing
    /// and syncs no log. Otherwise (the first renewal after a claim, or a write that put the key
    /// on a shared lease) a second transaction moves it to its own lease, granted first when
    /// there is none.
    async fn renew_with(
        &self,
        op: Op,
        key: &str,
        holder: &str,
        ttl: Duration,
        reads: Vec<TxnOp>,
    ) -> Result<(bool, Vec<TxnOpResponse>, u64)> {
        let secs = self.inner.leases.secs(ttl);
        let holds = Compare::value(key, CompareOp::Equal, holder);
        if let Some(lease) = self.inner.owned.get(key, secs) {
            // Read-only (etcd runs a transaction without a write in either branch as a
            // linearizable read): on our lease and holding `holder`, or else the key itself, to
            // tell a key moved to another lease from a key that is no longer ours.
            let mut otherwise = vec![TxnOp::get(key, None)];
            otherwise.extend(reads.iter().cloned());
            let txn = Txn::new()
                .when([holds.clone(), Compare::lease(key, CompareOp::Equal, lease)])
                .and_then(reads.clone())
                .or_else(otherwise);
            let run = self.send(|mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            });
            let (kept, answer) = tokio::join!(self.inner.leases.keep_alive(lease, secs), run);
            let resp = answer.map_err(|e| self.classify(e, op))?;
            let kept = kept.map_err(|e| self.classify(e, op))?;
            let cluster = resp.header().map_or(0, |h| h.cluster_id());
            let succeeded = resp.succeeded();
            let mut answers = resp.op_responses();
            if succeeded {
                // Renewed: the key held `holder` on our lease, and the lease was alive when
                // the keep-alive reached the server (a lease that expires takes its keys with
                // it, so a live one still carried the key).
                if !kept {
                    self.forget_owned(key);
                }
                return Ok((kept, answers, cluster));
            }
            if !kept {
                self.forget_owned(key);
            }
            let ours = match answers.first() {
                Some(TxnOpResponse::Get(g)) => g
                    .kvs()
                    .first()
                    .is_some_and(|kv| kv.value() == holder.as_bytes()),
                _ => {
                    return Err(Error::rejected(
                        BACKEND,
                        op.name(),
                        "the renewal transaction answered without the key",
                    ))
                }
            };
            if !ours {
                self.forget_owned(key);
                answers.remove(0);
                return Ok((false, answers, cluster));
            }
            // The key is ours on another lease: move it below.
        }
        self.move_to_own_lease(op, key, holder, ttl, secs, reads)
            .await
    }

    /// The part of [`renew_with`](Self::renew_with) that puts `key` (when it holds `holder`) on
    /// a lease of its own, granting one when it has none, then runs `reads`, in one transaction.
    async fn move_to_own_lease(
        &self,
        op: Op,
        key: &str,
        holder: &str,
        ttl: Duration,
        secs: i64,
        reads: Vec<TxnOp>,
    ) -> Result<(bool, Vec<TxnOpResponse>, u64)> {
        let mut retried = false;
        loop {
            let lease = match self.inner.owned.get(key, secs) {
                Some(id) => id,
                None => {
                    let id = self
                        .inner
                        .leases
                        .grant_fresh(ttl)
                        .await
                        .map_err(|e| self.classify(e, op))?;
                    if let Some(old) = self.inner.owned.set(key, id, secs) {
                        self.inner.leases.close(old);
                    }
                    id
                }
            };
            let mut then = vec![TxnOp::put(key, holder, Some(put_options(lease)))];
            then.extend(reads.iter().cloned());
            let txn = Txn::new()
                .when([Compare::value(key, CompareOp::Equal, holder)])
                .and_then(then)
                .or_else(reads.clone());
            let answer = self
                .send(|mut kv| {
                    let txn = txn.clone();
                    async move { kv.txn(txn).await }
                })
                .await;
            let resp = match answer {
                Ok(resp) => resp,
                // Our lease is gone (it expired while this member was paused, or the cluster
                // was restored): grant another once.
                Err(e) if !retried && errors::is_lease_not_found(&e) => {
                    self.forget_owned(key);
                    retried = true;
                    continue;
                }
                Err(e) => return Err(self.classify(e, op)),
            };
            let cluster = resp.header().map_or(0, |h| h.cluster_id());
            let held = resp.succeeded();
            let mut answers = resp.op_responses();
            if held {
                answers.remove(0);
            } else {
                self.forget_owned(key);
            }
            return Ok((held, answers, cluster));
        }
    }

    /// Adds `by` to the counter at `key` and, when `also` names a key, reads it in the same
    /// transaction. Returns the new value and what was read.
    async fn incr_by(
        &self,
        op: Op,
        key: &str,
        by: i64,
        ttl: Option<Duration>,
        also: Option<&str>,
    ) -> Result<(i64, Option<String>)> {
        let slot = self.inner.counters.slot(key);
        let mut seen = slot.lock().await;
        let read_also = |resp: &etcd_client::TxnResponse, index: usize| -> Result<Option<String>> {
            match also {
                None => Ok(None),
                Some(k) => nth_get(resp, index).map(|(v, _)| utf8(k, v)).transpose(),
            }
        };
        let with_also = |mut ops: Vec<TxnOp>| {
            if let Some(k) = also {
                ops.push(TxnOp::get(k, None));
            }
            ops
        };
        // What the key held at which revision, as far as we know: None = believed absent.
        let mut known: Option<(Vec<u8>, i64)> = seen.map(|(v, r)| (v.to_string().into_bytes(), r));
        for _ in 0..INCR_ATTEMPTS {
            let resp = match &known {
                None => {
                    // Create it at `by` (with the TTL) if absent, else read it.
                    let create = |lease: i64| {
                        Txn::new()
                            .when([Compare::version(key, CompareOp::Equal, 0)])
                            .and_then(with_also(vec![TxnOp::put(
                                key,
                                by.to_string(),
                                Some(put_options(lease)),
                            )]))
                            .or_else(with_also(vec![TxnOp::get(key, None)]))
                    };
                    let resp = self.txn_with_lease(op, ttl, create).await?;
                    if resp.succeeded() {
                        *seen = resp.header().map(|h| (by, h.revision()));
                        // op 0 is the put, op 1 the read.
                        return Ok((by, read_also(&resp, 0)?));
                    }
                    resp
                }
                Some((value, revision)) => {
                    let text = utf8(key, value.clone())?;
                    let current = match parse_counter(key, &text) {
                        Ok(n) => n,
                        Err(e) => {
                            *seen = None;
                            return Err(e);
                        }
                    };
                    let next = current.checked_add(by).ok_or_else(|| {
                        Error::foreign(
                            key,
                            "a decimal integer that fits (and, for incr, stays within) an i64",
                            &text,
                        )
                    })?;
                    // The write keeps the key's lease (ignore_lease): the TTL is set on creation
                    // only.
                    let txn = Txn::new()
                        .when([Compare::mod_revision(key, CompareOp::Equal, *revision)])
                        .and_then(with_also(vec![TxnOp::put(
                            key,
                            next.to_string(),
                            Some(PutOptions::new().with_ignore_lease()),
                        )]))
                        .or_else(with_also(vec![TxnOp::get(key, None)]));
                    let resp = self
                        .send(|mut kv| {
                            let txn = txn.clone();
                            async move { kv.txn(txn).await }
                        })
                        .await
                        .map_err(|e| self.classify(e, op))?;
                    if resp.succeeded() {
                        *seen = resp.header().map(|h| (next, h.revision()));
                        return Ok((next, read_also(&resp, 0)?));
                    }
                    resp
                }
            };
            // The comparison failed: the else branch read the key (op 0); go again from it.
            known = nth_get(&resp, 0);
            *seen = None;
        }
        Err(Error::contended(
            key,
            format!("{op} lost {INCR_ATTEMPTS} races in a row"),
        ))
    }

    /// [`Store::set_max`](headcount_core::Store::set_max) as a compare-and-set loop over the
    /// revision of the value last seen, like [`incr_by`](Self::incr_by): the write of a value
    /// above the one this handle last wrote is one transaction (compared on the revision of that
    /// write, reading the key instead when another client wrote it since), where the provided
    /// method reads first. A value at or above `value` is only believed when read by this call:
    /// another client may have lowered or removed the key since this handle wrote it.
    async fn raise_to(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        const OP: Op = Op::SetMax;
        let slot = self.inner.counters.slot(key);
        let mut seen = slot.lock().await;
        // What the key holds at which revision (None: absent), and whether this call read it
        // (else it is what this handle last wrote, perhaps stale).
        let mut known: Option<(Vec<u8>, i64)> = seen.map(|(v, r)| (v.to_string().into_bytes(), r));
        let mut read = false;
        let new = value.to_string();
        for _ in 0..INCR_ATTEMPTS {
            let compare = match &known {
                None => Compare::version(key, CompareOp::Equal, 0),
                Some((current, revision)) => {
                    let text = utf8(key, current.clone())?;
                    let current = match parse_counter(key, &text) {
                        Ok(n) => n,
                        Err(e) => {
                            *seen = None;
                            return Err(e);
                        }
                    };
                    if current >= value {
                        if read {
                            return Ok(false);
                        }
                        let resp = self
                            .send(|mut kv| async move { kv.get(key, None).await })
                            .await
                            .map_err(|e| self.classify(e, OP))?;
                        known = resp
                            .kvs()
                            .first()
                            .map(|kv| (kv.value().to_vec(), kv.mod_revision()));
                        read = true;
                        *seen = None;
                        continue;
                    }
                    Compare::mod_revision(key, CompareOp::Equal, *revision)
                }
            };
            let resp = self
                .txn_with_lease(OP, ttl, |lease| {
                    Txn::new()
                        .when([compare.clone()])
                        .and_then([TxnOp::put(key, new.as_str(), Some(put_options(lease)))])
                        .or_else([TxnOp::get(key, None)])
                })
                .await?;
            if resp.succeeded() {
                // Without a header (etcd always sends one) the revision is unknown: remember nothing.
                *seen = resp.header().map(|h| (value, h.revision()));
                return Ok(true);
            }
            // The comparison failed: the else branch read the key; go again from it.
            known = nth_get(&resp, 0);
            read = true;
            *seen = None;
        }
        Err(Error::contended(
            key,
            format!("{OP} lost {INCR_ATTEMPTS} races in a row"),
        ))
    }
}

/// The key-value of the `index`-th `Get` of a transaction's executed branch, if it found one.
fn nth_get(resp: &etcd_client::TxnResponse, index: usize) -> Option<(Vec<u8>, i64)> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(
                g.kvs()
                    .first()
                    .map(|kv| (kv.value().to_vec(), kv.mod_revision())),
            ),
            _ => None,
        })
        .nth(index)
        .flatten()
}

fn put_options(lease: i64) -> PutOptions {
    if lease == 0 {
        PutOptions::new()
    } else {
        PutOptions::new().with_lease(lease)
    }
}

/// The key-value pairs of a prefix range, as `list` returns them.
fn pairs(prefix: &str, kvs: &[etcd_client::KeyValue]) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::with_capacity(kvs.len());
    for kv in kvs {
        let key = String::from_utf8(kv.key().to_vec())
            .map_err(|_| Error::foreign(prefix, "UTF-8 keys", "a key that is not UTF-8"))?;
        let value = utf8(&key, kv.value().to_vec())?;
        pairs.push((key, value));
    }
    // etcd returns keys in byte order already; sorting keeps the contract explicit.
    pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(pairs)
}

fn utf8(key: &str, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes)
        .map_err(|_| Error::foreign(key, "a UTF-8 value", "bytes that are not UTF-8"))
}

#[async_trait]
impl backend::Backend for EtcdStore {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(BACKEND);
        caps.ttl_granularity = Duration::from_secs(1);
        caps.min_ttl = self.inner.leases.min_ttl();
        caps.native_incr_and_get = true;
        caps.native_renew_and_list = true;
        caps.native_compare_and_delete = true;
        caps.native_change_version = true;
        caps.native_renew_and_versions = true;
        caps.native_notifications = true;
        caps.ttl_reads = true;
        caps
    }

    /// A prefix watch of `dir` on the store handle's one watch stream (see the crate README,
    /// "Change notifications").
    async fn subscribe(&self, dir: &str) -> Result<Notifications> {
        let (watch, timeout) = (self.inner.watch.clone(), self.inner.config.timeout());
        let warned = self.inner.notify_warned.clone();
        Ok(self.inner.hub.subscribe_listened(dir, |hub| {
            crate::notify::listen(watch, timeout, hub, warned)
        }))
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        self.deadline(Op::Incr, self.incr_by(Op::Incr, key, 1, ttl, None))
            .await
            .map(|(n, _)| n)
    }

    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> Result<(i64, Option<String>)> {
        self.deadline(
            Op::IncrAndGet,
            self.incr_by(Op::IncrAndGet, incr_key, by, ttl, Some(get_key)),
        )
        .await
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        self.deadline(Op::SetMax, self.raise_to(key, value, ttl))
            .await
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        self.deadline(Op::Get, async {
            let resp = self
                .send(|mut kv| async move { kv.get(key, None).await })
                .await
                .map_err(|e| self.classify(e, Op::Get))?;
            resp.kvs()
                .first()
                .map(|kv| utf8(key, kv.value().to_vec()))
                .transpose()
        })
        .await
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        self.deadline(Op::Expire, async {
            // Re-attach the live key to a lease of the new TTL, keeping its value.
            let resp = self
                .txn_with_lease(Op::Expire, Some(ttl), |lease| {
                    Txn::new()
                        .when([Compare::version(key, CompareOp::Greater, 0)])
                        .and_then([TxnOp::put(
                            key,
                            "",
                            Some(put_options(lease).with_ignore_value()),
                        )])
                })
                .await?;
            Ok(resp.succeeded())
        })
        .await
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        self.deadline(Op::CompareAndSet, async {
            let compare = match expected {
                None => Compare::version(key, CompareOp::Equal, 0),
                // A value comparison on a missing key fails, as it must.
                Some(e) => Compare::value(key, CompareOp::Equal, e),
            };
            let resp = self
                .txn_with_lease(Op::CompareAndSet, ttl, |lease| {
                    Txn::new().when([compare.clone()]).and_then([TxnOp::put(
                        key,
                        new,
                        Some(put_options(lease)),
                    )])
                })
                .await?;
            Ok(resp.succeeded())
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        self.deadline(Op::Delete, async {
            let resp = self
                .send(|mut kv| async move { kv.delete(key, None).await })
                .await
                .map_err(|e| self.classify(e, Op::Delete))?;
            Ok(resp.deleted() > 0)
        })
        .await
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        self.deadline(Op::CompareAndDelete, async {
            let resp = self
                .txn_with_lease(Op::CompareAndDelete, None, |_| {
                    Txn::new()
                        .when([Compare::value(key, CompareOp::Equal, expected)])
                        .and_then([TxnOp::delete(key, None)])
                })
                .await?;
            if resp.succeeded() {
                // The key's own lease (if a renewal gave it one) expires by itself.
                self.forget_owned(key);
            }
            Ok(resp.succeeded())
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        self.deadline(Op::List, async {
            pairs(prefix, self.range(Op::List, prefix).await?.kvs())
        })
        .await
    }

    /// One range, then one `LeaseTimeToLive` per lease the listed keys carry (a renewed key has
    /// a lease of its own; keys written together may share one), a few at a time. Whole
    /// seconds, rounded down: a key in its last second shows 0.
    async fn list_with_ttl(&self, prefix: &str) -> Result<Vec<(String, String, Option<Duration>)>> {
        /// How many `LeaseTimeToLive` calls are in flight at once.
        const AT_ONCE: usize = 32;
        self.deadline(Op::ListWithTtl, async {
            let resp = self.range(Op::ListWithTtl, prefix).await?;
            let listed = pairs(prefix, resp.kvs())?;
            let leases: Vec<i64> = resp.kvs().iter().map(|kv| kv.lease()).collect();
            let mut distinct: Vec<i64> = leases.iter().copied().filter(|&l| l != 0).collect();
            distinct.sort_unstable();
            distinct.dedup();
            let mut left = HashMap::with_capacity(distinct.len());
            for chunk in distinct.chunks(AT_ONCE) {
                let mut calls = tokio::task::JoinSet::new();
                for &id in chunk {
                    let leases = self.inner.leases.clone();
                    calls.spawn(async move { (id, leases.time_to_live(id).await) });
                }
                while let Some(done) = calls.join_next().await {
                    let Ok((id, answer)) = done else {
                        return Err(Error::Unavailable {
                            backend: BACKEND,
                            message: "a lease read was cancelled".into(),
                            source: None,
                        });
                    };
                    let secs = answer.map_err(|e| self.classify(e, Op::ListWithTtl))?;
                    left.insert(id, secs);
                }
            }
            // `pairs` keeps the range's order (etcd answers sorted by key): one lease per pair.
            Ok(listed
                .into_iter()
                .zip(leases)
                .map(|((k, v), lease)| {
                    // A lease the server no longer has is a key on its way out: 0 left.
                    let ttl = (lease != 0).then(|| {
                        Duration::from_secs(
                            left.get(&lease).copied().flatten().unwrap_or(0).max(0) as u64
                        )
                    });
                    (k, v, ttl)
                })
                .collect())
        })
        .await
    }

    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        self.deadline(Op::RenewAndList, async {
            // One transaction (and a keep-alive of the key's own lease beside it, see
            // `renew_with`); the range runs after any write, so it sees the renewed key.
            let list = TxnOp::get(prefix, Some(GetOptions::new().with_prefix()));
            let (renewed, answers, _) = self
                .renew_with(Op::RenewAndList, key, holder, ttl, vec![list])
                .await?;
            let listed = answers
                .into_iter()
                .find_map(|r| match r {
                    TxnOpResponse::Get(g) => Some(g),
                    _ => None,
                })
                .map(|g| pairs(prefix, g.kvs()))
                .transpose()?
                .unwrap_or_default();
            Ok((renewed, listed))
        })
        .await
    }

    /// One transaction that compares and reads (the renewal itself is a keep-alive of the key's
    /// own lease sent beside it, see `renew_with`) and answers the directory's version in
    /// constant bytes: the number of keys under it and the newest revision among them. Only when
    /// that differs from `since` is the directory read, in a second request whose answer gives
    /// the version it returns.
    async fn renew_and_list_if_changed(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dir: &str,
        since: Option<&str>,
    ) -> Result<RenewedListing> {
        self.deadline(Op::RenewAndListIfChanged, async {
            let (renewed, answers, cluster) = self
                .renew_with(
                    Op::RenewAndListIfChanged,
                    key,
                    holder,
                    ttl,
                    vec![version_range(dir)],
                )
                .await?;
            let version = answers
                .into_iter()
                .find_map(|r| match r {
                    TxnOpResponse::Get(g) => Some(range_version(
                        cluster,
                        self.inner.revisions.generation(),
                        &g,
                    )),
                    _ => None,
                })
                .ok_or_else(|| {
                    Error::rejected(
                        BACKEND,
                        Op::RenewAndListIfChanged.name(),
                        "the renewal transaction answered without its range",
                    )
                })?;
            if since == Some(version.as_str()) {
                return Ok(RenewedListing::new(renewed, version, None));
            }
            let resp =
                self.send(|mut kv| async move {
                    kv.get(dir, Some(GetOptions::new().with_prefix())).await
                })
                .await
                .map_err(|e| self.classify(e, Op::RenewAndListIfChanged))?;
            let cluster = resp.header().map_or(cluster, |h| h.cluster_id());
            let version = range_version(cluster, self.inner.revisions.generation(), &resp);
            let entries = direct_entries(dir, pairs(dir, resp.kvs())?);
            let listing = (since != Some(version.as_str())).then_some(entries);
            Ok(RenewedListing::new(renewed, version, listing))
        })
        .await
    }

    /// One transaction, as `renew_and_list_if_changed`'s first: it compares and reads (the
    /// renewal itself is a keep-alive of the key's own lease sent beside it, see `renew_with`),
    /// one keys-only range per directory, each answering that directory's version in constant
    /// bytes as `renew_and_list_if_changed` does.
    async fn renew_and_versions(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[(&str, Option<&str>)],
    ) -> Result<(bool, Vec<String>)> {
        if dirs.len() > VERSIONS_PER_TXN {
            return backend::versions_one_by_one(self, key, holder, ttl, dirs).await;
        }
        self.deadline(Op::RenewAndVersions, async {
            let reads = dirs.iter().map(|(dir, _)| version_range(dir)).collect();
            let (renewed, answers, cluster) = self
                .renew_with(Op::RenewAndVersions, key, holder, ttl, reads)
                .await?;
            let generation = self.inner.revisions.generation();
            let versions: Vec<String> = answers
                .iter()
                .filter_map(|r| match r {
                    TxnOpResponse::Get(g) => Some(range_version(cluster, generation, g)),
                    _ => None,
                })
                .collect();
            if versions.len() != dirs.len() {
                return Err(Error::rejected(
                    BACKEND,
                    Op::RenewAndVersions.name(),
                    "the renewal transaction answered without every range",
                ));
            }
            Ok((renewed, versions))
        })
        .await
    }

    /// Durable: etcd fsyncs its write-ahead log, and commits through a Raft majority, before it
    /// acknowledges a write. The one way to turn that off, `--unsafe-no-fsync`, is not visible
    /// through the client API, so this is the documented behaviour rather than a probe.
    ///
    /// It names the servers by the endpoints the store connects to (`host:port`; none for a store
    /// over an application's client): the cluster id would not do, since independent clusters
    /// started with the same settings share it.
    async fn durability(&self) -> Result<Durability> {
        let servers = if self.inner.over_client {
            Vec::new()
        } else {
            self.inner
                .config
                .endpoints()
                .iter()
                .map(|(host, port)| format!("etcd endpoint {}:{port}", host.to_ascii_lowercase()))
                .collect()
        };
        Ok(Durability::durable(
            "etcd fsyncs its WAL before acknowledging a write (unless started with --unsafe-no-fsync, which the API cannot see)",
        )
        .with_servers(servers))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn the_defaults_of_a_store_over_a_client_parse() {
        assert!(EtcdConfig::from_url(CLIENT_DEFAULTS).is_ok());
    }
}
