//! The distributor and majority IDs run on the clock they are given: a [`ManualClock`] paces the
//! distributor's polls and the services' heartbeats, and times the IDs' deadlines, so a test
//! steps through minutes of their life without waiting for them.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use headcount_core::decorated::{Decorated, Hooks};
use headcount_core::memory::MemoryStore;
use headcount_core::recipes::distributor::{
    self, add_unit, read_assignment, register, spawn_heartbeat_with_clock, Distributor,
    DistributorConfig, Liveness,
};
use headcount_core::recipes::ids::{DurabilityPolicy, IdsConfig, MajorityIds};
use headcount_core::{Clock, DynStore, ManualClock, Op, Result};

/// Lets the spawned tasks run until they wait on the clock again.
async fn run_pending() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Steps `clock` forward by `step` until `done` holds or `limit` of clock time has passed, giving
/// the tasks real time to run after each step.
async fn step_until<F, Fut>(clock: &ManualClock, step: Duration, limit: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = clock.monotonic() + limit;
    while clock.monotonic() < end {
        run_pending().await;
        if done().await {
            return;
        }
        clock.advance(step);
    }
    panic!("not done within {limit:?} of the manual clock");
}

#[tokio::test]
async fn the_distributor_moves_units_off_a_dead_service_on_the_manual_clock() {
    let clock = ManualClock::at_unix_secs(1_000_000);
    let store: DynStore = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let services = distributor::namespace("hc", "services", "svc").unwrap();
    let units = distributor::namespace("hc", "workunits", "work").unwrap();
    let out = distributor::namespace("hc", "distribution", "dist").unwrap();
    for u in ["u1", "u2", "u3", "u4"] {
        add_unit(&store, &units, u).await.unwrap();
    }
    let ttl = Duration::from_secs(3);
    for name in ["a", "b"] {
        register(&store, &services, name, &Liveness::Heartbeat)
            .await
            .unwrap();
    }
    let a = spawn_heartbeat_with_clock(
        store.clone(),
        services.clone(),
        "a".into(),
        ttl,
        Arc::new(clock.clone()),
    )
    .await
    .unwrap();
    let b = spawn_heartbeat_with_clock(
        store.clone(),
        services.clone(),
        "b".into(),
        ttl,
        Arc::new(clock.clone()),
    )
    .await
    .unwrap();
    let config = DistributorConfig::new(["svc"], "work", "dist")
        .with_poll_interval(Duration::from_secs(1))
        .with_clock(Arc::new(clock.clone()));
    let running = Distributor::new(store.clone(), config).unwrap().spawn();

    let units_of = |name: &'static str| {
        let (store, out) = (store.clone(), out.clone());
        async move {
            read_assignment(&store, &out, name)
                .await
                .unwrap()
                .map_or(0, |a| a.units.len())
        }
    };
    let step = Duration::from_millis(500);
    step_until(&clock, step, Duration::from_secs(10), || async {
        units_of("a").await + units_of("b").await == 4 && units_of("b").await > 0
    })
    .await;

    // b stops renewing: its heartbeat expires after the TTL on the store's (manual) clock, and
    // the next poll gives its units to a, all without a second of real time.
    b.stop();
    let started = std::time::Instant::now();
    step_until(&clock, step, Duration::from_secs(10), || async {
        units_of("a").await == 4
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?} of real time",
        started.elapsed()
    );
    running.stop().await;
    a.stop();
}

/// Every `get` and `set_max` hangs: only the deadline ends a call.
#[derive(Debug)]
struct Hang;

#[async_trait]
impl Hooks for Hang {
    async fn before(&self, op: Op) -> Result<()> {
        if matches!(op, Op::Get | Op::SetMax | Op::CompareAndSet) {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

#[tokio::test]
async fn an_ids_deadline_passes_on_the_manual_clock_only() {
    let clock = ManualClock::at_unix_secs(1_000_000);
    let stores: Vec<DynStore> = (0..3)
        .map(|_| {
            let inner: DynStore = Arc::new(MemoryStore::new());
            Arc::new(Decorated::with(inner, Hang)) as DynStore
        })
        .collect();
    let deadline = Duration::from_secs(30);
    let config = IdsConfig::new("orders")
        .with_deadline(deadline)
        .with_durability(DurabilityPolicy::AllowNonDurable)
        .with_clock(Arc::new(clock.clone()));
    let ids = Arc::new(MajorityIds::new(stores, config).await.unwrap());
    let call = tokio::spawn({
        let ids = ids.clone();
        async move { ids.next().await }
    });
    // Real time passes; the manual clock does not: the call keeps waiting.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!call.is_finished(), "the deadline ran on real time");
    // Past the deadline on the manual clock (in steps, for the backoff pauses between rounds).
    let mut waited = Duration::ZERO;
    while !call.is_finished() && waited <= deadline + Duration::from_secs(5) {
        clock.advance(Duration::from_millis(250));
        waited += Duration::from_millis(250);
        run_pending().await;
    }
    let err = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("ended once the manual clock passed the deadline")
        .unwrap()
        .expect_err("no store answered");
    assert!(err.is_retryable(), "{err}");
    assert!(waited >= deadline, "ended after {waited:?} of {deadline:?}");
}
