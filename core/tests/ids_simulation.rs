//! The seeded simulation of majority IDs: several generators (processes) over 3 or 5 in-memory
//! stores, each link through its own fault layer (delays that reorder replies, failures before
//! the store, writes applied with the reply lost), a minority of stores down at times, on a
//! single-threaded Tokio runtime with paused time.
//!
//! Each generator is used one of three ways, drawn per seed: one ID per call
//! ([`MajorityIds::next`]), blocks of 1 to 8 IDs ([`MajorityIds::next_block`]), or 2 to 6 tasks
//! calling at once through one [`MediatedIds`] (group commit: one block per round for every
//! caller waiting; a quarter of the calls take 2 to 4 IDs).
//!
//! Checked over the whole history of every seed: no ID is returned twice, and every ID is
//! greater than every ID whose call completed before its own call started (linearizability of
//! a counter). With at most a minority down, calls keep succeeding.
//!
//! `HEADCOUNT_SIM_SEEDS=N` runs N seeds (default 300); `HEADCOUNT_SIM_SEED=S` replays one. The
//! generators' backoff draws from the thread's random generator, so a replay takes the same
//! schedule of faults and calls but not always the same retry pauses.

// Tests fail by panicking.
#![allow(clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use headcount_core::memory::MemoryStore;
use headcount_core::recipes::ids::{DurabilityPolicy, IdsConfig, MajorityIds, MediatedIds};
use headcount_core::sim::{FaultRates, Faults, FaultyStore, SimClock};
use headcount_core::{Clock, DynStore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// How one generator is used.
#[derive(Clone)]
enum Client {
    /// One ID per call.
    Single(Arc<MajorityIds>),
    /// Blocks of 1 to 8 IDs per call.
    Blocks(Arc<MajorityIds>),
    /// Several tasks at once through one mediator.
    Mediated(Arc<MediatedIds>),
}

impl Client {
    /// One call: the IDs it returned.
    async fn call(&self, rng: &mut StdRng) -> Result<Vec<i64>, headcount_core::Error> {
        match self {
            Client::Single(ids) => ids.next().await.map(|id| vec![id]),
            Client::Blocks(ids) => ids
                .next_block(rng.random_range(1..=8))
                .await
                .map(Iterator::collect),
            Client::Mediated(ids) => match rng.random_range(0..4) {
                0 => ids
                    .next_block(rng.random_range(2..=4))
                    .await
                    .map(Iterator::collect),
                _ => ids.next().await.map(|id| vec![id]),
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Call {
    client: usize,
    start: Instant,
    end: Instant,
    id: i64,
}

async fn run_seed(seed: u64) -> Result<(usize, usize), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n_stores = if rng.random_bool(0.5) { 3 } else { 5 };
    let clients = rng.random_range(2..=6);
    let rates = FaultRates {
        fail_before: rng.random_range(0.0..0.05),
        fail_after: rng.random_range(0.0..0.05),
        delay: rng.random_range(0.0..0.5),
        max_delay: Duration::from_millis(rng.random_range(1..20)),
    };
    let clock: Arc<dyn Clock> = Arc::new(SimClock::new(std::time::SystemTime::UNIX_EPOCH));
    let stores: Vec<MemoryStore> = (0..n_stores)
        .map(|_| MemoryStore::with_clock(clock.clone()))
        .collect();
    // links[c][s]: client c's connection to store s.
    let mut links: Vec<Vec<Arc<Faults>>> = Vec::new();
    let mut generators = Vec::new();
    for c in 0..clients {
        let mut faults = Vec::new();
        let mut handles: Vec<DynStore> = Vec::new();
        for (s, store) in stores.iter().enumerate() {
            let f = Faults::new(seed ^ ((c as u64) << 32) ^ (s as u64) << 48);
            f.set_rates(rates);
            handles.push(Arc::new(FaultyStore::new(
                Arc::new(store.clone()),
                f.clone(),
                clock.clone(),
            )));
            faults.push(f);
        }
        // Deadlines and backoff pauses on the simulated clock, like the stores' TTLs.
        let config = IdsConfig::new("sim")
            .with_deadline(Duration::from_secs(2))
            .with_durability(DurabilityPolicy::AllowNonDurable)
            .with_clock(clock.clone());
        let ids = MajorityIds::new(handles, config)
            .await
            .map_err(|e| format!("seed {seed}: generator {c}: {e}"))?;
        // Drawn apart from `rng`, so a seed's faults and calls are the ones it had before.
        let mut ways = StdRng::seed_from_u64(seed ^ 0x6d65_6469 ^ c as u64);
        match ways.random_range(0..3) {
            0 => generators.push(Client::Single(Arc::new(ids))),
            1 => generators.push(Client::Blocks(Arc::new(ids))),
            _ => {
                let mediated = Client::Mediated(Arc::new(MediatedIds::new(ids)));
                for _ in 0..ways.random_range(2..=6) {
                    generators.push(mediated.clone());
                }
            }
        }
        links.push(faults);
    }
    let history = Arc::new(Mutex::new(Vec::<Call>::new()));
    let failures = Arc::new(Mutex::new(0usize));
    let run = Duration::from_millis(rng.random_range(500..3_000));
    let mut tasks = Vec::new();
    for (c, ids) in generators.iter().enumerate() {
        let ids = ids.clone();
        let history = history.clone();
        let failures = failures.clone();
        let mut think = StdRng::seed_from_u64(seed.wrapping_add(c as u64 + 1));
        let stop = Instant::now() + run;
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let start = Instant::now();
                match ids.call(&mut think).await {
                    Ok(got) => {
                        let end = Instant::now();
                        history
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .extend(got.into_iter().map(|id| Call {
                                client: c,
                                start,
                                end,
                                id,
                            }));
                    }
                    Err(_) => {
                        *failures
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) += 1
                    }
                }
                let pause = think.random_range(0..5);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }));
    }
    // A minority of stores goes down and comes back, now and then.
    let minority = (n_stores - 1) / 2;
    let end = Instant::now() + run;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..200))).await;
        let down: Vec<usize> = (0..n_stores)
            .filter(|_| rng.random_bool(0.3))
            .take(minority)
            .collect();
        for (s, _) in stores.iter().enumerate() {
            for client in &links {
                client[s].set_down(down.contains(&s));
            }
        }
    }
    for client in &links {
        for f in client {
            f.set_down(false);
        }
    }
    for t in tasks {
        t.await
            .map_err(|e| format!("seed {seed}: a client died: {e}"))?;
    }
    let calls = history
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let failed = *failures
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    check(seed, &calls)?;
    if calls.is_empty() {
        return Err(format!(
            "seed {seed}: no call succeeded with at most {minority} of {n_stores} stores down ({failed} failed)"
        ));
    }
    Ok((calls.len(), failed))
}

