//! Tools for testing code that uses headcount under faults: a clock for deterministic
//! simulations ([`SimClock`]) and a fault layer over any store ([`FaultyStore`]).
//!
//! headcount's own protocol simulation (`core/tests/simulation.rs`) runs the recipes on a
//! single-threaded Tokio runtime with paused time, where the runtime jumps to the next timer
//! whenever every task waits: a run of minutes takes milliseconds and, for one seed, always
//! takes the same steps. It wraps a [`MemoryStore`](crate::memory::MemoryStore) in a
//! [`FaultyStore`] per member, so each call can be delayed (replies come back reordered),
//! fail before reaching the store, or be applied with its reply lost; it rolls the store back
//! with [`MemoryStore::restore`](crate::memory::MemoryStore::restore), steps the store's clock
//! with [`SimClock::step_wall`], and pauses a member with [`Faults::pause`]. The change
//! notifications a [`FaultyStore`] hands out pass through a lossy channel ([`NoticeRates`]):
//! notices are dropped, delayed (reordered across directories), duplicated, and now and then
//! one comes for nothing.
//!
//! The in-memory store answers a directory's version with a digest of its contents, which no
//! fault can make miss a change. headcount's own simulation also runs the group over store
//! models that answer the way each backend does (Redis's key index and version counters, etcd's
//! revisions, the SQL digests), in a crate of its tests (`headcount-sim`, never published).
//!
//! This module is part of the test kit: compiled only with the cargo feature `testkit`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use crate::clock::Clock;
use crate::decorated::{Decorated, Hooks};
use crate::error::{Error, Result};
use crate::notify::Notifications;
use crate::{DynStore, Op};

mod notices;

pub use self::notices::NoticeRates;

/// Locks a model's state. Every call leaves the state consistent before it can panic, so a
/// poisoned lock still guards valid state.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A clock on Tokio's time (so a runtime with paused time drives it) whose wall clock can be
/// stepped. Clones share the wall-clock step.
#[derive(Debug, Clone)]
pub struct SimClock {
    origin: tokio::time::Instant,
    wall_origin: SystemTime,
    /// Milliseconds added to the wall clock (a step forward).
    step_ms: Arc<AtomicU64>,
    /// The draws of [`Clock::random`], when seeded ([`SimClock::with_seed`]).
    rng: Option<Arc<Mutex<StdRng>>>,
}

impl SimClock {
    /// A clock whose monotonic time starts now (Tokio's) and whose wall time starts at `wall`.
    /// Create it inside the runtime that drives it.
    pub fn new(wall: SystemTime) -> Self {
        SimClock {
            origin: tokio::time::Instant::now(),
            wall_origin: wall,
            step_ms: Arc::new(AtomicU64::new(0)),
            rng: None,
        }
    }

    /// The same clock whose [`Clock::random`] draws from a generator seeded with `seed`, so
    /// that the members' nonces, and so a whole run, are the same at every replay.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.rng = Some(Arc::new(Mutex::new(StdRng::seed_from_u64(seed))));
        self
    }

    /// Steps the wall clock forward by `d` (as NTP stepping a host's clock would); the monotonic
    /// clock and sleeps are untouched.
    pub fn step_wall(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.step_ms.fetch_add(ms, Ordering::Relaxed);
    }
}

#[async_trait]
impl Clock for SimClock {
    fn now(&self) -> SystemTime {
        let step = Duration::from_millis(self.step_ms.load(Ordering::Relaxed));
        self.wall_origin + self.origin.elapsed() + step
    }

    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }

    async fn sleep(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    async fn sleep_until(&self, deadline: Duration) {
        tokio::time::sleep_until(self.origin + deadline).await;
    }

    fn random(&self) -> u64 {
        match &self.rng {
            Some(rng) => lock(rng).random(),
            None => rand::random(),
        }
    }
}

/// How often each kind of fault strikes a call through a [`FaultyStore`]: probabilities in
/// `0.0..=1.0`, and the longest delay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultRates {
    /// A call fails with [`Error::Unavailable`] before it reaches the store.
    pub fail_before: f64,
    /// A call is applied but its reply is lost: the caller gets [`Error::Timeout`].
    pub fail_after: f64,
    /// A call is delayed (before and after it is applied) by up to [`FaultRates::max_delay`].
    pub delay: f64,
    /// The longest delay.
    pub max_delay: Duration,
}

impl FaultRates {
    /// No faults at all.
    pub const NONE: FaultRates = FaultRates {
        fail_before: 0.0,
        fail_after: 0.0,
        delay: 0.0,
        max_delay: Duration::ZERO,
    };
}

/// The controls of one [`FaultyStore`]: its fault rates, its random generators and whether it
/// is paused. Shared by the store and whoever drives the faults.
#[derive(Debug)]
pub struct Faults {
    rng: Mutex<StdRng>,
    rates: Mutex<FaultRates>,
    paused: watch::Sender<bool>,
    down: AtomicBool,
    injected: AtomicU64,
    /// The draws of the notification channel, apart from the calls' so that the calls' faults
    /// are drawn as they would be without notifications.
    notice_rng: Mutex<StdRng>,
    notice_rates: Mutex<NoticeRates>,
    notice_faults: AtomicU64,
}

