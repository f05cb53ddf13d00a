//! Prints the assignor report (see `headcount_core::assign::report`) as a Markdown table.
//!
//! `cargo bench -p headcount-core --bench assign_report` for the full report (1,000,000 keys at
//! 3, 10, 100 and 1000 members); `-- --keys 100000` for a quicker one. Run without `--bench`
//! (as `cargo test --all-targets` does) it uses 10,000 keys unless `--keys` says otherwise.

#![allow(missing_docs)]

use std::process::ExitCode;

use headcount_core::assign::{hash_u64, report, AssignError, AssignorKind, Topology};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this without it, in a debug
    // build, where a quick report is enough to show it works.
    let mut keys = if args.iter().any(|a| a == "--bench") {
        report::KEYS
    } else {
        10_000
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        // Anything but `--keys N` is ignored.
        if arg == "--keys" {
            match args.next().and_then(|v| v.parse().ok()) {
                Some(n) => keys = n,
                None => {
                    eprintln!("--keys needs a number");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    match report::report(&report::MEMBERS, keys) {
        Ok(rows) => {
            println!(
                "{keys} keys (hash_u64(0..{keys})); slots 0..n all live; the join appends slot n; the death is slot n/2.\n"
            );
            print!("{}", report::markdown(&rows));
        }
        Err(e) => {
            eprintln!("assign report: {e}");
            return ExitCode::FAILURE;
        }
    }
    match order_cost(keys) {
        Ok(table) => {
            print!("{table}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("assign report: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What MementoHash's canonical death order costs: with some slots already dead, one more random
/// live slot dies, and we count the keys that move although they were not the dead slot's, for
/// the canonical order and for a recorded one (where the death is appended), over jump consistent
/// hash and over JumpBackHash. Jump with failover, over either hash, is shown for comparison.
fn order_cost(keys: usize) -> Result<String, AssignError> {
    const N: u32 = 100;
    const TRIALS: u64 = 20;
    let sample: Vec<u64> = (0..keys as u64).map(hash_u64).collect();
    let mut out = format!(
        "\nOne more death among {N} slots with some already dead: mean over {TRIALS} random deaths of the keys that move \
         without having been the dead slot's (0 is minimal), as a fraction of all {keys} keys.\n\n\
         | already dead | dead slot's keys | memento, canonical order | memento, recorded order | jumpback-memento, canonical | jumpback-memento, recorded | jump with failover | jumpback with failover |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for dead_pct in [1u64, 10, 50] {
        let (mut own, mut canonical, mut recorded, mut jump) = (0.0, 0.0, 0.0, 0.0);
        let (mut back_canonical, mut back_recorded, mut back_jump) = (0.0, 0.0, 0.0);
        for trial in 0..TRIALS {
            // A pseudo-random dead set and death order, then one random live slot dies.
            let mut order: Vec<u32> = (0..N).collect();
            let mut x = hash_u64(dead_pct * 1000 + trial);
            for i in (1..order.len()).rev() {
                x = hash_u64(x);
                order.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let dead_count = (u64::from(N) * dead_pct / 100) as usize;
            let (dead, live) = order.split_at(dead_count);
            let victim = live[(hash_u64(x) % live.len() as u64) as usize];

            let before_c = Topology::from_live(N, live.iter().copied())?;
            let mut after_c = before_c.clone();
            after_c.set_dead(victim)?;
            let before_r = Topology::from_death_order(N, dead.iter().copied())?;
            let mut after_r = before_r.clone();
            after_r.set_dead(victim)?;

            let excess = |kind: AssignorKind, before: &Topology, after: &Topology| {
                let m = kind.preview(before, after, sample.iter().copied())?;
                Ok::<f64, AssignError>(
                    m.moves.iter().filter(|mv| mv.from != victim).count() as f64 / keys as f64,
                )
            };
            let a = AssignorKind::Memento.build(&before_c)?;
            own += sample.iter().filter(|&&k| a.owner(k) == victim).count() as f64 / keys as f64;
            canonical += excess(AssignorKind::Memento, &before_c, &after_c)?;
            recorded += excess(AssignorKind::Memento, &before_r, &after_r)?;
            jump += excess(AssignorKind::JumpFailover, &before_c, &after_c)?;
            back_canonical += excess(AssignorKind::JumpBackMemento, &before_c, &after_c)?;
            back_recorded += excess(AssignorKind::JumpBackMemento, &before_r, &after_r)?;
            back_jump += excess(AssignorKind::JumpBackFailover, &before_c, &after_c)?;
        }
        let t = TRIALS as f64;
        out.push_str(&format!(
            "| {dead_pct}% | {:.3}% | {:.3}% | {:.3}% | {:.3}% | {:.3}% | {:.3}% | {:.3}% |\n",
            100.0 * own / t,
            100.0 * canonical / t,
            100.0 * recorded / t,
            100.0 * back_canonical / t,
            100.0 * back_recorded / t,
            100.0 * jump / t,
            100.0 * back_jump / t,
        ));
    }
    Ok(out)
}
