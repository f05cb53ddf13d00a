//! Group membership measured on real servers: convergence per event, store calls per member per
//! heartbeat in the steady state, and a large group on one Redis.
//!
//! ```sh
//! HEADCOUNT_REQUIRE_BACKENDS=all cargo bench -p headcount-conformance --bench group
//! # parts and sizes:
//! cargo bench -p headcount-conformance --bench group -- --only convergence --reps 5
//! cargo bench -p headcount-conformance --bench group -- --only convergence --backends etcd --ttl 3
//! cargo bench -p headcount-conformance --bench group -- --only scale --scale 100,1000 --scale-ttl 6
//! # change notifications against polling (not in the default parts: about 20 minutes):
//! HEADCOUNT_REQUIRE_BACKENDS=all cargo bench -p headcount-conformance --bench group -- --only notify
//! cargo bench -p headcount-conformance --bench group -- --only notify --backends redis --sizes 10 --reps 3
//! ```
//!
//! Servers come from the conformance harness (started from their binaries on loopback, or the
//! `HEADCOUNT_TEST_<BACKEND>_URL` stores). Every member runs in this process over one store
//! wrapped in a counter of calls by method.
//!
//! * **convergence** (each backend; 5 members, TTL 1.5 s or `--ttl`, raised to the backend's
//!   shortest lease: etcd 2 s): per repetition a join (slot 5), a graceful leave of it, a join
//!   again, a crash of it (the member dropped without leave), a crash of the lowest slot (the
//!   one that publishes at once), and a join that fills that hole. For each event two times
//!   from the event: *view* (every remaining member adopted a view newer than the one before
//!   the event) and *active* (every remaining member `Active` on one epoch newer than before,
//!   with the expected live count). Polled every 2 ms.
//! * **load** (each backend, same group, before the events): the calls of every method over 10
//!   heartbeats with nothing changing, per member per heartbeat.
//! * **scale** (Redis): `n` members (default 100 and 1000, TTL 6 s) joined one after the other
//!   (giving up after 150 s of joining); the join time, the time to converge, the steady-state
//!   calls five heartbeats after convergence (the wrapper's and the server's `INFO
//!   commandstats`), the server's and this process's
//!   CPU, the view record's size, and the convergence after one graceful leave and one crash,
//!   with the bytes Redis sent per member per change over those two (`INFO stats`
//!   `total_net_output_bytes`) and this process's resident memory and live heap (counted by
//!   its allocator) per member. `--partitions 0,4096,65536` runs each size with the default
//!   assignor (0) and with `sticky` over that many partitions; `--designs versioned,whole-views` beside the design before view headers
//!   (every view written whole, `GroupConfig::with_view_inline_max(usize::MAX)`), and
//!   `own-views` beside the design before a burst of joins was coalesced in a large group
//!   (every joiner publishes its own view, `GroupConfig::with_coalesce_from(usize::MAX)`);
//!   `polling` is the versioned design without change notifications.
//!   `--cold-start-only` stops each run once every member is active and prints the cold
//!   start's own table (times, views, store calls per member by method), for thousands of
//!   members without the steady-state window's wait.
//!   `--join-batch K` starts the members K at a time, concurrently (a cold start of a
//!   deployment), instead of one after the other; the row's epoch at "all active" counts the
//!   views published.
//!
//! * **stores** (only when asked: `--only stores --backends postgres,sqlite,etcd --scale 30,300`):
//!   the scale part on the other backends' shared test servers, each first given up to 100,000
//!   unrelated keys (64-byte values, no TTL) through the store: the steady-state store calls and
//!   the bytes a counting TCP proxy carries to and from the server, per member per heartbeat,
//!   five heartbeats after convergence (on etcd also the requests the server received by gRPC
//!   method, its puts and its WAL syncs, from its `/metrics`), and a crash's convergence.
//! * **processes** (Redis; only when asked: `--only processes`): `--processes N` (default 50)
//!   `headcount run` processes (the binary at `--headcount PATH`, default
//!   `target/release/headcount`: `cargo build --release -p headcount-cli` first) in one group on a
//!   Redis of their own holding `--unrelated` keys, TTL `--scale-ttl`, started all at once or
//!   `--start-rate R` a second (as a deployment starts its pods in waves): the time from the last
//!   start until every one prints `active` with `replicas = N` on one epoch, the server's
//!   commands per second and script time in the steady state (five heartbeats after that), the
//!   processes' CPU and resident memory over the same window (from `/proc`), and after a
//!   `kill -9` of one of them the time until the others print `active` with `replicas = N - 1`
//!   on a newer epoch (goal: TTL + two heartbeats). With `HEADCOUNT_BENCH_LOGS=DIR`, each
//!   process's log goes to `DIR/m<i>.log`, at the level `HEADCOUNT_BENCH_RUST_LOG` names (`warn`
//!   by default).
//! * **notify** (each backend; only when asked: `--only notify [--backends ...] [--sizes 10,300]
//!   [--reps 10] [--ttl 6]`): members that listen to the store's change notifications
//!   ([`GroupConfig::with_notifications`], the default) against members that only poll
//!   (`false`), in one run. The store first gets up to 100,000 unrelated
//!   keys (as in the stores part) and sits behind a counting TCP proxy when it is a server. Per
//!   size `n`, one group per mode, each on one store handle of its own shared by its members
//!   (one subscription), joined 50 at a time concurrently: the polling group starts alone and
//!   its steady-state load is measured over five heartbeats, four heartbeats after it
//!   converged; the listening group then joins beside it; `--reps` times, alternating which
//!   mode goes first, each group goes through a **join** (a new member; from the join call), a
//!   **graceful leave** of the member holding the middle slot (from the `leave()` call) and a
//!   **hand-over to a standby**, the view change that replaces a member (a new member id
//!   joins with [`GroupConfig::with_standby`] and is ready standing by; then the member holding
//!   the middle slot leaves gracefully and hands it its slot, as in a rolling deploy that
//!   replaces pods; from the `leave()` call). Each time is until every member is `Active` on
//!   one epoch whose view names exactly them (looked at every millisecond). Then the polling
//!   group leaves and the listening group's load is measured alone, as the polling group's
//!   was. Reported: the median and the tail of each event (the 99th percentile from 100
//!   repetitions, otherwise the maximum, named so), polling ÷ notices, the issue's goal (under
//!   100 ms at the median and 250 ms at the tail with notices), and the steady-state store
//!   calls, round trips, server requests (Redis `INFO` commands processed, less the `PEXPIRE`s
//!   that refresh version keys in a window placed by a hash of the member's key; etcd gRPC
//!   messages received, from its `/metrics`) and proxy bytes per member per heartbeat of both
//!   modes. Below the tables, each event's samples, the times until the first member and until
//!   every member had adopted the new view, and the store calls (both groups'), the bytes from
//!   the server (both groups') and this process's CPU time per event.
//!
//! Run without `--bench` (as `cargo test --all-targets` does) it makes one SQLite convergence
//! repetition only, unless the arguments say otherwise. It prints Markdown tables;
//! `docs/benchmarks.md` ("Group membership") holds a run of it.
//!
//! One file per part (`convergence.rs`, `scale.rs`, `stores.rs`, `notify.rs`, `processes.rs`),
//! the group under test and its call counter in `fleet.rs`, and what the benches share (the
//! command line, unrelated data, Redis `INFO`, etcd's `/metrics`) in `../common`.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;
mod convergence;
mod fleet;
mod notify;
mod processes;
mod scale;
mod stores;

