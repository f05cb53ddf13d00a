//! Redis behind Sentinel (`redis+sentinel://`): every conformance case against a primary with one
//! replica and three Sentinels (`HEADCOUNT_TEST_REDIS_SENTINEL_URL`, or `redis-server` and
//! `redis-server --sentinel` processes the harness starts); a group that survives a Sentinel
//! failover; and bad URLs (an unknown master name, Sentinels that do not answer) failing with a
//! typed error within the deadline.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use headcount::recipes::group::{Group, GroupConfig, GroupPhase, Member};
use headcount::ErrorKind;
use headcount_harness::{skip_unless_required, KvStore, ServerKind, Unavailable, SENTINEL_MASTER};

headcount_harness::conformance_tests!(
    redis_sentinel,
    headcount_harness::ServerKind::RedisSentinel,
    sentinel
);

/// The per-operation deadline of the stores of these tests.
const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// How long after `SENTINEL FAILOVER` every member must be active again under one view.
const FAILOVER_BOUND: Duration = Duration::from_secs(20);

/// A primary, a replica and three Sentinels for one test alone.
async fn sentinels(label: &str) -> Option<Arc<KvStore>> {
    let started = tokio::task::spawn_blocking(|| KvStore::redis_sentinel(Some(OP_TIMEOUT)))
        .await
        .unwrap_or_else(|e| Err(Unavailable::Failed(format!("starting Sentinel: {e}"))));
    skip_unless_required(ServerKind::RedisSentinel, label, started).map(Arc::new)
}

/// The primary's port as the Sentinel at `port` names it.
async fn primary_port(port: u16) -> redis::RedisResult<u16> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let (_, primary): (String, u16) = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(SENTINEL_MASTER)
        .query_async(&mut conn)
        .await?;
    Ok(primary)
}

