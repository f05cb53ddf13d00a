//! The interval indexer recipe over the store under test, driven by manual clocks: time moves
//! only when a case advances it, and a case waits for the peers to finish what is due (their
//! [`IntervalPeer::idle_until`] is past the clock) instead of sleeping.
//!
//! Every case uses a 30-second interval, so the keys' TTLs (three intervals, on the store's real
//! clock) stay far above any backend's granularity (etcd's whole seconds) while the manual clocks
//! race through hours of interval time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use headcount::recipes::interval::{
    live_peers, IntervalConfig, IntervalIndexer, IntervalPeer, TaskGuard,
};
use headcount::recipes::{IntervalPhase, Pair};
use headcount::{Capabilities, Clock, DynStore, Error, ErrorKind, ManualClock, OffsetClock};
use tokio::time::Instant;

use super::expect_kind;
use crate::{ensure, ensure_eq, wait, CaseResult, Ctx, Failure, ResultExt};

/// The interval of every case.
pub const INTERVAL: Duration = Duration::from_secs(30);

/// How long (real time) peers may take to finish what is due after the clock moved.
const SETTLE_DEADLINE: Duration = Duration::from_secs(60);

/// The case's key space as (prefix, group): [`Ctx::prefix`] is `hct:{hex}:`, exactly the
/// key space of group `hex` under prefix `hct`, so cleanup finds every key the recipe writes.
fn space(ctx: &Ctx) -> Result<(String, String), Failure> {
    let group = ctx
        .prefix
        .strip_prefix("hct:{")
        .and_then(|r| r.strip_suffix("}:"))
        .ok_or_else(|| Failure::new(format!("unexpected case prefix {:?}", ctx.prefix)))?;
    Ok(("hct".to_owned(), group.to_owned()))
}

