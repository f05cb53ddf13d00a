//! The embedded SQLite backend: one file shared by the processes of one machine, or a private
//! in-memory database.
//!
//! Every store owns one connection on a dedicated worker thread, so rusqlite's blocking calls never
//! run on the async runtime's workers; operations reach it as boxed closures over a channel and
//! come back on a oneshot. Read-modify-write primitives run in `BEGIN IMMEDIATE` transactions, so
//! they are atomic across connections and processes, not just within this handle. See the crate
//! README for URLs, options and the schema.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use headcount_core::backend::{self, parse_counter, ttl_millis, Deadline};
use headcount_core::{Capabilities, Durability, Error, Result};
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};
use tokio::sync::oneshot;

use headcount_core::backend::url::{
    check_deadline, parse_deadline, parse_duration, parse_query, reject_duplicates,
    DEFAULT_TIMEOUT, MAX_TIMEOUT,
};

const BACKEND: &str = "sqlite";

/// The table every key lives in. Fixed: one SQLite file is cheap, so separate deployments use
/// separate files.
pub const TABLE: &str = "headcount_kv";

/// Expired rows are deleted after every this many operations of one store handle.
const GC_EVERY: u32 = 1000;

/// SQLite's `synchronous` setting: how hard a commit waits for the disk.
///
/// The database always runs in WAL mode, where `Normal` (the default) never corrupts the file but
/// may lose the last commits on power loss or an OS crash (not on a process crash); `Full` syncs
/// every commit, which is what the majority-IDs recipe requires of a durable store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// No syncs at all: fastest, and a power loss may corrupt the database.
    Off,
    /// Sync at WAL checkpoints only (the default).
    #[default]
    Normal,
    /// Sync the WAL on every commit: durable.
    Full,
    /// Like `Full`, and also sync the directory after deleting journal files.
    Extra,
}

impl Synchronous {
    /// The value for `PRAGMA synchronous`.
    pub fn as_str(self) -> &'static str {
        match self {
            Synchronous::Off => "OFF",
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
            Synchronous::Extra => "EXTRA",
        }
    }

    /// Whether every commit reaches the disk before it is acknowledged.
    pub fn is_durable(self) -> bool {
        matches!(self, Synchronous::Full | Synchronous::Extra)
    }
}

impl FromStr for Synchronous {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "off" => Ok(Synchronous::Off),
            "normal" => Ok(Synchronous::Normal),
            "full" => Ok(Synchronous::Full),
            "extra" => Ok(Synchronous::Extra),
            _ => Err(Error::config(format!(
                "invalid value for option `synchronous`: `{s}` (expected off, normal, full or extra)"
            ))),
        }
    }
}

/// Options of a [`SqliteStore`], also settable as URL query options.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// Deadline of every operation, including waiting for other connections' locks (`timeout`,
    /// default 5 s).
    pub timeout: Duration,
    /// How long SQLite itself retries when another connection holds the lock (`busy_timeout`);
    /// `None` means the same as `timeout`.
    pub busy_timeout: Option<Duration>,
    /// Durability of commits (`synchronous`, default `normal`).
    pub synchronous: Synchronous,
    /// Whether a missing database file is created (`mode=rwc`, the default) or is an error
    /// (`mode=rw`, for tools that only read and must not leave an empty database behind).
    pub create: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            timeout: DEFAULT_TIMEOUT,
            busy_timeout: None,
            synchronous: Synchronous::Normal,
            create: true,
        }
    }
}

impl SqliteOptions {
    /// The busy timeout actually applied.
    pub fn effective_busy_timeout(&self) -> Duration {
        self.busy_timeout.unwrap_or(self.timeout)
    }

    fn check(&self) -> Result<()> {
        check_deadline("timeout", self.timeout)?;
        if self.effective_busy_timeout() > MAX_TIMEOUT {
            return Err(Error::config(format!(
                "option `busy_timeout` is longer than the limit of {MAX_TIMEOUT:?}"
            )));
        }
        Ok(())
    }
}

