//! The SQL of every primitive, run on the worker thread, with liveness judged on this host's clock.
//!
//! A write is one autocommit statement that reads the clock itself ([`NOW_MS`]), after SQLite has
//! taken the write lock for it. `incr` and `set_max` try one upsert that applies only over a
//! canonical counter (or an absent or expired row); when it does not apply they fall back to a
//! `BEGIN IMMEDIATE` transaction ([`locked_write`]) that reads the row and gives the exact answer
//! or error. `incr_and_get`, `renew_and_list` and `renew_and_versions`, several statements that must
//! see one instant, always run in such a transaction. Reads are one statement.

use std::sync::LazyLock;
use std::time::{SystemTime, UNIX_EPOCH};

use headcount_core::backend::{direct_entries, listing_digest, parse_counter};
use headcount_core::{Error, Result};
use rusqlite::types::{FromSql, Value, ValueRef};
use rusqlite::{params, Connection, OptionalExtension, Params, Statement, TransactionBehavior};

use super::errors::Sql;

/// The table every key lives in. Fixed: one SQLite file is cheap, so separate deployments use
/// separate files.
pub const TABLE: &str = "headcount_kv";

/// Milliseconds since the Unix epoch on this host's clock, which is the store's clock for an
/// embedded database.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// [`now_ms`] read by SQLite inside a statement, so that a single autocommit statement reads the
/// clock under the write lock it takes.
///
/// - Why under the lock: in autocommit mode a statement's program starts with `OP_Init`, which
///   jumps straight to the prologue at its end, whose first instruction is `OP_Transaction`; for a
///   write that takes the write lock, waiting in the busy handler. Only then does the prologue
///   compute any constants factored out of the body and jump back to the body, where these
///   statements call `unixepoch` (behind `OP_Once`). So the clock is read under the lock wherever
///   the planner puts the call (`sqlite3FinishCoding` emits the prologue in that order;
///   `the_clock_is_read_under_the_write_lock` checks every statement's bytecode). If the wait
///   times out, the statement fails with `SQLITE_BUSY` having read and written nothing.
/// - One instant: SQLite caches `'now'` per `sqlite3_step` (`Vdbe::iCurrentTime`, cleared at the
///   start of each step). These statements do all their work in their first step (`RETURNING`
///   rows are buffered), so every use in one statement sees the same value, and a cached
///   statement reads the clock afresh on each execution.
/// - Same value as [`now_ms`]: the unix VFS reads `gettimeofday` truncated to the millisecond
///   (the same `CLOCK_REALTIME` as `SystemTime`; it cannot fail, so the value is never NULL),
///   and `unixepoch('subsec')` returns it as `ms / 1000.0`. Multiplying back can land a hair
///   below `ms` (1001 ms gives 1000.999…), so `ROUND`, not truncation, recovers it exactly (the
///   error is below 0.06 ms up to year 9999).
/// - `+ 0` drops the `CAST`'s INTEGER affinity, so comparisons with `expires_at` convert exactly
///   as they did with a bound parameter (it matters only in a hand-made table whose `expires_at`
///   column lacks INTEGER affinity).
pub(crate) const NOW_MS: &str = "(CAST(ROUND(unixepoch('now', 'subsec') * 1000) AS INTEGER) + 0)";

/// The expiry of a key written at `now` (whole milliseconds, truncated) with `ttl_ms`. The write
/// really happened somewhere in `[now, now + 1)`, so one millisecond is added: a key may outlive its
/// TTL by up to 1 ms, never fall short of it. The statements that read [`NOW_MS`] compute the same
/// `now + ttl + 1` in SQL (NULL for no TTL); a TTL is at most `MAX_TTL`, so neither can overflow.
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

pub(crate) fn live_value(conn: &Connection, key: &str, now: i64) -> Result<Option<String>> {
    // Built once: formatting it per call would cost the hot path an allocation.
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT value FROM {TABLE} WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)"
        )
    });
    let mut stmt = conn.prepare_cached(&SQL).sql()?;
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

