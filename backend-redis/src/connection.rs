//! Connecting to a single server, to a Cluster or through Sentinels, checking that it speaks the Redis protocol, and
//! the connection every call of a store goes through.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use headcount_core::{Error, Result};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use crate::config::{Deployment, RedisConfig};
use crate::errors::{self, BACKEND};
use crate::reconnect::{Open, Reconnecting};
use crate::sentinel::SentinelConn;

/// The placeholder URLs of the stores over an application's client: only their default
/// options are used.
pub(crate) const SINGLE_DEFAULTS: &str = "redis://localhost";
pub(crate) const CLUSTER_DEFAULTS: &str = "redis+cluster://localhost:6379";

/// A connection to a single server or to a Cluster. Both reconnect by themselves: the
/// `ConnectionManager` replaces a broken connection on the next call, the Cluster connection
/// re-resolves its slot map and reconnects to nodes as needed; and both are replaced after a
/// call that ran out of time ([`crate::reconnect`]).
/// A Sentinel connection asks the Sentinels for the primary again after a fault (see
/// [`crate::sentinel`]).
#[derive(Clone)]
pub(crate) enum Conn {
    /// The connection, and the database it selects.
    Single(Arc<Reconnecting<ConnectionManager>>, i64),
    Cluster(Arc<Reconnecting<ClusterConnection>>),
    Sentinel(Arc<SentinelConn>),
    /// Another connection that sends `WAIT` after each command, in the same request
    /// ([`Conn::waiting`]).
    Waiting(Arc<WaitAfter>),
}

/// A connection that sends `WAIT` after each command in the same request (see
/// [`Conn::waiting`]), and the last `WAIT`'s answer.
pub(crate) struct WaitAfter {
    conn: Conn,
    wait: Cmd,
    acked: std::sync::Mutex<Option<Value>>,
}

impl WaitAfter {
    /// Sends `pipe` with `WAIT` after it, on one connection in one request; keeps `WAIT`'s
    /// answer and returns the pipeline's.
    async fn send(&self, pipe: &Pipeline, offset: usize, count: usize) -> RedisResult<Vec<Value>> {
        let mut both = pipe.clone();
        both.add_command(self.wait.clone());
        let mut conn = self.conn.clone();
        let mut values = conn.req_packed_commands(&both, offset, count + 1).await?;
        let acked = values.pop();
        *self.acked.lock().unwrap_or_else(PoisonError::into_inner) = acked;
        Ok(values)
    }
}

impl Conn {
    /// This connection, sending `WAIT replicas millis` after every command in the same request:
    /// a pipeline of the two on one connection, so a write and its `WAIT` never go to two
    /// connections. (Sent apart, a connection replaced between them, after a call cut short
    /// by its deadline, would make the `WAIT` go on a fresh connection that wrote nothing,
    /// which counts every connected replica at once and confirms the write whether or not a
    /// replica has it.) The last `WAIT`'s answer is [`Conn::replicas_acked`].
    pub(crate) fn waiting(&self, replicas: u32, millis: u64) -> Conn {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(millis);
        Conn::Waiting(Arc::new(WaitAfter {
            conn: self.clone(),
            wait,
            acked: std::sync::Mutex::new(None),
        }))
    }