/// Where the database lives.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    Memory,
    File(PathBuf),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Memory => f.write_str(":memory:"),
            Location::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Parses `sqlite://relative/path.db`, `sqlite:///absolute/path.db`, `sqlite:path.db`,
/// `sqlite::memory:` and `sqlite://:memory:`, each with optional query options.
fn parse_url(url: &str) -> Result<(Location, SqliteOptions)> {
    let rest = match url.split_once(':') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("sqlite") => rest,
        _ => {
            return Err(Error::config(
                "not a SQLite URL: expected sqlite://path/to/file.db or sqlite::memory:",
            ))
        }
    };
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let path = location.strip_prefix("//").unwrap_or(location);
    let location = if path == ":memory:" {
        Location::Memory
    } else if path.starts_with(":memory") {
        // `sqlite::memory:x` would otherwise be a file named `:memory:x`.
        return Err(Error::config(
            "SQLite URL names `:memory…` but is not `sqlite::memory:`: an in-memory database is exactly `sqlite::memory:` (options after `?`)",
        ));
    } else {
        let path = headcount_core::backend::url::decode(path, "path")?;
        if path.is_empty() {
            return Err(Error::config(
                "SQLite URL has no file path: expected sqlite://relative/path.db, sqlite:///absolute/path.db or sqlite::memory:",
            ));
        }
        if path.contains('\0') {
            return Err(Error::config("SQLite path contains a NUL character"));
        }
        Location::File(PathBuf::from(path))
    };

    let pairs = parse_query(query)?;
    reject_duplicates(&pairs)?;
    let mut options = SqliteOptions::default();
    for (key, value) in &pairs {
        match key.as_str() {
            "timeout" => options.timeout = parse_deadline(key, value)?,
            // Zero is meaningful here: fail at once instead of waiting for a lock.
            "busy_timeout" => options.busy_timeout = Some(parse_duration(key, value)?),
            "synchronous" => options.synchronous = value.parse()?,
            "mode" => {
                options.create = match value.as_str() {
                    "rwc" => true,
                    "rw" => false,
                    _ => {
                        return Err(Error::config(format!(
                            "invalid value for option `mode`: `{value}` (expected rwc, the default, or rw: do not create the file)"
                        )))
                    }
                }
            }
            _ => {
                return Err(Error::config(format!(
                    "unknown option `{key}` in SQLite URL: expected timeout, busy_timeout, synchronous or mode"
                )))
            }
        }
    }
    options.check()?;
    Ok((location, options))
}

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// A [`Store`](headcount_core::Store) in an SQLite database file (or in memory), shared safely by every process that
/// opens the same file on one machine.
///
/// Cloning is cheap and shares the connection and its worker thread, which stops when the last
/// clone is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    jobs: mpsc::Sender<Job>,
    location: Location,
    options: SqliteOptions,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("location", &self.inner.location.to_string())
            .field("options", &self.inner.options)
            .finish()
    }
}

impl SqliteStore {
    /// Opens the store named by a URL: `sqlite://relative/path.db`, `sqlite:///absolute/path.db`
    /// or `sqlite::memory:`, with the query options `timeout`, `busy_timeout` and `synchronous`
    /// (see the crate README). The file is created when missing; its directory must exist.
    pub async fn connect(url: &str) -> Result<Self> {
        let (location, options) = parse_url(url)?;
        Self::start(location, options).await
    }

