//! The fencing guards for sinks, on real servers: `PgFence` on PostgreSQL, `RedisFence` on Redis
//! and Redis Cluster (servers from the harness, or `HEADCOUNT_TEST_<BACKEND>_URL`).
//!
//! A test whose server is missing prints `SKIP` and passes, unless `HEADCOUNT_REQUIRE_BACKENDS`
//! requires the backend: then it fails.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use headcount::fence::{Fence, FencingToken};
use headcount_harness::ServerKind;

/// The shared store's URL, or None (with a SKIP line) when the backend is missing and not
/// required.
async fn url(backend: ServerKind, test: &str) -> Option<String> {
    backend
        .shared_or_skip(&format!("{}::{test}", backend.name()))
        .await
}

const fn t(n: u64) -> FencingToken {
    FencingToken::new(n)
}

/// The rule every fence keeps, through the one [`Fence`] trait, on a `resource` never used
/// before: an older token is refused, an equal or newer one admitted and read back.
async fn keeps_the_rule<F: Fence<C>, C: Send>(fence: &F, conn: &mut C, resource: &str) {
    assert_eq!(fence.current(conn, resource).await.unwrap(), None);
    assert!(fence.admit(conn, resource, t(5)).await.unwrap());
    assert!(!fence.admit(conn, resource, t(4)).await.unwrap());
    assert!(fence.admit(conn, resource, t(5)).await.unwrap());
    assert_eq!(fence.current(conn, resource).await.unwrap(), Some(t(5)));
    assert!(fence.admit(conn, resource, t(6)).await.unwrap());
    assert_eq!(fence.current(conn, resource).await.unwrap(), Some(t(6)));
}

fn unique(name: &str) -> String {
    format!("{name}_{:016x}", rand::random::<u64>())
}

#[cfg(feature = "postgres")]
mod pg_fence {
    use super::*;
    use headcount::postgres::FencedOutcome;
    use headcount::{ErrorKind, PgFence};
    use tokio_postgres::types::Type;
    use tokio_postgres::{Client, NoTls};

    async fn connect_pg(url: &str) -> Client {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    /// A fence and a sink table `(id serial, resource, token, writer)` of their own.
    async fn setup(url: &str) -> (Client, PgFence, String) {
        let client = connect_pg(url).await;
        let fence = PgFence::new(&unique("fence")).unwrap();
        fence.ensure_table(&client).await.unwrap();
        // Idempotent.
        fence.ensure_table(&client).await.unwrap();
        let sink = unique("sink");
        client
            .batch_execute(&format!(
                "CREATE TABLE {sink} (id bigserial PRIMARY KEY, resource text NOT NULL,
                                      token bigint NOT NULL, writer int NOT NULL)"
            ))
            .await
            .unwrap();
        (client, fence, sink)
    }

    fn insert(sink: &str) -> String {
        format!("INSERT INTO {sink} (resource, token, writer) SELECT $1, token, $3 FROM hc_fence")
    }

    /// `fence.execute_fenced` of `write` by `writer` (its `$3`). Through PgBouncer, whose
    /// transaction pooling keeps no named prepared statement from one call to the next,
    /// `execute_fenced_typed`.
    async fn write_fenced(
        backend: ServerKind,
        fence: &PgFence,
        client: &Client,
        write: &str,
        resource: &str,
        token: FencingToken,
        writer: i32,
    ) -> headcount::Result<FencedOutcome> {
        if backend == ServerKind::PgBouncer {
            fence
                .execute_fenced_typed(client, write, resource, token, &[(&writer, Type::INT4)])
                .await
        } else {
            fence
                .execute_fenced(client, write, resource, token, &[&writer])
                .await
        }
    }

