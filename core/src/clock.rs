//! Injectable time. Recipes read the wall clock (interval numbers), a monotonic clock (lease
//! deadlines that must not move when the wall clock is stepped) and sleep through a [`Clock`], so
//! tests can skew, step and freeze time with a [`ManualClock`].

use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
#[cfg(not(any(target_os = "linux", target_os = "android")))]
use std::time::Instant;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::watch;

/// A source of time.
#[async_trait]
pub trait Clock: Send + Sync + Debug + 'static {
    /// Wall-clock time. May jump (NTP steps, skew between machines).
    fn now(&self) -> SystemTime;

    /// Time elapsed since this clock's origin. Never goes backwards.
    fn monotonic(&self) -> Duration;

    /// Waits until [`monotonic`](Clock::monotonic) has advanced by at least `d`.
    async fn sleep(&self, d: Duration);

    /// Waits until [`monotonic`](Clock::monotonic) reads at least `deadline`. The provided
    /// method sleeps for the difference; [`ManualClock`] waits for the deadline itself, so an
    /// advance between computing it and sleeping cannot push it later.
    async fn sleep_until(&self, deadline: Duration) {
        let now = self.monotonic();
        if deadline > now {
            self.sleep(deadline - now).await;
        }
    }

    /// A random number, for the nonce of a claim. The provided method draws from the thread's
    /// generator; a simulation's clock draws from a seeded one, so that a run with the same
    /// seed makes the same claims and replays exactly.
    fn random(&self) -> u64 {
        rand::random()
    }
}

/// Runs `work` until it finishes or `clock`'s [`monotonic`](Clock::monotonic) time reaches
/// `deadline`: `None` when the deadline came first (`work` is dropped). The recipes time their
/// store calls with it, so a [`ManualClock`] drives their deadlines as it drives their sleeps.
pub async fn timeout_at<F: Future>(
    clock: &dyn Clock,
    deadline: Duration,
    work: F,
) -> Option<F::Output> {
    tokio::select! {
        biased;
        out = work => Some(out),
        () = clock.sleep_until(deadline) => None,
    }
}

/// [`timeout_at`] `after` from now.
pub async fn timeout<F: Future>(clock: &dyn Clock, after: Duration, work: F) -> Option<F::Output> {
    match clock.monotonic().checked_add(after) {
        Some(deadline) => timeout_at(clock, deadline, work).await,
        None => Some(work.await),
    }
}

/// A fixed period on a clock, for a task that works every `period`: each [`Pace::tick`] waits
/// until one period after the previous tick's start, or returns at once when the work since then
/// took longer (no burst of ticks to catch up: the ones after keep the period from the late one,
/// as tokio's `interval` with `MissedTickBehavior::Delay`).
#[derive(Debug, Clone)]
pub(crate) struct Pace {
    period: Duration,
    last: Option<Duration>,
}

impl Pace {
    /// The first tick returns at once.
    pub(crate) fn new(period: Duration) -> Self {
        Pace { period, last: None }
    }

    /// The first tick returns one period from now (the work was just done).
    pub(crate) fn after_now(clock: &dyn Clock, period: Duration) -> Self {
        Pace {
            period,
            last: Some(clock.monotonic()),
        }
    }

    /// Waits for the next tick.
    pub(crate) async fn tick(&mut self, clock: &dyn Clock) {
        let now = clock.monotonic();
        let at = self.last.map_or(now, |last| (last + self.period).max(now));
        clock.sleep_until(at).await;
        self.last = Some(at);
    }
}

