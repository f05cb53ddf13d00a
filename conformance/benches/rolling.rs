//! Rolling deploys measured on real servers: every member of a group restarted one after the
//! other, in each of the ways a deploy tool does it, with what each costs the keys.
//!
//! ```sh
//! HEADCOUNT_REQUIRE_BACKENDS=all cargo bench -p headcount-conformance --bench rolling
//! cargo bench -p headcount-conformance --bench rolling -- --backends redis,sqlite --sizes 10,50
//! cargo bench -p headcount-conformance --bench rolling -- --styles static,leave --restart-ms 500
//! cargo bench -p headcount-conformance --bench rolling -- --styles static,replace --notifications both
//! cargo bench -p headcount-conformance --bench rolling -- --styles leave,surge --assignors jumpback,balanced,sticky
//! cargo bench -p headcount-conformance --bench rolling -- --styles kill,kill-grace,checkpoint,twin --assignors sticky
//! cargo bench -p headcount-conformance --bench rolling -- --backends redis,postgres --styles outage-3s,outage-10s --ttl 6
//! ```
//!
//! Servers come from the conformance harness (started from their binaries on loopback, or the
//! `HEADCOUNT_TEST_<BACKEND>_URL` stores), each first given `--unrelated` keys (default 10,000,
//! 64-byte values, no TTL) through the store. Every member runs in this process over one store
//! wrapped in a counter of calls.
//!
//! For each backend and group size (`--sizes`, default 10 and 50; lease TTL `--ttl`, default
//! 2 s, raised to the backend's shortest lease), a group owning `--keys` keys (default 256,
//! `p0`...) is started and each member in turn is replaced, in one of these styles:
//!
//! * **static**: the member leaves for a restart
//!   ([`Member::leave_for_restart`](headcount::recipes::group::Member::leave_for_restart)) and the
//!   same member id joins again after `--restart-ms` (default 200 ms): a StatefulSet pod, or any
//!   unit restarted in place, with static membership;
//! * **leave**: the same, with a graceful [`Member::leave`] (a restart without static
//!   membership, to measure beside it);
//! * **surge**: a member with a new id joins, and once the group is ready the old one leaves: a
//!   Deployment with `maxSurge: 1, maxUnavailable: 0` (a replacement without a standby, to
//!   measure beside it);
//! * **replace**: the same with the new member joining as a standby
//!   ([`GroupConfig::with_standby`], `--standby-for`): it is ready while it stands by, and the
//!   old member's leave hands it its slot;
//! * **kill** (only when asked): the member is dropped without leaving and the same id joins
//!   after `--restart-ms` (a pod killed and restarted): it waits out its old lease, racing the
//!   others' view without it;
//! * **kill-grace**: the same with a crash grace of five TTLs on every member
//!   ([`GroupConfig::with_crash_grace`]): the same id takes its slot over, waits one lease TTL,
//!   and nothing moves;
//! * **checkpoint**: a static restart whose member holds a grant on every key it owns for a
//!   checkpoint of 1.5 TTLs when told to stop, with a drain timeout of three TTLs: the leave
//!   waits for the checkpoint, renewing its lease, and parks the claim afterwards. Each
//!   checkpoint then writes its keys through a fence that every owner the sampler sees writes
//!   through too: `refused` counts the checkpoints' writes the fence refused (another member
//!   took the key and wrote while the checkpoint ran);
//! * **twin**: a member is frozen (its store calls held) while a new process with its id joins
//!   and takes its place (with a crash grace, as `kill-grace`); then it goes on, finds its id
//!   held by the newer process, and must yield before claiming or publishing anything: no key
//!   moves;
//! * **outage-3s**, **outage-10s**: not a step per member but one event: the store's server is
//!   killed (SIGKILL) and started again on the same data after 3 s or 10 s, every member
//!   running (Redis with its append-only file, PostgreSQL and etcd keep their data; not SQLite,
//!   which has no server). Run them with `--ttl 6` to see the outage shorter than a lease ride
//!   through without a lapse.
//!
//! Before each next step the bench waits until every member is ready (active under one epoch
//! naming them all), as a deploy tool that waits for readiness does. A sampler reads, every
//! 10 ms, which member would grant each key, and reports per style: the epochs created (view
//! changes), the keys that changed owner (a member with another id) against the minimum (0 with
//! the same ids, every key once with new ids), the longest time one key had no owner, the
//! key-seconds without an owner, the checkpoints refused by the fence, the store calls per
//! step, and the rollout's wall time.
//!
//! The keys are assigned with `jumpback`, the default; `--assignors` runs each style under each
//! assignor named, where `sticky` and `balanced` declare the keys as the group's key set (a style
//! then reads `surge, sticky`).
//!
//! Members listen to the store's change notifications (the default); `--notifications off` makes
//! them poll only (a style then reads `static, polling`), and `both` runs each
//! style both ways, one after the other, so the two come from one run.
//!
//! Run without `--bench` (as `cargo test --all-targets` does) it makes one small SQLite run.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use headcount::assign::{AssignorKind, KeySet};
use headcount::fence::MemoryFence;
use headcount::recipes::group::{Grant, Group, GroupConfig, Member};
use headcount::{DynStore, Op};
use headcount_conformance::{Decorated, Hooks, ServerControl};
use headcount_harness::ServerKind;