/// Waits until the first Sentinel names the replica as the primary, at most [`FAILOVER_BOUND`]
/// after `started`; returns the time since `started`.
async fn wait_switched(servers: &KvStore, started: Instant) -> Duration {
    let sentinel = servers.sentinel_ports()[0];
    loop {
        if primary_port(sentinel).await.ok() == Some(servers.servers[1].port) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < FAILOVER_BOUND,
            "the Sentinels did not switch the master within {FAILOVER_BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether every member is active under one epoch with `n` live slots.
fn converged(members: &[Member], n: u32) -> bool {
    let all: Vec<_> = members.iter().map(Member::assignment).collect();
    all.iter()
        .all(|a| a.phase == GroupPhase::Active && a.epoch == all[0].epoch && a.replicas == n)
}

async fn wait_converged(members: &[Member], n: u32, within: Duration, what: &str) -> Duration {
    let start = Instant::now();
    while !converged(members, n) {
        let all: Vec<_> = members.iter().map(Member::assignment).collect();
        assert!(
            start.elapsed() < within,
            "{what}: not converged within {within:?}: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

/// How the primary is replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failover {
    /// `SENTINEL FAILOVER`: the primary lives on as a replica of the new one.
    Command,
    /// SIGKILL of the primary: the Sentinels agree it is down (quorum 2, 500 ms) and elect one
    /// of them to promote the replica.
    Kill,
}

/// `SENTINEL FAILOVER` under a group; see [`survives`].
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_survives_a_failover() {
    survives(
        "redis_sentinel::group_survives_a_failover",
        Failover::Command,
    )
    .await;
}

/// The primary killed under a group; see [`survives`].
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_survives_the_primary_killed() {
    survives(
        "redis_sentinel::group_survives_the_primary_killed",
        Failover::Kill,
    )
    .await;
}

/// Three members, each over its own `redis+sentinel://` store, converge; the replica is promoted
/// (`how`); within [`FAILOVER_BOUND`] every member is active under one view again, and stays so
/// for two more TTLs (its renewals, which write, reach the new primary: a replica refuses them).
async fn survives(label: &str, how: Failover) {
    let Some(servers) = sentinels(label).await else {
        return;
    };
    let url = servers.url();
    let ttl = Duration::from_secs(2);
    let mut members = Vec::new();
    for i in 0..3 {
        let store = headcount::connect(&url).await.unwrap();
        let config = GroupConfig::new("failover", ttl).with_member(format!("m{i}"));
        members.push(Group::join(store, config).await.unwrap());
    }
    wait_converged(&members, 3, Duration::from_secs(30), "before the failover").await;

    let sentinel_ports = servers.sentinel_ports();
    let before = primary_port(sentinel_ports[0]).await.unwrap();
    assert_eq!(before, servers.servers[0].port);
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", sentinel_ports[0])).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let started = Instant::now();
    match how {
        Failover::Command => redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(SENTINEL_MASTER)
            .query_async::<()>(&mut conn)
            .await
            .unwrap(),
        Failover::Kill => {
            let s = Arc::clone(&servers);
            tokio::task::spawn_blocking(move || s.servers[0].kill())
                .await
                .unwrap()
                .unwrap();
        }
    }
    // The Sentinels name the replica...
    let switched = wait_switched(&servers, started).await;
    // ... and the members, having renewed on the new primary, are active under one view.
    let remaining = FAILOVER_BOUND.saturating_sub(started.elapsed());
    wait_converged(&members, 3, remaining, "after the failover").await;
    let active = started.elapsed();
    tokio::time::sleep(ttl * 2).await;
    wait_converged(&members, 3, remaining, "two TTLs after the failover").await;
    let write = headcount::connect(&url).await.unwrap();
    write.incr("hc:{failover}:after", None).await.unwrap();
    eprintln!(
        "{label}: Sentinels switched after {switched:?}, members active under one view \
         {active:?} after the failover began ({how:?}), and still two TTLs later"
    );
    for m in members {
        m.leave().await.unwrap();
    }
}

/// What the sampler saw: overlaps (a key granted by two members at one instant) and, per key
/// and token, the members that granted it.
#[derive(Default)]
struct Observed {
    overlaps: Vec<String>,
    holders: std::collections::BTreeMap<(u32, u64), std::collections::BTreeSet<String>>,
    rounds: u64,
}

/// The members of a run by name, shared with the sampler.
type Members = Arc<std::sync::Mutex<Vec<(String, Arc<Member>)>>>;

/// Reads, again and again, which member would grant each of `keys` partitions and with which
/// token, from the members' own state ([`Member::would_grant`]), until `stop`. Two members
/// granting one key are checked again in the order A, B, A, B: an overlap is recorded only when
/// both still grant it with the same tokens, so both held it at A's second reading (a hand-off
/// that completed between two readings is not one).
async fn sample(members: Members, keys: u32, stop: Arc<tokio::sync::Notify>) -> Observed {
    let mut seen = Observed::default();
    loop {
        let now: Vec<(String, Arc<Member>)> = members.lock().unwrap().clone();
        for key in 0..keys {
            let name = key.to_string();
            let first: Vec<(usize, u64)> = now
                .iter()
                .enumerate()
                .filter_map(|(i, (_, m))| m.would_grant(&name).map(|t| (i, t.get())))
                .collect();
            for (i, token) in &first {
                seen.holders
                    .entry((key, *token))
                    .or_default()
                    .insert(now[*i].0.clone());
            }
            if first.len() > 1 {
                let again: Vec<(usize, u64)> = first
                    .iter()
                    .filter_map(|(i, _)| now[*i].1.would_grant(&name).map(|t| (*i, t.get())))
                    .collect();
                if again == first {
                    let who: Vec<String> = first
                        .iter()
                        .map(|(i, t)| {
                            format!("{} (token {t}, {:?})", now[*i].0, now[*i].1.assignment())
                        })
                        .collect();
                    seen.overlaps
                        .push(format!("partition {key} granted by {}", who.join(" and ")));
                }
            }
        }
        seen.rounds += 1;
        tokio::select! {
            () = stop.notified() => return seen,
            () = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
}

/// Joins member `name` over its own store and adds it to `members`.
async fn join_partitioned(url: &str, name: &str, ttl: Duration, members: &Members) {
    let store = headcount::connect(url).await.unwrap();
    let config = GroupConfig::new("split", ttl)
        .with_member(name)
        .with_partitions(PARTITIONS);
    let member = loop {
        // A join may meet the failover (a retryable error): a member retries as a supervisor
        // would restart it.
        match Group::join(store.clone(), config.clone()).await {
            Ok(m) => break m,
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{name}: {e}"),
        }
    };
    members
        .lock()
        .unwrap()
        .push((name.to_owned(), Arc::new(member)));
}

/// The partitions of [`no_two_owners_across_a_failover`].
const PARTITIONS: u32 = 12;

/// Members a, b and c own 12 partitions; `SENTINEL FAILOVER` promotes the replica while d
/// joins, and e joins a TTL and a half after the Sentinels switched (when renewals that went on
/// reaching the old primary would have let every lease lapse on the new one, so e would find
/// the group empty and take all 12). From the members' own state, read every few milliseconds
/// throughout: no partition is granted by two members at one instant, no token is granted by
/// two members, and all five end active under one view.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_two_owners_across_a_failover() {
    let label = "redis_sentinel::no_two_owners_across_a_failover";
    let Some(servers) = sentinels(label).await else {
        return;
    };
    // Every write waits for the replica: a renewal or view the promoted replica lacks would let
    // a newcomer take a key its owner still believes valid (asynchronous replication's window).
    let url = servers.url();
    let url = format!(
        "{url}{}wait_replicas=1",
        if url.contains('?') { '&' } else { '?' }
    );
    let ttl = Duration::from_secs(3);
    let members: Members = Arc::default();
    for name in ["a", "b", "c"] {
        join_partitioned(&url, name, ttl, &members).await;
    }
    let stop = Arc::new(tokio::sync::Notify::new());
    let sampler = tokio::spawn(sample(Arc::clone(&members), PARTITIONS, Arc::clone(&stop)));
    let wait = |n: u32, what: &'static str| {
        let members = Arc::clone(&members);
        async move {
            let start = Instant::now();
            loop {
                let now: Vec<_> = members
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(_, m)| m.assignment())
                    .collect();
                if now.len() == n as usize
                    && now.iter().all(|a| {
                        a.phase == GroupPhase::Active && a.epoch == now[0].epoch && a.replicas == n
                    })
                {
                    return start.elapsed();
                }
                assert!(
                    start.elapsed() < FAILOVER_BOUND + ttl * 2,
                    "{what}: not converged: {now:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait(3, "before the failover").await;

    let sentinel_ports = servers.sentinel_ports();
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", sentinel_ports[0])).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let started = Instant::now();
    redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SENTINEL_MASTER)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let during = {
        let (url, members) = (url.clone(), Arc::clone(&members));
        tokio::spawn(async move { join_partitioned(&url, "d", ttl, &members).await })
    };
    let switched = wait_switched(&servers, started).await;
    tokio::time::sleep(ttl + ttl / 2).await;
    join_partitioned(&url, "e", ttl, &members).await;
    during.await.unwrap();
    let took = wait(5, "after the failover").await;
    // Two more TTLs under watch: a member still renewing on the old primary would lapse on the
    // new one in that time.
    tokio::time::sleep(ttl * 2).await;
    wait(5, "two TTLs after the failover").await;
    stop.notify_one();
    let seen = sampler.await.unwrap();
    assert!(seen.rounds > 100, "the sampler ran {} rounds", seen.rounds);
    assert!(
        seen.overlaps.is_empty(),
        "{} overlaps, the first: {:#?}",
        seen.overlaps.len(),
        &seen.overlaps[..seen.overlaps.len().min(5)]
    );
    let shared: Vec<_> = seen
        .holders
        .iter()
        .filter(|(_, who)| who.len() > 1)
        .collect();
    assert!(
        shared.is_empty(),
        "tokens granted by two members: {shared:?}"
    );
    eprintln!(
        "{label}: Sentinels switched {switched:?} after SENTINEL FAILOVER; five members active \
         under one view {took:?} after e joined; {} readings, no overlap, {} (partition, token) \
         pairs each granted by one member",
        seen.rounds,
        seen.holders.len()
    );
    let members = std::mem::take(&mut *members.lock().unwrap());
    for (name, m) in members {
        let m = Arc::try_unwrap(m).unwrap_or_else(|_| panic!("{name} still shared"));
        m.leave().await.unwrap();
    }
}

/// Two of the three Sentinels gone: no call can be confirmed to come from the current primary,
/// so every call fails retryably, naming how many answered, and a member stops granting by its
/// lease deadline (its renewals fail) although the primary itself is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unconfirmed_primary_stops_grants_by_the_lease_deadline() {
    let label = "redis_sentinel::unconfirmed_primary_stops_grants_by_the_lease_deadline";
    let Some(servers) = sentinels(label).await else {
        return;
    };
    let url = servers.url();
    let ttl = Duration::from_secs(2);
    let store = headcount::connect(&url).await.unwrap();
    let config = GroupConfig::new("unconfirmed", ttl).with_member("a");
    let member = Group::join(store.clone(), config).await.unwrap();
    let active = member.active(0).await.unwrap();
    assert!(member.share().is_some(), "{active:?}");
    let sentinels: Vec<usize> = (0..servers.servers.len())
        .filter(|i| servers.sentinel_ports().contains(&servers.servers[*i].port))
        .collect();
    let s = Arc::clone(&servers);
    let gone = sentinels[1..].to_vec();
    tokio::task::spawn_blocking(move || {
        for i in gone {
            s.servers[i].kill().unwrap();
        }
    })
    .await
    .unwrap();
    let killed = Instant::now();
    let err = store.get("hc:{unconfirmed}:x").await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("of 3 Sentinels answered"), "{err}");
    while member.share().is_some() {
        assert!(
            killed.elapsed() < ttl + Duration::from_millis(500),
            "still granting {:?} after two Sentinels went away: {:?}",
            killed.elapsed(),
            member.assignment()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "{label}: stopped granting {:?} after two of three Sentinels went away (TTL {ttl:?})",
        killed.elapsed()
    );
    drop(member);
}

/// Mistakes in the URL that asking again cannot fix fail at once with the permanent
/// `Rejected`, naming the fix: a database the primary does not have, and the primary's own
/// address where the Sentinels' were expected.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn url_mistakes_are_permanent() {
    let Some(servers) = sentinels("redis_sentinel::url_mistakes_are_permanent").await else {
        return;
    };
    let out_of_range = servers.url().replace(
        &format!("/{SENTINEL_MASTER}"),
        &format!("/{SENTINEL_MASTER}/99"),
    );
    let primary = format!(
        "redis+sentinel://127.0.0.1:{}/{SENTINEL_MASTER}",
        servers.servers[0].port
    );
    for (url, says) in [
        (out_of_range, "out of range"),
        (primary, "names the Sentinels"),
    ] {
        let started = Instant::now();
        let err = headcount::connect(&url).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Rejected, "{url}: {err}");
        assert!(!err.is_retryable(), "{url}: {err}");
        assert!(err.to_string().contains(says), "{url}: {err}");
        assert!(started.elapsed() < OP_TIMEOUT, "{:?}", started.elapsed());
    }
}

/// A master name no Sentinel watches: `Rejected`, naming it, well within the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_master_is_rejected_by_name() {
    let Some(servers) = sentinels("redis_sentinel::unknown_master_is_rejected_by_name").await
    else {
        return;
    };
    let url = servers.url().replace("/mymaster", "/nosuchmaster");
    let started = Instant::now();
    let err = headcount::connect(&url).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Rejected, "{err}");
    assert!(err.to_string().contains("nosuchmaster"), "{err}");
    assert!(!err.is_retryable(), "{err}");
    assert!(started.elapsed() < OP_TIMEOUT, "{:?}", started.elapsed());
}

/// Sentinels that refuse connections, or accept and never answer: a retryable error within the
/// deadline, naming what was tried, never a stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_sentinels_are_retryable_within_the_deadline() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // Accepts (the kernel completes the handshake) and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    for (url, what) in [
        (
            format!("redis+sentinel://127.0.0.1:{closed}/mymaster?timeout=1s"),
            "refused",
        ),
        (
            format!(
                "redis+sentinel://127.0.0.1:{silent_port},127.0.0.1:{closed}/mymaster?timeout=1s"
            ),
            "silent",
        ),
    ] {
        let started = Instant::now();
        let err = headcount::connect(&url).await.unwrap_err();
        let took = started.elapsed();
        assert!(err.is_retryable(), "{what}: {err}");
        assert!(
            took < Duration::from_millis(1500),
            "{what}: took {took:?}: {err}"
        );
        assert!(err.to_string().contains("Sentinel"), "{what}: {err}");
    }
    drop(silent);
}

