//! The Redis key index on real servers: a listing costs O(keys under the prefix) however many
//! unrelated keys the database holds, the index stays close to the live keys for a prefix that
//! is never listed, and on Redis Cluster a listing needs a hash tag in its prefix.
#![cfg(feature = "redis")]
// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use headcount::ErrorKind;
use headcount_conformance::wait::{eventually, EVERY};
use headcount_harness::{skip_unless_required, KvStore, ServerKind, Unavailable};
use redis::aio::{ConnectionLike, MultiplexedConnection};

/// How long the index and the keys get to expire, and the listing to catch up.
const TEN_S: Duration = Duration::from_secs(10);

/// A dedicated store, or None (with a SKIP line) when the server is not installed.
fn start(backend: ServerKind, f: impl FnOnce() -> Result<KvStore, Unavailable>) -> Option<KvStore> {
    skip_unless_required(backend, "redis_index", f())
}

async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A single Redis started from its binary (or a skip), a raw connection to it and a store on it.
async fn redis_with_store() -> Option<(KvStore, MultiplexedConnection, headcount::DynStore)> {
    let server = start(ServerKind::Redis, || KvStore::redis(None))?;
    let url = server.url();
    let conn = raw(&url).await;
    let store = headcount::connect(&url).await.unwrap();
    Some((server, conn, store))
}