use common::{fill_store, Args};

const PREFIX: &str = "hcr";
const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// Counts every call made through it.
#[derive(Debug, Default)]
struct Calls(AtomicU64);

#[async_trait]
impl Hooks for Calls {
    async fn before(&self, _op: Op) -> headcount::Result<()> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Holds one member's calls and their replies while it is frozen (as SIGSTOP would).
#[derive(Debug, Clone)]
struct Freeze(Arc<tokio::sync::watch::Sender<bool>>);

impl Freeze {
    async fn pass(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|frozen| !*frozen).await;
    }
}

#[async_trait]
impl Hooks for Freeze {
    async fn before(&self, _op: Op) -> headcount::Result<()> {
        self.pass().await;
        Ok(())
    }

    async fn after(&self, _op: Op, _took: Duration) -> headcount::Result<()> {
        self.pass().await;
        Ok(())
    }
}

struct Opts {
    backends: Vec<ServerKind>,
    sizes: Vec<usize>,
    styles: Vec<String>,
    keys: usize,
    ttl: Duration,
    restart: Duration,
    unrelated: u64,
    /// Whether members listen to the store's notifications, per run of each style.
    notifications: Vec<bool>,
    /// `jumpback`, `balanced` or `sticky`, per run of each style.
    assignors: Vec<String>,
}

fn opts() -> Opts {
    let mut o = Opts {
        backends: common::every_backend(),
        sizes: vec![10, 50],
        styles: vec![
            "static".into(),
            "leave".into(),
            "surge".into(),
            "replace".into(),
        ],
        keys: 256,
        ttl: Duration::from_secs(2),
        restart: Duration::from_millis(200),
        unrelated: 10_000,
        notifications: vec![true],
        assignors: vec!["jumpback".into()],
    };
    if !common::benching() {
        o.backends = vec![ServerKind::Sqlite];
        o.sizes = vec![3];
        o.keys = 64;
        o.ttl = Duration::from_millis(900);
        o.unrelated = 100;
    }
    let mut args = Args::new();
    while let Some(flag) = args.flag() {
        match flag.as_str() {
            "--backends" => o.backends = args.backends(),
            "--sizes" => o.sizes = args.list("--sizes N,N"),
            "--styles" => o.styles = args.names(),
            "--keys" => o.keys = args.parse("--keys N"),
            "--ttl" => o.ttl = args.seconds("--ttl SECONDS"),
            "--restart-ms" => o.restart = Duration::from_millis(args.parse("--restart-ms MS")),
            "--unrelated" => o.unrelated = args.parse("--unrelated N"),
            "--assignors" => o.assignors = args.names(),
            "--notifications" => {
                o.notifications = match args.value().as_str() {
                    "on" => vec![true],
                    "off" => vec![false],
                    "both" => vec![true, false],
                    other => panic!("--notifications on|off|both, not {other}"),
                }
            }
            _ => {}
        }
    }
    o
}

