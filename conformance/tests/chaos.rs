//! The chaos test of group membership on real servers.
//!
//! Member *processes* (`headcount-chaos-member`) share a group on the store under test; a
//! generator offers task ids `0..N` into a PostgreSQL sink (a server from the harness, separate
//! from the store under test); each member writes the ids of the partitions it owns through a
//! fence checked in the same statement as the write. During the run the harness starts three
//! members, adds two, then, in an order and with victims and delays drawn from a seed: stops one
//! gracefully (SIGTERM: it leaves the group), kills one with SIGKILL, pauses one with SIGSTOP
//! while it has grants in flight until the others have taken over and written its partitions,
//! then resumes it with SIGCONT, and restarts the store's server once (not on SQLite: it has no
//! server).
//!
//! Checks: every id accepted by the sink exactly once; no `(key, epoch)` used by two members
//! (from their logs); at least one of the paused member's late writes refused by the fence;
//! convergence after each change within its bound, measured from the member logs.
//!
//! `HEADCOUNT_CHAOS_SEED` replays a schedule (the seed is printed on failure);
//! `HEADCOUNT_CHAOS_LONG=1` runs the long schedule (N = 100,000) instead of the short one
//! (N = 20,000). See docs/demo.md.
#![cfg(feature = "postgres")]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use headcount_conformance::ServerControl;
use headcount_harness::{self as harness, ServerKind, Unavailable};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom as _, SliceRandom as _};
use rand::{Rng as _, SeedableRng as _};
use serde_json::Value;
use tokio_postgres::{Client, NoTls};

const PARTITIONS: i64 = 64;
const MEMBER_BIN: &str = env!("CARGO_BIN_EXE_headcount-chaos-member");
/// Slack on every convergence bound: the machine runs other suites at once.
const SLACK: Duration = Duration::from_secs(2);

/// The chaos runs of one test binary go one at a time: each starts five processes.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn chaos_sqlite() -> Result<(), String> {
    chaos(ServerKind::Sqlite).await
}