impl Faults {
    /// Controls with no faults (and notices delivered perfectly), drawing from generators
    /// seeded with `seed`.
    pub fn new(seed: u64) -> Arc<Faults> {
        Arc::new(Faults {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            rates: Mutex::new(FaultRates::NONE),
            paused: watch::Sender::new(false),
            down: AtomicBool::new(false),
            injected: AtomicU64::new(0),
            notice_rng: Mutex::new(StdRng::seed_from_u64(seed ^ 0x0071_ce5e)),
            notice_rates: Mutex::new(NoticeRates::NONE),
            notice_faults: AtomicU64::new(0),
        })
    }

    fn lock_rates(&self) -> MutexGuard<'_, FaultRates> {
        lock(&self.rates)
    }

    /// Replaces the fault rates.
    pub fn set_rates(&self, rates: FaultRates) {
        *self.lock_rates() = rates;
    }

    /// Holds every call (new ones and those waiting to be applied) and every notice until
    /// [`Faults::resume`]: a process stopped by SIGSTOP, or a connection that stalls.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Lets held calls go on.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// While true, every call fails with [`Error::Unavailable`] before reaching the store (a
    /// store that is down or unreachable).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
    }

    /// How many faults (failures and delays) were injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Draws whether a call fails with the given probability, and whether (and how long) it is
    /// delayed.
    fn roll(&self, fail: impl Fn(&FaultRates) -> f64) -> (bool, Option<Duration>) {
        let rates = *self.lock_rates();
        let mut rng = lock(&self.rng);
        let mut chance = |p: f64| p > 0.0 && rng.random_bool(p.min(1.0));
        let failed = chance(fail(&rates));
        let delayed = chance(rates.delay) && !rates.max_delay.is_zero();
        let delay = delayed.then(|| {
            let max = u64::try_from(rates.max_delay.as_micros()).unwrap_or(u64::MAX);
            Duration::from_micros(rng.random_range(0..=max))
        });
        if failed || delayed {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        (failed, delay)
    }

    /// Before a call: whether it fails before the store, and its delay.
    fn draw(&self) -> (bool, Option<Duration>) {
        self.roll(|r| r.fail_before)
    }

    /// After a call: whether its reply is lost, and its delay.
    fn draw_after(&self) -> (bool, Option<Duration>) {
        self.roll(|r| r.fail_after)
    }

    async fn wait_unpaused(&self) {
        let mut rx = self.paused.subscribe();
        // The sender lives in `self`, which outlives this call.
        let _ = rx.wait_for(|paused| !*paused).await;
    }
}

/// The [`Hooks`] of a [`FaultyStore`]: the shared [`Faults`] and the clock that times delays.
#[derive(Debug, Clone)]
pub struct Faulty {
    faults: Arc<Faults>,
    clock: Arc<dyn Clock>,
    backend: &'static str,
}

/// A [`Store`](crate::Store) that injects faults into every call to the store it wraps, under
/// the control of a shared [`Faults`]: before the call, a pause, a delay, or a failure that
/// never reaches the store; after it, a delay, a pause, or a lost reply. Its change
/// notifications are the inner store's through a lossy channel ([`NoticeRates`]): a task per
/// subscription drops, delays, duplicates and adds notices, and holds them while paused.
/// Delays sleep on the given clock, so under a simulation's paused time they cost nothing and
/// reorder replies and notices deterministically.
pub type FaultyStore = Decorated<Faulty>;

impl Decorated<Faulty> {
    /// Wraps `inner`; `faults` decides what happens to each call, `clock` times the delays.
    pub fn new(inner: DynStore, faults: Arc<Faults>, clock: Arc<dyn Clock>) -> Self {
        let backend = inner.capabilities().backend;
        Decorated::with(
            inner,
            Faulty {
                faults,
                clock,
                backend,
            },
        )
    }

    /// The controls.
    pub fn faults(&self) -> &Arc<Faults> {
        &self.hooks().faults
    }
}

#[async_trait]
impl Hooks for Faulty {
    async fn before(&self, op: Op) -> Result<()> {
        self.faults.wait_unpaused().await;
        let (fail, delay) = self.faults.draw();
        if let Some(d) = delay {
            self.clock.sleep(d).await;
            self.faults.wait_unpaused().await;
        }
        if fail || self.faults.down.load(Ordering::Relaxed) {
            return Err(Error::Unavailable {
                backend: self.backend,
                message: format!("injected fault: `{op}` failed before reaching the store"),
                source: None,
            });
        }
        Ok(())
    }

    /// The inner store's notifications through the lossy channel, or none when the notice
    /// rates say so ([`NoticeRates::enabled`]). Call it within a Tokio runtime: it spawns the
    /// task that feeds them.
    async fn subscribe(&self, inner: &DynStore, dir: &str) -> Result<Notifications> {
        if !self.faults.notice_rates().enabled {
            return Ok(Notifications::never(dir));
        }
        let upstream = inner.subscribe(dir).await?;
        Ok(notices::lossy(
            upstream,
            self.faults.clone(),
            self.clock.clone(),
        ))
    }

    async fn after(&self, op: Op, _took: Duration) -> Result<()> {
        let (lost, delay) = self.faults.draw_after();
        if let Some(d) = delay {
            self.clock.sleep(d).await;
        }
        // A paused process does not see the reply until it runs again.
        self.faults.wait_unpaused().await;
        if lost {
            return Err(Error::Timeout {
                backend: self.backend,
                op: op.name(),
                after: delay.unwrap_or_default(),
            });
        }
        Ok(())
    }
}