/// A fake Sentinel: answers `SENTINEL …` with `127.0.0.1:<names>` and `+OK` to anything else
/// (the client's connection set-up).
async fn fake_sentinel(names: u16) -> (u16, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let serve = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while let Ok(n) = socket.read(&mut chunk).await {
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some((words, used)) = parse_request(&buf) {
                        buf.drain(..used);
                        let reply = if words
                            .first()
                            .is_some_and(|w| w.eq_ignore_ascii_case("SENTINEL"))
                        {
                            let port = names.to_string();
                            format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
                        } else {
                            "+OK\r\n".to_owned()
                        };
                        if socket.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (port, serve)
}

/// One RESP request (an array of bulk strings) at the start of `buf`, and its length.
fn parse_request(buf: &[u8]) -> Option<(Vec<String>, usize)> {
    fn line(buf: &[u8], at: usize) -> Option<(&str, usize)> {
        let end = buf.get(at..)?.windows(2).position(|w| w == b"\r\n")? + at;
        Some((std::str::from_utf8(&buf[at..end]).ok()?, end + 2))
    }
    let (head, mut at) = line(buf, 0)?;
    let count: usize = head.strip_prefix('*')?.parse().ok()?;
    let mut words = Vec::new();
    for _ in 0..count {
        let (len, start) = line(buf, at)?;
        let len: usize = len.strip_prefix('$')?.parse().ok()?;
        let word = buf.get(start..start + len)?;
        words.push(String::from_utf8_lossy(word).into_owned());
        at = start + len + 2;
        if buf.len() < at {
            return None;
        }
    }
    Some((words, at))
}

/// Sentinels that disagree: one (fake) names the replica. With the three real ones in the URL
/// the address most Sentinels name wins; with one real one (a tie) the `ROLE` check still picks
/// the primary; alone, it names only a replica: the retryable `Unavailable`, saying so, within
/// the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disagreeing_sentinels_resolve_to_the_primary() {
    let Some(servers) =
        sentinels("redis_sentinel::disagreeing_sentinels_resolve_to_the_primary").await
    else {
        return;
    };
    let (fake, serve) = fake_sentinel(servers.servers[1].port).await;
    let real: Vec<String> = servers
        .sentinel_ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    for sentinels in [
        format!("127.0.0.1:{fake},{}", real.join(",")),
        format!("127.0.0.1:{fake},{}", real[0]),
    ] {
        let url = format!("redis+sentinel://{sentinels}/mymaster?timeout=2s");
        let store = headcount::connect(&url).await.unwrap();
        // A write: the replica would refuse it.
        store.incr("hc:{disagree}:n", None).await.unwrap();
    }
    let started = Instant::now();
    let err = headcount::connect(&format!(
        "redis+sentinel://127.0.0.1:{fake}/mymaster?timeout=2s"
    ))
    .await
    .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("replica"), "{err}");
    assert!(started.elapsed() < OP_TIMEOUT, "{:?}", started.elapsed());
    serve.abort();
}

