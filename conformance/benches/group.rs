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
//!   CPU, the view record's size, and the convergence after one graceful leave and one crash.
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
//!   Redis of their own holding `--unrelated` keys, TTL `--scale-ttl`: the time from the last
//!   start until every one prints `active` with `replicas = N` on one epoch, the server's
//!   commands per second and script time in the steady state (five heartbeats after that), and
//!   after a `kill -9` of one of
//!   them the time until the others print `active` with `replicas = N - 1` on a newer epoch (goal:
//!   TTL + two heartbeats).
//! * **notify** (each backend; only when asked: `--only notify [--backends ...] [--sizes 10,300]
//!   [--reps 10] [--ttl 6]`): members that listen to the store's change notifications
//!   ([`GroupConfig::with_notifications`], the default) against members that only poll
//!   (`false`, the design before), in one run. The store first gets up to 100,000 unrelated
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

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use headcount::recipes::group::{Assignment, Group, GroupConfig, GroupPhase, Member};
use headcount::{Capabilities, DynStore, Op};
use headcount_conformance::{Decorated, Hooks};
use headcount_harness::{KvStore, ServerKind, Unavailable};
use tokio::sync::watch;

const PREFIX: &str = "hcb";

/// Counts the calls made through a [`Decorated`] store, by method; the store delegates each to
/// the inner store (so a backend's native `renew_and_list` is used when it has one).
#[derive(Debug, Default)]
struct Counting {
    calls: [AtomicU64; Op::ALL.len()],
    /// Calls that failed or took longer than [`SLOW`], by method.
    slow: [AtomicU64; Op::ALL.len()],
}

/// A call slower than this is counted apart (a congested store or client).
const SLOW: Duration = Duration::from_millis(500);

