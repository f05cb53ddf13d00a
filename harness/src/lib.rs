//! The server harness: where each backend's tests find a store.
//!
//! For each backend, in order:
//!
//! 1. `HEADCOUNT_TEST_<BACKEND>_URL` (`HEADCOUNT_TEST_POSTGRES_URL`, `…_PGBOUNCER_URL`,
//!    `…_SQLITE_URL`, `…_REDIS_URL`, `…_REDIS_CLUSTER_URL`, `…_REDIS_SENTINEL_URL`, `…_ETCD_URL`,
//!    `…_ETCD_CLUSTER_URL`) when set: the tests use that store, and the fault cases (which must
//!    kill the server) are skipped.
//! 2. Else the server binary (PostgreSQL's `initdb` and `postgres`, from PATH or
//!    `/usr/lib/postgresql/*/bin`, or only from `HEADCOUNT_TEST_POSTGRES_BIN_DIR` when set, run
//!    as the `postgres` user when the tests run as root; `pgbouncer` in front of a PostgreSQL of
//!    its own; `redis-server` and `redis-cli`; `etcd`),
//!    started on free loopback ports in a temp dir: one server, or for the cluster backends a
//!    3-primary Redis Cluster (`redis-cli --cluster create`), a primary and a replica behind three
//!    Sentinels (`redis-server --sentinel`, no other binary), or a 3-member etcd cluster. One
//!    shared store per backend per test process, started on first use; each fault case gets one
//!    of its own, reached through a TCP proxy ([`Proxy`]) so it can also cut the connection.
//!    SQLite needs no server: a file in a temp dir.
//! 3. Else, with the `containers` feature and a reachable Docker engine, a container
//!    (testcontainers).
//! 4. Else the test prints `SKIP <backend>::<case>: <what to install>` to stderr and passes,
//!    unless `HEADCOUNT_REQUIRE_BACKENDS` is `all` or a comma list naming the backend: then it
//!    fails with that message. Every test of the workspace applies this rule through
//!    [`available`] (or [`skip_unless_required`], [`ServerKind::shared_or_skip`]).
//!
//! Servers the harness starts die with the test process: they are spawned from one long-lived
//! thread with `PR_SET_PDEATHSIG`, and an exit hook stops them and removes their directories.

pub mod history;
mod kv_servers;
pub mod netns;
mod pgbouncer;
mod postgres;
mod process;
mod proxy;
mod sqlite;

#[cfg(feature = "containers")]
mod containers;

pub mod scenarios;

use std::io::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use headcount_conformance::{Case, Ctx, Needs, ServerControl};

pub use kv_servers::{KvControl, KvServer, KvStore, SENTINEL_MASTER};
pub use pgbouncer::{PgBouncer, PgBouncerControl};
pub use postgres::{find_bin_dir as find_postgres_bin_dir, PgControl, PgServer};
pub use process::cleanup;
pub use proxy::{check_call_after_healed_stall, Direction, Proxied, Proxy, Upstream};

/// The per-operation deadline (the URL's `timeout` option) of the store a fault case gets: the
/// cases expect each call to fail within it once the server is killed or paused.
pub const FAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);

/// A case still running after this long fails.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(180);

/// The environment variable naming which backends must be available: `all`, or a comma list
/// such as `postgres,sqlite`.
pub const REQUIRE_VAR: &str = "HEADCOUNT_REQUIRE_BACKENDS";

/// Which server the harness starts (or finds) to provide a store of one backend; named apart
/// from the [`Backend`](headcount::backend::Backend) trait that a backend's store implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ServerKind {
    /// headcount's in-memory store (`memory://`): no server, this process only.
    Memory,
    /// Embedded SQLite: a file in a temp dir.
    Sqlite,
    /// PostgreSQL: a server started from its binaries.
    Postgres,
    /// PostgreSQL through PgBouncer in transaction mode (the PostgreSQL backend, behind the
    /// pooler most production PostgreSQL sits behind): both started from their binaries.
    PgBouncer,
    /// Redis: one `redis-server`.
    Redis,
    /// Redis Cluster: three `redis-server` primaries joined by `redis-cli --cluster create`.
    RedisCluster,
    /// Redis behind Sentinel: a primary, one replica and three Sentinels
    /// (`redis-server --sentinel`), reached by `redis+sentinel://`.
    RedisSentinel,
    /// etcd: one member.
    Etcd,
    /// etcd: a cluster of three members.
    EtcdCluster,
}

