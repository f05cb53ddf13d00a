//! The store's one connection, owned by a worker thread so that rusqlite's blocking calls never
//! run on the async runtime's workers: opening it, running operations on it within their
//! deadline, and collecting garbage between them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use headcount_core::{Error, Result};
use rusqlite::types::Value;
use rusqlite::{Connection, ErrorCode, OpenFlags};
use tokio::sync::oneshot;

use super::config::{Location, SqliteConfig, SqliteOptions};
use super::errors::{open_error, worker_gone, BACKEND};
use super::sql::{gc_slice, GC_SLICE, TABLE};

/// A garbage collection runs after every this many operations of one store handle: it examines
/// one slice of [`GC_SLICE`] keys, or up to [`GC_SLICES`] while more than half of each slice was
/// expired, so it examines at least one row per operation, and up to four while expired rows
/// abound: a workload that leaves an expired key behind on most of its operations cannot outrun
/// it.
const GC_EVERY: u32 = GC_SLICE as u32;

/// The most slices one garbage collection examines.
const GC_SLICES: usize = 4;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The worker thread of one store and the way to it; the thread stops when this is dropped.
pub(crate) struct Worker {
    jobs: mpsc::Sender<Job>,
    config: SqliteConfig,
    /// The calls sent and not yet answered (or given up), to tell a lone call, which waits for
    /// its answer awake (see [`WAIT_AWAKE`]), from one queued behind others.
    in_flight: AtomicUsize,
}

impl Worker {
    /// Starts the worker thread and opens the database on it, within the deadline.
    pub(crate) async fn start(config: SqliteConfig) -> Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = oneshot::channel();
        let worker_location = config.location().clone();
        let worker_options = config.options().clone();
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
        config.deadline().run("open", ready).await?;
        Ok(Worker {
            jobs,
            config,
            in_flight: AtomicUsize::new(0),
        })
    }

    /// The configuration the database was opened with.
    pub(crate) fn config(&self) -> &SqliteConfig {
        &self.config
    }

    /// Runs `f` on the worker thread within the operation deadline.
    pub(crate) async fn call<T, F>(&self, op: &'static str, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let deadline = self.config.deadline();
        let started = Instant::now();
        let (reply, mut answer) = oneshot::channel();
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
        let in_flight = InFlight::enter(&self.in_flight);
        self.jobs.send(job).map_err(|_| worker_gone())?;
        if in_flight.alone {
            if let Some(answered) = wait_awake(&mut answer) {
                return answered;
            }
        }
        let answer = async { answer.await.unwrap_or_else(|_| Err(worker_gone())) };
        deadline.run_from(op, started.into(), answer).await
    }
}

/// One call counted in [`Worker::in_flight`] until it is answered or dropped.
struct InFlight<'a> {
    count: &'a AtomicUsize,
    /// No other call was in flight when this one was sent.
    alone: bool,
}

impl<'a> InFlight<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        let alone = count.fetch_add(1, Ordering::Relaxed) == 0;
        InFlight { count, alone }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long a lone call waits for its answer awake before it sleeps until the answer wakes it.
/// Most operations take the worker 5–20 µs, and a caller that fell asleep meanwhile is woken
/// on another core, which on the test machine (2 vCPUs) cost more than the operation: 4000
/// sequential `incr`s (a 14 µs statement run inline) took 34–54 µs each, against 25–45 µs
/// through `spawn_blocking`, whose thread hands its core back to the caller it wakes; waiting
/// awake, 15–21 µs. A call queued behind others sleeps at once: its wait is longer, and callers
/// spinning beside the worker would take the cores it needs. With one core there is nothing to
/// wait awake for.
const WAIT_AWAKE: Duration = Duration::from_micros(30);

/// The answer, if it comes within [`WAIT_AWAKE`] (with more than one core); else None, and the
/// caller awaits it. Blocks the calling thread for at most that long.
fn wait_awake<T>(answer: &mut oneshot::Receiver<Result<T>>) -> Option<Result<T>> {
    if !multi_core() {
        return None;
    }
    let until = Instant::now() + WAIT_AWAKE;
    loop {
        match answer.try_recv() {
            Ok(answered) => return Some(answered),
            Err(oneshot::error::TryRecvError::Closed) => return Some(Err(worker_gone())),
            Err(oneshot::error::TryRecvError::Empty) if Instant::now() < until => {
                std::hint::spin_loop();
            }
            Err(oneshot::error::TryRecvError::Empty) => return None,
        }
    }
}

/// Whether this machine has more than one core: on one core, a thread that waits awake (the
/// worker for its next job, a caller for its answer) keeps the one it waits for from running.
fn multi_core() -> bool {
    static MULTI_CORE: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
        std::thread::available_parallelism().is_ok_and(|n| n.get() > 1)
    });
    *MULTI_CORE
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
    // Writes read the clock in SQL with `unixepoch(…, 'subsec')` (SQLite 3.42 and later; the
    // bundled library is newer). An older library linked in instead would answer NULL, and every
    // TTL would silently be none.
    let clock: Option<f64> = conn
        .query_row("SELECT unixepoch('now', 'subsec')", [], |row| row.get(0))
        .map_err(opening)?;
    if clock.is_none() {
        return Err(Error::config(format!(
            "SQLite {} is too old for headcount: it needs 3.42 or later (unixepoch with 'subsec')",
            rusqlite::version()
        )));
    }
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

