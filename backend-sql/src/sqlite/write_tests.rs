//! The write statements: the clock SQLite reads for them, the one-statement counter path and the
//! transaction it falls back to.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use headcount_core::backend::parse_counter;
use headcount_core::{Error, ErrorKind, Store};
use rusqlite::types::{ToSql, Value};
use rusqlite::{params, Connection, OptionalExtension};

use super::sql::{
    canonical_counter, clock_statements, compare_and_delete, compare_and_set, delete, expire,
    incr_in_one_statement, now_ms, set_max_in_one_statement, NOW_MS, TABLE,
};
use super::SqliteStore;

const HOUR_MS: i64 = 3_600_000;
const MINUTE: Option<Duration> = Some(Duration::from_secs(60));

async fn file_store(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::connect(&format!("sqlite://{}", dir.path().join("hc.db").display()))
        .await
        .unwrap()
}

fn raw(dir: &tempfile::TempDir) -> Connection {
    Connection::open(dir.path().join("hc.db")).unwrap()
}

/// Stores a row as a hand edit would, any storage class.
fn put(raw: &Connection, key: &str, value: &dyn ToSql, expires_at: Option<i64>) {
    raw.execute(
        &format!("INSERT OR REPLACE INTO {TABLE} (key, value, expires_at) VALUES (?1, ?2, ?3)"),
        params![key, value, expires_at],
    )
    .unwrap();
}

/// The row as stored: the value cell with its storage class, and the expiry.
fn row(raw: &Connection, key: &str) -> Option<(Value, Option<i64>)> {
    raw.query_row(
        &format!("SELECT value, expires_at FROM {TABLE} WHERE key = ?1"),
        [key],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()
    .unwrap()
}

fn text(s: &str) -> Value {
    Value::Text(s.to_owned())
}

/// Asserts an expiry was set `ttl_ms` after a clock reading within `[before, after]`.
fn assert_fresh(expires_at: Option<i64>, before: i64, after: i64, ttl_ms: i64) {
    let e = expires_at.expect("an expiry");
    assert!(
        (before + ttl_ms + 1..=after + ttl_ms + 1).contains(&e),
        "{e} not in [{}, {}]",
        before + ttl_ms + 1,
        after + ttl_ms + 1
    );
}

fn assert_foreign<T: std::fmt::Debug>(result: headcount_core::Result<T>, key: &str, found: &str) {
    match result {
        Err(Error::ForeignValue {
            key: k, found: f, ..
        }) => {
            assert_eq!((k.as_str(), f.as_str()), (key, found));
        }
        other => panic!("{key}: {other:?}"),
    }
}

/// One instruction of `EXPLAIN` output.
struct Op {
    opcode: String,
    p2: i64,
    p4: String,
}

fn explain(conn: &Connection, sql: &str) -> Vec<Op> {
    let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
    let mut rows = stmt.raw_query();
    let mut ops = Vec::new();
    while let Some(r) = rows.next().unwrap() {
        let addr: i64 = r.get(0).unwrap();
        assert_eq!(addr, i64::try_from(ops.len()).unwrap());
        ops.push(Op {
            opcode: r.get(1).unwrap(),
            p2: r.get(3).unwrap(),
            p4: r.get::<_, Option<String>>(5).unwrap().unwrap_or_default(),
        });
    }
    ops
}

/// The lock-before-clock argument of `NOW_MS`, checked on the bytecode of this SQLite build:
/// every statement that reads the clock starts by jumping to a write `Transaction`, and only the
/// end of that prologue jumps back to the body, which holds the clock reads.
#[tokio::test]
async fn the_clock_is_read_under_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let _store = file_store(&dir).await; // creates the table as the store does
    let conn = raw(&dir);
    for (name, sql) in clock_statements() {
        let ops = explain(&conn, sql);
        assert_eq!(ops[0].opcode, "Init", "{name}");
        let entry = usize::try_from(ops[0].p2).unwrap();
        assert!(entry > 0, "{name}");
        // P2 of Transaction is nonzero for a write transaction, which takes the write lock.
        assert_eq!(
            (ops[entry].opcode.as_str(), ops[entry].p2 > 0),
            ("Transaction", true),
            "{name}"
        );
        let transactions = ops.iter().filter(|op| op.opcode == "Transaction").count();
        assert_eq!(transactions, 1, "{name}");
        let back_to_body = ops[entry..]
            .iter()
            .position(|op| op.opcode == "Goto" && op.p2 == 1)
            .map(|i| i + entry)
            .expect("the prologue jumps back to the body");
        let clock_reads: Vec<usize> = ops
            .iter()
            .enumerate()
            .filter(|(_, op)| op.opcode.ends_with("Func") || op.opcode == "Function")
            .filter(|(_, op)| op.p4.starts_with("unixepoch"))
            .map(|(addr, _)| addr)
            .collect();
        assert!(!clock_reads.is_empty(), "{name} reads no clock");
        for addr in clock_reads {
            // In the body (run after the prologue), or factored into the prologue after the
            // Transaction.
            assert!(
                addr < entry || (entry < addr && addr < back_to_body),
                "{name}: unixepoch at {addr}, Transaction at {entry}"
            );
        }
    }
}