#[tokio::test]
async fn chaos_postgres() -> Result<(), String> {
    chaos(ServerKind::Postgres).await
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn chaos_redis() -> Result<(), String> {
    chaos(ServerKind::Redis).await
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn chaos_etcd() -> Result<(), String> {
    chaos(ServerKind::Etcd).await
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn chaos_redis_cluster() -> Result<(), String> {
    chaos(ServerKind::RedisCluster).await
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn chaos_etcd_cluster() -> Result<(), String> {
    chaos(ServerKind::EtcdCluster).await
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A harness result as the conformance tests treat it: a missing backend skips, or fails when
/// it is required.
fn available<T>(backend: ServerKind, r: Result<T, Unavailable>) -> Result<Option<T>, String> {
    harness::available(backend, &format!("chaos::{}", backend.name()), r)
}

/// Runs one backend's chaos; the error names the seed to replay it with.
async fn chaos(backend: ServerKind) -> Result<(), String> {
    let _one = ONE_AT_A_TIME.lock().await;
    let seed = std::env::var("HEADCOUNT_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let long = std::env::var("HEADCOUNT_CHAOS_LONG").is_ok_and(|v| v == "1");
    run(backend, seed, long).await.map_err(|e| {
        format!(
            "chaos::{} failed with seed {seed} (replay: HEADCOUNT_CHAOS_SEED={seed}): {e}",
            backend.name()
        )
    })
}

/// The store under test: its URL and, except on SQLite, control over its server.
struct Target {
    url: String,
    control: Option<Arc<dyn ServerControl>>,
}

async fn run(backend: ServerKind, seed: u64, long: bool) -> Result<(), String> {
    let Some(sink_url) = available(ServerKind::Postgres, ServerKind::Postgres.shared().await)?
    else {
        return Ok(());
    };
    let target = if backend == ServerKind::Sqlite {
        match available(backend, backend.shared().await)? {
            Some(url) => Target { url, control: None },
            None => return Ok(()),
        }
    } else {
        match available(backend, backend.dedicated().await)? {
            Some(d) => Target {
                url: d.url,
                control: Some(d.control),
            },
            None => return Ok(()),
        }
    };
    let mut chaos = Chaos::new(backend, seed, long, &sink_url, target).await?;
    let result = chaos.play().await;
    let result = match result {
        Ok(()) => chaos.check().await,
        Err(e) => Err(e),
    };
    chaos.members.kill_all();
    let control = chaos.target.control.take();
    // A dedicated server stops with the last handle to its control, which blocks briefly.
    let _ = tokio::task::spawn_blocking(move || drop(control)).await;
    // The journal of the run is on stderr, which the test harness shows for a failed test.
    result
}

/// A member process and its log.
struct Proc {
    name: String,
    child: Child,
    log: LogTail,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Live,
    Paused,
    Gone,
}

/// Every member process; all are killed when this is dropped, so none outlives the test.
#[derive(Default)]
struct Members {
    procs: Vec<Proc>,
}

impl Members {
    fn kill_all(&mut self) {
        for p in &mut self.procs {
            if let Ok(None) = p.child.try_wait() {
                signal(&p.child, libc::SIGCONT);
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }

    fn live(&self) -> impl Iterator<Item = &Proc> {
        self.procs.iter().filter(|p| p.state == State::Live)
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        self.kill_all();
    }
}

#[allow(unsafe_code)]
fn signal(child: &Child, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on our own child's pid, not yet reaped (callers check try_wait).
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Waits (up to 2 s) until every thread of a SIGSTOPped child is stopped: kill(2) returns before
/// they all are, and a thread still running could log and send a write after the caller looked.
async fn wait_stopped(child: &Child) {
    let deadline = Instant::now() + Duration::from_secs(2);
    let dir = PathBuf::from(format!("/proc/{}/task", child.id()));
    while Instant::now() < deadline {
        let all_stopped = std::fs::read_dir(&dir).is_ok_and(|tasks| {
            tasks.flatten().all(|t| {
                std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                    stat.rsplit_once(')')
                        .and_then(|(_, rest)| rest.trim_start().chars().next())
                        .is_some_and(|state| matches!(state, 'T' | 't'))
                })
            })
        });
        if all_stopped {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Reads a member's JSON-lines log incrementally.
struct LogTail {
    path: PathBuf,
    offset: u64,
    partial: String,
    events: Vec<Value>,
}

impl LogTail {
    fn new(path: PathBuf) -> LogTail {
        LogTail {
            path,
            offset: 0,
            partial: String::new(),
            events: Vec::new(),
        }
    }

    /// Reads what was appended since the last call.
    fn refresh(&mut self) {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return;
        };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = String::new();
        if let Ok(n) = f.read_to_string(&mut buf) {
            self.offset += n as u64;
        }
        self.partial.push_str(&buf);
        while let Some(i) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=i).collect();
            if let Ok(v) = serde_json::from_str::<Value>(line.trim()) {
                self.events.push(v);
            }
        }
    }
}

fn ev<'a>(v: &'a Value, kind: &str) -> Option<&'a Value> {
    (v["ev"] == kind).then_some(v)
}

/// One change of the schedule, as measured.
struct Stage {
    what: String,
    convergence: Option<Duration>,
    bound: Duration,
}

struct Chaos {
    backend: ServerKind,
    rng: StdRng,
    n: u64,
    long: bool,
    ttl: Duration,
    group: String,
    tables: String,
    dir: PathBuf,
    sink_url: String,
    sink: Client,
    target: Target,
    members: Members,
    next_member: u32,
    generator: Option<tokio::task::JoinHandle<Result<(), String>>>,
    stages: Vec<Stage>,
    started: Instant,
    /// What the pause proved: whether a late write of the paused member was refused.
    pause_refused: Option<usize>,
}

async fn connect(url: &str) -> Result<Client, String> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("sink: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

impl Chaos {
    async fn new(
        backend: ServerKind,
        seed: u64,
        long: bool,
        sink_url: &str,
        target: Target,
    ) -> Result<Chaos, String> {
        let tag = format!("{:012x}", rand::random::<u64>() >> 16);
        let tables = format!("chaos_{tag}");
        let sink = connect(sink_url).await?;
        let t = &tables;
        sink.batch_execute(&format!(
            "CREATE TABLE {t}_fence (part int PRIMARY KEY, token bigint NOT NULL);
             INSERT INTO {t}_fence SELECT g, 0 FROM generate_series(0, {}) g;
             CREATE TABLE {t}_offered (id bigint PRIMARY KEY, part int NOT NULL);
             CREATE INDEX ON {t}_offered (part);
             CREATE TABLE {t}_accepted (id bigint NOT NULL, token bigint NOT NULL, member text NOT NULL);
             CREATE INDEX ON {t}_accepted (id);",
            PARTITIONS - 1
        ))
        .await
        .map_err(|e| format!("creating the sink tables: {e}"))?;
        let dir = std::env::temp_dir().join(format!("headcount-chaos-{tag}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // etcd leases are whole seconds with a server minimum.
        let ttl = if matches!(backend, ServerKind::Etcd | ServerKind::EtcdCluster) {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(1)
        };
        Ok(Chaos {
            backend,
            rng: StdRng::seed_from_u64(seed),
            n: if long { 100_000 } else { 20_000 },
            long,
            ttl,
            group: format!("chaos-{tag}"),
            tables,
            dir,
            sink_url: sink_url.to_owned(),
            sink,
            target,
            members: Members::default(),
            next_member: 1,
            generator: None,
            stages: Vec::new(),
            started: Instant::now(),
            pause_refused: None,
        })
    }

    fn note(&mut self, line: String) {
        let line = format!("[{:6.2} s] {line}", self.started.elapsed().as_secs_f64());
        eprintln!("chaos::{}: {line}", self.backend.name());
    }

    fn heartbeat(&self) -> Duration {
        self.ttl / 3
    }

    /// A join or a graceful leave: the others see it at their next heartbeat.
    fn bound_join(&self) -> Duration {
        self.ttl + self.heartbeat() * 4 + SLACK
    }

    /// A crash or a pause: the slot expires after the TTL, then as a join.
    fn bound_crash(&self) -> Duration {
        self.ttl * 2 + self.heartbeat() * 4 + SLACK
    }

    fn spawn_member(&mut self) -> Result<(), String> {
        let name = format!("m{}", self.next_member);
        self.next_member += 1;
        let log = self.dir.join(format!("{name}.log"));
        let err = std::fs::File::create(self.dir.join(format!("{name}.err")))
            .map_err(|e| format!("{name}.err: {e}"))?;
        let child = Command::new(MEMBER_BIN)
            .args(["--store", &self.target.url])
            .args(["--sink", &self.sink_url])
            .args(["--tables", &self.tables])
            .args(["--group", &self.group])
            .args(["--member", &name])
            .args(["--ttl-ms", &self.ttl.as_millis().to_string()])
            .args(["--partitions", &PARTITIONS.to_string()])
            .arg("--log")
            .arg(&log)
            .env("HEADCOUNT_CHAOS_PARENT", std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawning {MEMBER_BIN}: {e}"))?;
        self.note(format!("spawned {name} (pid {})", child.id()));
        self.members.procs.push(Proc {
            name,
            child,
            log: LogTail::new(log),
            state: State::Live,
        });
        Ok(())
    }

    fn pick(&mut self, except: &[&str]) -> Result<usize, String> {
        let live: Vec<usize> = (0..self.members.procs.len())
            .filter(|&i| {
                let p = &self.members.procs[i];
                p.state == State::Live && !except.contains(&p.name.as_str())
            })
            .collect();
        live.choose(&mut self.rng)
            .copied()
            .ok_or_else(|| "no live member to pick".to_owned())
    }

    fn refresh_logs(&mut self) {
        for p in &mut self.members.procs {
            p.log.refresh();
        }
    }

    /// Members that exited on their own: a failure, with their stderr.
    fn check_alive(&mut self) -> Result<(), String> {
        for p in &mut self.members.procs {
            if p.state == State::Live {
                if let Ok(Some(status)) = p.child.try_wait() {
                    let err = std::fs::read_to_string(self.dir.join(format!("{}.err", p.name)))
                        .unwrap_or_default();
                    return Err(format!("member {} exited ({status}): {err}", p.name));
                }
            }
        }
        Ok(())
    }

    /// Waits until the live members converge on one view with exactly their slots, no sooner
    /// than `settle` after `since`; records the time from `since` to the assignment event that
    /// completed it, and fails when it is over the bound.
    async fn converge(
        &mut self,
        what: &str,
        since: Instant,
        bound: Duration,
    ) -> Result<(), String> {
        let since_ms = now_ms().saturating_sub(since.elapsed().as_millis() as u64);
        let settle = self.ttl + self.heartbeat();
        let deadline = since + bound + SLACK * 5;
        loop {
            self.check_alive()?;
            self.refresh_logs();
            if since.elapsed() >= settle {
                if let Some(at_ms) = self.converged_at() {
                    let took = Duration::from_millis(at_ms.saturating_sub(since_ms));
                    self.note(format!(
                        "converged {:.2} s after \"{what}\" (bound {:.1} s)",
                        took.as_secs_f64(),
                        bound.as_secs_f64()
                    ));
                    self.stages.push(Stage {
                        what: what.to_owned(),
                        convergence: Some(took),
                        bound,
                    });
                    return if took <= bound {
                        Ok(())
                    } else {
                        Err(format!(
                            "convergence after \"{what}\" took {took:?}, over its bound {bound:?}"
                        ))
                    };
                }
            }
            if Instant::now() >= deadline {
                self.stages.push(Stage {
                    what: what.to_owned(),
                    convergence: None,
                    bound,
                });
                let states: Vec<String> = self
                    .members
                    .live()
                    .map(|p| {
                        let last = p.log.events.iter().rev().find_map(|v| ev(v, "assign"));
                        format!(
                            "{}: {}",
                            p.name,
                            last.map_or("-".to_owned(), Value::to_string)
                        )
                    })
                    .collect();
                return Err(format!(
                    "no convergence after \"{what}\" within {:?}: {states:?}",
                    deadline - since
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// When every live member's latest assignment is active under one epoch whose live slots are
    /// exactly theirs: the time of the latest of those assignment events.
    fn converged_at(&self) -> Option<u64> {
        headcount_harness::history::one_active_view(
            self.members
                .live()
                .map(|p| p.log.events.iter().rev().find_map(|v| ev(v, "assign"))),
        )
    }

    fn start_generator(&mut self) {
        let (url, t, n) = (self.sink_url.clone(), self.tables.clone(), self.n);
        // Offered over about as long as the schedule takes.
        let over = Duration::from_secs(if n > 20_000 { 60 } else { 18 });
        self.generator = Some(tokio::spawn(async move {
            let client = connect(&url).await?;
            let step = Duration::from_millis(50);
            let per_step = (n * step.as_millis() as u64 / over.as_millis() as u64).max(1);
            let started = Instant::now();
            let mut next = 0u64;
            let mut i = 0u32;
            while next < n {
                let end = (next + per_step).min(n);
                client
                    .execute(
                        &format!(
                            "INSERT INTO {t}_offered SELECT g, g % {PARTITIONS} \
                             FROM generate_series($1::bigint, $2::bigint) g"
                        ),
                        &[&(next as i64), &(end as i64 - 1)],
                    )
                    .await
                    .map_err(|e| format!("offering ids: {e}"))?;
                next = end;
                i += 1;
                tokio::time::sleep_until((started + step * i).into()).await;
            }
            Ok(())
        }));
    }

    async fn pause_between(&mut self, lo_ms: u64, hi_ms: u64) {
        let ms = self.rng.random_range(lo_ms..=hi_ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// The whole schedule.
    async fn play(&mut self) -> Result<(), String> {
        self.note(format!(
            "store {} (group {}), sink tables {}_*, {} ids, TTL {:?}, logs in {}",
            headcount::redact_url(&self.target.url),
            self.group,
            self.tables,
            self.n,
            self.ttl,
            self.dir.display()
        ));
        self.start_generator();
        let t = Instant::now();
        for _ in 0..3 {
            self.spawn_member()?;
        }
        let b = self.bound_join();
        self.converge("3 members join", t, b).await?;
        self.pause_between(200, 1500).await;
        let t = Instant::now();
        self.spawn_member()?;
        self.spawn_member()?;
        self.converge("2 members join", t, b).await?;
        // The short run plays the steps once; the long one plays them again, topping the group
        // up to five members first, for as long as ids are being offered.
        for round in 0.. {
            if round > 0 {
                if !self.long || self.generator.as_ref().is_none_or(|g| g.is_finished()) {
                    break;
                }
                let t = Instant::now();
                let missing = 5usize.saturating_sub(self.members.live().count());
                for _ in 0..missing {
                    self.spawn_member()?;
                }
                self.converge(&format!("{missing} members join"), t, b)
                    .await?;
            }
            self.round(b).await?;
        }
        Ok(())
    }

    /// One round of the shuffled steps.
    async fn round(&mut self, b: Duration) -> Result<(), String> {
        #[derive(Debug, Clone, Copy)]
        enum Step {
            Leave,
            Kill,
            Pause,
            Restart,
        }
        let mut steps = vec![Step::Leave, Step::Kill, Step::Pause, Step::Restart];
        steps.shuffle(&mut self.rng);
        self.note(format!("schedule: {steps:?}"));
        for step in steps {
            self.pause_between(200, 1500).await;
            match step {
                Step::Leave => {
                    let i = self.pick(&[])?;
                    let t = Instant::now();
                    signal(&self.members.procs[i].child, libc::SIGTERM);
                    self.members.procs[i].state = State::Gone;
                    let name = self.members.procs[i].name.clone();
                    self.note(format!("SIGTERM {name} (graceful leave)"));
                    self.converge(&format!("{name} leaves"), t, b).await?;
                    self.wait_exit(i).await?;
                }
                Step::Kill => {
                    let i = self.pick(&[])?;
                    let t = Instant::now();
                    let p = &mut self.members.procs[i];
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                    p.state = State::Gone;
                    let name = p.name.clone();
                    self.note(format!("SIGKILL {name}"));
                    let bc = self.bound_crash();
                    self.converge(&format!("{name} killed"), t, bc).await?;
                }
                Step::Pause => self.pause_one().await?,
                Step::Restart => {
                    let Some(control) = self.target.control.clone() else {
                        self.note(format!(
                            "SKIP the store restart on {}: an embedded store has no server",
                            self.backend.name()
                        ));
                        continue;
                    };
                    let t = Instant::now();
                    control
                        .kill()
                        .await
                        .map_err(|e| format!("killing the store: {e}"))?;
                    self.note("store server killed".into());
                    self.pause_between(300, 1000).await;
                    control
                        .start()
                        .await
                        .map_err(|e| format!("restarting the store: {e}"))?;
                    let down = t.elapsed();
                    self.note(format!(
                        "store server restarted ({:.2} s down)",
                        down.as_secs_f64()
                    ));
                    let bound = self.bound_crash() + down;
                    self.converge("store restart", t, bound).await?;
                }
            }
        }
        Ok(())
    }

    async fn wait_exit(&mut self, i: usize) -> Result<(), String> {
        let deadline = Instant::now() + self.ttl * 2 + SLACK * 5;
        loop {
            let p = &mut self.members.procs[i];
            match p.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    return Err(format!("{} exited with {status} after SIGTERM", p.name))
                }
                Ok(None) if Instant::now() >= deadline => {
                    return Err(format!("{} did not exit after SIGTERM", p.name))
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(e) => return Err(format!("waiting for {}: {e}", p.name)),
            }
        }
    }

    /// Grants the member has in flight in its work phase: the fence advanced, the write not yet
    /// sent (the member logs `sending` before it sends it), so it can only be sent late.
    fn in_flight(&self, i: usize) -> BTreeMap<String, u64> {
        let mut open = BTreeMap::new();
        for v in &self.members.procs[i].log.events {
            let key = v["key"].as_str().unwrap_or_default().to_owned();
            if let Some(g) = ev(v, "advanced") {
                open.insert(key, g["epoch"].as_u64().unwrap_or(0));
            } else if ev(v, "sending").is_some() || ev(v, "grant").is_some() {
                open.remove(&key);
            }
        }
        open
    }

    /// SIGSTOP a member while it has grants in flight (checked in its log once it is stopped),
    /// keep it stopped until the others converged without it and wrote each of its in-flight
    /// partitions under a newer epoch, then SIGCONT it and wait for its late writes.
    async fn pause_one(&mut self) -> Result<(), String> {
        let i = self.pick(&[])?;
        let name = self.members.procs[i].name.clone();
        let mut held = BTreeMap::new();
        let mut t = Instant::now();
        for _ in 0..200 {
            t = Instant::now();
            signal(&self.members.procs[i].child, libc::SIGSTOP);
            wait_stopped(&self.members.procs[i].child).await;
            self.refresh_logs();
            held = self.in_flight(i);
            if !held.is_empty() {
                break;
            }
            signal(&self.members.procs[i].child, libc::SIGCONT);
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(1..15))).await;
        }
        if held.is_empty() {
            return Err(format!(
                "{name} never had a grant in its work phase when stopped (200 tries): the \
                 pause could not test the fence"
            ));
        }
        self.members.procs[i].state = State::Paused;
        self.note(format!("SIGSTOP {name}, holding grants {held:?}"));
        let bc = self.bound_crash();
        self.converge(&format!("{name} paused"), t, bc).await?;
        // The others must have written each of its partitions under a newer epoch (looked for
        // in what they logged since the stop).
        let seen: Vec<usize> = self
            .members
            .procs
            .iter()
            .map(|p| p.log.events.len())
            .collect();
        let deadline = Instant::now() + bc;
        loop {
            self.refresh_logs();
            let taken_over = held.iter().all(|(key, &epoch)| {
                self.members.procs.iter().zip(&seen).any(|(p, &from)| {
                    p.state == State::Live
                        && p.log.events[from.min(p.log.events.len())..]
                            .iter()
                            .any(|v| {
                                ev(v, "write").is_some()
                                    && v["key"] == key.as_str()
                                    && v["epoch"].as_u64().is_some_and(|e| e > epoch)
                                    && v["fenced"] == false
                            })
                })
            });
            if taken_over {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the others did not write {name}'s partitions {held:?} while it was paused"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let paused_for = t.elapsed();
        let resumed_at = now_ms();
        let t = Instant::now();
        signal(&self.members.procs[i].child, libc::SIGCONT);
        self.members.procs[i].state = State::Live;
        self.note(format!(
            "SIGCONT {name} after {:.2} s (TTL {:?})",
            paused_for.as_secs_f64(),
            self.ttl
        ));
        if paused_for <= self.ttl {
            return Err(format!(
                "{name} was paused only {paused_for:?}, not past its TTL"
            ));
        }
        let b = self.bound_join();
        self.converge(&format!("{name} resumes"), t, b).await?;
        self.refresh_logs();
        let late: Vec<Value> = self.members.procs[i]
            .log
            .events
            .iter()
            .filter(|v| {
                ev(v, "write").is_some()
                    && v["t"].as_u64().is_some_and(|t| t >= resumed_at)
                    && v["key"].as_str().is_some_and(|k| held.contains_key(k))
                    && v["epoch"].as_u64() == v["key"].as_str().and_then(|k| held.get(k)).copied()
            })
            .cloned()
            .collect();
        let refused = late.iter().filter(|v| v["fenced"] == true).count();
        self.note(format!(
            "{name}: {} late writes (grants it held when stopped), {refused} refused by the fence",
            late.len()
        ));
        // Every one of them was sent after the others wrote its partition under a newer epoch.
        if late.len() != held.len() || refused != held.len() {
            return Err(format!(
                "{name} held {held:?} when stopped; its late writes, each of which the fence \
                 must refuse: {late:?}"
            ));
        }
        self.pause_refused = Some(refused);
        Ok(())
    }

    /// After the schedule: every id accepted once, no (key, epoch) used by two members.
    async fn check(&mut self) -> Result<(), String> {
        if let Some(g) = self.generator.take() {
            g.await.map_err(|e| format!("generator: {e}"))??;
        }
        let t = self.tables.clone();
        let n = self.n as i64;
        let deadline = Instant::now() + Duration::from_secs(if n > 20_000 { 120 } else { 60 });
        loop {
            self.check_alive()?;
            let row = self
                .sink
                .query_one(&format!("SELECT count(DISTINCT id) FROM {t}_accepted"), &[])
                .await
                .map_err(|e| format!("counting: {e}"))?;
            let done: i64 = row.get(0);
            if done == n {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!("only {done} of {n} ids accepted by the deadline"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.note(format!("all {n} ids accepted; stopping the members"));
        let live: Vec<usize> = (0..self.members.procs.len())
            .filter(|&i| self.members.procs[i].state == State::Live)
            .collect();
        for &i in &live {
            signal(&self.members.procs[i].child, libc::SIGTERM);
            self.members.procs[i].state = State::Gone;
        }
        for i in live {
            self.wait_exit(i).await?;
        }
        let rows = self
            .sink
            .query(
                &format!(
                    "SELECT id, count(*) FROM {t}_accepted GROUP BY id HAVING count(*) <> 1 \
                     ORDER BY id LIMIT 20"
                ),
                &[],
            )
            .await
            .map_err(|e| format!("duplicates: {e}"))?;
        let dups: Vec<(i64, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        let row = self
            .sink
            .query_one(
                &format!("SELECT count(*), count(DISTINCT id) FROM {t}_accepted"),
                &[],
            )
            .await
            .map_err(|e| format!("totals: {e}"))?;
        let (total, distinct): (i64, i64) = (row.get(0), row.get(1));
        if !dups.is_empty() || total != n || distinct != n {
            return Err(format!(
                "sink: {total} rows for {distinct} distinct ids of {n}; ids accepted more than \
                 once: {dups:?}"
            ));
        }
        self.refresh_logs();
        let mut users: HashMap<(String, u64), BTreeSet<String>> = HashMap::new();
        let mut grants = 0usize;
        for p in &self.members.procs {
            for v in p.log.events.iter().filter_map(|v| ev(v, "grant")) {
                grants += 1;
                let key = (
                    v["key"].as_str().unwrap_or_default().to_owned(),
                    v["epoch"].as_u64().unwrap_or(0),
                );
                users.entry(key).or_default().insert(p.name.clone());
            }
        }
        let shared: Vec<_> = users.iter().filter(|(_, m)| m.len() > 1).collect();
        if !shared.is_empty() {
            return Err(format!(
                "(key, epoch) pairs granted to more than one member: {shared:?}"
            ));
        }
        let refused: usize = self
            .members
            .procs
            .iter()
            .flat_map(|p| &p.log.events)
            .filter(|v| ev(v, "write").is_some() && v["fenced"] == true)
            .count();
        if self.pause_refused.is_none() {
            return Err("the pause stage did not run".into());
        }
        let summary: Vec<String> = self
            .stages
            .iter()
            .map(|s| {
                format!(
                    "{}: {} (bound {:.1} s)",
                    s.what,
                    s.convergence
                        .map_or("none".to_owned(), |d| format!("{:.2} s", d.as_secs_f64())),
                    s.bound.as_secs_f64()
                )
            })
            .collect();
        self.note(format!(
            "passed: {n} ids accepted exactly once; {grants} grants logged, no (key, epoch) \
             shared; {refused} writes refused by the fence; convergence: {}",
            summary.join("; ")
        ));
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}
