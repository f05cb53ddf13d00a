#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use headcount_core::{Error, ErrorKind, Op, Result, Store};
use rusqlite::Connection;

use super::config::Location;
use super::errors::Sql;
use super::sql::prefix_successor;
use super::store::sqlite_durability;
use super::*;

/// A URL's location and options.
fn parse_url(url: &str) -> Result<(Location, SqliteOptions)> {
    SqliteConfig::from_url(url).map(|c| (c.location().clone(), c.options().clone()))
}

fn file_url(dir: &tempfile::TempDir, name: &str) -> String {
    format!("sqlite://{}", dir.path().join(name).display())
}

async fn file_store(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::connect(&file_url(dir, "hc.db")).await.unwrap()
}

/// Polls `f` until it returns true or `within` passes.
async fn eventually<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn url_forms() {
    let (loc, opts) = parse_url("sqlite://relative/path.db").unwrap();
    assert_eq!(loc, Location::File(PathBuf::from("relative/path.db")));
    assert_eq!(opts, SqliteOptions::default());

    let (loc, _) = parse_url("sqlite:///absolute/path.db").unwrap();
    assert_eq!(loc, Location::File(PathBuf::from("/absolute/path.db")));

    let (loc, _) = parse_url("sqlite:plain.db").unwrap();
    assert_eq!(loc, Location::File(PathBuf::from("plain.db")));

    let (loc, _) = parse_url("SQLite:///tmp/my%20file.db").unwrap();
    assert_eq!(loc, Location::File(PathBuf::from("/tmp/my file.db")));
    let (loc, _) = parse_url("sqlite://a%23b.db").unwrap();
    assert_eq!(loc, Location::File(PathBuf::from("a#b.db")));

    for url in [
        "sqlite::memory:",
        "sqlite://:memory:",
        "sqlite::memory:?timeout=1s",
    ] {
        assert_eq!(parse_url(url).unwrap().0, Location::Memory, "{url}");
    }

    let (_, opts) =
        parse_url("sqlite://x.db?timeout=500ms&synchronous=FULL&busy_timeout=2m").unwrap();
    assert_eq!(opts.timeout, Duration::from_millis(500));
    assert_eq!(opts.synchronous, Synchronous::Full);
    assert!(opts.synchronous.is_durable());
    assert_eq!(opts.busy_timeout, Some(Duration::from_secs(120)));

    let (_, opts) = parse_url("sqlite://x.db?timeout=2s").unwrap();
    assert_eq!(opts.effective_busy_timeout(), Duration::from_secs(2));
    let (_, opts) = parse_url("sqlite://x.db?busy_timeout=0ms").unwrap();
    assert_eq!(opts.effective_busy_timeout(), Duration::ZERO);
    for (url, sync) in [
        ("sqlite://x.db?synchronous=off", Synchronous::Off),
        ("sqlite://x.db?synchronous=normal", Synchronous::Normal),
        ("sqlite://x.db?synchronous=extra", Synchronous::Extra),
    ] {
        assert_eq!(parse_url(url).unwrap().1.synchronous, sync);
    }
}