/// `NOW_MS` is `now_ms()`: bracketed by two readings of the host clock, and its arithmetic turns
/// every whole millisecond SQLite can hand it back into that millisecond exactly.
#[test]
fn the_sql_clock_is_the_host_clock_in_milliseconds() {
    let conn = Connection::open_in_memory().unwrap();
    for _ in 0..20 {
        let before = now_ms();
        let sql: i64 = conn
            .query_row(&format!("SELECT {NOW_MS}"), [], |r| r.get(0))
            .unwrap();
        let after = now_ms();
        assert!((before..=after).contains(&sql), "{before} {sql} {after}");
    }

    // unixepoch('subsec') returns the millisecond count divided by 1000.0; feed that quotient
    // for runs of consecutive milliseconds: near 0, now, 2^41 (year 2039) and the year 9999.
    let from_ms = NOW_MS.replace("unixepoch('now', 'subsec')", "(ms / 1000.0)");
    assert_ne!(from_ms, NOW_MS);
    let truncated = "CAST((ms / 1000.0) * 1000 AS INTEGER)";
    // (start, whether truncating instead of rounding is a millisecond early somewhere in the run:
    // it is from 1001 ms on and in clusters later, though not in the years around 2026).
    for (start, truncation_slips) in [
        (0, true),
        (now_ms(), false),
        (1 << 41, false),
        (4_295_013_759_044, true),
        (253_402_300_749_999, false),
    ] {
        let (wrong, truncated_wrong): (i64, i64) = conn
            .query_row(
                &format!(
                    "WITH RECURSIVE t(ms) AS (SELECT ?1 UNION ALL SELECT ms + 1 FROM t WHERE ms < ?1 + 50000)
                     SELECT sum({from_ms} <> ms), sum({truncated} <> ms) FROM t"
                ),
                [start],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(wrong, 0, "from {start}");
        if truncation_slips {
            assert!(truncated_wrong > 0, "from {start}");
        }
    }
}

/// A cached statement reads the clock on each execution, not once when prepared or first run.
#[tokio::test]
async fn each_write_reads_the_clock_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(&dir).await;
    let conn = raw(&dir);
    assert!(store.compare_and_set("k", None, "v", MINUTE).await.unwrap());
    assert!(store.expire("k", Duration::from_secs(60)).await.unwrap());
    let first = row(&conn, "k").unwrap().1.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = now_ms();
    assert!(store.expire("k", Duration::from_secs(60)).await.unwrap());
    let after = now_ms();
    let second = row(&conn, "k").unwrap().1;
    assert_fresh(second, before, after, 60_000);
    assert!(second.unwrap() >= first + 50);
}