    /// Opens the database file at `path` (`":memory:"` for a private in-memory database) with
    /// `options`. The file is created when missing; its directory must exist.
    pub async fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = path.as_ref();
        let location = if path == Path::new(":memory:") {
            Location::Memory
        } else {
            Location::File(path.to_path_buf())
        };
        options.check()?;
        Self::start(location, options).await
    }

    /// The database file, or `None` for an in-memory database.
    pub fn path(&self) -> Option<&Path> {
        match &self.inner.location {
            Location::Memory => None,
            Location::File(p) => Some(p),
        }
    }

    /// The options this store was opened with.
    pub fn options(&self) -> &SqliteOptions {
        &self.inner.options
    }

    async fn start(location: Location, options: SqliteOptions) -> Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = oneshot::channel();
        let worker_location = location.clone();
        let worker_options = options.clone();
        std::thread::Builder::new()
            .name("headcount-sqlite".into())
            .spawn(move || {
                match open_connection(&worker_location, &worker_options) {
                    Ok(conn) => {
                        // The opener gave up (deadline): nobody will ever send us work.
                        if ready_tx.send(Ok(())).is_ok() {
                            serve(conn, &queue, worker_options.effective_busy_timeout());
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| Error::unavailable(BACKEND, "cannot start the SQLite worker thread", e))?;

        let ready = async { ready_rx.await.unwrap_or_else(|_| Err(worker_gone())) };
        Deadline::new(BACKEND, options.timeout)
            .run("open", ready)
            .await?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                jobs,
                location,
                options,
            }),
        })
    }

    /// Runs `f` on the worker thread within the operation deadline.
    async fn call<T, F>(&self, op: &'static str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let deadline = Deadline::new(BACKEND, self.inner.options.timeout);
        let started = Instant::now();
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            // A caller that already gave up must not have its write applied later by surprise;
            // work still queued at its deadline is dropped instead.
            if reply.is_closed() {
                return;
            }
            if started.elapsed() >= deadline.after() {
                let _ = reply.send(Err(deadline.timed_out(op)));
                return;
            }
            let _ = reply.send(f(conn));
        });
        self.inner.jobs.send(job).map_err(|_| worker_gone())?;
        let answer = async { answer.await.unwrap_or_else(|_| Err(worker_gone())) };
        deadline.run_from(op, started.into(), answer).await
    }
}

fn worker_gone() -> Error {
    Error::Unavailable {
        backend: BACKEND,
        message: "the SQLite worker thread stopped".into(),
        source: None,
    }
}

/// Creating directories is the caller's business; saying which one is missing is ours, since
/// SQLite only reports "unable to open database file".
fn check_directory(path: &Path) -> Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => Err(Error::config(format!(
            "cannot open SQLite database `{}`: directory `{}` does not exist",
            path.display(),
            dir.display()
        ))),
        _ => Ok(()),
    }
}

fn open_connection(location: &Location, options: &SqliteOptions) -> Result<Connection> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if options.create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let opening = |e: rusqlite::Error| open_error(location, e);
    let conn = match location {
        Location::Memory => {
            Connection::open_in_memory_with_flags(flags | OpenFlags::SQLITE_OPEN_CREATE)
        }
        Location::File(path) => {
            check_directory(path)?;
            if !options.create && !path.exists() {
                return Err(Error::config(format!(
                    "SQLite database `{}` does not exist (mode=rw: not creating it)",
                    path.display()
                )));
            }
            Connection::open_with_flags(path, flags)
        }
    }
    .map_err(opening)?;
    conn.busy_timeout(options.effective_busy_timeout())
        .map_err(opening)?;
    // WAL lets readers proceed while a writer commits, and makes `synchronous=NORMAL` safe from
    // corruption. The first statement is also where SQLite notices a file that is not a database.
    // Several processes opening a fresh file at once race to switch it to WAL, and SQLite does
    // not call the busy handler for that switch: retry it until the deadline.
    let deadline = std::time::Instant::now() + options.timeout;
    let mode: String = loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)) {
            Ok(mode) => break mode,
            Err(e)
                if matches!(
                    e.sqlite_error_code(),
                    Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(opening(e)),
        }
    };
    if matches!(location, Location::File(_)) && !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(
            database = %location,
            journal_mode = %mode,
            "SQLite did not switch to WAL mode; concurrent access will block more"
        );
    }
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {}",
        options.synchronous.as_str()
    ))
    .map_err(opening)?;
    // The key is the primary key of a WITHOUT ROWID table: lookups and prefix ranges use it
    // directly, and SQLite has no index-entry size limit that long keys could hit. BINARY
    // collation compares UTF-8 bytes, so ORDER BY key is bytewise. `expires_at` is Unix time in
    // milliseconds on this host's clock, NULL for never.
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {TABLE} (
            key TEXT NOT NULL PRIMARY KEY,
            value TEXT NOT NULL,
            expires_at INTEGER
        ) WITHOUT ROWID"
    ))
    .map_err(opening)?;
    check_schema(&conn, location)?;
    Ok(conn)
}