use std::time::Duration;

use headcount_harness::{KvStore, ServerKind, Unavailable};

use common::Args;

/// Counts the live heap, for the scale part's memory per member.
#[global_allocator]
static ALLOC: common::CountingAlloc = common::CountingAlloc;

/// The command line: the parts to run and their sizes.
pub(crate) struct Opts {
    pub(crate) only: Vec<String>,
    pub(crate) backends: Vec<ServerKind>,
    pub(crate) reps: usize,
    pub(crate) scale: Vec<usize>,
    pub(crate) scale_ttl: Duration,
    /// Unrelated keys put in the scale part's Redis first (`DEBUG POPULATE`).
    pub(crate) unrelated: u64,
    /// The heartbeat designs of the scale part: `versioned` (read the table when it changed,
    /// both directories' versions in one call), `two-calls` (the same, one call per directory),
    /// `full` (read it at every heartbeat); `whole-views` and `own-views`, the versioned design
    /// with every view written whole, or with every change published by its own member;
    /// `polling`, the versioned design without change notifications.
    pub(crate) designs: Vec<String>,
    /// The scale part's key sets: the sticky assignor over each count of partitions (0: the
    /// default assignor, no declared keys).
    pub(crate) partitions: Vec<u32>,
    /// The scale part's joins started together (`--join-batch`; default 1: one after the
    /// other). A batch of k is k members started at once, as a deployment starts its pods.
    pub(crate) join_batch: usize,
    /// The scale part stops once every member is active (`--cold-start-only`): a cold start of
    /// thousands, without the steady-state window's wait for every member's first look.
    pub(crate) cold_start_only: bool,
    /// The convergence part's lease TTL (default 1.5 s, raised to the backend's minimum).
    pub(crate) ttl: Option<Duration>,
    /// The processes part's group size.
    pub(crate) processes: usize,
    /// The processes part's starts per second (`--start-rate`; default 0: all at once).
    pub(crate) start_rate: f64,
    /// The notify part's group sizes.
    pub(crate) sizes: Vec<usize>,
    /// The notify part's repetitions (`--reps`; default 10).
    pub(crate) notify_reps: Option<usize>,
    /// The `headcount` binary the processes part starts.
    pub(crate) headcount: std::path::PathBuf,
}