/// The SQL test that lets a counter take the one-statement path accepts exactly what
/// `parse_counter` accepts.
#[tokio::test]
async fn the_sql_counter_check_is_parse_counter() {
    let dir = tempfile::tempdir().unwrap();
    let _store = file_store(&dir).await;
    let conn = raw(&dir);
    let mut corpus: Vec<String> = [
        "0",
        "1",
        "-1",
        "9",
        "10",
        "-10",
        "42",
        "9223372036854775807",
        "-9223372036854775808",
        "9223372036854775806",
        "9223372036854775808",
        "-9223372036854775809",
        "18446744073709551616",
        "99999999999999999999",
        "00",
        "007",
        "-07",
        "+1",
        "+0",
        "-0",
        " 1",
        "1 ",
        "\t1",
        "1\n",
        "1.0",
        "1.",
        ".5",
        "1e3",
        "0x10",
        "",
        "-",
        "--1",
        "1-",
        "0-",
        "1_000",
        "١",
        "٣٢",
        "１",
        "abc",
        "12abc",
        "NaN",
        "Infinity",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    // Deterministic pseudo-random strings over digits, signs, spaces and dots, and canonical
    // numbers of every length with their non-canonical neighbours.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let alphabet = ['0', '1', '5', '9', '-', '+', ' ', '.', 'e'];
    for _ in 0..3000 {
        let len = next() % 22;
        corpus.push(
            (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect(),
        );
        let n = (next() as i64) >> (next() % 64);
        corpus.push(n.to_string());
        corpus.push(format!("0{n}"));
        corpus.push(format!("+{n}"));
        corpus.push(format!("{n}0"));
    }
    conn.execute_batch("BEGIN").unwrap();
    for (i, value) in corpus.iter().enumerate() {
        put(&conn, &format!("c{i}"), value, None);
    }
    conn.execute_batch("COMMIT").unwrap();
    let mut stmt = conn
        .prepare(&format!(
            "SELECT value, {} FROM {TABLE} WHERE key = ?1",
            canonical_counter()
        ))
        .unwrap();
    let mut accepted = 0;
    for (i, value) in corpus.iter().enumerate() {
        let (stored, sql): (String, bool) = stmt
            .query_row([format!("c{i}")], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        assert_eq!(&stored, value);
        let rust = parse_counter("k", value).is_ok();
        assert_eq!(sql, rust, "{value:?}");
        accepted += usize::from(rust);
    }
    assert!(accepted > 3000, "{accepted}");
}

/// The one statements take the common cases themselves (so `incr` and a raising `set_max` cost
/// one statement) and write nothing where the transaction must decide.
#[tokio::test]
async fn the_one_statement_paths_apply_exactly_where_they_should() {
    let dir = tempfile::tempdir().unwrap();
    let _store = file_store(&dir).await;
    let conn = raw(&dir);
    let later = Some(now_ms() + HOUR_MS);
    let past = Some(now_ms() - 1000);

    // incr: absent, live counters (negative, zero, one below the top), expired anything.
    assert_eq!(incr_in_one_statement(&conn, "a", None).unwrap(), Some(1));
    for (value, expires_at, then) in [
        ("-1", None, Some(0)),
        ("0", later, Some(1)),
        ("9223372036854775806", None, Some(i64::MAX)),
        ("abc", past, Some(1)),
        ("9223372036854775807", past, Some(1)),
    ] {
        put(&conn, "i", &value, expires_at);
        assert_eq!(
            incr_in_one_statement(&conn, "i", None).unwrap(),
            then,
            "{value}"
        );
    }
    // ... and nothing over a live foreign value or i64::MAX.
    for value in ["abc", "007", "-0", "", "9223372036854775807"] {
        put(&conn, "i", &value, later);
        assert_eq!(
            incr_in_one_statement(&conn, "i", Some(60_000)).unwrap(),
            None
        );
        assert_eq!(row(&conn, "i"), Some((text(value), later)), "{value}");
    }
    put(&conn, "i", &b"1".as_slice(), None);
    assert_eq!(incr_in_one_statement(&conn, "i", None).unwrap(), None);

    // set_max: absent, expired anything, a smaller live counter.
    assert!(set_max_in_one_statement(&conn, "s", 3, None).unwrap());
    for (value, expires_at) in [("2", later), ("abc", past), ("100", past), ("-5", None)] {
        put(&conn, "s", &value, expires_at);
        assert!(
            set_max_in_one_statement(&conn, "s", 3, None).unwrap(),
            "{value}"
        );
        assert_eq!(row(&conn, "s"), Some((text("3"), None)));
    }
    // ... and nothing over an equal or greater counter or a foreign value.
    for value in ["3", "4", "9223372036854775807", "abc", "03", "3.5"] {
        put(&conn, "s", &value, later);
        assert!(
            !set_max_in_one_statement(&conn, "s", 3, None).unwrap(),
            "{value}"
        );
        assert_eq!(row(&conn, "s"), Some((text(value), later)), "{value}");
    }
}

/// A row is expired from the millisecond its `expires_at` names (`expires_at <= now`), for every
/// statement that reads the clock. The row is written with the current millisecond and the
/// statement runs microseconds later, usually in the same millisecond, which is the case a
/// `>=` for `>` would get wrong; a later one is expired all the more.
#[tokio::test]
async fn a_row_is_expired_from_its_expiry_millisecond() {
    let dir = tempfile::tempdir().unwrap();
    let _store = file_store(&dir).await;
    let conn = raw(&dir);
    for _ in 0..20 {
        let at = |conn: &Connection| put(conn, "k", &"5", Some(now_ms()));
        at(&conn);
        assert!(!expire(&conn, "k", 60_000).unwrap(), "expire");
        at(&conn);
        assert!(
            !compare_and_set(&conn, "k", Some("5"), "6", None).unwrap(),
            "replace"
        );
        at(&conn);
        assert!(
            compare_and_set(&conn, "k", None, "6", None).unwrap(),
            "create"
        );
        at(&conn);
        assert!(
            !compare_and_delete(&conn, "k", "5").unwrap(),
            "compare_and_delete"
        );
        at(&conn);
        assert!(!delete(&conn, "k").unwrap(), "delete");
        at(&conn);
        assert_eq!(
            incr_in_one_statement(&conn, "k", None).unwrap(),
            Some(1),
            "incr"
        );
        at(&conn);
        assert!(
            set_max_in_one_statement(&conn, "k", 1, None).unwrap(),
            "set_max"
        );
    }
}

/// In a hand-made table whose `expires_at` has no INTEGER affinity, a text expiry compares as
/// text (greater than any number, so live), as it does for `get`, which binds the clock as a
/// parameter: the writes, which compute it in SQL, agree.
#[tokio::test]
async fn writes_and_reads_agree_on_a_hand_made_text_expiry() {
    let dir = tempfile::tempdir().unwrap();
    raw(&dir)
        .execute_batch(&format!(
            "CREATE TABLE {TABLE} (key TEXT NOT NULL PRIMARY KEY, value TEXT NOT NULL, expires_at) WITHOUT ROWID"
        ))
        .unwrap();
    let store = file_store(&dir).await;
    let conn = raw(&dir);
    put(&conn, "k", &"5", Some(0));
    conn.execute(&format!("UPDATE {TABLE} SET expires_at = '1'"), [])
        .unwrap();
    assert_eq!(store.get("k").await.unwrap().as_deref(), Some("5"));
    assert!(!store.compare_and_set("k", None, "x", None).await.unwrap());
    assert_eq!(store.incr("k", None).await.unwrap(), 6);
    assert!(store.set_max("k", 9, None).await.unwrap());
    assert_eq!(store.get("k").await.unwrap().as_deref(), Some("9"));
    put(&conn, "k", &"5", Some(0));
    conn.execute(&format!("UPDATE {TABLE} SET expires_at = '1'"), [])
        .unwrap();
    assert!(store.expire("k", Duration::from_secs(60)).await.unwrap());
}

/// Text that is not a canonical counter, live: `incr` and `set_max` report it and write nothing,
/// whether the row expires or not.
#[tokio::test]
async fn foreign_counter_texts_are_typed_errors_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(&dir).await;
    let conn = raw(&dir);
    let later = now_ms() + HOUR_MS;
    let foreign = [
        "007",
        "+1",
        " 1",
        "1 ",
        "1.0",
        "-0",
        "00",
        "",
        "1e3",
        "0x10",
        "abc",
        "١",
        "9223372036854775808",
        "-9223372036854775809",
    ];
    for (i, value) in foreign.iter().enumerate() {
        let expires_at = (i % 2 == 0).then_some(later);
        let key = format!("f{i}");
        put(&conn, &key, value, expires_at);
        assert_foreign(store.incr(&key, MINUTE).await, &key, value);
        assert_foreign(store.incr(&key, None).await, &key, value);
        assert_foreign(store.set_max(&key, 5, MINUTE).await, &key, value);
        assert_foreign(store.set_max(&key, i64::MAX, None).await, &key, value);
        assert_eq!(
            row(&conn, &key),
            Some((text(value), expires_at)),
            "{value:?}"
        );
    }
    // A blob in the TEXT column (TEXT affinity leaves blobs alone).
    put(&conn, "blob", &b"1".as_slice(), None);
    assert_foreign(store.incr("blob", None).await, "blob", "a blob of 1 bytes");
    assert_foreign(
        store.set_max("blob", 5, None).await,
        "blob",
        "a blob of 1 bytes",
    );
    assert_eq!(row(&conn, "blob"), Some((Value::Blob(b"1".to_vec()), None)));

    // i64::MAX is a counter that cannot be incremented: SQLite would turn the sum into a REAL.
    let max = i64::MAX.to_string();
    put(&conn, "max", &max, Some(later));
    let err = store.incr("max", None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ForeignValue);
    assert!(err.to_string().contains("within an i64"), "{err}");
    assert!(!store.set_max("max", 5, None).await.unwrap());
    assert!(!store.set_max("max", i64::MAX, MINUTE).await.unwrap());
    assert_eq!(row(&conn, "max"), Some((text(&max), Some(later))));
    // One below it still increments, once.
    put(&conn, "near", &(i64::MAX - 1).to_string(), None);
    assert_eq!(store.incr("near", None).await.unwrap(), i64::MAX);
    assert_eq!(
        store.incr("near", None).await.unwrap_err().kind(),
        ErrorKind::ForeignValue
    );
    assert_eq!(row(&conn, "near"), Some((text(&max), None)));
}

/// Canonical counters at the edges take the one-statement path and stay canonical text.
#[tokio::test]
async fn counters_at_the_edges() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(&dir).await;
    let conn = raw(&dir);
    for (stored, incremented) in [
        ("-1", "0"),
        ("0", "1"),
        ("-9223372036854775808", "-9223372036854775807"),
        ("99", "100"),
    ] {
        put(&conn, "k", &stored, None);
        assert_eq!(
            store.incr("k", None).await.unwrap(),
            incremented.parse::<i64>().unwrap()
        );
        assert_eq!(row(&conn, "k"), Some((text(incremented), None)));
    }
    put(&conn, "m", &"-5", None);
    assert!(store.set_max("m", -3, None).await.unwrap());
    assert!(!store.set_max("m", -4, None).await.unwrap());
    assert!(store.set_max("m", i64::MAX, None).await.unwrap());
    assert_eq!(row(&conn, "m"), Some((text(&i64::MAX.to_string()), None)));
    put(&conn, "min", &i64::MIN.to_string(), None);
    assert!(!store.set_max("min", i64::MIN, None).await.unwrap());
    assert!(store.set_max("min", i64::MIN + 1, None).await.unwrap());
}

/// INTEGER, REAL and NULL cells can only exist in a table someone made by hand without TEXT
/// affinity (the schema check looks at column names only). The one-statement path leaves them
/// to the transaction, which reads them as before: an INTEGER as its decimal text, a REAL as
/// Rust prints it (so `5.0` is the counter 5 and `0.5` is foreign), NULL as foreign.
#[tokio::test]
async fn non_text_cells_are_read_as_the_transaction_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    raw(&dir)
        .execute_batch(&format!(
            "CREATE TABLE {TABLE} (key TEXT NOT NULL PRIMARY KEY, value, expires_at INTEGER) WITHOUT ROWID"
        ))
        .unwrap();
    let store = file_store(&dir).await;
    let conn = raw(&dir);
    let later = Some(now_ms() + HOUR_MS);

    put(&conn, "int", &41_i64, later);
    assert_eq!(store.incr("int", MINUTE).await.unwrap(), 42);
    assert_eq!(row(&conn, "int"), Some((text("42"), later)));
    put(&conn, "int", &41_i64, later);
    assert!(!store.set_max("int", 41, None).await.unwrap());
    assert_eq!(row(&conn, "int"), Some((Value::Integer(41), later)));
    assert!(store.set_max("int", 50, None).await.unwrap());
    assert_eq!(row(&conn, "int"), Some((text("50"), None)));

    put(&conn, "real", &5.0_f64, later);
    assert!(!store.set_max("real", 5, None).await.unwrap());
    assert_eq!(store.incr("real", None).await.unwrap(), 6);
    assert_eq!(row(&conn, "real"), Some((text("6"), later)));

    for (key, value, found) in [
        ("half", Value::Real(0.5), "0.5"),
        ("null", Value::Null, "NULL"),
        ("blob", Value::Blob(b"7".to_vec()), "a blob of 1 bytes"),
    ] {
        put(&conn, key, &value, later);
        assert_foreign(store.incr(key, None).await, key, found);
        assert_foreign(store.set_max(key, 9, None).await, key, found);
        assert_eq!(row(&conn, key), Some((value, later)));
    }

    // Text in the same table takes the one-statement path as usual.
    put(&conn, "text", &"7", later);
    assert_eq!(store.incr("text", None).await.unwrap(), 8);
    assert_eq!(row(&conn, "text"), Some((text("8"), later)));
}