/// Refuses a table of our name that someone else created (other columns): every statement on
/// it would fail with raw SQL in the message.
fn check_schema(conn: &Connection, location: &Location) -> Result<()> {
    let columns = conn
        .prepare(&format!(
            "SELECT name FROM pragma_table_info('{TABLE}') ORDER BY cid"
        ))
        .and_then(|mut stmt| {
            stmt.query_map([], |row| row.get::<_, String>(0))?
                .collect::<std::result::Result<Vec<String>, _>>()
        })
        .map_err(|e| open_error(location, e))?;
    if columns != ["key", "value", "expires_at"] {
        return Err(Error::config(format!(
            "`{location}` has a table `{TABLE}` that headcount did not create (columns {}): use another database file",
            columns.join(", ")
        )));
    }
    Ok(())
}

fn open_error(location: &Location, e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => {
            Error::config(format!("`{location}` exists but is not a SQLite database"))
        }
        Some(
            ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied
            | ErrorCode::ReadOnly
            | ErrorCode::DatabaseCorrupt,
        ) => Error::config(format!("cannot open SQLite database `{location}`: {e}")),
        _ => sql_error(e),
    }
}

/// Maps a rusqlite error: lock contention and I/O trouble may pass (retryable); anything else
/// (corruption, a schema we did not create, a read-only file) will not.
fn sql_error(e: rusqlite::Error) -> Error {
    let retryable = matches!(
        e.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::SystemIoFailure
                | ErrorCode::DiskFull
                | ErrorCode::CannotOpen
                | ErrorCode::OutOfMemory
                | ErrorCode::FileLockingProtocolFailed
                | ErrorCode::OperationInterrupted
        )
    );
    let message = match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            format!("the database stayed locked by another connection past busy_timeout ({e})")
        }
        _ => e.to_string(),
    };
    if retryable {
        Error::unavailable(BACKEND, message, e)
    } else {
        Error::rejected(BACKEND, message, e)
    }
}

/// `?` for rusqlite results inside the worker.
trait Sql<T> {
    fn sql(self) -> Result<T>;
}

impl<T> Sql<T> for rusqlite::Result<T> {
    fn sql(self) -> Result<T> {
        self.map_err(sql_error)
    }
}

/// The worker thread's loop: run jobs until every store handle is gone.
fn serve(mut conn: Connection, queue: &mpsc::Receiver<Job>, busy_timeout: Duration) {
    let mut since_gc = 0u32;
    while let Ok(job) = queue.recv() {
        // A panic in one job must not take every later operation down with the thread; the
        // transaction it held rolls back as it unwinds.
        if catch_unwind(AssertUnwindSafe(|| job(&mut conn))).is_err() {
            tracing::error!("a SQLite job panicked; the worker carries on");
        }
        since_gc += 1;
        if since_gc >= GC_EVERY {
            since_gc = 0;
            collect_garbage(&conn, busy_timeout);
        }
    }
}

/// Deletes expired rows. Invisible to readers (expired rows are already absent), and safe against
/// a concurrent revival: the predicate is evaluated under SQLite's write lock, so a row renewed
/// before it runs is no longer expired. It does not wait for locks: a busy database just means
/// another round later.
fn collect_garbage(conn: &Connection, busy_timeout: Duration) {
    let busy = conn.busy_timeout(Duration::ZERO);
    let deleted = conn.execute(
        &format!("DELETE FROM {TABLE} WHERE expires_at <= ?1"),
        params![now_ms()],
    );
    match deleted {
        Ok(n) if n > 0 => tracing::debug!(rows = n, "deleted expired SQLite rows"),
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "skipped SQLite garbage collection"),
    }
    if busy.is_ok() {
        // Restoring can only fail if the connection is unusable, which the next job reports.
        let _ = conn.busy_timeout(busy_timeout);
    }
}

