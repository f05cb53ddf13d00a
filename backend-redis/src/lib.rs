#![doc = include_str!("../README.md")]

mod config;
mod errors;
mod fence;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use headcount_core::store::{
    check_cas, check_incr_and_get, check_key, check_opt_ttl, check_prefix, check_renew_and_list,
    check_ttl, ttl_millis,
};
use headcount_core::{Capabilities, Durability, Error, Result, Store};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Script, Value};

pub use config::{RedisConfig, Topology, DEFAULT_PORT};
use errors::BACKEND;
pub use fence::RedisFence;

/// The Lua sources, kept as files next to this one.
const INCR_LUA: &str = include_str!("scripts/incr.lua");
const CAS_LUA: &str = include_str!("scripts/cas.lua");
const SET_MAX_LUA: &str = include_str!("scripts/set_max.lua");
/// `list` and `renew_and_list` share the scan (`list_body.lua` builds `out`); each adds its own
/// ending, and `renew_and_list` its renewal in front.
const LIST_LUA: &str = concat!(include_str!("scripts/list_body.lua"), "return out\n");
const RENEW_AND_LIST_LUA: &str = concat!(
    include_str!("scripts/renew_head.lua"),
    include_str!("scripts/list_body.lua"),
    "table.insert(out, 1, renewed)\nreturn out\n"
);
const INCR_AND_GET_LUA: &str = include_str!("scripts/incr_and_get.lua");

