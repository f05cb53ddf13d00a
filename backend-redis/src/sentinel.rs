//! Redis Sentinel: finding the current primary of a master name, and following it across
//! failovers.
//!
//! The store asks every Sentinel of the URL at once `SENTINEL get-master-addr-by-name`, tries the
//! addresses they name (most named first), and keeps a connection to the first one whose `ROLE`
//! says `master`. Any connection fault, `READONLY` answer or call that did not finish (the
//! deadline ran out) drops that connection: the next call asks the Sentinels again. So after a
//! failover, where Sentinel disconnects the clients of the demoted primary, the next call reaches
//! the promoted one. No call is sent twice: the call that met the fault fails (retryably).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt as _};
use redis::aio::{ConnectionLike as _, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionInfo, ErrorKind, Pipeline, RedisError,
    RedisFuture, RedisResult, Value,
};

use headcount_core::backend::url::scrub;

use crate::config::RedisConfig;

/// The connection to the current primary, found through the Sentinels.
pub(crate) struct SentinelConn {
    config: RedisConfig,
    /// The connection in use and its generation; `None` once a fault dropped it.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// Held while asking the Sentinels, so concurrent calls ask once; the last generation.
    connecting: tokio::sync::Mutex<u64>,
}

impl SentinelConn {
    /// Finds the primary and connects to it (the caller bounds the time).
    pub(crate) async fn open(config: RedisConfig) -> RedisResult<Arc<Self>> {
        let conn = Arc::new(SentinelConn {
            config,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(0),
        });
        conn.connection().await?;
        Ok(conn)
    }

    pub(crate) fn db(&self) -> i64 {
        self.config.db()
    }

    /// The connection in use, or a new one to the primary the Sentinels name now.
    async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let mut generation = self.connecting.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let conn = self.connect().await?;
        *generation += 1;
        let fresh = (*generation, conn);
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(fresh.clone());
        Ok(fresh)
    }

    fn current(&self) -> Option<(u64, MultiplexedConnection)> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Drops the connection of `generation` if it is still the one in use.
    fn forget(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
        }
    }

    /// Asks the Sentinels, then connects to the first named address that is a primary.
    async fn connect(&self) -> RedisResult<MultiplexedConnection> {
        let timeout = self.config.timeout();
        let name = self.config.master_name().unwrap_or_default();
        let candidates = self.ask_sentinels(name).await?;
        let config = AsyncConnectionConfig::new().set_connection_timeout(timeout);
        let mut seen = Vec::new();
        for ((host, port), votes) in &candidates {
            let client = Client::open(self.config.connection_info(host, *port))?;
            let found = async {
                let mut conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                let role = is_primary(&mut conn).await?;
                Ok::<_, RedisError>((conn, role))
            }
            .await;
            match found {
                Ok((conn, true)) => return Ok(conn),
                Ok((_, false)) => {
                    seen.push(format!("{host}:{port} (named by {votes}) is a replica"))
                }
                Err(e) => seen.push(format!("{host}:{port} (named by {votes}): {e}")),
            }
        }
        Err(RedisError::from((
            ErrorKind::MasterDown,
            "no primary found through the Sentinels",
            format!(
                "master `{name}`: {} (a failover in progress? the next call asks again)",
                seen.join("; ")
            ),
        )))
    }

    /// The addresses the Sentinels name for `name`, most named first, with how many named each.
    ///
    /// Every Sentinel is asked at once. The answer is settled when every Sentinel answered, when
    /// one address is named by more than half of the URL's Sentinels, or, once at least one
    /// answered, when half the deadline has passed. None answering in that time is an I/O error
    /// (retryable); all that answered knowing no such master is `MasterNameNotFoundBySentinel`.
    async fn ask_sentinels(&self, name: &str) -> RedisResult<Vec<((String, u16), String)>> {
        let sentinels = self.config.endpoints();
        let window = self.config.timeout() / 2;
        let mut asks: FuturesUnordered<_> = sentinels
            .iter()
            .map(|(host, port)| {
                let info = self.config.sentinel_connection_info(host, *port);
                let at = format!("{host}:{port}");
                async move {
                    let answer = tokio::time::timeout(window, ask(info, name, window)).await;
                    (at, answer)
                }
            })
            .collect();
        let mut votes: HashMap<(String, u16), usize> = HashMap::new();
        let mut unknown = Vec::new();
        let mut failed = Vec::new();
        // Sentinels that refused the credentials (`sentinel_username`, `sentinel_password`).
        let mut refused = 0;
        while let Some((at, answer)) = asks.next().await {
            match answer {
                Ok(Ok(Some(addr))) => *votes.entry(addr).or_default() += 1,
                Ok(Ok(None)) => unknown.push(at),
                Ok(Err(e)) => {
                    if e.kind() == ErrorKind::AuthenticationFailed || e.code() == Some("NOAUTH") {
                        refused += 1;
                    }
                    failed.push(scrub(format!("{at}: {e}"), self.config.sentinel_password()));
                }
                Err(_) => failed.push(format!("{at}: no answer within {window:?}")),
            }
            if votes.values().any(|v| *v * 2 > sentinels.len()) {
                break;
            }
        }
        if votes.is_empty() && !unknown.is_empty() {
            return Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "unknown master name",
                format!(
                    "the Sentinels at {} know no master named `{name}` (SENTINEL \
                     get-master-addr-by-name answered nil){}",
                    unknown.join(", "),
                    if failed.is_empty() {
                        String::new()
                    } else {
                        format!("; no answer from {}", failed.join("; "))
                    }
                ),
            )));
        }
        if votes.is_empty() && refused > 0 && refused == failed.len() {
            // Every Sentinel that answered refused us: wrong or missing credentials, which
            // asking again will not fix.
            return Err(RedisError::from((
                ErrorKind::AuthenticationFailed,
                "the Sentinels refused the credentials",
                format!(
                    "master `{name}`: {} (the Sentinels' own user and password are the URL \
                     options sentinel_username and sentinel_password)",
                    failed.join("; ")
                ),
            )));
        }
        if votes.is_empty() {
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                format!(
                    "no Sentinel answered for master `{name}`: {}",
                    failed.join("; ")
                ),
            )));
        }
        let asked = sentinels.len();
        let mut named: Vec<_> = votes.into_iter().collect();
        named.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok(named
            .into_iter()
            .map(|(addr, n)| (addr, format!("{n} of {asked} Sentinels")))
            .collect())
    }

    /// Sends `cmd` on the connection in use; a fault, or a call dropped before it finished,
    /// drops the connection so the next call asks the Sentinels again.
    pub(crate) fn request<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            let mut watch = Unfinished::new(self, generation);
            let result = conn.req_packed_command(cmd).await;
            watch.finish(&result);
            result
        })
    }

    /// [`request`](Self::request) for a pipeline.
    pub(crate) fn request_many<'a>(
        &'a self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            let mut watch = Unfinished::new(self, generation);
            let result = conn.req_packed_commands(cmd, offset, count).await;
            watch.finish(&result);
            result
        })
    }
}

