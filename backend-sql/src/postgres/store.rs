//! [`PostgresStore`]: building a store over a URL, a configuration or an application's pool, and
//! its [`Backend`](backend::Backend) implementation, each primitive one statement of
//! [`sql`](super::sql).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use headcount_core::backend::{self, ttl_millis};
use headcount_core::notify::{Notifications, NotifyHub};
use headcount_core::store::RenewedListing;
use headcount_core::{Capabilities, Durability, Error, Op, Result};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::config::PostgresConfig;
use super::connection::{self, Connections};
use super::errors::BACKEND;
use super::probe;
use super::sql::prefix_patterns;

/// A [`Store`](headcount_core::Store) in a PostgreSQL table, shared by any number of processes and machines.
///
/// Cloning is cheap and shares the connection pools (the callers' and garbage collection's).
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Connections>,
    notify: Arc<Notify>,
}

/// Change notifications: the subscribers, and the task that holds `LISTEN` for them on a
/// connection of its own (see [`super::notify`]).
struct Notify {
    hub: NotifyHub,
    /// False over an application's pool, whose connection settings the store does not own.
    own_connection: bool,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self.inner.pool.status();
        let gc = self.inner.gc_connections();
        f.debug_struct("PostgresStore")
            .field("config", &self.inner.config)
            .field("connections", &status.size)
            .field("idle", &status.available)
            .field("gc_connections", &gc)
            .finish()
    }
}

impl PostgresStore {
    /// Connects to the server named by a `postgres://` or `postgresql://` URL (see the crate
    /// README for its options) and creates the table if it is missing. Fails with
    /// [`Error::Rejected`] for bad credentials or permissions, [`Error::Unavailable`] or
    /// [`Error::Timeout`] when the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(PostgresConfig::from_url(url)?).await
    }

    /// Like [`connect`](Self::connect) with an already parsed configuration.
    ///
    /// When connecting times out, each host is asked once more whether it speaks PostgreSQL at
    /// all: a server that answers as PostgreSQL never does (a Redis, an HTTP service behind a
    /// wrong port) makes the failure [`Error::Rejected`], since retrying will not help.
    pub async fn connect_with(config: PostgresConfig) -> Result<Self> {
        let (pool, gc_pool) = connection::pools(&config).await?;
        let pg = config.pg.clone();
        match Self::over(pool, Some(gc_pool), config, true).await {
            Err(Error::Timeout { backend, op, after }) => {
                match probe::not_postgres(&pg, after).await {
                    Some(found) => Err(Error::Rejected {
                        backend: BACKEND,
                        message: format!(
                            "connecting timed out after {after:?}, and {found} to a line of text: \
                         is this the port of a PostgreSQL server?"
                        ),
                        source: None,
                    }),
                    None => Err(Error::Timeout { backend, op, after }),
                }
            }
            other => other,
        }
    }

    /// A store over a `deadpool-postgres` pool the application already has (re-exported as
    /// [`deadpool_postgres`]), with the default table (`headcount_kv`) and operation timeout.
    /// Creates the table if it is missing. Connections that break or time out are dropped
    /// from the pool, as with [`connect`](Self::connect). [`connect`](Self::connect) builds its
    /// pool with `QueueMode::Lifo`, which keeps a light load on a few warm connections; a pool
    /// left at deadpool's default FIFO spreads calls over all its connections, which on a fast
    /// network can nearly double each call's latency. Garbage collection, every 1000 writes,
    /// takes one of the pool's connections for a few milliseconds (a store from
    /// [`connect`](Self::connect) keeps a connection of its own for it).
    pub async fn from_pool(pool: Pool) -> Result<Self> {
        Self::from_pool_with(pool, pool_defaults()?).await
    }

    /// [`from_pool`](Self::from_pool) with the table and timeout of `config` (its host, user,
    /// password and TLS settings are not used: the pool's are).
    pub async fn from_pool_with(pool: Pool, config: PostgresConfig) -> Result<Self> {
        Self::over(pool, None, config, false).await
    }

    /// A store over `pool`, collecting garbage over `gc_pool` (else `pool`).
    async fn over(
        pool: Pool,
        gc_pool: Option<Pool>,
        config: PostgresConfig,
        own_connection: bool,
    ) -> Result<Self> {
        let store = PostgresStore {
            inner: Arc::new(Connections::new(pool, gc_pool, config)),
            notify: Arc::new(Notify {
                hub: NotifyHub::new(),
                own_connection,
            }),
        };
        // Connecting eagerly reports bad credentials or an unreachable server now, not at the
        // first operation.
        store.inner.prepare().await?;
        Ok(store)
    }

    /// The configuration this store was built from.
    pub fn config(&self) -> &PostgresConfig {
        &self.inner.config
    }

    /// Closes the pools: later operations fail with [`Error::Unavailable`].
    pub fn close(&self) {
        self.inner.close();
    }

    fn note_write(&self) {
        self.inner.note_write();
    }

    /// How many of the connections this store has used reach the PostgreSQL server itself (its
    /// statements are prepared on them) and how many go through a pooler such as PgBouncer (its
    /// statements are sent unnamed there). For tests; not part of the public API.
    #[doc(hidden)]
    pub fn connections_direct_and_pooled(&self) -> (usize, usize) {
        self.inner.connection_kinds()
    }

    /// Runs one garbage collection now, as the store does in the background every 1000 writes:
    /// deletes the expired rows among the next 1000 rows of the table (in primary key order)
    /// after where the previous one stopped. For tests; not part of the public API.
    #[doc(hidden)]
    pub async fn collect_garbage_now(&self) -> Result<super::GarbageCollection> {
        self.inner.collect_garbage().await
    }
}

