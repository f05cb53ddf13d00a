//! PostgreSQL through PgBouncer in transaction mode, with a pool of two server connections that
//! every store connection takes turns on: every conformance case, and what the store does beside
//! its primitives (garbage collection, connecting). PgBouncer is started by the harness in front
//! of a PostgreSQL server of its own (one shared, plus one pair per fault case, whose faults hit
//! the server behind PgBouncer), or `HEADCOUNT_TEST_PGBOUNCER_URL` names one.
//!
//! A test whose servers are missing prints `SKIP` and passes, unless `HEADCOUNT_REQUIRE_BACKENDS`
//! requires `pgbouncer` (`all` does): then it fails.
#![cfg(feature = "postgres")]
// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use headcount::postgres::PostgresStore;
use headcount::{ErrorKind, Store};
use headcount_harness::ServerKind;

headcount_harness::conformance_tests!(pgbouncer, headcount_harness::ServerKind::PgBouncer);

/// `url` with `options` (`key=value&...`) added to its query.
fn with(url: &str, options: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{options}")
}

/// The store tells a connection through PgBouncer from one to the server itself: through
/// PgBouncer its statements are sent unnamed (a statement prepared on one server connection is
/// not there for the next transaction), to the server itself they are prepared.
#[tokio::test]
async fn pgbouncer_connections_are_told_from_direct_ones() {
    use headcount_harness::PgBouncer;
    let started = tokio::task::spawn_blocking(|| PgBouncer::start_new(None))
        .await
        .unwrap();
    let Some(bouncer) = headcount_harness::skip_unless_required(
        ServerKind::PgBouncer,
        "pgbouncer_connections_are_told_from_direct_ones",
        started,
    ) else {
        return;
    };
    for (url, pooled) in [(bouncer.url(), true), (bouncer.server_url(), false)] {
        let store = PostgresStore::connect(&url).await.unwrap();
        // Several calls at once, so that the store opens several connections.
        let keys: Vec<String> = (0..8).map(|i| format!("hc:{{kinds}}:{i}")).collect();
        let calls = keys.iter().map(|k| store.incr(k, None));
        for n in futures::future::join_all(calls).await {
            n.unwrap();
        }
        let (direct, through_pooler) = store.connections_direct_and_pooled();
        if pooled {
            assert!(
                direct == 0 && through_pooler > 0,
                "{url}: {direct} direct, {through_pooler} pooled"
            );
        } else {
            assert!(
                direct > 0 && through_pooler == 0,
                "{url}: {direct} direct, {through_pooler} pooled"
            );
        }
    }
    tokio::task::spawn_blocking(move || drop(bouncer))
        .await
        .unwrap();
}

/// Garbage collection runs on a connection of its own, which PgBouncer must accept: a startup
/// parameter such as `options` (to set `lock_timeout`) makes it refuse the connection
/// ("unsupported startup parameter: options"), and then no expired row is ever deleted.
#[tokio::test]
async fn pgbouncer_garbage_collection_deletes_expired_rows() {
    let Some(url) = ServerKind::PgBouncer
        .shared_or_skip("pgbouncer_garbage_collection_deletes_expired_rows")
        .await
    else {
        return;
    };
    let table = format!("hc_gc_pgbouncer_{:016x}", rand::random::<u64>());
    let store = PostgresStore::connect(&with(&url, &format!("table={table}")))
        .await
        .unwrap();
    for i in 0..10 {
        let key = format!("hc:{{gc}}:dead{i}");
        assert!(store
            .compare_and_set(&key, None, "v", Some(Duration::from_millis(1)))
            .await
            .unwrap());
    }
    assert!(store
        .compare_and_set("hc:{gc}:live", None, "v", None)
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let gc = store.collect_garbage_now().await.unwrap();
    assert_eq!((gc.examined, gc.deleted), (11, 10), "{gc:?}");
    assert_eq!(
        store.get("hc:{gc}:live").await.unwrap().as_deref(),
        Some("v")
    );

    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

/// PgBouncer refuses startup parameters it does not know, such as the URL's `options`, on every
/// attempt: a permanent error naming the pooler and what to do, not a retryable one (08P01 is a
/// connection-exception SQLSTATE).
#[tokio::test]
async fn pgbouncer_refusing_a_startup_parameter_is_a_permanent_error_naming_it() {
    let Some(url) = ServerKind::PgBouncer
        .shared_or_skip("pgbouncer_refusing_a_startup_parameter_is_a_permanent_error_naming_it")
        .await
    else {
        return;
    };
    let e = PostgresStore::connect(&with(&url, "options=-c%20statement_timeout%3D1000"))
        .await
        .unwrap_err();
    let message = e.to_string();
    assert_eq!(e.kind(), ErrorKind::Rejected, "{message}");
    for needle in [
        "unsupported startup parameter",
        "PgBouncer",
        "ignore_startup_parameters",
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
}

/// PgBouncer in session mode keeps a client connection on one server connection, so `LISTEN`
/// holds: with `pool_mode=session` in the URL the store's notifications stay on and a write
/// through another store is heard; without it the store (which cannot tell the modes apart)
/// polls, as it must in transaction mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_in_session_mode_keeps_notifications_with_pool_mode_session() {
    use headcount_harness::{PgBouncer, PgServer};
    let started = tokio::task::spawn_blocking(|| {
        PgBouncer::start_in_front_as(
            std::sync::Arc::new(PgServer::start_new(None)?),
            None,
            "session",
        )
    })
    .await
    .unwrap();
    let Some(bouncer) = headcount_harness::skip_unless_required(
        ServerKind::PgBouncer,
        "pgbouncer_in_session_mode_keeps_notifications_with_pool_mode_session",
        started,
    ) else {
        return;
    };
    let plain = PostgresStore::connect(&bouncer.url()).await.unwrap();
    assert!(!plain.capabilities().native_notifications);
    let session = PostgresStore::connect(&with(&bouncer.url(), "pool_mode=session"))
        .await
        .unwrap();
    assert!(session.capabilities().native_notifications);
    let dir = "hc:{session}:slot:";
    let mut heard = session.subscribe(dir).await.unwrap();
    assert!(heard.is_native());
    // The subscription becomes active shortly after: write until a write is heard.
    let start = std::time::Instant::now();
    let mut i = 0;
    loop {
        i += 1;
        assert!(plain
            .compare_and_set(&format!("{dir}{i}"), None, "m", None)
            .await
            .unwrap());
        if tokio::time::timeout(Duration::from_millis(200), heard.recv())
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no notification through PgBouncer in session mode"
        );
    }
    let err = PostgresStore::connect(&with(&bouncer.url(), "pool_mode=statement"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("pool_mode"), "{err}");
    drop((plain, session));
    tokio::task::spawn_blocking(move || drop(bouncer))
        .await
        .unwrap();
}