/// `{TABLE}`'s row is live at [`NOW_MS`]. Qualified, for an upsert's `DO UPDATE`, where
/// `excluded` is in scope too; in `NOT` it is exactly "expired": `expires_at > now` is never NULL
/// when `expires_at` is not.
fn live_now() -> String {
    format!("({TABLE}.expires_at IS NULL OR {TABLE}.expires_at > {NOW_MS})")
}

/// `{TABLE}.value` is a counter: exactly the text [`parse_counter`] accepts. The canonical
/// decimal spellings of the i64s are exactly the texts that survive a round trip through
/// SQLite's integer `CAST` unchanged: it reads an optional sign, digits and stops at anything
/// else (so `"007"`, `"+1"`, `" 1"`, `"1.0"`, `"-0"`, `""` come back different), clamps beyond
/// the i64 range (so a too-long number comes back different), and prints `%lld`. Text only: an
/// INTEGER or REAL cell (a hand-made table without TEXT affinity) is left to the slow path,
/// which reads it as [`text_of`] does.
pub(crate) fn canonical_counter() -> String {
    format!(
        "(typeof({TABLE}.value) = 'text'
          AND CAST(CAST({TABLE}.value AS INTEGER) AS TEXT) = {TABLE}.value)"
    )
}

/// Runs `stmt` to completion and returns the first column of its first row, if any. Stepping to
/// the end matters in autocommit mode: a statement with `RETURNING` commits only when it
/// finishes, and an error from that commit would be lost in the reset that drops it half-way.
fn returning<T: FromSql>(stmt: &mut Statement<'_>, params: impl Params) -> Result<Option<T>> {
    let mut rows = stmt.query(params).sql()?;
    let mut first = None;
    while let Some(row) = rows.next().sql()? {
        if first.is_none() {
            first = Some(row.get(0).sql()?);
        }
    }
    Ok(first)
}

pub(crate) fn incr(conn: &mut Connection, key: &str, ttl_ms: Option<i64>) -> Result<i64> {
    match incr_in_one_statement(conn, key, ttl_ms)? {
        Some(n) => Ok(n),
        // The transaction reads the value and reports it precisely.
        None => locked_write(conn, |tx, now| add_to_counter(tx, key, 1, ttl_ms, now)),
    }
}

/// `incr` as one autocommit statement, for the common case: a live canonical counter below
/// i64::MAX is incremented (its expiry kept), an absent or expired row becomes 1 with a fresh
/// expiry. Over anything else (a foreign value, or i64::MAX, whose sum SQLite would turn into a
/// REAL) it writes nothing and returns `None`.
pub(crate) fn incr_in_one_statement(
    conn: &Connection,
    key: &str,
    ttl_ms: Option<i64>,
) -> Result<Option<i64>> {
    let mut stmt = conn.prepare_cached(incr_sql()).sql()?;
    returning(&mut stmt, params![key, ttl_ms])
}