/// An expired row is absent whatever it holds: `incr` starts it at 1 and `set_max` writes over
/// it, each with a fresh expiry from the call's TTL (none for `None`).
#[tokio::test]
async fn expired_rows_are_replaced_with_a_fresh_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(&dir).await;
    let conn = raw(&dir);
    let past = Some(now_ms() - 1000);
    for (i, value) in ["41", "abc", "9223372036854775807", "007"]
        .iter()
        .enumerate()
    {
        let key = format!("i{i}");
        put(&conn, &key, value, past);
        let before = now_ms();
        assert_eq!(store.incr(&key, MINUTE).await.unwrap(), 1, "{value}");
        let after = now_ms();
        let (stored, expires_at) = row(&conn, &key).unwrap();
        assert_eq!(stored, text("1"));
        assert_fresh(expires_at, before, after, 60_000);

        put(&conn, &key, value, past);
        assert_eq!(store.incr(&key, None).await.unwrap(), 1, "{value}");
        assert_eq!(row(&conn, &key), Some((text("1"), None)));

        let key = format!("m{i}");
        put(&conn, &key, value, past);
        let before = now_ms();
        assert!(store.set_max(&key, 3, MINUTE).await.unwrap(), "{value}");
        let after = now_ms();
        let (stored, expires_at) = row(&conn, &key).unwrap();
        assert_eq!(stored, text("3"));
        assert_fresh(expires_at, before, after, 60_000);

        put(&conn, &key, value, past);
        assert!(store.set_max(&key, -3, None).await.unwrap(), "{value}");
        assert_eq!(row(&conn, &key), Some((text("-3"), None)));
    }
    put(&conn, "blob", &b"x".as_slice(), past);
    assert_eq!(store.incr("blob", None).await.unwrap(), 1);
}