fn config(ctx: &Ctx, clock: Arc<dyn Clock>) -> Result<IntervalConfig, Failure> {
    let (prefix, group) = space(ctx)?;
    Ok(IntervalConfig::new(group, INTERVAL)
        .with_prefix(prefix)
        .with_clock(clock))
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A manual timeline shared by the peers of a case, with the peers it drives.
struct Sim {
    clock: ManualClock,
    /// Seconds since the Unix epoch at which the clock started.
    base: Duration,
    peers: BTreeMap<String, IntervalPeer>,
}

impl Sim {
    fn new(start_unix: f64) -> Self {
        let base = secs(start_unix);
        Sim {
            clock: ManualClock::new(std::time::UNIX_EPOCH + base),
            base,
            peers: BTreeMap::new(),
        }
    }

    /// The wall time, in seconds since the Unix epoch.
    fn now(&self) -> Duration {
        self.base + self.clock.monotonic()
    }

    async fn join(&mut self, store: &DynStore, name: &str, cfg: IntervalConfig) -> CaseResult {
        let peer = IntervalIndexer::join(store.clone(), cfg.with_member(name))
            .await
            .during(format!("join of {name}"))?;
        self.peers.insert(name.to_owned(), peer);
        self.run_pending().await
    }

    fn peer(&self, name: &str) -> Result<&IntervalPeer, Failure> {
        self.peers
            .get(name)
            .ok_or_else(|| Failure::new(format!("no peer {name}")))
    }

    /// Waits until every peer has done everything due at the current time.
    async fn run_pending(&self) -> CaseResult {
        let what = format!("every peer idle after the clock reached {:?}", self.now());
        let every = Duration::from_millis(1);
        wait::until(&what, SETTLE_DEADLINE, every, || async {
            let mono = self.clock.monotonic();
            let busy: Vec<&str> = self
                .peers
                .iter()
                .filter(|(_, p)| p.idle_until().is_none_or(|u| u <= mono))
                .map(|(n, _)| n.as_str())
                .collect();
            if busy.is_empty() {
                Ok(())
            } else {
                Err(format!("peers {busy:?} busy"))
            }
        })
        .await
        .map_err(Failure::new)
    }

    /// Advances the clock to `t` (seconds since the Unix epoch) in steps of at most `step`,
    /// letting the peers run what each step made due.
    async fn advance_to(&self, t: Duration, step: Duration) -> CaseResult {
        while self.now() < t {
            let d = (t - self.now()).min(step);
            self.clock.advance(d);
            self.run_pending().await?;
        }
        Ok(())
    }

    async fn stop(&mut self, name: &str) -> CaseResult {
        let peer = self
            .peers
            .remove(name)
            .ok_or_else(|| Failure::new(format!("no peer {name}")))?;
        peer.leave().await.during(format!("leave of {name}"))
    }
}

fn pair_of(peer: &IntervalPeer) -> Option<(u64, u64)> {
    peer.status().pair.map(|p| (p.index, p.replicas))
}

/// `incr_and_get` adds to one counter and reads another in one call, with `incr`'s semantics.
pub async fn incr_and_get_fused(ctx: &Ctx) -> CaseResult {
    let s = &ctx.store;
    let (a, b) = (ctx.key("iag:a"), ctx.key("iag:b"));
    let got = s.incr_and_get(&a, 1, None, &b).await.during("first call")?;
    ensure_eq!(got, (1, None), "incr_and_get on two absent keys");
    super::put(ctx, &b, "anything at all", None).await?;
    let got = s
        .incr_and_get(&a, 1, None, &b)
        .await
        .during("second call")?;
    ensure_eq!(
        got,
        (2, Some("anything at all".to_owned())),
        "incr_and_get with the read key present (its value comes back as stored)"
    );
    let got = s.incr_and_get(&a, 5, None, &b).await.during("by 5")?;
    ensure_eq!(got.0, 7, "incr_and_get by 5 after 2");
    ensure_eq!(
        s.get(&a).await.during("get")?,
        Some("7".to_owned()),
        "the counter reads back as decimal text"
    );

    // The TTL applies on creation only: later calls, with no TTL or a longer one, keep it.
    let (c, d) = (ctx.key("iag:c"), ctx.key("iag:d"));
    let ttl = Duration::from_secs(1);
    let effective = ctx.caps().effective_ttl(ttl);
    let sent = Instant::now();
    let got = s
        .incr_and_get(&c, 1, Some(ttl), &d)
        .await
        .during("with a TTL")?;
    let done = Instant::now();
    ensure_eq!(
        got,
        (1, None),
        "incr_and_get creating the counter with a TTL"
    );
    let got = s
        .incr_and_get(&c, 1, Some(Duration::from_secs(60)), &d)
        .await
        .during("with a 60 s TTL")?;
    ensure_eq!(
        got.0,
        2,
        "incr_and_get with a 60 s TTL on the existing counter"
    );
    // The provided (non-native) method adds more than one with a get + CAS loop, which re-applies
    // the TTL as its documentation says; only a native one promises "on creation only" for
    // `by > 1`, so the non-native path is held to what it promises with `by = 1`.
    let by = if ctx.caps().native_incr_and_get { 2 } else { 1 };
    let got = s
        .incr_and_get(&c, by, None, &d)
        .await
        .during(format!("by {by} without a TTL"))?;
    ensure_eq!(got.0, 2 + by, "incr_and_get by {by} without a TTL");
    ensure!(
        Instant::now() < sent + effective,
        "three incr_and_get calls took {:?}, longer than the {effective:?} TTL under test: the \
         store is too slow for this case",
        sent.elapsed()
    );
    // Had a later call refreshed the TTL, the counter would outlive the first one's deadline.
    super::expect_expiry(ctx, &c, &(2 + by).to_string(), sent, done, ttl).await?;

    // A foreign value at the counter is a typed error and stays as it was.
    let e = ctx.key("iag:e");
    super::put(ctx, &e, "abc", None).await?;
    expect_kind(
        "incr_and_get over \"abc\"",
        s.incr_and_get(&e, 1, None, &b).await,
        ErrorKind::ForeignValue,
    )?;
    ensure_eq!(
        s.get(&e).await.during("get")?,
        Some("abc".to_owned()),
        "the foreign value after a refused incr_and_get"
    );
    expect_kind(
        "incr_and_get with one key twice",
        s.incr_and_get(&a, 1, None, &a).await,
        ErrorKind::InvalidArgument,
    )?;
    expect_kind(
        "incr_and_get by 0",
        s.incr_and_get(&a, 0, None, &b).await,
        ErrorKind::InvalidArgument,
    )?;

    // Concurrent callers each get a distinct value.
    let f = ctx.key("iag:f");
    let results = super::concurrently(20, |_| {
        let (s, f, b) = (s.clone(), f.clone(), b.clone());
        async move {
            let mut out = Vec::new();
            for _ in 0..10 {
                out.push(
                    s.incr_and_get(&f, 1, None, &b)
                        .await
                        .during("concurrent incr_and_get")?
                        .0,
                );
            }
            Ok(out)
        }
    })
    .await?;
    let mut all: Vec<i64> = results.into_iter().flatten().collect();
    all.sort_unstable();
    ensure!(
        all == (1..=200).collect::<Vec<i64>>(),
        "20 x 10 concurrent incr_and_get did not return exactly 1..=200: {all:?}"
    );
    Ok(())
}

/// The table of the longer "Distributed Peer Indexing" article (A and B start in interval 1, C in
/// interval 3, 30 s interval).
///
/// The increments match the article's table exactly. The emitted pairs follow the first
/// "Distributed Peer Indexing" article's algorithm, which emits at interval `n` the index drawn
/// in `n - 1` with the count of `n - 1`: the longer article's table instead shows C emitting
/// `(1,2)` in the interval it starts and B emitting `(3,2)`, pairing an index of interval 3 with
/// the count of interval 2. That contradicts both the first article's caveat ("the first result
/// will become known between interval and interval x 2")
/// and the meaning of the pair (B cannot be third of two), so this case tests the algorithm:
/// interval 2: A (1,2), B (2,2); interval 3: C nothing yet, A (1,2), B (2,2); interval 4:
/// C (1,3), A (2,3), B (3,3).
pub async fn interval_article_timeline(ctx: &Ctx) -> CaseResult {
    let (prefix, group) = space(ctx)?;
    let counter = |n: u64| format!("{prefix}:{{{group}}}:interval:{n}");
    let mut sim = Sim::new(1.0);
    let clock: Arc<dyn Clock> = Arc::new(sim.clock.clone());
    // Skews order the ticks of each interval C, A, B, as in the article's interval 3.
    let cfg = |skew: f64| config(ctx, clock.clone()).map(|c| c.with_skew(secs(skew)));
    let step = secs(0.5);

    sim.join(&ctx.store, "A", cfg(5.0)?).await?;
    ensure_eq!(
        ctx.store.get(&counter(1)).await.during("get")?,
        Some("1".to_owned()),
        "A increments key:1 -> 1"
    );
    sim.advance_to(secs(2.0), step).await?;
    sim.join(&ctx.store, "B", cfg(10.0)?).await?;
    ensure_eq!(
        ctx.store.get(&counter(1)).await.during("get")?,
        Some("2".to_owned()),
        "B increments key:1 -> 2"
    );
    ensure_eq!(
        pair_of(sim.peer("A")?),
        None,
        "A in interval 1 (no previous value)"
    );
    ensure_eq!(
        pair_of(sim.peer("B")?),
        None,
        "B in interval 1 (no previous value)"
    );

    sim.advance_to(secs(35.0), step).await?;
    ensure_eq!(
        ctx.store.get(&counter(2)).await.during("get")?,
        Some("1".to_owned()),
        "A: key:2 -> 1"
    );
    ensure_eq!(
        pair_of(sim.peer("A")?),
        Some((1, 2)),
        "A emits (1,2) in interval 2"
    );
    sim.advance_to(secs(40.0), step).await?;
    ensure_eq!(
        pair_of(sim.peer("B")?),
        Some((2, 2)),
        "B emits (2,2) in interval 2"
    );
    // Both acknowledged: the transition lets them take tasks.
    sim.advance_to(secs(45.0), step).await?;
    ensure!(
        sim.peer("A")?.pair().is_some() && sim.peer("B")?.pair().is_some(),
        "A and B should own tasks once both acknowledged interval 2: {:?} {:?}",
        sim.peer("A")?.status(),
        sim.peer("B")?.status()
    );

    sim.advance_to(secs(61.0), step).await?;
    sim.join(&ctx.store, "C", cfg(2.0)?).await?;
    ensure_eq!(
        ctx.store.get(&counter(3)).await.during("get")?,
        Some("1".to_owned()),
        "C starts: key:3 -> 1"
    );
    ensure_eq!(pair_of(sim.peer("C")?), None, "C in its first interval");
    sim.advance_to(secs(65.0), step).await?;
    ensure_eq!(
        ctx.store.get(&counter(3)).await.during("get")?,
        Some("2".to_owned()),
        "A: key:3 -> 2"
    );
    ensure_eq!(pair_of(sim.peer("A")?), Some((1, 2)), "A in interval 3");
    sim.advance_to(secs(70.0), step).await?;
    ensure_eq!(
        ctx.store.get(&counter(3)).await.during("get")?,
        Some("3".to_owned()),
        "B: key:3 -> 3"
    );
    ensure_eq!(pair_of(sim.peer("B")?), Some((2, 2)), "B in interval 3");

    sim.advance_to(secs(100.0), step).await?;
    ensure_eq!(pair_of(sim.peer("C")?), Some((1, 3)), "C in interval 4");
    ensure_eq!(pair_of(sim.peer("A")?), Some((2, 3)), "A in interval 4");
    ensure_eq!(pair_of(sim.peer("B")?), Some((3, 3)), "B in interval 4");
    sim.advance_to(secs(105.0), step).await?;
    for name in ["A", "B", "C"] {
        let p = sim.peer(name)?;
        ensure_eq!(
            p.status().phase,
            IntervalPhase::Active,
            "{name}'s phase in interval 4"
        );
        ensure!(p.pair().is_some(), "{name} owns tasks in interval 4");
    }
    let live = sim.peer("A")?.live_peers().await.during("live_peers")?;
    let members: Vec<&str> = live.iter().map(|h| h.member.as_str()).collect();
    ensure_eq!(
        members,
        vec!["A", "B", "C"],
        "live peers from the heartbeats"
    );

    sim.stop("B").await?;
    let live = live_peers(&ctx.store, &prefix, &group)
        .await
        .during("live_peers")?;
    ensure_eq!(live.len(), 2, "live peers once B left: {live:?}");
    for name in ["A", "C"] {
        sim.stop(name).await?;
    }
    Ok(())
}

/// What [`converge_with_offsets`] and [`converge_with_schedule`] saw.
#[derive(Debug, Clone, Default)]
pub struct Convergence {
    /// How long after the last join the active pairs first formed a partition (distinct indices
    /// `1..=n`, replicas `n`), if they did within three intervals.
    pub after_last_join: Option<Duration>,
    /// Observations (per step, per task id of a sample) of a task owned by two peers at once.
    pub double_owned: u64,
    /// Pairs of one epoch, observed (active) at any time on two different peers, that own a
    /// common task: the counts behind them differed, so the interval's pairs were not disjoint.
    pub same_epoch_conflicts: Vec<(String, Pair, String, Pair)>,
    /// The active pairs at the end, by peer.
    pub last: Vec<Option<Pair>>,
}

/// One peer of [`converge_with_schedule`].
#[derive(Debug, Clone, Copy)]
pub struct Joiner {
    /// When it joins, after the start of the timeline (an interval boundary).
    pub at: Duration,
    /// How far its clock is ahead of the shared timeline.
    pub ahead: Duration,
    /// How far its clock is behind the shared timeline (used when `ahead` is zero).
    pub behind: Duration,
    /// Its skew; drawn at random below `7 I / 16` when `None`.
    pub skew: Option<Duration>,
}

/// Joins one peer per offset (its clock that far ahead of the shared timeline, its skew drawn at
/// random), a third of an interval apart, then watches every second for three intervals whether
/// their active pairs partition the tasks.
pub async fn converge_with_offsets(
    ctx: &Ctx,
    offsets: &[Duration],
    start_interval: u64,
) -> Result<Convergence, Failure> {
    let joiners: Vec<Joiner> = offsets
        .iter()
        .zip(0u32..)
        .map(|(&ahead, i)| Joiner {
            at: secs(1.0) + INTERVAL / 3 * i,
            ahead,
            behind: Duration::ZERO,
            skew: None,
        })
        .collect();
    converge_with_schedule(ctx, &joiners, start_interval).await
}

/// Whether two pairs own a common task (the ownership repeats every `replicas` product).
fn overlap(a: &Pair, b: &Pair) -> bool {
    let period = a
        .replicas
        .max(1)
        .saturating_mul(b.replicas.max(1))
        .min(1 << 20);
    (0..period).any(|t| a.owns(t) && b.owns(t))
}

/// Joins the peers of `joiners` (sorted by `at`) on a timeline starting at the boundary of
/// interval `start_interval + 1`, then watches every second for three intervals after the last
/// join whether their active pairs partition the tasks, and records double ownership at one
/// instant and between two pairs of one epoch.
pub async fn converge_with_schedule(
    ctx: &Ctx,
    joiners: &[Joiner],
    start_interval: u64,
) -> Result<Convergence, Failure> {
    let base = secs(30.0 * start_interval as f64);
    let mut sim = Sim::new(base.as_secs_f64());
    let step = secs(1.0);
    let mut last_join = sim.now();
    for (i, j) in joiners.iter().enumerate() {
        sim.advance_to(base + j.at, step).await?;
        let clock: Arc<dyn Clock> = if j.ahead > Duration::ZERO {
            Arc::new(OffsetClock::ahead(sim.clock.clone(), j.ahead))
        } else {
            Arc::new(OffsetClock::behind(sim.clock.clone(), j.behind))
        };
        let mut cfg = config(ctx, clock)?;
        if let Some(skew) = j.skew {
            cfg = cfg.with_skew(skew);
        }
        sim.join(&ctx.store, &format!("p{i}"), cfg).await?;
        last_join = sim.now();
    }
    let n = joiners.len() as u64;
    let mut seen = Convergence::default();
    // Every distinct active pair observed, by epoch, with its peer.
    let mut by_epoch: BTreeMap<u64, Vec<(String, Pair)>> = BTreeMap::new();
    while sim.now() < last_join + INTERVAL * 3 {
        sim.advance_to(sim.now() + step, step).await?;
        let pairs: Vec<Option<Pair>> = sim.peers.values().map(|p| p.pair()).collect();
        for (name, pair) in sim.peers.keys().zip(&pairs) {
            if let Some(p) = pair {
                let observed = by_epoch.entry(p.epoch).or_default();
                if !observed.iter().any(|(m, q)| m == name && q == p) {
                    observed.push((name.clone(), *p));
                }
            }
        }
        let indices: BTreeSet<u64> = pairs.iter().flatten().map(|p| p.index).collect();
        let partition = pairs
            .iter()
            .all(|p| p.is_some_and(|p| p.replicas == n && p.capacity == 1))
            && indices == (1..=n).collect();
        if partition && seen.after_last_join.is_none() {
            seen.after_last_join = Some(sim.now() - last_join);
        }
        for t in 0..(n * 4) {
            if pairs.iter().flatten().filter(|p| p.owns(t)).count() > 1 {
                seen.double_owned += 1;
            }
        }
        seen.last = pairs;
    }
    for observed in by_epoch.values() {
        for (i, (na, a)) in observed.iter().enumerate() {
            for (nb, b) in &observed[i + 1..] {
                if na != nb && overlap(a, b) {
                    seen.same_epoch_conflicts
                        .push((na.clone(), *a, nb.clone(), *b));
                }
            }
        }
    }
    let names: Vec<String> = sim.peers.keys().cloned().collect();
    for name in names {
        sim.stop(&name).await?;
    }
    Ok(seen)
}

/// 5 peers with clocks up to a quarter interval apart converge within two and a half intervals
/// of the last join, and no task is ever owned by two of them; the same with clocks behind and
/// joins in the last quarter of an interval; and the race of a peer whose clock is behind
/// joining, on its clock in the previous interval, after a correct peer read that interval's
/// count. (A join in the second half of an interval on the joiner's clock draws only at its next
/// tick, so its first pair comes up to two intervals after it joined, and the others activate
/// theirs once their own ticks of that interval, up to `7 I / 16` plus the clock offsets later,
/// and the acknowledgements are in.)
pub async fn interval_skewed_peers_converge(ctx: &Ctx) -> CaseResult {
    let offsets: Vec<Duration> = (0..5u32).map(|i| INTERVAL / 4 * i / 4).collect();
    let seen = converge_with_offsets(ctx, &offsets, 1000).await?;
    ensure!(
        seen.after_last_join.is_some_and(|d| d <= INTERVAL * 5 / 2),
        "5 peers with clock offsets {offsets:?} did not converge to indices 1..=5 with replicas 5 \
         within two and a half intervals of the last join: {seen:?}"
    );
    ensure_eq!(
        seen.double_owned,
        0,
        "tasks owned by two peers at once ({seen:?})"
    );

    // The race itself: X (correct clock, skew 2 s) and Y (correct, skew 10 s) from interval
    // 1101; J, 5 s behind, joins at 4 s into interval 1104, which is 29 s into interval 1103 on
    // its clock. X read the count of 1103 at 2 s; were J to add itself to it, Y would read 3 at
    // 10 s and take (2,3) while X keeps (1,2): task 4 would be X's and Y's.
    let race = [
        Joiner {
            at: secs(1.0),
            ahead: Duration::ZERO,
            behind: Duration::ZERO,
            skew: Some(secs(2.0)),
        },
        Joiner {
            at: secs(1.0),
            ahead: Duration::ZERO,
            behind: Duration::ZERO,
            skew: Some(secs(10.0)),
        },
        Joiner {
            at: INTERVAL * 3 + secs(4.0),
            ahead: Duration::ZERO,
            behind: secs(5.0),
            skew: Some(secs(6.0)),
        },
    ];
    let seen = converge_with_schedule(ctx, &race, 1100).await?;
    ensure!(
        seen.double_owned == 0 && seen.same_epoch_conflicts.is_empty(),
        "a peer 5 s behind joining 4 s into an interval (29 s into the previous one on its clock) \
         must not add itself to a count another peer already read: {seen:?}"
    );
    ensure!(
        seen.after_last_join.is_some_and(|d| d <= INTERVAL * 5 / 2),
        "3 peers did not converge within two and a half intervals of the late join: {seen:?}"
    );

    // Clocks behind, spread over a quarter interval, each peer joining in the last quarter of an
    // interval on its own clock (so, for the ones behind, early in the next one on the shared
    // timeline, after peers with small skews read the count).
    for (trial, start) in [(0u32, 1200u64), (1, 1300)] {
        let joiners: Vec<Joiner> = (0..5u32)
            .map(|i| {
                let k = (i + trial) % 5;
                let behind = INTERVAL / 16 * k;
                Joiner {
                    at: INTERVAL * i + secs(26.0) + secs(1.0) * ((i + 2 * trial) % 4) + behind,
                    ahead: Duration::ZERO,
                    behind,
                    skew: Some(secs(0.5) + secs(3.0) * ((k + 3) % 5)),
                }
            })
            .collect();
        let seen = converge_with_schedule(ctx, &joiners, start).await?;
        ensure!(
            seen.double_owned == 0 && seen.same_epoch_conflicts.is_empty(),
            "5 peers with clocks behind joining late in intervals ({joiners:?}): no task may be \
             owned by two peers at once, nor by two pairs of one epoch: {seen:?}"
        );
        ensure!(
            seen.after_last_join.is_some_and(|d| d <= INTERVAL * 5 / 2),
            "5 peers with clocks behind joining late in intervals did not converge within two and a \
             half intervals of the last join ({joiners:?}): {seen:?}"
        );
    }
    Ok(())
}

/// What [`scale_scenario`] counted, per task id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScaleReport {
    /// Task ids offered.
    pub offered: u64,
    /// Ids processed exactly once.
    pub once: u64,
    /// Ids processed more than once.
    pub duplicated: u64,
    /// Ids nobody processed in the step they were first offered (lost for a one-shot offer; a
    /// queue offers them again).
    pub missed_first_offer: u64,
    /// Ids never processed, though re-offered every step until the end.
    pub never: u64,
}

