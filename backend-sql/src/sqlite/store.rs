//! [`SqliteStore`]: opening a store and its [`Backend`](backend::Backend) implementation, each
//! primitive one call of [`sql`](super::sql) on the worker thread.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use headcount_core::backend::{self, ttl_millis};
use headcount_core::notify::{Notifications, NotifyHub};
use headcount_core::{Capabilities, Durability, Op, Result};

use super::config::{Location, SqliteConfig};
use super::connection::Worker;
use super::errors::{Sql, BACKEND};
use super::sql::{
    compare_and_delete, compare_and_set, delete, expire, incr, incr_and_get, list,
    list_with_expiry, live_value, now_ms, renew_and_list, renew_and_versions, set_max,
};

/// A [`Store`](headcount_core::Store) in an SQLite database file (or in memory), shared safely by every process that
/// opens the same file on one machine.
///
/// Cloning is cheap and shares the connection and its worker thread, which stops when the last
/// clone is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Worker>,
    /// In-process change notifications, shared by every handle on the same file in this
    /// process (see [`hub_for`]).
    hub: NotifyHub,
}

/// The notification hub of the database at `location`: one per file per process, so two
/// handles opened on one file wake each other's subscribers; one per handle for an in-memory
/// database (which no other handle sees).
fn hub_for(location: &Location) -> NotifyHub {
    static HUBS: OnceLock<Mutex<HashMap<PathBuf, NotifyHub>>> = OnceLock::new();
    let Location::File(path) = location else {
        return NotifyHub::new();
    };
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
    HUBS.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(path)
        .or_default()
        .clone()
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("config", self.config())
            .finish()
    }
}

impl SqliteStore {
    /// Opens the store named by a URL: `sqlite://relative/path.db`, `sqlite:///absolute/path.db`
    /// or `sqlite::memory:`, with the query options `timeout`, `busy_timeout` and `synchronous`
    /// (see the crate README). The file is created when missing; its directory must exist.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(SqliteConfig::from_url(url)?).await
    }

    /// Like [`connect`](Self::connect) with an already built configuration, such as
    /// [`SqliteConfig::new`]`(path, options)` (`":memory:"` for a private in-memory database).
    /// The file is created when missing; its directory must exist.
    pub async fn connect_with(config: SqliteConfig) -> Result<Self> {
        let worker = Worker::start(config).await?;
        let hub = hub_for(worker.config().location());
        Ok(SqliteStore {
            inner: Arc::new(worker),
            hub,
        })
    }

    /// The configuration this store was opened with.
    pub fn config(&self) -> &SqliteConfig {
        self.inner.config()
    }

    /// Runs `f` on the worker thread within the operation deadline.
    pub(crate) async fn call<T, F>(&self, op: Op, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut rusqlite::Connection) -> Result<T> + Send + 'static,
    {
        self.inner.call(op.name(), f).await
    }

    fn is_memory(&self) -> bool {
        *self.config().location() == Location::Memory
    }
}

