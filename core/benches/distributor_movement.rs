//! How many work units move when one of n services fails, with the distributor's greedy matching
//! (`match_work_units`), against the optimum (only the failed service's own units).
//!
//! `cargo bench -p headcount-core --bench distributor_movement` prints the Markdown table of
//! `docs/distributor.md`. Every figure is averaged over which service fails. It asserts only
//! invariants (every unit owned once, counts within one), never a figure.

#![allow(missing_docs)]

use std::process::ExitCode;

use headcount_core::assign::match_work_units;

/// Owner (service index) of each unit.
fn owners(services: &[String], units: &[String]) -> Result<Vec<usize>, String> {
    let matching = match_work_units(services, units).map_err(|e| e.to_string())?;
    let mut owner = vec![usize::MAX; units.len()];
    let (mut lo, mut hi) = (usize::MAX, 0);
    for (s, taken) in matching.iter().enumerate() {
        lo = lo.min(taken.len());
        hi = hi.max(taken.len());
        for &u in taken {
            if owner[u] != usize::MAX {
                return Err(format!("unit {u} matched twice"));
            }
            owner[u] = s;
        }
    }
    if owner.contains(&usize::MAX) {
        return Err("a unit has no owner".into());
    }
    if hi - lo > 1 {
        return Err(format!("counts range from {lo} to {hi}"));
    }
    Ok(owner)
}

fn main() -> ExitCode {
    println!("| services | units | optimum (failed service's units) | moved (mean) | moved (max) | mean / optimum | moved as % of all units |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &[3usize, 5, 10, 30] {
        for &m in &[30usize, 300, 3000] {
            let services: Vec<String> = (0..n).map(|i| format!("service-{i}")).collect();
            let units: Vec<String> = (0..m).map(|i| format!("workunit-{i}")).collect();
            let before = match owners(&services, &units) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("{n} services, {m} units: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let (mut moved_sum, mut optimum_sum, mut moved_max) = (0usize, 0usize, 0usize);
            for failed in 0..n {
                let rest: Vec<String> = services
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != failed)
                    .map(|(_, s)| s.clone())
                    .collect();
                // Index in `rest` back to the index in `services`.
                let back = |i: usize| if i >= failed { i + 1 } else { i };
                let after = match owners(&rest, &units) {
                    Ok(o) => o,
                    Err(e) => {
                        eprintln!("{n} services minus one, {m} units: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                let moved = before
                    .iter()
                    .zip(&after)
                    .filter(|(b, a)| **b != back(**a))
                    .count();
                optimum_sum += before.iter().filter(|&&b| b == failed).count();
                moved_sum += moved;
                moved_max = moved_max.max(moved);
            }
            let mean = moved_sum as f64 / n as f64;
            let optimum = optimum_sum as f64 / n as f64;
            println!(
                "| {n} | {m} | {optimum:.1} | {mean:.1} | {moved_max} | {:.2} | {:.1}% |",
                mean / optimum,
                100.0 * mean / m as f64
            );
        }
    }
    ExitCode::SUCCESS
}