/// The options of a store over an application's pool: the defaults (its connection parts, a
/// placeholder, are not used).
fn pool_defaults() -> Result<PostgresConfig> {
    PostgresConfig::from_url("postgres://headcount@localhost")
}

fn unexpected_column(e: tokio_postgres::Error) -> Error {
    Error::rejected(BACKEND, format!("unexpected result column: {e}"), e)
}

/// The rows of a renewal with a listing: column 0 says whether the renewal applied, columns
/// `first` and `first + 1` hold a key and its value (both NULL on the one row of an empty or
/// unsent listing).
fn renewal_rows(rows: &[Row], first: usize) -> Result<(bool, Vec<(String, String)>)> {
    let mut renewed = false;
    let mut listed = Vec::with_capacity(rows.len());
    for row in rows {
        renewed = row.try_get(0).map_err(unexpected_column)?;
        let key: Option<String> = row.try_get(first).map_err(unexpected_column)?;
        let value: Option<String> = row.try_get(first + 1).map_err(unexpected_column)?;
        if let (Some(key), Some(value)) = (key, value) {
            listed.push((key, value));
        }
    }
    Ok((renewed, listed))
}

fn first_column<T>(rows: &[Row]) -> Result<Option<T>>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    match rows.first() {
        None => Ok(None),
        Some(row) => row
            .try_get(0)
            .map(Some)
            .map_err(|e| Error::rejected(BACKEND, format!("unexpected result column: {e}"), e)),
    }
}