    async fn sink_tokens(client: &Client, sink: &str, resource: &str) -> Vec<(i64, i32)> {
        client
            .query_typed(
                &format!("SELECT token, writer FROM {sink} WHERE resource = $1 ORDER BY id"),
                &[(&resource, Type::TEXT)],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    pub(super) async fn pg_older_token_rejected_equal_admitted(backend: ServerKind) {
        let Some(url) = url(backend, "pg_older_token_rejected_equal_admitted").await else {
            return;
        };
        let (client, fence, sink) = setup(&url).await;
        let write = insert(&sink);
        let newer = write_fenced(backend, &fence, &client, &write, "r", t(5), 1)
            .await
            .unwrap();
        assert!(newer.admitted);
        assert_eq!(newer.rows, 1);
        let older = write_fenced(backend, &fence, &client, &write, "r", t(3), 2)
            .await
            .unwrap();
        assert!(!older.admitted);
        assert_eq!(older.rows, 0, "a refused write wrote rows");
        let equal = write_fenced(backend, &fence, &client, &write, "r", t(5), 3)
            .await
            .unwrap();
        assert!(equal.admitted && equal.rows == 1, "{equal:?}");
        assert_eq!(sink_tokens(&client, &sink, "r").await, vec![(5, 1), (5, 3)]);
        assert_eq!(fence.current(&client, "r").await.unwrap(), Some(t(5)));

        // The plain statement of `fenced`, run by the caller: nothing written when refused.
        let sql = fence.fenced(&write);
        let typed = |token: i64, writer: i32| {
            let (sql, client) = (&sql, &client);
            async move {
                let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 3] = [
                    (&"r", Type::TEXT),
                    (&token, Type::INT8),
                    (&writer, Type::INT4),
                ];
                client.execute_typed(sql, &params).await.unwrap()
            }
        };
        let n = typed(4, 4).await;
        assert_eq!(n, 0, "the fenced statement wrote with an older token");
        let n = typed(6, 5).await;
        assert_eq!(n, 1);
        assert_eq!(
            sink_tokens(&client, &sink, "r").await,
            vec![(5, 1), (5, 3), (6, 5)]
        );

        // `admit` alone, per resource: another resource has its own highest token.
        assert!(fence.admit(&client, "other", t(2)).await.unwrap());
        assert!(!fence.admit(&client, "other", t(1)).await.unwrap());
        assert!(fence.admit(&client, "other", t(2)).await.unwrap());
        assert!(fence
            .admit(&client, "other", t(i64::MAX as u64))
            .await
            .unwrap());
        assert_eq!(fence.current(&client, "r").await.unwrap(), Some(t(6)));
        assert_eq!(fence.current(&client, "none").await.unwrap(), None);

        // Inside the caller's transaction: rolled back, the admission is gone too.
        let mut tx_client = connect_pg(&url).await;
        let tx = tx_client.transaction().await.unwrap();
        assert!(fence.admit(&tx, "r", t(9)).await.unwrap());
        tx.rollback().await.unwrap();
        assert_eq!(fence.current(&client, "r").await.unwrap(), Some(t(6)));

        // The same rule through the `Fence` trait.
        let mut client = client;
        keeps_the_rule(&fence, &mut client, "trait").await;
    }

    pub(super) async fn pg_concurrent_writers_commit_in_token_order(backend: ServerKind) {
        let Some(url) = url(backend, "pg_concurrent_writers_commit_in_token_order").await else {
            return;
        };
        let (client, fence, sink) = setup(&url).await;
        const WRITERS: i32 = 16;
        const WRITES: usize = 20;
        let mut tasks = Vec::new();
        for writer in 0..WRITERS {
            let (url, fence, write) = (url.clone(), fence.clone(), insert(&sink));
            tasks.push(tokio::spawn(async move {
                let client = connect_pg(&url).await;
                let mut tried = Vec::new();
                for i in 0..WRITES as u64 {
                    // Tokens creep up with jitter, as epochs do with owners racing: many are
                    // admitted, and many arrive after a newer one.
                    let token = i * 10 + rand::random_range(0..40_u64);
                    let out =
                        write_fenced(backend, &fence, &client, &write, "hot", t(token), writer)
                            .await
                            .unwrap();
                    assert_eq!(out.rows, u64::from(out.admitted), "{out:?}");
                    tried.push((token, out.admitted));
                }
                tried
            }));
        }
        let mut tried = Vec::new();
        for t in tasks {
            tried.extend(t.await.unwrap());
        }
        let max = tried.iter().map(|(t, _)| *t).max().unwrap();
        let admitted = tried.iter().filter(|(_, a)| *a).count();
        let rows = sink_tokens(&client, &sink, "hot").await;
        assert_eq!(rows.len(), admitted, "one sink row per admitted write");
        // In commit order (the serial column), every admitted token is >= all before it.
        for pair in rows.windows(2) {
            assert!(
                pair[0].0 <= pair[1].0,
                "token {} committed after {}: {rows:?}",
                pair[1].0,
                pair[0].0
            );
        }
        assert_eq!(fence.current(&client, "hot").await.unwrap(), Some(t(max)));
        assert_eq!(rows.last().map(|r| r.0 as u64), Some(max));
        println!(
            "pg fence: {} writes, {admitted} admitted, max token {max}",
            tried.len()
        );
    }

    pub(super) async fn pg_bad_input_is_invalid_argument(backend: ServerKind) {
        for bad in ["fence; DROP TABLE x", "1fence", "", "a.b", "fence\"x"] {
            assert_eq!(
                PgFence::new(bad).unwrap_err().kind(),
                ErrorKind::InvalidArgument,
                "{bad:?}"
            );
        }
        let Some(url) = url(backend, "pg_bad_input_is_invalid_argument").await else {
            return;
        };
        let (client, fence, sink) = setup(&url).await;
        let too_big = t(i64::MAX as u64 + 1);
        let e = fence.admit(&client, "r", too_big).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        let e = fence
            .execute_fenced(&client, &insert(&sink), "r", t(u64::MAX), &[&1_i32])
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert_eq!(fence.current(&client, "r").await.unwrap(), None);
        assert!(sink_tokens(&client, &sink, "r").await.is_empty());
    }
}

#[cfg(feature = "redis")]
mod redis_fence {
    use super::*;
    use headcount::{ErrorKind, RedisFence};
    use redis::aio::{ConnectionLike, MultiplexedConnection};
    use redis::AsyncCommands as _;
    use std::time::Duration;