/// Drops the connection when a call on it is dropped before it finished (the store's deadline
/// ran out: the primary may be gone without a word) or finished with a fault.
struct Unfinished<'a> {
    conn: &'a SentinelConn,
    generation: u64,
    done: bool,
}

impl<'a> Unfinished<'a> {
    fn new(conn: &'a SentinelConn, generation: u64) -> Self {
        Unfinished {
            conn,
            generation,
            done: false,
        }
    }

    fn finish<T>(&mut self, result: &RedisResult<T>) {
        self.done = true;
        if let Err(e) = result {
            if is_fault(e) {
                self.conn.forget(self.generation);
            }
        }
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.conn.forget(self.generation);
        }
    }
}

/// Whether `e` means the connection may no longer lead to the primary.
fn is_fault(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ReadOnly | ErrorKind::IoError | ErrorKind::MasterDown
    ) || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
}

/// One Sentinel's answer for `name`: the address, or `None` when it watches no such master.
async fn ask(
    info: ConnectionInfo,
    name: &str,
    timeout: Duration,
) -> RedisResult<Option<(String, u16)>> {
    let client = Client::open(info)?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(timeout)
        .set_response_timeout(timeout);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(name)
        .query_async(&mut conn)
        .await
}

/// Whether the server says it is a primary (`ROLE`). A server that refuses `ROLE` (an ACL
/// without it) is taken at the Sentinels' word.
async fn is_primary(conn: &mut MultiplexedConnection) -> RedisResult<bool> {
    match redis::cmd("ROLE").query_async::<Value>(conn).await {
        Ok(Value::Array(items)) => Ok(matches!(
            items.first(),
            Some(Value::BulkString(b)) if b == b"master"
        ) || matches!(items.first(), Some(Value::SimpleString(s)) if s == "master")),
        Ok(_) => Ok(false),
        Err(e) if e.kind() == ErrorKind::ResponseError => Ok(true),
        Err(e) => Err(e),
    }
}
