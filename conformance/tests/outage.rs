//! A store that goes away and comes back with its data, on real servers: a Redis with its
//! append-only file and a PostgreSQL, each killed with SIGKILL and started again on the same data
//! while three members of a group with 64 declared partitions keep running. Read from the
//! members' own state every few milliseconds throughout: how many times a partition changed
//! owner, the longest a partition had no owner, and whether two members ever granted one.
#![cfg(any(feature = "redis", feature = "postgres"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use headcount::recipes::group::{Group, GroupConfig, GroupPhase, Member};
use headcount_conformance::ServerControl;
use headcount_harness::{skip_unless_required, ServerKind, Unavailable};

/// The partitions the members share.
const PARTITIONS: u32 = 64;

/// What the sampler saw.
#[derive(Debug, Default)]
struct Observed {
    /// Times a partition's owner became another member than its last one.
    moves: usize,
    /// The longest a partition had no owner.
    longest_unowned: Duration,
    /// Partitions two members granted at one reading (confirmed by a second reading).
    overlaps: Vec<String>,
    /// Times a member was seen in another phase than active.
    not_active: usize,
    /// How long the server was down.
    down: Duration,
    /// The highest token any member granted before the outage, and the lowest after it.
    tokens: (u64, u64),
}

/// Samples every 5 ms until `stop`.
async fn sample(members: Arc<Vec<Member>>, stop: Arc<tokio::sync::Notify>) -> Observed {
    let mut seen = Observed::default();
    let mut last: HashMap<u32, usize> = HashMap::new();
    let mut unowned_since: HashMap<u32, Instant> = HashMap::new();
    loop {
        let now = Instant::now();
        for m in members.iter() {
            if m.assignment().phase != GroupPhase::Active {
                seen.not_active += 1;
            }
        }
        for p in 0..PARTITIONS {
            let key = p.to_string();
            let owners: Vec<usize> = (0..members.len())
                .filter(|&i| members[i].would_grant(&key).is_some())
                .collect();
            match owners.as_slice() {
                [] => {
                    unowned_since.entry(p).or_insert(now);
                }
                [one] => {
                    if let Some(since) = unowned_since.remove(&p) {
                        seen.longest_unowned = seen.longest_unowned.max(now - since);
                    }
                    if last.insert(p, *one).is_some_and(|before| before != *one) {
                        seen.moves += 1;
                    }
                }
                many => {
                    let again: Vec<usize> = many
                        .iter()
                        .copied()
                        .filter(|&i| members[i].would_grant(&key).is_some())
                        .collect();
                    if again == many {
                        seen.overlaps
                            .push(format!("partition {p} granted by {many:?}"));
                    }
                }
            }
        }
        tokio::select! {
            () = stop.notified() => return seen,
            () = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
}

/// The tokens `members` would grant for the partitions now.
fn tokens(members: &[Member]) -> impl Iterator<Item = u64> + '_ {
    (0..PARTITIONS).flat_map(move |p| {
        members
            .iter()
            .filter_map(move |m| m.would_grant(p.to_string()).map(|t| t.get()))
    })
}

fn highest_token(members: &[Member]) -> u64 {
    tokens(members).max().unwrap()
}

fn lowest_token(members: &[Member]) -> u64 {
    tokens(members).min().unwrap()
}

/// Waits until all `members` are active under one view naming them all.
async fn converged(members: &[Member], within: Duration) {
    let end = Instant::now() + within;
    loop {
        let a: Vec<_> = members.iter().map(Member::assignment).collect();
        if a.iter().all(|x| {
            x.phase == GroupPhase::Active && x.epoch == a[0].epoch && x.replicas as usize == a.len()
        }) {
            return;
        }
        assert!(Instant::now() < end, "never converged: {a:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three members on `url`, converged; the server killed, started again `down` later; the members
/// sampled from before the kill until `after` past the restart.
async fn through_an_outage(
    url: &str,
    control: &dyn ServerControl,
    ttl: Duration,
    down: Duration,
) -> Observed {
    let mut members = Vec::new();
    for id in ["a", "b", "c"] {
        let store = headcount::connect(url).await.unwrap();
        let config = GroupConfig::new("outage", ttl)
            .with_member(id)
            .with_partitions(PARTITIONS);
        members.push(Group::join(store, config).await.unwrap());
    }
    converged(&members, ttl * 4).await;
    let before = highest_token(&members);
    let members = Arc::new(members);
    let stop = Arc::new(tokio::sync::Notify::new());
    let sampler = tokio::spawn(sample(members.clone(), stop.clone()));
    tokio::time::sleep(ttl / 2).await;
    control.kill().await.unwrap();
    let killed = Instant::now();
    tokio::time::sleep(down.saturating_sub(killed.elapsed())).await;
    control.start().await.unwrap();
    let down = killed.elapsed();
    converged(&members, ttl * 6).await;
    // Long enough for a member that would publish a view without the others to do so.
    tokio::time::sleep(ttl).await;
    stop.notify_one();
    let mut seen = sampler.await.unwrap();
    seen.down = down;
    seen.tokens = (before, lowest_token(&members));
    for m in members.iter() {
        m.clone().leave().await.unwrap();
    }
    eprintln!("{seen:?}");
    seen
}

/// Nothing moved, no partition was granted twice, none was without an owner longer than the
/// outage plus a heartbeat, and every token after the outage is above every token before it.
fn rode_through(seen: &Observed, ttl: Duration) {
    assert!(seen.overlaps.is_empty(), "{:?}", seen.overlaps);
    assert_eq!(seen.moves, 0, "{seen:?}");
    assert!(seen.longest_unowned <= seen.down + ttl / 3, "{seen:?}");
    assert!(
        seen.tokens.1 > seen.tokens.0,
        "tokens after the outage come after: {seen:?}"
    );
}

/// The append-only file on every write: a Redis restarted with these keeps its data.
#[cfg(feature = "redis")]
const AOF: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

/// [`through_an_outage`] on a Redis of its own started with `args` (the harness's defaults keep
/// no data across a restart), or `None` (with a SKIP line) when none is installed.
#[cfg(feature = "redis")]
async fn redis_outage(
    args: &'static [&'static str],
    ttl: Duration,
    down: Duration,
) -> Option<Observed> {
    let started =
        tokio::task::spawn_blocking(move || headcount_harness::KvStore::redis_with(None, args))
            .await
            .unwrap();
    let server = Arc::new(skip_unless_required(ServerKind::Redis, "outage", started)?);
    let control = headcount_harness::KvControl::new(server.clone(), Duration::from_secs(5));
    Some(through_an_outage(&server.url(), &control, ttl, down).await)
}

/// Redis down ten seconds (past every lease, TTL 3 s) and back with its data: the members of
/// the last view take their own slots back, and no partition moves.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_past_the_lease_comes_back_and_no_partition_moves() {
    let ttl = Duration::from_secs(3);
    let Some(seen) = redis_outage(AOF, ttl, Duration::from_secs(10)).await else {
        return;
    };
    rode_through(&seen, ttl);
}

/// Redis down for less than the lease minus a heartbeat (TTL 6 s, down 3 s): no lease lapses,
/// so no member stops working and no partition is ever without an owner.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_for_less_than_a_lease_lapses_nothing() {
    let Some(seen) = redis_outage(AOF, Duration::from_secs(6), Duration::from_secs(3)).await else {
        return;
    };
    assert!(seen.overlaps.is_empty(), "{:?}", seen.overlaps);
    assert_eq!((seen.moves, seen.not_active), (0, 0), "{seen:?}");
    assert_eq!(seen.longest_unowned, Duration::ZERO, "{seen:?}");
}

/// Redis down past the lease and back **empty** (no persistence: the slots, the view and its
/// epochs are gone): the members remember the view they worked under and publish its slots and
/// assignment again above the epochs they saw, so no partition moves and every token after the
/// outage is above every token before it.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_back_empty_moves_nothing_and_tokens_go_on_rising() {
    let Some(seen) = redis_outage(&[], Duration::from_secs(3), Duration::from_secs(5)).await else {
        return;
    };
    assert!(seen.overlaps.is_empty(), "{:?}", seen.overlaps);
    assert_eq!(seen.moves, 0, "{seen:?}");
    assert!(
        seen.tokens.1 > seen.tokens.0,
        "tokens after the outage come after: {seen:?}"
    );
}

/// PostgreSQL down ten seconds and back with its data: no partition moves.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_past_the_lease_comes_back_and_no_partition_moves() {
    let started = tokio::task::spawn_blocking(|| headcount_harness::PgServer::start_new(None))
        .await
        .unwrap_or_else(|e| Err(Unavailable::Failed(e.to_string())));
    let Some(server) = skip_unless_required(ServerKind::Postgres, "outage", started) else {
        return;
    };
    let server = Arc::new(server);
    let control = headcount_harness::PgControl::new(server.clone(), Duration::from_secs(5));
    let down = Duration::from_secs(10);
    let ttl = Duration::from_secs(3);
    let seen = through_an_outage(&server.url(), &control, ttl, down).await;
    rode_through(&seen, ttl);
}
