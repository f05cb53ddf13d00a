//! Prints the report on the assignors for a declared key set (see
//! `headcount_core::assign::report::declared`): the shares and the movement of `sticky`,
//! `balanced` and `jumpback` over 256 and 4096 declared partitions at 3, 10 and 20 members, as a
//! Markdown table.
//!
//! `cargo test -p headcount-core --bench balanced_report` runs it in a debug build, `cargo bench
//! -p headcount-core --bench balanced_report` in an optimised one: the figures are exact counts,
//! the same either way.

#![allow(missing_docs)]

use std::process::ExitCode;

use headcount_core::assign::report;

fn main() -> ExitCode {
    match report::declared(&report::DECLARED_KEYS, &report::DECLARED_MEMBERS) {
        Ok(rows) => {
            println!(
                "Partitions \"0\"..\"keys-1\"; slots 0..n all live; the join appends slot n; each of the n members leaves in turn (a leave and a crash change the view alike).\n"
            );
            print!("{}", report::declared_markdown(&rows));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("declared-set report: {e}");
            ExitCode::FAILURE
        }
    }
}