/// Why the harness cannot give a case the store it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// The backend is not available here (no binary, no URL, no Docker): the message says what
    /// to install. A skip, or a failure when the backend is required.
    Missing(String),
    /// The backend is here but could not be started. Always a failure.
    Failed(String),
    /// This case cannot run on this setup (a fault case against a store the harness did not
    /// start). Always a skip.
    NotApplicable(String),
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::Missing(m) | Unavailable::Failed(m) | Unavailable::NotApplicable(m) => {
                f.write_str(m)
            }
        }
    }
}

/// A store for one case alone, with control over its server.
#[derive(Debug)]
pub struct Dedicated {
    /// The store URL.
    pub url: String,
    /// Control over the server's processes.
    pub control: Arc<dyn ServerControl>,
}

impl ServerKind {
    /// The backend's name, as in test names and `HEADCOUNT_REQUIRE_BACKENDS`.
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Memory => "memory",
            ServerKind::Sqlite => "sqlite",
            ServerKind::Postgres => "postgres",
            ServerKind::PgBouncer => "pgbouncer",
            ServerKind::Redis => "redis",
            ServerKind::RedisCluster => "redis_cluster",
            ServerKind::RedisSentinel => "redis_sentinel",
            ServerKind::Etcd => "etcd",
            ServerKind::EtcdCluster => "etcd_cluster",
        }
    }

    /// The variable that points the tests at an existing store: `HEADCOUNT_TEST_<BACKEND>_URL`.
    pub fn url_var(self) -> String {
        format!("HEADCOUNT_TEST_{}_URL", self.name().to_ascii_uppercase())
    }

    /// Whether `HEADCOUNT_REQUIRE_BACKENDS` requires this backend.
    pub fn required(self) -> bool {
        std::env::var(REQUIRE_VAR).is_ok_and(|v| {
            v.split(',')
                .map(str::trim)
                .any(|b| b.eq_ignore_ascii_case("all") || b.eq_ignore_ascii_case(self.name()))
        })
    }

    /// Whether the `headcount` crate these tests link has this backend (its cargo feature, which
    /// the crate under test turns on: the harness has no backend features of its own). A URL of
    /// the backend's scheme that no server answers is refused at once with
    /// `Error::FeatureDisabled` when it has not; any other answer, or none within a second, means
    /// the backend is there.
    async fn compiled(self) -> Result<(), Unavailable> {
        static COMPILED: Mutex<Vec<(ServerKind, bool)>> = Mutex::new(Vec::new());
        let known = lock(&COMPILED)
            .iter()
            .find(|(kind, _)| *kind == self)
            .map(|(_, on)| *on);
        let on = match known {
            Some(on) => on,
            None => {
                let probe = match self {
                    ServerKind::Memory => "memory://",
                    ServerKind::Sqlite => "sqlite::memory:",
                    ServerKind::Postgres | ServerKind::PgBouncer => "postgres://127.0.0.1:1/probe",
                    ServerKind::Redis | ServerKind::RedisCluster | ServerKind::RedisSentinel => {
                        "redis://127.0.0.1:1/"
                    }
                    ServerKind::Etcd | ServerKind::EtcdCluster => "etcd://127.0.0.1:1",
                };
                let answer =
                    tokio::time::timeout(Duration::from_secs(1), headcount::connect_plain(probe))
                        .await;
                let on = !matches!(answer, Ok(Err(headcount::Error::FeatureDisabled { .. })));
                lock(&COMPILED).push((self, on));
                on
            }
        };
        if on {
            Ok(())
        } else {
            Err(Unavailable::Missing(format!(
                "headcount was built without its `{}` feature",
                self.name()
            )))
        }
    }

    /// The URL of this process's shared store for the backend, starting its server on first use.
    pub async fn shared(self) -> Result<String, Unavailable> {
        self.compiled().await?;
        if let Ok(url) = std::env::var(self.url_var()) {
            return Ok(url);
        }
        match self {
            ServerKind::Memory => Ok("memory://conformance".to_owned()),
            ServerKind::Sqlite => sqlite::shared_url(),
            ServerKind::Postgres => {
                static SHARED: OnceLock<Result<String, Unavailable>> = OnceLock::new();
                // Starting blocks (initdb, polling for readiness): keep it off the runtime's
                // workers. Concurrent callers wait in `get_or_init` for the one start.
                tokio::task::spawn_blocking(|| SHARED.get_or_init(shared_postgres).clone())
                    .await
                    .map_err(|e| Unavailable::Failed(format!("starting PostgreSQL: {e}")))?
            }
            ServerKind::PgBouncer => {
                static SHARED: OnceLock<Result<String, Unavailable>> = OnceLock::new();
                tokio::task::spawn_blocking(|| SHARED.get_or_init(shared_pgbouncer).clone())
                    .await
                    .map_err(|e| Unavailable::Failed(format!("starting PgBouncer: {e}")))?
            }
            ServerKind::Redis
            | ServerKind::RedisCluster
            | ServerKind::RedisSentinel
            | ServerKind::Etcd
            | ServerKind::EtcdCluster => {
                static REDIS: OnceLock<Result<String, Unavailable>> = OnceLock::new();
                static REDIS_CLUSTER: OnceLock<Result<String, Unavailable>> = OnceLock::new();
                static REDIS_SENTINEL: OnceLock<Result<String, Unavailable>> = OnceLock::new();
                static ETCD: OnceLock<Result<String, Unavailable>> = OnceLock::new();
                static ETCD_CLUSTER: OnceLock<Result<String, Unavailable>> = OnceLock::new();
                let (cell, start): (_, fn() -> Result<KvStore, Unavailable>) = match self {
                    ServerKind::Redis => (&REDIS, || KvStore::redis(None)),
                    ServerKind::RedisCluster => {
                        (&REDIS_CLUSTER, || KvStore::redis_cluster(None, None))
                    }
                    ServerKind::RedisSentinel => {
                        (&REDIS_SENTINEL, || KvStore::redis_sentinel(None))
                    }
                    ServerKind::Etcd => (&ETCD, || KvStore::etcd(1, None)),
                    _ => (&ETCD_CLUSTER, || KvStore::etcd(3, None)),
                };
                let name = self.name();
                tokio::task::spawn_blocking(move || cell.get_or_init(|| shared_kv(start)).clone())
                    .await
                    .map_err(|e| Unavailable::Failed(format!("starting {name}: {e}")))?
            }
        }
    }

    /// The URL of the shared store ([`ServerKind::shared`]) for the test `label`, or `None` after a
    /// `SKIP` line when the backend is missing and not required ([`skip_unless_required`]).
    pub async fn shared_or_skip(self, label: &str) -> Option<String> {
        skip_unless_required(self, label, self.shared().await)
    }

    /// A store on a server started for one case alone, with control over its processes and a
    /// TCP proxy between the store and the server ([`ServerControl::cut`]); for the fault cases.
    pub async fn dedicated(self) -> Result<Dedicated, Unavailable> {
        self.compiled().await?;
        if std::env::var_os(self.url_var()).is_some() {
            return Err(Unavailable::NotApplicable(format!(
                "{} points at a server the harness did not start, so it cannot kill or pause it",
                self.url_var()
            )));
        }
        if self == ServerKind::RedisCluster {
            return dedicated_redis_cluster().await;
        }
        let plain = self.dedicated_server().await?;
        let (control, url) = proxy::Proxied::wrap(plain.control, &plain.url)
            .await
            .map_err(|e| Unavailable::Failed(format!("starting the TCP proxy: {e}")))?;
        Ok(Dedicated {
            url,
            control: Arc::new(control),
        })
    }

    /// A store on a 3-member cluster started for one case alone, with control over one member;
    /// for the member-loss case. Only the etcd cluster applies: a Redis Cluster without replicas
    /// loses the killed primary's slots by design.
    pub async fn cluster_member(self) -> Result<Dedicated, Unavailable> {
        self.compiled().await?;
        if self != ServerKind::EtcdCluster {
            return Err(Unavailable::NotApplicable(format!(
                "{} is not a cluster that survives losing a member (the etcd_cluster backend runs this case)",
                self.name()
            )));
        }
        if std::env::var_os(self.url_var()).is_some() {
            return Err(Unavailable::NotApplicable(format!(
                "{} points at a cluster the harness did not start, so it cannot kill a member",
                self.url_var()
            )));
        }
        let store = tokio::task::spawn_blocking(|| KvStore::etcd(3, Some(FAULT_OP_TIMEOUT)))
            .await
            .map_err(|e| Unavailable::Failed(format!("starting an etcd cluster: {e}")))??;
        let store = Arc::new(store);
        Ok(Dedicated {
            url: store.url(),
            control: Arc::new(KvControl::new(store, FAULT_OP_TIMEOUT)),
        })
    }

    async fn dedicated_server(self) -> Result<Dedicated, Unavailable> {
        self.compiled().await?;
        if std::env::var_os(self.url_var()).is_some() {
            return Err(Unavailable::NotApplicable(format!(
                "{} points at a server the harness did not start, so it cannot kill or pause it",
                self.url_var()
            )));
        }
        match self {
            ServerKind::Sqlite => Err(Unavailable::NotApplicable(
                "sqlite is embedded: there is no server process to kill or pause".into(),
            )),
            ServerKind::Memory => Err(Unavailable::NotApplicable(
                "the in-memory store has no server process to kill or pause".into(),
            )),
            ServerKind::Postgres => {
                #[cfg(feature = "containers")]
                if let Err(Unavailable::Missing(why)) = postgres::find_bin_dir() {
                    if containers::docker_reachable() {
                        return Err(Unavailable::NotApplicable(format!(
                            "fault cases need PostgreSQL's own binaries (the harness does not \
                             control containers): {why}"
                        )));
                    }
                }
                let server = tokio::task::spawn_blocking(|| {
                    postgres::PgServer::start_new(Some(FAULT_OP_TIMEOUT))
                })
                .await
                .map_err(|e| Unavailable::Failed(format!("starting PostgreSQL: {e}")))??;
                let server = Arc::new(server);
                Ok(Dedicated {
                    url: server.url(),
                    control: Arc::new(PgControl::new(server, FAULT_OP_TIMEOUT)),
                })
            }
            ServerKind::PgBouncer => {
                let bouncer = tokio::task::spawn_blocking(|| {
                    pgbouncer::PgBouncer::start_new(Some(FAULT_OP_TIMEOUT))
                })
                .await
                .map_err(|e| Unavailable::Failed(format!("starting PgBouncer: {e}")))??;
                let bouncer = Arc::new(bouncer);
                Ok(Dedicated {
                    url: bouncer.url(),
                    control: Arc::new(PgBouncerControl::new(bouncer, FAULT_OP_TIMEOUT)),
                })
            }
            ServerKind::Redis | ServerKind::Etcd => {
                let redis = self == ServerKind::Redis;
                let store = tokio::task::spawn_blocking(move || {
                    if redis {
                        KvStore::redis(Some(FAULT_OP_TIMEOUT))
                    } else {
                        KvStore::etcd(1, Some(FAULT_OP_TIMEOUT))
                    }
                })
                .await
                .map_err(|e| Unavailable::Failed(format!("starting {}: {e}", self.name())))??;
                let store = Arc::new(store);
                Ok(Dedicated {
                    url: store.url(),
                    control: Arc::new(KvControl::new(store, FAULT_OP_TIMEOUT)),
                })
            }
            ServerKind::EtcdCluster => {
                let store =
                    tokio::task::spawn_blocking(|| KvStore::etcd(3, Some(FAULT_OP_TIMEOUT)))
                        .await
                        .map_err(|e| Unavailable::Failed(format!("starting etcd: {e}")))??;
                let store = Arc::new(store);
                Ok(Dedicated {
                    url: store.url(),
                    control: Arc::new(KvControl::whole(store, FAULT_OP_TIMEOUT)),
                })
            }
            // Made by `dedicated_redis_cluster`, which puts the proxies in place first.
            ServerKind::RedisCluster => dedicated_redis_cluster().await,
            // Its fault cases are `#[ignore]`d (`conformance_tests!(…, sentinel)`): a killed
            // primary is a failover, which tests/redis_sentinel.rs tests on its own.
            ServerKind::RedisSentinel => Err(Unavailable::NotApplicable(
                "a killed Redis primary behind Sentinel is a failover: see tests/redis_sentinel.rs"
                    .into(),
            )),
        }
    }
}

