//! Change notifications refused by the server: members keep working by polling, and nothing
//! spins. A Redis user whose ACL grants no pub/sub channel still writes (the scripts' `PUBLISH`
//! is refused inside `redis.pcall`), and its subscription stays silent, retried rarely. A
//! PostgreSQL role that may write the table but not create its change triggers says it does not
//! notify, and works. On both, a group's members converge by polling.
// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[cfg(any(feature = "redis", feature = "postgres"))]
use std::time::Duration;

#[cfg(any(feature = "redis", feature = "postgres"))]
use headcount_conformance::harness::ServerKind;
#[cfg(feature = "redis")]
use headcount_conformance::harness::{skip_unless_required, KvStore};
#[cfg(feature = "redis")]
use redis::aio::MultiplexedConnection;

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_role_without_triggers_polls() {
    use headcount::postgres::PostgresStore;
    use headcount::Store;

    let Some(url) = ServerKind::Postgres
        .shared_or_skip("notify_faults::postgres_role_without_triggers_polls")
        .await
    else {
        return;
    };
    let table = format!("hc_notify_{:016x}", rand::random::<u64>());
    let role = format!("hc_writer_{:016x}", rand::random::<u64>());
    let sep = if url.contains('?') { '&' } else { '?' };
    // The owner creates the table (and its triggers), then drops the triggers and lets a role
    // that owns nothing write it.
    let owner = PostgresStore::connect(&format!("{url}{sep}table={table}"))
        .await
        .unwrap();
    assert!(owner.capabilities().native_notifications);
    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    admin
        .batch_execute(&format!(
            r#"DROP TRIGGER "{table}_changed_ins" ON "{table}";
               DROP TRIGGER "{table}_changed_upd" ON "{table}";
               DROP TRIGGER "{table}_changed_del" ON "{table}";
               CREATE ROLE "{role}" LOGIN;
               GRANT SELECT, INSERT, UPDATE, DELETE ON "{table}" TO "{role}";"#
        ))
        .await
        .unwrap();
    let writer_url = url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    let writer = PostgresStore::connect(&format!("{writer_url}{sep}table={table}"))
        .await
        .unwrap();
    assert!(!writer.capabilities().native_notifications);
    let mut silent = writer.subscribe("hc:{pg}:slot:").await.unwrap();
    assert!(!silent.is_native());
    assert!(writer
        .compare_and_set("hc:{pg}:slot:0", None, "m", None)
        .await
        .unwrap());
    assert_eq!(
        writer.get("hc:{pg}:slot:0").await.unwrap().as_deref(),
        Some("m")
    );
    assert!(silent.try_recv().is_none());
    // A group on the writer's store works by polling.
    let writer: headcount::DynStore = std::sync::Arc::new(writer);
    group_works_by_polling(writer.clone()).await;
    drop(writer);
    owner.close();
    admin
        .batch_execute(&format!(
            r#"DROP TABLE "{table}"; DROP FUNCTION "{table}_changed"(); DROP ROLE "{role}";"#
        ))
        .await
        .unwrap();
}

#[cfg(feature = "redis")]
async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[cfg(feature = "redis")]
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

#[cfg(feature = "redis")]
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
    // A group on the limited user's store works by polling: its members join, converge, and see
    // a graceful leave at a heartbeat.
    group_works_by_polling(limited).await;
}

/// Three members of a group on `store` (whose notifications are silent) join and converge, and
/// the two left converge after one leaves.
#[cfg(any(feature = "redis", feature = "postgres"))]
async fn group_works_by_polling(store: headcount::DynStore) {
    use headcount::recipes::group::{Group, GroupConfig, GroupPhase, Member};

    let ttl = Duration::from_millis(900);
    let group = format!("silent{:08x}", rand::random::<u32>());
    let mut members = Vec::new();
    for i in 0..3 {
        let cfg = GroupConfig::new(group.clone(), ttl).with_member(format!("m{i}"));
        members.push(Group::join(store.clone(), cfg).await.unwrap());
    }
    async fn converged(members: &[Member]) {
        let start = tokio::time::Instant::now();
        loop {
            let a: Vec<_> = members.iter().map(|m| m.assignment()).collect();
            if a.iter().all(|x| {
                x.phase == GroupPhase::Active
                    && x.epoch == a[0].epoch
                    && x.live.len() == members.len()
            }) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "never converged: {a:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    converged(&members).await;
    members.remove(1).leave().await.unwrap();
    converged(&members).await;
    for m in members {
        m.leave().await.unwrap();
    }
}
