//! Lookup time of jump consistent hash, JumpBackHash and each assignor at 10, 100 and 1000 slots,
//! all live and with half of them dead.
//!
//! `cargo bench -p headcount-core --bench assign -- --warm-up-time 1 --measurement-time 3`
//!
//! Each iteration looks up the next of 2^20 distinct random keys, so neither the branch predictor
//! nor the caches can learn a key's path: this is the cost of one lookup among other work. The
//! `repeating_keys` groups cycle over only 4096 keys, as many microbenchmarks do; there the branch
//! predictor learns the sequence and successive lookups overlap, which measures something
//! closer to throughput and comes out two to three times faster. The docs quote the first.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use headcount_core::assign::{
    hash_u64, jump_back_hash, jump_consistent_hash, Assignor, AssignorKind, Topology,
};

const SIZES: [u32; 3] = [10, 100, 1000];
const DISTINCT: usize = 1 << 20;
const REPEATING: usize = 4096;

fn keys(count: usize) -> Vec<u64> {
    (0..count as u64).map(|i| hash_u64(i ^ 0x5eed)).collect()
}

/// Every other slot dead, removed in the canonical order.
fn half_dead(n: u32) -> Topology {
    Topology::from_live(n, (0..n).filter(|s| s % 2 == 0)).unwrap()
}

fn lookups(c: &mut Criterion, group: &str, keys: &[u64], build: impl Fn(u32) -> Box<dyn Assignor>) {
    let mut g = c.benchmark_group(group);
    for n in SIZES {
        let a = build(n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) & (keys.len() - 1);
                a.owner(black_box(keys[i]))
            })
        });
    }
    g.finish();
}

/// A consistent hash: the bucket in `0..buckets` of a key.
type BucketHash = fn(u64, u32) -> u32;

fn bench_hashes(c: &mut Criterion) {
    let hashes: [(&str, BucketHash); 2] = [
        ("jump_consistent_hash", jump_consistent_hash),
        ("jump_back_hash", jump_back_hash),
    ];
    for (hash_name, hash) in hashes {
        for (suffix, keys) in [("", keys(DISTINCT)), ("/repeating_keys", keys(REPEATING))] {
            let mut group = c.benchmark_group(format!("{hash_name}{suffix}"));
            for n in SIZES {
                group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
                    let mut i = 0;
                    b.iter(|| {
                        i = (i + 1) & (keys.len() - 1);
                        hash(black_box(keys[i]), n)
                    })
                });
            }
            group.finish();
        }
    }
}

fn bench_assignors(c: &mut Criterion) {
    let distinct = keys(DISTINCT);
    for kind in AssignorKind::ALL {
        lookups(c, &format!("{kind}/all_live"), &distinct, |n| {
            kind.build(&Topology::new(n).unwrap()).unwrap()
        });
    }
    for kind in [
        AssignorKind::JumpFailover,
        AssignorKind::Memento,
        AssignorKind::JumpBackFailover,
        AssignorKind::JumpBackMemento,
    ] {
        lookups(c, &format!("{kind}/half_dead"), &distinct, |n| {
            kind.build(&half_dead(n)).unwrap()
        });
    }
    let repeating = keys(REPEATING);
    for kind in [AssignorKind::Memento, AssignorKind::JumpBackMemento] {
        lookups(
            c,
            &format!("{kind}/half_dead/repeating_keys"),
            &repeating,
            |n| kind.build(&half_dead(n)).unwrap(),
        );
    }
}

fn bench_bytes(c: &mut Criterion) {
    let names: Vec<String> = (0..DISTINCT)
        .map(|i| format!("tenant-{i}/task-{}", i * 7))
        .collect();
    let a = AssignorKind::Memento
        .build(&Topology::new(100).unwrap())
        .unwrap();
    c.bench_function("memento/all_live/100/byte_key", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % DISTINCT;
            a.owner_of_bytes(black_box(names[i].as_bytes()))
        })
    });
}

criterion_group!(benches, bench_hashes, bench_assignors, bench_bytes);
criterion_main!(benches);
