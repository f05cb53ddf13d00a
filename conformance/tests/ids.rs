//! Majority IDs on real servers: five `redis-server`s with `appendonly yes` + `appendfsync
//! always`, and a mixed set of three SQLite files (`synchronous=full`) and two PostgreSQL servers
//! (`fsync=on`). Concurrent clients, a linearizability check over the recorded history, nodes
//! killed and restarted, a node that forgets its data, and bad input.
//!
//! A missing server binary skips a test with a `SKIP` line, or fails it when
//! `HEADCOUNT_REQUIRE_BACKENDS` requires the backend.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg(all(feature = "redis", feature = "sqlite", feature = "postgres"))]

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use headcount::recipes::ids::{DurabilityPolicy, IdsConfig, MajorityIds, MediatedIds};
use headcount::{DynStore, ErrorKind};
use headcount_conformance::id_history::{
    check_id_history as check_history, IdCall as Call, IdLoad,
};
use headcount_conformance::wait;
use headcount_harness::{skip_unless_required, KvStore, PgServer, ServerKind, Unavailable};
use tokio::time::Instant;

const AOF_ALWAYS: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The value, or None with a SKIP line when the backend is missing and not required.
fn available<T>(backend: ServerKind, test: &str, r: Result<T, Unavailable>) -> Option<T> {
    skip_unless_required(backend, &format!("ids::{}::{test}", backend.name()), r)
}

/// `n` single Redis servers started with `args`, each with a 1 s operation timeout.
async fn redis_servers(
    backend: ServerKind,
    n: usize,
    args: &'static [&'static str],
    test: &str,
) -> Option<Vec<Arc<KvStore>>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let started = tokio::task::spawn_blocking(move || {
            KvStore::redis_with(Some(Duration::from_secs(1)), args)
        })
        .await
        .unwrap();
        out.push(Arc::new(available(backend, test, started)?));
    }
    Some(out)
}

/// A fresh directory for SQLite files, removed by the caller.
fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hc-ids-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn connect_all(urls: &[String]) -> Vec<DynStore> {
    let mut stores = Vec::new();
    for url in urls {
        stores.push(headcount::connect(url).await.unwrap());
    }
    stores
}

fn generator_name() -> String {
    format!("t{:08x}", rand::random::<u32>())
}

/// `clients` clients, each with its own connections and generator, take `per` IDs each, all
/// starting together.
async fn run_clients(urls: &[String], clients: usize, per: usize, config: IdsConfig) -> Vec<Call> {
    let barrier = Arc::new(tokio::sync::Barrier::new(clients));
    let mut tasks = Vec::new();
    for client in 0..clients {
        let urls = urls.to_vec();
        let config = config.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let ids = MajorityIds::new(connect_all(&urls).await, config)
                .await
                .unwrap();
            barrier.wait().await;
            let mut calls = Vec::with_capacity(per);
            for _ in 0..per {
                let start = Instant::now();
                let id = ids.next().await.unwrap();
                calls.push(Call {
                    client,
                    start,
                    end: Instant::now(),
                    id: Some(id),
                });
            }
            (calls, ids.stats())
        }));
    }
    let mut all = Vec::new();
    let (mut attempts, mut got) = (0, 0);
    for t in tasks {
        let (calls, stats) = t.await.unwrap();
        attempts += stats.attempts;
        got += stats.ids;
        all.extend(calls);
    }
    say(&format!(
        "{clients} clients x {per} IDs: {got} IDs in {attempts} attempts"
    ));
    all
}

async fn redis5_8_clients_x_500_unique_increasing_linearizable(backend: ServerKind) {
    let Some(servers) = redis_servers(backend, 5, AOF_ALWAYS, "redis5_8x500").await else {
        return;
    };
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let config = IdsConfig::new(generator_name()).with_deadline(Duration::from_secs(30));
    let calls = run_clients(&urls, 8, 500, config).await;
    assert_eq!(calls.len(), 4000);
    check_history(&calls);
}