/// A live counter keeps its expiry when incremented, whatever TTL the call brings; `set_max`
/// that raises it writes a fresh expiry from its own TTL, and one that does not changes nothing.
#[tokio::test]
async fn live_counters_keep_their_expiry_on_incr() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(&dir).await;
    let conn = raw(&dir);
    let later = Some(now_ms() + HOUR_MS);
    put(&conn, "k", &"5", later);
    assert_eq!(store.incr("k", MINUTE).await.unwrap(), 6);
    assert_eq!(store.incr("k", None).await.unwrap(), 7);
    assert_eq!(row(&conn, "k"), Some((text("7"), later)));

    assert!(!store.set_max("k", 7, MINUTE).await.unwrap());
    assert!(!store.set_max("k", 2, None).await.unwrap());
    assert_eq!(row(&conn, "k"), Some((text("7"), later)));
    let before = now_ms();
    assert!(store.set_max("k", 8, MINUTE).await.unwrap());
    let after = now_ms();
    let (stored, expires_at) = row(&conn, "k").unwrap();
    assert_eq!(stored, text("8"));
    assert_fresh(expires_at, before, after, 60_000);
    assert!(store.set_max("k", 9, None).await.unwrap());
    assert_eq!(row(&conn, "k"), Some((text("9"), None)));
}