/// What the sampler saw of one key.
#[derive(Default, Clone)]
struct KeySeen {
    owner: Option<String>,
    unowned_since: Option<Instant>,
    moves: u64,
    longest_pause: Duration,
    unowned: Duration,
    doubles: u64,
}

/// The members now in the group (by id), as the sampler reads them.
type Live = Arc<Mutex<Vec<(String, Member)>>>;

/// Reads every [`SAMPLE_EVERY`] which member would grant each key, until `stop`.
async fn sample(
    live: Live,
    keys: Vec<String>,
    fence: Arc<MemoryFence>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<KeySeen> {
    let mut seen = vec![KeySeen::default(); keys.len()];
    loop {
        let now = Instant::now();
        {
            let members = live.lock().unwrap();
            for (k, key) in keys.iter().enumerate() {
                let mut owners = members
                    .iter()
                    .filter_map(|(id, m)| m.would_grant(key).map(|t| (id, t)));
                // The owner writes the key through the fence, as a worker would.
                let owner = owners.next().map(|(id, token)| {
                    fence.admit(key, token);
                    id
                });
                let s = &mut seen[k];
                if owners.next().is_some() {
                    s.doubles += 1;
                }
                match owner {
                    Some(id) => {
                        if let Some(since) = s.unowned_since.take() {
                            let pause = now - since;
                            s.longest_pause = s.longest_pause.max(pause);
                            s.unowned += pause;
                        }
                        if s.owner.as_ref().is_some_and(|o| o != id) {
                            s.moves += 1;
                        }
                        s.owner = Some(id.clone());
                    }
                    None => {
                        if s.unowned_since.is_none() {
                            s.unowned_since = Some(now);
                        }
                    }
                }
            }
        }
        if *stop.borrow() {
            return seen;
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// Waits until the `n` members in `live` are ready under one epoch whose view names them all;
/// returns that epoch.
async fn ready(live: &Live, n: usize, within: Duration) -> Result<u64, String> {
    let give_up = Instant::now() + within;
    loop {
        let (ok, epochs) = {
            let members = live.lock().unwrap();
            let a: Vec<_> = members.iter().map(|(_, m)| m.assignment()).collect();
            let ok = a.len() == n
                && a.iter()
                    .all(|x| x.is_ready() && x.epoch == a[0].epoch && x.live.len() == n);
            (ok, a.iter().map(|x| x.epoch).collect::<Vec<_>>())
        };
        if ok {
            return Ok(epochs[0]);
        }
        if Instant::now() >= give_up {
            return Err(format!("not ready within {within:?}: epochs {epochs:?}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

struct Row {
    backend: &'static str,
    members: usize,
    style: String,
    epochs: u64,
    moved: u64,
    minimum: u64,
    longest: Duration,
    key_seconds: f64,
    calls_per_step: f64,
    wall: Duration,
    doubles: u64,
    refused: u64,
}

/// The outage of an `outage-<N>s` style, if it is one.
fn outage_of(style: &str) -> Option<Duration> {
    let secs = style.strip_prefix("outage-")?.strip_suffix('s')?;
    Some(Duration::from_secs_f64(secs.parse().ok()?))
}

#[allow(clippy::too_many_arguments)]
async fn rollout(
    backend: ServerKind,
    store: &DynStore,
    control: Option<&dyn ServerControl>,
    n: usize,
    style: &str,
    notices: bool,
    assignor: &str,
    o: &Opts,
) -> Result<Row, String> {
    let caps = store.capabilities();
    let ttl = o.ttl.max(caps.min_ttl);
    let group = format!("r{:08x}", rand::random::<u32>());
    let calls = Arc::new(Decorated::with(store.clone(), Calls::default()));
    let counted: DynStore = calls.clone();
    // Each member over a freeze of its own (the `twin` style freezes one).
    let freezes: Arc<Mutex<BTreeMap<String, Freeze>>> = Arc::default();
    let store_for = |id: &str| -> DynStore {
        let freeze = Freeze(Arc::new(tokio::sync::watch::Sender::new(false)));
        freezes
            .lock()
            .unwrap()
            .insert(id.to_owned(), freeze.clone());
        Arc::new(Decorated::with(counted.clone(), freeze))
    };
    let keys: Vec<String> = (0..o.keys).map(|k| format!("p{k}")).collect();
    let set = KeySet::new(&keys).map_err(|e| e.to_string())?;
    let fence = Arc::new(MemoryFence::new());
    let refused = Arc::new(AtomicU64::new(0));
    let config = |id: &str| {
        let mut config = GroupConfig::new(group.clone(), ttl)
            .with_prefix(PREFIX)
            .with_member(id)
            .with_restart_window(ttl * 5)
            .with_notifications(notices);
        match style {
            "kill-grace" | "twin" => config = config.with_crash_grace(ttl * 5),
            "checkpoint" => config = config.with_drain_timeout(ttl * 3),
            _ => {}
        }
        match assignor {
            "sticky" => config.with_keys(set.clone()),
            "balanced" => config
                .with_keys(set.clone())
                .with_assignor(AssignorKind::Balanced(set.id())),
            _ => config,
        }
    };
    let live: Live = Arc::new(Mutex::new(Vec::new()));
    for i in 0..n {
        let id = format!("m{i}");
        let m = Group::join(store_for(&id), config(&id))
            .await
            .map_err(|e| e.to_string())?;
        live.lock().unwrap().push((id, m));
    }
    let first = ready(&live, n, ttl * 20).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(sample(live.clone(), keys.clone(), fence.clone(), stop_rx));
    tokio::time::sleep(SAMPLE_EVERY * 3).await;
    let calls_before = calls.hooks().0.load(Ordering::Relaxed);
    let started = Instant::now();
    let within = ttl * 20;
    let steps = if let Some(down) = outage_of(style) {
        let control = control.ok_or("an outage needs a server the bench started")?;
        control.kill().await.map_err(|e| e.to_string())?;
        let killed = Instant::now();
        tokio::time::sleep(down.saturating_sub(killed.elapsed())).await;
        control.start().await.map_err(|e| e.to_string())?;
        eprintln!("  server down {:.2} s", killed.elapsed().as_secs_f64());
        ready(&live, n, within).await?;
        0
    } else {
        n
    };
    for i in 0..steps {
        let old = format!("m{i}");
        let take = |live: &Live| {
            let mut members = live.lock().unwrap();
            let at = members.iter().position(|(id, _)| *id == old).unwrap();
            members.remove(at).1
        };
        match style {
            "static" | "leave" | "kill" | "kill-grace" | "checkpoint" => {
                let m = take(&live);
                match style {
                    "static" => m.leave_for_restart().await.map_err(|e| e.to_string())?,
                    "leave" => m.leave().await.map_err(|e| e.to_string())?,
                    "checkpoint" => {
                        // Every key it owns is in a checkpoint that ends 1.5 TTLs after the
                        // stop, then written through the fence.
                        let held: Vec<(String, Grant)> = keys
                            .iter()
                            .filter_map(|k| m.owns(k).map(|g| (k.clone(), g)))
                            .collect();
                        let (fence, refused) = (fence.clone(), refused.clone());
                        let checkpoint = tokio::spawn(async move {
                            tokio::time::sleep(ttl * 3 / 2).await;
                            for (k, g) in held {
                                if !fence.admit(&k, g.token()) {
                                    refused.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        });
                        m.leave_for_restart().await.map_err(|e| e.to_string())?;
                        checkpoint.await.map_err(|e| e.to_string())?;
                    }
                    _ => drop(m),
                }
                tokio::time::sleep(o.restart).await;
                let m = Group::join(store_for(&old), config(&old))
                    .await
                    .map_err(|e| e.to_string())?;
                live.lock().unwrap().push((old.clone(), m));
            }
            "twin" => {
                // Frozen past its lease while a new process with its id takes its place.
                let freeze = freezes.lock().unwrap()[&old].clone();
                freeze.0.send_replace(true);
                let frozen = take(&live);
                let m = Group::join(store_for(&old), config(&old))
                    .await
                    .map_err(|e| e.to_string())?;
                live.lock().unwrap().push((old.clone(), m));
                ready(&live, n, within).await?;
                // It goes on and must yield; the sampler watches it meanwhile.
                let watched = format!("{old}-frozen");
                live.lock().unwrap().push((watched.clone(), frozen.clone()));
                freeze.0.send_replace(false);
                match tokio::time::timeout(within, frozen.active(u64::MAX)).await {
                    Ok(Err(_)) => {}
                    _ => return Err(format!("{old}: the resumed twin did not yield")),
                }
                live.lock().unwrap().retain(|(id, _)| *id != watched);
            }
            "surge" => {
                let new = format!("n{i}");
                let m = Group::join(store_for(&new), config(&new))
                    .await
                    .map_err(|e| e.to_string())?;
                live.lock().unwrap().push((new, m));
                ready(&live, n + 1, within).await?;
                take(&live).leave().await.map_err(|e| e.to_string())?;
            }
            "replace" => {
                let new = format!("n{i}");
                let m = Group::join(store_for(&new), config(&new).with_standby(within))
                    .await
                    .map_err(|e| e.to_string())?;
                // Ready while it stands by: the deploy tool stops the old member next.
                m.wait_ready().await.map_err(|e| e.to_string())?;
                live.lock().unwrap().push((new, m));
                take(&live).leave().await.map_err(|e| e.to_string())?;
            }
            other => return Err(format!("unknown style {other}")),
        }
        ready(&live, n, within).await?;
    }
    let wall = started.elapsed();
    let calls_after = calls.hooks().0.load(Ordering::Relaxed);
    let last = ready(&live, n, within).await?;
    tokio::time::sleep(SAMPLE_EVERY * 3).await;
    stop_tx.send(true).unwrap();
    let seen = sampler.await.map_err(|e| e.to_string())?;
    let members: Vec<Member> = live.lock().unwrap().drain(..).map(|(_, m)| m).collect();
    for m in members {
        let _ = m.leave().await;
    }
    Ok(Row {
        backend: backend.name(),
        members: n,
        style: match (notices, assignor) {
            (true, "jumpback") => style.to_owned(),
            (true, a) => format!("{style}, {a}"),
            (false, "jumpback") => format!("{style}, polling"),
            (false, a) => format!("{style}, {a}, polling"),
        },
        epochs: last - first,
        moved: seen.iter().map(|s| s.moves).sum(),
        minimum: if matches!(style, "surge" | "replace") {
            o.keys as u64
        } else {
            0
        },
        longest: seen
            .iter()
            .map(|s| s.longest_pause)
            .max()
            .unwrap_or_default(),
        key_seconds: seen.iter().map(|s| s.unowned.as_secs_f64()).sum(),
        calls_per_step: (calls_after - calls_before) as f64 / steps.max(1) as f64,
        wall,
        doubles: seen.iter().map(|s| s.doubles).sum(),
        refused: refused.load(Ordering::Relaxed),
    })
}

/// A server for an outage: one the bench starts and may kill, with its data kept across a
/// restart (Redis with its append-only file); `None` for SQLite, which has no server.
async fn outage_server(backend: ServerKind) -> Option<(String, Arc<dyn ServerControl>)> {
    use headcount_harness::{KvControl, KvStore, PgControl, PgServer};
    let timeout = Duration::from_secs(5);
    tokio::task::spawn_blocking(move || match backend {
        ServerKind::Redis => {
            let s = KvStore::redis_with(None, &["--appendonly", "yes", "--appendfsync", "always"])
                .expect("a Redis with its append-only file");
            let s = Arc::new(s);
            let url = s.url();
            Some((
                url,
                Arc::new(KvControl::new(s, timeout)) as Arc<dyn ServerControl>,
            ))
        }
        ServerKind::Etcd => {
            let s = Arc::new(KvStore::etcd(1, None).expect("an etcd"));
            let url = s.url();
            Some((
                url,
                Arc::new(KvControl::new(s, timeout)) as Arc<dyn ServerControl>,
            ))
        }
        ServerKind::Postgres => {
            let s = Arc::new(PgServer::start_new(None).expect("a PostgreSQL"));
            let url = s.url();
            Some((
                url,
                Arc::new(PgControl::new(s, timeout)) as Arc<dyn ServerControl>,
            ))
        }
        _ => None,
    })
    .await
    .unwrap()
}

fn main() {
    let o = opts();
    let runtime = common::runtime();
    let mut rows: Vec<Row> = Vec::new();
    let mut ttls = BTreeMap::new();
    runtime.block_on(async {
        for &backend in &o.backends {
            let Some(url) = common::shared_url(backend, "rolling").await else {
                continue;
            };
            fill_store(&url, o.unrelated)
                .await
                .unwrap_or_else(|e| panic!("{}: filling: {e}", backend.name()));
            let store = headcount::connect(&url).await.unwrap();
            ttls.insert(backend.name(), o.ttl.max(store.capabilities().min_ttl));
            for &n in &o.sizes {
                for style in &o.styles {
                    // An outage kills a server of its own, started with its data kept.
                    let dedicated = match outage_of(style) {
                        Some(_) => match outage_server(backend).await {
                            Some((url, control)) => {
                                fill_store(&url, o.unrelated).await.unwrap_or_else(|e| {
                                    panic!("{}: filling: {e}", backend.name())
                                });
                                Some((headcount::connect(&url).await.unwrap(), control))
                            }
                            None => {
                                eprintln!("SKIP {style} on {}: no server to kill", backend.name());
                                continue;
                            }
                        },
                        None => None,
                    };
                    let (on, control) = match &dedicated {
                        Some((s, c)) => (s, Some(c.as_ref())),
                        None => (&store, None),
                    };
                    for &notices in &o.notifications {
                        for assignor in &o.assignors {
                            eprintln!(
                                "rolling: {} members on {}, {style}, notifications {notices}, {assignor}",
                                n,
                                backend.name()
                            );
                            match rollout(backend, on, control, n, style, notices, assignor, &o)
                                .await
                            {
                                Ok(row) => rows.push(row),
                                Err(e) => panic!("{} {n} {style}: {e}", backend.name()),
                            }
                        }
                    }
                }
            }
        }
    });
    println!(
        "\n### Rolling restart of every member, one at a time ({} keys, restart {} ms, {} unrelated keys)\n",
        o.keys,
        o.restart.as_millis(),
        o.unrelated
    );
    println!("| backend | TTL ms | members | style | epochs created | keys moved | minimum | longest pause of a key ms | key-seconds without an owner | checkpoints refused | store calls per step | rollout s |");
    println!("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} | {:.0} | {:.1} |",
            r.backend,
            ttls[r.backend].as_millis(),
            r.members,
            r.style,
            r.epochs,
            r.moved,
            r.minimum,
            r.longest.as_millis(),
            r.key_seconds,
            r.refused,
            r.calls_per_step,
            r.wall.as_secs_f64()
        );
        assert_eq!(
            r.doubles, 0,
            "{} {} {}: a key had two owners at once",
            r.backend, r.members, r.style
        );
    }
}