fn shared_postgres() -> Result<String, Unavailable> {
    match postgres::PgServer::start_new(None) {
        Ok(server) => {
            let url = server.url();
            // Lives until the process exits; the exit hook stops it and removes its directory.
            static SERVER: OnceLock<PgServer> = OnceLock::new();
            let _ = SERVER.set(server);
            Ok(url)
        }
        #[cfg(feature = "containers")]
        Err(Unavailable::Missing(why)) => containers::start_postgres().map_err(|e| match e {
            Unavailable::Missing(docker) => Unavailable::Missing(format!("{why}; {docker}")),
            other => other,
        }),
        Err(e) => Err(e),
    }
}

/// The shared PgBouncer, with a PostgreSQL server of its own behind it (not the shared
/// PostgreSQL, which `HEADCOUNT_TEST_POSTGRES_URL` may replace by a server elsewhere).
fn shared_pgbouncer() -> Result<String, Unavailable> {
    let bouncer = pgbouncer::PgBouncer::start_new(None)?;
    let url = bouncer.url();
    // Lives until the process exits; the exit hook stops both and removes their directories.
    static BOUNCER: OnceLock<PgBouncer> = OnceLock::new();
    let _ = BOUNCER.set(bouncer);
    Ok(url)
}

/// A Redis Cluster for one fault case, whose nodes announce proxies in front of them: a Cluster
/// client learns node addresses from the nodes, so a proxy only in front of the seed would be
/// bypassed. Kill, pause and resume act on all three nodes.
async fn dedicated_redis_cluster() -> Result<Dedicated, Unavailable> {
    let failed = |e: std::io::Error| Unavailable::Failed(format!("starting a TCP proxy: {e}"));
    let mut proxies = Vec::new();
    // One flag for the three: `drop_next_reply` drops one answer, from whichever node.
    let drop_reply = Arc::default();
    for _ in 0..3 {
        proxies.push(
            proxy::Proxy::unbound_sharing(Arc::clone(&drop_reply))
                .await
                .map_err(failed)?,
        );
    }
    let announce: Vec<_> = proxies.iter().map(|p| (p.port(), p.upstream())).collect();
    let store = tokio::task::spawn_blocking(move || {
        KvStore::redis_cluster(Some(FAULT_OP_TIMEOUT), Some(announce))
    })
    .await
    .map_err(|e| Unavailable::Failed(format!("starting a Redis Cluster: {e}")))??;
    let store = Arc::new(store);
    let url = store.url();
    let control =
        proxy::Proxied::with_proxies(Arc::new(KvControl::whole(store, FAULT_OP_TIMEOUT)), proxies);
    Ok(Dedicated {
        url,
        control: Arc::new(control),
    })
}

