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
use headcount_harness::ServerKind;
#[cfg(feature = "redis")]
use headcount_harness::{skip_unless_required, KvStore};
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
    let logs = capture_logs();
    let writer = PostgresStore::connect(&format!("{writer_url}{sep}table={table}"))
        .await
        .unwrap();
    assert!(!writer.capabilities().native_notifications);
    // One clean line with the server's reason, not the client's "db error".
    let said = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    let line = said
        .lines()
        .find(|l| l.contains(&format!("change triggers on table `{table}`")))
        .unwrap_or_else(|| panic!("no warning about the triggers in: {said}"));
    // "must be owner of table …" or, where the role may not create the trigger function in the
    // schema, "permission denied for schema …".
    assert!(
        line.contains("(does this role own it?): must be owner of")
            || line.contains("(does this role own it?): permission denied for"),
        "{line}"
    );
    let message = &line[line.find("cannot install").unwrap_or(0)..];
    assert!(
        !message.contains("db error") && !message.contains("  "),
        "{line}"
    );
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

/// What the store logs from here on, as text: a global subscriber (the test binary's only one)
/// writing into the buffer returned, for every test of this binary alike.
#[cfg(any(feature = "redis", feature = "postgres"))]
fn capture_logs() -> std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    use std::sync::{Arc, Mutex, OnceLock};
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&logs);
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Buffer(Arc::clone(&sink)))
            .try_init();
        logs
    })
    .clone()
}

/// A writer that appends to a shared buffer.
#[cfg(any(feature = "redis", feature = "postgres"))]
struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(any(feature = "redis", feature = "postgres"))]
impl std::io::Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
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
    let logs = capture_logs();
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
    // The warning names the fix in plain words (not the client's reply).
    let start = tokio::time::Instant::now();
    let line = loop {
        let said = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
        if let Some(l) = said
            .lines()
            .find(|l| l.contains("did not subscribe this user"))
        {
            break l.to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no warning: {said}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        line.contains("ACL SETUSER") && !line.contains("bulk-string"),
        "{line}"
    );
    // The refused PUBLISH of each of the limited user's writes shares one ACL LOG entry.
    let denied = |log: &redis::Value| -> Vec<i64> {
        let redis::Value::Array(entries) = log else {
            return Vec::new();
        };
        entries
            .iter()
            .filter_map(|e| {
                let redis::Value::Array(fields) = e else {
                    return None;
                };
                let text = |v: &redis::Value| match v {
                    redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => String::new(),
                };
                let field = |name: &str| {
                    fields
                        .chunks(2)
                        .find(|kv| text(&kv[0]) == name)
                        .map(|kv| kv[1].clone())
                };
                let user = field("username").map(|v| text(&v))?;
                let count = match field("count")? {
                    redis::Value::Int(n) => n,
                    _ => 0,
                };
                // A channel refused inside a script: the scripts' PUBLISH.
                let published = field("reason").is_some_and(|r| text(&r) == "channel")
                    && field("context").is_some_and(|c| text(&c) == "lua");
                (user == "nochan" && published).then_some(count)
            })
            .collect()
    };
    for i in 0..10 {
        assert!(limited
            .compare_and_set(&format!("{dir}n{i}"), None, "m", None)
            .await
            .unwrap());
    }
    let log: redis::Value = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut admin)
        .await
        .unwrap();
    let entries = denied(&log);
    assert_eq!(entries.len(), 1, "ACL LOG: {log:?}");
    assert!(entries[0] >= 10, "ACL LOG: {log:?}");
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