/// The loaded scripts. `Script` sends `EVALSHA` and, on `NOSCRIPT` (a restarted or flushed
/// server, a new Cluster node), loads the script and retries once.
struct Scripts {
    incr: Script,
    cas: Script,
    set_max: Script,
    list: Script,
    incr_and_get: Script,
    renew_and_list: Script,
}

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
/// Cloning is cheap and shares the connection. Every primitive is one round trip: a plain command
/// (`GET`, `PEXPIRE`, `DEL`, `SET NX`) or one Lua script called by its SHA.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    config: RedisConfig,
    scripts: Scripts,
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
        let password = config.password().map(str::to_owned);
        let classify = |e: RedisError| errors::classify(e, "connect", timeout, password.as_deref());
        let work = async {
            let conn = match config.topology() {
                Topology::Single => {
                    let (host, port) = config
                        .nodes()
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
                        .nodes()
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
        let conn = tokio::time::timeout(timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(Error::Timeout {
                    backend: BACKEND,
                    op: "connect",
                    after: timeout,
                })
            })?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                config,
                scripts: Scripts {
                    incr: Script::new(INCR_LUA),
                    cas: Script::new(CAS_LUA),
                    set_max: Script::new(SET_MAX_LUA),
                    list: Script::new(LIST_LUA),
                    incr_and_get: Script::new(INCR_AND_GET_LUA),
                    renew_and_list: Script::new(RENEW_AND_LIST_LUA),
                },
            }),
        })
    }

    /// The configuration this store was built from.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// Runs `call` on a clone of the connection within the deadline, mapping errors.
    async fn run<T, F, Fut>(&self, op: &'static str, key: Option<&str>, call: F) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let timeout = self.inner.config.timeout();
        match tokio::time::timeout(timeout, call(self.inner.conn.clone())).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => match key {
                Some(key) if errors::is_wrong_type(&e) => Err(Error::foreign(
                    key,
                    "a string (the key holds another Redis type)",
                    "another Redis type",
                )),
                _ => Err(errors::classify(
                    e,
                    op,
                    timeout,
                    self.inner.config.password(),
                )),
            },
            Err(_) => Err(Error::Timeout {
                backend: BACKEND,
                op,
                after: timeout,
            }),
        }
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
        let reply: Value = self
            .run("incr_and_get", Some(key), |mut c| async move {
                script
                    .key(key)
                    .key(key)
                    .arg(by)
                    .arg(ttl_arg(ttl))
                    .invoke_async(&mut c)
                    .await
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

/// Escapes the glob characters of Redis's `MATCH` (`*`, `?`, `[`, `]`, `\`, `^`) so the
/// pattern `<escaped prefix>*` matches exactly the keys that start with `prefix`.
fn glob_escape(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 2);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

/// Whether every key starting with `prefix` has the same Redis Cluster hash slot: the prefix
/// holds a complete, non-empty hash tag (`{...}`, the first `{` and the first `}` after it).
fn prefix_pins_slot(prefix: &str) -> bool {
    match prefix.find('{') {
        Some(open) => match prefix[open + 1..].find('}') {
            Some(len) => len > 0,
            None => false,
        },
        None => false,
    }
}

/// The part of a key Redis Cluster hashes: the first non-empty `{...}`, else the whole key.
fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
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
    pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    // SCAN may return a key twice; the values are the same snapshot.
    pairs.dedup_by(|a, b| a.0 == b.0);
    Ok(pairs)
}

#[async_trait]
impl Store for RedisStore {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(BACKEND);
        caps.native_set_max = true;
        caps.native_incr_and_get = true;
        caps.native_renew_and_list = true;
        caps
    }

    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        check_renew_and_list(key, holder, ttl, prefix)?;
        if matches!(self.inner.conn, Conn::Cluster(_))
            && !(prefix_pins_slot(prefix) && hash_tag(key) == hash_tag(prefix))
        {
            // A script may only touch one hash slot on Cluster. A group's slot keys and its
            // prefix share the `{group}` tag, so this only happens outside headcount's naming:
            // two calls, the renewal and then the listing, not atomic together.
            let renewed = self
                .compare_and_set(key, Some(holder), holder, Some(ttl))
                .await?;
            return Ok((renewed, self.list(prefix).await?));
        }
        let pattern = glob_escape(prefix);
        let script = &self.inner.scripts.renew_and_list;
        let reply: Value = self
            .run("renew_and_list", Some(key), |mut c| async move {
                script
                    .key(key)
                    .key(prefix)
                    .arg(&pattern)
                    .arg(prefix)
                    .arg(holder)
                    .arg(ttl_millis(ttl))
                    .invoke_async(&mut c)
                    .await
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
        check_incr_and_get(incr_key, by, ttl, get_key)?;
        if matches!(self.inner.conn, Conn::Cluster(_)) && hash_tag(incr_key) != hash_tag(get_key) {
            // A script may only touch one hash slot on Cluster. Keys of one group share their
            // `{group}` tag, so this only happens for keys outside headcount's naming: two calls,
            // not atomic together.
            let n = self.incr_by_two_calls(incr_key, by, ttl).await?;
            return Ok((n, self.get(get_key).await?));
        }
        let script = &self.inner.scripts.incr_and_get;
        let reply: Value = self
            .run("incr_and_get", Some(incr_key), |mut c| async move {
                script
                    .key(incr_key)
                    .key(get_key)
                    .arg(by)
                    .arg(ttl_arg(ttl))
                    .invoke_async(&mut c)
                    .await
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
        check_key(key)?;
        check_opt_ttl(ttl)?;
        let script = &self.inner.scripts.incr;
        let reply: Value = self
            .run("incr", Some(key), |mut c| async move {
                script.key(key).arg(ttl_arg(ttl)).invoke_async(&mut c).await
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
        check_key(key)?;
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
        check_key(key)?;
        check_ttl(ttl)?;
        let n: i64 = self
            .run("expire", Some(key), |mut c| async move {
                redis::cmd("PEXPIRE")
                    .arg(key)
                    .arg(ttl_millis(ttl))
                    .query_async(&mut c)
                    .await
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
        check_cas(key, expected, new, ttl)?;
        match expected {
            None => {
                let mut cmd = redis::cmd("SET");
                cmd.arg(key).arg(new).arg("NX");
                if let Some(ttl) = ttl {
                    cmd.arg("PX").arg(ttl_millis(ttl));
                }
                let reply: Value = self
                    .run("compare_and_set", Some(key), |mut c| async move {
                        cmd.query_async(&mut c).await
                    })
                    .await?;
                Ok(matches!(reply, Value::Okay | Value::SimpleString(_)))
            }
            Some(expected) => {
                let script = &self.inner.scripts.cas;
                let reply: Value = self
                    .run("compare_and_set", Some(key), |mut c| async move {
                        script
                            .key(key)
                            .arg(expected)
                            .arg(new)
                            .arg(ttl_arg(ttl))
                            .invoke_async(&mut c)
                            .await
                    })
                    .await?;
                written_or_foreign(key, "a string (the key holds another Redis type)", reply)
            }
        }
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        let n: i64 = self
            .run("delete", Some(key), |mut c| async move {
                redis::cmd("DEL").arg(key).query_async(&mut c).await
            })
            .await?;
        Ok(n > 0)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        check_prefix(prefix)?;
        let pattern = glob_escape(prefix);
        let script = &self.inner.scripts.list;
        let reply: Value = match &self.inner.conn {
            Conn::Cluster(_) if !prefix_pins_slot(prefix) => {
                // The keys may live on every node: run the script on each primary and combine.
                // EVAL with the source (not EVALSHA): every primary must run it, and a fan-out
                // is rare enough that sending the text is cheaper than managing NOSCRIPT per
                // node.
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(LIST_LUA).arg(0).arg(&pattern).arg(prefix);
                self.run("list", None, |c| async move {
                    let Conn::Cluster(mut c) = c else {
                        return Err(RedisError::from((
                            redis::ErrorKind::ClientError,
                            "not a Cluster connection",
                        )));
                    };
                    let combined = c
                        .route_command(
                            &cmd,
                            RoutingInfo::MultiNode((
                                MultipleNodeRoutingInfo::AllMasters,
                                Some(ResponsePolicy::CombineArrays),
                            )),
                        )
                        .await?;
                    Ok(merge_node_lists(combined))
                })
                .await?
            }
            // On one server, or with the prefix's keys in one slot: KEYS[1] = prefix routes the
            // script to the node that owns them.
            _ => {
                self.run("list", None, |mut c| async move {
                    script
                        .key(prefix)
                        .arg(&pattern)
                        .arg(prefix)
                        .invoke_async(&mut c)
                        .await
                })
                .await?
            }
        };
        list_reply(reply)
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        check_key(key)?;
        check_opt_ttl(ttl)?;
        let script = &self.inner.scripts.set_max;
        let reply: Value = self
            .run("set_max", Some(key), |mut c| async move {
                script
                    .key(key)
                    .arg(value)
                    .arg(ttl_arg(ttl))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        written_or_foreign(key, "a decimal integer", reply)
    }

    /// Durable only with `appendonly yes` and `appendfsync always` (on every primary of a
    /// Cluster): then Redis fsyncs the AOF before it replies. A server that refuses `CONFIG GET`
    /// (disabled or renamed, an ACL without `+config`) cannot tell, and answers not durable.
    async fn durability(&self) -> Result<Durability> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("append*");
        let reply: Result<Value> = self
            .run("durability", None, |c| async move {
                match c {
                    Conn::Cluster(mut c) => {
                        c.route_command(
                            &cmd,
                            RoutingInfo::MultiNode((
                                MultipleNodeRoutingInfo::AllMasters,
                                Some(ResponsePolicy::CombineArrays),
                            )),
                        )
                        .await
                    }
                    Conn::Single(mut c) => cmd.query_async(&mut c).await,
                }
            })
            .await;
        match reply {
            Ok(value) => Ok(durability_of(&value)),
            Err(e) if e.is_retryable() => Err(e),
            Err(e) => Ok(Durability::not_durable(format!(
                "cannot read appendonly/appendfsync with CONFIG GET (disabled, renamed or not permitted?): {e}"
            ))),
        }
    }
}

/// Judges the reply of `CONFIG GET append*` (one or several nodes' pairs, concatenated).
fn durability_of(reply: &Value) -> Durability {
    let mut words = Vec::new();
    flatten_strings(reply, &mut words);
    let mut appendonly = Vec::new();
    let mut appendfsync = Vec::new();
    for pair in words.chunks_exact(2) {
        match pair[0].as_str() {
            "appendonly" => appendonly.push(pair[1].clone()),
            "appendfsync" => appendfsync.push(pair[1].clone()),
            _ => {}
        }
    }
    let detail = format!(
        "appendonly {}, appendfsync {}",
        show_settings(&appendonly),
        show_settings(&appendfsync)
    );
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

/// Merges the replies of the list script from several nodes (combined into one array of
/// `{'ok', k, v, ...}` arrays, or flattened) into one `{'ok', k, v, ...}` reply; the first
/// `foreign` reply wins.
fn merge_node_lists(combined: Value) -> Value {
    let Value::Array(items) = combined else {
        return combined;
    };
    // CombineArrays concatenates the nodes' arrays, so the "ok" markers are interleaved with
    // the pairs: drop every marker, keeping key/value order.
    let mut out = vec![Value::BulkString(b"ok".to_vec())];
    let mut iter = items.into_iter().peekable();
    while let Some(item) = iter.next() {
        match item {
            Value::BulkString(ref s) if s == b"ok" => {}
            Value::BulkString(ref s) if s == b"foreign" => {
                let mut foreign = vec![item];
                foreign.extend(iter.by_ref().take(2));
                return Value::Array(foreign);
            }
            Value::Array(inner) => {
                if let Value::Array(nested) = merge_node_lists(Value::Array(inner)) {
                    if nested
                        .first()
                        .is_some_and(|v| matches!(v, Value::BulkString(s) if s == b"foreign"))
                    {
                        return Value::Array(nested);
                    }
                    out.extend(nested.into_iter().skip(1));
                }
            }
            other => {
                out.push(other);
                if let Some(v) = iter.next() {
                    out.push(v);
                }
            }
        }
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn globs_are_escaped() {
        assert_eq!(glob_escape("hc:{g}:"), "hc:{g}:*");
        assert_eq!(glob_escape(r"a*b?c[d]e\f^g-h"), r"a\*b\?c\[d\]e\\f\^g\-h*");
    }

    #[test]
    fn hash_tags() {
        assert_eq!(hash_tag("hc:{g}:interval:3"), "g");
        assert_eq!(hash_tag("a{}b"), "a{}b");
        assert_eq!(hash_tag("plain"), "plain");
    }

    #[test]
    fn hash_tags_pin_a_slot() {
        assert!(prefix_pins_slot("hc:{g}:"));
        assert!(prefix_pins_slot("{g}"));
        assert!(!prefix_pins_slot("hc:{g"));
        assert!(!prefix_pins_slot("hc:{}:x}"));
        assert!(!prefix_pins_slot("hc:"));
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
        let merged = merge_node_lists(Value::Array(vec![
            b("ok"),
            b("a"),
            b("1"),
            b("ok"),
            b("ok"),
            b("b"),
            b("2"),
        ]));
        assert_eq!(
            list_reply(merged).unwrap(),
            vec![("a".into(), "1".into()), ("b".into(), "2".into())]
        );
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