/// The real clocks: [`SystemTime::now`] for the wall clock and, for
/// [`monotonic`](Clock::monotonic), a clock that **keeps counting while the host is suspended**
/// (`CLOCK_BOOTTIME` on Linux and Android; `std::time::Instant` elsewhere, which may stop during
/// a suspend).
///
/// Why: a member's lease deadline is measured on this clock, while the store expires the lease
/// on its own. A clock that stops while a laptop or VM is suspended (`CLOCK_MONOTONIC`, which
/// `Instant` reads on Linux) would let a member resume believing its lease still had time left
/// when the store had long expired it and another member owned its keys. With `CLOCK_BOOTTIME`
/// the suspended time counts, so a resumed member's grants are invalid at once
/// ([`Grant::is_valid`](crate::recipes::group::Grant::is_valid) reads the clock when called).
///
/// Sleeps use `tokio::time::sleep`, whose timer runs on `CLOCK_MONOTONIC`, which stops during a
/// suspend. So that a sleeper still wakes within [`SLEEP_SLICE`] of a resume, not a whole sleep
/// later, one thread per process (`headcount-resume`, started at the first sleep) compares the
/// two clocks every slice and wakes every sleeper when `CLOCK_BOOTTIME` gained on
/// `CLOCK_MONOTONIC`; each sleeper then reads the clock again. A sleep costs one timer, and
/// wakes before its deadline only after a suspend, whatever the number of sleepers; the thread
/// itself wakes four times a second for as long as the process runs. (Where that thread cannot
/// start, and on other systems, sleeps wake every slice to read the clock.) Under tokio's paused
/// test time this clock does not advance with tokio's; use a [`ManualClock`] there.
#[derive(Debug, Clone)]
pub struct SystemClock {
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    origin: Instant,
    #[cfg(any(target_os = "linux", target_os = "android"))]
    boot_origin: Duration,
}

/// The longest a [`SystemClock`] sleeper sleeps past its deadline after the host resumes from a
/// suspend: how often the process's resume watcher compares the clocks (or, without it, the
/// longest single timer a sleep waits on before reading the clock again).
pub const SLEEP_SLICE: Duration = Duration::from_millis(250);

/// The process's resume watcher: a thread that wakes every [`SLEEP_SLICE`] and tells the
/// [`SystemClock`] sleepers when the host was suspended meanwhile.
#[cfg(any(target_os = "linux", target_os = "android"))]
mod resume {
    use std::sync::OnceLock;
    use std::time::Duration;

    use tokio::sync::Notify;

    use super::SLEEP_SLICE;

    /// Woken (all waiters) after each suspend the watcher sees.
    static RESUMED: Notify = Notify::const_new();
    /// Whether the watcher thread started.
    static WATCHING: OnceLock<bool> = OnceLock::new();

