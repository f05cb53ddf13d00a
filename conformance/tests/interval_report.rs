//! Measurements of the interval indexer behind `docs/interval.md`, on an in-memory SQLite store.
//!
//! The quick test checks that the transition is what makes the scale scenario exact (without it
//! tasks are duplicated); the ignored one prints the full figures:
//! `cargo test -p headcount-conformance --test interval_report -- --ignored --nocapture`.
#![cfg(feature = "sqlite")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use headcount_conformance::cases::interval::{
    converge_with_offsets, scale_scenario, ScaleReport, INTERVAL,
};
use headcount_conformance::Ctx;

async fn ctx() -> Ctx {
    let store = headcount::connect("sqlite::memory:").await.unwrap();
    Ctx::new(store, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_transition_the_scale_scenario_duplicates() {
    let raw = scale_scenario(&ctx().await, false).await.unwrap();
    let safe = scale_scenario(&ctx().await, true).await.unwrap();
    println!("without the transition: {raw:?}\nwith the transition:    {safe:?}");
    assert!(raw.duplicated > 0, "{raw:?}");
    assert_eq!(safe.duplicated, 0, "{safe:?}");
    assert_eq!(safe.never, 0, "{safe:?}");
}

fn row(name: &str, r: &ScaleReport) {
    println!(
        "| {name} | {} | {} | {} | {} | {} |",
        r.offered, r.once, r.duplicated, r.missed_first_offer, r.never
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints the figures of docs/interval.md"]
async fn report() {
    println!("| run | offered | once | duplicated | missed at first offer | never |");
    println!("|---|---|---|---|---|---|");
    row(
        "without transition",
        &scale_scenario(&ctx().await, false).await.unwrap(),
    );
    row(
        "with transition",
        &scale_scenario(&ctx().await, true).await.unwrap(),
    );

    println!();
    println!("| clock spread (s) | converged within 2.5 intervals | double-owned observations |");
    println!("|---|---|---|");
    const TRIALS: u32 = 8;
    for k in 0..=20u32 {
        let spread = INTERVAL * k / 20;
        let offsets: Vec<Duration> = (0..5u32).map(|i| spread * i / 4).collect();
        let mut ok = 0;
        let mut double = 0;
        for trial in 0..TRIALS {
            let seen = converge_with_offsets(&ctx().await, &offsets, 1000 + u64::from(trial) * 10)
                .await
                .unwrap();
            if seen.after_last_join.is_some_and(|d| d <= INTERVAL * 5 / 2) {
                ok += 1;
            }
            double += seen.double_owned;
        }
        println!("| {:.1} | {ok}/{TRIALS} | {double} |", spread.as_secs_f64());
    }
}
