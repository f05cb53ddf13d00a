//! Majority IDs over N = 3 and N = 5 Redis servers on loopback, N = 3 PostgreSQL servers, and a
//! mixed set (Redis + PostgreSQL + a SQLite file): IDs per second, p50/p99 latency and majority
//! rounds per ID, for one client, for 16 contending clients (each its own generator and
//! connections), for 16 callers through one in-process mediator ([`MediatedIds`]), taking turns
//! (one round each, the first design) and with group commit (one round for every caller
//! waiting), and for 16 gRPC clients of one IDs server (`ids serve`, in process). Every caller
//! calls again as soon as it has its ID.
//!
//! ```sh
//! HEADCOUNT_REQUIRE_BACKENDS=redis,postgres cargo bench -p headcount-conformance --bench ids -- \
//!     --warm-up-time 1 --measurement-time 3
//! ```
//!
//! The sets: Redis with `appendonly yes` + `appendfsync always` (durable, what the recipe
//! requires) and without persistence (the durability opt-out), to show what the fsync costs;
//! PostgreSQL with `fsync = on` and `synchronous_commit = on`; one of each durable backend. It
//! also measures the disk's own fsync latency (appends of 64 bytes, each followed by `fsync`, in
//! the temp dir the servers use), the bound for one sequential caller. One criterion iteration is
//! one call by each caller; the Markdown table at the end is what `docs/ids.md` quotes.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use headcount::recipes::ids::{
    DurabilityPolicy, IdsClient, IdsConfig, IdsService, IdsStats, MajorityIds, MediatedIds,
    RunningIdsServer,
};
use headcount::DynStore;
use headcount_conformance::percentile;
use headcount_harness::{KvStore, PgServer, ServerKind, Unavailable};

const AOF_ALWAYS: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];
const CLIENTS: usize = 16;
const MODES: [&str; 5] = [
    "1 client",
    "16 clients",
    "16 callers, mediated one at a time",
    "16 callers, mediated with group commit",
    "16 clients of one IDs server",
];

/// The store sets, in table order.
const SETS: [&str; 4] = [
    "redis, appendfsync always",
    "redis, no persistence",
    "postgresql, synchronous_commit on",
    "redis + postgresql + sqlite",
];

struct Setup {
    set: &'static str,
    n: usize,
    clients: Vec<Arc<MajorityIds>>,
    turns: Arc<MediatedIds>,
    mediated: Arc<MediatedIds>,
    /// 16 gRPC clients of one in-process `ids serve` (its own generator), each its own
    /// connection.
    remote: Vec<IdsClient>,
    service: IdsService,
    name: String,
    _server: RunningIdsServer,
}

#[derive(Default)]
struct Stats {
    ids: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
    attempts: u64,
    won: u64,
}

type Results = Arc<Mutex<BTreeMap<(&'static str, usize, &'static str), Stats>>>;

fn servers(n: usize, args: &'static [&'static str]) -> Option<Vec<KvStore>> {
    let mut out = Vec::new();
    for _ in 0..n {
        match KvStore::redis_with(None, args) {
            Ok(s) => out.push(s),
            Err(Unavailable::Missing(why)) if !ServerKind::Redis.required() => {
                eprintln!("SKIP ids bench: {why}");
                return None;
            }
            Err(e) => panic!("{e}"),
        }
    }
    Some(out)
}

async fn generator(urls: &[String], name: &str, policy: DurabilityPolicy) -> MajorityIds {
    let mut stores: Vec<DynStore> = Vec::new();
    for url in urls {
        stores.push(headcount::connect(url).await.unwrap());
    }
    let config = IdsConfig::new(name)
        .with_deadline(Duration::from_secs(60))
        .with_durability(policy);
    MajorityIds::new(stores, config).await.unwrap()
}