/// Milliseconds since the Unix epoch on this host's clock, which is the store's clock for an
/// embedded database.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The expiry of a key written at `now` (whole milliseconds, truncated) with `ttl_ms`. The write
/// really happened somewhere in `[now, now + 1)`, so one millisecond is added: a key may outlive its
/// TTL by up to 1 ms, never fall short of it.
fn expiry(now: i64, ttl_ms: Option<i64>) -> Option<i64> {
    ttl_ms.map(|t| now.saturating_add(t).saturating_add(1))
}

/// Reads a stored text cell. Someone editing the file by hand may have stored another type.
fn text_of(key: &str, value: ValueRef<'_>) -> Result<String> {
    match value {
        ValueRef::Text(bytes) => String::from_utf8(bytes.to_vec())
            .map_err(|_| Error::foreign(key, "UTF-8 text", &String::from_utf8_lossy(bytes))),
        ValueRef::Integer(i) => Ok(i.to_string()),
        ValueRef::Real(f) => Ok(f.to_string()),
        ValueRef::Null => Err(Error::foreign(key, "text", "NULL")),
        ValueRef::Blob(b) => Err(Error::foreign(
            key,
            "text",
            &format!("a blob of {} bytes", b.len()),
        )),
    }
}

fn live_value(conn: &Connection, key: &str, now: i64) -> Result<Option<String>> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT value FROM {TABLE} WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)"
        ))
        .sql()?;
    let mut rows = stmt.query(params![key, now]).sql()?;
    match rows.next().sql()? {
        Some(row) => Ok(Some(text_of(key, row.get_ref(0).sql()?)?)),
        None => Ok(None),
    }
}

/// Writes `value` at `key` with a fresh expiry, whether or not a (necessarily expired or
/// replaced) row is there.
fn upsert(conn: &Connection, key: &str, value: &str, expires_at: Option<i64>) -> Result<()> {
    conn.prepare_cached(&format!(
        "INSERT INTO {TABLE} (key, value, expires_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at"
    ))
    .sql()?
    .execute(params![key, value, expires_at])
    .sql()?;
    Ok(())
}

/// Runs `op` in a write transaction with the clock read after the write lock is taken, so a long
/// wait for the lock (another process writing) cannot make liveness be judged, or an expiry set,
/// at a stale instant: a reader meanwhile may already have seen the key expire.
fn locked_write<T>(
    conn: &mut Connection,
    op: impl FnOnce(&Connection, i64) -> Result<T>,
) -> Result<T> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .sql()?;
    let out = op(&tx, now_ms())?;
    tx.commit().sql()?;
    Ok(out)
}

fn incr(conn: &mut Connection, key: &str, ttl_ms: Option<i64>) -> Result<i64> {
    locked_write(conn, |tx, now| add_to_counter(tx, key, 1, ttl_ms, now))
}

/// Adds `by` to the counter at `key` inside the caller's write transaction, judging liveness at
/// `now`; a live key keeps its expiry, a missing or expired one is created with `ttl_ms`.
fn add_to_counter(
    tx: &Connection,
    key: &str,
    by: i64,
    ttl_ms: Option<i64>,
    now: i64,
) -> Result<i64> {
    match live_value(tx, key, now)? {
        Some(text) => {
            let next = parse_counter(key, &text)?.checked_add(by).ok_or_else(|| {
                Error::foreign(key, "a decimal integer that stays within an i64", &text)
            })?;
            tx.prepare_cached(&format!("UPDATE {TABLE} SET value = ?2 WHERE key = ?1"))
                .sql()?
                .execute(params![key, next.to_string()])
                .sql()?;
            Ok(next)
        }
        None => {
            upsert(tx, key, &by.to_string(), expiry(now, ttl_ms))?;
            Ok(by)
        }
    }
}

/// [`Store::incr_and_get`] in one `BEGIN IMMEDIATE` transaction: the read sees the database as
/// of the increment.
fn incr_and_get(
    conn: &mut Connection,
    key: &str,
    by: i64,
    ttl_ms: Option<i64>,
    get_key: &str,
) -> Result<(i64, Option<String>)> {
    locked_write(conn, |tx, now| {
        let next = add_to_counter(tx, key, by, ttl_ms, now)?;
        Ok((next, live_value(tx, get_key, now)?))
    })
}

