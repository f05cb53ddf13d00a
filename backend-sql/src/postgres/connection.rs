//! The pool of connections: building it, checking a connection out for one operation (and
//! dropping it when that broke or timed out), creating the table, running statements within the
//! deadline, and collecting expired rows now and then.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use deadpool_postgres::{
    ClientWrapper, Manager, ManagerConfig, Object, Pool, QueueMode, RecyclingMethod,
};
use headcount_core::notify::WarnOnce;
use headcount_core::{Error, Op, Result};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use super::config::PostgresConfig;
use super::errors::{self, BACKEND};
use super::pooler;
use super::sql::{Statement, Statements, GC_BATCH};
use super::tls;

/// Garbage is collected after every this many writes through one store handle: one slice of
/// [`GC_BATCH`] rows, or up to [`GC_SLICES`] slices one after the other while more than half of
/// each was expired. So it examines at least one row per write, and up to four while expired
/// rows abound: a workload that leaves an expired key behind on most of its writes cannot outrun
/// it.
const GC_EVERY: u64 = GC_BATCH as u64;

/// The most slices one garbage collection examines.
const GC_SLICES: usize = 4;

/// The most connections whose kind [`Connections::protocol`] remembers; past that it
/// forgets them all, and asks again (one round trip each).
const KINDS_REMEMBERED: usize = 4096;

/// Builds the pools of the server `config` names (connecting lazily): the callers' pool of
/// `pool_size` connections, and the garbage collection's of one (see [`Connections`]).
pub(crate) async fn pools(config: &PostgresConfig) -> Result<(Pool, Pool)> {
    // Building the connector may read `sslrootcert` from disk: keep that off the runtime's
    // worker threads.
    let tls = match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let config = config.clone();
            runtime
                .spawn_blocking(move || tls::connector(&config))
                .await
                .map_err(|e| Error::unavailable(BACKEND, "cannot set up TLS", e))??
        }
        Err(_) => tls::connector(config)?,
    };
    let pool = |pg: &tokio_postgres::Config, size: usize| {
        let manager = Manager::from_config(
            pg.clone(),
            tls.clone(),
            // Fast: a checkout only checks `is_closed`; Verified would add a round trip to every
            // operation. Connections that broke or timed out are discarded by `Conn` instead.
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        // LIFO: a caller gets the connection returned last, so a light load keeps reusing the
        // few connections whose server processes are awake and whose cache is warm. The default
        // FIFO hands each call the connection idle longest, spreading sequential calls over
        // every connection the pool ever grew to, which cost about 90 µs per call on a ~100 µs
        // round trip (a raw client cycling over 16 connections pays the same).
        Pool::builder(manager)
            .max_size(size)
            .queue_mode(QueueMode::Lifo)
            .build()
            .map_err(|e| Error::config(format!("cannot build the PostgreSQL pool: {e}")))
    };
    Ok((pool(&config.pg, config.pool_size())?, pool(&config.pg, 1)?))
}

/// A store's pool, its statements and what it knows of the table.
pub(crate) struct Connections {
    pub(crate) pool: Pool,
    /// The garbage collection's own connection, when the store opened its pool: a collection
    /// holds its connection for milliseconds, and taking it from the callers' pool made a busy
    /// store's calls queue behind it (at 16 calls in flight on a pool of 16, the writes'
    /// throughput fell by 10–30% and their p99 nearly doubled). Over an application's pool,
    /// that pool.
    gc_pool: Option<Pool>,
    pub(crate) config: PostgresConfig,
    pub(crate) sql: Statements,
    password: Option<String>,
    schema_ready: AtomicBool,
    /// Whether the change triggers were looked for (once per handle), and found or installed.
    notify_checked: AtomicBool,
    notifying: AtomicBool,
    pub(crate) notify_warned: Arc<WarnOnce>,
    writes: AtomicU64,
    gc_running: AtomicBool,
    /// The last primary key (`key_hash`) the previous garbage collection examined; empty to start
    /// from the beginning of the table.
    gc_cursor: Mutex<Vec<u8>>,
    /// Per connection, by the key its handshake announced: whether it reaches the server itself,
    /// so that statements may be prepared on it (see [`pooler`]).
    direct: Mutex<HashMap<(i32, i32), bool>>,
}