#[test]
fn bad_urls_are_config_errors() {
    for (url, needle) in [
        ("sqlite://x.db?mode=ro", "`mode`"),
        ("sqlite://x.db?timeout=abc", "`timeout`"),
        ("sqlite://x.db?timeout=0s", "`timeout`"),
        ("sqlite://x.db?timeout=5d", "`timeout`"),
        ("sqlite://x.db?timeout=1000h", "`timeout`"),
        ("sqlite://x.db?busy_timeout=2h", "`busy_timeout`"),
        ("sqlite://x.db?synchronous=sometimes", "`synchronous`"),
        ("sqlite://x.db?timeout=1s&timeout=2s", "more than once"),
        ("sqlite://x.db?timeout", "key=value"),
        ("sqlite://", "no file path"),
        ("sqlite:", "no file path"),
        ("sqlite:///bad%zzpath", "percent-escape"),
        // A raw `#` starts a fragment, as in every store URL: `%23` in a file name.
        ("sqlite://a#b.db", "%23"),
        ("sqlite://x.db?timeout=1s#x", "fragment"),
        ("sqlite://x.db?bogus=1", "unknown option `bogus`"),
        ("postgres://x", "not a SQLite URL"),
    ] {
        match parse_url(url) {
            Err(e @ Error::InvalidConfig { .. }) => {
                assert!(e.to_string().contains(needle), "{url}: {e}")
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}

#[test]
fn successor_bounds_prefixes() {
    assert_eq!(prefix_successor("ab").as_deref(), Some("ac"));
    assert_eq!(prefix_successor("a\u{10FFFF}").as_deref(), Some("b"));
    assert_eq!(prefix_successor("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
    assert_eq!(prefix_successor("\u{10FFFF}\u{10FFFF}"), None);
    // Byte order of UTF-8 is code point order, which is what makes the range exact.
    for key in ["ab", "ab\u{10FFFF}", "ab:{é}", "ab\u{7f}"] {
        assert!(("ab".."ac").contains(&key), "{key}");
    }
}

#[tokio::test]
async fn memory_store_is_private_and_works() {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let caps = store.capabilities();
    assert_eq!(caps.backend, "sqlite");
    assert!(!caps.shared);
    assert!(caps.native_set_max);
    assert_eq!(store.incr("k", None).await.unwrap(), 1);
    assert_eq!(store.incr("k", None).await.unwrap(), 2);
    assert_eq!(store.get("k").await.unwrap().as_deref(), Some("2"));
    assert!(store.config().path().is_none());
    let config = SqliteConfig::new(":memory:", SqliteOptions::default()).unwrap();
    let other = SqliteStore::connect_with(config).await.unwrap();
    assert_eq!(other.get("k").await.unwrap(), None);
}

#[tokio::test]
async fn primitives() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(&dir).await;
    assert!(store.capabilities().shared);

    assert_eq!(store.get("hc:{g}:a").await.unwrap(), None);
    assert_eq!(store.incr("hc:{g}:a", None).await.unwrap(), 1);
    assert_eq!(store.incr("hc:{g}:a", None).await.unwrap(), 2);
    assert_eq!(store.get("hc:{g}:a").await.unwrap().as_deref(), Some("2"));

    assert!(!store
        .expire("hc:{g}:absent", Duration::from_secs(5))
        .await
        .unwrap());
    assert!(store
        .expire("hc:{g}:a", Duration::from_secs(5))
        .await
        .unwrap());

    // CAS: absent, equal, different.
    assert!(store
        .compare_and_set("hc:{g}:c", None, "v1", None)
        .await
        .unwrap());
    assert!(!store
        .compare_and_set("hc:{g}:c", None, "v2", None)
        .await
        .unwrap());
    assert!(store
        .compare_and_set("hc:{g}:c", Some("v1"), "v2", None)
        .await
        .unwrap());
    assert!(!store
        .compare_and_set("hc:{g}:c", Some("v1"), "v3", None)
        .await
        .unwrap());
    assert!(!store
        .compare_and_set("hc:{g}:absent", Some("v1"), "v3", None)
        .await
        .unwrap());
    assert_eq!(store.get("hc:{g}:c").await.unwrap().as_deref(), Some("v2"));

    // set_max never goes backwards.
    assert!(store.set_max("hc:{g}:m", 5, None).await.unwrap());
    assert!(!store.set_max("hc:{g}:m", 3, None).await.unwrap());
    assert!(!store.set_max("hc:{g}:m", 5, None).await.unwrap());
    assert!(store.set_max("hc:{g}:m", 9, None).await.unwrap());
    assert_eq!(store.get("hc:{g}:m").await.unwrap().as_deref(), Some("9"));

    assert!(store.delete("hc:{g}:c").await.unwrap());
    assert!(!store.delete("hc:{g}:c").await.unwrap());
    assert_eq!(store.get("hc:{g}:c").await.unwrap(), None);

    // Values are plain text for the sqlite3 shell.
    let raw = Connection::open(dir.path().join("hc.db")).unwrap();
    let (value, expires): (String, Option<i64>) = raw
        .query_row(
            "SELECT value, expires_at FROM headcount_kv WHERE key = 'hc:{g}:m'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((value.as_str(), expires), ("9", None));
}

#[tokio::test]
async fn bad_arguments_write_nothing() {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let cases: Vec<Result<bool>> = vec![
        store.incr("", None).await.map(|_| true),
        store.incr("k", Some(Duration::ZERO)).await.map(|_| true),
        store.expire("k", Duration::ZERO).await,
        store.compare_and_set("k", None, "a\0b", None).await,
        store.compare_and_set("k\n", None, "v", None).await,
        store.set_max("k", 1, Some(Duration::ZERO)).await,
        store.list("").await.map(|_| true),
    ];
    for case in cases {
        assert_eq!(case.unwrap_err().kind(), ErrorKind::InvalidArgument);
    }
    assert_eq!(store.get("k").await.unwrap(), None);
}

#[tokio::test]
async fn expiry_on_the_host_clock() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(&dir).await;
    let ttl = Some(Duration::from_millis(150));

    assert_eq!(store.incr("e", ttl).await.unwrap(), 1);
    // A live key keeps its expiry when incremented.
    let raw = Connection::open(dir.path().join("hc.db")).unwrap();
    let expires = |raw: &Connection| -> Option<i64> {
        raw.query_row(
            "SELECT expires_at FROM headcount_kv WHERE key = 'e'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    let first = expires(&raw);
    assert!(first.is_some());
    assert_eq!(
        store
            .incr("e", Some(Duration::from_secs(60)))
            .await
            .unwrap(),
        2
    );
    assert_eq!(expires(&raw), first);

    assert!(store.compare_and_set("c", None, "x", ttl).await.unwrap());
    assert!(store.set_max("m", 7, ttl).await.unwrap());
    // "c" and "m" were written after "e", so wait for all three: under load the gap between the
    // writes can exceed a millisecond.
    assert!(
        eventually(Duration::from_secs(5), || async {
            store.get("e").await.unwrap().is_none()
                && store.get("c").await.unwrap().is_none()
                && store.get("m").await.unwrap().is_none()
        })
        .await
    );
    assert!(store.list("e").await.unwrap().is_empty());
    assert!(!store.expire("e", Duration::from_secs(5)).await.unwrap());
    assert!(!store.delete("c").await.unwrap());

    // An expired counter counts from 0 and takes the new TTL; expired rows are absent for CAS
    // and set_max too.
    assert_eq!(store.incr("e", None).await.unwrap(), 1);
    assert_eq!(expires(&raw), None);
    assert!(!store
        .compare_and_set("m", Some("7"), "8", None)
        .await
        .unwrap());
    assert!(store.set_max("m", 1, None).await.unwrap());
    assert_eq!(store.get("m").await.unwrap().as_deref(), Some("1"));

    // CAS with ttl None makes the key persistent.
    assert!(store
        .compare_and_set("p", None, "x", Some(Duration::from_secs(60)))
        .await
        .unwrap());
    assert!(store
        .compare_and_set("p", Some("x"), "y", None)
        .await
        .unwrap());
    let persistent: Option<i64> = raw
        .query_row(
            "SELECT expires_at FROM headcount_kv WHERE key = 'p'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(persistent, None);
}

#[tokio::test]
async fn foreign_values_are_typed_errors_and_write_nothing() {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    assert!(store.compare_and_set("f", None, "abc", None).await.unwrap());
    match store.incr("f", None).await {
        Err(Error::ForeignValue { key, found, .. }) => {
            assert_eq!(key, "f");
            assert_eq!(found, "abc");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store.set_max("f", 3, None).await.unwrap_err().kind(),
        ErrorKind::ForeignValue
    );
    assert_eq!(store.get("f").await.unwrap().as_deref(), Some("abc"));

    assert!(store
        .compare_and_set("big", None, &i64::MAX.to_string(), None)
        .await
        .unwrap());
    assert_eq!(
        store.incr("big", None).await.unwrap_err().kind(),
        ErrorKind::ForeignValue
    );
    assert_eq!(store.get("big").await.unwrap(), Some(i64::MAX.to_string()));
}

#[tokio::test]
async fn listing_is_bytewise_live_and_exact() {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let keys = [
        "a",
        "a%",
        "a_b",
        "a\\",
        "ab",
        "a:{é}",
        "a\u{10FFFF}",
        "a~",
        "b",
        "A",
        "`",
    ];
    for k in keys {
        assert!(store.compare_and_set(k, None, k, None).await.unwrap());
    }
    assert!(store
        .compare_and_set("a-expiring", None, "x", Some(Duration::from_millis(1)))
        .await
        .unwrap());
    assert!(
        eventually(Duration::from_secs(5), || async {
            store.get("a-expiring").await.unwrap().is_none()
        })
        .await
    );
    let listed = store.list("a").await.unwrap();
    let mut expected: Vec<&str> = keys
        .iter()
        .copied()
        .filter(|k| k.starts_with('a'))
        .collect();
    expected.sort_unstable(); // str ordering is bytewise
    assert_eq!(
        listed.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        expected
    );
    assert!(listed.iter().all(|(k, v)| k == v));
    assert_eq!(store.list("a%").await.unwrap().len(), 1);
    assert_eq!(store.list("a_").await.unwrap().len(), 1);
    assert_eq!(store.list("zzz").await.unwrap().len(), 0);
    assert_eq!(
        store.list("a\u{10FFFF}").await.unwrap(),
        vec![("a\u{10FFFF}".to_owned(), "a\u{10FFFF}".to_owned())]
    );
}

#[tokio::test]
async fn long_and_odd_keys() {
    let dir = tempfile::tempdir().unwrap();
    let store = file_store(&dir).await;
    let long = format!("hc:{{g}}:{}", "k".repeat(4096 - 7));
    assert_eq!(long.len(), 4096);
    let kib = format!("hc:{{ключ}}:{}", "é".repeat(512));
    for key in [long.as_str(), kib.as_str(), "hc:{群}:x"] {
        assert_eq!(store.incr(key, None).await.unwrap(), 1);
        assert_eq!(store.get(key).await.unwrap().as_deref(), Some("1"));
        assert_eq!(store.list(key).await.unwrap().len(), 1);
        assert!(store.delete(key).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_on_one_file_increment_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let a = file_store(&dir).await;
    let b = file_store(&dir).await;
    let mut tasks = Vec::new();
    for i in 0..50 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..40 {
                seen.push(store.incr("hc:{g}:n", None).await.unwrap());
            }
            seen
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let set: BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(all.len(), 2000);
    assert_eq!(set, (1..=2000).collect());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cas_has_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let a = file_store(&dir).await;
    let b = file_store(&dir).await;
    assert!(a.compare_and_set("c", None, "0", None).await.unwrap());
    let mut tasks = Vec::new();
    for i in 0..32 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            store
                .compare_and_set("c", Some("0"), &format!("w{i}"), None)
                .await
                .unwrap()
        }));
    }
    let mut wins = 0;
    for t in tasks {
        wins += usize::from(t.await.unwrap());
    }
    assert_eq!(wins, 1);
    let mut tasks = Vec::new();
    for i in 0..32 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            store
                .compare_and_set("fresh", None, &format!("w{i}"), None)
                .await
                .unwrap()
        }));
    }
    let mut wins = 0;
    for t in tasks {
        wins += usize::from(t.await.unwrap());
    }
    assert_eq!(wins, 1);
}

#[tokio::test]
async fn a_locked_file_times_out_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{}?timeout=300ms", file_url(&dir, "hc.db"));
    let store = SqliteStore::connect(&url).await.unwrap();
    assert_eq!(store.incr("k", None).await.unwrap(), 1);

    // Another process-like connection holds the write lock.
    let holder = Connection::open(dir.path().join("hc.db")).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let err = store.incr("k", None).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Reads are not blocked by a writer in WAL mode.
    assert_eq!(store.get("k").await.unwrap().as_deref(), Some("1"));
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(store.incr("k", None).await.unwrap(), 2);
}

#[tokio::test]
async fn files_that_cannot_be_databases_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir/hc.db");
    let err = SqliteStore::connect(&format!("sqlite://{}", missing.display()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert!(err.to_string().contains("no/such/dir"), "{err}");

    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, vec![b'x'; 8192]).unwrap();
    let err = SqliteStore::connect(&format!("sqlite://{}", junk.display()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(err.to_string().contains("not a SQLite database"), "{err}");
    assert!(err.to_string().contains("junk.db"), "{err}");
}

#[tokio::test]
async fn synchronous_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::connect(&format!("{}?synchronous=full", file_url(&dir, "hc.db")))
        .await
        .unwrap();
    // The pragmas the durability probe reads, so under its name.
    let level = store
        .call(Op::Durability, |conn| {
            conn.query_row("PRAGMA synchronous", [], |r| r.get::<_, i64>(0))
                .sql()
        })
        .await
        .unwrap();
    assert_eq!(level, 2); // FULL
    let mode = store
        .call(Op::Durability, |conn| {
            conn.query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0))
                .sql()
        })
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    assert!(format!("{store:?}").contains("hc.db"));
}

#[tokio::test]
async fn durability_follows_synchronous() {
    let dir = tempfile::tempdir().unwrap();
    let full = SqliteStore::connect(&format!("{}?synchronous=full", file_url(&dir, "full.db")))
        .await
        .unwrap();
    let d = full.durability().await.unwrap();
    assert!(d.durable, "{d:?}");
    assert!(
        d.detail.contains("FULL") && d.detail.contains("wal"),
        "{d:?}"
    );
    let normal = SqliteStore::connect(&file_url(&dir, "normal.db"))
        .await
        .unwrap();
    let d = normal.durability().await.unwrap();
    assert!(!d.durable && d.detail.contains("NORMAL"), "{d:?}");
    let memory = SqliteStore::connect("sqlite::memory:?synchronous=full")
        .await
        .unwrap();
    assert!(!memory.durability().await.unwrap().durable);
    assert!(!sqlite_durability(2, "memory").durable);
    assert!(sqlite_durability(3, "DELETE").durable);
}