fn pg_servers(n: usize) -> Option<Vec<PgServer>> {
    let mut out = Vec::new();
    for _ in 0..n {
        match PgServer::start_with(None, &["fsync=on", "synchronous_commit=on"]) {
            Ok(s) => out.push(s),
            Err(Unavailable::Missing(why)) if !ServerKind::Postgres.required() => {
                eprintln!("SKIP ids bench (postgresql): {why}");
                return None;
            }
            Err(e) => panic!("{e}"),
        }
    }
    Some(out)
}

/// The disk's fsync latency where the servers keep their files: `count` appends of 64 bytes,
/// each followed by `fsync`; (p50, mean).
fn fsync_latency(count: usize) -> (Duration, Duration) {
    use std::io::Write as _;
    let path = std::env::temp_dir().join(format!("hc-fsync-{:08x}", rand::random::<u32>()));
    let mut file = std::fs::File::create(&path).unwrap();
    let mut lat = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        file.write_all(&[b'x'; 64]).unwrap();
        file.sync_all().unwrap();
        lat.push(t.elapsed());
    }
    let _ = std::fs::remove_file(&path);
    let mean = lat.iter().sum::<Duration>() / count as u32;
    lat.sort_unstable();
    (percentile(&lat, 50), mean)
}

async fn setup(set: &'static str, urls: Vec<String>) -> Setup {
    let n = urls.len();
    let policy = if set == "redis, no persistence" {
        DurabilityPolicy::AllowNonDurable
    } else {
        DurabilityPolicy::Require
    };
    let name = format!("bench{:08x}", rand::random::<u32>());
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(Arc::new(generator(&urls, &name, policy).await));
    }
    let turns = Arc::new(MediatedIds::one_at_a_time(
        generator(&urls, &name, policy).await,
    ));
    let mediated = Arc::new(MediatedIds::new(generator(&urls, &name, policy).await));
    let service = IdsService::new(vec![MediatedIds::new(
        generator(&urls, &name, policy).await,
    )])
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = headcount::recipes::ids::serve(listener, service.clone())
        .await
        .unwrap();
    let addr = vec![server.local_addr().to_string()];
    let remote = (0..CLIENTS)
        .map(|_| IdsClient::new(&addr, Duration::from_secs(60)).unwrap())
        .collect();
    Setup {
        set,
        n,
        clients,
        turns,
        mediated,
        remote,
        service,
        name,
        _server: server,
    }
}