async fn mixed_3_sqlite_2_postgres_8_clients_x_500(backend: ServerKind) {
    let test = "mixed_8x500";
    let mut pgs = Vec::new();
    for _ in 0..2 {
        let started = tokio::task::spawn_blocking(|| {
            PgServer::start_with(None, &["fsync=on", "synchronous_commit=on"])
        })
        .await
        .unwrap();
        let Some(pg) = available(backend, test, started) else {
            return;
        };
        pgs.push(pg);
    }
    let dir = temp_dir();
    let mut urls: Vec<String> = (0..3)
        .map(|i| {
            format!(
                "sqlite://{}/ids{i}.db?synchronous=full&timeout=30s",
                dir.display()
            )
        })
        .collect();
    urls.extend(pgs.iter().map(PgServer::url));
    let config = IdsConfig::new(generator_name()).with_deadline(Duration::from_secs(30));
    let calls = run_clients(&urls, 8, 500, config).await;
    assert_eq!(calls.len(), 4000);
    check_history(&calls);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `clients` clients over `urls`, each with its own connections and generator, taking single
/// IDs with no pause after a failure.
async fn start_load(urls: &[String], clients: usize, config: &IdsConfig) -> IdLoad {
    let mut callers = Vec::new();
    for _ in 0..clients {
        let ids = Arc::new(
            MajorityIds::new(connect_all(urls).await, config.clone())
                .await
                .unwrap(),
        );
        callers.push(move || {
            let ids = ids.clone();
            async move { ids.next().await.ok().map(|id| vec![id]) }
        });
    }
    IdLoad::start(callers, Duration::ZERO)
}

async fn kill(server: &Arc<KvStore>) {
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.servers[0].kill())
        .await
        .unwrap()
        .unwrap();
}

async fn restart(server: &Arc<KvStore>) {
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.servers[0].start())
        .await
        .unwrap()
        .unwrap();
}

async fn redis5_kill_two_then_three_fails_closed_then_resumes_above(backend: ServerKind) {
    let Some(servers) = redis_servers(backend, 5, AOF_ALWAYS, "redis5_kill").await else {
        return;
    };
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let deadline = Duration::from_secs(2);
    let config = IdsConfig::new(generator_name()).with_deadline(deadline);
    let load = start_load(&urls, 4, &config).await;
    let t0 = Instant::now();
    load.wait_ids(t0, 200, Duration::from_secs(60), "all 5 up")
        .await;

    // Two of five down: a majority (3) remains, IDs keep coming.
    kill(&servers[0]).await;
    kill(&servers[1]).await;
    let t2 = Instant::now();
    load.wait_ids(t2, 200, Duration::from_secs(60), "2 of 5 killed")
        .await;

    // Three down: every call that starts now fails, within the deadline, with no ID.
    kill(&servers[2]).await;
    let t3 = Instant::now();
    let slack = Duration::from_secs(1);
    let after = load
        .wait_calls(t3, 8, 4, Duration::from_secs(30), "after the third kill")
        .await;
    for c in &after {
        assert!(
            c.id.is_none(),
            "an ID {:?} was returned with 3 of 5 nodes down",
            c.id
        );
        assert!(
            c.end - c.start <= deadline + slack,
            "a call failed only after {:?} (deadline {deadline:?})",
            c.end - c.start
        );
    }
    let before_restart: i64 = load.snapshot().iter().filter_map(|c| c.id).max().unwrap();

    // Back up (from their append-only files): IDs resume above every earlier one.
    for s in &servers[..3] {
        restart(s).await;
    }
    let t4 = Instant::now();
    load.wait_ids(t4, 100, Duration::from_secs(60), "after the restarts")
        .await;
    let calls = load.stop().await;
    for c in calls.iter().filter(|c| c.start >= t4) {
        if let Some(id) = c.id {
            assert!(
                id > before_restart,
                "{id} after the restart is not above {before_restart}"
            );
        }
    }
    // Not asserted: with 2 of 5 down every one of the 3 live nodes must accept, so contending
    // clients can run out of deadline; the count is printed so a run shows it.
    let failed_early = calls
        .iter()
        .filter(|c| c.id.is_none() && c.end < t3)
        .count();
    let in_flight = calls
        .iter()
        .filter(|c| c.id.is_none() && c.start < t3 && c.end >= t3)
        .count();
    say(&format!(
        "kill test: {} calls, {} IDs; failed before the third kill: {failed_early}, in flight at it: {in_flight}",
        calls.len(),
        calls.iter().filter(|c| c.id.is_some()).count()
    ));
    check_history(&calls);
}

/// Two Redis servers with AOF always and a third without persistence, which forgets everything
/// when it restarts.
async fn two_durable_one_forgetful(backend: ServerKind, test: &str) -> Option<Vec<Arc<KvStore>>> {
    let mut servers = redis_servers(backend, 2, AOF_ALWAYS, test).await?;
    servers.extend(redis_servers(backend, 1, &[], test).await?);
    Some(servers)
}