    async fn single(backend: ServerKind) -> Option<MultiplexedConnection> {
        let url = url(backend, "redis_fence").await?;
        let client = redis::Client::open(url).unwrap();
        Some(client.get_multiplexed_async_connection().await.unwrap())
    }

    async fn get<C: ConnectionLike + Send>(conn: &mut C, key: &str) -> Option<String> {
        redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
    }

    pub(super) async fn redis_older_token_rejected_equal_admitted(backend: ServerKind) {
        let Some(mut conn) = single(backend).await else {
            return;
        };
        let tag = unique("t");
        let (fk, dk) = (format!("fence:{{{tag}}}"), format!("data:{{{tag}}}"));
        let fence = RedisFence::new();
        assert!(fence
            .fenced_set(&mut conn, &fk, t(5), &dk, "v5", None)
            .await
            .unwrap());
        assert!(!fence
            .fenced_set(&mut conn, &fk, t(3), &dk, "v3", None)
            .await
            .unwrap());
        assert_eq!(get(&mut conn, &dk).await.as_deref(), Some("v5"));
        assert_eq!(get(&mut conn, &fk).await.as_deref(), Some("5"));
        assert!(fence
            .fenced_set(
                &mut conn,
                &fk,
                t(5),
                &dk,
                "v5b",
                Some(Duration::from_secs(60))
            )
            .await
            .unwrap());
        assert_eq!(get(&mut conn, &dk).await.as_deref(), Some("v5b"));
        let data_ttl: i64 = conn.pttl(&dk).await.unwrap();
        let fence_ttl: i64 = conn.pttl(&fk).await.unwrap();
        assert!(data_ttl > 0 && data_ttl <= 60_000, "{data_ttl}");
        assert_eq!(fence_ttl, -1, "the fence key must never expire");

        // admit alone; decimal comparison beyond 2^53 (where doubles collide) and up to u64::MAX.
        let ak = format!("admit:{{{tag}}}");
        assert!(fence
            .admit(&mut conn, &ak, t(9_007_199_254_740_993))
            .await
            .unwrap());
        assert!(!fence
            .admit(&mut conn, &ak, t(9_007_199_254_740_992))
            .await
            .unwrap());
        assert!(fence
            .admit(&mut conn, &ak, t(9_007_199_254_740_993))
            .await
            .unwrap());
        assert!(!fence.admit(&mut conn, &ak, t(10)).await.unwrap());
        assert!(fence.admit(&mut conn, &ak, t(u64::MAX)).await.unwrap());
        assert!(!fence.admit(&mut conn, &ak, t(u64::MAX - 1)).await.unwrap());
        assert_eq!(
            get(&mut conn, &ak).await.as_deref(),
            Some("18446744073709551615")
        );
        assert_eq!(
            fence.current(&mut conn, &ak).await.unwrap(),
            Some(t(u64::MAX))
        );

        // The same rule through the `Fence` trait, the fence key as the resource.
        let tk = format!("trait:{{{tag}}}");
        keeps_the_rule(&fence, &mut conn, &tk).await;
        let _: () = redis::cmd("DEL")
            .arg(&fk)
            .arg(&dk)
            .arg(&ak)
            .arg(&tk)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    pub(super) async fn redis_foreign_fence_value_is_typed(backend: ServerKind) {
        let Some(mut conn) = single(backend).await else {
            return;
        };
        let tag = unique("f");
        let (fk, dk) = (format!("fence:{{{tag}}}"), format!("data:{{{tag}}}"));
        let fence = RedisFence::new();
        for bad in ["abc", "007", "-1", "18446744073709551616", ""] {
            let _: () = conn.set(&fk, bad).await.unwrap();
            let e = fence
                .fenced_set(&mut conn, &fk, t(1), &dk, "v", None)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ForeignValue, "{bad:?}: {e}");
            let e = fence.current(&mut conn, &fk).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ForeignValue, "current of {bad:?}: {e}");
            assert_eq!(get(&mut conn, &fk).await.as_deref(), Some(bad));
            assert_eq!(get(&mut conn, &dk).await, None, "data written past {bad:?}");
        }
        let _: () = conn.del(&fk).await.unwrap();
        let _: () = conn.rpush(&fk, "x").await.unwrap();
        let e = fence.admit(&mut conn, &fk, t(1)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ForeignValue, "{e}");
        // Bad arguments are refused before anything is sent.
        let e = fence
            .fenced_set(&mut conn, &dk, t(1), &dk, "v", None)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        let e = fence.admit(&mut conn, "", t(1)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        let _: () = conn.del(&fk).await.unwrap();
    }