fn total(s: &Setup, mode: &str) -> IdsStats {
    let mut t = IdsStats::default();
    let add = |t: &mut IdsStats, x: IdsStats| {
        t.ids += x.ids;
        t.attempts += x.attempts;
        t.won += x.won;
        t.failures += x.failures;
    };
    match mode {
        "16 callers, mediated one at a time" => add(&mut t, s.turns.inner().stats()),
        "16 callers, mediated with group commit" => add(&mut t, s.mediated.inner().stats()),
        "16 clients of one IDs server" => add(&mut t, s.service.stats(&s.name).unwrap()),
        "1 client" => add(&mut t, s.clients[0].stats()),
        _ => s.clients.iter().for_each(|c| add(&mut t, c.stats())),
    }
    t
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let Some(durable) = servers(5, AOF_ALWAYS) else {
        return;
    };
    let Some(volatile) = servers(5, &[]) else {
        return;
    };
    let Some(pg) = pg_servers(3) else {
        return;
    };
    let sqlite_dir =
        std::env::temp_dir().join(format!("hc-ids-bench-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&sqlite_dir).unwrap();
    let sqlite = format!("sqlite://{}/ids.db?synchronous=full", sqlite_dir.display());
    let urls = |all: &[KvStore], n: usize| all[..n].iter().map(KvStore::url).collect::<Vec<_>>();
    let mut sets: Vec<(&'static str, Vec<String>)> = Vec::new();
    for n in [3, 5] {
        sets.push((SETS[0], urls(&durable, n)));
        sets.push((SETS[1], urls(&volatile, n)));
    }
    sets.push((SETS[2], pg[..3].iter().map(PgServer::url).collect()));
    // Sets run one after another, each under a generator name of its own.
    sets.push((SETS[3], vec![durable[0].url(), pg[0].url(), sqlite]));
    let mut setups = Vec::new();
    for (set, urls) in sets {
        setups.push(Arc::new(runtime.block_on(setup(set, urls))));
    }
    let results: Results = Arc::default();
    for s in &setups {
        let label = s.set.replace([',', ' ', '+'], "");
        let mut group = c.benchmark_group(format!("ids/{label}/n{}", s.n));
        for mode in MODES {
            let s = s.clone();
            let results = results.clone();
            group.bench_function(mode, |b| {
                b.iter_custom(|iters| {
                    let s2 = s.clone();
                    let before = total(&s, mode);
                    let (lat, elapsed) = runtime.block_on(async move {
                        let started = Instant::now();
                        let concurrency = if mode == "1 client" { 1 } else { CLIENTS };
                        let mut lat = Vec::with_capacity(iters as usize * concurrency);
                        // Each caller calls `iters` times, again as soon as answered.
                        let callers = (0..concurrency).map(|i| {
                            let s = &s2;
                            async move {
                                let mut lat = Vec::with_capacity(iters as usize);
                                for _ in 0..iters {
                                    let t = Instant::now();
                                    match mode {
                                        "16 callers, mediated one at a time" => {
                                            s.turns.next().await.unwrap();
                                        }
                                        "16 callers, mediated with group commit" => {
                                            s.mediated.next().await.unwrap();
                                        }
                                        "16 clients of one IDs server" => {
                                            s.remote[i].next(&s.name).await.unwrap();
                                        }
                                        _ => {
                                            s.clients[i].next().await.unwrap();
                                        }
                                    }
                                    lat.push(t.elapsed());
                                }
                                lat
                            }
                        });
                        for l in futures::future::join_all(callers).await {
                            lat.extend(l);
                        }
                        (lat, started.elapsed())
                    });
                    let after = total(&s, mode);
                    let mut r = results.lock().unwrap();
                    let st = r.entry((s.set, s.n, mode)).or_default();
                    st.ids += lat.len() as u64;
                    st.elapsed += elapsed;
                    st.latencies.extend(lat);
                    st.attempts += after.attempts - before.attempts;
                    st.won += after.won - before.won;
                    elapsed
                });
            });
        }
        group.finish();
    }
    print_table(&results.lock().unwrap());
    // After the runs, so the probe's syncs do not queue with the servers'.
    let (p50, mean) = fsync_latency(2_000);
    println!(
        "\ndisk fsync (2,000 appends of 64 bytes, each synced): p50 {:.3} ms, mean {:.3} ms, {:.0} syncs/s",
        p50.as_secs_f64() * 1000.0,
        mean.as_secs_f64() * 1000.0,
        1.0 / mean.as_secs_f64().max(1e-9)
    );
    let _ = std::fs::remove_dir_all(&sqlite_dir);
}

fn print_table(results: &BTreeMap<(&'static str, usize, &'static str), Stats>) {
    println!();
    println!("| stores | N | callers | IDs/s | p50 | p99 | rounds per ID | lost rounds |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
    for set in SETS {
        for n in [3, 5] {
            for mode in MODES {
                let Some(s) = results.get(&(set, n, mode)) else {
                    continue;
                };
                let mut l = s.latencies.clone();
                l.sort_unstable();
                let rate = s.ids as f64 / s.elapsed.as_secs_f64().max(1e-9);
                // A round serves one ID, or a block for every waiting caller (group commit).
                let per = s.attempts as f64 / (s.ids as f64).max(1.0);
                let retry = s.attempts.saturating_sub(s.won) as f64 / (s.attempts as f64).max(1.0);
                println!(
                    "| {set} | {n} | {mode} | {rate:.0} | {} | {} | {per:.2} | {:.1}% |",
                    ms(percentile(&l, 50)),
                    ms(percentile(&l, 99)),
                    retry * 100.0
                );
            }
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