/// `incr`'s one statement: binds the key and the TTL.
fn incr_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        let live = live_now();
        let counter = canonical_counter();
        format!(
            "INSERT INTO {TABLE} (key, value, expires_at) VALUES (?1, '1', {NOW_MS} + ?2 + 1)
             ON CONFLICT (key) DO UPDATE SET
                 value = CASE WHEN {live}
                              THEN CAST(CAST({TABLE}.value AS INTEGER) + 1 AS TEXT)
                              ELSE excluded.value END,
                 expires_at = CASE WHEN {live} THEN {TABLE}.expires_at ELSE excluded.expires_at END
             WHERE NOT {live}
                OR ({counter} AND CAST({TABLE}.value AS INTEGER) < 9223372036854775807)
             RETURNING CAST(value AS INTEGER)"
        )
    });
    &SQL
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
pub(crate) fn incr_and_get(
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

pub(crate) fn set_max(
    conn: &mut Connection,
    key: &str,
    value: i64,
    ttl_ms: Option<i64>,
) -> Result<bool> {
    if set_max_in_one_statement(conn, key, value, ttl_ms)? {
        return Ok(true);
    }
    // The statement wrote nothing: the transaction decides between "not greater" (a normal
    // `false`) and a foreign value (an error). The statement cannot tell them apart without
    // touching the row, since `RETURNING` reports only rows it wrote; so a `set_max` that does
    // not raise the value costs the statement and then the transaction.
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

/// `set_max` as one autocommit statement when it writes: over an absent or expired row, or a
/// live canonical counter below `value`, it writes `value` with a fresh expiry and returns
/// `true`. Otherwise it writes nothing and returns `false`.
pub(crate) fn set_max_in_one_statement(
    conn: &Connection,
    key: &str,
    value: i64,
    ttl_ms: Option<i64>,
) -> Result<bool> {
    let changed = conn
        .prepare_cached(set_max_sql())
        .sql()?
        .execute(params![key, value, ttl_ms])
        .sql()?;
    Ok(changed == 1)
}

/// `set_max`'s one statement: binds the key, the value and the TTL.
fn set_max_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        let live = live_now();
        let counter = canonical_counter();
        format!(
            "INSERT INTO {TABLE} (key, value, expires_at)
             VALUES (?1, CAST(?2 AS TEXT), {NOW_MS} + ?3 + 1)
             ON CONFLICT (key) DO UPDATE SET
                 value = excluded.value, expires_at = excluded.expires_at
             WHERE NOT {live} OR ({counter} AND CAST({TABLE}.value AS INTEGER) < ?2)"
        )
    });
    &SQL
}

// The primitives below are one autocommit statement each, atomic under SQLite's write lock and
// reading the clock under it ([`NOW_MS`]).

pub(crate) fn compare_and_set(
    conn: &Connection,
    key: &str,
    expected: Option<&str>,
    new: &str,
    ttl_ms: Option<i64>,
) -> Result<bool> {
    let changed = match expected {
        Some(expected) => conn
            .prepare_cached(replace_sql())
            .sql()?
            .execute(params![key, new, ttl_ms, expected])
            .sql()?,
        None => conn
            .prepare_cached(create_sql())
            .sql()?
            .execute(params![key, new, ttl_ms])
            .sql()?,
    };
    Ok(changed == 1)
}

/// `compare_and_set` over a live expected value: binds the key, the new value, the TTL and the
/// expected value.
fn replace_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE {TABLE} SET value = ?2, expires_at = {NOW_MS} + ?3 + 1
             WHERE key = ?1 AND value = ?4 AND (expires_at IS NULL OR expires_at > {NOW_MS})"
        )
    });
    &SQL
}

/// `compare_and_set` over an absent or expired key: binds the key, the value and the TTL.
fn create_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "INSERT INTO {TABLE} (key, value, expires_at) VALUES (?1, ?2, {NOW_MS} + ?3 + 1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
             WHERE {TABLE}.expires_at IS NOT NULL AND {TABLE}.expires_at <= {NOW_MS}"
        )
    });
    &SQL
}

pub(crate) fn expire(conn: &Connection, key: &str, ttl_ms: i64) -> Result<bool> {
    let changed = conn
        .prepare_cached(expire_sql())
        .sql()?
        .execute(params![key, ttl_ms])
        .sql()?;
    Ok(changed == 1)
}

/// Binds the key and the TTL.
fn expire_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE {TABLE} SET expires_at = {NOW_MS} + ?2 + 1
             WHERE key = ?1 AND (expires_at IS NULL OR expires_at > {NOW_MS})"
        )
    });
    &SQL
}

pub(crate) fn compare_and_delete(conn: &Connection, key: &str, expected: &str) -> Result<bool> {
    let n = conn
        .prepare_cached(compare_and_delete_sql())
        .sql()?
        .execute(params![key, expected])
        .sql()?;
    Ok(n > 0)
}

/// Binds the key and the expected value.
fn compare_and_delete_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "DELETE FROM {TABLE} WHERE key = ?1 AND value = ?2
             AND (expires_at IS NULL OR expires_at > {NOW_MS})"
        )
    });
    &SQL
}