/// A write that waits for another connection's write lock judges liveness, and sets expiries, at
/// the time it gets the lock: keys that expire while it waits are absent to it. Each primitive
/// runs on its own store (own connection and worker thread), so each one waits in SQLite's busy
/// handler itself rather than queueing behind another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_waits_for_the_lock_judges_liveness_when_it_gets_it() {
    let dir = tempfile::tempdir().unwrap();
    let setup = file_store(&dir).await;
    let ttl = Some(Duration::from_millis(300));
    assert_eq!(setup.incr("n", ttl).await.unwrap(), 1);
    assert!(setup.set_max("m", 5, ttl).await.unwrap());
    for key in ["c", "r", "e", "d", "cd"] {
        assert!(setup.compare_and_set(key, None, "x", ttl).await.unwrap());
    }
    let conn = raw(&dir);
    let expiry = |key: &str| row(&conn, key).unwrap().1.unwrap();
    let last_expiry = ["n", "m", "c", "r", "e", "d", "cd"]
        .into_iter()
        .map(expiry)
        .max()
        .unwrap();
    let mut stores = Vec::new();
    for _ in 0..7 {
        stores.push(file_store(&dir).await);
    }

    let holder = raw(&dir);
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let s = stores.clone();
    let writes = tokio::spawn(async move {
        tokio::join!(
            s[0].incr("n", MINUTE),
            s[1].set_max("m", 1, MINUTE),
            s[2].compare_and_set("c", None, "y", MINUTE),
            s[3].compare_and_set("r", Some("x"), "y", None),
            s[4].expire("e", Duration::from_secs(60)),
            s[5].delete("d"),
            s[6].compare_and_delete("cd", "x"),
        )
    });
    // Every key expires while the writes wait.
    while now_ms() <= last_expiry + 20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released = now_ms();
    holder.execute_batch("ROLLBACK").unwrap();
    let (incr, set_max, create, replace, expire, delete, compare_and_delete) =
        writes.await.unwrap();

    assert_eq!(incr.unwrap(), 1, "incr counted from an expired counter");
    assert!(set_max.unwrap(), "set_max wrote over an expired 5");
    assert!(
        create.unwrap(),
        "compare_and_set(None) saw the expired key absent"
    );
    assert!(
        !replace.unwrap(),
        "compare_and_set(Some) saw the expired key absent"
    );
    assert!(!expire.unwrap(), "expire saw the expired key absent");
    assert!(!delete.unwrap(), "delete saw the expired key absent");
    assert!(
        !compare_and_delete.unwrap(),
        "compare_and_delete saw the expired key absent"
    );
    for key in ["n", "m", "c"] {
        assert!(
            expiry(key) > released + 60_000,
            "{key}: the expiry counts from when the lock was taken"
        );
    }
}