#[async_trait]
impl backend::Backend for PostgresStore {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(BACKEND);
        caps.native_set_max = true;
        caps.native_incr_and_get = true;
        caps.native_renew_and_list = true;
        caps.native_compare_and_delete = true;
        caps.native_renew_and_versions = true;
        caps.native_notifications = self.notify.own_connection && self.inner.notifying();
        caps.ttl_reads = true;
        caps
    }

    /// `LISTEN` on one connection of the store handle's own (see the crate README, "Change
    /// notifications"). Silent over an application's pool (`from_pool`), and when the table's
    /// change triggers are missing and this role could not install them (said once).
    async fn subscribe(&self, dir: &str) -> Result<Notifications> {
        if !backend::Backend::capabilities(self).native_notifications {
            return Ok(Notifications::never(dir));
        }
        let (config, channel) = (self.inner.config.clone(), self.inner.sql.channel.clone());
        let warned = self.inner.notify_warned.clone();
        Ok(self.notify.hub.subscribe_listened(dir, |hub| {
            super::notify::listen(config, channel, hub, warned)
        }))
    }

    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        let ttl_ms = ttl_millis(ttl);
        let (head, whole) = prefix_patterns(prefix);
        let rows = self
            .inner
            .query(
                Op::RenewAndList,
                &self.inner.sql.renew_and_list,
                &[&key, &ttl_ms, &holder, &head, &whole],
                None,
            )
            .await?;
        self.note_write();
        let (renewed, listed) = renewal_rows(&rows, 1)?;
        Ok((renewed, listed))
    }

    /// One statement: the renewal, and the directory's entries with a digest the server
    /// computes (SHA-256 of the entries, length-prefixed); the entries cross the wire only when the
    /// digest differs from `since`. An unchanged directory costs the wire a constant amount; the
    /// server still reads the directory's rows (an index range scan), so
    /// [`Capabilities::native_change_version`] stays false.
    async fn renew_and_list_if_changed(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dir: &str,
        since: Option<&str>,
    ) -> Result<RenewedListing> {
        let ttl_ms = ttl_millis(ttl);
        let (head, whole) = prefix_patterns(dir);
        let rows = self
            .inner
            .query(
                Op::RenewAndListIfChanged,
                &self.inner.sql.renew_if_changed,
                &[&key, &ttl_ms, &holder, &head, &whole, &dir, &since],
                None,
            )
            .await?;
        self.note_write();
        let (renewed, listed) = renewal_rows(&rows, 2)?;
        let version: String = match rows.first() {
            Some(row) => row.try_get(1).map_err(unexpected_column)?,
            None => {
                return Err(Error::rejected(
                    BACKEND,
                    "renew_and_list_if_changed returned no row",
                    "the statement always returns one",
                ))
            }
        };
        // The digest equals `since`: no rows came. It differs: every entry came (none when the
        // directory is empty, which the caller may not hold yet).
        let listing = (since != Some(version.as_str())).then_some(listed);
        Ok(RenewedListing::new(renewed, version, listing))
    }

    /// One statement: the renewal, and for each directory the digest
    /// [`renew_and_list_if_changed`](backend::Backend::renew_and_list_if_changed) answers for it,
    /// each over the same index range as that call's listing; no entries cross the wire.
    async fn renew_and_versions(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[(&str, Option<&str>)],
    ) -> Result<(bool, Vec<String>)> {
        let ttl_ms = ttl_millis(ttl);
        let patterns: Vec<(String, String)> =
            dirs.iter().map(|(dir, _)| prefix_patterns(dir)).collect();
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&key, &ttl_ms, &holder];
        for ((dir, _), (head, whole)) in dirs.iter().zip(&patterns) {
            params.extend([head as &(dyn ToSql + Sync), whole, dir]);
        }
        let statement = self.inner.sql.renew_versions(dirs.len());
        let rows = self
            .inner
            .query(Op::RenewAndVersions, &statement, &params, None)
            .await?;
        self.note_write();
        let row = rows.first().ok_or_else(|| {
            Error::rejected(
                BACKEND,
                "renew_and_versions returned no row",
                "the statement always returns one",
            )
        })?;
        let renewed: bool = row.try_get(0).map_err(unexpected_column)?;
        let versions = (1..=dirs.len())
            .map(|i| row.try_get::<_, String>(i).map_err(unexpected_column))
            .collect::<Result<Vec<_>>>()?;
        Ok((renewed, versions))
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        let ttl_ms = ttl.map(ttl_millis);
        let rows = self
            .inner
            .query(Op::Incr, &self.inner.sql.incr, &[&key, &ttl_ms], Some(key))
            .await?;
        self.note_write();
        first_column::<i64>(&rows)?.ok_or_else(|| {
            Error::rejected(
                BACKEND,
                "incr returned no row",
                "INSERT ... RETURNING gave nothing",
            )
        })
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        let rows = self
            .inner
            .query(Op::Get, &self.inner.sql.get, &[&key], None)
            .await?;
        first_column(&rows)
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        let ttl_ms = ttl_millis(ttl);
        let rows = self
            .inner
            .query(Op::Expire, &self.inner.sql.expire, &[&key, &ttl_ms], None)
            .await?;
        self.note_write();
        Ok(!rows.is_empty())
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        let ttl_ms = ttl.map(ttl_millis);
        let rows = match expected {
            Some(expected) => {
                self.inner
                    .query(
                        Op::CompareAndSet,
                        &self.inner.sql.cas_update,
                        &[&key, &ttl_ms, &new, &expected],
                        None,
                    )
                    .await?
            }
            None => {
                self.inner
                    .query(
                        Op::CompareAndSet,
                        &self.inner.sql.cas_insert,
                        &[&key, &ttl_ms, &new],
                        None,
                    )
                    .await?
            }
        };
        self.note_write();
        Ok(!rows.is_empty())
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let rows = self
            .inner
            .query(Op::Delete, &self.inner.sql.delete, &[&key], None)
            .await?;
        self.note_write();
        Ok(first_column::<bool>(&rows)?.unwrap_or(false))
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        let rows = self
            .inner
            .query(
                Op::CompareAndDelete,
                &self.inner.sql.compare_and_delete,
                &[&key, &expected],
                None,
            )
            .await?;
        self.note_write();
        Ok(!rows.is_empty())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let (head, whole) = prefix_patterns(prefix);
        let rows = self
            .inner
            .query(Op::List, &self.inner.sql.list, &[&head, &whole], None)
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<std::result::Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| Error::rejected(BACKEND, format!("unexpected result column: {e}"), e))
    }

    async fn list_with_ttl(&self, prefix: &str) -> Result<Vec<(String, String, Option<Duration>)>> {
        let (head, whole) = prefix_patterns(prefix);
        let rows = self
            .inner
            .query(
                Op::ListWithTtl,
                &self.inner.sql.list_with_ttl,
                &[&head, &whole],
                None,
            )
            .await?;
        rows.iter()
            .map(|row| {
                let left: Option<i64> = row.try_get(2)?;
                let left = left.map(|ms| Duration::from_millis(ms.max(0) as u64));
                Ok((row.try_get(0)?, row.try_get(1)?, left))
            })
            .collect::<std::result::Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| Error::rejected(BACKEND, format!("unexpected result column: {e}"), e))
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        let ttl_ms = ttl.map(ttl_millis);
        let rows = self
            .inner
            .query(
                Op::SetMax,
                &self.inner.sql.set_max,
                &[&key, &ttl_ms, &value],
                Some(key),
            )
            .await?;
        self.note_write();
        Ok(!rows.is_empty())
    }

    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> Result<(i64, Option<String>)> {
        let ttl_ms = ttl.map(ttl_millis);
        let rows = self
            .inner
            .query(
                Op::IncrAndGet,
                &self.inner.sql.incr_and_get,
                &[&incr_key, &ttl_ms, &by, &get_key],
                Some(incr_key),
            )
            .await?;
        self.note_write();
        let row = rows.first().ok_or_else(|| {
            Error::rejected(
                BACKEND,
                "incr_and_get returned no row",
                "INSERT ... RETURNING gave nothing",
            )
        })?;
        let value: i64 = row
            .try_get(0)
            .map_err(|e| Error::rejected(BACKEND, format!("unexpected result column: {e}"), e))?;
        let read: Option<String> = row
            .try_get(1)
            .map_err(|e| Error::rejected(BACKEND, format!("unexpected result column: {e}"), e))?;
        Ok((value, read))
    }

    /// Durable when `fsync` is on and `synchronous_commit` is anything but `off`: `local`, `on`,
    /// `remote_write` and `remote_apply` all wait for the local WAL flush before the commit is
    /// acknowledged (the last three also wait for standbys, which only adds safety). Read with
    /// `current_setting` on one of this store's own connections, so a per-role or per-database
    /// override is what counts.
    async fn durability(&self) -> Result<Durability> {
        let rows = self
            .inner
            .query(Op::Durability, &self.inner.sql.durability, &[], None)
            .await?;
        let settings = rows
            .first()
            .map(|row| {
                Ok::<Settings, tokio_postgres::Error>(Settings {
                    fsync: row.try_get(0)?,
                    synchronous_commit: row.try_get(1)?,
                    standbys: row.try_get(2)?,
                    synchronous_standby_names: row.try_get(3)?,
                })
            })
            .transpose()
            .map_err(|e| Error::rejected(BACKEND, format!("unexpected result column: {e}"), e))?;
        let Some(settings) = settings else {
            return Err(Error::Rejected {
                backend: BACKEND,
                message: "current_setting('fsync') returned no row".into(),
                source: None,
            });
        };
        // The running server: its databases share the start time and port (through a pooler,
        // the server's, not the pooler's). (Not `system_identifier`: clusters copied from one
        // base backup or template share it.)
        let rows = self
            .inner
            .query(Op::Durability, &self.inner.sql.server, &[], None)
            .await?;
        let servers = rows
            .first()
            .and_then(|row| row.try_get::<_, Option<String>>(0).ok())
            .flatten()
            .map(|id| vec![format!("postgresql server started {id}")])
            .unwrap_or_default();
        Ok(settings_durability(&settings).with_servers(servers))
    }
}