    pub(super) async fn redis_concurrent_writers_end_at_the_max(backend: ServerKind) {
        let Some(conn) = single(backend).await else {
            return;
        };
        let tag = unique("c");
        let (fk, dk) = (format!("fence:{{{tag}}}"), format!("data:{{{tag}}}"));
        let fence = RedisFence::new();
        let mut tasks = Vec::new();
        for writer in 0..16 {
            let (mut conn, fence, fk, dk) = (conn.clone(), fence.clone(), fk.clone(), dk.clone());
            tasks.push(tokio::spawn(async move {
                let mut tried = Vec::new();
                for i in 0..20_u64 {
                    let token = i * 10 + rand::random_range(0..40_u64);
                    let value = format!("{token}:{writer}:{i}");
                    let ok = fence
                        .fenced_set(&mut conn, &fk, t(token), &dk, &value, None)
                        .await
                        .unwrap();
                    tried.push((token, ok));
                }
                tried
            }));
        }
        let mut tried = Vec::new();
        for t in tasks {
            tried.extend(t.await.unwrap());
        }
        let max = tried.iter().map(|(t, _)| *t).max().unwrap();
        let mut conn = conn;
        assert_eq!(get(&mut conn, &fk).await, Some(max.to_string()));
        // The last admitted write carries the highest token: nothing older overwrote it.
        let data = get(&mut conn, &dk).await.unwrap();
        assert_eq!(
            data.split(':').next(),
            Some(max.to_string().as_str()),
            "{data}"
        );
        assert!(tried.iter().any(|(t, ok)| *t == max && *ok));
        let admitted = tried.iter().filter(|(_, ok)| *ok).count();
        println!(
            "redis fence: {} writes, {admitted} admitted, max token {max}",
            tried.len()
        );
        let _: () = conn.del(&[&fk, &dk]).await.unwrap();
    }

