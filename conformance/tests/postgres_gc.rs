//! The PostgreSQL store's garbage collection on a real server (the harness's, or
//! `HEADCOUNT_TEST_POSTGRES_URL`): each collection examines one bounded slice of the primary key
//! after a cursor, never the whole table (which other deployments may share), deletes only the
//! rows of that slice that are still expired, and covers the whole table, wrapping around, over
//! repeated collections.
//!
//! A test whose server is missing prints `SKIP` and passes, unless `HEADCOUNT_REQUIRE_BACKENDS`
//! requires PostgreSQL: then it fails.
#![cfg(feature = "postgres")]
// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use headcount::postgres::PostgresStore;
use headcount::Store;
use headcount_harness::ServerKind;
use tokio_postgres::Client;

/// The most rows one collection examines (the store's `GC_BATCH`).
const SLICE: i64 = 1000;

/// A fresh table name, so each test sees only its own rows.
fn table(stem: &str) -> String {
    format!("hc_gc_{stem}_{:016x}", rand::random::<u64>())
}

/// A store on `table` with a 10 s timeout, or the URL options `options` (`timeout=1s&...`).
async fn store_with(url: &str, table: &str, options: &str) -> PostgresStore {
    let sep = if url.contains('?') { '&' } else { '?' };
    PostgresStore::connect(&format!("{url}{sep}table={table}&{options}"))
        .await
        .unwrap()
}

async fn store(url: &str, table: &str) -> PostgresStore {
    store_with(url, table, "timeout=10s").await
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// The harness's PostgreSQL for test `test` (or a skip): its URL, a fresh table named after
/// `stem`, a store on it and a plain client.
async fn setup(test: &str, stem: &str) -> Option<(String, String, PostgresStore, Client)> {
    let url = ServerKind::Postgres
        .shared_or_skip(&format!("postgres_gc::{test}"))
        .await?;
    let table = table(stem);
    let store = store(&url, &table).await;
    let client = connect(&url).await;
    Some((url, table, store, client))
}

async fn drop_table(client: &Client, table: &str) {
    client
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

/// Inserts `n` rows named `{stem}{i}` expiring `expiry` from now (an SQL interval, or `NULL`).
async fn insert(client: &Client, table: &str, stem: &str, n: i64, expiry: &str) {
    let expires_at = if expiry == "NULL" {
        "NULL".to_owned()
    } else {
        format!("now() + interval '{expiry}'")
    };
    client
        .execute(
            &format!(
                "INSERT INTO {table} (key, value, expires_at)
                 SELECT $1 || i, '1', {expires_at} FROM generate_series(1, $2::bigint) AS i"
            ),
            &[&stem, &n],
        )
        .await
        .unwrap();
}

/// How many rows of `table` have a key starting with `stem`.
async fn count(client: &Client, table: &str, stem: &str) -> i64 {
    client
        .query_one(
            &format!("SELECT count(*) FROM {table} WHERE starts_with(key, $1)"),
            &[&stem],
        )
        .await
        .unwrap()
        .get(0)
}

/// How many garbage collections of `table` wait for a lock on the server.
async fn collections_waiting_for_a_lock(client: &Client, table: &str) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0
               AND strpos(query, 'slice') > 0",
            &[&table],
        )
        .await
        .unwrap()
        .get(0)
}

