//! Majority IDs over N = 3 and N = 5 Redis servers on loopback: IDs per second, p50/p99 latency
//! and majority rounds per ID, for one client, for 16 contending clients (each its own generator
//! and connections), and for 16 callers through one in-process mediator ([`MediatedIds`]),
//! taking turns (one round each, the first design) and with group commit (one round for every
//! caller waiting). Every caller calls again as soon as it has its ID.
//!
//! ```sh
//! HEADCOUNT_REQUIRE_BACKENDS=redis cargo bench -p headcount-conformance --bench ids -- \
//!     --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Two sets of servers: `appendonly yes` + `appendfsync always` (durable, what the recipe
//! requires) and the harness default without persistence (the durability opt-out), to show what
//! the fsync costs. One criterion iteration is one call by each caller; the Markdown table at the
//! end is what `docs/ids.md` quotes.

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
use headcount_conformance::harness::{Backend, KvStore, Unavailable};
use headcount_conformance::percentile;

const AOF_ALWAYS: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];
const CLIENTS: usize = 16;
const MODES: [&str; 5] = [
    "1 client",
    "16 clients",
    "16 callers, mediated one at a time",
    "16 callers, mediated with group commit",
    "16 clients of one IDs server",
];

struct Setup {
    fsync: &'static str,
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

fn servers(args: &'static [&'static str]) -> Option<Vec<KvStore>> {
    let mut out = Vec::new();
    for _ in 0..5 {
        match KvStore::redis_with(None, args) {
            Ok(s) => out.push(s),
            Err(Unavailable::Missing(why)) if !Backend::Redis.required() => {
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

async fn setup(fsync: &'static str, all: &[KvStore], n: usize) -> Setup {
    let urls: Vec<String> = all[..n].iter().map(KvStore::url).collect();
    let policy = if fsync == "always" {
        DurabilityPolicy::Require
    } else {
        DurabilityPolicy::AllowNonDurable
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
        fsync,
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
    let Some(durable) = servers(AOF_ALWAYS) else {
        return;
    };
    let Some(volatile) = servers(&[]) else {
        return;
    };
    let mut setups = Vec::new();
    for (fsync, all) in [("always", &durable), ("none", &volatile)] {
        for n in [3, 5] {
            setups.push(Arc::new(runtime.block_on(setup(fsync, all, n))));
        }
    }
    let results: Results = Arc::default();
    for s in &setups {
        let mut group = c.benchmark_group(format!("ids/fsync-{}/n{}", s.fsync, s.n));
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
                    let st = r.entry((s.fsync, s.n, mode)).or_default();
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
}

fn print_table(results: &BTreeMap<(&'static str, usize, &'static str), Stats>) {
    println!();
    println!("| appendfsync | N | callers | IDs/s | p50 | p99 | rounds per ID | lost rounds |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
    for fsync in ["always", "none"] {
        for n in [3, 5] {
            for mode in MODES {
                let Some(s) = results.get(&(fsync, n, mode)) else {
                    continue;
                };
                let mut l = s.latencies.clone();
                l.sort_unstable();
                let rate = s.ids as f64 / s.elapsed.as_secs_f64().max(1e-9);
                // A round serves one ID, or a block for every waiting caller (group commit).
                let per = s.attempts as f64 / (s.ids as f64).max(1.0);
                let retry = s.attempts.saturating_sub(s.won) as f64 / (s.attempts as f64).max(1.0);
                println!(
                    "| {fsync} | {n} | {mode} | {rate:.0} | {} | {} | {per:.2} | {:.1}% |",
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