    /// The key's hash slot, as the server computes it.
    async fn keyslot<C: ConnectionLike + Send>(conn: &mut C, key: &str) -> i64 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(conn)
            .await
            .unwrap()
    }

    pub(super) async fn redis_cluster_needs_one_slot(backend: ServerKind) {
        let Some(url) = url(backend, "redis_cluster_needs_one_slot").await else {
            return;
        };
        let nodes: Vec<String> = url
            .trim_start_matches("redis+cluster://")
            .split('?')
            .next()
            .unwrap()
            .split(',')
            .map(|h| format!("redis://{h}"))
            .collect();
        let client = redis::cluster::ClusterClient::new(nodes).unwrap();
        let mut conn = client.get_async_connection().await.unwrap();
        let fence = RedisFence::new();
        let tag = unique("s");
        let (fk, dk) = (format!("fence:{{{tag}}}"), format!("data:{{{tag}}}"));
        assert!(fence
            .fenced_set(&mut conn, &fk, t(2), &dk, "v", None)
            .await
            .unwrap());
        assert!(!fence
            .fenced_set(&mut conn, &fk, t(1), &dk, "old", None)
            .await
            .unwrap());
        assert_eq!(get(&mut conn, &dk).await.as_deref(), Some("v"));
        // A data key in another slot: a typed error, no panic, nothing written.
        let fence_slot = keyslot(&mut conn, &fk).await;
        let mut other = String::new();
        for i in 0.. {
            other = format!("data:{{{tag}-{i}}}");
            if keyslot(&mut conn, &other).await != fence_slot {
                break;
            }
        }
        let e = fence
            .fenced_set(&mut conn, &fk, t(3), &other, "v", None)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("hash slot"), "{e}");
        assert_eq!(get(&mut conn, &fk).await.as_deref(), Some("2"));
        assert_eq!(get(&mut conn, &other).await, None);
        let _: () = conn.del(&fk).await.unwrap();
        let _: () = conn.del(&dk).await.unwrap();
    }
}

// Which backends: the `fence_*` rows of the table in headcount_harness::scenario_tests.
#[cfg(feature = "postgres")]
use pg_fence::{
    pg_bad_input_is_invalid_argument, pg_concurrent_writers_commit_in_token_order,
    pg_older_token_rejected_equal_admitted,
};
headcount_harness::scenario_tests!(fence_postgres, workers = 4: [
    pg_older_token_rejected_equal_admitted,
    pg_concurrent_writers_commit_in_token_order,
    pg_bad_input_is_invalid_argument,
]);

#[cfg(feature = "redis")]
use redis_fence::{
    redis_cluster_needs_one_slot, redis_concurrent_writers_end_at_the_max,
    redis_foreign_fence_value_is_typed, redis_older_token_rejected_equal_admitted,
};
headcount_harness::scenario_tests!(fence_redis, workers = 4: [
    redis_older_token_rejected_equal_admitted,
    redis_foreign_fence_value_is_typed,
    redis_concurrent_writers_end_at_the_max,
]);
headcount_harness::scenario_tests!(fence_redis_cluster, workers = 4: [
    redis_cluster_needs_one_slot,
]);