/// What [`settings_durability`] judges.
struct Settings {
    fsync: String,
    synchronous_commit: String,
    /// Standbys streaming from this server.
    standbys: i64,
    synchronous_standby_names: String,
}

/// Judges PostgreSQL's `fsync` and `synchronous_commit` settings, and its replication: a standby
/// that is promoted after a failover has only what was replicated to it, so with standbys
/// attached a write is durable only when they are synchronous (`synchronous_standby_names` set
/// and `synchronous_commit` at least `on`).
fn settings_durability(s: &Settings) -> Durability {
    let (fsync, commit) = (s.fsync.as_str(), s.synchronous_commit.as_str());
    let mut detail = format!("fsync {fsync}, synchronous_commit {commit}");
    if fsync != "on" || commit == "off" {
        return Durability::not_durable(format!(
            "{detail} (durable needs fsync on and synchronous_commit other than off)"
        ));
    }
    if s.standbys > 0 {
        detail.push_str(&format!(
            ", {} standby(s), synchronous_standby_names '{}'",
            s.standbys, s.synchronous_standby_names
        ));
        let synchronous = !s.synchronous_standby_names.trim().is_empty()
            && matches!(commit, "on" | "remote_write" | "remote_apply");
        if !synchronous {
            return Durability::not_durable(format!(
                "{detail} (a promoted asynchronous standby can lose acknowledged writes: set synchronous_standby_names and synchronous_commit = on)"
            ));
        }
    }
    Durability::durable(detail)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn the_defaults_of_a_pooled_store_parse() {
        assert!(pool_defaults().is_ok());
    }

    fn settings(fsync: &str, commit: &str, standbys: i64, names: &str) -> Settings {
        Settings {
            fsync: fsync.into(),
            synchronous_commit: commit.into(),
            standbys,
            synchronous_standby_names: names.into(),
        }
    }

    #[test]
    fn durability_needs_fsync_and_a_waiting_commit() {
        for commit in ["on", "local", "remote_write", "remote_apply"] {
            assert!(
                settings_durability(&settings("on", commit, 0, "")).durable,
                "{commit}"
            );
        }
        let off = settings_durability(&settings("on", "off", 0, ""));
        assert!(!off.durable && off.detail.contains("synchronous_commit off"));
        assert!(!settings_durability(&settings("off", "on", 0, "")).durable);
        // Standbys: durable only when synchronous.
        let asynchronous = settings_durability(&settings("on", "on", 1, ""));
        assert!(!asynchronous.durable && asynchronous.detail.contains("standby"));
        assert!(!settings_durability(&settings("on", "local", 2, "s1")).durable);
        assert!(settings_durability(&settings("on", "on", 1, "FIRST 1 (s1)")).durable);
        assert!(settings_durability(&settings("on", "remote_apply", 1, "s1")).durable);
    }
}
