#![doc = include_str!("../README.md")]

mod config;
mod errors;
mod fence;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use headcount_core::backend::{
    self, direct_entries, listing_digest, ttl_millis, versions_one_by_one,
};
use headcount_core::{Capabilities, Durability, Error, RenewedListing, Result, Store};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Script, ScriptInvocation, Value};

pub use config::{RedisConfig, Topology, DEFAULT_PORT};
use errors::BACKEND;

pub use fence::RedisFence;
/// The client crate of [`RedisStore::from_client`] and [`RedisStore::from_manager`],
/// re-exported so an application names the same version.
pub use redis;

/// The Lua sources, kept as files next to this one. Every script that writes or lists keys starts
/// with `local D = <its number of data keys>`, `local REPLAY = <whether it is replay-protected>`
/// and `index.lua` (the key index: the data keys come first in `KEYS`, then the two index keys,
/// when the key has an index, then the request key of a replay-protected call on Cluster).
macro_rules! indexed {
    (@replay $replay:literal, $data_keys:literal, $($part:expr),+ $(,)?) => {
        concat!(
            "local D = ",
            $data_keys,
            "\nlocal REPLAY = ",
            $replay,
            "\n",
            include_str!("scripts/index.lua"),
            $($part),+
        )
    };
    ($data_keys:literal, $($part:expr),+ $(,)?) => {
        indexed!(@replay "false", $data_keys, $($part),+)
    };
}
/// A write script whose repeat must not apply twice (see `replay.lua`): its body runs as a
/// function, after which the answer is recorded under the call's request id (its last argument)
/// at the request key (its last key), both from [`RedisStore::index_and_request`].
macro_rules! replayable {
    ($data_keys:literal, $body:expr) => {
        indexed!(
            @replay "true",
            $data_keys,
            "local function body()\n",
            $body,
            include_str!("scripts/replay.lua")
        )
    };
}

const INCR_LUA: &str = replayable!(1, include_str!("scripts/incr.lua"));
const CAS_LUA: &str = replayable!(1, include_str!("scripts/cas.lua"));
const SET_MAX_LUA: &str = replayable!(1, include_str!("scripts/set_max.lua"));
const EXPIRE_LUA: &str = indexed!(1, include_str!("scripts/expire.lua"));
const DELETE_LUA: &str = replayable!(1, include_str!("scripts/delete.lua"));
const COMPARE_AND_DELETE_LUA: &str = replayable!(1, include_str!("scripts/compare_and_delete.lua"));
/// `list` and `renew_and_list` share the listing (`list_body.lua` builds `out`); each adds its
/// own ending, and `renew_and_list` its renewal in front.
const LIST_LUA: &str = indexed!(0, include_str!("scripts/list_body.lua"), "return out\n");
const RENEW_AND_LIST_LUA: &str = indexed!(
    1,
    include_str!("scripts/renew_head.lua"),
    include_str!("scripts/list_body.lua"),
    "settle()\ntable.insert(out, 1, renewed)\nreturn out\n"
);
const INCR_AND_GET_LUA: &str = replayable!(2, include_str!("scripts/incr_and_get.lua"));
/// `renew_and_list_if_changed`: the renewal and version check, then (when the version changed)
/// the shared listing.
const RENEW_CHECK_LUA: &str = indexed!(
    1,
    include_str!("scripts/renew_check.lua"),
    include_str!("scripts/list_body.lua"),
    "table.insert(out, 1, version)\ntable.insert(out, 1, renewed)\nreturn out\n"
);
/// `renew_and_versions`: the renewal and the versions of several directories, no listing.
const RENEW_VERSIONS_LUA: &str = indexed!(1, include_str!("scripts/renew_versions.lua"));

/// The index of every key on a single server.
const INDEX_KEY: &str = "headcount:index";
/// The expiry index of every key on a single server.
const EXPIRY_KEY: &str = "headcount:expiry";
/// What follows `{tag}` in the name of the index of the keys with hash tag `tag`.
const INDEX_SUFFIX: &str = ":headcount:index";
/// What follows `{tag}` in the name of the expiry index of the keys with hash tag `tag`.
const EXPIRY_SUFFIX: &str = ":headcount:expiry";
/// What follows `{tag}` in the name of a recorded answer of a replay-protected call on Cluster,
/// before the call's request id (`replay.lua`).
const REQUEST_INFIX: &str = ":headcount:req:";

