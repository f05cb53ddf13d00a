//! [`RedisStore`]: building a store over a URL, a configuration or an application's connection,
//! and its [`Backend`](backend::Backend) implementation, each primitive one `GET` or one script.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use headcount_core::backend::{
    self, direct_entries, listing_digest, ttl_millis, versions_one_by_one,
};
use headcount_core::notify::{Notifications, NotifyHub, WarnOnce};
use headcount_core::{Capabilities, Durability, Error, Op, RenewedListing, Result, Store};
use redis::aio::{ConnectionLike as _, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{ScriptInvocation, Value};

use crate::config::{Deployment, RedisConfig};
use crate::connection::{self, Conn, CLUSTER_DEFAULTS, SINGLE_DEFAULTS};
use crate::durability::{durability_of, replication_ids, replication_of};
use crate::errors::{self, BACKEND};
use crate::index::{
    dir_of, hash_tag, is_index_name, sweep_period, tag_of, IndexKeys, REQUEST_INFIX,
};
use crate::notify;
use crate::reconnect::Reconnecting;
use crate::replies::{
    foreign_reply, list_reply, list_with_ttl_reply, unexpected, written_or_foreign,
};
use crate::scripts::{ttl_arg, Scripts};

/// A [`Store`] in Redis or Redis Cluster, shared by any number of processes and machines.
///
/// Cloning is cheap and shares the connection. Every primitive is one round trip: `GET`, or one
/// Lua script called by its SHA that also keeps headcount's key index (see the crate README,
/// "Data layout"), so that [`Store::list`] reads only the keys under its prefix.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    config: RedisConfig,
    scripts: Scripts,
    requests: RequestIds,
    /// The subscribers of change notifications, and where their one pub/sub connection goes:
    /// `None` for a store over an application's connection manager or Cluster connection
    /// (whose address the store cannot see) and behind Sentinel (not followed across a
    /// failover yet).
    hub: NotifyHub,
    notify_target: Option<notify::Target>,
    notify_warned: Arc<WarnOnce>,
}

/// The request ids of the replay-protected scripts (`replay.lua`): this store's random base and
/// a counter, unique among the calls of every store for a minute (the ids' lifetime in Redis).
struct RequestIds {
    base: u64,
    next: AtomicU64,
}