async fn zcard(conn: &mut impl ConnectionLike, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

/// `usec_per_call` of EVALSHA from `INFO commandstats`: the server's time per script call.
async fn evalsha_usec_per_call(conn: &mut impl ConnectionLike) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|s| {
            s.split(',')
                .find_map(|kv| kv.strip_prefix("usec_per_call="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no evalsha in INFO commandstats: {info}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_ignores_a_large_unrelated_keyspace() {
    let Some(server) = start(ServerKind::Redis, || {
        KvStore::redis_with(None, &["--enable-debug-command", "yes"])
    }) else {
        return;
    };
    let url = server.url();
    let mut conn = raw(&url).await;
    let _: () = redis::cmd("DEBUG")
        .arg("POPULATE")
        .arg(100_000)
        .arg("unrelated")
        .query_async(&mut conn)
        .await
        .unwrap();
    let store = headcount::connect(&url).await.unwrap();
    let mut want = Vec::new();
    for i in 0..50 {
        let k = format!("hc:{{ix}}:a:{i:02}");
        assert!(store.compare_and_set(&k, None, "v", None).await.unwrap());
        want.push((k, "v".to_owned()));
    }
    for k in ["hc:{ix}:b:1", "hc:{ix}:a", "plain:1"] {
        store.incr(k, None).await.unwrap();
    }
    // Written by another client: not in headcount's index, so not listed.
    let _: () = redis::cmd("SET")
        .arg("hc:{ix}:a:raw")
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();

    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    for _ in 0..10 {
        assert_eq!(store.list("hc:{ix}:a:").await.unwrap(), want);
    }
    // A SCAN over 100,000 keys takes tens of milliseconds per call; reading 50 names from the
    // index takes tens of microseconds. The bound leaves room for a loaded machine.
    let usec = evalsha_usec_per_call(&mut conn).await;
    assert!(usec < 5_000.0, "list took {usec} µs per call on the server");
    assert_eq!(
        store.list("plain:").await.unwrap(),
        vec![("plain:1".to_owned(), "1".to_owned())]
    );
    assert!(store.list("unrelated:").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_stays_bounded_for_a_prefix_never_listed() {
    let Some((_server, mut conn, store)) = redis_with_store().await else {
        return;
    };
    // Long enough that none of the 1,000 keys expires while they are still being written on a
    // loaded machine (the counts below would then come up short), short enough to wait for.
    let ttl = Duration::from_secs(2);
    let write_expiring = |tag: &'static str| {
        let store = store.clone();
        async move {
            for chunk in (0..1000).collect::<Vec<_>>().chunks(50) {
                futures::future::try_join_all(chunk.iter().map(|i| {
                    let store = store.clone();
                    let key = format!("hc:{{{tag}}}:n:{i}");
                    async move { store.incr(&key, Some(ttl)).await }
                }))
                .await
                .unwrap();
            }
        }
    };

    // Only keys with a TTL: the index keys expire with the last of them, with no further call.
    write_expiring("gone").await;
    assert!(zcard(&mut conn, "headcount:index").await >= 1000);
    let every = Duration::from_millis(50);
    eventually("the index expired with its keys", TEN_S, every, || {
        let mut conn = conn.clone();
        async move {
            let n: u64 = redis::cmd("EXISTS")
                .arg("headcount:index")
                .arg("headcount:expiry")
                .query_async(&mut conn)
                .await
                .unwrap();
            n == 0
        }
    })
    .await;

    // With a persistent key beside them, the index stays; writes sweep the expired names.
    store.incr("hc:{live}:n", None).await.unwrap();
    write_expiring("never-listed").await;
    assert!(zcard(&mut conn, "headcount:index").await >= 1001);
    eventually("the keys expired", TEN_S, EVERY, || async {
        store
            .get("hc:{never-listed}:n:999")
            .await
            .unwrap()
            .is_none()
    })
    .await;
    // Each write removes up to 8 expired names: 1,000 need 125 writes.
    for _ in 0..130 {
        store.incr("hc:{live}:n", None).await.unwrap();
    }
    assert_eq!(zcard(&mut conn, "headcount:index").await, 1);
    assert_eq!(zcard(&mut conn, "headcount:expiry").await, 0);
    assert_eq!(
        store.list("hc:").await.unwrap(),
        vec![("hc:{live}:n".to_owned(), "131".to_owned())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_lists_need_a_hash_tag() {
    let Some(cluster) = start(ServerKind::RedisCluster, || {
        KvStore::redis_cluster(None, None)
    }) else {
        return;
    };
    let store = headcount::connect(&cluster.url()).await.unwrap();
    let nodes: Vec<String> = cluster
        .servers
        .iter()
        .map(|s| format!("redis://127.0.0.1:{}", s.port))
        .collect();
    let mut conn = redis::cluster::ClusterClient::new(nodes)
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();

    // A key without a hash tag is written and read, but no index can share its slot.
    assert_eq!(store.incr("plain:n", None).await.unwrap(), 1);
    assert_eq!(store.get("plain:n").await.unwrap().as_deref(), Some("1"));
    for prefix in ["plain:", "hc:", "hc:{t"] {
        let err = store.list(prefix).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{prefix}: {err}");
        assert!(err.to_string().contains("hash tag"), "{err}");
    }
    // renew_and_list refuses before renewing anything.
    assert!(store
        .compare_and_set("plain:slot", None, "me", Some(Duration::from_secs(60)))
        .await
        .unwrap());
    let err = store
        .renew_and_list("plain:slot", "me", Duration::from_secs(1), "plain:")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let pttl: i64 = redis::cmd("PTTL")
        .arg("plain:slot")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        pttl > 2_000,
        "the refused call renewed the key: PTTL {pttl}"
    );

    // A tagged key is recorded in its tag's index, in its slot.
    store.incr("hc:{t}:a", None).await.unwrap();
    let names: Vec<String> = redis::cmd("ZRANGE")
        .arg("{t}:headcount:index")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(names, vec!["hc:{t}:a".to_owned()]);
    assert_eq!(
        store.list("hc:{t}:").await.unwrap(),
        vec![("hc:{t}:a".to_owned(), "1".to_owned())]
    );
    // The index names are not keys headcount writes.
    let err = store.incr("{t}:headcount:index", None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

/// The heartbeat reads its key with the version in one `MGET`, which answers nil for a key of
/// another Redis type: the script must still tell that apart from an absent key and refuse it as
/// foreign, renewing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_refuses_a_key_of_another_type() {
    let Some(server) = start(ServerKind::Redis, || KvStore::redis(None)) else {
        return;
    };
    let store = headcount::connect(&server.url()).await.unwrap();
    let mut conn = raw(&server.url()).await;
    let ttl = Duration::from_secs(5);
    // Absent: nothing renewed, the (empty) directory listed.
    let answer = store
        .renew_and_list_if_changed("hc:{t}:slot:0", "me", ttl, "hc:{t}:slot:", None)
        .await
        .unwrap();
    assert!(!answer.renewed);
    assert_eq!(answer.listing.as_deref(), Some(&[][..]));
    // A hash where the slot should be: refused as foreign, its TTL untouched.
    let _: () = redis::cmd("HSET")
        .arg("hc:{t}:slot:0")
        .arg("f")
        .arg("v")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = store
        .renew_and_list_if_changed("hc:{t}:slot:0", "me", ttl, "hc:{t}:slot:", None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ForeignValue, "{err}");
    assert!(err.to_string().contains("hash"), "{err}");
    let pttl: i64 = redis::cmd("PTTL")
        .arg("hc:{t}:slot:0")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(pttl, -1, "the refused call set an expiry");
    // Our own value: renewed.
    let _: () = redis::cmd("DEL")
        .arg("hc:{t}:slot:0")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(store
        .compare_and_set("hc:{t}:slot:0", None, "me", Some(ttl))
        .await
        .unwrap());
    let answer = store
        .renew_and_list_if_changed("hc:{t}:slot:0", "me", ttl, "hc:{t}:slot:", None)
        .await
        .unwrap();
    assert!(answer.renewed);
}

/// A primary of a Cluster: its node id, port and slot ranges.
type Primary = (String, u16, Vec<(u16, u16)>);

/// The primaries `CLUSTER NODES` lists.
fn cluster_nodes(text: &str) -> Vec<Primary> {
    text.lines()
        .filter(|l| l.contains("master"))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let port = f[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap();
            let ranges = f[8..]
                .iter()
                .filter(|r| !r.starts_with('['))
                .map(|r| match r.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => (r.parse().unwrap(), r.parse().unwrap()),
                })
                .collect();
            (f[0].to_owned(), port, ranges)
        })
        .collect()
}

/// A hash slot on its way from one primary (`src`) to another (`dst`): `CLUSTER SETSLOT …
/// IMPORTING` on the target, `MIGRATING` on the source, and keys moved by hand.
struct Migration {
    slot: u16,
    source: Primary,
    target: Primary,
    src: MultiplexedConnection,
    nodes: Vec<Primary>,
}

impl Migration {
    /// Starts moving the slot of hash tag `tag` to another primary.
    async fn begin(cluster: &KvStore, tag: &str) -> Migration {
        let mut any = raw(&format!("redis://127.0.0.1:{}", cluster.servers[0].port)).await;
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(format!("{{{tag}}}"))
            .query_async(&mut any)
            .await
            .unwrap();
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut any)
            .await
            .unwrap();
        let nodes = cluster_nodes(&text);
        let source = nodes
            .iter()
            .find(|(_, _, r)| r.iter().any(|&(a, b)| a <= slot && slot <= b))
            .unwrap()
            .clone();
        let target = nodes.iter().find(|n| n.0 != source.0).unwrap().clone();
        let mut src = raw(&format!("redis://127.0.0.1:{}", source.1)).await;
        let mut dst = raw(&format!("redis://127.0.0.1:{}", target.1)).await;
        let m = Migration {
            slot,
            source,
            target,
            src: src.clone(),
            nodes,
        };
        let () = m
            .setslot("IMPORTING", &m.source.0)
            .query_async(&mut dst)
            .await
            .unwrap();
        let () = m
            .setslot("MIGRATING", &m.target.0)
            .query_async(&mut src)
            .await
            .unwrap();
        m
    }

    fn setslot(&self, state: &str, id: &str) -> redis::Cmd {
        let mut c = redis::cmd("CLUSTER");
        c.arg("SETSLOT").arg(self.slot).arg(state).arg(id);
        c
    }

    /// Moves `keys` to the target.
    async fn move_keys<K: AsRef<str>>(&mut self, keys: impl IntoIterator<Item = K>) {
        let mut migrate = redis::cmd("MIGRATE");
        migrate
            .arg("127.0.0.1")
            .arg(self.target.1)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS");
        for k in keys {
            migrate.arg(k.as_ref());
        }
        let _: redis::Value = migrate.query_async(&mut self.src).await.unwrap();
    }

    /// The keys of the slot still on the source.
    async fn left(&mut self) -> Vec<String> {
        redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(self.slot)
            .arg(1000)
            .query_async(&mut self.src)
            .await
            .unwrap()
    }

    /// Gives the slot to the target on every primary.
    async fn finish(&self) {
        for (_, port, _) in &self.nodes {
            let mut c = raw(&format!("redis://127.0.0.1:{port}")).await;
            let () = self
                .setslot("NODE", &self.target.0)
                .query_async(&mut c)
                .await
                .unwrap();
        }
    }
}

/// While the slot of a group's keys migrates to another node (`CLUSTER SETSLOT … MIGRATING` /
/// `IMPORTING`, some keys moved with `MIGRATE`), a listing is whole or fails with a retryable
/// error: never a part of the keys, and never one that drops index entries for the keys that
/// moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_during_a_slot_migration_is_whole_or_retryable() {
    let Some(cluster) = start(ServerKind::RedisCluster, || {
        KvStore::redis_cluster(None, None)
    }) else {
        return;
    };
    let store = headcount::connect(&cluster.url()).await.unwrap();
    let mut want = Vec::new();
    for i in 0..20 {
        let key = format!("hc:{{m}}:{i:02}");
        store.incr(&key, None).await.unwrap();
        want.push((key, "1".to_owned()));
    }
    assert_eq!(store.list("hc:{m}:").await.unwrap(), want);
    let mut migration = Migration::begin(&cluster, "m").await;
    // Half the data keys move; the index stays on the source for now.
    migration.move_keys(want[..10].iter().map(|(k, _)| k)).await;
    for round in 0..3 {
        match store.list("hc:{m}:").await {
            Ok(got) => assert_eq!(got, want, "round {round}: a listing mid-migration"),
            Err(e) => {
                assert!(e.is_retryable(), "round {round}: {e}");
                eprintln!("round {round}: {e}");
            }
        }
    }
    // The rest moves (the other data keys, the index, the directory versions, the recorded
    // answers); the slot then belongs to the target.
    let rest = migration.left().await;
    assert!(rest.iter().any(|k| k == "{m}:headcount:index"), "{rest:?}");
    migration.move_keys(&rest).await;
    match store.list("hc:{m}:").await {
        Ok(got) => assert_eq!(
            got, want,
            "a listing with every key moved, before the slot is"
        ),
        Err(e) => {
            assert!(e.is_retryable(), "{e}");
            eprintln!("every key moved: {e}");
        }
    }
    migration.finish().await;
    // After the migration every key is listed again, none dropped from the index on the way.
    let every = Duration::from_millis(50);
    eventually(
        "every key listed after the migration",
        TEN_S,
        every,
        || async {
            match store.list("hc:{m}:").await {
                Ok(got) if got == want => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;
}

/// While a group's slot migrates, a heartbeat whose quiet marker and directory versions already
/// moved (and whose slot key did not) must not fail for good: the heartbeat declares those keys,
/// so Redis answers TRYAGAIN or ASK before the script runs (rather than "Script attempted to
/// access a non local key"), and any such error is retryable: the member tries again at its
/// next heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_during_a_slot_migration_is_retryable() {
    let Some(cluster) = start(ServerKind::RedisCluster, || {
        KvStore::redis_cluster(None, None)
    }) else {
        return;
    };
    let store = headcount::connect(&cluster.url()).await.unwrap();
    let ttl = Duration::from_secs(10);
    let key = "hc:{h}:slot:0";
    let dirs = [("hc:{h}:view:", None), ("hc:{h}:slot:", None)];
    assert!(store
        .compare_and_set(key, None, "me", Some(ttl))
        .await
        .unwrap());
    let (renewed, _) = store
        .renew_and_versions(key, "me", ttl, &dirs)
        .await
        .unwrap();
    assert!(renewed);
    let mut migration = Migration::begin(&cluster, "h").await;
    migration
        .move_keys([
            "{h}:headcount:quiet",
            "{h}:headcount:version:hc:{h}:view:",
            "{h}:headcount:version:hc:{h}:slot:",
        ])
        .await;
    for call in 0..2 {
        let answer = if call == 0 {
            store
                .renew_and_versions(key, "me", ttl, &dirs)
                .await
                .map(|_| ())
        } else {
            store
                .renew_and_list_if_changed(key, "me", ttl, "hc:{h}:slot:", None)
                .await
                .map(|_| ())
        };
        if let Err(e) = answer {
            assert!(e.is_retryable(), "call {call}: {e}");
            eprintln!("call {call}: {e}");
        }
    }
    let rest = migration.left().await;
    migration.move_keys(&rest).await;
    migration.finish().await;
    eventually("a heartbeat after the migration", TEN_S, EVERY, || async {
        store.renew_and_versions(key, "me", ttl, &dirs).await
    })
    .await;
}

/// The sweep during a slot migration: a due name whose key already moved to the target cannot be declared
/// in KEYS (the script finds it in the expiry set), so on Cluster the sweep checks that each
/// due key is on the node first and leaves the others to a later sweep. A listing of another
/// directory on the source meanwhile answers its live key; once the migration is over, the names that expired
/// are gone from the listing and the live key is still in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_during_a_slot_migration_skips_the_keys_that_moved() {
    let Some(cluster) = start(ServerKind::RedisCluster, || {
        KvStore::redis_cluster(None, None)
    }) else {
        return;
    };
    let store = headcount::connect(&cluster.url()).await.unwrap();
    let short = Duration::from_millis(200);
    let moved: Vec<String> = (0..4).map(|i| format!("hc:{{w}}:a:{i}")).collect();
    for k in &moved {
        assert!(store
            .compare_and_set(k, None, "x", Some(short))
            .await
            .unwrap());
    }
    let stay = "hc:{w}:b:0";
    assert!(store
        .compare_and_set(stay, None, "1", Some(Duration::from_secs(30)))
        .await
        .unwrap());
    // A heartbeat leaves the quiet marker (for 500 ms: its shortest life at this TTL). Every
    // script declares it, and while a slot migrates Redis answers TRYAGAIN to a script whose
    // declared keys are only partly on the node: the write below needs it still there.
    let (renewed, _) = store
        .renew_and_versions(stay, "1", Duration::from_secs(30), &[("hc:{w}:", None)])
        .await
        .unwrap();
    assert!(renewed);
    let mut migration = Migration::begin(&cluster, "w").await;
    migration.move_keys(&moved).await;
    // Their names are due once their TTL has passed; they live (or lapse) on the target.
    tokio::time::sleep(short + Duration::from_millis(50)).await;
    // A listing of another directory sweeps: every due name is on the target. (A listing of
    // their own directory fails retryably while they are away, as any listing of keys that
    // moved does: see the test above.)
    let want = vec![(stay.to_owned(), "1".to_owned())];
    let got = store.list("hc:{w}:b:").await;
    assert_eq!(
        got.expect("a listing while the due names' keys moved"),
        want
    );
    let rest = migration.left().await;
    migration.move_keys(&rest).await;
    migration.finish().await;
    eventually(
        "the live key alone after the migration",
        TEN_S,
        EVERY,
        || async {
            match store.list("hc:{w}:").await {
                Ok(got) if got == want => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;
}

async fn pttl(conn: &mut impl ConnectionLike, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

/// Asserts that both index keys outlive `key` by the 6 s margin the listing relies on (a key
/// without TTL needs them persistent, or the expiry set empty), `after` the write named.
async fn assert_index_outlives(conn: &MultiplexedConnection, key: &str, after: &str) {
    let mut conn = conn.clone();
    let k = pttl(&mut conn, key).await;
    for index in ["headcount:index", "headcount:expiry"] {
        let i = pttl(&mut conn, index).await;
        let ok = match k {
            // The expiry set is gone when it holds no name.
            -1 => i == -1 || (index == "headcount:expiry" && i == -2),
            k if k >= 0 => i == -1 || i >= k + 6_000 - 50,
            _ => true,
        };
        assert!(
            ok,
            "after {after}: {index} has PTTL {i} ms, {key} has {k} ms"
        );
    }
}

/// A write of a key the index already holds updates the index only as far as it must (the name,
/// and when the expiry moved its score and the index keys' own expiry): each kind of write that
/// moves an expiry must still keep the index keys alive past the key, else a listing would miss
/// a live key once they expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_outlives_every_key_it_holds() {
    let Some((_server, conn, store)) = redis_with_store().await else {
        return;
    };
    let ms = Duration::from_millis;
    let index_pttl = || {
        let mut conn = conn.clone();
        async move { pttl(&mut conn, "headcount:index").await }
    };
    let check = |what: &'static str| assert_index_outlives(&conn, "hc:k", what);

    // Created with a short TTL, then extended by each primitive that can.
    store.incr("hc:k", Some(ms(200))).await.unwrap();
    check("incr creating the key").await;
    assert!(store.expire("hc:k", ms(60_000)).await.unwrap());
    check("expire extending it").await;
    assert!(store
        .compare_and_set("hc:k", Some("1"), "1", Some(ms(120_000)))
        .await
        .unwrap());
    check("compare_and_set extending it").await;
    assert!(store.set_max("hc:k", 5, Some(ms(240_000))).await.unwrap());
    check("set_max extending it").await;
    assert_eq!(store.incr("hc:k", Some(ms(1))).await.unwrap(), 6);
    check("incr leaving its expiry").await;
    // Without TTL the index keys must not expire; with one again they may.
    assert!(store
        .compare_and_set("hc:k", Some("6"), "7", None)
        .await
        .unwrap());
    check("compare_and_set removing the TTL").await;
    assert_eq!(index_pttl().await, -1);
    assert!(store.expire("hc:k", ms(30_000)).await.unwrap());
    check("expire giving a TTL back").await;
    assert!(index_pttl().await > 0);
    // Shortened: the index may expire sooner, never before the key.
    assert!(store.expire("hc:k", ms(300)).await.unwrap());
    check("expire shortening it").await;
    assert_eq!(
        store.list("hc:").await.unwrap(),
        vec![("hc:k".to_owned(), "7".to_owned())]
    );

    // Deleting what is not there changes no directory: a group member's heartbeat would
    // otherwise read its slot table again for nothing.
    store.incr("hc:d:a", None).await.unwrap();
    let version = || {
        let mut conn = conn.clone();
        async move {
            let v: Option<String> = redis::cmd("GET")
                .arg("headcount:version:hc:d:")
                .query_async(&mut conn)
                .await
                .unwrap();
            v.expect("the directory has a version")
        }
    };
    let v1 = version().await;
    assert!(!store.delete("hc:d:absent").await.unwrap());
    assert_eq!(
        version().await,
        v1,
        "a delete of nothing changed the version"
    );
    assert!(store.delete("hc:d:a").await.unwrap());
    let v2 = version().await;
    // `<µs>.<random>`: the number goes up.
    let number = |v: &str| v.split('.').next().unwrap().parse::<u64>().unwrap();
    assert!(number(&v2) > number(&v1), "{v2} after {v1}");
}

/// What other clients do to headcount's keys (a longer TTL, a `PERSIST`) and a lost expiry set
/// must not let the index keys expire before a live key they hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_outlives_keys_other_clients_changed() {
    let Some((_server, conn, store)) = redis_with_store().await else {
        return;
    };
    let ms = Duration::from_millis;
    let raw_cmd = |args: &'static [&'static str]| {
        let mut conn = conn.clone();
        async move {
            let mut cmd = redis::cmd(args[0]);
            for a in &args[1..] {
                cmd.arg(*a);
            }
            let _: redis::Value = cmd.query_async(&mut conn).await.unwrap();
        }
    };
    let check = |key: &'static str, what: &'static str| assert_index_outlives(&conn, key, what);

    // Another client extends a key's TTL; a later write's sweep re-scores it, and the index
    // keys must follow.
    store.incr("hc:a", Some(ms(300))).await.unwrap();
    store.incr("hc:b", Some(ms(60_000))).await.unwrap();
    raw_cmd(&["PEXPIRE", "hc:a", "120000"]).await;
    tokio::time::sleep(ms(400)).await;
    store.incr("hc:b", Some(ms(60_000))).await.unwrap();
    check("hc:a", "a sweep re-scoring a key another client extended").await;

    // Another client persists a counter; the next increment keeps the index persistent.
    raw_cmd(&["PERSIST", "hc:b"]).await;
    store.incr("hc:b", None).await.unwrap();
    check("hc:b", "an increment of a counter another client persisted").await;

    // The expiry set is lost while the index keeps an expiry; a write that removes a TTL must
    // still make the index persistent.
    raw_cmd(&["DEL", "hc:b"]).await;
    store.delete("hc:b").await.unwrap();
    store
        .compare_and_set("hc:c", None, "x", Some(ms(60_000)))
        .await
        .unwrap();
    raw_cmd(&["DEL", "headcount:expiry"]).await;
    assert!(store
        .compare_and_set("hc:c", Some("x"), "y", None)
        .await
        .unwrap());
    check(
        "hc:c",
        "a write removing a TTL after the expiry set was lost",
    )
    .await;
}
