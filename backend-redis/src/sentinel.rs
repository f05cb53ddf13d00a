//! Redis Sentinel: finding the current primary of a master name, following it across
//! failovers, and confirming after every call that the server that answered is still the one
//! the Sentinels name.
//!
//! The store asks every Sentinel of the URL at once `SENTINEL get-master-addr-by-name`, tries the
//! addresses they name (most named first), and keeps a connection to the first one whose `ROLE`
//! says `master`. Any connection fault, `READONLY` answer or call that did not finish (the
//! deadline ran out) drops that connection: the next call asks the Sentinels again. No call is
//! sent twice: the call that met the fault fails (retryably).
//!
//! A deposed primary does not say so: after `SENTINEL FAILOVER` the old primary keeps answering
//! as a primary, its clients connected, until the Sentinels reconfigure it as a replica about ten
//! seconds later, and a write it acknowledges in that time never reaches the new primary. So
//! every answer is confirmed before the caller sees it: the Sentinels are asked again, and the
//! answer stands only if no other address is named by more of them than the one that answered.
//! A confirmation that starts after a call's reply arrived covers that call, so concurrent calls
//! share one (the Sentinels are asked once per wave of calls, over connections kept open). When
//! the Sentinels name another primary, the answer is discarded, the call fails retryably and the
//! connection is dropped; when too few Sentinels answer to confirm it, the call fails retryably
//! too. A group member whose renewals fail that way stops granting at its lease deadline.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt as _};
use redis::aio::{ConnectionLike as _, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult,
    Value,
};

use headcount_core::backend::url::scrub;

use crate::config::RedisConfig;

/// A server's address.
type Addr = (String, u16);

/// The connection to the primary in use.
#[derive(Clone)]
struct Primary {
    /// Bumped at every new connection, so a fault on an old one never drops a newer one.
    generation: u64,
    addr: Addr,
    conn: MultiplexedConnection,
}

/// The last confirmation: when it started, and the address the Sentinels named then (`Err`:
/// why they could not confirm any).
struct Confirmation {
    started: Instant,
    named: Result<Addr, String>,
}

/// The connection to the current primary, found through the Sentinels.
pub(crate) struct SentinelConn {
    config: RedisConfig,
    /// The connection in use; `None` once a fault dropped it.
    current: Mutex<Option<Primary>>,
    /// Held while asking the Sentinels for a new primary, so concurrent calls ask once; the
    /// last generation.
    connecting: tokio::sync::Mutex<u64>,
    /// One connection per Sentinel of the URL (in its order), opened when first needed and
    /// dropped at its first fault.
    sentinels: Vec<Mutex<Option<MultiplexedConnection>>>,
    /// Held while confirming, so that calls waiting on it share the next confirmation.
    confirming: tokio::sync::Mutex<Option<Confirmation>>,
}

/// What the Sentinels answered for a master name.
struct Tally {
    /// The addresses named, most named first, with how many named each.
    named: Vec<(Addr, usize)>,
    /// How many Sentinels answered (naming an address or none).
    answered: usize,
    /// The Sentinels that answered knowing no such master.
    unknown: Vec<String>,
    /// The Sentinels that did not answer, with why.
    failed: Vec<String>,
    /// Of those, how many refused the credentials.
    refused: usize,
    /// Of those, how many answered with an error that says they are no Sentinel.
    not_sentinels: usize,
}

impl SentinelConn {
    /// Finds the primary and connects to it (the caller bounds the time).
    pub(crate) async fn open(config: RedisConfig) -> RedisResult<Self> {
        let sentinels = config
            .endpoints()
            .iter()
            .map(|_| Mutex::new(None))
            .collect();
        let conn = SentinelConn {
            config,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(0),
            sentinels,
            confirming: tokio::sync::Mutex::new(None),
        };
        conn.connection().await?;
        Ok(conn)
    }

    pub(crate) fn db(&self) -> i64 {
        self.config.db()
    }

    fn name(&self) -> &str {
        self.config.master_name().unwrap_or_default()
    }