fn set_max(conn: &mut Connection, key: &str, value: i64, ttl_ms: Option<i64>) -> Result<bool> {
    locked_write(conn, |tx, now| {
        if let Some(text) = live_value(tx, key, now)? {
            if parse_counter(key, &text)? >= value {
                return Ok(false);
            }
        }
        upsert(tx, key, &value.to_string(), expiry(now, ttl_ms))?;
        Ok(true)
    })
}

fn compare_and_set(
    conn: &mut Connection,
    key: &str,
    expected: Option<&str>,
    new: &str,
    ttl_ms: Option<i64>,
) -> Result<bool> {
    locked_write(conn, |conn, now| {
        compare_and_set_at(conn, now, key, expected, new, ttl_ms)
    })
}

fn compare_and_set_at(
    conn: &Connection,
    now: i64,
    key: &str,
    expected: Option<&str>,
    new: &str,
    ttl_ms: Option<i64>,
) -> Result<bool> {
    let expires_at = expiry(now, ttl_ms);
    // Each branch is one statement, which SQLite runs atomically under its write lock.
    let changed = match expected {
        Some(expected) => conn
            .prepare_cached(&format!(
                "UPDATE {TABLE} SET value = ?3, expires_at = ?4
                 WHERE key = ?1 AND value = ?5 AND (expires_at IS NULL OR expires_at > ?2)"
            ))
            .sql()?
            .execute(params![key, now, new, expires_at, expected])
            .sql()?,
        None => conn
            .prepare_cached(&format!(
                "INSERT INTO {TABLE} (key, value, expires_at) VALUES (?1, ?3, ?4)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
                 WHERE {TABLE}.expires_at IS NOT NULL AND {TABLE}.expires_at <= ?2"
            ))
            .sql()?
            .execute(params![key, now, new, expires_at])
            .sql()?,
    };
    Ok(changed == 1)
}

fn expire(conn: &mut Connection, key: &str, ttl_ms: i64) -> Result<bool> {
    locked_write(conn, |conn, now| {
        let changed = conn
            .prepare_cached(&format!(
                "UPDATE {TABLE} SET expires_at = ?3
                 WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)"
            ))
            .sql()?
            .execute(params![key, now, expiry(now, Some(ttl_ms))])
            .sql()?;
        Ok(changed == 1)
    })
}

fn compare_and_delete(conn: &mut Connection, key: &str, expected: &str) -> Result<bool> {
    locked_write(conn, |conn, now| {
        let n = conn
            .prepare_cached(&format!(
                "DELETE FROM {TABLE} WHERE key = ?1 AND value = ?2
                 AND (expires_at IS NULL OR expires_at > ?3)"
            ))
            .sql()?
            .execute(params![key, expected, now])
            .sql()?;
        Ok(n > 0)
    })
}

fn delete(conn: &mut Connection, key: &str) -> Result<bool> {
    locked_write(conn, |conn, now| {
        // An expired row is removed too (it is garbage anyway), but only a live one counts.
        let live: Option<bool> = conn
            .prepare_cached(&format!(
                "DELETE FROM {TABLE} WHERE key = ?1
                 RETURNING (expires_at IS NULL OR expires_at > ?2)"
            ))
            .sql()?
            .query_row(params![key, now], |row| row.get(0))
            .optional()
            .sql()?;
        Ok(live.unwrap_or(false))
    })
}

/// [`Store::renew_and_list`] in one `BEGIN IMMEDIATE` transaction: the renewal and the listing
/// judge liveness at the same instant, and the listing sees the renewal.
fn renew_and_list(
    conn: &mut Connection,
    key: &str,
    holder: &str,
    ttl_ms: i64,
    prefix: &str,
) -> Result<(bool, Vec<(String, String)>)> {
    locked_write(conn, |tx, now| {
        let changed = tx
            .prepare_cached(&format!(
                "UPDATE {TABLE} SET expires_at = ?3
                 WHERE key = ?1 AND value = ?4 AND (expires_at IS NULL OR expires_at > ?2)"
            ))
            .sql()?
            .execute(params![key, now, expiry(now, Some(ttl_ms)), holder])
            .sql()?;
        Ok((changed == 1, list(tx, prefix, now)?))
    })
}