/// Starts a shared Redis or etcd store that lives until the process exits.
fn shared_kv(start: fn() -> Result<KvStore, Unavailable>) -> Result<String, Unavailable> {
    let store = start()?;
    let url = store.url();
    static STORES: std::sync::Mutex<Vec<KvStore>> = std::sync::Mutex::new(Vec::new());
    STORES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(store);
    Ok(url)
}

fn say(line: &str) {
    // Straight to the process's stderr: libtest captures `eprintln!` of passing tests, and a
    // skip must be seen.
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The one rule for a test that cannot have what it needs from the harness, for every test of
/// every crate: the value when there is one; else `Ok(None)` after a line
/// `SKIP <label>: <why> (set HEADCOUNT_REQUIRE_BACKENDS=all to make this a failure)` on stderr,
/// when the backend is missing ([`Unavailable::Missing`]) or the test cannot run on this setup
/// ([`Unavailable::NotApplicable`]) and [`REQUIRE_VAR`] does not require the backend; else an
/// error naming `label` (the backend is required, or it failed to start).
///
/// `label` names the test, such as `postgres::incr_50x100_exact`. Tests that fail by panicking
/// call [`skip_unless_required`].
pub fn available<T>(
    backend: ServerKind,
    label: &str,
    found: Result<T, Unavailable>,
) -> Result<Option<T>, String> {
    let required = backend.required();
    match found {
        Ok(value) => Ok(Some(value)),
        Err(Unavailable::Missing(why) | Unavailable::NotApplicable(why)) if !required => {
            say(&format!(
                "SKIP {label}: {why} (set {REQUIRE_VAR}=all to make this a failure)"
            ));
            Ok(None)
        }
        Err(Unavailable::NotApplicable(why)) => Err(format!(
            "{label}: {} is required by {REQUIRE_VAR} but this test cannot run: {why}",
            backend.name()
        )),
        Err(Unavailable::Missing(why)) => Err(format!(
            "{label}: {} is required by {REQUIRE_VAR} but unavailable: {why}",
            backend.name()
        )),
        Err(Unavailable::Failed(why)) => Err(format!("{label}: {why}")),
    }
}

/// [`available`] for a test that fails by panicking: the value, or `None` after the `SKIP` line
/// (the test then returns and passes); panics with [`available`]'s message when the backend is
/// required or failed to start.
///
/// ```no_run
/// # use headcount_harness::{skip_unless_required, ServerKind};
/// # async fn test() {
/// let Some(url) = skip_unless_required(ServerKind::Redis, "redis::my_test", ServerKind::Redis.shared().await)
/// else {
///     return;
/// };
/// # }
/// ```
#[track_caller]
#[allow(clippy::panic)] // For tests, which fail by panicking.
pub fn skip_unless_required<T>(
    backend: ServerKind,
    label: &str,
    found: Result<T, Unavailable>,
) -> Option<T> {
    match available(backend, label, found) {
        Ok(value) => value,
        Err(message) => panic!("{message}"),
    }
}

/// Runs the case `case` against `backend` as one test: finds a store (see the module docs),
/// runs the case and its cleanup, and returns the failure message, if any, naming
/// `<backend>::<case>`. What [`conformance_tests!`](crate::conformance_tests) calls.
pub async fn run_test(backend: ServerKind, case: &str) -> Result<(), String> {
    let label = format!("{}::{case}", backend.name());
    let Some(case) = Case::find(case) else {
        return Err(format!("{label}: no such case"));
    };
    let target = match case.needs {
        Needs::ServerControl => backend.dedicated().await.map(|d| (d.url, Some(d.control))),
        Needs::ClusterMember => backend
            .cluster_member()
            .await
            .map(|d| (d.url, Some(d.control))),
        _ => backend.shared().await.map(|url| (url, None)),
    };
    // A required backend runs every case it was generated for: a skip that passed would count as
    // proof. Cases a backend can never run are #[ignore]d by the macro instead.
    let Some((url, control)) = available(backend, &label, target)? else {
        return Ok(());
    };
    let store = headcount::connect(&url).await.map_err(|e| {
        format!(
            "{label}: connecting to {}: {e}",
            headcount::redact_url(&url)
        )
    })?;
    let ctx = Ctx::new(store, control);
    let outcome = match tokio::time::timeout(CASE_TIMEOUT, (case.run)(&ctx)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(failure)) => Err(format!("{label} failed: {failure}")),
        Err(_) => Err(format!("{label} did not finish within {CASE_TIMEOUT:?}")),
    };
    let cleanup = tokio::time::timeout(CASE_TIMEOUT, ctx.cleanup()).await;
    // A dedicated server goes with the last handle to its control; stopping it blocks briefly.
    let _ = tokio::task::spawn_blocking(move || drop(ctx)).await;
    outcome?;
    match cleanup {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("{label} passed, but {e}")),
        Err(_) => Err(format!("{label} passed, but its cleanup did not finish")),
    }
}

