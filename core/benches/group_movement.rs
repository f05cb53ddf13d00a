//! Movement per join and leave as the group recipe produces its views: slots claimed lowest free
//! first, views built with `Topology::from_live_slots`, and by default jump with failover (`jump`,
//! the group's default when `docs/benchmarks.md` was measured; `--assignor jumpback` for today's
//! default). Prints a Markdown table of the moved fraction of the keys against the optimum.
//!
//! ```sh
//! cargo bench -p headcount-core --bench group_movement                  # 1,000,000 keys
//! cargo bench -p headcount-core --bench group_movement -- --keys 10000000 --assignor memento
//! ```
//!
//! For `n` members (slots `0..n`), one after the other: a join (slot `n`), a graceful leave of
//! the middle slot (leaving a hole), a join that fills the hole, a leave of the last slot, a
//! crash of the lowest slot, and with one hole already open a second leave and the join that
//! fills the lowest hole. The optimum is the changed slot's fair share: `1/(live after)` for a
//! join, `1/(live before)` for a leave (so `1/(n+1)` for a join to or a leave from `n+1`).
//! *Excess* counts the keys that moved between two slots that both stayed: a minimal assignor
//! has none. The sampling noise of the fraction (one standard deviation, relative) is
//! `sqrt((1-p)/(p·keys))`: with 1,000,000 keys and `n = 1000` it is 3%, so the 5% goal is within
//! two standard deviations there; `--keys 10000000` brings it to 1%.

#![allow(missing_docs)]

use std::collections::BTreeSet;
use std::process::ExitCode;

use headcount_core::assign::{hash_u64, AssignError, AssignorKind, Topology};

struct Row {
    n: u32,
    event: String,
    moved: usize,
    excess: usize,
    optimum: f64,
}

fn measure(
    kind: AssignorKind,
    before: &BTreeSet<u32>,
    after: &BTreeSet<u32>,
    keys: u64,
) -> Result<(usize, usize), AssignError> {
    let old = kind.build(&Topology::from_live_slots(before.iter().copied())?)?;
    let new = kind.build(&Topology::from_live_slots(after.iter().copied())?)?;
    let (mut moved, mut excess) = (0, 0);
    for k in 0..keys {
        let h = hash_u64(k);
        let (from, to) = (old.owner(h), new.owner(h));
        if from != to {
            moved += 1;
            if before.contains(&to) && after.contains(&from) {
                excess += 1;
            }
        }
    }
    Ok((moved, excess))
}

/// The lowest slot not in `live`, as `Table::lowest_free` claims it.
fn lowest_free(live: &BTreeSet<u32>) -> u32 {
    (0..).find(|s| !live.contains(s)).unwrap_or(0)
}

fn run(kind: AssignorKind, n: u32, keys: u64, rows: &mut Vec<Row>) -> Result<(), AssignError> {
    let mut live: BTreeSet<u32> = (0..n).collect();
    let mut step = |event: String, next: BTreeSet<u32>, live: &mut BTreeSet<u32>| {
        let (a, b) = (live.len() as f64, next.len() as f64);
        let optimum = 1.0 / a.max(b);
        let (moved, excess) = measure(kind, live, &next, keys)?;
        rows.push(Row {
            n,
            event,
            moved,
            excess,
            optimum,
        });
        *live = next;
        Ok::<(), AssignError>(())
    };
    let with = |live: &BTreeSet<u32>, s: u32| {
        let mut l = live.clone();
        l.insert(s);
        l
    };
    let without = |live: &BTreeSet<u32>, s: u32| {
        let mut l = live.clone();
        l.remove(&s);
        l
    };
    let s = lowest_free(&live);
    step(format!("join (slot {s})"), with(&live, s), &mut live)?;
    let mid = n / 2;
    step(
        format!("leave of middle slot {mid}"),
        without(&live, mid),
        &mut live,
    )?;
    let s = lowest_free(&live);
    step(format!("join filling hole {s}"), with(&live, s), &mut live)?;
    let last = live.iter().next_back().copied().unwrap_or(0);
    step(
        format!("leave of last slot {last}"),
        without(&live, last),
        &mut live,
    )?;
    // Back to n + 1 before the crash so every row compares with the same optimum.
    let s = lowest_free(&live);
    step(format!("join (slot {s})"), with(&live, s), &mut live)?;
    step("crash of slot 0".into(), without(&live, 0), &mut live)?;
    let q = (n / 4).max(1);
    if live.contains(&q) {
        step(
            format!("second leave (slot {q}, hole at 0 open)"),
            without(&live, q),
            &mut live,
        )?;
    }
    let s = lowest_free(&live);
    step(
        format!("join filling lowest hole {s}"),
        with(&live, s),
        &mut live,
    )?;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo test --all-targets` runs this without `--bench`, in a debug build: keep it quick.
    let mut keys: u64 = if args.iter().any(|a| a == "--bench") {
        1_000_000
    } else {
        10_000
    };
    let mut kind = AssignorKind::JumpFailover;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--keys" => match it.next().and_then(|v| v.parse().ok()) {
                Some(k) => keys = k,
                None => {
                    eprintln!("--keys needs a number");
                    return ExitCode::FAILURE;
                }
            },
            "--assignor" => match it.next().and_then(|v| v.parse().ok()) {
                Some(k) => kind = k,
                None => {
                    let names: Vec<&str> = AssignorKind::ALL.iter().map(|k| k.name()).collect();
                    eprintln!("--assignor needs one of {}", names.join(", "));
                    return ExitCode::FAILURE;
                }
            },
            _ => {}
        }
    }
    let mut rows = Vec::new();
    for n in [3, 10, 100, 1000] {
        if let Err(e) = run(kind, n, keys, &mut rows) {
            eprintln!("group movement: {e}");
            return ExitCode::FAILURE;
        }
    }
    println!(
        "{keys} keys (hash_u64(0..{keys})), assignor `{}`; moved fraction against the optimum 1/max(live before, live after).\n",
        kind.name()
    );
    println!("| n | event | moved | optimum | moved / optimum | within 5% | excess | 1σ noise |");
    println!("|---:|---|---:|---:|---:|:-:|---:|---:|");
    for r in &rows {
        let frac = r.moved as f64 / keys as f64;
        let ratio = frac / r.optimum;
        let noise = ((1.0 - r.optimum) / (r.optimum * keys as f64)).sqrt();
        println!(
            "| {} | {} | {:.5} | {:.5} | {:.3} | {} | {} | {:.1}% |",
            r.n,
            r.event,
            frac,
            r.optimum,
            ratio,
            if (ratio - 1.0).abs() <= 0.05 {
                "yes"
            } else {
                "no"
            },
            r.excess,
            noise * 100.0
        );
    }
    ExitCode::SUCCESS
}
