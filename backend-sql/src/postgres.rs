//! The PostgreSQL backend: one table, a pool of connections, and one atomic statement per
//! primitive with expiry judged by the server's `now()`.
//!
//! See the crate README for URLs, options, the schema and the guarantee of each primitive.

mod config;
mod errors;
mod fence;
mod tls;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{ClientWrapper, Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use headcount_core::backend::{self, ttl_millis};
use headcount_core::store::RenewedListing;
use headcount_core::{Capabilities, Durability, Error, Result};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

pub use config::{PostgresConfig, SslMode, DEFAULT_POOL_SIZE, DEFAULT_PORT, DEFAULT_TABLE};
/// The pool crate [`PostgresStore::from_pool`] takes, re-exported so an application names the
/// same version.
pub use deadpool_postgres;
pub use fence::{FencedOutcome, PgFence};
/// The client crate of [`PgFence`], re-exported so an application names the same version.
pub use tokio_postgres;

pub(crate) const BACKEND: &str = "postgres";

/// How many leading characters of a key the prefix index holds. 512 characters are at most 2 KiB
/// of UTF-8, safely under the ~2.7 KB limit of a btree entry, while keys may be 4 KiB.
const KEY_HEAD_CHARS: usize = 512;

/// Expired rows are deleted after every this many writes through one store handle.
const GC_EVERY: u64 = 1000;

/// The most expired rows one garbage collection deletes, to keep its locks short.
const GC_BATCH: u32 = 1000;

/// The SQL of every statement, with the table name filled in.
#[derive(Debug)]
struct Statements {
    /// The quoted table name, for `to_regclass`.
    quoted_table: String,
    exists: String,
    create: String,
    incr: String,
    incr_and_get: String,
    get: String,
    expire: String,
    cas_update: String,
    cas_insert: String,
    delete: String,
    compare_and_delete: String,
    list: String,
    renew_and_list: String,
    renew_if_changed: String,
    set_max: String,
    raw_value: String,
    gc: String,
}

impl Statements {
    fn new(table: &str) -> Self {
        // `table` is a validated identifier ([a-z0-9_]); quoting it lets reserved words through.
        let t = format!("\"{table}\"");
        let live = "(cur.expires_at IS NULL OR cur.expires_at > now())";
        let expired = "(cur.expires_at IS NOT NULL AND cur.expires_at <= now())";
        // `::bigint` alone would accept " 7", "+7" or "007" where core's parse_counter (and
        // Redis's INCR) refuse them; anything but canonical decimal is cast from 'x' instead,
        // which raises 22P02 and so reports the same ForeignValue as every other backend.
        let stored_int =
            "(CASE WHEN cur.value ~ '^(0|-?[1-9][0-9]*)$' THEN cur.value ELSE 'x' END)::bigint";
        // sha256 of the key's bytes. `convert_to` would say it more plainly but is only STABLE,
        // which a generated column refuses; doubling backslashes makes the IMMUTABLE text->bytea
        // cast take every byte literally (its escape syntax is just `\\` and `\ooo`, and `\x`
        // only counts at the very start).
        let hash = |k: &str| format!(r"sha256(replace({k}, E'\\', E'\\\\')::bytea)");
        let by_key = format!("cur.key_hash = {}", hash("$1::text"));
        let key_hash = hash("key");
        let new_expiry = "now() + $2::bigint * interval '1 millisecond'";
        // The live keys under a prefix, given as the two LIKE patterns of `prefix_patterns`.
        let listing = |head: &str, whole: &str| {
            format!(
                "SELECT cur.key, cur.value FROM {t} AS cur
                 WHERE left(cur.key, {KEY_HEAD_CHARS}) LIKE {head} AND cur.key LIKE {whole}
                   AND {live}"
            )
        };
        Statements {
            quoted_table: t.clone(),
            exists: "SELECT to_regclass($1::text) IS NOT NULL".into(),
            create: format!(
                r#"SELECT pg_advisory_xact_lock(hashtext('headcount schema {table}'));
CREATE TABLE IF NOT EXISTS {t} (
    key text COLLATE "C" NOT NULL,
    key_hash bytea GENERATED ALWAYS AS ({key_hash}) STORED,
    value text NOT NULL,
    expires_at timestamptz,
    CONSTRAINT "{table}_pkey" PRIMARY KEY (key_hash)
);
CREATE INDEX IF NOT EXISTS "{table}_key_head" ON {t} (left(key, {KEY_HEAD_CHARS}));
COMMENT ON TABLE {t} IS 'headcount coordination keys: value is text (counters in decimal), expires_at NULL means never; a row whose expires_at has passed is absent.';"#
            ),
            incr: format!(
                "INSERT INTO {t} AS cur (key, value, expires_at) VALUES ($1, '1', {new_expiry})
                 ON CONFLICT (key_hash) DO UPDATE SET
                   value = CASE WHEN {live} THEN ({stored_int} + 1)::text ELSE '1' END,
                   expires_at = CASE WHEN {live} THEN cur.expires_at ELSE EXCLUDED.expires_at END
                 RETURNING cur.value::bigint"
            ),
            // One statement: the CTE increments, the outer query reads the other key. The read
            // sees the snapshot the statement started with (READ COMMITTED), which is a point
            // between sending the request and its reply.
            incr_and_get: format!(
                "WITH i AS (
                   INSERT INTO {t} AS cur (key, value, expires_at) VALUES ($1, $3::bigint::text, {new_expiry})
                   ON CONFLICT (key_hash) DO UPDATE SET
                     value = CASE WHEN {live} THEN ({stored_int} + $3::bigint)::text ELSE EXCLUDED.value END,
                     expires_at = CASE WHEN {live} THEN cur.expires_at ELSE EXCLUDED.expires_at END
                   RETURNING cur.value::bigint AS v
                 )
                 SELECT i.v, (SELECT g.value FROM {t} AS g
                              WHERE g.key_hash = {get_hash}
                                AND (g.expires_at IS NULL OR g.expires_at > now()))
                 FROM i",
                get_hash = hash("$4::text"),
            ),
            get: format!("SELECT cur.value FROM {t} AS cur WHERE {by_key} AND {live}"),
            expire: format!(
                "UPDATE {t} AS cur SET expires_at = {new_expiry} WHERE {by_key} AND {live} RETURNING 1"
            ),
            cas_update: format!(
                "UPDATE {t} AS cur SET value = $3, expires_at = {new_expiry}
                 WHERE {by_key} AND cur.value = $4 AND {live} RETURNING 1"
            ),
            cas_insert: format!(
                "INSERT INTO {t} AS cur (key, value, expires_at) VALUES ($1, $3, {new_expiry})
                 ON CONFLICT (key_hash) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
                 WHERE {expired} RETURNING 1"
            ),
            delete: format!(
                "DELETE FROM {t} AS cur WHERE {by_key} RETURNING {live}"
            ),
            compare_and_delete: format!(
                "DELETE FROM {t} AS cur WHERE {by_key} AND cur.value = $2 AND {live} RETURNING 1"
            ),
            list: format!("{} ORDER BY cur.key", listing("$1", "$2")),
            // One statement: the CTE renews, the outer query lists. The listing reads the
            // snapshot the statement started with, so it does not see the new expiry, but the
            // renewal never changes a value, and `now()` is the same instant for both parts: a
            // key the CTE found live (and renewed) is live in the listing too. The LEFT JOIN
            // gives one row (with NULL key) when nothing is listed, so the flag always comes
            // back; the CTE runs to completion whether or not anything reads it.
            renew_and_list: format!(
                "WITH r AS (
                   UPDATE {t} AS cur SET expires_at = {new_expiry}
                   WHERE {by_key} AND cur.value = $3 AND {live} RETURNING 1
                 )
                 SELECT EXISTS (SELECT 1 FROM r), l.key, l.value
                 FROM (VALUES (1)) AS one (x)
                 LEFT JOIN ({listing}) AS l ON true
                 ORDER BY l.key",
                listing = listing("$4", "$5"),
            ),
            // The renewal, then the keys directly under the directory ($4, $5: its LIKE patterns;
            // $6: the directory, measured by the server in its own encoding's characters, as
            // `substr` counts them) and a SHA-256 of them computed by the server (not md5, which
            // FIPS-mode servers refuse): the rows
            // come back only when that digest differs from $7 (the caller's version), else one
            // row with the digest and no key. Like `renew_and_list`, the listing reads the
            // statement's snapshot, which the renewal (a TTL of a live row) does not change.
            // Each entry is length-prefixed, so the digest is of an unambiguous encoding.
            renew_if_changed: format!(
                "WITH r AS (
                   UPDATE {t} AS cur SET expires_at = {new_expiry}
                   WHERE {by_key} AND cur.value = $3 AND {live} RETURNING 1
                 ),
                 l AS (
                   SELECT d.key, d.value FROM ({listing}) AS d
                   WHERE strpos(substr(d.key, length($6::text) + 1), ':') = 0
                 ),
                 v AS (
                   SELECT 'p' || encode(sha256(convert_to(coalesce(string_agg(
                     length(l.key)::text || ':' || l.key || length(l.value)::text || ':' || l.value,
                     '' ORDER BY l.key), ''), 'UTF8')), 'hex') AS version
                   FROM l
                 )
                 SELECT EXISTS (SELECT 1 FROM r), v.version, l.key, l.value
                 FROM v LEFT JOIN l ON v.version IS DISTINCT FROM $7::text
                 ORDER BY l.key",
                listing = listing("$4", "$5"),
            ),
            // CASE, not OR: PostgreSQL does not promise to evaluate OR left to right, and the cast
            // must never run on an expired row (it may hold anything).
            set_max: format!(
                "INSERT INTO {t} AS cur (key, value, expires_at) VALUES ($1, $3::bigint::text, {new_expiry})
                 ON CONFLICT (key_hash) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
                 WHERE CASE WHEN {expired} THEN true ELSE {stored_int} < $3::bigint END
                 RETURNING 1"
            ),
            raw_value: format!("SELECT cur.value FROM {t} AS cur WHERE {by_key}"),
            // The outer predicate is re-checked on the latest row version under READ COMMITTED,
            // so a row renewed after the inner scan saw it expired is left alone.
            gc: format!(
                "DELETE FROM {t} AS cur WHERE cur.key_hash IN (
                     SELECT key_hash FROM {t} WHERE expires_at <= now()
                     LIMIT {GC_BATCH} FOR UPDATE SKIP LOCKED)
                 AND {expired}"
            ),
        }
    }
}