impl RequestIds {
    fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        // A randomly keyed hasher over the time and the process id: random enough that two
        // stores (in this process or another) do not share a base.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        RequestIds {
            base: h.finish(),
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{n:x}", self.base)
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the server or Cluster named by a `redis://`, `rediss://`, `redis+cluster://`
    /// or `rediss+cluster://` URL (see the crate README) and checks that it answers. Fails with
    /// [`Error::Rejected`] for bad credentials or a server that does not speak the Redis protocol,
    /// [`Error::Unavailable`] or [`Error::Timeout`] when it cannot be reached in time.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(RedisConfig::from_url(url)?).await
    }

    /// Like [`connect`](Self::connect) with an already parsed configuration.
    pub async fn connect_with(config: RedisConfig) -> Result<Self> {
        let conn = connection::open(&config).await?;
        let target = match config.deployment() {
            Deployment::Single | Deployment::Cluster => Some(notify::Target {
                nodes: config
                    .endpoints()
                    .iter()
                    .map(|(h, p)| config.connection_info(h, *p))
                    .collect(),
                timeout: config.timeout(),
            }),
            Deployment::Sentinel => None,
        };
        Self::from_conn(conn, config, target)
    }

    /// A store over a connection manager the application already has (single server), with
    /// the default operation timeout. The manager's own reconnect settings apply.
    pub fn from_manager(manager: ConnectionManager) -> Result<Self> {
        let db = manager.get_db();
        Self::from_conn(
            Conn::Single(Arc::new(Reconnecting::new(None, manager)), db),
            RedisConfig::from_url(SINGLE_DEFAULTS)?,
            None,
        )
    }

    /// A store over a Redis Cluster connection the application already has, with the default
    /// operation timeout. Its keys must carry a `{hash tag}` (headcount's always do).
    pub fn from_cluster(conn: ClusterConnection) -> Result<Self> {
        Self::from_conn(
            Conn::Cluster(Arc::new(Reconnecting::new(None, conn))),
            RedisConfig::from_url(CLUSTER_DEFAULTS)?,
            None,
        )
    }

    /// A store over a `redis::Client` the application already has: opens a connection
    /// manager from it (with short reconnect waits, as [`connect`](Self::connect) does) and
    /// checks the server answers.
    pub async fn from_client(client: redis::Client) -> Result<Self> {
        let config = RedisConfig::from_url(SINGLE_DEFAULTS)?;
        let target = notify::Target {
            nodes: vec![client.get_connection_info().clone()],
            timeout: config.timeout(),
        };
        let conn = connection::open_client(client, &config).await?;
        Self::from_conn(conn, config, Some(target))
    }

    fn from_conn(
        conn: Conn,
        config: RedisConfig,
        notify_target: Option<notify::Target>,
    ) -> Result<Self> {
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                config,
                scripts: Scripts::new(),
                requests: RequestIds::new(),
                hub: NotifyHub::new(),
                notify_target,
                notify_warned: Arc::default(),
            }),
        })
    }

    /// The configuration this store was built from.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    fn is_cluster(&self) -> bool {
        matches!(self.inner.conn, Conn::Cluster(_))
    }

    fn is_sentinel(&self) -> bool {
        matches!(self.inner.conn, Conn::Sentinel(_))
    }

    /// Adds the keys a replay-protected write of `key` touches besides its data keys: the
    /// index of `key` (see [`RedisStore::index_for_key`]) with its quiet marker and the versions
    /// of the directories of `key` and of `also` (a key the script reads, see
    /// [`IndexKeys::declare`]) and, on Cluster, the key its answer is
    /// recorded at, in `key`'s slot (declared, so the call is redirected with the slot during a
    /// migration like every other key it touches). Returns the request id, the script's last
    /// argument: empty on a single server, whose connection manager never sends a request
    /// twice, and for a key whose slot no name of ours can share (a `}` without a hash tag);
    /// and the index added.
    fn index_and_request(
        &self,
        call: &mut ScriptInvocation<'_>,
        key: &str,
        also: Option<&str>,
    ) -> Result<(String, Option<IndexKeys>)> {
        let index = self.index_for_key(key)?;
        if let Some(index) = &index {
            index.add_to(call);
            index.declare(call, dir_of(key).into_iter().chain(also.and_then(dir_of)));
        }
        if !self.is_cluster() {
            return Ok((String::new(), index));
        }
        let id = self.inner.requests.next();
        let request_key = match tag_of(key) {
            Some(tag) => format!("{{{tag}}}{REQUEST_INFIX}{id}"),
            // An untagged key: the whole name in braces hashes like the name.
            None if !key.contains(['{', '}']) => format!("{{{key}}}{REQUEST_INFIX}{id}"),
            None => return Ok((String::new(), index)),
        };
        call.key(request_key);
        Ok((id, index))
    }

    /// Where a write of `key` is recorded: the database's index on a single server, the index of
    /// the key's hash tag on Cluster, none for an untagged key on Cluster (no index can share
    /// its slot). The index keys themselves are refused.
    fn index_for_key(&self, key: &str) -> Result<Option<IndexKeys>> {
        if is_index_name(key) {
            return Err(Error::invalid(format!(
                "{key:?} is the name of headcount's key index on Redis; pick another key"
            )));
        }
        Ok(match (self.is_cluster(), tag_of(key)) {
            (false, _) => Some(IndexKeys::database()),
            (true, Some(tag)) => Some(IndexKeys::of_tag(tag)),
            (true, None) => None,
        })
    }

    /// The index that holds every key under `prefix`. On Cluster only a prefix with a complete
    /// hash tag has one: its keys all share that tag's slot.
    fn index_for_prefix(&self, prefix: &str) -> Result<IndexKeys> {
        match (self.is_cluster(), tag_of(prefix)) {
            (false, _) => Ok(IndexKeys::database()),
            (true, Some(tag)) => Ok(IndexKeys::of_tag(tag)),
            (true, None) => Err(Error::Unsupported {
                backend: BACKEND,
                what: format!(
                    "listing a prefix without a hash tag on Redis Cluster: a listing prefix \
                     must contain one ({{...}}, as headcount's own keys hc:{{group}}: do), so \
                     that all its keys share one slot; {prefix:?} has none"
                ),
            }),
        }
    }

    /// Runs `call` on a clone of the connection within the deadline, mapping errors. `key` is
    /// the caller's key and `index` the index the call updates: Redis's `WRONGTYPE` names
    /// neither, so it is blamed on an index key that holds another type (found with `TYPE`, on
    /// this rare path only), else on `key`.
    async fn run<T, F, Fut>(
        &self,
        op: Op,
        key: Option<&str>,
        index: Option<&IndexKeys>,
        call: F,
    ) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let deadline = self.inner.config.deadline();
        let wait = self.inner.config.wait_replicas().filter(|_| writes(op));
        // Three quarters of the deadline: a `WAIT` that runs out answers how many replicas it
        // reached before the call's deadline cuts it off with less to say.
        let within = deadline.after() * 3 / 4;
        let conn = match wait {
            Some(n) => {
                let millis = u64::try_from(within.as_millis()).unwrap_or(u64::MAX);
                self.inner.conn.waiting(n, millis.max(1))
            }
            None => self.inner.conn.clone(),
        };
        let work = async {
            let e = match call(conn.clone()).await {
                Ok(v) => match wait {
                    Some(n) => {
                        return replicas_confirm(n, conn.replicas_acked(), within).map(|()| v)
                    }
                    None => return Ok(v),
                },
                Err(e) => e,
            };
            if errors::is_wrong_type(&e) {
                if let Some(foreign) = self.foreign_index(index).await {
                    return Err(foreign);
                }
                if let Some(key) = key {
                    return Err(Error::foreign(
                        key,
                        "a string (the key holds another Redis type)",
                        "another Redis type",
                    ));
                }
            }
            // Behind Sentinel a replica's READONLY means the primary changed under this
            // connection: it is dropped, and the next call asks the Sentinels again.
            if e.kind() == redis::ErrorKind::ReadOnly && self.is_sentinel() {
                return Err(Error::unavailable(
                    BACKEND,
                    format!(
                        "the server became a replica (a Sentinel failover): the next call asks \
                         the Sentinels for the new primary ({e})"
                    ),
                    e,
                ));
            }
            Err(errors::classify(
                e,
                op.name(),
                deadline,
                self.inner.config.password(),
            ))
        };
        deadline.run(op.name(), work).await
    }

    /// The error to report when an index key holds another Redis type than the sorted set
    /// headcount keeps there (written by another client): a [`Error::ForeignValue`] naming it.
    async fn foreign_index(&self, index: Option<&IndexKeys>) -> Option<Error> {
        for name in [&index?.index, &index?.expiry] {
            let mut conn = self.inner.conn.clone();
            let kind: String = redis::cmd("TYPE")
                .arg(name)
                .query_async(&mut conn)
                .await
                .ok()?;
            if kind != "zset" && kind != "none" {
                return Some(Error::foreign(
                    name,
                    "a sorted set, headcount's key index (delete the key: headcount rebuilds \
                     the index as it touches its keys)",
                    &format!("a Redis {kind}"),
                ));
            }
        }
        None
    }
}