/// Garbage collection examines a bounded slice of the key range per call, whatever the table
/// holds, and over successive calls (wrapping around) deletes every expired row and nothing
/// else, hand-made keys of other storage classes included (they sort before and after text, and
/// a blob cursor must not stop it). A collection that scanned the whole table deletes all 1,000
/// expired rows at once.
#[tokio::test]
async fn garbage_collection_examines_a_bounded_slice_and_covers_the_table() {
    use super::sql::{gc_slice, GC_SLICE};
    let dir = tempfile::tempdir().unwrap();
    drop(file_store(&dir).await);
    let raw = raw(&dir);
    let now = now_ms();
    // Interleaved: an expired row, a live one, one without expiry, 1,000 of each.
    for i in 0..1000 {
        put(&raw, &format!("k:{i:04}:a"), &"v", Some(now - 1000));
        put(&raw, &format!("k:{i:04}:b"), &"v", Some(now + HOUR_MS));
        put(&raw, &format!("k:{i:04}:c"), &"v", None);
    }
    // Hand-made expired rows: an empty key and a number (sort before every text key), and 300
    // blob keys (sort after every text key, so a slice ends on one).
    let put_key = |key: Value| {
        raw.execute(
            &format!("INSERT INTO {TABLE} (key, value, expires_at) VALUES (?1, 'v', ?2)"),
            params![key, now - 1000],
        )
        .unwrap();
    };
    put_key(text(""));
    put_key(Value::Integer(7));
    for i in 0..300_u32 {
        put_key(Value::Blob(i.to_be_bytes().to_vec()));
    }
    let total = 3302;
    let count = |raw: &Connection| -> i64 {
        raw.query_row(&format!("SELECT count(*) FROM {TABLE}"), [], |r| r.get(0))
            .unwrap()
    };
    let (deleted, next) = gc_slice(&raw, None).unwrap();
    assert!(
        deleted <= GC_SLICE / 3 + 3,
        "one collection deleted {deleted} rows; its slice is {GC_SLICE} keys"
    );
    assert!(deleted > 0);
    let mut after = next.expect("the slice did not reach the end of the keys");
    let mut calls = 1;
    loop {
        let (_, next) = gc_slice(&raw, Some(&after)).unwrap();
        calls += 1;
        match next {
            Some(next) => {
                assert_ne!(next, after, "the cursor moves");
                after = next;
            }
            None => break,
        }
    }
    assert_eq!(
        calls,
        usize::div_ceil(total, GC_SLICE) + usize::from(total % GC_SLICE == 0)
    );
    assert_eq!(
        count(&raw),
        2000,
        "every expired row deleted, every other row kept"
    );
    for i in [0, 499, 999] {
        assert!(row(&raw, &format!("k:{i:04}:a")).is_none());
        assert!(row(&raw, &format!("k:{i:04}:b")).is_some());
        assert!(row(&raw, &format!("k:{i:04}:c")).is_some());
    }
}