/// The two sorted sets that record the keys headcount wrote in one hash slot (see the crate
/// README, "Data layout").
#[derive(Debug, Clone, PartialEq, Eq)]
struct IndexKeys {
    index: String,
    expiry: String,
}

impl IndexKeys {
    fn database() -> Self {
        IndexKeys {
            index: INDEX_KEY.to_owned(),
            expiry: EXPIRY_KEY.to_owned(),
        }
    }

    /// The index of the keys with hash tag `tag`: `{tag}:headcount:index`, in their slot.
    fn of_tag(tag: &str) -> Self {
        IndexKeys {
            index: format!("{{{tag}}}{INDEX_SUFFIX}"),
            expiry: format!("{{{tag}}}{EXPIRY_SUFFIX}"),
        }
    }

    /// Appends the two index keys to a script's `KEYS`, after its data keys.
    fn add_to(&self, call: &mut ScriptInvocation<'_>) {
        call.key(&self.index).key(&self.expiry);
    }
}

/// The shortest life of the quiet marker a heartbeat's sweep sets (index.lua): an index is swept
/// at most this often, and an expiry is noticed at most this long after it comes due (plus the
/// time to the next heartbeat of any member).
fn sweep_period(ttl: Duration) -> Duration {
    (ttl / 12).clamp(Duration::from_millis(10), Duration::from_millis(500))
}

/// Whether `key` is the name of an index (of either topology): headcount never writes there
/// through the `Store` API, or the index would be overwritten.
fn is_index_name(key: &str) -> bool {
    // The index, the expiry index, the quiet marker (and the sweep marker of earlier versions)
    // and the directory versions (index.lua), and the answers recorded against repeated
    // requests (replay.lua).
    let reserved = |rest: &str| {
        rest == "index"
            || rest == "expiry"
            || rest == "quiet"
            || rest == "swept"
            || rest.starts_with("version:")
            || rest.starts_with("req:")
    };
    if let Some(rest) = key.strip_prefix("headcount:") {
        return reserved(rest);
    }
    match key.strip_prefix('{').and_then(|r| r.split_once('}')) {
        Some((tag, rest)) if !tag.is_empty() => {
            rest.strip_prefix(":headcount:").is_some_and(reserved)
        }
        _ => false,
    }
}

/// The loaded scripts. `Script` sends `EVALSHA` and, on `NOSCRIPT` (a restarted or flushed
/// server, a new Cluster node), loads the script and retries once.
struct Scripts {
    incr: Script,
    cas: Script,
    set_max: Script,
    expire: Script,
    delete: Script,
    compare_and_delete: Script,
    list: Script,
    incr_and_get: Script,
    renew_and_list: Script,
    renew_check: Script,
    renew_versions: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            incr: Script::new(INCR_LUA),
            cas: Script::new(CAS_LUA),
            set_max: Script::new(SET_MAX_LUA),
            expire: Script::new(EXPIRE_LUA),
            delete: Script::new(DELETE_LUA),
            compare_and_delete: Script::new(COMPARE_AND_DELETE_LUA),
            list: Script::new(LIST_LUA),
            incr_and_get: Script::new(INCR_AND_GET_LUA),
            renew_and_list: Script::new(RENEW_AND_LIST_LUA),
            renew_check: Script::new(RENEW_CHECK_LUA),
            renew_versions: Script::new(RENEW_VERSIONS_LUA),
        }
    }
}

/// The placeholder URLs of the stores over an application's client: only their default
/// options are used.
const SINGLE_DEFAULTS: &str = "redis://localhost";
const CLUSTER_DEFAULTS: &str = "redis+cluster://localhost:6379";