async fn a_non_durable_node_is_refused_when_the_check_is_on(backend: ServerKind) {
    let Some(abc) = two_durable_one_forgetful(backend, "non_durable_refused").await else {
        return;
    };
    let urls: Vec<String> = abc.iter().map(|s| s.url()).collect();
    let err = MajorityIds::new(connect_all(&urls).await, IdsConfig::new(generator_name()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("store #2") && msg.contains("appendonly no"),
        "{msg}"
    );
}

/// With the check off, a node that forgets (no AOF, restarted) lets a later majority read a
/// smaller number: this schedule provably repeats an ID, and the test expects it to.
async fn with_the_check_off_a_forgetful_node_repeats_an_id(backend: ServerKind) {
    let Some(abc) = two_durable_one_forgetful(backend, "forgetful_repeats").await else {
        return;
    };
    let (a, b, c) = (&abc[0], &abc[1], &abc[2]);
    let urls = vec![a.url(), b.url(), c.url()];
    let config = IdsConfig::new(generator_name())
        .with_deadline(Duration::from_secs(5))
        .with_durability(DurabilityPolicy::AllowNonDurable);
    let ids = MajorityIds::new(connect_all(&urls).await, config.clone())
        .await
        .unwrap();
    // Another client, used only at the end (connected now, while every server runs).
    let later = MajorityIds::new(connect_all(&urls).await, config)
        .await
        .unwrap();
    // All up: 1 is on A, B and C. The call returns once a majority stored it, so under load
    // the third write may still be in flight when A is killed: store it on every server, as the
    // protocol would have, so the schedule below is the one described.
    assert_eq!(ids.next().await.unwrap(), 1);
    for s in connect_all(&urls).await {
        s.set_max(ids.key(), 1, None).await.unwrap();
    }
    // A down: B and C are the majority and reach 5.
    kill(a).await;
    let mut last = 1;
    for _ in 0..4 {
        last = ids.next().await.unwrap();
    }
    assert_eq!(last, 5);
    // C crashes and comes back empty; A comes back with 1; B goes down.
    kill(c).await;
    restart(c).await;
    restart(a).await;
    kill(b).await;
    // The only majority is {A (1), C (nothing)}: a client with no memory of earlier IDs reads
    // 1 from it and the two agree on 2, which was handed out before.
    let repeated = later.next().await.unwrap();
    assert_eq!(
        repeated, 2,
        "expected the violation the article warns about: ID 2 again after 5"
    );
    assert!(repeated <= last);
}

async fn bad_input_gives_typed_errors(_embedded: ServerKind) {
    let dir = temp_dir();
    let url = |i: usize| format!("sqlite://{}/bad{i}.db?synchronous=full", dir.display());
    let stores = connect_all(&[url(0), url(1), url(2), url(3)]).await;
    let name = generator_name();
    let config = IdsConfig::new(&name);

    let empty = MajorityIds::new(Vec::new(), config.clone())
        .await
        .unwrap_err();
    assert_eq!(empty.kind(), ErrorKind::InvalidArgument, "{empty}");
    let twice = MajorityIds::new(vec![stores[0].clone(), stores[0].clone()], config.clone())
        .await
        .unwrap_err();
    assert!(twice.to_string().contains("passed again"), "{twice}");
    let bad_name = MajorityIds::new(stores.clone(), IdsConfig::new("a:b"))
        .await
        .unwrap_err();
    assert_eq!(bad_name.kind(), ErrorKind::InvalidArgument, "{bad_name}");
    let in_memory = headcount::connect("sqlite::memory:").await.unwrap();
    let refused = MajorityIds::new(vec![in_memory], config.clone())
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Config, "{refused}");

    // Four stores: the majority is three.
    let four = MajorityIds::new(stores.clone(), config.clone())
        .await
        .unwrap();
    assert_eq!((four.stores(), four.majority()), (4, 3));
    assert_eq!(four.next().await.unwrap(), 1);

    // A foreign value on one of three stores: that store counts as failing, the other two serve.
    let three = MajorityIds::new(stores[..3].to_vec(), config.clone())
        .await
        .unwrap();
    stores[0].delete(three.key()).await.unwrap();
    assert!(stores[0]
        .compare_and_set(three.key(), None, "abc", None)
        .await
        .unwrap());
    let id = three.next().await.unwrap();
    assert!(id >= 2, "{id}");
    // On two of three, no majority can answer: the typed error at once, not at the deadline.
    stores[1].delete(three.key()).await.unwrap();
    assert!(stores[1]
        .compare_and_set(three.key(), None, "xyz", None)
        .await
        .unwrap());
    let started = Instant::now();
    let err = three.next().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ForeignValue, "{err}");
    assert!(
        started.elapsed() < config.deadline(),
        "{:?}",
        started.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One server behind several URLs is one failure domain, not several votes: two databases of
/// one Redis, one PostgreSQL server connected twice, and one SQLite file named two ways are
/// refused with `InvalidArgument` naming the server; distinct servers pass.
async fn one_server_behind_several_urls_is_refused(backend: ServerKind) {
    let test = "one_server_behind_several_urls_is_refused";
    let config = IdsConfig::new(generator_name());
    // A store of its own beside the one named twice, where a test needs a third.
    let dir = temp_dir();
    let other = format!("sqlite://{}/other.db?synchronous=full", dir.display());
    match backend {
        ServerKind::Redis => {
            let Some(redis) = redis_servers(backend, 2, AOF_ALWAYS, test).await else {
                return;
            };
            let (a, b) = (redis[0].url(), redis[1].url());
            let db = |url: &str, n: u8| match url.split_once('?') {
                Some((base, query)) => format!("{base}/{n}?{query}"),
                None => format!("{url}/{n}"),
            };
            let one = connect_all(&[db(&a, 0), db(&a, 1), b.clone()]).await;
            let e = MajorityIds::new(one, config.clone()).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(
                e.to_string()
                    .contains("#0 and #1 are one server (redis replication id"),
                "{e}"
            );
            let distinct = connect_all(&[db(&a, 0), b.clone()]).await;
            assert!(MajorityIds::new(distinct, config.clone()).await.is_ok());
        }
        ServerKind::Sqlite => {
            let file = |spelling: &str| {
                format!(
                    "sqlite://{}{spelling}ids.db?synchronous=full",
                    dir.display()
                )
            };
            let same_file = connect_all(&[file("/"), file("/./"), other.clone()]).await;
            let e = MajorityIds::new(same_file, config.clone())
                .await
                .unwrap_err();
            assert!(e.to_string().contains("(sqlite file"), "{e}");
        }
        ServerKind::Postgres => {
            let started = tokio::task::spawn_blocking(|| PgServer::start_with(None, &["fsync=on"]))
                .await
                .unwrap();
            let Some(pg) = available(backend, test, started) else {
                return;
            };
            let twice = connect_all(&[pg.url(), other.clone(), pg.url()]).await;
            let e = MajorityIds::new(twice, config.clone()).await.unwrap_err();
            assert!(
                e.to_string()
                    .contains("#0 and #2 are one server (postgresql server started"),
                "{e}"
            );
            tokio::task::spawn_blocking(move || drop(pg)).await.unwrap();
        }
        other => panic!("{test}: not written for {}", other.name()),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

async fn mediated_calls_take_turns_and_stay_unique(_embedded: ServerKind) {
    let dir = temp_dir();
    let urls: Vec<String> = (0..3)
        .map(|i| format!("sqlite://{}/med{i}.db?synchronous=full", dir.display()))
        .collect();
    let ids = MajorityIds::new(connect_all(&urls).await, IdsConfig::new(generator_name()))
        .await
        .unwrap();
    let mediated = Arc::new(MediatedIds::new(ids));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let m = mediated.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..20 {
                got.push(m.next().await.unwrap());
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, (1..=320).collect::<Vec<i64>>());
    // One process, one turn at a time: no attempt was lost to a rival.
    assert_eq!(mediated.inner().stats().retry_rate(), 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

async fn probe(url: &str) -> headcount::Durability {
    headcount::connect(url)
        .await
        .unwrap()
        .durability()
        .await
        .unwrap()
}

async fn durability_probe_follows_how_the_harness_started_each_server(backend: ServerKind) {
    let test = "durability_probe";
    match backend {
        ServerKind::Redis => redis_durability(backend, test).await,
        ServerKind::Postgres => postgres_durability(backend, test).await,
        ServerKind::Etcd => etcd_durability(backend, test).await,
        other => panic!("{test}: not written for {}", other.name()),
    }
}

async fn redis_durability(backend: ServerKind, test: &str) {
    // Redis: the harness default has no AOF; with AOF always it is durable.
    let Some(plain) = redis_servers(backend, 1, &[], test).await else {
        return;
    };
    let d = probe(&plain[0].url()).await;
    assert!(!d.durable && d.detail.contains("appendonly no"), "{d:?}");
    let aof = redis_servers(backend, 1, AOF_ALWAYS, test).await.unwrap();
    let d = probe(&aof[0].url()).await;
    assert!(
        d.durable && d.detail == "appendonly yes, appendfsync always, no replicas",
        "{d:?}"
    );
    // A policy that may evict keys without a TTL (the counters) is not durable.
    let lru: &'static [&'static str] = &[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--maxmemory-policy",
        "allkeys-lru",
    ];
    let evicting = redis_servers(backend, 1, lru, test).await.unwrap();
    let d = probe(&evicting[0].url()).await;
    assert!(!d.durable && d.detail.contains("allkeys-lru"), "{d:?}");
    // A primary with an asynchronous replica is not durable: a promoted replica can lack
    // acknowledged writes.
    let primary = aof[0].url();
    let port: u16 = primary
        .split("127.0.0.1:")
        .nth(1)
        .map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|digits| digits.parse().ok())
        .unwrap();
    let replica = tokio::task::spawn_blocking(move || {
        let port = port.to_string();
        KvStore::redis_with(None, &["--replicaof", "127.0.0.1", &port])
    })
    .await
    .unwrap()
    .unwrap();
    let what = "the primary no longer durable once its replica connected";
    let every = Duration::from_millis(100);
    let d = wait::eventually(what, Duration::from_secs(10), every, || async {
        let d = probe(&primary).await;
        if d.durable {
            Err(d)
        } else {
            Ok(d)
        }
    })
    .await;
    assert!(
        !d.durable && d.detail.contains("connected replica"),
        "{d:?}"
    );
    let d = probe(&replica.url()).await;
    assert!(!d.durable, "{d:?}");
    tokio::task::spawn_blocking(move || drop(replica))
        .await
        .unwrap();
    let everysec: &'static [&'static str] = &["--appendonly", "yes", "--appendfsync", "everysec"];
    let sec = redis_servers(backend, 1, everysec, test).await.unwrap();
    let d = probe(&sec[0].url()).await;
    assert!(!d.durable && d.detail.contains("everysec"), "{d:?}");
}

async fn postgres_durability(backend: ServerKind, test: &str) {
    // PostgreSQL: the harness runs with fsync=off; fsync=on is durable, synchronous_commit=off
    // is not.
    for (settings, durable, needle) in [
        (&[][..], false, "fsync off"),
        (&["fsync=on"][..], true, "fsync on, synchronous_commit on"),
        (
            &["fsync=on", "synchronous_commit=off"][..],
            false,
            "synchronous_commit off",
        ),
    ] {
        let settings: Vec<&'static str> = settings.to_vec();
        let started = tokio::task::spawn_blocking(move || PgServer::start_with(None, &settings))
            .await
            .unwrap();
        let Some(pg) = available(backend, test, started) else {
            break;
        };
        let d = probe(&pg.url()).await;
        assert_eq!(d.durable, durable, "{d:?}");
        assert!(d.detail.contains(needle), "{d:?}");
        tokio::task::spawn_blocking(move || drop(pg)).await.unwrap();
    }
}

async fn etcd_durability(backend: ServerKind, test: &str) {
    // etcd: durable by construction.
    let started = tokio::task::spawn_blocking(|| KvStore::etcd(1, None))
        .await
        .unwrap();
    if let Some(etcd) = available(backend, test, started) {
        let d = probe(&etcd.url()).await;
        assert!(d.durable && d.detail.contains("WAL"), "{d:?}");
        tokio::task::spawn_blocking(move || drop(etcd))
            .await
            .unwrap();
    }
}

// Which backends: the `ids_*` rows of the table in headcount_harness::scenario_tests.
headcount_harness::scenario_tests!(ids_redis, workers = 4: [
    redis5_8_clients_x_500_unique_increasing_linearizable,
    redis5_kill_two_then_three_fails_closed_then_resumes_above,
    a_non_durable_node_is_refused_when_the_check_is_on,
    with_the_check_off_a_forgetful_node_repeats_an_id,
]);
headcount_harness::scenario_tests!(ids_sqlite, workers = 4: [
    bad_input_gives_typed_errors,
    mediated_calls_take_turns_and_stay_unique,
]);
headcount_harness::scenario_tests!(ids_mixed, workers = 4: [
    mixed_3_sqlite_2_postgres_8_clients_x_500,
]);
headcount_harness::scenario_tests!(ids_one_server, workers = 4: [
    one_server_behind_several_urls_is_refused,
]);
headcount_harness::scenario_tests!(ids_durability, workers = 4: [
    durability_probe_follows_how_the_harness_started_each_server,
]);