/// Escapes `%`, `_` and `\` for a LIKE pattern (backslash is the default escape character).
fn like_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 1);
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The two LIKE patterns of `list`: one for the indexed head of the key, one for the whole key.
fn prefix_patterns(prefix: &str) -> (String, String) {
    let head: String = prefix.chars().take(KEY_HEAD_CHARS).collect();
    (
        format!("{}%", like_escape(&head)),
        format!("{}%", like_escape(prefix)),
    )
}

/// A [`Store`](headcount_core::Store) in a PostgreSQL table, shared by any number of processes and machines.
///
/// Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    config: PostgresConfig,
    sql: Statements,
    password: Option<String>,
    schema_ready: AtomicBool,
    writes: AtomicU64,
    gc_running: AtomicBool,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self.inner.pool.status();
        f.debug_struct("PostgresStore")
            .field("config", &self.inner.config)
            .field("connections", &status.size)
            .field("idle", &status.available)
            .finish()
    }
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

impl PostgresStore {
    /// Connects to the server named by a `postgres://` or `postgresql://` URL (see the crate
    /// README for its options) and creates the table if it is missing. Fails with
    /// [`Error::Rejected`] for bad credentials or permissions, [`Error::Unavailable`] or
    /// [`Error::Timeout`] when the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(PostgresConfig::from_url(url)?).await
    }

    /// Like [`connect`](Self::connect) with an already parsed configuration.
    pub async fn connect_with(config: PostgresConfig) -> Result<Self> {
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
            Err(_) => tls::connector(&config)?,
        };
        let manager = Manager::from_config(
            config.pg.clone(),
            tls,
            // Fast: a checkout only checks `is_closed`; Verified would add a round trip to every
            // operation. Connections that broke or timed out are discarded by `Conn` instead.
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size())
            .build()
            .map_err(|e| Error::config(format!("cannot build the PostgreSQL pool: {e}")))?;
        Self::from_pool_with(pool, config).await
    }

    /// A store over a `deadpool-postgres` pool the application already has (re-exported as
    /// [`deadpool_postgres`]), with the default table (`headcount`) and operation timeout.
    /// Creates the table if it is missing. Connections that break or time out are dropped
    /// from the pool, as with [`connect`](Self::connect).
    pub async fn from_pool(pool: Pool) -> Result<Self> {
        Self::from_pool_with(pool, pool_defaults()?).await
    }

    /// [`from_pool`](Self::from_pool) with the table and timeout of `config` (its host, user,
    /// password and TLS settings are not used: the pool's are).
    pub async fn from_pool_with(pool: Pool, config: PostgresConfig) -> Result<Self> {
        let store = PostgresStore {
            inner: Arc::new(Inner {
                pool,
                password: config.password(),
                sql: Statements::new(config.table()),
                config,
                schema_ready: AtomicBool::new(false),
                writes: AtomicU64::new(0),
                gc_running: AtomicBool::new(false),
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

    /// Closes the pool: later operations fail with [`Error::Unavailable`].
    pub fn close(&self) {
        self.inner.pool.close();
    }

    fn note_write(&self) {
        let n = self.inner.writes.fetch_add(1, Ordering::Relaxed) + 1;
        if !n.is_multiple_of(GC_EVERY) || self.inner.gc_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = self.inner.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    inner.collect_garbage().await;
                    inner.gc_running.store(false, Ordering::Release);
                });
            }
            Err(_) => inner.gc_running.store(false, Ordering::Release),
        }
    }
}