    /// The notice of a resume, once the watcher runs (started here at the first call); `None`
    /// when its thread could not start.
    pub(super) fn notice() -> Option<&'static Notify> {
        let watching = *WATCHING.get_or_init(|| {
            std::thread::Builder::new()
                .name("headcount-resume".into())
                .spawn(watch)
                .is_ok()
        });
        watching.then_some(&RESUMED)
    }

    /// How far `CLOCK_BOOTTIME` is ahead of `CLOCK_MONOTONIC`: it grows only while the host is
    /// suspended (both run at the same rate otherwise, NTP's slewing included).
    fn gap() -> Duration {
        // Boot time first: a delay between the two reads can then only make the gap look
        // smaller, which `resumed` ignores, never larger (a false resume, and a high mark that
        // would hide the next real suspends).
        let boot = super::boot_time();
        boot.saturating_sub(super::clock_time(rustix::time::ClockId::Monotonic))
    }

    /// Whether the gap grew since `last` by more than the jitter of two clock reads (updating
    /// `last`): the host was suspended in between.
    pub(super) fn resumed(last: &mut Duration, gap: Duration) -> bool {
        let grew = gap > *last + Duration::from_millis(1);
        *last = (*last).max(gap);
        grew
    }

    fn watch() {
        let mut last = gap();
        loop {
            std::thread::sleep(SLEEP_SLICE);
            if resumed(&mut last, gap()) {
                RESUMED.notify_waiters();
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn only_a_gap_grown_past_the_jitter_is_a_resume() {
            let ms = Duration::from_millis;
            let mut last = ms(100);
            assert!(!resumed(&mut last, ms(100)), "no suspend");
            assert!(
                !resumed(&mut last, ms(100) + Duration::from_micros(300)),
                "two reads' jitter"
            );
            assert!(resumed(&mut last, ms(5_100)), "five seconds suspended");
            assert_eq!(last, ms(5_100));
            assert!(
                !resumed(&mut last, ms(5_100)),
                "the same suspend, seen once"
            );
            assert!(!resumed(&mut last, ms(4_000)), "a smaller gap never counts");
            assert_eq!(last, ms(5_100));
        }

        #[test]
        fn the_watcher_starts_once() {
            let first = notice().expect("the watcher thread starts");
            assert!(std::ptr::eq(first, notice().expect("still running")));
        }
    }
}

#[cfg(test)]
mod sleep_tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use tokio::sync::Notify;

    use super::sleep_until_on;

    /// A clock read that the test moves, as a suspend moves `CLOCK_BOOTTIME` while tokio's timer
    /// stands still.
    fn reader(ms: &AtomicU64) -> impl Fn() -> Duration + '_ {
        || Duration::from_millis(ms.load(Ordering::SeqCst))
    }

    /// Polls `sleeper` for 50 ms; fails with `why` if it ends meanwhile.
    async fn still_asleep_50ms(
        sleeper: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
        why: &str,
    ) {
        tokio::select! {
            () = sleeper => panic!("{why}"),
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }

    #[tokio::test]
    async fn a_resume_notice_ends_a_sleep_whose_deadline_passed_while_suspended() {
        let now = AtomicU64::new(0);
        let resumes = Notify::new();
        let start = Instant::now();
        let sleeper = sleep_until_on(reader(&now), Duration::from_secs(30), Some(&resumes));
        tokio::pin!(sleeper);
        still_asleep_50ms(sleeper.as_mut(), "returned before its deadline").await;
        // The host "was suspended" for 40 s: the clock passed the deadline, tokio's timer did not.
        now.store(40_000, Ordering::SeqCst);
        resumes.notify_waiters();
        tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .expect("the notice ends the sleep, not the 30 s timer");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_resume_notice_before_the_deadline_neither_ends_the_sleep_nor_loses_it() {
        let now = AtomicU64::new(0);
        let resumes = Notify::new();
        let sleeper = sleep_until_on(reader(&now), Duration::from_millis(300), Some(&resumes));
        tokio::pin!(sleeper);
        still_asleep_50ms(sleeper.as_mut(), "returned before its deadline").await;
        // A suspend too short to reach the deadline: the sleeper reads the clock and sleeps on.
        now.store(100, Ordering::SeqCst);
        resumes.notify_waiters();
        still_asleep_50ms(
            sleeper.as_mut(),
            "returned at the notice, 200 ms before its deadline",
        )
        .await;
        // Then the clock reaches the deadline with no further notice: the timer, now set for
        // the rest of the wait from the last read, ends it.
        now.store(300, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .expect("the sleep ends at its timer");
    }

    #[tokio::test]
    async fn without_a_watcher_a_sleep_reads_the_clock_every_slice() {
        let now = AtomicU64::new(0);
        let sleeper = sleep_until_on(reader(&now), Duration::from_secs(30), None);
        tokio::pin!(sleeper);
        still_asleep_50ms(sleeper.as_mut(), "returned before its deadline").await;
        now.store(40_000, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(2), sleeper)
            .await
            .expect("the next slice reads the clock");
    }
}

/// `CLOCK_BOOTTIME`: time since boot, suspended time included.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn boot_time() -> Duration {
    clock_time(rustix::time::ClockId::Boottime)
}

/// The time of the kernel clock `id`.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn clock_time(id: rustix::time::ClockId) -> Duration {
    let t = rustix::time::clock_gettime(id);
    // The kernel never reports negative times for its boot and monotonic clocks.
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

impl SystemClock {
    /// A system clock whose monotonic origin is now.
    pub fn new() -> Self {
        SystemClock {
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            origin: Instant::now(),
            #[cfg(any(target_os = "linux", target_os = "android"))]
            boot_origin: boot_time(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn monotonic(&self) -> Duration {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            boot_time().saturating_sub(self.boot_origin)
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            self.origin.elapsed()
        }
    }

    async fn sleep(&self, d: Duration) {
        let deadline = self.monotonic().saturating_add(d);
        self.sleep_until(deadline).await;
    }

    async fn sleep_until(&self, deadline: Duration) {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let resumes = resume::notice();
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let resumes = None;
        sleep_until_on(|| self.monotonic(), deadline, resumes).await;
    }
}

/// Waits until `read()` reaches `deadline`: one tokio timer for the whole wait, and the clock read
/// again whenever `resumes` is notified (a suspend that moved `read` on while tokio's timer
/// stood still); without `resumes`, the clock is read again every [`SLEEP_SLICE`].
async fn sleep_until_on(
    read: impl Fn() -> Duration,
    deadline: Duration,
    resumes: Option<&tokio::sync::Notify>,
) {
    loop {
        // The notice is taken before the clock is read, so a resume between the two still wakes
        // this sleeper.
        let resumed = resumes.map(tokio::sync::Notify::notified);
        let now = read();
        if now >= deadline {
            return;
        }
        match resumed {
            Some(resumed) => tokio::select! {
                () = tokio::time::sleep(deadline - now) => {}
                () = resumed => {}
            },
            None => tokio::time::sleep((deadline - now).min(SLEEP_SLICE)).await,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct ManualState {
    wall: SystemTime,
    mono: Duration,
}

/// A clock that moves only when told to. Clones share the same time.
///
/// [`advance`](ManualClock::advance) moves both clocks and wakes the sleepers whose deadline
/// passed; [`set_wall`](ManualClock::set_wall) steps only the wall clock, as NTP would.
#[derive(Debug, Clone)]
pub struct ManualClock {
    state: Arc<Mutex<ManualState>>,
    tick: Arc<watch::Sender<Duration>>,
}

impl ManualClock {
    /// A manual clock whose wall time starts at `wall` and monotonic time at zero.
    pub fn new(wall: SystemTime) -> Self {
        let (tick, _) = watch::channel(Duration::ZERO);
        ManualClock {
            state: Arc::new(Mutex::new(ManualState {
                wall,
                mono: Duration::ZERO,
            })),
            tick: Arc::new(tick),
        }
    }

    /// A manual clock starting at `secs` seconds after the Unix epoch.
    pub fn at_unix_secs(secs: u64) -> Self {
        Self::new(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ManualState> {
        // The state is two plain values; a panic elsewhere cannot leave them half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves both clocks forward by `d` and wakes sleepers whose deadline has passed.
    pub fn advance(&self, d: Duration) {
        let mono = {
            let mut s = self.lock();
            s.wall += d;
            s.mono += d;
            s.mono
        };
        self.tick.send_replace(mono);
    }

    /// Steps the wall clock to `wall` (forwards or backwards); the monotonic clock is untouched.
    pub fn set_wall(&self, wall: SystemTime) {
        self.lock().wall = wall;
    }
}

#[async_trait]
impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        self.lock().wall
    }

    fn monotonic(&self) -> Duration {
        self.lock().mono
    }

    async fn sleep(&self, d: Duration) {
        let deadline = self.monotonic() + d;
        self.sleep_until(deadline).await;
    }

    async fn sleep_until(&self, deadline: Duration) {
        let mut rx = self.tick.subscribe();
        // `wait_for` checks the current value first, so an advance between reading the deadline
        // and subscribing is not missed. The sender lives in `self`, so it cannot close under us.
        let _ = rx.wait_for(|mono| *mono >= deadline).await;
    }
}

/// A clock whose wall time is another clock's plus a fixed offset (either way), as on a machine
/// whose clock is off: the monotonic clock and sleeps are the inner clock's. Tests use it over a
/// shared [`ManualClock`] to give each peer a skewed view of one timeline.
#[derive(Debug, Clone)]
pub struct OffsetClock<C> {
    inner: C,
    ahead: Duration,
    behind: Duration,
}

impl<C: Clock> OffsetClock<C> {
    /// `inner`'s time shifted `ahead` into the future.
    pub fn ahead(inner: C, ahead: Duration) -> Self {
        OffsetClock {
            inner,
            ahead,
            behind: Duration::ZERO,
        }
    }

    /// `inner`'s time shifted `behind` into the past.
    pub fn behind(inner: C, behind: Duration) -> Self {
        OffsetClock {
            inner,
            ahead: Duration::ZERO,
            behind,
        }
    }
}

#[async_trait]
impl<C: Clock> Clock for OffsetClock<C> {
    fn now(&self) -> SystemTime {
        let now = self.inner.now();
        let t = now.checked_add(self.ahead).unwrap_or(now);
        t.checked_sub(self.behind).unwrap_or(SystemTime::UNIX_EPOCH)
    }

    fn monotonic(&self) -> Duration {
        self.inner.monotonic()
    }

    async fn sleep(&self, d: Duration) {
        self.inner.sleep(d).await;
    }

    async fn sleep_until(&self, deadline: Duration) {
        self.inner.sleep_until(deadline).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, SystemTime};

    use super::{
        boot_time, timeout, Clock, ManualClock, OffsetClock, Pace, SystemClock, SLEEP_SLICE,
    };

    #[tokio::test]
    async fn manual_clock_wakes_sleepers_only_when_advanced_past_deadline() {
        let clock = ManualClock::at_unix_secs(1_000);
        let sleeper = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.sleep(Duration::from_secs(10)).await })
        };
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(9));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_secs(1));
        tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .expect("sleeper woke")
            .expect("no panic");
        assert_eq!(clock.monotonic(), Duration::from_secs(10));
        assert_eq!(
            clock.now(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_010)
        );
    }

    #[tokio::test]
    async fn timeouts_run_on_the_clock_given() {
        let clock = ManualClock::at_unix_secs(1_000);
        let waiting = {
            let clock = clock.clone();
            tokio::spawn(async move {
                timeout(&clock, Duration::from_secs(5), std::future::pending::<()>()).await
            })
        };
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(4));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "no real time counts");
        clock.advance(Duration::from_secs(1));
        let out = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("timed out on the manual clock")
            .expect("no panic");
        assert_eq!(out, None);
        assert_eq!(
            timeout(&clock, Duration::from_secs(1), async { 7 }).await,
            Some(7)
        );
    }

    #[tokio::test]
    async fn a_pace_keeps_its_period_and_never_bursts() {
        let clock = ManualClock::at_unix_secs(1_000);
        let period = Duration::from_secs(10);
        let mut pace = Pace::new(period);
        pace.tick(&clock).await;
        assert_eq!(
            clock.monotonic(),
            Duration::ZERO,
            "the first tick is at once"
        );
        // Work of 4 s, then the tick waits out the rest of the period.
        clock.advance(Duration::from_secs(4));
        let ticking = {
            let clock = clock.clone();
            let mut pace = pace.clone();
            tokio::spawn(async move {
                pace.tick(&clock).await;
                pace
            })
        };
        tokio::task::yield_now().await;
        assert!(!ticking.is_finished());
        clock.advance(Duration::from_secs(6));
        let mut pace = ticking.await.expect("no panic");
        // Work of 25 s, longer than two periods: the next tick is at once, and the one after a
        // whole period after it, not at once again.
        clock.advance(Duration::from_secs(25));
        pace.tick(&clock).await;
        assert_eq!(clock.monotonic(), Duration::from_secs(35));
        let ticking = {
            let clock = clock.clone();
            tokio::spawn(async move { pace.tick(&clock).await })
        };
        tokio::task::yield_now().await;
        assert!(!ticking.is_finished(), "no burst after a late tick");
        clock.advance(period);
        ticking.await.expect("no panic");
        assert_eq!(
            Pace::after_now(&clock, period).last,
            Some(Duration::from_secs(45))
        );
    }

    #[test]
    fn offset_clocks_shift_only_the_wall_clock() {
        let clock = ManualClock::at_unix_secs(100);
        let fast = OffsetClock::ahead(clock.clone(), Duration::from_secs(5));
        let slow = OffsetClock::behind(clock.clone(), Duration::from_secs(7));
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            fast.now(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(106)
        );
        assert_eq!(slow.now(), SystemTime::UNIX_EPOCH + Duration::from_secs(94));
        assert_eq!(fast.monotonic(), clock.monotonic());
    }

    #[test]
    fn stepping_the_wall_clock_leaves_monotonic_alone() {
        let clock = ManualClock::at_unix_secs(500);
        clock.advance(Duration::from_secs(3));
        clock.set_wall(SystemTime::UNIX_EPOCH);
        assert_eq!(clock.now(), SystemTime::UNIX_EPOCH);
        assert_eq!(clock.monotonic(), Duration::from_secs(3));
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn system_clock_counts_boot_time() {
        // Read CLOCK_BOOTTIME around the clock's own reading: the clock is boot time since its
        // origin, so it lies between the two differences.
        let before = boot_time();
        let c = SystemClock::new();
        let after_new = boot_time();
        std::thread::sleep(Duration::from_millis(20));
        let start = boot_time();
        let m = c.monotonic();
        let end = boot_time();
        assert!(m >= start - after_new, "{m:?} < {:?}", start - after_new);
        assert!(m <= end - before, "{m:?} > {:?}", end - before);
        assert!(m >= Duration::from_millis(20));
    }

    #[tokio::test]
    async fn system_clock_sleeps_longer_than_a_slice() {
        let c = SystemClock::new();
        let t = Instant::now();
        c.sleep(SLEEP_SLICE + Duration::from_millis(30)).await;
        assert!(c.monotonic() >= SLEEP_SLICE + Duration::from_millis(30));
        assert!(t.elapsed() >= SLEEP_SLICE + Duration::from_millis(30));
    }

    #[tokio::test]
    async fn system_clock_sleeps() {
        let c = SystemClock::new();
        c.sleep(Duration::from_millis(5)).await;
        assert!(c.monotonic() >= Duration::from_millis(5));
    }
}