/// Unique IDs, and each greater than every ID whose call completed before its call started.
fn check(seed: u64, calls: &[Call]) -> Result<(), String> {
    let mut ids: Vec<i64> = calls.iter().map(|c| c.id).collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("seed {seed}: ID {} returned twice", w[0]));
    }
    let mut by_end: Vec<&Call> = calls.iter().collect();
    by_end.sort_by_key(|c| c.end);
    for call in calls {
        // The largest ID among calls that completed strictly before this one started.
        let before = by_end
            .iter()
            .take_while(|c| c.end < call.start)
            .map(|c| c.id)
            .max();
        if let Some(max) = before {
            if call.id <= max {
                return Err(format!(
                    "seed {seed}: client {} got {} though {max} was returned before its call started \
                     (replay: HEADCOUNT_SIM_SEED={seed} cargo test -p headcount-core --test ids_simulation)",
                    call.client, call.id
                ));
            }
        }
    }
    Ok(())
}

fn run_one(seed: u64) -> Result<(usize, usize), String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| format!("runtime: {e}"))?
        .block_on(run_seed(seed))
}

#[test]
fn majority_ids_simulation() {
    let (seeds, _) = common::seeds(300);
    let (mut ok, mut failed_calls) = (0, 0);
    for seed in seeds {
        match run_one(seed) {
            Ok((n, f)) => {
                ok += n;
                failed_calls += f;
            }
            Err(e) => panic!("{e}"),
        }
    }
    eprintln!(
        "majority IDs simulation: {ok} IDs checked, {failed_calls} calls failed at their deadline"
    );
}

#[test]
fn the_checker_catches_repeats_and_stale_ids() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let call = |client, start, end, id| Call {
        client,
        start: at(start),
        end: at(end),
        id,
    };
    // Overlapping calls may return in any order.
    assert!(check(0, &[call(0, 0, 10, 2), call(1, 5, 15, 1)]).is_ok());
    assert!(check(0, &[call(0, 0, 10, 2), call(1, 11, 15, 1)]).is_err());
    assert!(check(0, &[call(0, 0, 10, 2), call(1, 5, 15, 2)]).is_err());
}

