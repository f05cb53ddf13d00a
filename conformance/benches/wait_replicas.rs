//! What `wait_replicas=1` costs a Redis Sentinel store: the latency of a lease renewal
//! (`compare_and_set` of the holder's own value with a TTL, what a member's heartbeat writes) and
//! of a read (`get`, which does not wait), with and without the option, on a primary with one
//! replica behind three Sentinels on loopback (the harness's `redis_sentinel` store).
//!
//! ```sh
//! HEADCOUNT_REQUIRE_BACKENDS=redis_sentinel cargo bench -p headcount-conformance \
//!     --bench wait_replicas -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! One criterion iteration is one call; the Markdown table at the end (p50 and p99 of single
//! calls, measured apart from criterion's own loop) is what backend-redis/README.md quotes.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use headcount::DynStore;
use headcount_conformance::percentile;
use headcount_harness::{skip_unless_required, KvStore, ServerKind};

const SIDES: [(&str, &str); 2] = [("without", ""), ("wait_replicas=1", "?wait_replicas=1")];
const SAMPLES: usize = 2000;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(kv) = skip_unless_required(
        ServerKind::RedisSentinel,
        "bench::wait_replicas",
        KvStore::redis_sentinel(None),
    ) else {
        return;
    };
    let url = kv.url();
    let stores: Vec<(&str, DynStore)> = SIDES
        .iter()
        .map(|(name, option)| {
            let store = rt
                .block_on(headcount::connect(&format!("{url}{option}")))
                .unwrap();
            (*name, store)
        })
        .collect();
    let key = format!("hc:{{bench-wait-{:08x}}}:slot:0", rand::random::<u32>());
    let ttl = Some(Duration::from_secs(30));
    rt.block_on(stores[0].1.compare_and_set(&key, None, "me", ttl))
        .unwrap();
    let mut table = Vec::new();
    for (name, store) in &stores {
        c.bench_function(&format!("renewal (compare_and_set), {name}"), |b| {
            b.iter(|| {
                rt.block_on(store.compare_and_set(&key, Some("me"), "me", ttl))
                    .unwrap()
            });
        });
        c.bench_function(&format!("get, {name}"), |b| {
            b.iter(|| rt.block_on(store.get(&key)).unwrap());
        });
        for op in ["renewal (compare_and_set)", "get"] {
            let mut latencies = Vec::with_capacity(SAMPLES);
            rt.block_on(async {
                for _ in 0..SAMPLES {
                    let started = Instant::now();
                    if op == "get" {
                        store.get(&key).await.unwrap();
                    } else {
                        store
                            .compare_and_set(&key, Some("me"), "me", ttl)
                            .await
                            .unwrap();
                    }
                    latencies.push(started.elapsed());
                }
            });
            latencies.sort_unstable();
            table.push(format!(
                "| {op} | {name} | {:.0} µs | {:.0} µs |",
                percentile(&latencies, 50).as_secs_f64() * 1e6,
                percentile(&latencies, 99).as_secs_f64() * 1e6,
            ));
        }
    }
    rt.block_on(stores[0].1.delete(&key)).unwrap();
    println!("\n| call | option | p50 | p99 |\n|---|---|---|---|");
    for row in table {
        println!("{row}");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