impl RedisStore {
    /// `INCRBY` with the TTL on creation, through the incr script's rules but without the read:
    /// the Cluster fallback of `incr_and_get` for keys in different slots.
    async fn incr_by_two_calls(&self, key: &str, by: i64, ttl: Option<Duration>) -> Result<i64> {
        if by == 1 {
            return self.incr(key, ttl).await;
        }
        let script = &self.inner.scripts.incr_and_get;
        // Reading the counter itself as the second key keeps the script's single slot.
        let mut call = script.key(key);
        call.key(key);
        let (request, index) = self.index_and_request(&mut call, key, None)?;
        call.arg(by).arg(ttl_arg(ttl)).arg(request);
        let reply: Value = self
            .run(
                Op::IncrAndGet,
                Some(key),
                index.as_ref(),
                |mut c| async move { call.invoke_async(&mut c).await },
            )
            .await?;
        match reply {
            Value::Array(items) => match (items.first(), items.get(1)) {
                (Some(Value::BulkString(s)), Some(Value::Int(n))) if s == b"ok" => Ok(*n),
                _ => Err(foreign_reply(
                    key,
                    "a decimal integer that stays within an i64",
                    &items,
                )),
            },
            other => Err(unexpected(other)),
        }
    }
}

impl RedisStore {
    /// Runs a listing script (`list_body.lua` and its ending) over the prefix's range of the
    /// key index; the index keys are the script's KEYS, so on Cluster they route it to the
    /// prefix's slot.
    async fn run_listing(&self, op: Op, script: &redis::Script, prefix: &str) -> Result<Value> {
        let index = self.index_for_prefix(prefix)?;
        let mut call = script.key(&index.index);
        call.key(&index.expiry);
        index.declare(&mut call, dir_of(prefix));
        call.arg(prefix);
        self.run(op, None, Some(&index), |mut c| async move {
            call.invoke_async(&mut c).await
        })
        .await
    }
}