#[async_trait]
impl backend::Backend for SqliteStore {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(BACKEND);
        caps.native_set_max = true;
        caps.native_incr_and_get = true;
        caps.native_renew_and_list = true;
        caps.native_compare_and_delete = true;
        caps.native_renew_and_versions = true;
        caps.shared = !self.is_memory();
        caps.native_notifications = true;
        caps.ttl_reads = true;
        caps
    }

    /// In-process: a write through any handle on the same file in this process wakes the
    /// subscribers of its directory once it committed. Another process's writes are not
    /// notified (SQLite has no channel between processes): subscribers there learn of them by
    /// polling.
    async fn subscribe(&self, dir: &str) -> Result<Notifications> {
        Ok(self.hub.subscribe(dir))
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        let owned = key.to_owned();
        let ttl_ms = ttl.map(ttl_millis);
        let n = self
            .call(Op::Incr, move |conn| incr(conn, &owned, ttl_ms))
            .await?;
        self.hub.notify_key(key);
        Ok(n)
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_owned();
        self.call(Op::Get, move |conn| live_value(conn, &key, now_ms()))
            .await
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        let key = key.to_owned();
        let ttl_ms = ttl_millis(ttl);
        self.call(Op::Expire, move |conn| expire(conn, &key, ttl_ms))
            .await
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        // A renewal through compare-and-set (the same value) changes no value: not notified.
        let renewal = expected == Some(new);
        let owned = key.to_owned();
        let expected = expected.map(str::to_owned);
        let new = new.to_owned();
        let ttl_ms = ttl.map(ttl_millis);
        let wrote = self
            .call(Op::CompareAndSet, move |conn| {
                compare_and_set(conn, &owned, expected.as_deref(), &new, ttl_ms)
            })
            .await?;
        if wrote && !renewal {
            self.hub.notify_key(key);
        }
        Ok(wrote)
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let owned = key.to_owned();
        let deleted = self
            .call(Op::Delete, move |conn| delete(conn, &owned))
            .await?;
        if deleted {
            self.hub.notify_key(key);
        }
        Ok(deleted)
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        let (owned, expected) = (key.to_owned(), expected.to_owned());
        let deleted = self
            .call(Op::CompareAndDelete, move |conn| {
                compare_and_delete(conn, &owned, &expected)
            })
            .await?;
        if deleted {
            self.hub.notify_key(key);
        }
        Ok(deleted)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let prefix = prefix.to_owned();
        self.call(Op::List, move |conn| list(conn, &prefix, now_ms()))
            .await
    }

    async fn list_with_ttl(&self, prefix: &str) -> Result<Vec<(String, String, Option<Duration>)>> {
        let prefix = prefix.to_owned();
        self.call(Op::ListWithTtl, move |conn| {
            let now = now_ms();
            Ok(list_with_expiry(conn, &prefix, now)?
                .into_iter()
                .map(|(k, v, expires)| {
                    // A stored expiry carries the millisecond added so a key never falls short of
                    // its TTL (`sql::expiry`): the TTL itself ends a millisecond earlier.
                    let left = expires.map(|t| {
                        Duration::from_millis(t.saturating_sub(now).saturating_sub(1).max(0) as u64)
                    });
                    (k, v, left)
                })
                .collect())
        })
        .await
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        let owned = key.to_owned();
        let ttl_ms = ttl.map(ttl_millis);
        let wrote = self
            .call(Op::SetMax, move |conn| set_max(conn, &owned, value, ttl_ms))
            .await?;
        if wrote {
            self.hub.notify_key(key);
        }
        Ok(wrote)
    }

    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> Result<(i64, Option<String>)> {
        let key = incr_key.to_owned();
        let get_key = get_key.to_owned();
        let ttl_ms = ttl.map(ttl_millis);
        let answer = self
            .call(Op::IncrAndGet, move |conn| {
                incr_and_get(conn, &key, by, ttl_ms, &get_key)
            })
            .await?;
        self.hub.notify_key(incr_key);
        Ok(answer)
    }

    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        let key = key.to_owned();
        let holder = holder.to_owned();
        let prefix = prefix.to_owned();
        let ttl_ms = ttl_millis(ttl);
        self.call(Op::RenewAndList, move |conn| {
            renew_and_list(conn, &key, &holder, ttl_ms, &prefix)
        })
        .await
    }

    /// One call on the worker thread, one transaction: the renewal and every directory's
    /// digest, as `renew_and_list_if_changed` answers it, judged at one instant.
    async fn renew_and_versions(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[(&str, Option<&str>)],
    ) -> Result<(bool, Vec<String>)> {
        let key = key.to_owned();
        let holder = holder.to_owned();
        let dirs: Vec<String> = dirs.iter().map(|(dir, _)| (*dir).to_owned()).collect();
        let ttl_ms = ttl_millis(ttl);
        self.call(Op::RenewAndVersions, move |conn| {
            renew_and_versions(conn, &key, &holder, ttl_ms, &dirs)
        })
        .await
    }

    /// Durable when the connection's `PRAGMA synchronous` is FULL or EXTRA and the journal is
    /// WAL or DELETE (or TRUNCATE/PERSIST): then every commit is synced before it returns. An
    /// in-memory database is never durable.
    async fn durability(&self) -> Result<Durability> {
        if self.is_memory() {
            return Ok(Durability::not_durable(
                "an in-memory SQLite database is gone when its process exits",
            ));
        }
        let (synchronous, journal, file) = self
            .call(Op::Durability, |conn| {
                let synchronous: i64 = conn
                    .query_row("PRAGMA synchronous", [], |row| row.get(0))
                    .sql()?;
                let journal: String = conn
                    .query_row("PRAGMA journal_mode", [], |row| row.get(0))
                    .sql()?;
                Ok((synchronous, journal, conn.path().map(str::to_owned)))
            })
            .await?;
        // The file, as SQLite opened it, made canonical: two URLs for one file are one store.
        let servers = file
            .filter(|f| !f.is_empty())
            .map(|f| std::fs::canonicalize(&f).map_or(f, |p| p.display().to_string()))
            .map(|f| vec![format!("sqlite file {f}")])
            .unwrap_or_default();
        Ok(sqlite_durability(synchronous, &journal).with_servers(servers))
    }
}

/// Judges `PRAGMA synchronous` (0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA) and `PRAGMA journal_mode`.
pub(crate) fn sqlite_durability(synchronous: i64, journal: &str) -> Durability {
    let name = match synchronous {
        0 => "OFF",
        1 => "NORMAL",
        2 => "FULL",
        3 => "EXTRA",
        _ => "unknown",
    };
    let journal = journal.to_ascii_lowercase();
    let detail = format!("synchronous {name}, journal_mode {journal}");
    let synced_journal = matches!(journal.as_str(), "wal" | "delete" | "truncate" | "persist");
    if matches!(synchronous, 2 | 3) && synced_journal {
        Durability::durable(detail)
    } else {
        Durability::not_durable(format!(
            "{detail} (durable needs synchronous FULL or EXTRA, e.g. ?synchronous=full, and an on-disk journal)"
        ))
    }
}