/// Scales 3 -> 5 -> 2 peers (30 s interval, steps of 1.5 s, 500 fresh task ids per step, so
/// 10,000 per interval), offering every pending id to every peer at every step; an id leaves
/// the queue once someone processed it. The 3 leave gracefully. Counts what happened to each id.
/// Every guard is dropped at once; see [`scale_scenario_holding`].
pub async fn scale_scenario(ctx: &Ctx, transition: bool) -> Result<ScaleReport, Failure> {
    scale_scenario_holding(ctx, transition, false).await
}

/// [`scale_scenario`], and with `hold` the guards of the even task ids are kept until the next
/// step, so transitions have in-flight tasks to drain; then it also fails if a peer holding a
/// guard across a step activates a pair that owns other tasks than the one it held before.
pub async fn scale_scenario_holding(
    ctx: &Ctx,
    transition: bool,
    hold: bool,
) -> Result<ScaleReport, Failure> {
    const PER_STEP: u64 = 500;
    let mut sim = Sim::new(30.0 * 2000.0);
    let step = secs(1.5);
    let mut join = |i: u64| -> Result<IntervalConfig, Failure> {
        let clock: Arc<dyn Clock> = Arc::new(sim.clock.clone());
        Ok(config(ctx, clock)?
            .with_skew(secs(1.5 * i as f64 + 0.75))
            .with_transition(transition))
    };
    let cfgs: Vec<IntervalConfig> = (0..5).map(&mut join).collect::<Result<_, _>>()?;
    let mut report = ScaleReport::default();
    let mut counts: BTreeMap<u64, u32> = BTreeMap::new();
    let mut pending: BTreeSet<u64> = BTreeSet::new();
    let mut next_id = 0u64;
    // Guards kept across a step, by peer.
    let mut held: BTreeMap<String, Vec<TaskGuard>> = BTreeMap::new();
    let mut drains_seen = 0u64;

    for (i, cfg) in cfgs.iter().take(3).enumerate() {
        sim.join(&ctx.store, &format!("p{i}"), cfg.clone()).await?;
    }
    // (intervals to run, change before them)
    let phases: [(u32, u8); 4] = [(4, 0), (4, 1), (5, 2), (3, 3)];
    for (intervals, change) in phases {
        // A leaving peer waits for its guards (on the manual clock): let them go first.
        held.clear();
        match change {
            1 => {
                for (i, cfg) in cfgs.iter().enumerate().skip(3) {
                    sim.join(&ctx.store, &format!("p{i}"), cfg.clone()).await?;
                }
            }
            2 => {
                for name in ["p0", "p2", "p4"] {
                    sim.stop(name).await?;
                }
            }
            _ => {}
        }
        let steps = intervals * 20;
        for _ in 0..steps {
            let before: BTreeMap<String, Option<Pair>> = sim
                .peers
                .iter()
                .map(|(name, p)| (name.clone(), p.pair()))
                .collect();
            sim.advance_to(sim.now() + step, step).await?;
            for (name, guards) in &held {
                if guards.is_empty() {
                    continue;
                }
                let Some(peer) = sim.peers.get(name) else {
                    continue;
                };
                let was = before.get(name).copied().flatten();
                let now = peer.pair();
                if let Some(now) = now {
                    ensure!(
                        was.is_some_and(|w| w.same_ownership(&now)),
                        "{name} activated {now:?} (before: {was:?}) while holding {} guards",
                        guards.len()
                    );
                }
                if was.is_some() && now.is_none() {
                    drains_seen += 1;
                }
            }
            held.clear();
            let fresh = change != 3;
            if fresh {
                for _ in 0..PER_STEP {
                    pending.insert(next_id);
                    next_id += 1;
                }
            }
            let mut done = Vec::new();
            for &id in &pending {
                let mut n = 0;
                for (name, peer) in &sim.peers {
                    if let Some(guard) = peer.begin(id) {
                        n += 1;
                        if hold && id % 2 == 0 {
                            held.entry(name.clone()).or_default().push(guard);
                        } else {
                            drop(guard);
                        }
                    }
                }
                if n > 0 {
                    *counts.entry(id).or_default() += n;
                    done.push(id);
                } else if fresh && id + PER_STEP >= next_id && !counts.contains_key(&id) {
                    report.missed_first_offer += 1;
                }
            }
            for id in done {
                pending.remove(&id);
            }
        }
    }
    held.clear();
    ensure!(
        !hold || drains_seen > 0,
        "no peer ever stopped owning tasks while holding a guard: the drain was not exercised"
    );
    report.offered = next_id;
    report.never = pending.len() as u64;
    report.once = counts.values().filter(|&&n| n == 1).count() as u64;
    report.duplicated = counts.values().filter(|&&n| n > 1).count() as u64;
    let names: Vec<String> = sim.peers.keys().cloned().collect();
    for name in names {
        sim.stop(&name).await?;
    }
    Ok(report)
}