/// Sentinels with credentials of their own (the default user's password, as `requirepass` in
/// `sentinel.conf` sets it, and an ACL user): the store finds the primary with
/// `sentinel_password` (and `sentinel_username`) in the URL, the servers themselves needing
/// none. Without them, or with wrong ones, connecting fails at once with the permanent
/// `Rejected`, naming the options and never the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinels_with_credentials_of_their_own() {
    let Some(servers) = sentinels("redis_sentinel::sentinels_with_credentials_of_their_own").await
    else {
        return;
    };
    let ports = servers.sentinel_ports();
    for port in &ports {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        for rule in [
            &["watcher", "on", ">w4tcher-pw", "+@all"][..],
            // Last: from here on, a connection without the password is refused.
            &["default", "resetpass", ">s3ntinel-pw"],
        ] {
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg(rule)
                .query_async::<()>(&mut conn)
                .await
                .unwrap();
        }
    }
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let base = format!("redis+sentinel://{}/mymaster?timeout=2s", hosts.join(","));
    for credentials in [
        "sentinel_password=s3ntinel-pw",
        "sentinel_username=watcher&sentinel_password=w4tcher-pw",
    ] {
        let store = headcount::connect(&format!("{base}&{credentials}"))
            .await
            .unwrap_or_else(|e| panic!("{credentials}: {e}"));
        // A write: only the primary takes it.
        store.incr("hc:{sentinel-auth}:n", None).await.unwrap();
    }
    for (credentials, secret) in [
        ("", None),
        ("&sentinel_password=wr0ng-pw", Some("wr0ng-pw")),
        (
            "&sentinel_username=watcher&sentinel_password=s3ntinel-pw",
            Some("s3ntinel-pw"),
        ),
    ] {
        let started = Instant::now();
        let err = headcount::connect(&format!("{base}{credentials}"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Rejected, "{credentials}: {err}");
        assert!(!err.is_retryable(), "{err}");
        assert!(err.to_string().contains("sentinel_password"), "{err}");
        if let Some(secret) = secret {
            assert!(!format!("{err} {err:?}").contains(secret), "{err:?}");
        }
        assert!(started.elapsed() < OP_TIMEOUT, "{:?}", started.elapsed());
    }
}