fn opts() -> Opts {
    let mut o = Opts {
        only: vec!["convergence".into(), "scale".into()],
        backends: common::every_backend(),
        reps: 5,
        scale: vec![100, 1000],
        scale_ttl: Duration::from_secs(6),
        unrelated: 1_000_000,
        designs: vec!["versioned".into(), "full".into()],
        partitions: vec![0],
        join_batch: 1,
        cold_start_only: false,
        ttl: None,
        processes: 50,
        start_rate: 0.0,
        sizes: vec![10, 300],
        notify_reps: None,
        headcount: std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/release/headcount"),
    };
    // A smoke run (SQLite, one repetition, no large group) shows it works without taking
    // minutes.
    if !common::benching() {
        o.only = vec!["convergence".into()];
        o.backends = vec![ServerKind::Sqlite];
        o.reps = 1;
    }
    let mut args = Args::new();
    while let Some(flag) = args.flag() {
        match flag.as_str() {
            "--only" => o.only = args.names(),
            "--backends" => o.backends = args.backends(),
            "--reps" => {
                o.reps = args.parse("--reps N");
                o.notify_reps = Some(o.reps);
            }
            "--sizes" => o.sizes = args.list("--sizes N,N"),
            "--scale" => o.scale = args.list("--scale N,N"),
            "--ttl" => o.ttl = Some(args.seconds("--ttl SECONDS")),
            "--scale-ttl" => o.scale_ttl = args.seconds("--scale-ttl SECONDS"),
            "--unrelated" => o.unrelated = args.parse("--unrelated N"),
            "--designs" => o.designs = args.names(),
            "--partitions" => o.partitions = args.list("--partitions N,N"),
            "--join-batch" => o.join_batch = args.parse("--join-batch N"),
            "--cold-start-only" => o.cold_start_only = true,
            "--processes" => o.processes = args.parse("--processes N"),
            "--start-rate" => o.start_rate = args.parse("--start-rate N"),
            "--headcount" => o.headcount = args.value().into(),
            _ => {}
        }
    }
    o
}

/// A Redis of its own for the scale and processes parts (`DEBUG` enabled, to fill it), or `None`
/// when Redis is not installed and not required.
pub(crate) fn own_redis(part: &str) -> Option<KvStore> {
    match KvStore::redis_with(None, &["--enable-debug-command", "yes"]) {
        Ok(s) => Some(s),
        Err(Unavailable::Missing(why)) if !ServerKind::Redis.required() => {
            eprintln!("SKIP group bench {part} part: {why}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Empties the Redis at `url` and fills it with `unrelated` keys (`DEBUG POPULATE`), as a
/// user's Redis holding other data would be.
pub(crate) async fn fill_redis(url: &str, unrelated: u64) {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    if unrelated > 0 {
        let _: () = redis::cmd("DEBUG")
            .arg("POPULATE")
            .arg(unrelated)
            .arg("unrelated")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

fn main() {
    let o = opts();
    // `HEADCOUNT_BENCH_WARNINGS=1` prints the members' warnings (a lease lost, a store call
    // failed): what a slow run went through.
    if std::env::var_os("HEADCOUNT_BENCH_WARNINGS").is_some() {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(std::io::stderr)
            .init();
    }
    common::runtime().block_on(async {
        let part = |name: &str| o.only.iter().any(|p| p == name);
        if part("convergence") {
            convergence::run(&o).await;
        }
        if part("scale") {
            scale::run(&o).await;
        }
        if part("stores") {
            stores::run(&o).await;
        }
        if part("notify") {
            notify::run(&o).await;
        }
        if part("processes") {
            processes::run(&o).await;
        }
    });
}
