//! Which backends the recipe suites' scenarios run on: the one table,
//! [`scenario_tests!`](crate::scenario_tests).
//!
//! The store conformance cases ([`CASES`](headcount_conformance::CASES)) run on every backend, through
//! [`conformance_tests!`](crate::conformance_tests). The recipe suites (`tests/distributor.rs`,
//! `tests/fence.rs`, `tests/ids.rs`) test what is built on a store, or beside one, and each of
//! their scenario families runs on the backends listed for it in
//! [`scenario_tests!`](crate::scenario_tests), which also says why the others are left out. A
//! family's scenarios are plain `async fn name(backend: ServerKind)` in the suite; the macro turns
//! each into one `#[test]` per backend of its family, `<family>::<backend>::<name>`, so a
//! failure names its case and its backend.
//!
//! A scenario reaches its servers through the [harness](crate): a missing server
//! skips it (`SKIP` line) unless `HEADCOUNT_REQUIRE_BACKENDS` requires the backend.

/// Expands to a module named `$family` holding one module per backend of the family (named
/// after the backend: `sqlite`, `postgres`, `redis`, ...), built only with that backend's cargo
/// feature, each holding one
/// `#[tokio::test(flavor = "multi_thread", worker_threads = $workers)]` per case, which calls
/// the suite's `async fn $case(backend: ServerKind)` with that backend.
///
/// ```ignore
/// // tests/distributor.rs
/// async fn failover_and_return(backend: ServerKind) { /* ... */ }
/// headcount_harness::scenario_tests!(distributor, workers = 2: [failover_and_return]);
/// ```
///
/// The arms of this macro are the table: one per family, listing its backends and, in a
/// comment, why the other backends are left out.
#[macro_export]
macro_rules! scenario_tests {
    // The Distributor (tests/distributor.rs): its registrations, units, table and per-service
    // records are ordinary keys, so it runs on every store other processes can share.
    // Left out: memory, a store of one process only (headcount-core's own distributor tests run
    // on it).
    (distributor, workers = $workers:literal: $cases:tt) => {
        $crate::__scenario_backends! { distributor, $workers, $cases,
            sqlite Sqlite "sqlite",
            postgres Postgres "postgres",
            pgbouncer PgBouncer "postgres",
            redis Redis "redis",
            redis_cluster RedisCluster "redis",
            etcd Etcd "etcd",
            etcd_cluster EtcdCluster "etcd",
        }
    };
    // PgFence (tests/fence.rs): a guard table inside the sink's own PostgreSQL transaction,
    // driven through a tokio-postgres client, not a Store. Only PostgreSQL has one; through
    // PgBouncer in transaction mode too, where the sink's client has no named prepared
    // statements.
    (fence_postgres, workers = $workers:literal: $cases:tt) => {
        $crate::__scenario_backends! { fence_postgres, $workers, $cases,
            postgres Postgres "postgres",
            pgbouncer PgBouncer "postgres",
        }
    };
    // RedisFence (tests/fence.rs): a Lua script over a Redis connection, not a Store. One
    // server; the Cluster's one-slot rule is the family below.
    (fence_redis, workers = $workers:literal: $cases:tt) => {
        $crate::__scenario_backends! { fence_redis, $workers, $cases, redis Redis "redis", }
    };
    // RedisFence on Redis Cluster: the fence and data keys must share a hash slot.
    (fence_redis_cluster, workers = $workers:literal: $cases:tt) => {
        $crate::__scenario_backends! { fence_redis_cluster, $workers, $cases, redis_cluster RedisCluster "redis", }
    };
    // Majority IDs over five Redis servers each started with chosen persistence flags
    // (appendonly, appendfsync), killed and restarted: what these cases vary is Redis's own
    // persistence. The other backends' majorities are the families below.
    (ids_redis, workers = $workers:literal: $cases:tt) => {
        $crate::__scenario_backends! { ids_redis, $workers, $cases, redis Redis "redis", }
    };
    // Majority IDs over SQLite files alone: bad input and the in-process mediator need no
    // server. The server backends run the other families.
    (ids_sqlite, workers = $workers:literal: $cases:tt) => {
        $crate::__scenario_backends! { ids_sqlite, $workers, $cases, sqlite Sqlite "sqlite", }
    };
    // Majority IDs over a mixed set, three SQLite files and two PostgreSQL servers started with
    // fsync on: PostgreSQL is the server the set needs (SQLite is embedded).
    (ids_mixed, workers = $workers:literal: $cases:tt) => {
        $crate::__scenario_backends! { ids_mixed, $workers, $cases, postgres Postgres "postgres", }
    };
    // One server behind several URLs is one vote: each backend with a way to name one server
    // twice (two Redis databases, one PostgreSQL server connected twice, one SQLite file spelt
    // two ways). Not written for etcd (which names a server by the endpoint it connects to) or
    // the clusters.
    (ids_one_server, workers = $workers:literal: $cases:tt) => {
        $crate::__scenario_backends! { ids_one_server, $workers, $cases,
            redis Redis "redis",
            sqlite Sqlite "sqlite",
            postgres Postgres "postgres",
        }
    };
    // The durability probe against servers started with known settings. Left out: SQLite, which
    // has no server to start (the durability_probe conformance case checks its verdict); not
    // written for the clusters.
    (ids_durability, workers = $workers:literal: $cases:tt) => {
        $crate::__scenario_backends! { ids_durability, $workers, $cases,
            redis Redis "redis",
            postgres Postgres "postgres",
            etcd Etcd "etcd",
        }
    };
}

/// One module per backend, each with every case of `$cases`.
#[doc(hidden)]
#[macro_export]
macro_rules! __scenario_backends {
    ($family:ident, $workers:literal, $cases:tt, $($module:ident $backend:ident $feature:literal,)*) => {
        mod $family {
            $(
                #[cfg(feature = $feature)]
                mod $module {
                    $crate::__scenario_cases! { $workers, $backend, $cases }
                }
            )*
        }
    };
}

/// One test per case, against one backend.
#[doc(hidden)]
#[macro_export]
macro_rules! __scenario_cases {
    ($workers:literal, $backend:ident, [$($case:ident),* $(,)?]) => {
        $(
            #[$crate::__private::tokio::test(
                crate = "::headcount_harness::__private::tokio",
                flavor = "multi_thread",
                worker_threads = $workers
            )]
            async fn $case() {
                super::super::$case($crate::ServerKind::$backend).await;
            }
        )*
    };
}