/// `wait_replicas=1`: a write counts only once the replica holds it. With the replica paused
/// (its link still open, so the primary counts it as connected) every write fails retryably,
/// saying how many replicas it reached, and the value it wrote is on the primary alone; once
/// the replica is back, writes count again. Each write's `WAIT` goes in one request with it, on
/// its connection: sent apart, a connection replaced in between (after a call cut short) would
/// send the `WAIT` on a fresh connection that wrote nothing, which counts every connected
/// replica at once, the paused one included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_the_replica_lacks_never_counts() {
    let label = "redis_sentinel::a_write_the_replica_lacks_never_counts";
    let Some(servers) = sentinels(label).await else {
        return;
    };
    // A deadline of 1 s: the `WAIT` gets three quarters of it, the write and the Sentinels'
    // confirmation the rest, with room for a loaded machine.
    let url = servers.url().replace(
        &format!("timeout={}ms", OP_TIMEOUT.as_millis()),
        "timeout=1000ms",
    );
    let url = format!(
        "{url}{}wait_replicas=1",
        if url.contains('?') { '&' } else { '?' }
    );
    let store = headcount::connect(&url).await.unwrap();
    let key = "hc:{waiting}:k";
    assert!(store.compare_and_set(key, None, "0", None).await.unwrap());
    let s = Arc::clone(&servers);
    tokio::task::spawn_blocking(move || s.servers[1].pause().unwrap())
        .await
        .unwrap();
    let mut previous = "0".to_owned();
    for i in 1..=5 {
        // Calls cut short by their callers between the writes replace the connection.
        let _ = tokio::time::timeout(Duration::from_millis(1), store.get(key)).await;
        let next = i.to_string();
        let err = store
            .compare_and_set(key, Some(&previous), &next, None)
            .await
            .expect_err("a write the paused replica lacks counted");
        // Refused as the `WAIT` answered, or, on a machine too loaded to answer within the
        // deadline, cut off by it: either way not counted.
        assert!(err.is_retryable(), "{err}");
        assert!(
            err.to_string().contains("reached 0 of the 1 replicas")
                || err.kind() == ErrorKind::Timeout,
            "{err}"
        );
        // Not counted, but on the primary: the next write compares with it.
        assert_eq!(
            store.get(key).await.unwrap().as_deref(),
            Some(next.as_str())
        );
        previous = next;
    }
    let s = Arc::clone(&servers);
    tokio::task::spawn_blocking(move || s.servers[1].resume().unwrap())
        .await
        .unwrap();
    let resumed = Instant::now();
    loop {
        match store
            .compare_and_set(key, Some(&previous), "done", None)
            .await
        {
            Ok(true) => break,
            Ok(false) => panic!("the value changed under the test"),
            Err(e) => assert!(
                resumed.elapsed() < Duration::from_secs(10),
                "writes still not confirmed 10 s after the replica came back: {e}"
            ),
        }
    }
}