/// The worker thread's loop: run jobs until every store handle is gone.
fn serve(mut conn: Connection, queue: &mpsc::Receiver<Job>, busy_timeout: Duration) {
    let mut since_gc = 0u32;
    // The last key the previous collection examined (None: start from the first key).
    let mut gc_after: Option<Value> = None;
    while let Some(job) = next_job(queue) {
        // A panic in one job must not take every later operation down with the thread; the
        // transaction it held rolls back as it unwinds.
        if catch_unwind(AssertUnwindSafe(|| job(&mut conn))).is_err() {
            tracing::error!("a SQLite job panicked; the worker carries on");
        }
        since_gc += 1;
        if since_gc >= GC_EVERY {
            since_gc = 0;
            collect_garbage(&conn, busy_timeout, &mut gc_after);
        }
    }
}

/// How long the worker polls for the next job before it sleeps: a caller that sends its next
/// call as soon as the last one is answered finds the worker awake, instead of paying a
/// wake-up of a sleeping thread on every call (on the test machine that wake-up made sequential
/// calls 10–20% slower than `spawn_blocking`'s; with the poll they are 1.1–1.4 times as fast).
/// At most 50 µs of one core after each burst of calls, and none on a machine with one core,
/// where polling would keep the caller from running.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// The next job: polled for [`POLL_BEFORE_SLEEP`] (with more than one core), then waited for.
/// None once every store handle is gone.
fn next_job(queue: &mpsc::Receiver<Job>) -> Option<Job> {
    let poll = if multi_core() {
        POLL_BEFORE_SLEEP
    } else {
        Duration::ZERO
    };
    let until = Instant::now() + poll;
    loop {
        match queue.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) if Instant::now() < until => std::hint::spin_loop(),
            Err(mpsc::TryRecvError::Empty) => return queue.recv().ok(),
        }
    }
}

/// Deletes the expired rows of the next slice of the key range (see [`gc_slice`]), and of up to
/// [`GC_SLICES`] slices while more than half of each was expired, and moves `after` past them.
/// Invisible to readers (expired rows are already absent). It does not wait for locks: a busy
/// database just means another round later, from the same place.
pub(crate) fn collect_garbage(
    conn: &Connection,
    busy_timeout: Duration,
    after: &mut Option<Value>,
) {
    let busy = conn.busy_timeout(Duration::ZERO);
    for _ in 0..GC_SLICES {
        match gc_slice(conn, after.as_ref()) {
            Ok((deleted, next)) => {
                if deleted > 0 {
                    tracing::debug!(rows = deleted, "deleted expired SQLite rows");
                }
                *after = next;
                if after.is_none() || deleted * 2 <= GC_SLICE {
                    break;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "skipped SQLite garbage collection");
                break;
            }
        }
    }
    if busy.is_ok() {
        // Restoring can only fail if the connection is unusable, which the next job reports.
        let _ = conn.busy_timeout(busy_timeout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn worker() -> Worker {
        Worker::start(SqliteConfig::from_url("sqlite::memory:").unwrap())
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_answered_after_the_awake_wait_is_still_answered() {
        let worker = worker().await;
        let slow = Duration::from_millis(5);
        assert!(slow > WAIT_AWAKE * 10);
        let answer = worker
            .call("test", move |_| {
                std::thread::sleep(slow);
                Ok(7)
            })
            .await;
        assert_eq!(answer.ok(), Some(7));
        assert_eq!(worker.in_flight.load(Ordering::Relaxed), 0);
        // And a quick one, answered while its caller waits awake.
        assert_eq!(worker.call("test", |_| Ok(8)).await.ok(), Some(8));
        assert_eq!(worker.in_flight.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_given_up_is_no_longer_counted_in_flight() {
        let worker = worker().await;
        let call = worker.call("test", |_| {
            std::thread::sleep(Duration::from_millis(200));
            Ok(())
        });
        assert!(tokio::time::timeout(Duration::from_millis(20), call)
            .await
            .is_err());
        // Dropped while the worker still runs it: the next call is alone again, and waits for
        // its answer awake.
        assert_eq!(worker.in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(worker.call("test", |_| Ok(1)).await.ok(), Some(1));
    }

    #[test]
    fn only_a_call_sent_when_none_was_in_flight_is_alone() {
        let count = AtomicUsize::new(0);
        let first = InFlight::enter(&count);
        let second = InFlight::enter(&count);
        assert!(first.alone);
        assert!(!second.alone);
        drop(first);
        drop(second);
        assert_eq!(count.load(Ordering::Relaxed), 0);
        assert!(InFlight::enter(&count).alone);
    }
}