fn list(conn: &Connection, prefix: &str, now: i64) -> Result<Vec<(String, String)>> {
    // `key >= prefix AND key < successor(prefix)` is exactly "starts with prefix" under bytewise
    // (= code point) order, and is a range scan of the primary key.
    // Two statements rather than `(?3 IS NULL OR key < ?3)`, which would hide the upper bound
    // from the planner.
    let upper = prefix_successor(prefix);
    let bound = if upper.is_some() { "AND key < ?3" } else { "" };
    let sql = format!(
        "SELECT key, value FROM {TABLE}
         WHERE key >= ?1 {bound} AND (expires_at IS NULL OR expires_at > ?2)
         ORDER BY key"
    );
    let mut stmt = conn.prepare_cached(&sql).sql()?;
    let mut rows = match &upper {
        Some(upper) => stmt.query(params![prefix, now, upper]),
        None => stmt.query(params![prefix, now]),
    }
    .sql()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().sql()? {
        let key = text_of("(a key)", row.get_ref(0).sql()?)?;
        let value = text_of(&key, row.get_ref(1).sql()?)?;
        out.push((key, value));
    }
    Ok(out)
}

/// The smallest string greater than every string that starts with `prefix`, or `None` when there
/// is none (the prefix is all `char::MAX`).
fn prefix_successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last {
            '\u{D7FF}' => Some('\u{E000}'),
            c => char::from_u32(u32::from(c) + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[async_trait]
impl backend::Backend for SqliteStore {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(BACKEND);
        caps.native_set_max = true;
        caps.native_incr_and_get = true;
        caps.native_renew_and_list = true;
        caps.native_compare_and_delete = true;
        caps.shared = self.inner.location != Location::Memory;
        caps
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        let key = key.to_owned();
        let ttl_ms = ttl.map(ttl_millis);
        self.call("incr", move |conn| incr(conn, &key, ttl_ms))
            .await
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_owned();
        self.call("get", move |conn| live_value(conn, &key, now_ms()))
            .await
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        let key = key.to_owned();
        let ttl_ms = ttl_millis(ttl);
        self.call("expire", move |conn| expire(conn, &key, ttl_ms))
            .await
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        let key = key.to_owned();
        let expected = expected.map(str::to_owned);
        let new = new.to_owned();
        let ttl_ms = ttl.map(ttl_millis);
        self.call("compare_and_set", move |conn| {
            compare_and_set(conn, &key, expected.as_deref(), &new, ttl_ms)
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let key = key.to_owned();
        self.call("delete", move |conn| delete(conn, &key)).await
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        let (key, expected) = (key.to_owned(), expected.to_owned());
        self.call("compare_and_delete", move |conn| {
            compare_and_delete(conn, &key, &expected)
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let prefix = prefix.to_owned();
        self.call("list", move |conn| list(conn, &prefix, now_ms()))
            .await
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        let key = key.to_owned();
        let ttl_ms = ttl.map(ttl_millis);
        self.call("set_max", move |conn| set_max(conn, &key, value, ttl_ms))
            .await
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
        self.call("incr_and_get", move |conn| {
            incr_and_get(conn, &key, by, ttl_ms, &get_key)
        })
        .await
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
        self.call("renew_and_list", move |conn| {
            renew_and_list(conn, &key, &holder, ttl_ms, &prefix)
        })
        .await
    }

    /// Durable when the connection's `PRAGMA synchronous` is FULL or EXTRA and the journal is
    /// WAL or DELETE (or TRUNCATE/PERSIST): then every commit is synced before it returns. An
    /// in-memory database is never durable.
    async fn durability(&self) -> Result<Durability> {
        if self.inner.location == Location::Memory {
            return Ok(Durability::not_durable(
                "an in-memory SQLite database is gone when its process exits",
            ));
        }
        let (synchronous, journal, file) = self
            .call("durability", |conn| {
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
fn sqlite_durability(synchronous: i64, journal: &str) -> Durability {
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

#[cfg(test)]
mod tests;
