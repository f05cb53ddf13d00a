//! A fencing guard for a Redis sink: a set-if-greater-or-equal script over a fence key, which can
//! write the guarded data in the same atomic step: [`RedisFence`].

use std::time::Duration;

use async_trait::async_trait;
use headcount_core::backend::url::DEFAULT_TIMEOUT;
use headcount_core::backend::{check_key, check_opt_ttl, check_value, Deadline};
use headcount_core::fence::{Fence, FencingToken};
use headcount_core::{Error, Result};
use redis::aio::ConnectionLike;
use redis::{RedisError, Script, Value};

use crate::errors::{self, BACKEND};
use crate::index::hash_tag;
use crate::replies::{unexpected, written_or_foreign};
use crate::scripts::ttl_arg;

const FENCE_LUA: &str = include_str!("scripts/fence.lua");

/// A fencing guard for a Redis sink: a set-if-greater-or-equal script over a fence key, which can
/// write the guarded data in the same atomic step.
///
/// Every grant headcount hands out carries a [`FencingToken`] (`Grant::token`: for a key,
/// the first epoch of the member's unbroken ownership of it; for a whole share, the epoch of its
/// view). The fence key
/// holds the highest token admitted for one resource, as decimal text (`redis-cli GET` shows it).
/// A write whose token is at least that is admitted (equal tokens: the same owner writes again)
/// and the token recorded; an older one is refused, however late it arrives. Fence keys never
/// expire.
///
/// [`RedisFence::fenced_set`] checks the token and writes the data in one Lua script, so no write
/// of a stale owner can slip in between. It takes the caller's own connection (any
/// [`redis::aio::ConnectionLike`]: a multiplexed connection, a `ConnectionManager`, a Cluster
/// connection). On Redis Cluster the fence key and the data key must share a hash slot: give both
/// the same `{tag}`; keys in different slots are [`Error::InvalidArgument`].
///
/// ```no_run
/// # async fn demo(token: headcount_core::fence::FencingToken) -> headcount_core::Result<()> {
/// use headcount_redis::RedisFence;
///
/// let client = redis::Client::open("redis://127.0.0.1/")
///     .map_err(|e| headcount_core::Error::config(e.to_string()))?;
/// let mut conn = client
///     .get_multiplexed_async_connection()
///     .await
///     .map_err(|e| headcount_core::Error::config(e.to_string()))?;
/// let fence = RedisFence::new();
/// // The grant's fencing token (grant.token()) guards the write of customer 42's report.
/// let written = fence
///     .fenced_set(&mut conn, "fence:{customer:42}", token, "report:{customer:42}", "...", None)
///     .await?;
/// if !written {
///     // A newer owner of customer 42 exists: stop working on it.
/// }
/// # Ok(())
/// # }
/// ```
///
/// Cheap to clone; holds no connection, only the script (sent by its SHA, loaded on `NOSCRIPT`).
#[derive(Debug, Clone)]
pub struct RedisFence {
    script: Script,
    deadline: Deadline,
}

impl Default for RedisFence {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisFence {
    /// A fence whose calls give up after 5 s.
    pub fn new() -> Self {
        RedisFence {
            script: Script::new(FENCE_LUA),
            deadline: Deadline::new(BACKEND, DEFAULT_TIMEOUT),
        }
    }

    /// The same fence with another deadline per call ([`Error::Timeout`] past it).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.deadline = Deadline::new(BACKEND, timeout);
        self
    }

    /// Admits `token` at `fence_key` when it is at least the highest token admitted there (and
    /// records it); returns whether it did. A fence key holding anything but a token is
    /// [`Error::ForeignValue`], and nothing is written.
    pub async fn admit<C>(&self, conn: &mut C, fence_key: &str, token: FencingToken) -> Result<bool>
    where
        C: ConnectionLike + Send,
    {
        check_key(fence_key)?;
        let mut call = self.script.key(fence_key);
        call.arg(token.to_string()).arg("").arg("");
        let reply = self.invoke(conn, "fence_admit", &call).await?;
        count_refusal(written_or_foreign(
            fence_key,
            "a fencing token (a decimal u64)",
            reply,
        ))
    }