/// How a connection runs statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// Prepared once per connection (named, cached), then executed: one round trip, and the
    /// server parses and plans once.
    Prepared,
    /// Sent with every call as the unnamed statement with the parameter types: one round trip,
    /// nothing left on the server connection, a parse and a plan per call.
    Unnamed,
}

/// What one garbage collection did. For tests; not part of the public API.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GarbageCollection {
    /// The rows of the slice it examined, expired or not (at most the batch size, 1000).
    pub examined: u64,
    /// The expired rows it deleted.
    pub deleted: u64,
    /// Whether the slice reached the end of the table, so the next collection starts over.
    pub wrapped: bool,
}

/// A pooled connection checked out for one operation. Unless [`Conn::reuse`] is called, it is
/// dropped from the pool instead of returned: a connection whose operation timed out or broke may
/// still have a reply in flight or be dead, and must not be handed to the next caller.
struct Conn {
    obj: Option<Object>,
    reuse: bool,
}

impl Conn {
    fn client(&mut self) -> Result<&mut ClientWrapper> {
        self.obj.as_deref_mut().ok_or_else(|| Error::Unavailable {
            backend: BACKEND,
            message: "connection already released".into(),
            source: None,
        })
    }

    fn reuse(&mut self) {
        self.reuse = true;
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(obj) = self.obj.take() {
            if !self.reuse {
                // Detach from the pool; dropping the client closes the connection.
                drop(Object::take(obj));
            }
        }
    }
}

