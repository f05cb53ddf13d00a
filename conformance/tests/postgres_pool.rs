//! The PostgreSQL store's connection pool on a real server (the harness's, or
//! `HEADCOUNT_TEST_POSTGRES_URL`): the pool hands out the connection returned last (LIFO), so a
//! connection whose call timed out must never go back on that stack, or the very next call would
//! queue behind the statement still running on it.
//!
//! A test whose server is missing prints `SKIP` and passes, unless `HEADCOUNT_REQUIRE_BACKENDS`
//! requires PostgreSQL: then it fails.
#![cfg(feature = "postgres")]
// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use headcount::postgres::PostgresStore;
use headcount::{ErrorKind, Store};
use headcount_harness::ServerKind;

const TIMEOUT: Duration = Duration::from_millis(500);

#[tokio::test]
async fn postgres_timed_out_connection_is_not_handed_out_again() {
    let Some(url) = ServerKind::Postgres
        .shared_or_skip("postgres_pool::postgres_timed_out_connection_is_not_handed_out_again")
        .await
    else {
        return;
    };
    // A table of its own, so the row lock below blocks no other test.
    let table = format!("hc_pool_{:016x}", rand::random::<u64>());
    let sep = if url.contains('?') { '&' } else { '?' };
    let store = PostgresStore::connect(&format!("{url}{sep}table={table}&timeout=500ms"))
        .await
        .unwrap();
    let key = "hc:{pool}:locked";
    assert_eq!(store.incr(key, None).await.unwrap(), 1);

    // Another session locks the row: the next increment waits for it past its deadline, and its
    // statement keeps waiting on the server after the call gave up.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client.batch_execute("BEGIN").await.unwrap();
    client
        .execute(
            &format!("SELECT 1 FROM {table} WHERE key = $1 FOR UPDATE"),
            &[&key],
        )
        .await
        .unwrap();
    let started = Instant::now();
    let e = store.incr(key, None).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(started.elapsed() < TIMEOUT + Duration::from_millis(500));

    // The connection that timed out was the pool's last returned one: handed out again, it would
    // make these calls wait behind the blocked increment and time out too.
    for i in 0..3 {
        let started = Instant::now();
        assert_eq!(
            store.get(&format!("hc:{{pool}}:other{i}")).await.unwrap(),
            None
        );
        assert!(
            started.elapsed() < TIMEOUT,
            "call {i} took {:?}",
            started.elapsed()
        );
    }

    client.batch_execute("ROLLBACK").await.unwrap();
    // The increment that timed out may still apply once the lock is gone (its server process
    // was waiting for the lock, not reading its closed socket): a timeout leaves a write unknown.
    let after = store.incr(key, None).await.unwrap();
    assert!(matches!(after, 2 | 3), "{after}");
    client
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}