pub(crate) fn delete(conn: &Connection, key: &str) -> Result<bool> {
    let mut stmt = conn.prepare_cached(delete_sql()).sql()?;
    let live: Option<bool> = returning(&mut stmt, params![key])?;
    Ok(live.unwrap_or(false))
}

/// Binds the key. An expired row is removed too (it is garbage anyway), but only a live one
/// counts.
fn delete_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "DELETE FROM {TABLE} WHERE key = ?1
             RETURNING (expires_at IS NULL OR expires_at > {NOW_MS})"
        )
    });
    &SQL
}

/// The most rows one garbage collection examines.
pub(crate) const GC_SLICE: usize = 256;

/// One garbage collection: deletes the expired rows among the (at most [`GC_SLICE`]) keys after
/// `after` in key order (`None`: from the first key), and returns how many it deleted and where
/// the next one starts (`None`: the slice reached the end, so the next starts over). Its work is
/// bounded however many rows the table holds (there is no index on `expires_at`, and a scan of
/// the whole table would cost in proportion to every deployment sharing the file), and every row
/// is examined once per rows / [`GC_SLICE`] collections. The cursor is the stored key as it is
/// (any storage class, any bytes), so a hand-made row cannot stop it. The delete reads the clock
/// under its write lock ([`NOW_MS`]), so a row renewed before it runs is no longer expired.
pub(crate) fn gc_slice(conn: &Connection, after: Option<&Value>) -> Result<(usize, Option<Value>)> {
    static SQL: LazyLock<[String; 6]> = LazyLock::new(|| {
        let skip = GC_SLICE - 1;
        [
            format!("SELECT key FROM {TABLE} ORDER BY key LIMIT 1 OFFSET {skip}"),
            format!("SELECT key FROM {TABLE} WHERE key > ?1 ORDER BY key LIMIT 1 OFFSET {skip}"),
            format!("DELETE FROM {TABLE} WHERE key <= ?1 AND expires_at <= {NOW_MS}"),
            format!("DELETE FROM {TABLE} WHERE key > ?1 AND key <= ?2 AND expires_at <= {NOW_MS}"),
            // Fewer than GC_SLICE keys in the whole table.
            format!("DELETE FROM {TABLE} WHERE expires_at <= {NOW_MS}"),
            format!("DELETE FROM {TABLE} WHERE key > ?1 AND expires_at <= {NOW_MS}"),
        ]
    });
    let last: Option<Value> = match after {
        None => conn
            .prepare_cached(&SQL[0])
            .sql()?
            .query_row([], |row| row.get(0)),
        Some(after) => conn
            .prepare_cached(&SQL[1])
            .sql()?
            .query_row([after], |row| row.get(0)),
    }
    .optional()
    .sql()?;
    let deleted = match (after, &last) {
        (None, Some(last)) => conn.prepare_cached(&SQL[2]).sql()?.execute([last]),
        (Some(after), Some(last)) => conn
            .prepare_cached(&SQL[3])
            .sql()?
            .execute(params![after, last]),
        (None, None) => conn.prepare_cached(&SQL[4]).sql()?.execute([]),
        (Some(after), None) => conn.prepare_cached(&SQL[5]).sql()?.execute([after]),
    }
    .sql()?;
    Ok((deleted, last))
}

/// Every statement that reads [`NOW_MS`], by primitive, for tests that look at their bytecode.
#[cfg(test)]
pub(crate) fn clock_statements() -> [(&'static str, &'static str); 7] {
    [
        ("incr", incr_sql()),
        ("set_max", set_max_sql()),
        ("compare_and_set (replace)", replace_sql()),
        ("compare_and_set (create)", create_sql()),
        ("expire", expire_sql()),
        ("compare_and_delete", compare_and_delete_sql()),
        ("delete", delete_sql()),
    ]
}