#[async_trait]
impl backend::Backend for RedisStore {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(BACKEND);
        caps.native_set_max = true;
        caps.native_incr_and_get = true;
        caps.native_renew_and_list = true;
        caps.native_compare_and_delete = true;
        caps.native_change_version = true;
        caps.native_renew_and_versions = true;
        caps.native_notifications = self.inner.notify_target.is_some();
        caps.ttl_reads = true;
        caps
    }

    /// Pub/sub on the store handle's one subscription connection (see the crate README,
    /// "Change notifications"). On Cluster, a directory without a hash tag keeps no version,
    /// so it is never notified: its notifications are silent.
    async fn subscribe(&self, dir: &str) -> Result<Notifications> {
        let Some(target) = &self.inner.notify_target else {
            return Ok(Notifications::never(dir));
        };
        if self.is_cluster() && tag_of(dir).is_none() {
            return Ok(Notifications::never(dir));
        }
        let warned = self.inner.notify_warned.clone();
        Ok(self
            .inner
            .hub
            .subscribe_listened(dir, |hub| notify::listen(target.clone(), hub, warned)))
    }

    async fn renew_and_list_if_changed(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dir: &str,
        since: Option<&str>,
    ) -> Result<RenewedListing> {
        let list_index = self.index_for_prefix(dir)?;
        let key_index = self.index_for_key(key)?;
        if key_index.as_ref() != Some(&list_index) {
            // Not one slot (outside headcount's naming): the provided method's two calls.
            let renewed =
                Store::compare_and_set(self, key, Some(holder), holder, Some(ttl)).await?;
            let entries = direct_entries(dir, Store::list(self, dir).await?);
            let version = listing_digest(&entries);
            let listing = (since != Some(version.as_str())).then_some(entries);
            return Ok(RenewedListing::new(renewed, version, listing));
        }
        // A heartbeat's sweep sets a quiet marker that lives until the earliest expiry score, but
        // at least this long, so a busy index is swept at most this often (see index.lua).
        let period = sweep_period(ttl);
        let mut call = self.inner.scripts.renew_check.key(key);
        list_index.add_to(&mut call);
        list_index.declare(&mut call, std::iter::once(dir).chain(dir_of(key)));
        call.arg(dir)
            .arg(holder)
            .arg(ttl_millis(ttl))
            .arg(since.unwrap_or_default())
            .arg(ttl_millis(period));
        let reply: Value = self
            .run(
                Op::RenewAndListIfChanged,
                Some(key),
                Some(&list_index),
                |mut c| async move { call.invoke_async(&mut c).await },
            )
            .await?;
        let Value::Array(mut items) = reply else {
            return Err(unexpected(reply));
        };
        match (items.first(), items.get(1)) {
            (Some(Value::Int(n)), Some(Value::BulkString(v))) => {
                let renewed = *n == 1;
                let version = String::from_utf8_lossy(v).into_owned();
                let listing = if items.len() > 2 {
                    let listed = list_reply(Value::Array(items.split_off(2)))?;
                    Some(direct_entries(dir, listed))
                } else {
                    None
                };
                Ok(RenewedListing::new(renewed, version, listing))
            }
            // `{'foreign', key, type}`, from the renewal or the listing.
            _ => Err(list_reply(Value::Array(items)).err().unwrap_or_else(|| {
                unexpected(Value::SimpleString(
                    "a version check without a version".into(),
                ))
            })),
        }
    }

    async fn renew_and_versions(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[(&str, Option<&str>)],
    ) -> Result<(bool, Vec<String>)> {
        let key_index = self.index_for_key(key)?;
        let mut index = None;
        for (dir, _) in dirs {
            let dir_index = self.index_for_prefix(dir)?;
            if key_index.as_ref() != Some(&dir_index) {
                index = None;
                break;
            }
            index = Some(dir_index);
        }
        let Some(index) = index else {
            // Not one slot (outside headcount's naming): one call per directory.
            return versions_one_by_one(self, key, holder, ttl, dirs).await;
        };
        let period = sweep_period(ttl);
        let mut call = self.inner.scripts.renew_versions.key(key);
        index.add_to(&mut call);
        index.declare(&mut call, dirs.iter().map(|(d, _)| *d).chain(dir_of(key)));
        call.arg(holder)
            .arg(ttl_millis(ttl))
            .arg(ttl_millis(period));
        for (dir, _) in dirs {
            call.arg(*dir);
        }
        let reply: Value = self
            .run(
                Op::RenewAndVersions,
                Some(key),
                Some(&index),
                |mut c| async move { call.invoke_async(&mut c).await },
            )
            .await?;
        let Value::Array(items) = reply else {
            return Err(unexpected(reply));
        };
        match items.first() {
            Some(Value::Int(n)) if items.len() == dirs.len() + 1 => {
                let versions = items[1..]
                    .iter()
                    .map(|v| match v {
                        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
                        other => Err(unexpected(other.clone())),
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok((*n == 1, versions))
            }
            // `{'foreign', key, type}`, from the renewal.
            _ => Err(list_reply(Value::Array(items)).err().unwrap_or_else(|| {
                unexpected(Value::SimpleString(
                    "a renewal without one version per directory".into(),
                ))
            })),
        }
    }

    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        // Both checked before anything is renewed: a prefix Cluster cannot list, an index name.
        let list_index = self.index_for_prefix(prefix)?;
        let key_index = self.index_for_key(key)?;
        if key_index.as_ref() != Some(&list_index) {
            // A script may only touch one hash slot on Cluster. A group's slot keys and its
            // prefix share the `{group}` tag, so this only happens outside headcount's naming:
            // two calls, the renewal and then the listing, not atomic together.
            let renewed =
                Store::compare_and_set(self, key, Some(holder), holder, Some(ttl)).await?;
            return Ok((renewed, Store::list(self, prefix).await?));
        }
        let script = &self.inner.scripts.renew_and_list;
        let mut call = script.key(key);
        list_index.add_to(&mut call);
        list_index.declare(&mut call, dir_of(key).into_iter().chain(dir_of(prefix)));
        call.arg(prefix).arg(holder).arg(ttl_millis(ttl));
        let reply: Value = self
            .run(
                Op::RenewAndList,
                Some(key),
                Some(&list_index),
                |mut c| async move { call.invoke_async(&mut c).await },
            )
            .await?;
        let Value::Array(mut items) = reply else {
            return Err(unexpected(reply));
        };
        match items.first() {
            Some(Value::Int(n)) => {
                let renewed = *n == 1;
                items.remove(0);
                Ok((renewed, list_reply(Value::Array(items))?))
            }
            // `{'foreign', key, type}`, from the renewal or the listing.
            _ => Err(list_reply(Value::Array(items)).err().unwrap_or_else(|| {
                unexpected(Value::SimpleString("a listing without renewal flag".into()))
            })),
        }
    }

    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> Result<(i64, Option<String>)> {
        if self.is_cluster() && hash_tag(incr_key) != hash_tag(get_key) {
            // A script may only touch one hash slot on Cluster. Keys of one group share their
            // `{group}` tag, so this only happens for keys outside headcount's naming: two calls,
            // not atomic together.
            let n = self.incr_by_two_calls(incr_key, by, ttl).await?;
            return Ok((n, Store::get(self, get_key).await?));
        }
        let script = &self.inner.scripts.incr_and_get;
        let mut call = script.key(incr_key);
        call.key(get_key);
        let (request, index) = self.index_and_request(&mut call, incr_key, Some(get_key))?;
        call.arg(by).arg(ttl_arg(ttl)).arg(request);
        let reply: Value = self
            .run(
                Op::IncrAndGet,
                Some(incr_key),
                index.as_ref(),
                |mut c| async move { call.invoke_async(&mut c).await },
            )
            .await?;
        let Value::Array(items) = reply else {
            return Err(unexpected(reply));
        };
        match (items.first(), items.get(1)) {
            (Some(Value::BulkString(s)), Some(Value::Int(n))) if s == b"ok" => {
                let read = match items.get(2) {
                    None | Some(Value::Nil) => None,
                    Some(Value::BulkString(b)) => {
                        Some(String::from_utf8(b.clone()).map_err(|_| {
                            Error::foreign(get_key, "a UTF-8 value", "bytes that are not UTF-8")
                        })?)
                    }
                    Some(other) => return Err(unexpected(other.clone())),
                };
                Ok((*n, read))
            }
            (Some(Value::BulkString(s)), Some(_)) if s == b"foreign" => Err(foreign_reply(
                incr_key,
                "a decimal integer that stays within an i64",
                &items,
            )),
            (Some(Value::BulkString(s)), Some(_)) if s == b"foreign-read" => Err(foreign_reply(
                get_key,
                "a string (the key holds another Redis type)",
                &items,
            )),
            _ => Err(unexpected(Value::Array(items))),
        }
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        let mut call = self.inner.scripts.incr.key(key);
        let (request, index) = self.index_and_request(&mut call, key, None)?;
        call.arg(ttl_arg(ttl)).arg(request);
        let reply: Value = self
            .run(Op::Incr, Some(key), index.as_ref(), |mut c| async move {
                call.invoke_async(&mut c).await
            })
            .await?;
        let Value::Array(items) = reply else {
            return Err(unexpected(reply));
        };
        match (items.first(), items.get(1)) {
            (Some(Value::BulkString(s)), Some(Value::Int(n))) if s == b"ok" => Ok(*n),
            (Some(Value::BulkString(s)), Some(_)) if s == b"foreign" => Err(foreign_reply(
                key,
                "a decimal integer that fits (and, for incr, stays within) an i64",
                &items,
            )),
            _ => Err(unexpected(Value::Array(items))),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        let bytes: Option<Vec<u8>> = self
            .run(Op::Get, Some(key), None, |mut c| async move {
                redis::cmd("GET").arg(key).query_async(&mut c).await
            })
            .await?;
        bytes
            .map(|b| {
                String::from_utf8(b)
                    .map_err(|_| Error::foreign(key, "a UTF-8 value", "bytes that are not UTF-8"))
            })
            .transpose()
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        let mut call = self.inner.scripts.expire.key(key);
        let index = self.index_for_key(key)?;
        if let Some(index) = &index {
            index.add_to(&mut call);
            index.declare(&mut call, dir_of(key));
        }
        call.arg(ttl_millis(ttl));
        let n: i64 = self
            .run(Op::Expire, Some(key), index.as_ref(), |mut c| async move {
                call.invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        let mut call = self.inner.scripts.cas.key(key);
        let (request, index) = self.index_and_request(&mut call, key, None)?;
        call.arg(expected.unwrap_or_default())
            .arg(new)
            .arg(ttl_arg(ttl))
            .arg(if expected.is_none() { "1" } else { "0" })
            .arg(request);
        let reply: Value = self
            .run(
                Op::CompareAndSet,
                Some(key),
                index.as_ref(),
                |mut c| async move { call.invoke_async(&mut c).await },
            )
            .await?;
        written_or_foreign(key, "a string (the key holds another Redis type)", reply)
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let mut call = self.inner.scripts.delete.key(key);
        let (request, index) = self.index_and_request(&mut call, key, None)?;
        call.arg(request);
        let n: i64 = self
            .run(Op::Delete, Some(key), index.as_ref(), |mut c| async move {
                call.invoke_async(&mut c).await
            })
            .await?;
        Ok(n > 0)
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        let mut call = self.inner.scripts.compare_and_delete.key(key);
        let (request, index) = self.index_and_request(&mut call, key, None)?;
        call.arg(expected).arg(request);
        let reply: Value = self
            .run(
                Op::CompareAndDelete,
                Some(key),
                index.as_ref(),
                |mut c| async move { call.invoke_async(&mut c).await },
            )
            .await?;
        written_or_foreign(key, "a string (the key holds another Redis type)", reply)
    }

    /// Reads the prefix's range of the key index (see the crate README): O(log N + M) for M keys
    /// under the prefix, whatever else the database holds. Lists the keys written through
    /// headcount only.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let script = &self.inner.scripts.list;
        list_reply(self.run_listing(Op::List, script, prefix).await?)
    }

    /// The listing of [`list`](backend::Backend::list) and, in the same script, each listed key's `PTTL`:
    /// one round trip, read at one instant of the server's clock.
    async fn list_with_ttl(&self, prefix: &str) -> Result<Vec<(String, String, Option<Duration>)>> {
        let script = &self.inner.scripts.list_with_ttl;
        list_with_ttl_reply(self.run_listing(Op::ListWithTtl, script, prefix).await?)
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        let mut call = self.inner.scripts.set_max.key(key);
        let (request, index) = self.index_and_request(&mut call, key, None)?;
        call.arg(value).arg(ttl_arg(ttl)).arg(request);
        let reply: Value = self
            .run(Op::SetMax, Some(key), index.as_ref(), |mut c| async move {
                call.invoke_async(&mut c).await
            })
            .await?;
        written_or_foreign(key, "a decimal integer", reply)
    }

    /// Durable only with `appendonly yes` and `appendfsync always` (on every primary of a
    /// Cluster): then Redis fsyncs the AOF before it replies. A server that refuses `CONFIG GET`
    /// (disabled or renamed, an ACL without `+config`) cannot tell, and answers not durable.
    /// A `maxmemory` limit with an evicting `maxmemory-policy` is reported in
    /// [`Durability::evicts`].
    async fn durability(&self) -> Result<Durability> {
        let mut config = redis::cmd("CONFIG");
        config
            .arg("GET")
            .arg("append*")
            .arg("maxmemory-policy")
            .arg("maxmemory");
        let settings = match self.on_every_primary(config, true).await {
            Ok(value) => durability_of(&value),
            Err(e) if e.is_retryable() => return Err(e),
            Err(e) => Durability::not_durable(format!(
                "cannot read appendonly/appendfsync with CONFIG GET (disabled, renamed or not permitted?): {e}"
            )),
        };
        // Read even when the settings already fail: it also names the data set
        // (`master_replid`), which majority IDs compare across stores.
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        match self.on_every_primary(info, false).await {
            Ok(value) => {
                let servers = replication_ids(&value);
                let mut d = if settings.durable {
                    replication_of(&value, settings)
                } else {
                    settings
                };
                if self.is_sentinel() {
                    d.durable = false;
                    d.detail.push_str(&format!(
                        "; behind Redis Sentinel (master `{}`): a failover promotes a replica, \
                         and Redis replicates asynchronously, so the new primary can lack \
                         writes the old one acknowledged",
                        self.inner.config.master_name().unwrap_or_default()
                    ));
                }
                Ok(d.with_servers(servers))
            }
            Err(e) if e.is_retryable() => Err(e),
            Err(_) if !settings.durable => Ok(settings),
            Err(e) => Ok(Durability::not_durable(format!(
                "cannot read INFO replication (disabled, renamed or not permitted?): {e}"
            ))),
        }
    }
}

impl RedisStore {
    /// Runs `cmd` on the server, or on every primary of a Cluster (their replies combined into
    /// one array when `arrays`, else as the client returns them).
    async fn on_every_primary(&self, cmd: redis::Cmd, arrays: bool) -> Result<Value> {
        self.run(Op::Durability, None, None, |c| async move {
            match c {
                Conn::Cluster(c) => {
                    let policy = arrays.then_some(ResponsePolicy::CombineArrays);
                    c.run(|mut conn| async move {
                        conn.route_command(
                            &cmd,
                            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, policy)),
                        )
                        .await
                    })
                    .await
                }
                mut c @ (Conn::Single(..) | Conn::Sentinel(_) | Conn::Waiting(_)) => {
                    cmd.query_async(&mut c).await
                }
            }
        })
        .await
    }
}