#[test]
fn group_commit_serves_the_waiting_callers_with_one_round() {
    run_paused(async {
        let clock: Arc<dyn Clock> = Arc::new(SimClock::new(std::time::SystemTime::UNIX_EPOCH));
        let faults = Faults::new(7);
        // Every reply 1 to 5 ms late, so that callers arrive while a round is in flight.
        faults.set_rates(FaultRates {
            fail_before: 0.0,
            fail_after: 0.0,
            delay: 1.0,
            max_delay: Duration::from_millis(5),
        });
        let stores: Vec<DynStore> = (0..3)
            .map(|_| {
                Arc::new(FaultyStore::new(
                    Arc::new(MemoryStore::with_clock(clock.clone())),
                    faults.clone(),
                    clock.clone(),
                )) as DynStore
            })
            .collect();
        let config = IdsConfig::new("batch")
            .with_durability(DurabilityPolicy::AllowNonDurable)
            .with_clock(clock.clone());
        let ids = Arc::new(MediatedIds::new(
            MajorityIds::new(stores, config).await.expect("generator"),
        ));
        let calls = (0..64).map(|_| {
            let ids = ids.clone();
            async move { ids.next().await.expect("an ID") }
        });
        let mut got = futures::future::join_all(calls).await;
        got.sort_unstable();
        assert_eq!(
            got,
            (1..=64).collect::<Vec<i64>>(),
            "64 IDs, no hole, no repeat"
        );
        let stats = ids.inner().stats();
        assert_eq!(stats.ids, 64);
        assert!(
            stats.won <= 4,
            "64 callers at once are served by a few rounds, not one each: {stats:?}"
        );
    });
}

#[test]
fn blocks_of_bad_sizes_are_refused() {
    run_paused(async {
        let store: DynStore = Arc::new(MemoryStore::new());
        let config = IdsConfig::new("bad").with_durability(DurabilityPolicy::AllowNonDurable);
        let ids = MajorityIds::new(vec![store], config)
            .await
            .expect("generator");
        for bad in [0, headcount_core::recipes::ids::MAX_BLOCK + 1, u64::MAX] {
            let e = ids.next_block(bad).await.expect_err("refused");
            assert_eq!(
                e.kind(),
                headcount_core::ErrorKind::InvalidArgument,
                "{bad}: {e}"
            );
        }
        assert_eq!(ids.next_block(3).await.expect("a block"), 1..=3);
        assert_eq!(ids.next().await.expect("an ID"), 4);
    });
}

/// Three stores where one holds `values[i]` at the key of generator `name`.
async fn stores_holding(name: &str, values: &[Option<i64>]) -> (Vec<MemoryStore>, MajorityIds) {
    let stores: Vec<MemoryStore> = values.iter().map(|_| MemoryStore::new()).collect();
    let key = format!("hc:{{ids}}:id:{name}");
    for (store, v) in stores.iter().zip(values) {
        if let Some(v) = v {
            use headcount_core::Store as _;
            let written = store
                .compare_and_set(&key, None, &v.to_string(), None)
                .await
                .expect("seed the store");
            assert!(written);
        }
    }
    let handles: Vec<DynStore> = stores
        .iter()
        .map(|s| Arc::new(s.clone()) as DynStore)
        .collect();
    let config = IdsConfig::new(name)
        .with_deadline(Duration::from_millis(300))
        .with_durability(DurabilityPolicy::AllowNonDurable)
        .with_clock(Arc::new(SimClock::new(std::time::SystemTime::UNIX_EPOCH)));
    let ids = MajorityIds::new(handles, config).await.expect("generator");
    (stores, ids)
}

async fn held(store: &MemoryStore, name: &str) -> Option<String> {
    use headcount_core::Store as _;
    store
        .get(&format!("hc:{{ids}}:id:{name}"))
        .await
        .expect("read")
}

