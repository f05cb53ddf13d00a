//! The lossy notification channel of a [`FaultyStore`](super::FaultyStore): the notifications
//! it hands out are fed from the inner store's by a task of their own, which drops, delays
//! (reordering notices across directories), duplicates and adds notices, as
//! [`NoticeRates`] and the process's [`Faults`] say. Delays sleep on the store's clock, so
//! under a simulation's paused time they cost nothing and, for one seed, are always the same;
//! while the process is paused ([`Faults::pause`]) notices are held, as a stopped process
//! reads nothing from its sockets.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use super::{lock, Faults};
use crate::clock::Clock;
use crate::notify::{Notice, Notifications, NotifyHub};

/// How the notices of a [`FaultyStore`](super::FaultyStore)'s subscriptions are delivered:
/// probabilities in `0.0..=1.0`, drawn for each notice of the inner store, and the longest
/// delay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NoticeRates {
    /// Whether subscriptions get notices at all: false hands out
    /// [`Notifications::never`] (a store without notifications, or one whose server refuses
    /// them), read when subscribing.
    pub enabled: bool,
    /// A notice is lost.
    pub drop: f64,
    /// A notice (not lost) is delivered up to [`NoticeRates::max_delay`] late.
    pub delay: f64,
    /// A notice (not lost) is delivered once more, up to [`NoticeRates::max_delay`] after
    /// the first.
    pub duplicate: f64,
    /// Beside a notice, another one comes up to [`NoticeRates::max_delay`] later, for nothing:
    /// a [`Notice::Changed`] or a [`Notice::MayHaveMissed`], as likely.
    pub spurious: f64,
    /// The longest delay.
    pub max_delay: Duration,
}

impl NoticeRates {
    /// Every notice delivered once, at once (held only while the process is paused).
    pub const NONE: NoticeRates = NoticeRates {
        enabled: true,
        drop: 0.0,
        delay: 0.0,
        duplicate: 0.0,
        spurious: 0.0,
        max_delay: Duration::ZERO,
    };

    /// No notification at all: subscriptions hand out [`Notifications::never`].
    pub const OFF: NoticeRates = NoticeRates {
        enabled: false,
        ..NoticeRates::NONE
    };
}

impl Faults {
    /// Replaces the notice rates. Subscriptions made before follow the new rates, except for
    /// [`NoticeRates::enabled`], which counts when subscribing.
    pub fn set_notice_rates(&self, rates: NoticeRates) {
        *lock(&self.notice_rates) = rates;
    }

    /// The notice rates.
    pub fn notice_rates(&self) -> NoticeRates {
        *lock(&self.notice_rates)
    }