/// What the macros expand to needs, re-exported so the crate invoking them needs no dependency of
/// its own on these.
#[doc(hidden)]
pub mod __private {
    pub use headcount_conformance::for_each_case;
    pub use tokio;
}

/// Expands to a module named `$module` holding one
/// `#[tokio::test(flavor = "multi_thread", worker_threads = 4)]` per case, each running that case
/// against `$backend` (a [`ServerKind`]) through [`run_test`], so a failure names
/// its case (`postgres::incr_50x100_exact`).
///
/// ```ignore
/// // tests/postgres.rs
/// headcount_harness::conformance_tests!(postgres, headcount_harness::ServerKind::Postgres);
/// // tests/sqlite.rs: an embedded store has no server process, so the cases that kill or pause
/// // one are generated `#[ignore]`d with the reason, visible in the test summary, never passed.
/// headcount_harness::conformance_tests!(sqlite, headcount_harness::ServerKind::Sqlite, embedded);
/// ```
///
/// A case that cannot run (no server, or it needs control of a server the harness did not start)
/// prints a `SKIP` line to stderr and passes, unless `HEADCOUNT_REQUIRE_BACKENDS` requires the
/// backend; see the crate's front page.
#[macro_export]
macro_rules! conformance_tests {
    ($module:ident, $backend:expr $(,)?) => {
        $crate::__private::for_each_case!($crate::__conformance_tests! $module, $backend, server,);
    };
    ($module:ident, $backend:expr, embedded $(,)?) => {
        $crate::__private::for_each_case!($crate::__conformance_tests! $module, $backend, embedded,);
    };
    ($module:ident, $backend:expr, cluster $(,)?) => {
        $crate::__private::for_each_case!($crate::__conformance_tests! $module, $backend, cluster,);
    };
    ($module:ident, $backend:expr, sentinel $(,)?) => {
        $crate::__private::for_each_case!($crate::__conformance_tests! $module, $backend, sentinel,);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($module:ident, $backend:expr, $kind:ident, [$({ $name:ident, $needs:ident, $about:literal },)*]) => {
        mod $module {
            $(
                $crate::__conformance_test! { $needs, $kind,
                    #[doc = $about]
                    #[$crate::__private::tokio::test(
                        crate = "::headcount_harness::__private::tokio",
                        flavor = "multi_thread",
                        worker_threads = 4
                    )]
                    async fn $name() {
                        if let ::core::result::Result::Err(message) =
                            $crate::run_test($backend, ::core::stringify!($name)).await
                        {
                            ::core::panic!("{message}");
                        }
                    }
                }
            )*
        }
    };
}

