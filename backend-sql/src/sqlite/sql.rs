//! The SQL of every primitive, run on the worker thread: one statement, or a `BEGIN IMMEDIATE`
//! transaction for read-modify-write, with liveness judged on this host's clock.

use std::time::{SystemTime, UNIX_EPOCH};

use headcount_core::backend::parse_counter;
use headcount_core::{Error, Result};
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

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

pub(crate) fn live_value(conn: &Connection, key: &str, now: i64) -> Result<Option<String>> {
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

pub(crate) fn incr(conn: &mut Connection, key: &str, ttl_ms: Option<i64>) -> Result<i64> {
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

pub(crate) fn compare_and_set(
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

pub(crate) fn expire(conn: &mut Connection, key: &str, ttl_ms: i64) -> Result<bool> {
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

pub(crate) fn compare_and_delete(conn: &mut Connection, key: &str, expected: &str) -> Result<bool> {
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

pub(crate) fn delete(conn: &mut Connection, key: &str) -> Result<bool> {
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
pub(crate) fn renew_and_list(
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

pub(crate) fn list(conn: &Connection, prefix: &str, now: i64) -> Result<Vec<(String, String)>> {
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