#[async_trait]
impl Hooks for Counting {
    async fn before(&self, op: Op) -> headcount::Result<()> {
        self.calls[Counting::index(op)].fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn outcome(&self, op: Op, took: Duration, error: Option<&headcount::Error>) {
        if error.is_some() || took > SLOW {
            self.slow[Counting::index(op)].fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Counting {
    fn new(inner: DynStore) -> Arc<Decorated<Counting>> {
        Arc::new(Decorated::with(inner, Counting::default()))
    }

    /// Where `op` is counted: its place in [`Op::ALL`].
    fn index(op: Op) -> usize {
        // An operation missing from Op::ALL is a bug in headcount: say which.
        let Some(i) = Op::ALL.iter().position(|o| *o == op) else {
            panic!("the group bench cannot count `{op}`: it is not in Op::ALL");
        };
        i
    }

    fn slow_snapshot(&self) -> BTreeMap<&'static str, u64> {
        Op::ALL
            .iter()
            .zip(&self.slow)
            .map(|(op, c)| (op.name(), c.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        Op::ALL
            .iter()
            .zip(&self.calls)
            .map(|(op, c)| (op.name(), c.load(Ordering::Relaxed)))
            .collect()
    }
}

/// Calls per method between two snapshots, and the store round trips they make: a provided
/// (non-native) `renew_and_list` is two round trips.
fn delta(
    before: &BTreeMap<&'static str, u64>,
    after: &BTreeMap<&'static str, u64>,
) -> BTreeMap<&'static str, u64> {
    after
        .iter()
        .map(|(m, a)| (*m, a - before.get(m).copied().unwrap_or(0)))
        .filter(|(_, d)| *d > 0)
        .collect()
}

fn round_trips(calls: &BTreeMap<&'static str, u64>, caps: &Capabilities) -> u64 {
    Op::ALL
        .iter()
        .map(|op| {
            let n = calls.get(op.name()).copied().unwrap_or(0);
            match op {
                Op::RenewAndList | Op::RenewAndListIfChanged if !caps.native_renew_and_list => {
                    2 * n
                }
                Op::IncrAndGet if !caps.native_incr_and_get => 2 * n,
                _ => n,
            }
        })
        .sum()
}

struct Opts {
    only: Vec<String>,
    backends: Vec<ServerKind>,
    reps: usize,
    scale: Vec<usize>,
    scale_ttl: Duration,
    /// Unrelated keys put in the scale part's Redis first (`DEBUG POPULATE`).
    unrelated: u64,
    /// The heartbeat designs of the scale part: `versioned` (read the table when it changed,
    /// both directories' versions in one call), `two-calls` (the same, one call per directory),
    /// `full` (read it at every heartbeat, the design before).
    designs: Vec<String>,
    /// The convergence part's lease TTL (default 1.5 s, raised to the backend's minimum).
    ttl: Option<Duration>,
    /// The processes part's group size.
    processes: usize,
    /// The notify part's group sizes.
    sizes: Vec<usize>,
    /// The notify part's repetitions (`--reps`; default 10).
    notify_reps: Option<usize>,
    /// The `headcount` binary the processes part starts.
    headcount: std::path::PathBuf,
}

fn opts() -> Opts {
    let mut o = Opts {
        only: vec!["convergence".into(), "scale".into()],
        backends: vec![
            ServerKind::Sqlite,
            ServerKind::Postgres,
            ServerKind::Redis,
            ServerKind::Etcd,
        ],
        reps: 5,
        scale: vec![100, 1000],
        scale_ttl: Duration::from_secs(6),
        unrelated: 1_000_000,
        designs: vec!["versioned".into(), "full".into()],
        ttl: None,
        processes: 50,
        sizes: vec![10, 300],
        notify_reps: None,
        headcount: std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/release/headcount"),
    };
    // `cargo test --all-targets` runs this binary without `--bench`, in a debug build: a smoke
    // run (SQLite, one repetition, no large group) shows it works without taking minutes.
    if !std::env::args().any(|a| a == "--bench") {
        o.only = vec!["convergence".into()];
        o.backends = vec![ServerKind::Sqlite];
        o.reps = 1;
    }
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        // `cargo bench` passes `--bench`; other unknown arguments are ignored too.
        let mut value = || args.next().unwrap_or_default();
        match a.as_str() {
            "--only" => o.only = value().split(',').map(str::to_owned).collect(),
            "--backends" => {
                o.backends = value()
                    .split(',')
                    .map(|b| match b {
                        "sqlite" => ServerKind::Sqlite,
                        "postgres" => ServerKind::Postgres,
                        "redis" => ServerKind::Redis,
                        "etcd" => ServerKind::Etcd,
                        other => panic!("unknown backend {other}"),
                    })
                    .collect()
            }
            "--reps" => {
                o.reps = value().parse().expect("--reps N");
                o.notify_reps = Some(o.reps);
            }
            "--sizes" => {
                o.sizes = value()
                    .split(',')
                    .map(|n| n.parse().expect("--sizes N,N"))
                    .collect()
            }
            "--scale" => {
                o.scale = value()
                    .split(',')
                    .map(|n| n.parse().expect("--scale N,N"))
                    .collect()
            }
            "--ttl" => o.ttl = Some(Duration::from_secs_f64(value().parse().unwrap())),
            "--scale-ttl" => o.scale_ttl = Duration::from_secs_f64(value().parse().unwrap()),
            "--unrelated" => o.unrelated = value().parse().expect("--unrelated N"),
            "--designs" => o.designs = value().split(',').map(str::to_owned).collect(),
            "--processes" => o.processes = value().parse().expect("--processes N"),
            "--headcount" => o.headcount = value().into(),
            _ => {}
        }
    }
    o
}

async fn url_of(backend: ServerKind) -> Option<String> {
    match backend.shared().await {
        Ok(url) => Some(url),
        Err(e) => {
            assert!(!backend.required(), "{}: {e}", backend.name());
            eprintln!("SKIP group bench on {}: {e}", backend.name());
            None
        }
    }
}

fn group_name() -> String {
    format!("gb{:08x}", rand::random::<u32>())
}

/// The members of one group under test, with a watch of each one's assignment.
struct Fleet {
    store: DynStore,
    group: String,
    ttl: Duration,
    /// Members read the whole table at every heartbeat (the design before version checks).
    full_reads: bool,
    /// One `renew_and_list_if_changed` per directory instead of `renew_and_versions`.
    two_calls: bool,
    /// Members listen to the store's change notifications (the default); `false` polls only.
    notices: bool,
    members: Vec<(Member, watch::Receiver<Assignment>)>,
}

impl Fleet {
    /// Makes every member leave, without waiting on each one in turn: the group is being torn
    /// down.
    async fn leave_all(&mut self) {
        let leaves: Vec<_> = self
            .members
            .drain(..)
            .map(|(m, _)| tokio::spawn(m.leave()))
            .collect();
        for l in leaves {
            let _ = l.await;
        }
    }

    fn config(&self, id: &str) -> GroupConfig {
        GroupConfig::new(&self.group, self.ttl)
            .with_prefix(PREFIX)
            .with_member(id)
            .with_change_checks(!self.full_reads)
            .with_one_call_versions(!self.two_calls)
            .with_notifications(self.notices)
    }

    async fn join(&mut self, id: &str) -> std::result::Result<(), String> {
        self.join_with(id, self.config(id)).await
    }

    async fn join_with(&mut self, id: &str, cfg: GroupConfig) -> std::result::Result<(), String> {
        let m = Group::join(self.store.clone(), cfg)
            .await
            .map_err(|e| format!("join of {id}: {e}"))?;
        let rx = m.watch();
        self.members.push((m, rx));
        Ok(())
    }

    /// Joins `ids`, `batch` at a time concurrently (each batch's joins race for slots as
    /// members started together do).
    async fn join_batches(
        &mut self,
        ids: &[String],
        batch: usize,
    ) -> std::result::Result<(), String> {
        for chunk in ids.chunks(batch.max(1)) {
            let joined = futures::future::try_join_all(chunk.iter().map(|id| {
                let (store, cfg) = (self.store.clone(), self.config(id));
                async move {
                    Group::join(store, cfg)
                        .await
                        .map_err(|e| format!("join of {id}: {e}"))
                }
            }))
            .await?;
            for m in joined {
                let rx = m.watch();
                self.members.push((m, rx));
            }
        }
        Ok(())
    }

    fn index_of_slot(&self, slot: u32) -> usize {
        self.members
            .iter()
            .position(|(_, rx)| rx.borrow().slot == Some(slot))
            .unwrap_or_else(|| panic!("no member holds slot {slot}"))
    }

    /// The common active epoch when every member is active on one epoch with `n` live slots.
    fn converged(&self, n: u32) -> Option<u64> {
        let first = self.members.first()?.1.borrow().epoch;
        self.members
            .iter()
            .all(|(_, rx)| {
                let a = rx.borrow();
                a.phase == GroupPhase::Active && a.epoch == first && a.replicas == n
            })
            .then_some(first)
    }

    /// Every member has adopted a view newer than `e0` (active, or pending in a hand-off).
    fn adopted(&self, e0: u64) -> bool {
        self.members.iter().all(|(_, rx)| {
            let a = rx.borrow();
            a.epoch > e0 || a.phase == GroupPhase::Handoff
        })
    }

    fn active_after(&self, e0: u64, n: u32) -> bool {
        self.converged(n).is_some_and(|e| e > e0)
    }

    fn dump(&self) -> String {
        self.members
            .iter()
            .map(|(_, rx)| {
                let a = rx.borrow();
                format!(
                    "{}:slot={:?},epoch={},replicas={},{}",
                    a.member,
                    a.slot,
                    a.epoch,
                    a.replicas,
                    a.phase.as_str()
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    async fn settle(&self, n: u32, limit: Duration) -> std::result::Result<u64, String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(e) = self.converged(n) {
                return Ok(e);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no convergence on {n} live slots within {limit:?}: {}",
                    self.dump()
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// From `t0`, the times to every member adopting a view newer than `e0`, and to every member
    /// active on it with `n` live slots.
    async fn measure(
        &self,
        t0: Instant,
        e0: u64,
        n: u32,
        poll: Duration,
        limit: Duration,
    ) -> std::result::Result<(Duration, Duration), String> {
        let mut view = None;
        loop {
            let now = Instant::now();
            if view.is_none() && self.adopted(e0) {
                view = Some(now - t0);
            }
            if self.active_after(e0, n) {
                let active = now - t0;
                return Ok((view.unwrap_or(active), active));
            }
            if now - t0 >= limit {
                return Err(format!(
                    "no convergence within {limit:?} (epoch before {e0}, want {n} live): {}",
                    self.dump()
                ));
            }
            tokio::time::sleep(poll).await;
        }
    }
}

#[derive(Default)]
struct Samples(BTreeMap<&'static str, (Vec<Duration>, Vec<Duration>)>);

impl Samples {
    fn add(&mut self, event: &'static str, (view, active): (Duration, Duration)) {
        let e = self.0.entry(event).or_default();
        e.0.push(view);
        e.1.push(active);
    }
}

fn median_max(v: &[Duration]) -> (Duration, Duration) {
    let mut s = v.to_vec();
    s.sort();
    (s[s.len() / 2], s[s.len() - 1])
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

/// The convergence and steady-state load of one backend; appends Markdown rows to the tables.
async fn convergence(
    backend: ServerKind,
    url: &str,
    reps: usize,
    ttl: Option<Duration>,
    conv: &mut Vec<String>,
    load: &mut Vec<String>,
) -> std::result::Result<(), String> {
    let inner = headcount::connect(url).await.map_err(|e| e.to_string())?;
    let caps = inner.capabilities();
    let counting = Counting::new(inner);
    let store: DynStore = counting.clone();
    let ttl = ttl.unwrap_or(Duration::from_millis(1500)).max(caps.min_ttl);
    let hb = ttl / 3;
    let limit = ttl * 6 + Duration::from_secs(5);
    let poll = Duration::from_millis(2);
    let mut fleet = Fleet {
        store,
        group: group_name(),
        ttl,
        full_reads: false,
        two_calls: false,
        notices: true,
        members: Vec::new(),
    };
    for i in 0..5 {
        fleet.join(&format!("m{i}")).await?;
    }
    fleet.settle(5, limit).await?;

    // Steady state: 10 heartbeats with nothing changing.
    let beats = 10u32;
    let e0 = fleet.settle(5, limit).await?;
    let before = counting.hooks().snapshot();
    let t = Instant::now();
    tokio::time::sleep(hb * beats).await;
    let elapsed = t.elapsed();
    let calls = delta(&before, &counting.hooks().snapshot());
    let e1 = fleet.settle(5, limit).await?;
    if e1 != e0 {
        return Err(format!(
            "the view changed during the steady-state window ({e0} -> {e1})"
        ));
    }
    let per = |n: u64| n as f64 / 5.0 / (elapsed.as_secs_f64() / hb.as_secs_f64());
    let methods = calls
        .iter()
        .map(|(m, n)| format!("{m} {:.2}", per(*n)))
        .collect::<Vec<_>>()
        .join(", ");
    load.push(format!(
        "| {} | {} | {:.2} | {:.2} | {} | {} |",
        backend.name(),
        ms(ttl),
        per(calls.values().sum()),
        per(round_trips(&calls, &caps)),
        methods,
        if caps.native_renew_and_list {
            "native (1 round trip)"
        } else {
            "provided: compare_and_set + list (2)"
        }
    ));

    let mut samples = Samples::default();
    for rep in 0..reps {
        // Join of slot 5.
        let e0 = fleet.settle(5, limit).await?;
        let t0 = Instant::now();
        fleet.join(&format!("x{rep}")).await?;
        samples.add(
            "join (new slot 5)",
            fleet.measure(t0, e0, 6, poll, limit).await?,
        );

        // Graceful leave of slot 5.
        let e0 = fleet.settle(6, limit).await?;
        let i = fleet.index_of_slot(5);
        let (m, _) = fleet.members.remove(i);
        let t0 = Instant::now();
        let leaving = tokio::spawn(m.leave());
        samples.add(
            "graceful leave",
            fleet.measure(t0, e0, 5, poll, limit).await?,
        );
        leaving
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;

        // Join again, then crash it.
        let e0 = fleet.settle(5, limit).await?;
        let t0 = Instant::now();
        fleet.join(&format!("y{rep}")).await?;
        samples.add(
            "join (new slot 5)",
            fleet.measure(t0, e0, 6, poll, limit).await?,
        );
        let e0 = fleet.settle(6, limit).await?;
        let i = fleet.index_of_slot(5);
        let t0 = Instant::now();
        drop(fleet.members.remove(i));
        samples.add(
            "crash (slot 5)",
            fleet.measure(t0, e0, 5, poll, limit).await?,
        );

        // Crash of the lowest slot, the one that publishes a changed view at once.
        let e0 = fleet.settle(5, limit).await?;
        let i = fleet.index_of_slot(0);
        let (m, _) = fleet.members.remove(i);
        let id = m.member().to_owned();
        let t0 = Instant::now();
        drop(m);
        samples.add(
            "crash (lowest slot 0)",
            fleet.measure(t0, e0, 4, poll, limit).await?,
        );
        // The same member id comes back and fills the hole at slot 0.
        let e0 = fleet.settle(4, limit).await?;
        let t0 = Instant::now();
        fleet.join(&id).await?;
        samples.add(
            "join (fills slot 0)",
            fleet.measure(t0, e0, 5, poll, limit).await?,
        );
        eprintln!("{}: repetition {} done", backend.name(), rep + 1);
    }
    let goal = |event: &str| {
        if event.starts_with("crash") {
            ttl + hb
        } else {
            hb
        }
    };
    for (event, (views, actives)) in &samples.0 {
        let (vm, vx) = median_max(views);
        let (am, ax) = median_max(actives);
        let g = goal(event);
        conv.push(format!(
            "| {} | {} | {event} | {} | {} / {} | {} / {} | {} | {:.2} |",
            backend.name(),
            ms(ttl),
            views.len(),
            ms(vm),
            ms(vx),
            ms(am),
            ms(ax),
            ms(g),
            am.as_secs_f64() / g.as_secs_f64(),
        ));
    }
    for (m, _) in fleet.members.drain(..) {
        let _ = m.leave().await;
    }
    Ok(())
}

/// `INFO commandstats` (calls per command) and `INFO cpu` (server CPU seconds) of a Redis.
async fn redis_info(
    conn: &mut redis::aio::MultiplexedConnection,
) -> (BTreeMap<String, u64>, f64, u64) {
    let text: String = redis::cmd("INFO")
        .arg("all")
        .query_async(conn)
        .await
        .unwrap();
    let mut calls = BTreeMap::new();
    let mut cpu = 0.0;
    let mut total = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("cmdstat_") {
            if let Some((cmd, stats)) = rest.split_once(':') {
                let field = |name: &str| -> u64 {
                    stats
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(name))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0)
                };
                calls.insert(cmd.to_owned(), field("calls="));
                // The server time of the scripts, in µs, under a name of its own.
                if cmd == "evalsha" {
                    calls.insert("evalsha usec".to_owned(), field("usec="));
                }
            }
        } else if let Some(v) = line
            .strip_prefix("used_cpu_sys:")
            .or_else(|| line.strip_prefix("used_cpu_user:"))
        {
            cpu += v.trim().parse::<f64>().unwrap_or(0.0);
        } else if let Some(v) = line.strip_prefix("total_commands_processed:") {
            total = v.trim().parse().unwrap_or(0);
        }
    }
    (calls, cpu, total)
}

/// CPU seconds (user + system) used by this process so far.
#[allow(unsafe_code)]
fn own_cpu() -> f64 {
    // SAFETY: rusage is a plain C struct of integers, so all-zero is a valid value, and
    // getrusage only writes into the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0.0;
        }
        ru
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// `n` members on one Redis; appends a Markdown row.
async fn scale(
    url: &str,
    n: usize,
    ttl: Duration,
    design: &str,
    rows: &mut Vec<String>,
    detail: &mut Vec<String>,
) -> std::result::Result<(), String> {
    let inner = headcount::connect(url).await.map_err(|e| e.to_string())?;
    let caps = inner.capabilities();
    let counting = Counting::new(inner);
    let store: DynStore = counting.clone();
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let hb = ttl / 3;
    let limit = ttl * 20 + Duration::from_secs(60);
    let join_cap = Duration::from_secs(150);
    let mut fleet = Fleet {
        store: store.clone(),
        group: group_name(),
        ttl,
        full_reads: design == "full",
        two_calls: design == "two-calls",
        notices: true,
        members: Vec::new(),
    };
    let t0 = Instant::now();
    for i in 0..n {
        fleet.join(&format!("m{i}")).await?;
        if (i + 1) % 100 == 0 {
            eprintln!(
                "scale {n}: {} joined after {:.1} s",
                i + 1,
                t0.elapsed().as_secs_f64()
            );
        }
        if t0.elapsed() > join_cap {
            let rate = (i + 1) as f64 / t0.elapsed().as_secs_f64();
            drop(fleet);
            return Err(format!(
                "gave up joining after {:.0} s with {} of {n} members joined ({rate:.1} joins/s on average)",
                t0.elapsed().as_secs_f64(),
                i + 1
            ));
        }
    }
    let joined = t0.elapsed();
    let e_join = fleet.settle(n as u32, limit).await?;
    let converged = t0.elapsed();

    // Steady state over 5 heartbeats, after five more: a member that does not watch the slot
    // table looks at it one heartbeat in four, and its first look after the joins reads it.
    let beats = 5u32;
    fleet.settle(n as u32, limit).await?;
    tokio::time::sleep(hb * 5).await;
    let e0 = fleet.settle(n as u32, limit).await?;
    let (rc0, cpu0, tot0) = redis_info(&mut conn).await;
    let own0 = own_cpu();
    let before = counting.hooks().snapshot();
    let t = Instant::now();
    tokio::time::sleep(hb * beats).await;
    let secs = t.elapsed().as_secs_f64();
    let calls = delta(&before, &counting.hooks().snapshot());
    let own = own_cpu() - own0;
    let (rc1, cpu1, tot1) = redis_info(&mut conn).await;
    let e1 = fleet.settle(n as u32, limit).await?;
    let steady = if e0 == e1 {
        ""
    } else {
        " (the view changed during the window!)"
    };
    let server_cmds: BTreeMap<String, u64> = rc1
        .iter()
        .map(|(c, v)| (c.clone(), v - rc0.get(c).copied().unwrap_or(0)))
        .filter(|(_, d)| *d > 0)
        .collect();
    let heartbeats = secs / hb.as_secs_f64();
    let per_member_hb = |x: u64| x as f64 / n as f64 / heartbeats;
    let script_usec = server_cmds.get("evalsha usec").copied().unwrap_or(0) as f64
        / server_cmds.get("evalsha").copied().unwrap_or(1).max(1) as f64;
    let view_key = format!("{PREFIX}:{{{}}}:view:current", fleet.group);
    let view_len = store
        .get(&view_key)
        .await
        .map_err(|e| e.to_string())?
        .map_or(0, |v| v.len());
    let slot_len = store
        .get(&format!("{PREFIX}:{{{}}}:slot:0", fleet.group))
        .await
        .map_err(|e| e.to_string())?
        .map_or(0, |v| v.len());

    // One graceful leave of a middle slot, then one crash of another middle slot.
    let e0 = fleet.settle(n as u32, limit).await?;
    let before_changes = counting.hooks().snapshot();
    let i = fleet.index_of_slot(n as u32 / 2);
    let (m, _) = fleet.members.remove(i);
    let t0 = Instant::now();
    let leaving = tokio::spawn(m.leave());
    let (lv, la) = fleet
        .measure(t0, e0, n as u32 - 1, Duration::from_millis(10), limit)
        .await?;
    leaving
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let e0 = fleet.settle(n as u32 - 1, limit).await?;
    let i = fleet.index_of_slot(n as u32 / 3);
    let t0 = Instant::now();
    drop(fleet.members.remove(i));
    let (cv, ca) = fleet
        .measure(t0, e0, n as u32 - 2, Duration::from_millis(10), limit)
        .await?;
    let change_calls = delta(&before_changes, &counting.hooks().snapshot());

    let row = format!(
        "| {n} | {} | {} | {:.1} s | {:.1} s (epoch {e_join}) | {:.0} | {:.2} | {:.0} | {:.2} | {script_usec:.1} | {:.0}% | {:.0}% | {} / {} | {} / {} | {} B | {} B |",
        match design {
            "full" => "full table every heartbeat (before)",
            "two-calls" => "versioned, one call per directory (before)",
            _ => "versioned, both versions in one call",
        },
        ms(ttl),
        joined.as_secs_f64(),
        converged.as_secs_f64(),
        round_trips(&calls, &caps) as f64 / secs,
        per_member_hb(round_trips(&calls, &caps)),
        (tot1 - tot0) as f64 / secs,
        per_member_hb(tot1 - tot0),
        (cpu1 - cpu0) / secs * 100.0,
        own / secs * 100.0,
        ms(lv),
        ms(la),
        ms(cv),
        ms(ca),
        view_len,
        slot_len,
    );
    eprintln!("{row}");
    rows.push(row);
    detail.push(format!(
        "{n} members{steady}: wrapper calls {calls:?}; server commands {server_cmds:?} over {secs:.1} s; wrapper calls from the leave to the crash's convergence: {change_calls:?}; calls over {SLOW:?} or failed, whole run: {:?}",
        counting.hooks().slow_snapshot()
    ));
    fleet.leave_all().await;
    Ok(())
}

/// `url` with the port of its first `127.0.0.1:PORT` replaced by `port`, and the old port.
fn via_port(url: &str, port: u16) -> Option<(String, u16)> {
    let host = "127.0.0.1:";
    let at = url.find(host)? + host.len();
    let end = url[at..]
        .find(|c: char| !c.is_ascii_digit())
        .map_or(url.len(), |e| at + e);
    let old: u16 = url[at..end].parse().ok()?;
    Some((format!("{}{port}{}", &url[..at], &url[end..]), old))
}

/// etcd's request counters (its Prometheus `/metrics` on the client port): gRPC messages
/// received and RPCs started by method, keys put, and write-ahead-log syncs.
async fn etcd_metrics(port: u16) -> BTreeMap<String, f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut out = BTreeMap::new();
    let Ok(mut conn) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return out;
    };
    let request =
        format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if conn.write_all(request.as_bytes()).await.is_err() {
        return out;
    }
    let mut text = String::new();
    let _ = conn.read_to_string(&mut text).await;
    for line in text.lines() {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let method = |rest: &str| {
            rest.split("grpc_method=\"")
                .nth(1)
                .and_then(|m| m.split('"').next())
                .map(str::to_owned)
        };
        let key = if let Some(rest) = name.strip_prefix("grpc_server_msg_received_total{") {
            match method(rest) {
                Some(method) => method,
                None => continue,
            }
        } else if let Some(rest) = name.strip_prefix("grpc_server_started_total{") {
            match method(rest) {
                Some(method) => format!("{method} RPCs started"),
                None => continue,
            }
        } else if name == "etcd_mvcc_put_total" || name == "etcd_debugging_mvcc_put_total" {
            "puts".to_owned()
        } else if name == "etcd_disk_wal_fsync_duration_seconds_count" {
            "WAL syncs".to_owned()
        } else {
            continue;
        };
        *out.entry(key).or_default() += value;
    }
    out
}

/// Puts `n` unrelated keys (no TTL, 64 bytes each) in the store at `url`, as a user's store
/// holding other data would, unless a previous run did.
async fn fill_store(url: &str, n: u64) -> std::result::Result<(), String> {
    let store = headcount::connect(url).await.map_err(|e| e.to_string())?;
    let last = format!("unrelated:{:08}", n - 1);
    if store.get(&last).await.map_err(|e| e.to_string())?.is_some() {
        return Ok(());
    }
    let value = "u".repeat(64);
    let t = Instant::now();
    let mut next = 0u64;
    while next < n {
        let batch: Vec<u64> = (next..(next + 256).min(n)).collect();
        next += batch.len() as u64;
        futures::future::try_join_all(batch.iter().map(|i| {
            let key = format!("unrelated:{i:08}");
            let (store, value) = (&store, &value);
            async move {
                let _ = store.compare_and_set(&key, None, value, None).await?;
                Ok::<_, headcount::Error>(())
            }
        }))
        .await
        .map_err(|e| e.to_string())?;
    }
    eprintln!(
        "filled {n} unrelated keys in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `n` members on the store at `url` (PostgreSQL, SQLite, etcd), reached through a counting
/// proxy when it is a server; returns a Markdown row: store calls and bytes per member per
/// heartbeat in the steady state, and a crash's convergence.
async fn scale_store(
    backend: ServerKind,
    url: &str,
    n: usize,
    ttl: Duration,
    unrelated: u64,
) -> std::result::Result<String, String> {
    let proxy = match via_port(url, 0) {
        Some((_, port)) => Some(
            headcount_harness::Proxy::start(port)
                .await
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let upstream = via_port(url, 0).map(|(_, port)| port);
    let url = match &proxy {
        Some(p) => via_port(url, p.port()).map(|(u, _)| u).unwrap_or_default(),
        None => url.to_owned(),
    };
    let inner = headcount::connect(&url).await.map_err(|e| e.to_string())?;
    let caps = inner.capabilities();
    let counting = Counting::new(inner);
    let store: DynStore = counting.clone();
    let hb = ttl / 3;
    let limit = ttl * 20 + Duration::from_secs(60);
    let mut fleet = Fleet {
        store: store.clone(),
        group: group_name(),
        ttl,
        full_reads: false,
        two_calls: false,
        notices: true,
        members: Vec::new(),
    };
    let t0 = Instant::now();
    for i in 0..n {
        fleet.join(&format!("m{i}")).await?;
    }
    fleet.settle(n as u32, limit).await?;
    let converged = t0.elapsed();
    tokio::time::sleep(hb * 5).await;
    let e0 = fleet.settle(n as u32, limit).await?;
    let bytes0 = proxy.as_ref().map(|p| p.bytes());
    let etcd_port = match backend {
        ServerKind::Etcd => upstream,
        _ => None,
    };
    let metrics0 = match etcd_port {
        Some(port) => etcd_metrics(port).await,
        None => BTreeMap::new(),
    };
    let own0 = own_cpu();
    let before = counting.hooks().snapshot();
    let t = Instant::now();
    let beats = 5u32;
    tokio::time::sleep(hb * beats).await;
    let secs = t.elapsed().as_secs_f64();
    let calls = delta(&before, &counting.hooks().snapshot());
    let own = own_cpu() - own0;
    let bytes1 = proxy.as_ref().map(|p| p.bytes());
    let metrics1 = match etcd_port {
        Some(port) => etcd_metrics(port).await,
        None => BTreeMap::new(),
    };
    let e1 = fleet.settle(n as u32, limit).await?;
    let steady = if e0 == e1 {
        ""
    } else {
        " (the view changed during the window!)"
    };
    let heartbeats = secs / hb.as_secs_f64();
    let per_member_hb = |x: u64| x as f64 / n as f64 / heartbeats;
    let bytes = match (bytes0, bytes1) {
        (Some((t0, f0)), Some((t1, f1))) => format!(
            "{:.0} / {:.0}",
            per_member_hb(t1 - t0),
            per_member_hb(f1 - f0)
        ),
        _ => "in process".to_owned(),
    };
    let server: Vec<String> = metrics1
        .iter()
        .map(|(k, v)| (k, v - metrics0.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .map(|(k, d)| format!("{k} {:.2}", d / n as f64 / heartbeats))
        .collect();
    let server = if server.is_empty() {
        "-".to_owned()
    } else {
        server.join(", ")
    };
    let i = fleet.index_of_slot(n as u32 / 3);
    let t0 = Instant::now();
    drop(fleet.members.remove(i));
    let (cv, ca) = fleet
        .measure(t0, e1, n as u32 - 1, Duration::from_millis(10), limit)
        .await?;
    let row = format!(
        "| {} | {n} | {unrelated} | {} | {:.1} s | {:.2} | {:.2} | {bytes} | {server} | {:.0}% | {} / {} |{steady} {calls:?} |",
        backend.name(),
        ms(ttl),
        converged.as_secs_f64(),
        per_member_hb(calls.values().sum()),
        per_member_hb(round_trips(&calls, &caps)),
        own / secs * 100.0,
        ms(cv),
        ms(ca),
    );
    eprintln!("{row}");
    fleet.leave_all().await;
    Ok(row)
}

/// The notify part's two modes, run side by side: members that listen to the store's change
/// notifications (the default) and members that only poll (`with_notifications(false)`).
const MODES: [(&str, bool); 2] = [("notices", true), ("polling", false)];

/// The notify part's events, in the order of its table.
const NOTIFY_EVENTS: [&str; 3] = ["join", "graceful leave", "hand-over to a standby"];

impl Fleet {
    /// Every member is active on one epoch above `e0` whose view names exactly them: as many
    /// live slots as members, each member's slot among them.
    fn named_after(&self, e0: u64) -> bool {
        let n = self.members.len();
        let Some((_, first)) = self.members.first() else {
            return false;
        };
        let epoch = first.borrow().epoch;
        epoch > e0
            && self.members.iter().all(|(_, rx)| {
                let a = rx.borrow();
                a.phase == GroupPhase::Active
                    && a.epoch == epoch
                    && a.live.len() == n
                    && a.slot.is_some_and(|s| a.live.contains(&s))
            })
    }

    /// The times from `t0` until [`Fleet::named_after`] `e0`, looking every millisecond, until
    /// every member had adopted a view above `e0` ([`Fleet::adopted`]), and until the first
    /// member had.
    async fn until_named(
        &self,
        t0: Instant,
        e0: u64,
        limit: Duration,
    ) -> std::result::Result<[Duration; 3], String> {
        let mut adopted = None;
        let mut first = None;
        loop {
            if first.is_none()
                && self.members.iter().any(|(_, rx)| {
                    let a = rx.borrow();
                    a.epoch > e0 || a.phase == GroupPhase::Handoff
                })
            {
                first = Some(t0.elapsed());
            }
            if adopted.is_none() && self.adopted(e0) {
                adopted = Some(t0.elapsed());
            }
            if self.named_after(e0) {
                let named = t0.elapsed();
                return Ok([named, adopted.unwrap_or(named), first.unwrap_or(named)]);
            }
            if t0.elapsed() >= limit {
                return Err(format!(
                    "no view naming all {} members above epoch {e0} within {limit:?}: {}",
                    self.members.len(),
                    self.dump()
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The member holding the middle one of the held slots.
    fn middle(&self) -> usize {
        let mut held: Vec<(u32, usize)> = self
            .members
            .iter()
            .enumerate()
            .filter_map(|(i, (_, rx))| rx.borrow().slot.map(|s| (s, i)))
            .collect();
        held.sort_unstable();
        held[held.len() / 2].1
    }
}

/// What one event of the notify part took: until every member was active under a view naming
/// them all, until every member had adopted it, the store calls made meanwhile (by every member
/// of both groups) and this process's CPU time.
#[derive(Clone, Copy)]
struct Took {
    named: Duration,
    adopted: Duration,
    /// Until the first member adopted it.
    first: Duration,
    calls: u64,
    cpu: f64,
    /// Bytes from the server through the proxy (both groups).
    bytes: u64,
}

/// What an event is measured by, and from where it is measured.
#[derive(Clone, Copy)]
struct Meters<'a> {
    counting: &'a Counting,
    proxy: Option<&'a headcount_harness::Proxy>,
}

/// Starts measuring an event at `t0`.
struct EventStart {
    t0: Instant,
    calls: BTreeMap<&'static str, u64>,
    cpu: f64,
    bytes: u64,
}

impl EventStart {
    fn now(meters: Meters<'_>) -> EventStart {
        EventStart {
            calls: meters.counting.snapshot(),
            cpu: own_cpu(),
            bytes: meters.proxy.map_or(0, |p| p.bytes().1),
            t0: Instant::now(),
        }
    }

    async fn until_named(
        self,
        fleet: &Fleet,
        meters: Meters<'_>,
        e0: u64,
        limit: Duration,
    ) -> std::result::Result<Took, String> {
        let [named, adopted, first] = fleet.until_named(self.t0, e0, limit).await?;
        Ok(Took {
            named,
            adopted,
            first,
            calls: delta(&self.calls, &meters.counting.snapshot())
                .values()
                .sum(),
            cpu: own_cpu() - self.cpu,
            bytes: meters.proxy.map_or(0, |p| p.bytes().1) - self.bytes,
        })
    }
}

/// One repetition of the notify part's events on a settled fleet of `n` members, which it leaves
/// with `n` members: a join, a graceful leave of the member in the middle, and a hand-over of
/// the middle member's slot to a standby.
async fn notify_events(
    fleet: &mut Fleet,
    meters: Meters<'_>,
    n: usize,
    rep: usize,
    limit: Duration,
    samples: &mut BTreeMap<&'static str, Vec<Took>>,
) -> std::result::Result<(), String> {
    let n32 = n as u32;
    // A join: a new member, from the join call.
    let e0 = fleet.settle(n32, limit).await?;
    let start = EventStart::now(meters);
    fleet.join(&format!("j{rep}")).await?;
    let took = start.until_named(fleet, meters, e0, limit).await?;
    samples.entry(NOTIFY_EVENTS[0]).or_default().push(took);

    // A graceful leave of the member in the middle, from the leave call.
    let e0 = fleet.settle(n32 + 1, limit).await?;
    let (m, _) = fleet.members.remove(fleet.middle());
    let start = EventStart::now(meters);
    let leaving = tokio::spawn(m.leave());
    let took = start.until_named(fleet, meters, e0, limit).await?;
    samples.entry(NOTIFY_EVENTS[1]).or_default().push(took);
    leaving
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("leave: {e}"))?;

    // A view change replacing a member: a standby (a new member id) stands by, ready; the
    // member in the middle leaves gracefully and hands it its slot. From the leave call until
    // every member, the standby included, is active under one view naming them all.
    let e0 = fleet.settle(n32, limit).await?;
    let id = format!("s{rep}");
    let cfg = fleet.config(&id).with_standby(limit);
    fleet.join_with(&id, cfg).await?;
    let standby = &fleet.members.last().expect("just joined").0;
    tokio::time::timeout(limit, standby.wait_ready())
        .await
        .map_err(|_| format!("standby {id} not ready within {limit:?}"))?
        .map_err(|e| format!("standby {id}: {e}"))?;
    let phase = standby.assignment().phase;
    if phase != GroupPhase::Standby {
        return Err(format!("{id} is {} instead of standing by", phase.as_str()));
    }
    let (m, _) = fleet.members.remove(fleet.middle());
    let start = EventStart::now(meters);
    let leaving = tokio::spawn(m.leave());
    let took = start.until_named(fleet, meters, e0, limit).await?;
    samples.entry(NOTIFY_EVENTS[2]).or_default().push(took);
    leaving
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("leave before a hand-over: {e}"))?;
    Ok(())
}

/// What the notify part reads of a server around a steady-state window: the bytes through the
/// counting proxy, Redis's commands, etcd's requests.
struct ServerProbe {
    proxy: Option<headcount_harness::Proxy>,
    redis: Option<redis::aio::MultiplexedConnection>,
    etcd_port: Option<u16>,
}

#[derive(Default)]
struct ServerReading {
    bytes: Option<(u64, u64)>,
    redis: Option<(BTreeMap<String, u64>, u64)>,
    etcd: BTreeMap<String, f64>,
}

impl ServerProbe {
    async fn read(&mut self) -> ServerReading {
        let redis = match &mut self.redis {
            Some(conn) => {
                let (calls, _, total) = redis_info(conn).await;
                Some((calls, total))
            }
            None => None,
        };
        ServerReading {
            bytes: self.proxy.as_ref().map(|p| p.bytes()),
            redis,
            etcd: match self.etcd_port {
                Some(port) => etcd_metrics(port).await,
                None => BTreeMap::new(),
            },
        }
    }
}

/// Steady-state load of one mode, per member per heartbeat.
struct Load {
    calls: f64,
    round_trips: f64,
    /// Bytes to and from the server.
    bytes: Option<(f64, f64)>,
    /// Redis commands processed, or etcd gRPC messages received.
    requests: Option<f64>,
    detail: String,
}

/// The steady-state load of `fleet` (alone on its store) over `beats` heartbeats.
#[allow(clippy::too_many_arguments)]
async fn steady_load(
    fleet: &Fleet,
    counting: &Decorated<Counting>,
    caps: &Capabilities,
    probe: &mut ServerProbe,
    hb: Duration,
    beats: u32,
    limit: Duration,
) -> std::result::Result<Load, String> {
    let n = fleet.members.len() as u32;
    let e0 = fleet.settle(n, limit).await?;
    let s0 = probe.read().await;
    let before = counting.hooks().snapshot();
    let t = Instant::now();
    tokio::time::sleep(hb * beats).await;
    let secs = t.elapsed().as_secs_f64();
    let calls = delta(&before, &counting.hooks().snapshot());
    let s1 = probe.read().await;
    let e1 = fleet.settle(n, limit).await?;
    if e1 != e0 {
        return Err(format!(
            "the view changed during the steady-state window ({e0} -> {e1})"
        ));
    }
    let per = |x: f64| x / f64::from(n) / (secs / hb.as_secs_f64());
    let bytes = match (s0.bytes, s1.bytes) {
        (Some((t0, f0)), Some((t1, f1))) => Some((per((t1 - t0) as f64), per((f1 - f0) as f64))),
        _ => None,
    };
    let mut server: Vec<String> = Vec::new();
    let requests = match (&s0.redis, &s1.redis) {
        (Some((c0, tot0)), Some((c1, tot1))) => {
            for (c, v) in c1 {
                let d = v - c0.get(c).copied().unwrap_or(0);
                if d > 0 && c != "evalsha usec" {
                    server.push(format!("{c} {:.2}", per(d as f64)));
                }
            }
            // The PEXPIREs beyond a renewal's one per script call refresh version keys, in a
            // window placed by a hash of the member's key (the group name is random): take
            // them out, so the two modes compare what they do rather than where their windows
            // fall; the detail lists them.
            let d = |c: &str| c1.get(c).copied().unwrap_or(0) - c0.get(c).copied().unwrap_or(0);
            let refresh = d("pexpire").saturating_sub(d("evalsha"));
            Some(per((tot1 - tot0 - refresh) as f64))
        }
        _ if !s1.etcd.is_empty() => {
            let mut received = 0.0;
            for (k, v) in &s1.etcd {
                let d = v - s0.etcd.get(k).copied().unwrap_or(0.0);
                if d > 0.0 {
                    server.push(format!("{k} {:.2}", per(d)));
                    if !k.contains(' ') && k != "puts" {
                        received += d;
                    }
                }
            }
            Some(per(received))
        }
        _ => None,
    };
    let methods = calls
        .iter()
        .map(|(m, c)| format!("{m} {:.2}", per(*c as f64)))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(Load {
        calls: per(calls.values().sum::<u64>() as f64),
        round_trips: per(round_trips(&calls, caps) as f64),
        bytes,
        requests,
        detail: if server.is_empty() {
            format!("store calls: {methods}")
        } else {
            format!("store calls: {methods}; server: {}", server.join(", "))
        },
    })
}

/// The sorted samples' median and tail: the 99th percentile with 100 samples or more, else the
/// maximum (named so).
fn median_tail(v: &[Duration]) -> (Duration, Duration, &'static str) {
    let mut s = v.to_vec();
    s.sort();
    let median = s[s.len() / 2];
    if s.len() >= 100 {
        let i = (s.len() * 99).div_ceil(100) - 1;
        (median, s[i], "p99")
    } else {
        (median, s[s.len() - 1], "max")
    }
}

fn change(polling: f64, notices: f64) -> String {
    if polling == 0.0 {
        return "-".to_owned();
    }
    format!("{:+.1}%", (notices / polling - 1.0) * 100.0)
}

/// One group of `n` members per mode on the store at `url`, both alive on their own store
/// handles: the steady-state load of each alone, and `reps` repetitions of the events,
/// alternating the modes. Appends Markdown rows.
#[allow(clippy::too_many_arguments)]
async fn notify(
    backend: ServerKind,
    url: &str,
    n: usize,
    ttl: Option<Duration>,
    reps: usize,
    conv: &mut Vec<String>,
    load: &mut Vec<String>,
    detail: &mut Vec<String>,
) -> std::result::Result<(), String> {
    // A counting proxy in front of a server, as in the stores part.
    let upstream = via_port(url, 0).map(|(_, port)| port);
    let proxy = match upstream {
        Some(port) => Some(
            headcount_harness::Proxy::start(port)
                .await
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let url = match &proxy {
        Some(p) => via_port(url, p.port()).map(|(u, _)| u).unwrap_or_default(),
        None => url.to_owned(),
    };
    let redis = match backend {
        ServerKind::Redis => Some(
            redis::Client::open(url.as_str())
                .map_err(|e| e.to_string())?
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?,
        ),
        _ => None,
    };
    let mut probe = ServerProbe {
        proxy,
        redis,
        etcd_port: if backend == ServerKind::Etcd {
            upstream
        } else {
            None
        },
    };

    // One store handle per mode (one subscription for the members that listen).
    let mut counting = Vec::new();
    let mut fleets = Vec::new();
    let mut caps = None;
    let mut limit = Duration::ZERO;
    let mut hb = Duration::ZERO;
    for (_, notices) in MODES {
        let inner = headcount::connect(&url).await.map_err(|e| e.to_string())?;
        let c = inner.capabilities();
        let ttl = ttl.unwrap_or(Duration::from_secs(6)).max(c.min_ttl);
        hb = ttl / 3;
        limit = ttl * 6 + Duration::from_secs(10);
        caps = Some(c);
        let wrapped = Counting::new(inner);
        let store: DynStore = wrapped.clone();
        counting.push(wrapped);
        fleets.push(Fleet {
            store,
            group: group_name(),
            ttl,
            full_reads: false,
            two_calls: false,
            notices,
            members: Vec::new(),
        });
    }
    let caps = caps.expect("two modes");
    let ttl = fleets[0].ttl;
    let ids: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
    let beats = 5;
    let mut loads: [Option<Load>; 2] = [None, None];

    // Polling first, alone on the store: start, settle, four heartbeats, then its load.
    let t = Instant::now();
    fleets[1].join_batches(&ids, 50).await?;
    fleets[1].settle(n as u32, limit).await?;
    eprintln!(
        "notify {} {n}: polling group active after {:.1} s",
        backend.name(),
        t.elapsed().as_secs_f64()
    );
    tokio::time::sleep(hb * 4).await;
    loads[1] = Some(
        steady_load(
            &fleets[1],
            &counting[1],
            &caps,
            &mut probe,
            hb,
            beats,
            limit,
        )
        .await?,
    );

    // Then the group that listens, beside it.
    let t = Instant::now();
    fleets[0].join_batches(&ids, 50).await?;
    fleets[0].settle(n as u32, limit).await?;
    eprintln!(
        "notify {} {n}: listening group active after {:.1} s",
        backend.name(),
        t.elapsed().as_secs_f64()
    );
    let view_key = format!("{PREFIX}:{{{}}}:view:current", fleets[0].group);
    let view_len = fleets[0]
        .store
        .get(&view_key)
        .await
        .map_err(|e| e.to_string())?
        .map_or(0, |v| v.len());
    detail.push(format!(
        "{} {n}: view record {view_len} bytes",
        backend.name()
    ));
    tokio::time::sleep(hb * 2).await;

    let mut samples: [BTreeMap<&'static str, Vec<Took>>; 2] = Default::default();
    let t = Instant::now();
    for rep in 0..reps {
        let order = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
        for mode in order {
            let meters = Meters {
                counting: counting[mode].hooks(),
                proxy: probe.proxy.as_ref(),
            };
            notify_events(&mut fleets[mode], meters, n, rep, limit, &mut samples[mode])
                .await
                .map_err(|e| format!("{} repetition {}: {e}", MODES[mode].0, rep + 1))?;
        }
        eprintln!(
            "notify {} {n}: repetition {} done after {:.1} s",
            backend.name(),
            rep + 1,
            t.elapsed().as_secs_f64()
        );
    }

    // The listening group's load, alone again, as long after its last change as the polling
    // group's was.
    fleets[1].leave_all().await;
    tokio::time::sleep(hb * 4).await;
    loads[0] = Some(
        steady_load(
            &fleets[0],
            &counting[0],
            &caps,
            &mut probe,
            hb,
            beats,
            limit,
        )
        .await?,
    );
    fleets[0].leave_all().await;

    for event in NOTIFY_EVENTS {
        let named = |mode: usize| -> Vec<Duration> {
            samples[mode][event].iter().map(|t| t.named).collect()
        };
        let on = median_tail(&named(0));
        let off = median_tail(&named(1));
        let met = on.0 < Duration::from_millis(100) && on.1 < Duration::from_millis(250);
        conv.push(format!(
            "| {} | {n} | {} | {event} | {} | {} / {} {} | {} / {} {} | {:.1} | {} |",
            backend.name(),
            ms(ttl),
            samples[0][event].len(),
            ms(on.0),
            ms(on.1),
            on.2,
            ms(off.0),
            ms(off.1),
            off.2,
            off.0.as_secs_f64() / on.0.as_secs_f64().max(1e-6),
            if met { "yes" } else { "**no**" },
        ));
        for (mode, name) in [(0, "notices"), (1, "polling")] {
            let v = &samples[mode][event];
            let mut calls: Vec<u64> = v.iter().map(|t| t.calls).collect();
            calls.sort_unstable();
            let mut cpu: Vec<f64> = v.iter().map(|t| t.cpu).collect();
            cpu.sort_by(f64::total_cmp);
            let mut bytes: Vec<u64> = v.iter().map(|t| t.bytes).collect();
            bytes.sort_unstable();
            detail.push(format!(
                "{} {n} {event}, {name}: all active {:?} ms; all adopted the view {:?} ms; the first adopted it {:?} ms; median {} store calls, {} bytes from the server and {:.0} ms of this process's CPU per event",
                backend.name(),
                v.iter().map(|t| t.named.as_millis()).collect::<Vec<_>>(),
                v.iter().map(|t| t.adopted.as_millis()).collect::<Vec<_>>(),
                v.iter().map(|t| t.first.as_millis()).collect::<Vec<_>>(),
                calls[calls.len() / 2],
                bytes[bytes.len() / 2],
                cpu[cpu.len() / 2] * 1000.0,
            ));
        }
    }
    let [Some(on), Some(off)] = loads else {
        unreachable!("both loads measured")
    };
    let both = |f: &dyn Fn(&Load) -> Option<f64>| match (f(&off), f(&on)) {
        (Some(a), Some(b)) => format!("{a:.2} / {b:.2} | {}", change(a, b)),
        _ => "- | -".to_owned(),
    };
    load.push(format!(
        "| {} | {n} | {} | {} | {} | {} | {} |",
        backend.name(),
        ms(ttl),
        both(&|l| Some(l.calls)),
        both(&|l| Some(l.round_trips)),
        both(&|l| l.requests),
        both(&|l| l.bytes.map(|(to, from)| to + from)),
    ));
    for (mode, l) in [("polling", &off), ("notices", &on)] {
        detail.push(format!(
            "{} {n} steady state, {mode}: {}{}",
            backend.name(),
            l.detail,
            l.bytes
                .map(|(to, from)| format!("; bytes to / from the server {to:.0} / {from:.0}"))
                .unwrap_or_default()
        ));
    }
    Ok(())
}

/// What one `headcount run` process printed last, and when.
#[derive(Default, Clone)]
struct Printed {
    phase: String,
    index: Option<u64>,
    replicas: u64,
    epoch: u64,
}

/// Kills (SIGKILL) the processes left on drop, so a failed run leaves none behind.
struct Procs(Vec<std::process::Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until every process in `alive` printed `active` with `replicas = n` on one epoch above
/// `above`, with distinct indexes; returns that epoch.
async fn all_active(
    rx: &std::sync::mpsc::Receiver<(usize, Printed)>,
    last: &mut [Printed],
    alive: &[usize],
    n: u64,
    above: u64,
    limit: Instant,
) -> std::result::Result<u64, String> {
    loop {
        while let Ok((i, p)) = rx.try_recv() {
            last[i] = p;
        }
        let epoch = last[alive[0]].epoch;
        let mut indexes: Vec<u64> = alive.iter().filter_map(|&i| last[i].index).collect();
        indexes.sort_unstable();
        indexes.dedup();
        let done = epoch > above
            && indexes.len() == alive.len()
            && alive.iter().all(|&i| {
                let p = &last[i];
                p.phase == "active" && p.replicas == n && p.epoch == epoch
            });
        if done {
            return Ok(epoch);
        }
        if Instant::now() > limit {
            let active = alive.iter().filter(|&&i| last[i].phase == "active").count();
            let behind: Vec<String> = alive
                .iter()
                .filter(|&&i| {
                    let p = &last[i];
                    p.phase != "active" || p.replicas != n || p.epoch != epoch
                })
                .take(5)
                .map(|&i| {
                    let p = &last[i];
                    format!(
                        "process {i}: {} epoch {} replicas {} index {:?}",
                        p.phase, p.epoch, p.replicas, p.index
                    )
                })
                .collect();
            return Err(format!(
                "{active} of {} active, not all with replicas {n} on one epoch above {above} (epoch of the first: {epoch}; behind: {})",
                alive.len(),
                behind.join("; ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `n` `headcount run` processes on the Redis at `url`; returns a Markdown row.
async fn processes(
    bin: &std::path::Path,
    url: &str,
    n: usize,
    ttl: Duration,
    unrelated: u64,
) -> std::result::Result<String, String> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    if !bin.exists() {
        return Err(format!(
            "no headcount binary at {} (cargo build --release -p headcount-cli, or --headcount PATH)",
            bin.display()
        ));
    }
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let group = group_name();
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Printed)>();
    let mut procs = Procs(Vec::new());
    for i in 0..n {
        let mut child = Command::new(bin)
            .args([
                "run",
                "--store",
                url,
                "--group",
                &group,
                "--member",
                &format!("m{i}"),
            ])
            .arg("--ttl")
            .arg(format!("{}ms", ttl.as_millis()))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        let out = child.stdout.take().expect("stdout");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                let p = Printed {
                    phase: v["phase"].as_str().unwrap_or_default().to_owned(),
                    index: v["index"].as_u64(),
                    replicas: v["replicas"].as_u64().unwrap_or(0),
                    epoch: v["epoch"].as_u64().unwrap_or(0),
                };
                if tx.send((i, p)).is_err() {
                    break;
                }
            }
        });
        procs.0.push(child);
    }
    let started = Instant::now();
    let limit = ttl * 20 + Duration::from_secs(60);
    let mut last = vec![Printed::default(); n];
    let mut alive: Vec<usize> = (0..n).collect();
    let e0 = all_active(&rx, &mut last, &alive, n as u64, 0, started + limit).await?;
    let active_after = started.elapsed();

    // Steady state over 5 heartbeats, after five more (as in the scale part: a member that does
    // not watch the slot table looks at it one heartbeat in four, and its first look after the
    // joins reads it).
    let hb = ttl / 3;
    tokio::time::sleep(hb * 5).await;
    let (rc0, cpu0, tot0) = redis_info(&mut conn).await;
    let t = Instant::now();
    tokio::time::sleep(hb * 5).await;
    let secs = t.elapsed().as_secs_f64();
    let (rc1, cpu1, tot1) = redis_info(&mut conn).await;
    let script_calls =
        rc1.get("evalsha").copied().unwrap_or(0) - rc0.get("evalsha").copied().unwrap_or(0);
    let script_usec = (rc1.get("evalsha usec").copied().unwrap_or(0)
        - rc0.get("evalsha usec").copied().unwrap_or(0)) as f64
        / script_calls.max(1) as f64;
    let per_member_hb = (tot1 - tot0) as f64 / n as f64 / (secs / hb.as_secs_f64());
    let commands: BTreeMap<&String, u64> = rc1
        .iter()
        .map(|(c, v)| (c, v - rc0.get(c).copied().unwrap_or(0)))
        .filter(|(_, d)| *d > 0)
        .collect();
    eprintln!("processes {n}: server commands over {secs:.1} s: {commands:?}");

    // kill -9 of a middle process.
    let victim = n / 2;
    let killed = Instant::now();
    procs.0[victim].kill().map_err(|e| e.to_string())?;
    alive.retain(|&i| i != victim);
    let e1 = all_active(&rx, &mut last, &alive, n as u64 - 1, e0, killed + limit).await?;
    let converged = killed.elapsed();
    Ok(format!(
        "| {n} | {unrelated} | {} | {:.1} s (epoch {e0}) | {:.0} | {per_member_hb:.2} | {script_usec:.1} | {:.0}% | {:.1} s (epoch {e1}) | {:.1} s |",
        ms(ttl),
        active_after.as_secs_f64(),
        (tot1 - tot0) as f64 / secs,
        (cpu1 - cpu0) / secs * 100.0,
        converged.as_secs_f64(),
        (ttl + hb * 2).as_secs_f64(),
    ))
}

/// A Redis of its own for the scale and processes parts (`DEBUG` enabled, to fill it), or `None`
/// when Redis is not installed and not required.
fn own_redis(part: &str) -> Option<KvStore> {
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
async fn fill_redis(url: &str, unrelated: u64) {
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        if o.only.iter().any(|p| p == "convergence") {
            let mut conv = Vec::new();
            let mut load = Vec::new();
            for &backend in &o.backends {
                let Some(url) = url_of(backend).await else {
                    continue;
                };
                if let Err(e) = convergence(backend, &url, o.reps, o.ttl, &mut conv, &mut load).await {
                    panic!("{}: {e}", backend.name());
                }
            }
            println!("\n### Steady state: store calls per member per heartbeat (5 members, 10 heartbeats)\n");
            println!("| backend | TTL ms | calls | round trips | by method | renew_and_list |");
            println!("|---|---:|---:|---:|---|---|");
            for r in &load {
                println!("{r}");
            }
            println!("\n### Convergence per event (5 members; ms, median / max)\n");
            println!("| backend | TTL ms | event | n | view adopted | all active | goal | active median / goal |");
            println!("|---|---:|---|---:|---:|---:|---:|---:|");
            for r in &conv {
                println!("{r}");
            }
        }
        if o.only.iter().any(|p| p == "scale") {
            // A Redis of its own, holding unrelated data first, as a user's would.
            let Some(server) = own_redis("scale") else {
                return;
            };
            let url = server.url();
            let mut rows = Vec::new();
            let mut detail = Vec::new();
            for &n in &o.scale {
                for design in &o.designs {
                    fill_redis(&url, o.unrelated).await;
                    eprintln!("scale: {n} members, {design}, {} unrelated keys", o.unrelated);
                    if let Err(e) = scale(&url, n, o.scale_ttl, design, &mut rows, &mut detail).await {
                        eprintln!("scale {n}: FAILED: {e}");
                        rows.push(format!("| {n} | {design} | failed: {e} |"));
                    }
                }
            }
            println!("\n### One group on one local Redis holding {} unrelated keys\n", o.unrelated);
            println!("| members | heartbeat | TTL ms | all joined | all active | round trips/s (wrapper) | per member per heartbeat | server commands/s | per member per heartbeat | server µs per script call | Redis CPU | client CPU | leave: view / active ms | crash: view / active ms | view record | slot record |");
            println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
            for r in &rows {
                println!("{r}");
            }
            println!();
            for d in &detail {
                println!("- {d}");
            }
        }
        if o.only.iter().any(|p| p == "stores") {
            let mut rows = Vec::new();
            for &backend in &o.backends {
                let Some(url) = url_of(backend).await else {
                    continue;
                };
                let unrelated = o.unrelated.min(100_000);
                if let Err(e) = fill_store(&url, unrelated).await {
                    panic!("{}: filling: {e}", backend.name());
                }
                for &n in &o.scale {
                    eprintln!("stores: {} members on {}", n, backend.name());
                    match scale_store(backend, &url, n, o.scale_ttl, unrelated).await {
                        Ok(row) => rows.push(row),
                        Err(e) => rows.push(format!("| {} | {n} | failed: {e} |", backend.name())),
                    }
                }
            }
            println!("\n### One group on the other stores, each holding unrelated keys\n");
            println!("| backend | members | unrelated keys | TTL ms | all active | store calls per member per heartbeat | round trips | bytes per member per heartbeat (to / from the server) | server requests per member per heartbeat | client CPU | crash: view / active ms | calls in the window |");
            println!("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|");
            for r in &rows {
                println!("{r}");
            }
        }
        if o.only.iter().any(|p| p == "notify") {
            let started = Instant::now();
            let (mut conv, mut load, mut detail) = (Vec::new(), Vec::new(), Vec::new());
            for &backend in &o.backends {
                let Some(url) = url_of(backend).await else {
                    continue;
                };
                let unrelated = o.unrelated.min(100_000);
                if let Err(e) = fill_store(&url, unrelated).await {
                    panic!("{}: filling: {e}", backend.name());
                }
                for &n in &o.sizes {
                    let reps = o.notify_reps.unwrap_or(10);
                    eprintln!("notify: {n} members on {}, {reps} repetitions", backend.name());
                    let t = Instant::now();
                    if let Err(e) = notify(backend, &url, n, o.ttl, reps, &mut conv, &mut load, &mut detail).await {
                        eprintln!("notify {} {n}: FAILED: {e}", backend.name());
                        conv.push(format!("| {} | {n} | failed: {e} |", backend.name()));
                    }
                    detail.push(format!("{} {n}: {:.0} s", backend.name(), t.elapsed().as_secs_f64()));
                }
            }
            println!("\n### Convergence with and without change notifications (ms from the call until every member is active under one view naming all)\n");
            println!("| backend | members | TTL ms | event | reps | notices: median / tail | polling: median / tail | polling ÷ notices (medians) | goal (< 100 median, < 250 p99) |");
            println!("|---|---:|---:|---|---:|---:|---:|---:|---|");
            for r in &conv {
                println!("{r}");
            }
            println!("\n### Steady-state load per member per heartbeat, polling / notices (each group alone on its store)\n");
            println!("| backend | members | TTL ms | store calls | change | round trips | change | server requests (Redis commands without version-key refreshes, etcd gRPC messages) | change | bytes to + from the server | change |");
            println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
            for r in &load {
                println!("{r}");
            }
            println!();
            for d in &detail {
                println!("- {d}");
            }
            println!("- whole part: {:.0} s", started.elapsed().as_secs_f64());
        }
        if o.only.iter().any(|p| p == "processes") {
            let Some(server) = own_redis("processes") else {
                return;
            };
            let url = server.url();
            fill_redis(&url, o.unrelated).await;
            eprintln!("processes: {} `headcount run`, {} unrelated keys", o.processes, o.unrelated);
            let row = match processes(&o.headcount, &url, o.processes, o.scale_ttl, o.unrelated).await {
                Ok(row) => row,
                Err(e) => {
                    eprintln!("processes: FAILED: {e}");
                    format!("| {} | {} | failed: {e} |", o.processes, o.unrelated)
                }
            };
            println!("\n### `headcount run` processes in one group on one local Redis\n");
            println!("| processes | unrelated keys | TTL ms | all active after the last start | server commands/s | per member per heartbeat | server µs per script call | Redis CPU | kill -9 of one: all others active on a newer view | goal (TTL + 2 heartbeats) |");
            println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
            println!("{row}");
        }
    });
}