/// A connection to a single server or to a Cluster. Both reconnect by themselves: the
/// `ConnectionManager` replaces a broken connection on the next call, the Cluster connection
/// re-resolves its slot map and reconnects to nodes as needed.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

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
        let timeout = config.timeout();
        let deadline = config.deadline();
        let password = config.password().map(str::to_owned);
        let classify =
            |e: RedisError| errors::classify(e, "connect", deadline, password.as_deref());
        let work = async {
            let conn = match config.topology() {
                Topology::Single => {
                    let (host, port) = config
                        .endpoints()
                        .first()
                        .cloned()
                        .ok_or_else(|| Error::config("invalid Redis URL: no host"))?;
                    let client = redis::Client::open(config.connection_info(&host, port))
                        .map_err(classify)?;
                    // One retry with short waits: the manager reconnects on the next call
                    // anyway, and a call must not wait out a long backoff.
                    let manager_config = ConnectionManagerConfig::new()
                        .set_connection_timeout(timeout)
                        .set_response_timeout(timeout)
                        .set_number_of_retries(1)
                        .set_factor(10)
                        .set_max_delay(100);
                    // A Redis server answers a PING on a fresh connection. One that drops the
                    // connection twice in a row, without a RESP reply, is almost certainly no
                    // Redis: a gRPC server such as etcd resets a connection that does not start
                    // with the HTTP/2 preface.
                    let mut dropped = 0;
                    let manager = loop {
                        let opened = async {
                            let mut manager = ConnectionManager::new_with_config(
                                client.clone(),
                                manager_config.clone(),
                            )
                            .await?;
                            // Nothing is sent while connecting without credentials: the PING
                            // proves the other end speaks RESP.
                            redis::cmd("PING").query_async::<()>(&mut manager).await?;
                            Ok::<_, RedisError>(manager)
                        }
                        .await;
                        match opened {
                            Ok(manager) => break manager,
                            Err(e) if e.is_connection_dropped() && dropped == 0 => dropped += 1,
                            Err(e) if e.is_connection_dropped() => {
                                return Err(Error::rejected(
                                    BACKEND,
                                    "the server closed the connection twice without a RESP \
                                     reply: is this the port of a Redis server?",
                                    e,
                                ))
                            }
                            Err(e) => return Err(classify(e)),
                        }
                    };
                    Conn::Single(manager)
                }
                Topology::Cluster => {
                    let nodes: Vec<_> = config
                        .endpoints()
                        .iter()
                        .map(|(h, p)| config.connection_info(h, *p))
                        .collect();
                    let mut builder = ClusterClientBuilder::new(nodes)
                        .connection_timeout(timeout)
                        .response_timeout(timeout)
                        .retries(2)
                        .min_retry_wait(10)
                        .max_retry_wait(200);
                    if let Some(user) = config.username() {
                        builder = builder.username(user.to_owned());
                    }
                    if let Some(p) = config.password() {
                        builder = builder.password(p.to_owned());
                    }
                    let client = builder.build().map_err(classify)?;
                    let mut conn = client.get_async_connection().await.map_err(classify)?;
                    redis::cmd("PING")
                        .query_async::<()>(&mut conn)
                        .await
                        .map_err(classify)?;
                    Conn::Cluster(conn)
                }
            };
            Ok::<_, Error>(conn)
        };
        let conn = deadline.run("connect", work).await?;
        Self::from_conn(conn, config)
    }

    /// A store over a connection manager the application already has (single server), with
    /// the default operation timeout. The manager's own reconnect settings apply.
    pub fn from_manager(manager: ConnectionManager) -> Result<Self> {
        Self::from_conn(
            Conn::Single(manager),
            RedisConfig::from_url(SINGLE_DEFAULTS)?,
        )
    }

    /// A store over a Redis Cluster connection the application already has, with the default
    /// operation timeout. Its keys must carry a `{hash tag}` (headcount's always do).
    pub fn from_cluster(conn: ClusterConnection) -> Result<Self> {
        Self::from_conn(
            Conn::Cluster(conn),
            RedisConfig::from_url(CLUSTER_DEFAULTS)?,
        )
    }

    /// A store over a `redis::Client` the application already has: opens a connection
    /// manager from it (with short reconnect waits, as [`connect`](Self::connect) does) and
    /// checks the server answers.
    pub async fn from_client(client: redis::Client) -> Result<Self> {
        let config = RedisConfig::from_url(SINGLE_DEFAULTS)?;
        let timeout = config.timeout();
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout)
            .set_number_of_retries(1)
            .set_factor(10)
            .set_max_delay(100);
        let deadline = config.deadline();
        let open = async {
            let mut manager = ConnectionManager::new_with_config(client, manager_config).await?;
            redis::cmd("PING").query_async::<()>(&mut manager).await?;
            Ok::<_, RedisError>(manager)
        };
        let manager = deadline
            .run("connect", async {
                open.await
                    .map_err(|e| errors::classify(e, "connect", deadline, None))
            })
            .await?;
        Self::from_conn(Conn::Single(manager), config)
    }

    fn from_conn(conn: Conn, config: RedisConfig) -> Result<Self> {
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                config,
                scripts: Scripts::new(),
                requests: RequestIds::new(),
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

    /// Adds the keys a replay-protected write of `key` touches besides its data keys: the
    /// index of `key` (see [`RedisStore::index_for_key`]) and, on Cluster, the key its answer is
    /// recorded at, in `key`'s slot (declared, so the call is redirected with the slot during a
    /// migration like every other key it touches). Returns the request id, the script's last
    /// argument: empty on a single server, whose connection manager never sends a request
    /// twice, and for a key whose slot no name of ours can share (a `}` without a hash tag).
    fn index_and_request(&self, call: &mut ScriptInvocation<'_>, key: &str) -> Result<String> {
        if let Some(index) = self.index_for_key(key)? {
            index.add_to(call);
        }
        if !self.is_cluster() {
            return Ok(String::new());
        }
        let id = self.inner.requests.next();
        let request_key = match tag_of(key) {
            Some(tag) => format!("{{{tag}}}{REQUEST_INFIX}{id}"),
            // An untagged key: the whole name in braces hashes like the name.
            None if !key.contains(['{', '}']) => format!("{{{key}}}{REQUEST_INFIX}{id}"),
            None => return Ok(String::new()),
        };
        call.key(request_key);
        Ok(id)
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
            (true, None) => Err(Error::invalid(format!(
                "on Redis Cluster a listing prefix must contain a hash tag ({{...}}, as \
                 headcount's own keys hc:{{group}}: do), so that all its keys share one slot; \
                 {prefix:?} has none"
            ))),
        }
    }

    /// Runs `call` on a clone of the connection within the deadline, mapping errors.
    async fn run<T, F, Fut>(&self, op: &'static str, key: Option<&str>, call: F) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let deadline = self.inner.config.deadline();
        let work = async {
            call(self.inner.conn.clone()).await.map_err(|e| match key {
                Some(key) if errors::is_wrong_type(&e) => Error::foreign(
                    key,
                    "a string (the key holds another Redis type)",
                    "another Redis type",
                ),
                _ => errors::classify(e, op, deadline, self.inner.config.password()),
            })
        };
        deadline.run(op, work).await
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
        let request = self.index_and_request(&mut call, key)?;
        call.arg(by).arg(ttl_arg(ttl)).arg(request);
        let reply: Value = self
            .run("incr_and_get", Some(key), |mut c| async move {
                call.invoke_async(&mut c).await
            })
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

/// The TTL argument of a script: milliseconds, or empty for none.
fn ttl_arg(ttl: Option<Duration>) -> String {
    ttl.map(|t| ttl_millis(t).to_string()).unwrap_or_default()
}

/// The reply of a script that returns `1`, `0` or `{'foreign', what}`.
fn written_or_foreign(key: &str, expected: &'static str, reply: Value) -> Result<bool> {
    match reply {
        Value::Int(n) => Ok(n == 1),
        Value::Array(items) => Err(foreign_reply(key, expected, &items)),
        other => Err(unexpected(other)),
    }
}

fn foreign_reply(key: &str, expected: &'static str, items: &[Value]) -> Error {
    let found = items.get(1).map(text).unwrap_or_default();
    Error::foreign(key, expected, &found)
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

fn unexpected(v: Value) -> Error {
    Error::Rejected {
        backend: BACKEND,
        message: format!("unexpected reply from the server: {v:?}"),
        source: None,
    }
}

/// The hash tag of a key or prefix under Redis Cluster's rule: the text between the first `{`
/// and the first `}` after it, when not empty. Every key that starts with a prefix holding a
/// tag has that same tag, so the prefix pins one slot.
fn tag_of(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// The part of a key Redis Cluster hashes: its hash tag, else the whole key.
fn hash_tag(key: &str) -> &str {
    tag_of(key).unwrap_or(key)
}

/// Parses the reply of the list script into sorted pairs.
fn list_reply(reply: Value) -> Result<Vec<(String, String)>> {
    let Value::Array(items) = reply else {
        return Err(unexpected(reply));
    };
    let mut pairs = Vec::with_capacity(items.len() / 2);
    let mut rest = items.into_iter();
    match rest.next() {
        Some(Value::BulkString(s)) if s == b"ok" => {}
        Some(Value::BulkString(s)) if s == b"foreign" => {
            let key = rest.next().map(|v| text(&v)).unwrap_or_default();
            return Err(Error::foreign(
                &key,
                "a string (the key holds another Redis type)",
                &rest.next().map(|v| text(&v)).unwrap_or_default(),
            ));
        }
        other => return Err(unexpected(other.unwrap_or(Value::Nil))),
    }
    while let (Some(k), Some(v)) = (rest.next(), rest.next()) {
        let (Value::BulkString(k), Value::BulkString(v)) = (k, v) else {
            return Err(Error::Rejected {
                backend: BACKEND,
                message: "unexpected reply from the list script".into(),
                source: None,
            });
        };
        let key = String::from_utf8(k).map_err(|e| {
            Error::foreign(
                &String::from_utf8_lossy(e.as_bytes()),
                "a UTF-8 key",
                "bytes that are not UTF-8",
            )
        })?;
        let value = String::from_utf8(v)
            .map_err(|_| Error::foreign(&key, "a UTF-8 value", "bytes that are not UTF-8"))?;
        pairs.push((key, value));
    }
    // The index answers in key order already; sorting keeps the contract whatever the reply.
    pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(pairs)
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
        caps
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
        call.arg(dir)
            .arg(holder)
            .arg(ttl_millis(ttl))
            .arg(since.unwrap_or_default())
            .arg(ttl_millis(period));
        let reply: Value = self
            .run("renew_and_list_if_changed", Some(key), |mut c| async move {
                call.invoke_async(&mut c).await
            })
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
        call.arg(holder)
            .arg(ttl_millis(ttl))
            .arg(ttl_millis(period));
        for (dir, _) in dirs {
            call.arg(*dir);
        }
        let reply: Value = self
            .run("renew_and_versions", Some(key), |mut c| async move {
                call.invoke_async(&mut c).await
            })
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
        call.arg(prefix).arg(holder).arg(ttl_millis(ttl));
        let reply: Value = self
            .run("renew_and_list", Some(key), |mut c| async move {
                call.invoke_async(&mut c).await
            })
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
        let request = self.index_and_request(&mut call, incr_key)?;
        call.arg(by).arg(ttl_arg(ttl)).arg(request);
        let reply: Value = self
            .run("incr_and_get", Some(incr_key), |mut c| async move {
                call.invoke_async(&mut c).await
            })
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
        let request = self.index_and_request(&mut call, key)?;
        call.arg(ttl_arg(ttl)).arg(request);
        let reply: Value = self
            .run("incr", Some(key), |mut c| async move {
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
            .run("get", Some(key), |mut c| async move {
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
        if let Some(index) = self.index_for_key(key)? {
            index.add_to(&mut call);
        }
        call.arg(ttl_millis(ttl));
        let n: i64 = self
            .run("expire", Some(key), |mut c| async move {
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
        let request = self.index_and_request(&mut call, key)?;
        call.arg(expected.unwrap_or_default())
            .arg(new)
            .arg(ttl_arg(ttl))
            .arg(if expected.is_none() { "1" } else { "0" })
            .arg(request);
        let reply: Value = self
            .run("compare_and_set", Some(key), |mut c| async move {
                call.invoke_async(&mut c).await
            })
            .await?;
        written_or_foreign(key, "a string (the key holds another Redis type)", reply)
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let mut call = self.inner.scripts.delete.key(key);
        let request = self.index_and_request(&mut call, key)?;
        call.arg(request);
        let n: i64 = self
            .run("delete", Some(key), |mut c| async move {
                call.invoke_async(&mut c).await
            })
            .await?;
        Ok(n > 0)
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        let mut call = self.inner.scripts.compare_and_delete.key(key);
        let request = self.index_and_request(&mut call, key)?;
        call.arg(expected).arg(request);
        let reply: Value = self
            .run("compare_and_delete", Some(key), |mut c| async move {
                call.invoke_async(&mut c).await
            })
            .await?;
        written_or_foreign(key, "a string (the key holds another Redis type)", reply)
    }

    /// Reads the prefix's range of the key index (see the crate README): O(log N + M) for M keys
    /// under the prefix, whatever else the database holds. Lists the keys written through
    /// headcount only.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let index = self.index_for_prefix(prefix)?;
        // The index keys are the script's KEYS: on Cluster they route it to the prefix's slot.
        let mut call = self.inner.scripts.list.key(&index.index);
        call.key(&index.expiry).arg(prefix);
        let reply: Value = self
            .run("list", None, |mut c| async move {
                call.invoke_async(&mut c).await
            })
            .await?;
        list_reply(reply)
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        let mut call = self.inner.scripts.set_max.key(key);
        let request = self.index_and_request(&mut call, key)?;
        call.arg(value).arg(ttl_arg(ttl)).arg(request);
        let reply: Value = self
            .run("set_max", Some(key), |mut c| async move {
                call.invoke_async(&mut c).await
            })
            .await?;
        written_or_foreign(key, "a decimal integer", reply)
    }

    /// Durable only with `appendonly yes` and `appendfsync always` (on every primary of a
    /// Cluster): then Redis fsyncs the AOF before it replies. A server that refuses `CONFIG GET`
    /// (disabled or renamed, an ACL without `+config`) cannot tell, and answers not durable.
    async fn durability(&self) -> Result<Durability> {
        let mut config = redis::cmd("CONFIG");
        config.arg("GET").arg("append*").arg("maxmemory-policy");
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
                let d = if settings.durable {
                    replication_of(&value, settings)
                } else {
                    settings
                };
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
        self.run("durability", None, |c| async move {
            match c {
                Conn::Cluster(mut c) => {
                    let policy = arrays.then_some(ResponsePolicy::CombineArrays);
                    c.route_command(
                        &cmd,
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, policy)),
                    )
                    .await
                }
                Conn::Single(mut c) => cmd.query_async(&mut c).await,
            }
        })
        .await
    }
}

/// Judges `INFO replication` (of one or several nodes) on top of durable settings: Redis
/// replicates asynchronously, so a replica promoted after a failover can lack writes its primary
/// acknowledged, and a replica itself is read-only.
fn replication_of(reply: &Value, settings: Durability) -> Durability {
    let mut texts = Vec::new();
    flatten_strings(reply, &mut texts);
    let mut replicas = 0u64;
    let mut is_replica = false;
    for line in texts.iter().flat_map(|t| t.lines()) {
        if let Some(n) = line.trim().strip_prefix("connected_slaves:") {
            replicas += n.parse::<u64>().unwrap_or(0);
        }
        if line.trim() == "role:slave" {
            is_replica = true;
        }
    }
    if is_replica {
        return Durability::not_durable(format!(
            "{}; the server is a replica (read-only)",
            settings.detail
        ));
    }
    if replicas > 0 {
        return Durability::not_durable(format!(
            "{}, {replicas} connected replica(s) (Redis replicates asynchronously: a replica promoted after a failover can lack acknowledged writes)",
            settings.detail
        ));
    }
    Durability::durable(format!("{}, no replicas", settings.detail))
}

/// The `master_replid` of each node in `INFO replication`: the id of the data set a server
/// serves, shared by its databases and by a primary and its replicas.
fn replication_ids(reply: &Value) -> Vec<String> {
    let mut texts = Vec::new();
    flatten_strings(reply, &mut texts);
    let mut ids: Vec<String> = texts
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|line| line.trim().strip_prefix("master_replid:"))
        .map(|id| format!("redis replication id {id}"))
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Judges the reply of `CONFIG GET append*` (one or several nodes' pairs, concatenated).
fn durability_of(reply: &Value) -> Durability {
    let mut words = Vec::new();
    flatten_strings(reply, &mut words);
    let mut appendonly = Vec::new();
    let mut appendfsync = Vec::new();
    let mut eviction = Vec::new();
    for pair in words.chunks_exact(2) {
        match pair[0].as_str() {
            "appendonly" => appendonly.push(pair[1].clone()),
            "appendfsync" => appendfsync.push(pair[1].clone()),
            "maxmemory-policy" => eviction.push(pair[1].clone()),
            _ => {}
        }
    }
    let detail = format!(
        "appendonly {}, appendfsync {}",
        show_settings(&appendonly),
        show_settings(&appendfsync)
    );
    // allkeys-* may evict a key that has no TTL (a majority-IDs counter) under memory pressure:
    // the next ID would start again from the other stores' values, or from 1.
    if let Some(policy) = eviction.iter().find(|p| p.starts_with("allkeys-")) {
        return Durability::not_durable(format!(
            "{detail}, maxmemory-policy {policy} (it may evict keys without a TTL; use noeviction or a volatile-* policy)"
        ));
    }
    let durable = !appendonly.is_empty()
        && !appendfsync.is_empty()
        && appendonly.iter().all(|v| v == "yes")
        && appendfsync.iter().all(|v| v == "always");
    if durable {
        Durability::durable(detail)
    } else {
        Durability::not_durable(format!(
            "{detail} (durable needs appendonly yes and appendfsync always)"
        ))
    }
}

/// The values one setting has across nodes, deduplicated: `yes`, or `yes/no` when nodes differ.
fn show_settings(values: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for v in values {
        if !seen.contains(&v.as_str()) {
            seen.push(v);
        }
    }
    if seen.is_empty() {
        "(not reported)".to_owned()
    } else {
        seen.join("/")
    }
}

/// Every string of a reply in order, maps flattened to key, value.
fn flatten_strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => out.push(s.clone()),
        Value::Array(items) | Value::Set(items) => {
            items.iter().for_each(|v| flatten_strings(v, out));
        }
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten_strings(k, out);
            flatten_strings(v, out);
        }),
        _ => {}
    }
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

    #[test]
    fn hash_tags() {
        assert_eq!(hash_tag("hc:{g}:interval:3"), "g");
        assert_eq!(hash_tag("a{}b"), "a{}b");
        assert_eq!(hash_tag("plain"), "plain");
    }

    #[test]
    fn hash_tags_pin_a_slot() {
        assert_eq!(tag_of("hc:{g}:"), Some("g"));
        assert_eq!(tag_of("{g}"), Some("g"));
        assert_eq!(tag_of("a{b{c}d}"), Some("b{c"));
        assert_eq!(tag_of("hc:{g"), None);
        assert_eq!(tag_of("hc:{}:x}"), None);
        assert_eq!(tag_of("hc:"), None);
    }

    #[test]
    fn index_keys_share_the_tag_and_are_reserved() {
        let ix = IndexKeys::of_tag("b{c");
        assert_eq!(ix.index, "{b{c}:headcount:index");
        assert_eq!(tag_of(&ix.index), Some("b{c"));
        assert_eq!(tag_of(&ix.expiry), Some("b{c"));
        for name in [
            "headcount:index",
            "headcount:expiry",
            "{g}:headcount:index",
            "{g}:headcount:expiry",
            "headcount:swept",
            "{g}:headcount:swept",
            "headcount:quiet",
            "{g}:headcount:quiet",
            "headcount:version:hc:{g}:slot:",
            "{g}:headcount:version:hc:{g}:slot:",
            "{g}:headcount:req:0123456789abcdef0",
            "{counter}:headcount:req:0123456789abcdef0",
        ] {
            assert!(is_index_name(name), "{name}");
        }
        for name in [
            "hc:{g}:headcount:index",
            "{}:headcount:index",
            "{g}:headcount:index2",
            "héadcount:index",
            "x",
        ] {
            assert!(!is_index_name(name), "{name}");
        }
    }

    #[test]
    fn list_replies_are_sorted_and_checked() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![b("ok"), b("k2"), b("2"), b("k1"), b("1")]);
        assert_eq!(
            list_reply(reply).unwrap(),
            vec![("k1".into(), "1".into()), ("k2".into(), "2".into())]
        );
        let foreign = Value::Array(vec![b("foreign"), b("k"), b("a Redis list")]);
        assert!(matches!(
            list_reply(foreign),
            Err(Error::ForeignValue { .. })
        ));
    }

    #[test]
    fn durability_needs_aof_always_on_every_node() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = |pairs: &[(&str, &str)]| {
            Value::Array(pairs.iter().flat_map(|(k, v)| [bulk(k), bulk(v)]).collect())
        };
        let durable = reply(&[("appendonly", "yes"), ("appendfsync", "always")]);
        let d = durability_of(&durable);
        assert!(
            d.durable && d.detail == "appendonly yes, appendfsync always",
            "{d:?}"
        );
        let everysec = durability_of(&reply(&[
            ("appendonly", "yes"),
            ("appendfsync", "everysec"),
        ]));
        assert!(!everysec.durable && everysec.detail.contains("everysec"));
        let mixed = reply(&[
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("appendonly", "no"),
            ("appendfsync", "always"),
        ]);
        let d = durability_of(&mixed);
        assert!(!d.durable && d.detail.contains("yes/no"), "{d:?}");
        assert!(!durability_of(&Value::Array(vec![])).durable);
        let map = Value::Map(vec![
            (bulk("appendonly"), bulk("yes")),
            (bulk("appendfsync"), bulk("always")),
        ]);
        assert!(durability_of(&map).durable);
        let lru = durability_of(&reply(&[
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("maxmemory-policy", "allkeys-lru"),
        ]));
        assert!(
            !lru.durable && lru.detail.contains("allkeys-lru"),
            "{lru:?}"
        );
        let volatile = reply(&[
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("maxmemory-policy", "volatile-lru"),
        ]);
        assert!(durability_of(&volatile).durable);
    }

    #[test]
    fn replicas_make_a_store_not_durable() {
        let ok = || Durability::durable("appendonly yes, appendfsync always");
        let info = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let alone = info("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n");
        assert!(replication_of(&alone, ok()).durable);
        let replicated = info("# Replication\r\nrole:master\r\nconnected_slaves:1\r\n");
        let d = replication_of(&replicated, ok());
        assert!(
            !d.durable && d.detail.contains("1 connected replica"),
            "{d:?}"
        );
        let replica = info("# Replication\r\nrole:slave\r\n");
        assert!(!replication_of(&replica, ok()).durable);
        let cluster = Value::Map(vec![
            (info("n1"), alone.clone()),
            (info("n2"), replicated.clone()),
        ]);
        assert!(!replication_of(&cluster, ok()).durable);
    }

    #[tokio::test]
    async fn unreachable_server_is_retryable_and_never_shows_the_password() {
        let err = RedisStore::connect("redis://:hunter22@127.0.0.1:1/0?timeout=2s")
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert!(!format!("{err} {err:?}").contains("hunter22"));
    }

    #[tokio::test]
    async fn a_silent_server_times_out_within_the_deadline() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let started = std::time::Instant::now();
        let err = RedisStore::connect(&format!("redis://127.0.0.1:{port}?timeout=300ms"))
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
        hold.abort();
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
}