    /// The connection in use, or a new one to the primary the Sentinels name now.
    async fn connection(&self) -> RedisResult<Primary> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let mut generation = self.connecting.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let (addr, conn) = self.connect().await?;
        *generation += 1;
        let fresh = Primary {
            generation: *generation,
            addr,
            conn,
        };
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(fresh.clone());
        Ok(fresh)
    }

    fn current(&self) -> Option<Primary> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Drops the connection of `generation` if it is still the one in use.
    fn forget(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|p| p.generation == generation) {
            *current = None;
        }
    }

    /// Asks the Sentinels, then connects to the first named address that is a primary.
    async fn connect(&self) -> RedisResult<(Addr, MultiplexedConnection)> {
        let timeout = self.config.timeout();
        let name = self.name();
        let tally = self.ask_sentinels().await;
        let candidates = self.candidates(tally)?;
        let config = AsyncConnectionConfig::new().set_connection_timeout(timeout);
        let mut seen = Vec::new();
        for ((host, port), votes) in candidates {
            let client = Client::open(self.config.connection_info(&host, port))?;
            let found = async {
                let mut conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                let role = is_primary(&mut conn).await?;
                Ok::<_, RedisError>((conn, role))
            }
            .await;
            match found {
                Ok((conn, true)) => return Ok(((host, port), conn)),
                Ok((_, false)) => {
                    seen.push(format!("{host}:{port} (named by {votes}) is a replica"))
                }
                // The server answered, with a refusal that asking again will not change (a
                // database out of range, wrong credentials): the URL needs fixing.
                Err(e) if is_refusal(&e) => {
                    return Err(RedisError::from((
                        e.kind(),
                        "the primary refused the connection",
                        format!(
                            "master `{name}` at {host}:{port} (named by {votes}): {}",
                            scrub(e.to_string(), self.config.password())
                        ),
                    )))
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

    /// The addresses to try, most named first, with how many of the Sentinels named each; or why
    /// there are none.
    fn candidates(&self, tally: Tally) -> RedisResult<Vec<(Addr, String)>> {
        let name = self.name();
        let failed = tally.failed.join("; ");
        if tally.named.is_empty() && !tally.unknown.is_empty() {
            return Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "unknown master name",
                format!(
                    "the Sentinels at {} know no master named `{name}` (SENTINEL \
                     get-master-addr-by-name answered nil){}",
                    tally.unknown.join(", "),
                    if failed.is_empty() {
                        String::new()
                    } else {
                        format!("; no answer from {failed}")
                    }
                ),
            )));
        }
        if tally.named.is_empty() && tally.refused > 0 && tally.refused == tally.failed.len() {
            // Every Sentinel that answered refused us: wrong or missing credentials, which
            // asking again will not fix.
            return Err(RedisError::from((
                ErrorKind::AuthenticationFailed,
                "the Sentinels refused the credentials",
                format!(
                    "master `{name}`: {failed} (the Sentinels' own user and password are the URL \
                     options sentinel_username and sentinel_password)"
                ),
            )));
        }
        if tally.named.is_empty()
            && tally.not_sentinels > 0
            && tally.not_sentinels + tally.refused == tally.failed.len()
        {
            // Every server that answered refused the SENTINEL command: the URL names Redis
            // servers (the primary itself, say), not Sentinels.
            return Err(RedisError::from((
                ErrorKind::ResponseError,
                "no Sentinel at the URL's addresses",
                format!(
                    "master `{name}`: {failed} (a redis+sentinel:// URL names the Sentinels, \
                     port 26379 by default; for a Redis server itself use redis://host:port)"
                ),
            )));
        }
        if tally.named.is_empty() {
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                format!("no Sentinel answered for master `{name}`: {failed}"),
            )));
        }
        let asked = self.sentinels.len();
        Ok(tally
            .named
            .into_iter()
            .map(|(addr, n)| (addr, format!("{n} of {asked} Sentinels")))
            .collect())
    }

    /// Asks every Sentinel at once which address is the primary of the URL's master name.
    ///
    /// The answer is settled when every Sentinel answered, when one address is named by more
    /// than half of the URL's Sentinels, or, once at least one answered, when half the deadline
    /// has passed.
    async fn ask_sentinels(&self) -> Tally {
        let name = self.name();
        let sentinels = self.config.endpoints();
        let window = self.config.timeout() / 2;
        let mut asks: FuturesUnordered<_> = sentinels
            .iter()
            .enumerate()
            .map(|(i, (host, port))| {
                let at = format!("{host}:{port}");
                async move {
                    let answer = tokio::time::timeout(window, self.ask(i, name, window)).await;
                    (at, answer)
                }
            })
            .collect();
        let mut votes: HashMap<Addr, usize> = HashMap::new();
        let mut tally = Tally {
            named: Vec::new(),
            answered: 0,
            unknown: Vec::new(),
            failed: Vec::new(),
            refused: 0,
            not_sentinels: 0,
        };
        while let Some((at, answer)) = asks.next().await {
            match answer {
                Ok(Ok(Some(addr))) => {
                    tally.answered += 1;
                    *votes.entry(addr).or_default() += 1;
                }
                Ok(Ok(None)) => {
                    tally.answered += 1;
                    tally.unknown.push(at);
                }
                Ok(Err(e)) => {
                    if e.kind() == ErrorKind::AuthenticationFailed
                        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
                    {
                        tally.refused += 1;
                    } else if e.kind() == ErrorKind::ResponseError
                        && e.to_string().contains("unknown command")
                    {
                        tally.not_sentinels += 1;
                    }
                    tally
                        .failed
                        .push(scrub(format!("{at}: {e}"), self.config.sentinel_password()));
                }
                Err(_) => tally
                    .failed
                    .push(format!("{at}: no answer within {window:?}")),
            }
            if votes.values().any(|v| *v * 2 > sentinels.len()) {
                break;
            }
        }
        let mut named: Vec<_> = votes.into_iter().collect();
        named.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        tally.named = named;
        tally
    }

    /// One Sentinel's answer for `name` (the `i`th of the URL): the address, or `None` when it
    /// watches no such master. Its connection is kept for the next question, and dropped on a
    /// fault.
    async fn ask(&self, i: usize, name: &str, timeout: Duration) -> RedisResult<Option<Addr>> {
        let slot = &self.sentinels[i];
        let kept = slot.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let mut conn = match kept {
            Some(conn) => conn,
            None => {
                let (host, port) = &self.config.endpoints()[i];
                let client = Client::open(self.config.sentinel_connection_info(host, *port))?;
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(timeout);
                let conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
                conn
            }
        };
        let answer = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(name)
            .query_async(&mut conn)
            .await;
        if answer.is_err() {
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
        answer
    }

    /// Confirms that `primary`, whose reply arrived at `replied`, is the primary the Sentinels
    /// name: by a confirmation that started after `replied`, this call's own or one it waited
    /// for. When they name another address the connection is dropped.
    async fn confirm(&self, primary: &Primary, replied: Instant) -> RedisResult<()> {
        let mut last = self.confirming.lock().await;
        let fresh = last.as_ref().filter(|c| c.started >= replied);
        let named = match fresh {
            Some(c) => c.named.clone(),
            None => {
                let started = Instant::now();
                let named = self.named_primary(primary).await;
                *last = Some(Confirmation {
                    started,
                    named: named.clone(),
                });
                named
            }
        };
        drop(last);
        let name = self.name();
        match named {
            Ok(addr) if addr == primary.addr => Ok(()),
            Ok((host, port)) => {
                self.forget(primary.generation);
                Err(RedisError::from((
                    ErrorKind::MasterDown,
                    "the primary changed (a Sentinel failover)",
                    format!(
                        "the Sentinels now name {host}:{port} as the primary of `{name}`, not \
                         {}:{}, which answered: its answer is discarded (a deposed primary's \
                         writes never reach the new one), and the next call goes to {host}:{port}",
                        primary.addr.0, primary.addr.1
                    ),
                )))
            }
            Err(why) => Err(RedisError::from((
                ErrorKind::MasterDown,
                "the Sentinels did not confirm the primary",
                format!(
                    "master `{name}`: {why}; the answer of {}:{} is discarded, since it may come \
                     from a deposed primary",
                    primary.addr.0, primary.addr.1
                ),
            ))),
        }
    }

    /// The address the Sentinels name now: `primary`'s unless another is named by more of them;
    /// an error when fewer than half of them (or none) answered.
    async fn named_primary(&self, primary: &Primary) -> Result<Addr, String> {
        let tally = self.ask_sentinels().await;
        let asked = self.sentinels.len();
        if tally.answered * 2 < asked || tally.answered == 0 {
            return Err(format!(
                "{} of {asked} Sentinels answered ({})",
                tally.answered,
                tally.failed.join("; ")
            ));
        }
        let ours = tally
            .named
            .iter()
            .find(|(a, _)| *a == primary.addr)
            .map_or(0, |(_, n)| *n);
        match tally.named.first() {
            Some((best, n)) if *n > ours => Ok(best.clone()),
            _ if ours > 0 => Ok(primary.addr.clone()),
            _ => Err(format!(
                "the Sentinels that answered name no primary ({})",
                tally.unknown.join(", ")
            )),
        }
    }

    /// Sends `cmd` on the connection in use and confirms its answer; a fault, or a call
    /// dropped before it finished, drops the connection so the next call asks the Sentinels
    /// again.
    pub(crate) fn request<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let primary = self.connection().await?;
            let mut conn = primary.conn.clone();
            let mut watch = Unfinished::new(self, primary.generation);
            let result = conn.req_packed_command(cmd).await;
            watch.finish(&result);
            let replied = Instant::now();
            let value = result?;
            self.confirm(&primary, replied).await?;
            Ok(value)
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
            let primary = self.connection().await?;
            let mut conn = primary.conn.clone();
            let mut watch = Unfinished::new(self, primary.generation);
            let result = conn.req_packed_commands(cmd, offset, count).await;
            watch.finish(&result);
            let replied = Instant::now();
            let values = result?;
            self.confirm(&primary, replied).await?;
            Ok(values)
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

/// Whether `e` is a server's refusal that asking again will not change (a database out of
/// range, wrong credentials), as opposed to a fault that may pass (loading, out of memory).
fn is_refusal(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ResponseError | ErrorKind::AuthenticationFailed
    ) && !matches!(
        e.code(),
        Some("OOM" | "BUSY" | "MISCONF" | "LOADING" | "TRYAGAIN" | "MASTERDOWN")
    ) && !e.to_string().contains("max number of clients")
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