/// Scaling 3 -> 5 -> 2 with the transition processes every task id exactly once, with half of
/// the tasks still in flight across a step, and no peer activates a new pair while one of its
/// tasks is in flight.
pub async fn interval_scale_exactly_once(ctx: &Ctx) -> CaseResult {
    let r = scale_scenario_holding(ctx, true, true).await?;
    ensure!(
        r.duplicated == 0 && r.never == 0 && r.once == r.offered,
        "with the transition, every task id must be processed exactly once: {r:?}"
    );
    Ok(())
}

/// A [`Store`] that fails every call with [`Error::Unavailable`] while `down` is set.
#[derive(Debug)]
struct Flaky {
    inner: DynStore,
    down: Arc<AtomicBool>,
}

impl Flaky {
    fn check(&self) -> headcount::Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::Unavailable {
                backend: "flaky",
                message: "planted outage".into(),
                source: None,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl headcount::backend::Backend for Flaky {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn incr(&self, key: &str, ttl: Option<Duration>) -> headcount::Result<i64> {
        self.check()?;
        self.inner.incr(key, ttl).await
    }
    async fn get(&self, key: &str) -> headcount::Result<Option<String>> {
        self.check()?;
        self.inner.get(key).await
    }
    async fn expire(&self, key: &str, ttl: Duration) -> headcount::Result<bool> {
        self.check()?;
        self.inner.expire(key, ttl).await
    }
    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> headcount::Result<bool> {
        self.check()?;
        self.inner.compare_and_set(key, expected, new, ttl).await
    }
    async fn delete(&self, key: &str) -> headcount::Result<bool> {
        self.check()?;
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> headcount::Result<Vec<(String, String)>> {
        self.check()?;
        self.inner.list(prefix).await
    }
    async fn list_with_ttl(
        &self,
        prefix: &str,
    ) -> headcount::Result<Vec<(String, String, Option<Duration>)>> {
        self.check()?;
        self.inner.list_with_ttl(prefix).await
    }
    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> headcount::Result<(i64, Option<String>)> {
        self.check()?;
        self.inner.incr_and_get(incr_key, by, ttl, get_key).await
    }
    /// Forwarded even while down: a subscription is no store call.
    async fn subscribe(&self, dir: &str) -> headcount::Result<headcount::notify::Notifications> {
        self.inner.subscribe(dir).await
    }
}

/// Bad intervals, groups and capacities are `InvalidArgument` at join; a foreign value at the
/// current interval's counter is `ForeignValue`.
pub async fn interval_bad_input_rejected(ctx: &Ctx) -> CaseResult {
    let (prefix, group) = space(ctx)?;
    let counter = |n: u64| format!("{prefix}:{{{group}}}:interval:{n}");
    let sim_clock = ManualClock::at_unix_secs(30 * 3000 + 1);
    let clock: Arc<dyn Clock> = Arc::new(sim_clock);
    let base = config(ctx, clock.clone())?;
    let mut zero = base.clone();
    zero.interval = Duration::ZERO;
    let mut bad_group = base.clone();
    bad_group.group = "not:valid".into();
    let sub_ms = {
        let mut c = base.clone();
        c.interval = Duration::from_micros(500);
        c
    };
    for (what, cfg) in [
        ("a zero interval", zero),
        ("a sub-millisecond interval", sub_ms),
        ("an invalid group", bad_group),
        ("capacity 0", base.clone().with_capacity(0)),
    ] {
        expect_kind(
            &format!("join with {what}"),
            IntervalIndexer::join(ctx.store.clone(), cfg)
                .await
                .map(|_| ()),
            ErrorKind::InvalidArgument,
        )?;
    }
    // Interval 3001 starts at 90,000 s; the clock is at 90,001.
    super::put(ctx, &counter(3001), "abc", Some(INTERVAL * 3)).await?;
    expect_kind(
        "join over a foreign counter",
        IntervalIndexer::join(ctx.store.clone(), base.clone())
            .await
            .map(|_| ()),
        ErrorKind::ForeignValue,
    )?;

    Ok(())
}

/// The store of two peers (`A` and `B`, from interval 3002) that fails on demand, with the
/// simulation that drives them; the clock is at 3002 + 10 s and both hold pairs.
async fn flaky_pair(ctx: &Ctx) -> Result<(Sim, Arc<AtomicBool>, String), Failure> {
    let (prefix, group) = space(ctx)?;
    let sim_clock = ManualClock::at_unix_secs(30 * 3000 + 1);
    let clock: Arc<dyn Clock> = Arc::new(sim_clock.clone());
    let base = config(ctx, clock)?;
    let down = Arc::new(AtomicBool::new(false));
    let flaky: DynStore = Arc::new(Flaky {
        inner: ctx.store.clone(),
        down: down.clone(),
    });
    let mut sim = Sim {
        clock: sim_clock,
        base: secs(30.0 * 3000.0 + 1.0),
        peers: BTreeMap::new(),
    };
    let step = secs(1.0);
    sim.advance_to(secs(30.0 * 3001.0 + 1.0), step).await?;
    sim.join(&flaky, "A", base.clone().with_skew(secs(2.0)))
        .await?;
    sim.join(&flaky, "B", base.clone().with_skew(secs(4.0)))
        .await?;
    sim.advance_to(secs(30.0 * 3002.0 + 10.0), step).await?;
    Ok((sim, down, format!("{prefix}:{{{group}}}:interval:")))
}

/// Through a store outage a peer keeps its last pair, still processes its tasks until the pair
/// expires a quarter interval after the failed tick, reports the fault, stops owning once the
/// pair expired, and owns tasks again when the store is back.
pub async fn interval_outage_keeps_then_expires_pair(ctx: &Ctx) -> CaseResult {
    let (mut sim, down, _) = flaky_pair(ctx).await?;
    let step = secs(1.0);
    let before = sim.peer("A")?.status().pair;
    ensure!(
        before.is_some() && sim.peer("A")?.pair().is_some(),
        "A should own tasks in interval 3003: {:?}",
        sim.peer("A")?.status()
    );

    // The store goes down across A's tick of interval 3004.
    down.store(true, Ordering::SeqCst);
    sim.advance_to(secs(30.0 * 3003.0 + 3.0), step).await?;
    let st = sim.peer("A")?.status();
    ensure_eq!(
        st.phase,
        IntervalPhase::Faulted,
        "A's phase after a failed tick"
    );
    ensure_eq!(st.pair, before, "A keeps its last pair through the outage");
    // ...and still works under it until it expires (a quarter interval after the failed tick).
    let a = sim.peer("A")?;
    ensure_eq!(
        a.pair(),
        before,
        "A's effective pair right after the failed tick, before it expires"
    );
    let owned = before.and_then(|p| (0..p.replicas).find(|&t| p.owns(t)));
    ensure!(
        owned.is_some_and(|t| a.should_process(t) && a.begin(t).is_some()),
        "A should still process task {owned:?} of its pair {before:?} right after the failed tick"
    );
    ensure!(
        st.last_error
            .as_deref()
            .is_some_and(|e| e.contains("planted outage")),
        "A reports the fault: {st:?}"
    );
    // The pair expires on A's own clock a quarter interval after the tick that failed.
    sim.advance_to(secs(30.0 * 3003.0 + 2.0 + 7.6), step)
        .await?;
    ensure!(
        sim.peer("A")?.pair().is_none(),
        "A must stop owning tasks once its unconfirmed pair expired: {:?}",
        sim.peer("A")?.pair()
    );
    down.store(false, Ordering::SeqCst);
    // Interval 3005: a fresh draw; interval 3006: pairs again.
    sim.advance_to(secs(30.0 * 3005.0 + 10.0), step).await?;
    for name in ["A", "B"] {
        let p = sim.peer(name)?;
        ensure!(
            p.pair().is_some_and(|p| p.replicas == 2),
            "{name} should own tasks again after the outage: {:?}",
            p.status()
        );
    }

    for name in ["A", "B"] {
        sim.stop(name).await?;
    }
    Ok(())
}

/// A foreign value at the previous interval's counter during a tick: no pair emitted, the
/// fault reported.
pub async fn interval_foreign_previous_count_reported(ctx: &Ctx) -> CaseResult {
    let (mut sim, _, counters) = flaky_pair(ctx).await?;
    let step = secs(1.0);
    let counter = |n: u64| format!("{counters}{n}");
    // Interval 3006: both peers hold pairs, and its counter is written.
    sim.advance_to(secs(30.0 * 3005.0 + 10.0), step).await?;
    // A foreign value at the previous interval's counter: no pair emitted, the fault reported.
    let key = counter(3006);
    let current = ctx.store.get(&key).await.during("get")?;
    if let Some(cur) = current {
        ctx.store
            .compare_and_set(&key, Some(&cur), "xyz", Some(INTERVAL * 3))
            .await
            .during("planting xyz")?;
    }
    sim.advance_to(secs(30.0 * 3006.0 + 3.0), step).await?;
    let st = sim.peer("A")?.status();
    ensure!(
        st.phase == IntervalPhase::Faulted
            && st.last_error.as_deref().is_some_and(|e| e.contains("xyz"))
            && sim.peer("A")?.pair().is_none(),
        "a foreign previous count must be reported and emit nothing: {st:?}"
    );
    for name in ["A", "B"] {
        sim.stop(name).await?;
    }
    Ok(())
}

/// A peer with capacity 2 owns twice the share of a peer with capacity 1.
pub async fn interval_weighted_capacity(ctx: &Ctx) -> CaseResult {
    let mut sim = Sim::new(30.0 * 4000.0 + 1.0);
    let clock: Arc<dyn Clock> = Arc::new(sim.clock.clone());
    let cfg = config(ctx, clock)?;
    sim.join(
        &ctx.store,
        "big",
        cfg.clone().with_skew(secs(1.0)).with_capacity(2),
    )
    .await?;
    sim.join(&ctx.store, "small", cfg.clone().with_skew(secs(2.0)))
        .await?;
    sim.advance_to(secs(30.0 * 4001.0 + 10.0), secs(1.0))
        .await?;
    let big = sim.peer("big")?;
    let small = sim.peer("small")?;
    let (mut nb, mut ns) = (0, 0);
    for t in 0..3000u64 {
        let (b, s) = (big.should_process(t), small.should_process(t));
        ensure!(b != s, "task {t}: owned by big {b}, small {s}");
        nb += u32::from(b);
        ns += u32::from(s);
    }
    ensure_eq!((nb, ns), (2000, 1000), "tasks owned by capacities 2 and 1");
    ensure_eq!(
        big.pair().map(|p| (p.index, p.replicas, p.capacity)),
        Some((1, 3, 2)),
        "big's pair"
    );
    for name in ["big", "small"] {
        sim.stop(name).await?;
    }
    Ok(())
}