    /// Admits `token` at `fence_key` as [`RedisFence::admit`] does and, only when admitted, sets
    /// `data_key` to `value` (with `ttl`, or without expiry), in one atomic script. Returns whether
    /// it wrote. On Redis Cluster both keys must share a hash slot (the same `{tag}`); keys in
    /// different slots are [`Error::InvalidArgument`] from the server's `CROSSSLOT`.
    pub async fn fenced_set<C>(
        &self,
        conn: &mut C,
        fence_key: &str,
        token: FencingToken,
        data_key: &str,
        value: &str,
        ttl: Option<Duration>,
    ) -> Result<bool>
    where
        C: ConnectionLike + Send,
    {
        check_key(fence_key)?;
        check_key(data_key)?;
        check_value(value)?;
        check_opt_ttl(ttl)?;
        if fence_key == data_key {
            return Err(Error::invalid(
                "fenced_set needs a data key other than the fence key",
            ));
        }
        let mut call = self.script.key(fence_key);
        call.key(data_key)
            .arg(token.to_string())
            .arg(value)
            .arg(ttl_arg(ttl));
        let reply = self.invoke(conn, "fenced_set", &call).await.map_err(|e| {
            match e {
                // Say which keys and what to do instead of the server's bare CROSSSLOT.
                Error::InvalidArgument { .. } => Error::invalid(format!(
                    "fence key {fence_key:?} and data key {data_key:?} are in different Redis \
                     Cluster hash slots (hash tags {:?} and {:?}): give both the same {{tag}}",
                    hash_tag(fence_key),
                    hash_tag(data_key)
                )),
                other => other,
            }
        })?;
        count_refusal(written_or_foreign(
            fence_key,
            "a fencing token (a decimal u64)",
            reply,
        ))
    }

    /// The highest token admitted at `fence_key`, or `None` when none was (the key is absent). A
    /// fence key holding anything but a token is [`Error::ForeignValue`].
    pub async fn current<C>(&self, conn: &mut C, fence_key: &str) -> Result<Option<FencingToken>>
    where
        C: ConnectionLike + Send,
    {
        check_key(fence_key)?;
        let op = "fence_current";
        let work = async {
            redis::cmd("GET")
                .arg(fence_key)
                .query_async::<Option<String>>(conn)
                .await
                .map_err(|e| errors::classify(e, op, self.deadline, None))
        };
        let Some(text) = self.deadline.run(op, work).await? else {
            return Ok(None);
        };
        // Canonical decimal only, as the fence script reads it ("007" is not a token).
        match text.parse::<u64>() {
            Ok(n) if n.to_string() == text => Ok(Some(FencingToken::new(n))),
            _ => Err(Error::foreign(
                fence_key,
                "a fencing token (a decimal u64)",
                &text,
            )),
        }
    }

    async fn invoke<C>(
        &self,
        conn: &mut C,
        op: &'static str,
        call: &redis::ScriptInvocation<'_>,
    ) -> Result<Value>
    where
        C: ConnectionLike + Send,
    {
        let work = async {
            match call.invoke_async::<Value>(conn).await {
                Ok(Value::Array(items)) if items.len() == 2 => Ok(Value::Array(items)),
                Ok(v @ Value::Int(_)) => Ok(v),
                Ok(other) => Err(unexpected(other)),
                Err(e) if is_cross_slot(&e) => Err(Error::invalid(e.to_string())),
                Err(e) => Err(errors::classify(e, op, self.deadline, None)),
            }
        };
        self.deadline.run(op, work).await
    }
}

/// Counts a refused token in headcount's fence-rejection metric.
fn count_refusal(admitted: Result<bool>) -> Result<bool> {
    if let Ok(false) = admitted {
        headcount_core::metrics::record_fence_rejection("redis");
    }
    admitted
}

/// Redis Cluster's refusal of a script whose keys are in different hash slots.
fn is_cross_slot(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::CrossSlot || e.code() == Some("CROSSSLOT")
}

/// [`RedisFence::admit`] and [`RedisFence::current`] over the caller's connection; the resource
/// is the fence key.
#[async_trait]
impl<C: ConnectionLike + Send> Fence<C> for RedisFence {
    async fn admit(&self, conn: &mut C, fence_key: &str, token: FencingToken) -> Result<bool> {
        RedisFence::admit(self, conn, fence_key, token).await
    }

    async fn current(&self, conn: &mut C, fence_key: &str) -> Result<Option<FencingToken>> {
        RedisFence::current(self, conn, fence_key).await
    }
}