/// Whether the answer of the `WAIT n` sent after a write, in the same request on the same
/// connection ([`Conn::waiting`]), says that `n` replicas hold every write the connection
/// made until then, the write included. Fewer is an [`Error::Unavailable`]: the write is on
/// the primary but may not survive a failover, so the caller must not count on it (a
/// renewal not confirmed lets the lease run out, as a lost answer would). `None`: the call
/// sent no command, so it wrote nothing; `within` is how long the `WAIT` waited at most.
fn replicas_confirm(n: u32, acked: Option<Value>, within: Duration) -> Result<()> {
    let answer = match acked {
        None => return Ok(()),
        Some(Value::Int(acked)) if acked >= i64::from(n) => return Ok(()),
        Some(Value::Int(acked)) => format!("reached {acked} of the {n} replicas"),
        Some(other) => format!("was not confirmed by replicas (`WAIT` answered {other:?})"),
    };
    Err(Error::Unavailable {
        backend: BACKEND,
        message: format!(
            "the write {answer} `wait_replicas` asks for within {within:?}: it is on the \
             primary but may not survive a failover"
        ),
        source: None,
    })
}

/// Whether `op` writes (so `wait_replicas` waits for the replicas after it).
fn writes(op: Op) -> bool {
    !matches!(op, Op::Get | Op::List | Op::ListWithTtl | Op::Durability)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn the_defaults_of_stores_over_a_client_parse() {
        assert!(RedisConfig::from_url(SINGLE_DEFAULTS).is_ok());
        assert!(RedisConfig::from_url(CLUSTER_DEFAULTS).is_ok());
    }

    #[tokio::test]
    async fn a_server_of_another_protocol_is_rejected_quickly() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        // Answers like an HTTP server (etcd's port does): a status line, then closes.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let serve = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buf = [0u8; 256];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    .await;
            }
        });
        let started = std::time::Instant::now();
        let err = RedisStore::connect(&format!("redis://127.0.0.1:{port}?timeout=3s"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Rejected { .. }),
            "expected Rejected, got {err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        serve.abort();
    }

    /// Reads one command (a RESP array of bulk strings) from `buf`, returning its words and
    /// how many bytes it took; `None` until it is whole.
    fn parse_command(buf: &[u8]) -> Option<(Vec<String>, usize)> {
        fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
            let end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
            Some((&buf[at..end], end + 2))
        }
        let (head, mut at) = line(buf, 0)?;
        let n: usize = std::str::from_utf8(head.strip_prefix(b"*")?)
            .ok()?
            .parse()
            .ok()?;
        let mut words = Vec::with_capacity(n);
        for _ in 0..n {
            let (len, next) = line(buf, at)?;
            let len: usize = std::str::from_utf8(len.strip_prefix(b"$")?)
                .ok()?
                .parse()
                .ok()?;
            if buf.len() < next + len + 2 {
                return None;
            }
            words.push(String::from_utf8_lossy(&buf[next..next + len]).into_owned());
            at = next + len + 2;
        }
        Some((words, at))
    }

    /// `wait_replicas`: a write's `WAIT` goes with it on its connection, even when a call cut
    /// short by its caller replaces the connection while the write is under way. A server that
    /// answers as Redis does: a script's answer after 60 ms, `WAIT` with 0 replicas on a
    /// connection that wrote (the replica lags) and with 1 on one that did not (every
    /// connected replica holds its nothing), a `GET` never. Sent apart, the `WAIT` went on the
    /// fresh connection and confirmed the write.
    #[tokio::test]
    async fn a_write_and_its_wait_share_one_connection() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let serve = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut buf, mut wrote) = (Vec::new(), false);
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Ok(n) = socket.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some((words, used)) = parse_command(&buf) {
                            buf.drain(..used);
                            let reply: &[u8] = match words[0].to_ascii_uppercase().as_str() {
                                "PING" => b"+PONG\r\n",
                                "EVALSHA" | "EVAL" => {
                                    tokio::time::sleep(Duration::from_millis(60)).await;
                                    wrote = true;
                                    b"*2\r\n$2\r\nok\r\n:1\r\n"
                                }
                                "WAIT" if wrote => b":0\r\n",
                                "WAIT" => b":1\r\n",
                                "GET" => std::future::pending().await,
                                _ => b"+OK\r\n",
                            };
                            if socket.write_all(reply).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        let url = format!("redis://127.0.0.1:{port}?timeout=2s&wait_replicas=1");
        let store = RedisStore::connect(&url).await.unwrap();
        let write = store.incr("hc:{w}:n", None);
        let cut_short = async {
            // Sent while the write waits for its answer, then given up by its caller: the
            // connection is replaced.
            tokio::time::sleep(Duration::from_millis(10)).await;
            let _ = tokio::time::timeout(Duration::from_millis(20), store.get("hc:{w}:n")).await;
        };
        let (written, ()) = tokio::join!(write, cut_short);
        let err = written.expect_err("a write the replica lacks was confirmed");
        assert!(
            matches!(err, Error::Unavailable { .. }) && err.to_string().contains("0 of the 1"),
            "{err:?}"
        );
        serve.abort();
    }
}
