//! Connecting to a single server, to a Cluster or through Sentinels, checking that it speaks the Redis protocol, and
//! the connection every call of a store goes through.

use std::sync::Arc;
use std::time::Duration;

use headcount_core::{Error, Result};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

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
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(_, db) => *db,
            // Redis Cluster has database 0 only.
            Conn::Cluster(_) => 0,
            Conn::Sentinel(c) => c.db(),
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