/// A bad restore left one store of three near `i64::MAX`: before, the next call returned an ID
/// there and the generator was spent for good (the other two stores took it). Now the store is
/// left out of proposals, IDs go on from the majority's number, and the damaged store keeps its
/// value for an operator to repair. A number that a majority holds is never left out, however
/// far the others lag.
#[test]
fn a_store_far_ahead_of_a_majority_is_left_out_of_proposals() {
    run_paused(async {
        let huge = i64::MAX - 5;
        for at in 0..3 {
            let mut values = vec![Some(10), Some(12), None];
            values.insert(at, Some(huge));
            values.truncate(3);
            let (stores, ids) = stores_holding("far", &values).await;
            assert_eq!(ids.next().await.expect("an ID"), 13, "{values:?}");
            assert_eq!(ids.next_block(3).await.expect("a block"), 14..=16);
            assert_eq!(ids.next().await.expect("an ID"), 17);
            assert_eq!(held(&stores[at], "far").await, Some(huge.to_string()));
            let others: Vec<Option<String>> = futures_held(&stores, at).await;
            assert!(
                others.iter().all(|v| v.as_deref() == Some("17")),
                "{values:?}: {others:?}"
            );
        }
        // A majority far ahead of the third store is the generator's number.
        let far = (1i64 << 41) + 7;
        let (_, ids) = stores_holding("ahead", &[Some(far), None, Some(far)]).await;
        assert_eq!(ids.next().await.expect("an ID"), far + 1);
        assert_eq!(ids.next_block(2).await.expect("a block"), far + 2..=far + 3);
        // Two stores of three far ahead: a majority holds that much, so it is used too.
        let (_, ids) = stores_holding("two", &[Some(huge - 10), Some(3), Some(huge - 20)]).await;
        assert_eq!(ids.next().await.expect("an ID"), huge - 9);
    });
}

/// Two handles to one store (clones of one in-memory store share their data) are one failure
/// domain: refused, naming both.
#[test]
fn two_handles_to_one_store_are_refused() {
    run_paused(async {
        let one = MemoryStore::new();
        let stores: Vec<DynStore> = vec![
            Arc::new(one.clone()),
            Arc::new(MemoryStore::new()),
            Arc::new(one),
        ];
        let config = IdsConfig::new("twice").with_durability(DurabilityPolicy::AllowNonDurable);
        let e = MajorityIds::new(stores, config)
            .await
            .expect_err("one store twice");
        assert_eq!(e.kind(), headcount_core::ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("#0 and #2 are one server"), "{e}");
    });
}

/// Two stores of five restored from one bad backup hold the same huge number: a majority (the
/// other three) holds far less, so both are left out. And a store far ahead that cannot be told
/// apart (a third store down) fails the call, and leaves nothing behind that a later call (a
/// block, which may skip its read) would propose from.
#[test]
fn stores_far_ahead_are_left_out_even_in_pairs_and_never_remembered() {
    run_paused(async {
        let huge = 1i64 << 62;
        let (stores, ids) =
            stores_holding("pair", &[Some(huge), Some(7), Some(huge), Some(5), Some(9)]).await;
        assert_eq!(ids.next().await.expect("an ID"), 10);
        assert_eq!(ids.next_block(2).await.expect("a block"), 11..=12);
        assert_eq!(held(&stores[0], "pair").await, Some(huge.to_string()));

        // A = B = 100, C far ahead, B down: a majority cannot be told, the calls fail closed.
        let clock: Arc<dyn Clock> = Arc::new(SimClock::new(std::time::SystemTime::UNIX_EPOCH));
        let raw: Vec<MemoryStore> = (0..3)
            .map(|_| MemoryStore::with_clock(clock.clone()))
            .collect();
        let key = "hc:{ids}:id:down";
        for (store, v) in raw.iter().zip([100, 100, huge]) {
            use headcount_core::Store as _;
            assert!(store
                .compare_and_set(key, None, &v.to_string(), None)
                .await
                .expect("seed"));
        }
        let faults: Vec<Arc<Faults>> = (0..3).map(Faults::new).collect();
        let handles: Vec<DynStore> = raw
            .iter()
            .zip(&faults)
            .map(|(s, f)| {
                Arc::new(FaultyStore::new(
                    Arc::new(s.clone()),
                    f.clone(),
                    clock.clone(),
                )) as DynStore
            })
            .collect();
        let config = IdsConfig::new("down")
            .with_deadline(Duration::from_millis(300))
            .with_durability(DurabilityPolicy::AllowNonDurable)
            .with_clock(clock.clone());
        let ids = MajorityIds::new(handles, config).await.expect("generator");
        faults[1].set_down(true);
        ids.next_block(2)
            .await
            .expect_err("cannot tell with B down");
        ids.next().await.expect_err("cannot tell with B down");
        faults[1].set_down(false);
        assert_eq!(ids.next_block(2).await.expect("a block"), 101..=102);
        assert_eq!(ids.next().await.expect("an ID"), 103);
    });
}

/// What every store but `skip` holds at generator `far`'s key.
async fn futures_held(stores: &[MemoryStore], skip: usize) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for (i, s) in stores.iter().enumerate() {
        if i != skip {
            out.push(held(s, "far").await);
        }
    }
    out
}

fn run_paused(test: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
        .block_on(test);
}