impl Connections {
    /// The connections of `pool` (and `gc_pool` for garbage collection, else `pool`), with the
    /// table and deadline of `config`; nothing is checked yet (see [`Connections::prepare`]).
    pub(crate) fn new(pool: Pool, gc_pool: Option<Pool>, config: PostgresConfig) -> Self {
        Connections {
            pool,
            gc_pool,
            password: config.password(),
            sql: Statements::new(config.table()),
            config,
            schema_ready: AtomicBool::new(false),
            notify_checked: AtomicBool::new(false),
            notifying: AtomicBool::new(false),
            notify_warned: Arc::default(),
            writes: AtomicU64::new(0),
            gc_running: AtomicBool::new(false),
            gc_cursor: Mutex::new(Vec::new()),
            direct: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a write, and every [`GC_EVERY`] writes runs one garbage collection (see
    /// [`Connections::collect_garbage`]) in the background.
    pub(crate) fn note_write(self: &Arc<Self>) {
        let n = self.writes.fetch_add(1, Ordering::Relaxed) + 1;
        if !n.is_multiple_of(GC_EVERY) || self.gc_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = self.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    for _ in 0..GC_SLICES {
                        match inner.collect_garbage().await {
                            Ok(gc) => {
                                tracing::debug!(
                                    examined = gc.examined,
                                    deleted = gc.deleted,
                                    "deleted expired PostgreSQL rows"
                                );
                                if gc.wrapped || gc.deleted * 2 <= gc.examined {
                                    break;
                                }
                            }
                            Err(Error::Timeout { .. }) => {
                                tracing::debug!("PostgreSQL garbage collection timed out");
                                break;
                            }
                            Err(e) => {
                                tracing::debug!(
                                    error = %e,
                                    "skipped PostgreSQL garbage collection"
                                );
                                break;
                            }
                        }
                    }
                    inner.gc_running.store(false, Ordering::Release);
                });
            }
            Err(_) => inner.gc_running.store(false, Ordering::Release),
        }
    }

    fn classify(&self, e: tokio_postgres::Error) -> Error {
        errors::classify(e, self.password.as_deref())
    }

    /// Closes the pools: later operations fail with [`Error::Unavailable`].
    pub(crate) fn close(&self) {
        self.pool.close();
        if let Some(gc) = &self.gc_pool {
            gc.close();
        }
    }

    /// The connections garbage collection has open on a pool of its own (0 or 1; 0 over an
    /// application's pool, whose connections it borrows).
    pub(crate) fn gc_connections(&self) -> usize {
        self.gc_pool.as_ref().map_or(0, |p| p.status().size)
    }

    /// How `client` runs statements: prepared when its connection reaches the server itself,
    /// else (through a pooler, or when that cannot be told) unnamed. Asked once per connection,
    /// with one round trip; remembered by the key its handshake announced.
    async fn protocol(
        &self,
        client: &ClientWrapper,
    ) -> std::result::Result<Protocol, tokio_postgres::Error> {
        let Some(key) = pooler::announced_key(client).await else {
            return Ok(Protocol::Unnamed);
        };
        let known = self
            .direct
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .copied();
        let direct = match known {
            Some(direct) => direct,
            None => {
                let direct = pooler::reaches_the_announced_process(client, key.0).await?;
                if !direct {
                    tracing::info!(
                        "this PostgreSQL connection goes through a pooler: its statements are \
                         sent unnamed, not prepared"
                    );
                }
                let mut kinds = self.direct.lock().unwrap_or_else(PoisonError::into_inner);
                if kinds.len() >= KINDS_REMEMBERED {
                    kinds.clear();
                }
                kinds.insert(key, direct);
                direct
            }
        };
        Ok(if direct {
            Protocol::Prepared
        } else {
            Protocol::Unnamed
        })
    }

    /// How many of the connections seen so far reach the server itself, and how many go
    /// through a pooler. For tests.
    pub(crate) fn connection_kinds(&self) -> (usize, usize) {
        let kinds = self.direct.lock().unwrap_or_else(PoisonError::into_inner);
        let direct = kinds.values().filter(|d| **d).count();
        (direct, kinds.len() - direct)
    }

    async fn checkout(&self) -> Result<Conn> {
        self.checkout_from(&self.pool).await
    }

    async fn checkout_from(&self, pool: &Pool) -> Result<Conn> {
        let obj = pool
            .get()
            .await
            .map_err(|e| errors::classify_pool(e, self.password.as_deref()))?;
        Ok(Conn {
            obj: Some(obj),
            reuse: false,
        })
    }

    /// Checks out a connection and makes sure the table exists, within the deadline.
    pub(crate) async fn prepare(&self) -> Result<()> {
        let work = async {
            let mut conn = self.checkout().await?;
            self.ensure_schema(&mut conn).await?;
            conn.reuse();
            Ok(())
        };
        self.config.deadline().run("connect", work).await
    }

    /// Creates the table and its index when missing. Several processes may start at once, and
    /// concurrent `CREATE TABLE IF NOT EXISTS` can still fail on a catalog unique index, so
    /// creation is serialised with a transaction-scoped advisory lock. An existing table is only
    /// looked up, so a role that may use but not create it works.
    async fn ensure_schema(&self, conn: &mut Conn) -> Result<()> {
        let client = conn.client()?;
        let exists: bool = run(
            client,
            Protocol::Unnamed,
            &self.sql.exists,
            &[&self.sql.quoted_table],
        )
        .await
        .and_then(|rows| match rows.first() {
            Some(row) => row.try_get(0),
            None => Ok(false),
        })
        .map_err(|e| self.classify(e))?;
        if !exists {
            let created = async {
                let tx = client.transaction().await?;
                tx.batch_execute(&self.sql.create).await?;
                tx.commit().await
            }
            .await;
            if let Err(e) = created {
                if errors::breaks_connection(&e) {
                    return Err(self.classify(e));
                }
                conn.reuse();
                return Err(self.classify(e));
            }
            tracing::info!(table = self.config.table(), "created the headcount table");
        }
        if !self.notify_checked.swap(true, Ordering::AcqRel) {
            self.ensure_notify_triggers(conn).await?;
        }
        self.schema_ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Installs the change triggers (see `Statements::notify_schema`) when missing, once per
    /// store handle. A role that may not (it does not own the table) leaves them missing: the
    /// store then says once why, and hands out silent notifications (callers keep polling).
    async fn ensure_notify_triggers(&self, conn: &mut Conn) -> Result<()> {
        let client = conn.client()?;
        // Behind a pooler in transaction mode a LISTEN does not outlive its transaction, so a
        // listener would hear nothing: no notifications then (the store's own connection goes
        // where its pool's go).
        match self.protocol(client).await {
            Ok(Protocol::Prepared) => {}
            // The URL says the pooler runs in session mode: the listener's connection keeps
            // its server connection, so its LISTEN holds.
            Ok(Protocol::Unnamed) if self.config.session_pooler() => {}
            Ok(Protocol::Unnamed) => {
                self.notify_warned.warn(
                    BACKEND,
                    "the connections go through a pooler (or one that cannot be told apart \
                     from it), where LISTEN does not hold in transaction mode (in session mode \
                     it does: add pool_mode=session to the URL)",
                );
                return Ok(());
            }
            Err(e) => {
                self.notify_checked.store(false, Ordering::Release);
                return Err(self.classify(e));
            }
        }
        let installed: bool = run(
            client,
            Protocol::Unnamed,
            &self.sql.notify_installed,
            &[&self.sql.quoted_table, &self.sql.notify_trigger],
        )
        .await
        .and_then(|rows| match rows.first() {
            Some(row) => row.try_get(0),
            None => Ok(false),
        })
        .map_err(|e| self.classify(e))?;
        if installed {
            self.notifying.store(true, Ordering::Release);
            return Ok(());
        }
        let created = async {
            let tx = client.transaction().await?;
            tx.batch_execute(&self.sql.notify_schema).await?;
            tx.commit().await
        }
        .await;
        match created {
            Ok(()) => {
                tracing::info!(table = self.config.table(), "installed the change triggers");
                self.notifying.store(true, Ordering::Release);
            }
            Err(e) if errors::breaks_connection(&e) => {
                self.notify_checked.store(false, Ordering::Release);
                return Err(self.classify(e));
            }
            Err(e) => {
                conn.reuse();
                // The server's own reason ("must be owner of table …"), not the client's
                // "db error".
                let why = e
                    .as_db_error()
                    .map_or_else(|| e.to_string(), |db| db.message().to_owned());
                self.notify_warned.warn(
                    BACKEND,
                    &format!(
                        "cannot install the change triggers on table `{}` (does this role own it?): {why}",
                        self.config.table()
                    ),
                );
            }
        }
        Ok(())
    }

    /// Whether the table has its change triggers, so that a listener hears every write.
    pub(crate) fn notifying(&self) -> bool {
        self.notifying.load(Ordering::Acquire)
    }

    /// Runs one statement and returns its rows, within the deadline. `counter` names the key
    /// whose stored value is cast to a number, so a failed cast becomes [`Error::ForeignValue`]
    /// for it.
    pub(crate) async fn query(
        &self,
        op: Op,
        sql: &Statement,
        params: &[&(dyn ToSql + Sync)],
        counter: Option<&str>,
    ) -> Result<Vec<Row>> {
        let work = async {
            let mut conn = self.checkout().await?;
            if !self.schema_ready.load(Ordering::Acquire) {
                self.ensure_schema(&mut conn).await?;
            }
            let client = conn.client()?;
            let mut result = match self.protocol(client).await {
                Ok(protocol) => run(client, protocol, sql, params).await,
                Err(e) => Err(e),
            };
            if matches!(&result, Err(e) if errors::is_undefined_table(e)) {
                // The table was dropped or the server re-initialised: create it again, once.
                self.schema_ready.store(false, Ordering::Release);
                self.ensure_schema(&mut conn).await?;
                let client = conn.client()?;
                result = match self.protocol(client).await {
                    Ok(protocol) => run(client, protocol, sql, params).await,
                    Err(e) => Err(e),
                };
            }
            match result {
                Ok(rows) => {
                    conn.reuse();
                    Ok(rows)
                }
                Err(e) => {
                    if !errors::breaks_connection(&e) {
                        conn.reuse();
                    }
                    match counter {
                        Some(key) if errors::is_bad_counter(&e) => {
                            let expected = if errors::is_out_of_range(&e) {
                                "a decimal integer that fits (and, for incr, stays within) an i64"
                            } else {
                                "a decimal integer"
                            };
                            let found = self.raw_value(&mut conn, key).await;
                            Err(Error::foreign(key, expected, &found))
                        }
                        _ => Err(self.classify(e)),
                    }
                }
            }
        };
        self.config.deadline().run(op.name(), work).await
    }

    /// The stored value at `key`, live or not, for a foreign-value report.
    async fn raw_value(&self, conn: &mut Conn, key: &str) -> String {
        let fetched = match conn.client() {
            Ok(client) => run(client, Protocol::Unnamed, &self.sql.raw_value, &[&key])
                .await
                .ok(),
            Err(_) => None,
        };
        fetched
            .and_then(|rows| rows.first().and_then(|r| r.try_get::<_, String>(0).ok()))
            .unwrap_or_else(|| "(unreadable)".into())
    }

    /// Deletes the expired rows among the next [`GC_BATCH`] rows of the table in primary key
    /// order, after the cursor left by the previous collection, and moves the cursor past them
    /// (back to the start once a slice reaches the end of the table). Each collection's work is
    /// bounded by the slice, not by the table, which other deployments may share; a full pass
    /// over a table of `n` rows takes `n / GC_BATCH + 1` collections. Rows a caller has locked
    /// are skipped, and a row renewed concurrently is not deleted (see `sql.gc`).
    ///
    /// Two collections running at once (a test's and the background one) may examine the same
    /// slice; that only repeats work.
    pub(crate) async fn collect_garbage(&self) -> Result<GarbageCollection> {
        let after = self
            .gc_cursor
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let work = async {
            let mut conn = self
                .checkout_from(self.gc_pool.as_ref().unwrap_or(&self.pool))
                .await?;
            match self.gc_slice(conn.client()?, &after).await {
                Ok(rows) => {
                    conn.reuse();
                    Ok(rows)
                }
                Err(e) => {
                    if !errors::breaks_connection(&e) {
                        conn.reuse();
                    }
                    Err(self.classify(e))
                }
            }
        };
        let rows = self.config.deadline().run("gc", work).await?;
        let row = rows.first().ok_or_else(|| Error::Rejected {
            backend: BACKEND,
            message: "garbage collection returned no row".into(),
            source: None,
        })?;
        let unexpected = |e: tokio_postgres::Error| {
            Error::rejected(BACKEND, format!("unexpected result column: {e}"), e)
        };
        let last: Option<Vec<u8>> = row.try_get(0).map_err(unexpected)?;
        let examined: i64 = row.try_get(1).map_err(unexpected)?;
        let deleted: i64 = row.try_get(2).map_err(unexpected)?;
        let examined = u64::try_from(examined).unwrap_or(0);
        let wrapped = examined < u64::from(GC_BATCH);
        let next = match last {
            Some(last) if !wrapped => last,
            _ => Vec::new(),
        };
        *self
            .gc_cursor
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = next;
        Ok(GarbageCollection {
            examined,
            deleted: u64::try_from(deleted).unwrap_or(0),
            wrapped,
        })
    }

    /// One garbage collection's statement in a transaction of its own, whose `lock_timeout`
    /// (`SET LOCAL`, so it ends with the transaction) is the store's `timeout`: a collection that
    /// waits for a table lock (a caller's `LOCK TABLE`, a migration) gives up at its deadline,
    /// and the server gives up too instead of keeping the abandoned statement queued for the
    /// lock. A setting of the session (a startup `options` parameter) would not do: a pooler in
    /// transaction mode refuses it, or hands the session to other clients.
    async fn gc_slice(
        &self,
        client: &mut ClientWrapper,
        after: &[u8],
    ) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
        let lock_timeout = self.config.deadline().after().as_millis().max(1);
        let tx = client.transaction().await?;
        tx.batch_execute(&format!("SET LOCAL lock_timeout = {lock_timeout}"))
            .await?;
        let rows = tx
            .query_typed(&self.sql.gc.sql, &typed(&self.sql.gc, &[&after]))
            .await?;
        tx.commit().await?;
        Ok(rows)
    }
}

/// Runs `statement` with `params` in one round trip. [`Protocol::Prepared`]: prepared once per
/// connection (cached, with the statement's parameter types), then executed.
/// [`Protocol::Unnamed`]: the SQL goes with the parameters and their types every time (`Parse`,
/// `Bind`, `Execute`, `Sync` in one go), so nothing is left on the server connection for a later
/// call, which is what a pooler in transaction mode needs: there the next call may run on another
/// server connection, which does not have a statement prepared earlier (SQLSTATE 26000), or has
/// another client's statement of the same name (42P05), see [`pooler`].
async fn run(
    client: &ClientWrapper,
    protocol: Protocol,
    statement: &Statement,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
    match protocol {
        Protocol::Prepared => {
            let prepared = client
                .prepare_typed_cached(&statement.sql, &statement.types)
                .await?;
            client.query(&prepared, params).await
        }
        Protocol::Unnamed => {
            client
                .query_typed(&statement.sql, &typed(statement, params))
                .await
        }
    }
}

/// `params` paired with the parameter types of `statement`.
fn typed<'a>(
    statement: &Statement,
    params: &[&'a (dyn ToSql + Sync)],
) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    params
        .iter()
        .copied()
        .zip(statement.types.iter().cloned())
        .collect()
}