/// One collection deletes exactly the expired rows among the first `SLICE` rows in primary key
/// order and leaves every other expired row; repeated collections then cover the rest of the
/// table, report the wrap-around at its end, and start over from the beginning.
#[tokio::test]
async fn postgres_gc_examines_one_slice_per_collection_and_wraps_around() {
    let Some((_, table, store, client)) = setup(
        "postgres_gc_examines_one_slice_per_collection_and_wraps_around",
        "slice",
    )
    .await
    else {
        return;
    };
    // 1500 expired rows among 5500: more expired rows than one collection may delete, and a
    // table four slices and a half long.
    insert(&client, &table, "hc:{gc}:dead", 1500, "-1 minute").await;
    insert(&client, &table, "hc:{gc}:live", 3500, "1 hour").await;
    insert(&client, &table, "hc:{gc}:forever", 500, "NULL").await;
    let total = 5500;

    // What the first slice holds: the first SLICE rows by key_hash (a hash: expired and live
    // rows are interleaved).
    let first: Vec<(Vec<u8>, bool)> = client
        .query(
            &format!(
                "SELECT key_hash, coalesce(expires_at <= now(), false) FROM {table}
                 ORDER BY key_hash LIMIT {SLICE}"
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let expired_in_first = first.iter().filter(|(_, expired)| *expired).count() as u64;
    let last = first.last().unwrap().0.clone();
    assert!(
        expired_in_first > 0 && expired_in_first < 1000,
        "{expired_in_first}"
    );

    let gc = store.collect_garbage_now().await.unwrap();
    assert_eq!(gc.examined, SLICE as u64, "{gc:?}");
    assert!(!gc.wrapped, "{gc:?}");
    // Exactly the slice's expired rows: a larger or unbounded scan deletes more (up to 1000).
    assert_eq!(gc.deleted, expired_in_first, "{gc:?}");
    let left = |cmp: &'static str| {
        let client = &client;
        let table = &table;
        let last = &last;
        async move {
            client
                .query_one(
                    &format!(
                        "SELECT count(*) FROM {table}
                         WHERE expires_at <= now() AND key_hash {cmp} $1"
                    ),
                    &[last],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };
    assert_eq!(left("<=").await, 0, "an expired row of the slice was left");
    assert_eq!(
        left(">").await,
        1500 - expired_in_first as i64,
        "an expired row beyond the slice was deleted"
    );

    // The rest of the table: 4500 rows after the cursor, four full slices then one of 500 that
    // reaches the end.
    let mut calls = 0;
    loop {
        calls += 1;
        let gc = store.collect_garbage_now().await.unwrap();
        assert!(gc.examined <= SLICE as u64, "{gc:?}");
        if gc.wrapped {
            assert_eq!(gc.examined, 500, "{gc:?}");
            break;
        }
        assert_eq!(gc.examined, SLICE as u64, "{gc:?}");
        assert!(calls < 10, "no wrap-around after {calls} collections");
    }
    assert_eq!(calls, 5);
    assert_eq!(count(&client, &table, "hc:{gc}:dead").await, 0);
    assert_eq!(count(&client, &table, "hc:{gc}:live").await, 3500);
    assert_eq!(count(&client, &table, "hc:{gc}:forever").await, 500);

    // After the wrap-around the next collection starts at the beginning again: rows expiring now
    // anywhere in the table are found within one more pass.
    insert(&client, &table, "hc:{gc}:later", 300, "-1 second").await;
    let remaining = total - 1500 + 300;
    let gc = store.collect_garbage_now().await.unwrap();
    assert_eq!(gc.examined, SLICE as u64, "did not start over: {gc:?}");
    let mut deleted = gc.deleted;
    let mut calls = 1;
    while !store
        .collect_garbage_now()
        .await
        .map(|gc| {
            deleted += gc.deleted;
            gc.wrapped
        })
        .unwrap()
    {
        calls += 1;
        assert!(calls < 10, "no wrap-around after {calls} collections");
    }
    assert_eq!(calls, remaining / SLICE);
    assert_eq!(deleted, 300);
    assert_eq!(count(&client, &table, "hc:{gc}:later").await, 0);
    assert_eq!(count(&client, &table, "hc:{gc}:live").await, 3500);

    drop_table(&client, &table).await;
}

/// A full pass of collections deletes every expired row and nothing else: rows still live, rows
/// without expiry and rows a caller has locked stay.
#[tokio::test]
async fn postgres_gc_keeps_live_rows_rows_without_expiry_and_locked_rows() {
    let Some((url, table, store, client)) = setup(
        "postgres_gc_keeps_live_rows_rows_without_expiry_and_locked_rows",
        "keep",
    )
    .await
    else {
        return;
    };
    // Through the store: a lease with a TTL and a counter without one.
    assert_eq!(
        store
            .incr("hc:{gc}:lease", Some(Duration::from_secs(3600)))
            .await
            .unwrap(),
        1
    );
    assert_eq!(store.incr("hc:{gc}:counter", None).await.unwrap(), 1);
    insert(&client, &table, "hc:{gc}:live", 700, "1 hour").await;
    insert(&client, &table, "hc:{gc}:forever", 700, "NULL").await;
    insert(&client, &table, "hc:{gc}:dead", 700, "-1 minute").await;
    insert(&client, &table, "hc:{gc}:held", 1, "-1 minute").await;

    // A caller holds the lock of one expired row (as a writer about to revive it would): the
    // collection skips it rather than wait.
    let holder = connect(&url).await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .execute(
            &format!("SELECT 1 FROM {table} WHERE key = 'hc:{{gc}}:held1' FOR UPDATE"),
            &[],
        )
        .await
        .unwrap();

    let started = Instant::now();
    let mut deleted = 0;
    for _ in 0..10 {
        let gc = store.collect_garbage_now().await.unwrap();
        deleted += gc.deleted;
        if gc.wrapped {
            break;
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a collection waited for a lock"
    );
    assert_eq!(deleted, 700);
    assert_eq!(count(&client, &table, "hc:{gc}:dead").await, 0);
    assert_eq!(count(&client, &table, "hc:{gc}:held").await, 1);
    assert_eq!(count(&client, &table, "hc:{gc}:live").await, 700);
    assert_eq!(count(&client, &table, "hc:{gc}:forever").await, 700);
    assert_eq!(
        store.get("hc:{gc}:lease").await.unwrap().as_deref(),
        Some("1")
    );
    assert_eq!(
        store.get("hc:{gc}:counter").await.unwrap().as_deref(),
        Some("1")
    );

    // Released, the expired row goes in the next pass.
    holder.batch_execute("ROLLBACK").await.unwrap();
    let mut deleted = 0;
    for _ in 0..10 {
        let gc = store.collect_garbage_now().await.unwrap();
        deleted += gc.deleted;
        if gc.wrapped {
            break;
        }
    }
    assert_eq!(deleted, 1);
    assert_eq!(count(&client, &table, "hc:{gc}:held").await, 0);

    drop_table(&client, &table).await;
}

/// A row renewed after the collection's statement read it as expired (between its snapshot and
/// its delete) is not deleted: the delete re-checks expiry on the newest row version.
///
/// Deterministic: the store runs over a view of the real table whose filter calls a function
/// that waits for an advisory lock the test holds, so the collection's statement stops inside its
/// slice scan (after taking its snapshot, before locking any row). The test renews the row then,
/// and only then lets the collection go on.
#[tokio::test]
async fn postgres_gc_spares_a_row_renewed_after_the_slice_read_it() {
    let Some(url) = ServerKind::Postgres
        .shared_or_skip("postgres_gc::postgres_gc_spares_a_row_renewed_after_the_slice_read_it")
        .await
    else {
        return;
    };
    let base = table("renew");
    let view = format!("{base}_v");
    let gate = format!("{base}_gate");
    let lock_id = i64::from(rand::random::<u32>());
    // Creates the real table.
    drop(store(&url, &base).await);
    let client = connect(&url).await;
    client
        .batch_execute(&format!(
            "CREATE FUNCTION {gate}() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
             BEGIN
               PERFORM pg_advisory_lock_shared({lock_id});
               PERFORM pg_advisory_unlock_shared({lock_id});
               RETURN true;
             END $$;
             CREATE VIEW {view} AS SELECT * FROM {base} WHERE {gate}();"
        ))
        .await
        .unwrap();
    // The view exists, so this store uses it as its table.
    let store = store(&url, &view).await;
    insert(&client, &base, "hc:{gc}:renewed", 1, "-1 minute").await;
    insert(&client, &base, "hc:{gc}:dead", 1, "-1 minute").await;

    client
        .execute("SELECT pg_advisory_lock($1)", &[&lock_id])
        .await
        .unwrap();
    let collection = tokio::spawn({
        let store = store.clone();
        async move { store.collect_garbage_now().await }
    });
    // Wait until the collection's statement is stopped at the gate.
    let started = Instant::now();
    loop {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'
                   AND strpos(query, $1) > 0 AND strpos(query, 'slice') > 0",
                &[&view],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the collection never reached the gate"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its snapshot saw both rows expired. Renew one (committed at once), then let it go on.
    let renewed = client
        .execute(
            &format!(
                "UPDATE {base} SET expires_at = now() + interval '1 hour'
                 WHERE key = 'hc:{{gc}}:renewed1'"
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(renewed, 1);
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&lock_id])
        .await
        .unwrap();
    let gc = tokio::time::timeout(Duration::from_secs(10), collection)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    assert_eq!(gc.examined, 2, "{gc:?}");
    assert_eq!(gc.deleted, 1, "{gc:?}");
    assert_eq!(count(&client, &base, "hc:{gc}:dead").await, 0);
    assert_eq!(
        count(&client, &base, "hc:{gc}:renewed").await,
        1,
        "the renewed row was deleted"
    );

    client
        .batch_execute(&format!(
            "DROP VIEW {view}; DROP FUNCTION {gate}(); DROP TABLE {base}"
        ))
        .await
        .unwrap();
}

/// The collection that every 1000th write starts goes on, slice after slice (up to four), while
/// most of each slice was expired: a workload that leaves expired rows behind faster than one
/// per write is kept up with. One slice alone would delete about 800 of these 3,500 rows.
#[tokio::test]
async fn postgres_gc_started_by_writes_goes_on_while_most_of_a_slice_was_expired() {
    let Some((_, table, store, client)) = setup(
        "postgres_gc_started_by_writes_goes_on_while_most_of_a_slice_was_expired",
        "repeat",
    )
    .await
    else {
        return;
    };
    insert(&client, &table, "hc:{gc}:dead", 3500, "-1 minute").await;
    // 1000 writes start one collection in the background; they leave 1000 live rows.
    for i in 0..SLICE {
        store
            .compare_and_set(
                &format!("hc:{{gc}}:w{i}"),
                None,
                "v",
                Some(Duration::from_secs(3600)),
            )
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = count(&client, &table, "hc:{gc}:dead").await;
        if left < 3500 - 2 * SLICE {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} of 3500 expired rows still there 20 s after the 1000th write"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count(&client, &table, "hc:{gc}:w").await, SLICE);

    drop_table(&client, &table).await;
}

/// A collection runs on a connection of its own: while one is stopped (here by a lock that its
/// `DELETE` waits for), the callers' pool, of a single connection, still serves them. Taking the
/// collection's connection from the callers' pool made every call queue behind it.
#[tokio::test]
async fn postgres_gc_leaves_the_callers_pool_to_the_callers() {
    let Some(url) = ServerKind::Postgres
        .shared_or_skip("postgres_gc::postgres_gc_leaves_the_callers_pool_to_the_callers")
        .await
    else {
        return;
    };
    let table = table("own");
    let store = store_with(&url, &table, "timeout=10s&pool_size=1").await;
    let client = connect(&url).await;
    insert(&client, &table, "hc:{gc}:dead", 10, "-1 minute").await;
    store
        .compare_and_set("hc:{gc}:live", None, "v", None)
        .await
        .unwrap();

    // SHARE mode lets reads through and stops every write, the collection's `DELETE` among them.
    let mut locker = connect(&url).await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute(&format!("LOCK TABLE {table} IN SHARE MODE"))
        .await
        .unwrap();
    let collection = tokio::spawn({
        let store = store.clone();
        async move { store.collect_garbage_now().await }
    });
    let started = Instant::now();
    loop {
        if collections_waiting_for_a_lock(&client, &table).await > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the collection never waited for the lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let read = tokio::time::timeout(Duration::from_secs(3), store.get("hc:{gc}:live")).await;
    assert!(
        matches!(&read, Ok(Ok(Some(v))) if v == "v"),
        "a read while the collection waited: {read:?}"
    );
    assert!(!collection.is_finished(), "the collection did not wait");

    lock.commit().await.unwrap();
    let gc = tokio::time::timeout(Duration::from_secs(10), collection)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(gc.deleted, 10, "{gc:?}");
    drop(locker);
    drop_table(&client, &table).await;
}

/// A collection that waits for a table lock gives up at the store's deadline, and so does the
/// server: the collection's transaction sets `lock_timeout` to the deadline (`SET LOCAL`, which a
/// pooler in transaction mode keeps within the transaction), so its statement does not stay
/// queued for the lock, holding a connection, after the call returned.
#[tokio::test]
async fn postgres_gc_waiting_for_a_table_lock_gives_up_on_the_server_too() {
    let Some(url) = ServerKind::Postgres
        .shared_or_skip(
            "postgres_gc::postgres_gc_waiting_for_a_table_lock_gives_up_on_the_server_too",
        )
        .await
    else {
        return;
    };
    let table = table("locked");
    let store = store_with(&url, &table, "timeout=1s").await;
    let client = connect(&url).await;
    insert(&client, &table, "hc:{gc}:dead", 10, "-1 minute").await;

    let mut locker = connect(&url).await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute(&format!("LOCK TABLE {table} IN SHARE MODE"))
        .await
        .unwrap();
    let started = Instant::now();
    let e = store.collect_garbage_now().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}: {e}",
        started.elapsed()
    );
    // The lock is still held: a statement still waiting for it is the collection's, abandoned.
    let deadline = Instant::now() + Duration::from_secs(2);
    while collections_waiting_for_a_lock(&client, &table).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the collection's statement still waits for the lock 2 s after the call gave up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lock.commit().await.unwrap();
    assert_eq!(count(&client, &table, "hc:{gc}:dead").await, 10);
    drop(locker);
    drop_table(&client, &table).await;
}