    /// The answer of the last `WAIT` a [`Conn::waiting`] connection sent: how many replicas
    /// hold every write made on its connection until then (an error reply as it came); `None`
    /// before any command, and on other connections.
    pub(crate) fn replicas_acked(&self) -> Option<Value> {
        match self {
            Conn::Waiting(w) => w
                .acked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            _ => None,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c, _) => {
                Box::pin(c.run(move |mut conn| async move { conn.req_packed_command(cmd).await }))
            }
            Conn::Cluster(c) => {
                Box::pin(c.run(move |mut conn| async move { conn.req_packed_command(cmd).await }))
            }
            Conn::Sentinel(c) => c.request(cmd),
            Conn::Waiting(w) => Box::pin(async move {
                let mut pipe = redis::pipe();
                pipe.add_command(cmd.clone());
                let mut values = w.send(&pipe, 0, 1).await?;
                values.pop().ok_or_else(|| {
                    RedisError::from((
                        redis::ErrorKind::ResponseError,
                        "a command sent with WAIT came back without its answer",
                    ))
                })
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c, _) => Box::pin(c.run(move |mut conn| async move {
                conn.req_packed_commands(cmd, offset, count).await
            })),
            Conn::Cluster(c) => Box::pin(c.run(move |mut conn| async move {
                conn.req_packed_commands(cmd, offset, count).await
            })),
            Conn::Sentinel(c) => c.request_many(cmd, offset, count),
            Conn::Waiting(w) => Box::pin(w.send(cmd, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(_, db) => *db,
            // Redis Cluster has database 0 only.
            Conn::Cluster(_) => 0,
            Conn::Sentinel(c) => c.db(),
            Conn::Waiting(w) => w.conn.get_db(),
        }
    }
}

/// The connection manager's settings: one retry with short waits, since the manager reconnects on
/// the next call anyway, and a call must not wait out a long backoff. No response timeout: every
/// call already runs within the store's deadline (`RedisStore::run`), so a second timer per call
/// would only add work (and a timed-out request is no reason for the manager to reconnect
/// either way).
fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(timeout)
        .set_number_of_retries(1)
        .set_factor(10)
        .set_max_delay(100)
}

/// Connects to the server or Cluster `config` names and checks that it answers, within the
/// deadline.
pub(crate) async fn open(config: &RedisConfig) -> Result<Conn> {
    let timeout = config.timeout();
    let deadline = config.deadline();
    let password = config.password().map(str::to_owned);
    let classify = |e: RedisError| errors::classify(e, "connect", deadline, password.as_deref());
    let work = async {
        let conn = match config.deployment() {
            Deployment::Single => {
                let (host, port) = config
                    .endpoints()
                    .first()
                    .cloned()
                    .ok_or_else(|| Error::config("invalid Redis URL: no host"))?;
                let client =
                    redis::Client::open(config.connection_info(&host, port)).map_err(classify)?;
                let manager_config = manager_config(timeout);
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
                let db = manager.get_db();
                Conn::Single(
                    Arc::new(Reconnecting::new(
                        Some(reopen_manager(client, manager_config)),
                        manager,
                    )),
                    db,
                )
            }
            Deployment::Cluster => {
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
                let open: Open<ClusterConnection> = Box::new(move || {
                    let client = client.clone();
                    Box::pin(async move { client.get_async_connection().await })
                });
                Conn::Cluster(Arc::new(Reconnecting::new(Some(open), conn)))
            }
            Deployment::Sentinel => {
                let conn = SentinelConn::open(config.clone()).await.map_err(classify)?;
                Conn::Sentinel(Arc::new(conn))
            }
        };
        Ok::<_, Error>(conn)
    };
    deadline.run("connect", work).await
}

/// Opens a connection manager over an application's client and checks that the server answers,
/// within the deadline of `config`.
pub(crate) async fn open_client(client: redis::Client, config: &RedisConfig) -> Result<Conn> {
    let timeout = config.timeout();
    let manager_config = manager_config(timeout);
    let deadline = config.deadline();
    let open = async {
        let mut manager =
            ConnectionManager::new_with_config(client.clone(), manager_config.clone()).await?;
        redis::cmd("PING").query_async::<()>(&mut manager).await?;
        Ok::<_, RedisError>(manager)
    };
    let manager = deadline
        .run("connect", async {
            open.await
                .map_err(|e| errors::classify(e, "connect", deadline, None))
        })
        .await?;
    let db = manager.get_db();
    Ok(Conn::Single(
        Arc::new(Reconnecting::new(
            Some(reopen_manager(client, manager_config)),
            manager,
        )),
        db,
    ))
}

/// Opens a connection manager like the first one, for [`Reconnecting`].
fn reopen_manager(
    client: redis::Client,
    manager_config: ConnectionManagerConfig,
) -> Open<ConnectionManager> {
    Box::new(move || {
        let (client, manager_config) = (client.clone(), manager_config.clone());
        Box::pin(async move { ConnectionManager::new_with_config(client, manager_config).await })
    })
}
