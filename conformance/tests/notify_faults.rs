//! Change notifications refused by the server: members keep working by polling, and nothing
//! spins. A Redis user whose ACL grants no pub/sub channel still writes (the scripts' `PUBLISH`
//! is refused inside `redis.pcall`), and its subscription stays silent, retried rarely.
#![cfg(feature = "redis")]
// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use headcount_conformance::harness::{skip_unless_required, KvStore, ServerKind};
use redis::aio::MultiplexedConnection;

async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn connections_received(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_pubsub_refused_by_acl_keeps_writes_and_stays_silent() {
    let Some(server) =
        skip_unless_required(ServerKind::Redis, "notify_faults", KvStore::redis(None))
    else {
        return;
    };
    let url = server.url();
    let mut admin = raw(&url).await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nochan",
            "on",
            ">pw",
            "~*",
            "+@all",
            "resetchannels",
        ])
        .query_async(&mut admin)
        .await
        .unwrap();
    let limited_url = url.replacen("redis://", "redis://nochan:pw@", 1);
    let limited = headcount::connect(&limited_url).await.unwrap();
    let full = headcount::connect(&url).await.unwrap();
    assert!(limited.capabilities().native_notifications);

    let dir = "hc:{acl}:slot:";
    let before = connections_received(&mut admin).await;
    let mut refused = limited.subscribe(dir).await.unwrap();
    let mut heard = full.subscribe(dir).await.unwrap();
    // The full user's subscription becomes active: a write of its own is heard.
    let start = tokio::time::Instant::now();
    let mut i = 0;
    loop {
        i += 1;
        full.compare_and_set(&format!("{dir}warm{i}"), None, "v", None)
            .await
            .unwrap();
        if tokio::time::timeout(Duration::from_millis(200), heard.recv())
            .await
            .is_ok()
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never heard");
    }
    // The limited user writes (its PUBLISH is refused inside the script, the write is not).
    assert!(limited
        .compare_and_set(&format!("{dir}0"), None, "m", None)
        .await
        .unwrap());
    assert_eq!(
        limited.get(&format!("{dir}0")).await.unwrap().as_deref(),
        Some("m")
    );
    assert!(limited.delete(&format!("{dir}0")).await.unwrap());
    // The full user's writes are published; the limited user's subscription hears nothing.
    full.compare_and_set(&format!("{dir}1"), None, "m", None)
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(1), heard.recv())
            .await
            .is_ok(),
        "the full user's write was not heard"
    );
    let fired = tokio::time::timeout(Duration::from_secs(2), refused.recv()).await;
    assert!(
        fired.is_err(),
        "a subscription the ACL refuses fired: {fired:?}, {} connections",
        connections_received(&mut admin).await - before
    );
    // No spinning: the refused subscription was tried about once in these seconds (and is
    // retried every 30 s), beside the connections of the two stores' subscriptions.
    let opened = connections_received(&mut admin).await - before;
    assert!(opened <= 4, "{opened} connections opened in about 3 s");
}