    /// How many notice faults (drops, delays, duplicates, spurious notices) were injected.
    pub fn notice_faults(&self) -> u64 {
        self.notice_faults
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The deliveries of one notice of the inner store: when (after it came) and what.
    fn deliveries(&self, notice: Notice) -> Vec<(Duration, Notice)> {
        let rates = self.notice_rates();
        let mut rng = lock(&self.notice_rng);
        let within = |rng: &mut StdRng| within(rng, rates.max_delay);
        let mut out = Vec::new();
        let mut faults = 0;
        if chance(&mut rng, rates.drop) {
            faults += 1;
        } else {
            let at = if chance(&mut rng, rates.delay) {
                faults += 1;
                within(&mut rng)
            } else {
                Duration::ZERO
            };
            out.push((at, notice));
            if chance(&mut rng, rates.duplicate) {
                faults += 1;
                out.push((at + within(&mut rng), notice));
            }
        }
        if chance(&mut rng, rates.spurious) {
            faults += 1;
            let what = if rng.random_bool(0.5) {
                Notice::Changed
            } else {
                Notice::MayHaveMissed
            };
            out.push((within(&mut rng), what));
        }
        drop(rng);
        if faults > 0 {
            self.notice_faults
                .fetch_add(faults, std::sync::atomic::Ordering::Relaxed);
        }
        out
    }
}

/// True with probability `p`; no draw when `p` is zero.
fn chance(rng: &mut StdRng, p: f64) -> bool {
    p > 0.0 && rng.random_bool(p.min(1.0))
}

/// A time up to `max`, uniformly; no draw when `max` is zero.
fn within(rng: &mut StdRng, max: Duration) -> Duration {
    let max = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(if max == 0 {
        0
    } else {
        rng.random_range(0..=max)
    })
}

/// Notifications of `upstream`'s directory fed from `upstream` through the faults: a task on
/// the current runtime forwards them, and ends (unsubscribing `upstream`) once the answer is
/// dropped. `upstream` itself when it never fires.
pub(super) fn lossy(
    upstream: Notifications,
    faults: Arc<Faults>,
    clock: Arc<dyn Clock>,
) -> Notifications {
    if !upstream.is_native() {
        return upstream;
    }
    let hub = NotifyHub::new();
    let downstream = hub.subscribe(upstream.dir());
    tokio::spawn(forward(upstream, hub, faults, clock));
    downstream
}

/// A notice waiting for its time: when (on the clock's monotonic time), in what order it was
/// scheduled (so equal times keep their order), and whether it is a
/// [`Notice::MayHaveMissed`].
type Pending = Reverse<(Duration, u64, bool)>;

async fn forward(
    mut upstream: Notifications,
    hub: NotifyHub,
    faults: Arc<Faults>,
    clock: Arc<dyn Clock>,
) {
    let dir = upstream.dir().to_owned();
    let mut listener = hub.listener();
    let mut paused = faults.paused.subscribe();
    let mut queue: BinaryHeap<Pending> = BinaryHeap::new();
    let mut scheduled: u64 = 0;
    loop {
        let held = *paused.borrow_and_update();
        if !held {
            let now = clock.monotonic();
            while let Some(Reverse((at, _, missed))) = queue.peek().copied() {
                if at > now {
                    break;
                }
                queue.pop();
                if missed {
                    hub.notify_missed();
                } else {
                    hub.notify(&dir);
                }
            }
        }
        let next = queue.peek().map(|Reverse((at, _, _))| *at);
        tokio::select! {
            biased;
            _ = listener.directories_changed() => {
                // The task holds the hub, so it is there: what changed is that the
                // notifications it feeds were dropped.
                if hub.directories().is_empty() {
                    return;
                }
            }
            changed = paused.changed() => {
                // The sender lives in `faults`, which this task holds: never an error.
                if changed.is_err() {
                    return;
                }
            }
            () = clock.sleep_until(next.unwrap_or_default()), if next.is_some() && !held => {}
            notice = upstream.recv() => {
                let now = clock.monotonic();
                for (after, what) in faults.deliveries(notice) {
                    scheduled += 1;
                    queue.push(Reverse((now + after, scheduled, what == Notice::MayHaveMissed)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;
    use std::time::Duration;

    use super::NoticeRates;
    use crate::memory::MemoryStore;
    use crate::notify::Notice;
    use crate::sim::{Faults, FaultyStore, SimClock};
    use crate::{Clock, DynStore, Store};

    const DIR: &str = "hc:{g}:d:";

    fn faulty(rates: NoticeRates, seed: u64) -> (MemoryStore, FaultyStore, Arc<Faults>) {
        let clock = SimClock::new(std::time::SystemTime::UNIX_EPOCH);
        let memory = MemoryStore::with_clock(Arc::new(clock.clone()));
        let faults = Faults::new(seed);
        faults.set_notice_rates(rates);
        let inner: DynStore = Arc::new(memory.clone());
        let clock: Arc<dyn Clock> = Arc::new(clock);
        let store = FaultyStore::new(inner, faults.clone(), clock);
        (memory, store, faults)
    }

    async fn write(memory: &MemoryStore, n: usize) {
        memory
            .compare_and_set(&format!("{DIR}k"), None, &n.to_string(), None)
            .await
            .unwrap();
        memory.delete(&format!("{DIR}k")).await.unwrap();
    }

    /// Lets the forwarding task run without moving the clock.
    async fn run_pending() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn perfect_delivery_is_at_once_and_held_while_paused() {
        let (memory, store, faults) = faulty(NoticeRates::NONE, 1);
        let mut n = store.subscribe(DIR).await.unwrap();
        assert!(n.is_native());
        write(&memory, 0).await;
        run_pending().await;
        assert_eq!(n.try_recv(), Some(Notice::Changed));
        faults.pause();
        write(&memory, 1).await;
        run_pending().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(n.try_recv(), None, "held while paused");
        faults.resume();
        run_pending().await;
        assert_eq!(n.try_recv(), Some(Notice::Changed));
        assert_eq!(faults.notice_faults(), 0);
        let off = faulty(NoticeRates::OFF, 1).1.subscribe(DIR).await.unwrap();
        assert!(!off.is_native());
    }

    #[tokio::test(start_paused = true)]
    async fn notices_are_dropped_delayed_and_duplicated() {
        // Everything lost.
        let drop_all = NoticeRates {
            drop: 1.0,
            ..NoticeRates::NONE
        };
        let (memory, store, faults) = faulty(drop_all, 2);
        let mut n = store.subscribe(DIR).await.unwrap();
        write(&memory, 0).await;
        run_pending().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(n.try_recv(), None);
        assert_eq!(faults.notice_faults(), 1);

        // Every notice late, and once more later still.
        let late_twice = NoticeRates {
            delay: 1.0,
            duplicate: 1.0,
            max_delay: Duration::from_millis(100),
            ..NoticeRates::NONE
        };
        let (memory, store, faults) = faulty(late_twice, 3);
        let mut n = store.subscribe(DIR).await.unwrap();
        let start = tokio::time::Instant::now();
        write(&memory, 0).await;
        run_pending().await;
        assert_eq!(n.recv().await, Notice::Changed);
        let first = start.elapsed();
        assert!(first > Duration::ZERO, "delayed");
        assert!(first <= Duration::from_millis(100));
        assert_eq!(n.recv().await, Notice::Changed);
        let second = start.elapsed();
        assert!(second > first, "duplicated later");
        assert!(second <= Duration::from_millis(200));
        assert_eq!(faults.notice_faults(), 2);

        // Half lost, some spurious: some come, not all.
        let lossy = NoticeRates {
            drop: 0.5,
            spurious: 0.2,
            max_delay: Duration::from_millis(50),
            ..NoticeRates::NONE
        };
        let (memory, store, faults) = faulty(lossy, 4);
        let mut n = store.subscribe(DIR).await.unwrap();
        let mut got = 0;
        for i in 0..100 {
            write(&memory, i).await;
            run_pending().await;
            tokio::time::sleep(Duration::from_millis(60)).await;
            while n.try_recv().is_some() {
                got += 1;
            }
        }
        assert!((20..90).contains(&got), "{got} of 100 notices");
        assert!(faults.notice_faults() > 30);
    }

    #[tokio::test(start_paused = true)]
    async fn the_task_ends_when_the_notifications_are_dropped() {
        let slow = NoticeRates {
            delay: 1.0,
            max_delay: Duration::from_secs(5),
            ..NoticeRates::NONE
        };
        let (memory, store, _faults) = faulty(slow, 5);
        let n = store.subscribe(DIR).await.unwrap();
        run_pending().await;
        assert_eq!(memory.hub.directories(), vec![DIR.to_owned()]);
        write(&memory, 0).await;
        run_pending().await;
        drop(n);
        run_pending().await;
        // The task dropped its subscription to the inner store: it ended.
        assert!(memory.hub.directories().is_empty());
    }
}