/// The options of a store over an application's pool: the defaults (its connection parts, a
/// placeholder, are not used).
fn pool_defaults() -> Result<PostgresConfig> {
    PostgresConfig::from_url("postgres://headcount@localhost")
}

impl Inner {
    fn classify(&self, e: tokio_postgres::Error) -> Error {
        errors::classify(e, self.password.as_deref())
    }

    async fn checkout(&self) -> Result<Conn> {
        let obj = self
            .pool
            .get()
            .await
            .map_err(|e| errors::classify_pool(e, self.password.as_deref()))?;
        Ok(Conn {
            obj: Some(obj),
            reuse: false,
        })
    }

    /// Checks out a connection and makes sure the table exists, within the deadline.
    async fn prepare(&self) -> Result<()> {
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
        let exists: bool = client
            .query_one(&self.sql.exists, &[&self.sql.quoted_table])
            .await
            .and_then(|row| row.try_get(0))
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
        self.schema_ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Runs one prepared statement and returns its rows, within the deadline. `counter` names the
    /// key whose stored value is cast to a number, so a failed cast becomes
    /// [`Error::ForeignValue`] for it.
    async fn query(
        &self,
        op: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        counter: Option<&str>,
    ) -> Result<Vec<Row>> {
        let work = async {
            let mut conn = self.checkout().await?;
            if !self.schema_ready.load(Ordering::Acquire) {
                self.ensure_schema(&mut conn).await?;
            }
            let mut result = run(conn.client()?, sql, params).await;
            if matches!(&result, Err(e) if errors::is_undefined_table(e)) {
                // The table was dropped or the server re-initialised: create it again, once.
                self.schema_ready.store(false, Ordering::Release);
                self.ensure_schema(&mut conn).await?;
                result = run(conn.client()?, sql, params).await;
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
        self.config.deadline().run(op, work).await
    }

    /// The stored value at `key`, live or not, for a foreign-value report.
    async fn raw_value(&self, conn: &mut Conn, key: &str) -> String {
        let fetched = match conn.client() {
            Ok(client) => run(client, &self.sql.raw_value, &[&key]).await.ok(),
            Err(_) => None,
        };
        fetched
            .and_then(|rows| rows.first().and_then(|r| r.try_get::<_, String>(0).ok()))
            .unwrap_or_else(|| "(unreadable)".into())
    }

    async fn collect_garbage(&self) {
        let work = async {
            let mut conn = self.checkout().await?;
            match run(conn.client()?, &self.sql.gc, &[]).await {
                Ok(rows) => {
                    conn.reuse();
                    Ok(rows.len())
                }
                Err(e) => {
                    if !errors::breaks_connection(&e) {
                        conn.reuse();
                    }
                    Err(self.classify(e))
                }
            }
        };
        match self.config.deadline().run("gc", work).await {
            Ok(n) => tracing::debug!(rows = n, "deleted expired PostgreSQL rows"),
            Err(Error::Timeout { .. }) => {
                tracing::debug!("PostgreSQL garbage collection timed out")
            }
            Err(e) => tracing::debug!(error = %e, "skipped PostgreSQL garbage collection"),
        }
    }
}

/// Prepares (once per connection, cached) and runs `sql`: one round trip once prepared.
async fn run(
    client: &ClientWrapper,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
    let statement = client.prepare_cached(sql).await?;
    client.query(&statement, params).await
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
        caps
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
                "renew_and_list",
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
                "renew_and_list_if_changed",
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

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        let ttl_ms = ttl.map(ttl_millis);
        let rows = self
            .inner
            .query("incr", &self.inner.sql.incr, &[&key, &ttl_ms], Some(key))
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
            .query("get", &self.inner.sql.get, &[&key], None)
            .await?;
        first_column(&rows)
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        let ttl_ms = ttl_millis(ttl);
        let rows = self
            .inner
            .query("expire", &self.inner.sql.expire, &[&key, &ttl_ms], None)
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
                        "compare_and_set",
                        &self.inner.sql.cas_update,
                        &[&key, &ttl_ms, &new, &expected],
                        None,
                    )
                    .await?
            }
            None => {
                self.inner
                    .query(
                        "compare_and_set",
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
            .query("delete", &self.inner.sql.delete, &[&key], None)
            .await?;
        self.note_write();
        Ok(first_column::<bool>(&rows)?.unwrap_or(false))
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        let rows = self
            .inner
            .query(
                "compare_and_delete",
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
            .query("list", &self.inner.sql.list, &[&head, &whole], None)
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<std::result::Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| Error::rejected(BACKEND, format!("unexpected result column: {e}"), e))
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        let ttl_ms = ttl.map(ttl_millis);
        let rows = self
            .inner
            .query(
                "set_max",
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
                "incr_and_get",
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
            .query(
                "durability",
                "SELECT current_setting('fsync'), current_setting('synchronous_commit'),
                        (SELECT count(*) FROM pg_stat_replication),
                        current_setting('synchronous_standby_names')",
                &[],
                None,
            )
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
        // The running server: its databases share the start time (as seconds since 1970, so no
        // session time zone changes it) and port. (Not
        // `system_identifier`: clusters copied from one base backup or template share it.)
        let rows = self
            .inner
            .query(
                "durability",
                "SELECT extract(epoch FROM pg_postmaster_start_time())::text || ' on port ' \
                 || current_setting('port')",
                &[],
                None,
            )
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

    #[test]
    fn like_patterns_escape_wildcards() {
        assert_eq!(like_escape(r"a%b_c\d"), r"a\%b\_c\\d");
        let (head, whole) = prefix_patterns("hc:{g}:");
        assert_eq!(head, "hc:{g}:%");
        assert_eq!(whole, "hc:{g}:%");
        let long = "é".repeat(600);
        let (head, whole) = prefix_patterns(&long);
        assert_eq!(head.chars().count(), KEY_HEAD_CHARS + 1);
        assert_eq!(whole.chars().count(), 601);
    }

    #[test]
    fn statements_quote_the_table() {
        let sql = Statements::new("user");
        assert!(sql.create.contains("CREATE TABLE IF NOT EXISTS \"user\""));
        assert!(sql.incr.contains("INSERT INTO \"user\" AS cur"));
        assert_eq!(sql.quoted_table, "\"user\"");
    }

    #[tokio::test]
    async fn unreachable_server_is_retryable_and_never_shows_the_password() {
        // Port 1 on loopback: refused at once on any sane machine.
        let url = "postgres://u:hunter22@127.0.0.1:1/db?timeout=2s&sslmode=disable";
        let err = PostgresStore::connect(url).await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("hunter22"), "{shown}");
    }

    #[tokio::test]
    async fn a_silent_server_times_out_within_the_deadline() {
        // A listener that accepts but never answers, like a stopped server.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let url =
            format!("postgres://u:hunter22@127.0.0.1:{port}/db?timeout=300ms&sslmode=disable");
        let started = std::time::Instant::now();
        let err = PostgresStore::connect(&url).await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(!format!("{err:?}").contains("hunter22"));
        hold.abort();
    }
}