/// One garbage collection examines one slice when little is expired, and goes on for up to four
/// while most of each slice was expired, so a workload that leaves expired keys behind faster
/// than one per operation is still kept up with. It restores the busy timeout it lowered.
#[tokio::test]
async fn garbage_collection_goes_on_while_most_of_a_slice_was_expired() {
    use super::connection::collect_garbage;
    use super::sql::GC_SLICE;
    let dir = tempfile::tempdir().unwrap();
    drop(file_store(&dir).await);
    let raw = raw(&dir);
    let now = now_ms();
    let count = |raw: &Connection| -> usize {
        let n: i64 = raw
            .query_row(&format!("SELECT count(*) FROM {TABLE}"), [], |r| r.get(0))
            .unwrap();
        usize::try_from(n).unwrap()
    };
    // Mostly live: one slice, of which a quarter is deleted.
    for i in 0..2000 {
        let expired = i % 4 == 0;
        put(
            &raw,
            &format!("a:{i:04}"),
            &"v",
            Some(if expired { now - 1000 } else { now + HOUR_MS }),
        );
    }
    let mut after = None;
    collect_garbage(&raw, Duration::from_secs(3), &mut after);
    assert_eq!(count(&raw), 2000 - GC_SLICE / 4, "one slice only");
    assert!(after.is_some());
    // Mostly expired, where the cursor stands: four slices.
    for i in 0..3000 {
        put(&raw, &format!("b:{i:04}"), &"v", Some(now - 1000));
    }
    let mut after = Some(text("b:"));
    let before = count(&raw);
    collect_garbage(&raw, Duration::from_secs(3), &mut after);
    let deleted = before - count(&raw);
    assert!(
        deleted > 3 * GC_SLICE && deleted <= 4 * GC_SLICE,
        "{deleted} rows deleted by one collection"
    );
    let busy: i64 = raw
        .query_row("PRAGMA busy_timeout", [], |r| r.get(0))
        .unwrap();
    assert_eq!(busy, 3000);
}