/// Emits one test, `#[ignore]`d (with the reason, visible in the test summary) when the backend
/// cannot give what the case needs: no server process for an embedded store, no redundant member
/// outside a `cluster` backend.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_test {
    (ServerControl, embedded, $($test:tt)*) => {
        #[ignore = "embedded store: there is no server process to kill or pause (headcount-sql tests a held lock timing out instead)"]
        $($test)*
    };
    (ClusterMember, embedded, $($test:tt)*) => {
        #[ignore = "embedded store: there is no cluster whose member could be killed"]
        $($test)*
    };
    (ServerControl, sentinel, $($test:tt)*) => {
        #[ignore = "behind Sentinel a killed or cut primary is a failover: tests/redis_sentinel.rs runs one and checks a group survives it"]
        $($test)*
    };
    (ClusterMember, sentinel, $($test:tt)*) => {
        #[ignore = "losing the primary behind Sentinel is a failover, with calls failing until it completes: tests/redis_sentinel.rs tests that"]
        $($test)*
    };
    (ClusterMember, server, $($test:tt)*) => {
        #[ignore = "no redundant member to lose: a single server, or a Redis Cluster without replicas (etcd_cluster runs this case)"]
        $($test)*
    };
    ($needs:ident, $kind:ident, $($test:tt)*) => {
        $($test)*
    };
}

/// Locks `m`; what it guards stays valid across a panic, so a poisoned lock is taken as is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