/// [`Store::renew_and_list`] in one `BEGIN IMMEDIATE` transaction: the renewal and the listing
/// judge liveness at the same instant, and the listing sees the renewal.
pub(crate) fn renew_and_list(
    conn: &mut Connection,
    key: &str,
    holder: &str,
    ttl_ms: i64,
    prefix: &str,
) -> Result<(bool, Vec<(String, String)>)> {
    locked_write(conn, |tx, now| {
        let renewed = renew(tx, key, holder, ttl_ms, now)?;
        Ok((renewed, list(tx, prefix, now)?))
    })
}

/// [`Store::renew_and_versions`] in one `BEGIN IMMEDIATE` transaction, as [`renew_and_list`]:
/// the renewal, then each directory's version as the provided `renew_and_list_if_changed` (a
/// [`renew_and_list`] of the directory) answers it, the digest of the entries directly under
/// it ([`listing_digest`]), read with the same range of the primary key as its listing.
pub(crate) fn renew_and_versions(
    conn: &mut Connection,
    key: &str,
    holder: &str,
    ttl_ms: i64,
    dirs: &[String],
) -> Result<(bool, Vec<String>)> {
    locked_write(conn, |tx, now| {
        let renewed = renew(tx, key, holder, ttl_ms, now)?;
        let versions = dirs
            .iter()
            .map(|dir| Ok(listing_digest(&direct_entries(dir, list(tx, dir, now)?))))
            .collect::<Result<Vec<_>>>()?;
        Ok((renewed, versions))
    })
}

/// Renews `key` if it holds `holder` and is live at `now`, inside the caller's write
/// transaction: returns whether it did.
fn renew(tx: &Connection, key: &str, holder: &str, ttl_ms: i64, now: i64) -> Result<bool> {
    let changed = tx
        .prepare_cached(&format!(
            "UPDATE {TABLE} SET expires_at = ?3
             WHERE key = ?1 AND value = ?4 AND (expires_at IS NULL OR expires_at > ?2)"
        ))
        .sql()?
        .execute(params![key, now, expiry(now, Some(ttl_ms)), holder])
        .sql()?;
    Ok(changed == 1)
}

pub(crate) fn list(conn: &Connection, prefix: &str, now: i64) -> Result<Vec<(String, String)>> {
    Ok(list_with_expiry(conn, prefix, now)?
        .into_iter()
        .map(|(k, v, _)| (k, v))
        .collect())
}

/// The live keys under `prefix` with their values and their `expires_at` (Unix ms, `None` for
/// a key without a TTL), sorted by key: [`list`], and the TTLs of `list_with_ttl`.
pub(crate) fn list_with_expiry(
    conn: &Connection,
    prefix: &str,
    now: i64,
) -> Result<Vec<(String, String, Option<i64>)>> {
    // `key >= prefix AND key < successor(prefix)` is exactly "starts with prefix" under bytewise
    // (= code point) order, and is a range scan of the primary key.
    // Two statements rather than `(?3 IS NULL OR key < ?3)`, which would hide the upper bound
    // from the planner.
    static SQL: LazyLock<[String; 2]> = LazyLock::new(|| {
        ["", "AND key < ?3"].map(|bound| {
            format!(
                "SELECT key, value, expires_at FROM {TABLE}
                 WHERE key >= ?1 {bound} AND (expires_at IS NULL OR expires_at > ?2)
                 ORDER BY key"
            )
        })
    });
    let upper = prefix_successor(prefix);
    let mut stmt = conn
        .prepare_cached(&SQL[usize::from(upper.is_some())])
        .sql()?;
    let mut rows = match &upper {
        Some(upper) => stmt.query(params![prefix, now, upper]),
        None => stmt.query(params![prefix, now]),
    }
    .sql()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().sql()? {
        let key = text_of("(a key)", row.get_ref(0).sql()?)?;
        let value = text_of(&key, row.get_ref(1).sql()?)?;
        let expires: Option<i64> = row.get(2).sql()?;
        out.push((key, value, expires));
    }
    Ok(out)
}

/// The smallest string greater than every string that starts with `prefix`, or `None` when there
/// is none (the prefix is all `char::MAX`).
pub(crate) fn prefix_successor(prefix: &str) -> Option<String> {
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
