//! Network partitions, tested the way Jepsen tests: member processes (`headcount-chaos-member`)
//! each in a network namespace of its own, the store's servers in namespaces too where the
//! schedule cuts them from each other (a 3-member etcd cluster, a Redis primary with its replica
//! and Sentinels, a Redis Cluster of three primaries), links cut, healed, delayed and lossy while the members write through a fence
//! into a PostgreSQL sink. A schedule is drawn from a seed; a checker
//! ([`headcount_harness::history`]) reads the whole history afterwards.
//!
//! The faults, each on a member picked by the seed:
//!
//! * `cut`: the member loses every store node while it holds grants (its sink stays reachable:
//!   the fence must refuse what it writes late), healed after less than a lease or after
//!   several;
//! * `cut during hand-off`: a member joins and another is cut while the keys move;
//! * `cut while leaving`: SIGTERM, then the cut while it drains;
//! * `flap`: cut and healed several times a second;
//! * `delay`: 200-800 ms each way with jitter (the proxy between the member and the store);
//! * `loss`: 10-30 % of the packets to and from the store dropped by the kernel;
//! * `kill` (SIGKILL and a replacement) and `pause` (SIGSTOP past the lease);
//! * store side: one etcd member (or one Redis Cluster primary) cut from the other two with some
//!   members on its side; the Redis primary cut from its replica and Sentinels with some members
//!   on its side;
//! * Redis Cluster: a member cut from the primary that holds the group's slot while it still
//!   reaches the other primaries.
//!
//! Each test runs the short schedule of one backend (it is part of the normal test run, as
//! root; where namespaces cannot be made it prints `SKIP` and passes, or fails under
//! `HEADCOUNT_REQUIRE_BACKENDS=all`). `HEADCOUNT_PARTITIONS_SEED=<n>` replays a seed;
//! `HEADCOUNT_PARTITIONS_RUNS=<n>` runs `n` seeds of the long schedule (eight faults) instead
//! and prints one result line per fault; `HEADCOUNT_PARTITIONS_FAULTS=Cut,PrimaryIsolated`
//! draws its faults from those kinds only; `HEADCOUNT_PARTITIONS_WAIT=0` runs the Sentinel store
//! without `wait_replicas=1`; `HEADCOUNT_PARTITIONS_PRE_VOTE=1` runs the etcd members with
//! `--pre-vote`; `HEADCOUNT_PARTITIONS_KEEP=1` keeps the member and server logs of
//! runs that pass too. See docs/partitions.md.
#![cfg(all(feature = "postgres", feature = "redis", feature = "etcd"))]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use headcount_harness::history::{
    self, Cut, GrantEvent, History, SinkRow, Window, WindowStats, WriteEvent,
};
use headcount_harness::netns::{Endpoint, Host, Net, Rule};
use headcount_harness::{KvStore, PgServer, Proxy, ServerKind, Unavailable};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde_json::Value;
use tokio_postgres::{Client, NoTls};

/// The member binary: the one cargo built, or `HEADCOUNT_PARTITIONS_MEMBER_BIN` (a copy kept
/// apart, for long runs in a target directory that other checkouts build into too).
fn member_bin() -> String {
    std::env::var("HEADCOUNT_PARTITIONS_MEMBER_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_headcount-chaos-member").to_owned())
}
const PARTITIONS: i64 = 32;
/// The members' per-operation deadline on the store.
const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// Slack on every bound: the machine runs other suites at once.
const SLACK: Duration = Duration::from_secs(3);

/// One partition run at a time per test binary: each starts several processes and namespaces.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_redis() -> Result<(), String> {
    partitions(ServerKind::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_postgres() -> Result<(), String> {
    partitions(ServerKind::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_etcd_cluster() -> Result<(), String> {
    partitions(ServerKind::EtcdCluster).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_redis_sentinel() -> Result<(), String> {
    partitions(ServerKind::RedisSentinel).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_redis_cluster() -> Result<(), String> {
    partitions(ServerKind::RedisCluster).await
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn available<T>(backend: ServerKind, r: Result<T, Unavailable>) -> Result<Option<T>, String> {
    headcount_harness::available(backend, &format!("partitions::{}", backend.name()), r)
}

async fn partitions(backend: ServerKind) -> Result<(), String> {
    let _one = ONE_AT_A_TIME.lock().await;
    let runs: u64 = std::env::var("HEADCOUNT_PARTITIONS_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let replay: Option<u64> = std::env::var("HEADCOUNT_PARTITIONS_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    let long = runs > 0;
    let mut failures = Vec::new();
    for i in 0..runs.max(1) {
        let seed = match replay {
            Some(s) => s + i,
            None => rand::random::<u64>(),
        };
        eprintln!(
            "partitions::{}: seed {seed} (replay: HEADCOUNT_PARTITIONS_SEED={seed})",
            backend.name()
        );
        match run(backend, seed, long).await {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => {
                let e = format!(
                    "partitions::{} failed with seed {seed} (replay: HEADCOUNT_PARTITIONS_SEED={seed}): {e}",
                    backend.name()
                );
                eprintln!("{e}");
                failures.push(e);
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// The store under test, as the members reach it.
struct Store {
    /// The URL up to the hosts (`redis://`, `postgres://postgres@`, `etcd://`).
    prefix: &'static str,
    /// After the hosts (`/postgres`).
    suffix: &'static str,
    /// The nodes, as the test process reaches them.
    nodes: Vec<SocketAddrV4>,
    /// The nodes' hosts, when they are in namespaces (store-side faults).
    hosts: Vec<Host>,
    /// Whether members reach the nodes directly instead of through proxies: a Sentinel names
    /// the primary's own address, so the data path cannot go through a proxy anyway.
    direct: bool,
    /// Servers members reach directly beyond `nodes` (the Redis primary and replica behind the
    /// Sentinels).
    also: Vec<SocketAddrV4>,
    /// URL options beyond `timeout`.
    options: String,
    /// What keeps servers outside the net alive.
    _keep: Option<Box<dyn std::any::Any + Send>>,
}

fn loopback_ports(url: &str) -> Vec<u16> {
    url.split("127.0.0.1:")
        .skip(1)
        .filter_map(|rest| {
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            rest[..end].parse().ok()
        })
        .collect()
}

async fn start_store(
    backend: ServerKind,
    net: &Net,
    dir: &std::path::Path,
) -> Result<Store, Unavailable> {
    let failed = |e: std::io::Error| Unavailable::Failed(format!("{}: {e}", backend.name()));
    match backend {
        ServerKind::Redis => {
            let kv = tokio::task::spawn_blocking(|| KvStore::redis(None))
                .await
                .map_err(|e| Unavailable::Failed(e.to_string()))??;
            let nodes = loopback_ports(&kv.url())
                .into_iter()
                .map(|p| SocketAddrV4::new(Ipv4Addr::LOCALHOST, p))
                .collect();
            Ok(Store {
                prefix: "redis://",
                suffix: "",
                nodes,
                hosts: Vec::new(),
                direct: false,
                also: Vec::new(),
                options: String::new(),
                _keep: Some(Box::new(kv)),
            })
        }
        ServerKind::Postgres => {
            let pg = tokio::task::spawn_blocking(|| PgServer::start_new(None))
                .await
                .map_err(|e| Unavailable::Failed(e.to_string()))??;
            Ok(Store {
                prefix: "postgres://postgres@",
                suffix: "/postgres",
                nodes: vec![SocketAddrV4::new(Ipv4Addr::LOCALHOST, pg.port())],
                hosts: Vec::new(),
                direct: false,
                also: Vec::new(),
                options: String::new(),
                _keep: Some(Box::new(pg)),
            })
        }
        ServerKind::EtcdCluster => {
            let Some(bin) = which("etcd") else {
                return Err(Unavailable::Missing("`etcd` is not on PATH".into()));
            };
            let mut hosts = Vec::new();
            for i in 1..=3 {
                hosts.push(net.host(&format!("e{i}")).map_err(failed)?);
            }
            let cluster: Vec<String> = hosts
                .iter()
                .map(|h| format!("{}=http://{}:2380", h.name, h.ip))
                .collect();
            let token = format!("hc-{:08x}", rand::random::<u32>());
            for h in &hosts {
                let client = format!("http://{}:2379", h.ip);
                let peer = format!("http://{}:2380", h.ip);
                let mut cmd = Command::new(&bin);
                cmd.args(["--name", &h.name])
                    .arg("--data-dir")
                    .arg(dir.join(format!("{}.etcd", h.name)))
                    .args(["--listen-client-urls", &client])
                    .args(["--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer])
                    .args(["--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &cluster.join(",")])
                    .args(["--initial-cluster-state", "new"])
                    .args(["--initial-cluster-token", &token])
                    .args(["--log-level", "warn"]);
                if etcd_pre_vote() {
                    cmd.arg("--pre-vote");
                }
                serve(net, h, cmd, dir).map_err(failed)?;
            }
            let nodes: Vec<SocketAddrV4> = addrs(&hosts, 2379);
            let url = format!(
                "etcd://{}",
                nodes
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            );
            let end = Instant::now() + Duration::from_secs(60);
            loop {
                if let Ok(store) = headcount::connect(&url).await {
                    if store.get("hc-partitions-ready").await.is_ok() {
                        break;
                    }
                }
                if Instant::now() > end {
                    return Err(Unavailable::Failed(format!(
                        "the etcd cluster in namespaces did not answer within 60 s (logs in {})",
                        dir.display()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(Store {
                prefix: "etcd://",
                suffix: "",
                nodes,
                hosts,
                direct: false,
                also: Vec::new(),
                options: String::new(),
                _keep: None,
            })
        }
        ServerKind::RedisSentinel => start_sentinel(net, dir).await,
        ServerKind::RedisCluster => start_cluster(net, dir).await,
        other => Err(Unavailable::NotApplicable(format!(
            "no partition schedule for {}",
            other.name()
        ))),
    }
}

/// Whether the etcd members run with `--pre-vote` (`HEADCOUNT_PARTITIONS_PRE_VOTE=1`; the
/// default from etcd 3.5 on, off in the 3.4 servers Debian ships, which the test runs as they
/// come unless asked): a member cut off then cannot depose the leader when it comes back.
fn etcd_pre_vote() -> bool {
    std::env::var("HEADCOUNT_PARTITIONS_PRE_VOTE").is_ok_and(|v| v == "1")
}

/// Whether the Sentinel store waits for its replica on every write (`wait_replicas=1`): yes
/// unless `HEADCOUNT_PARTITIONS_WAIT=0`, which measures the store without it.
fn sentinel_waits() -> bool {
    std::env::var("HEADCOUNT_PARTITIONS_WAIT").map_or(true, |v| v != "0")
}

/// A Redis primary (host r1) and its replica (r2) behind three Sentinels (s1-s3), each on a
/// host of its own.
async fn start_sentinel(net: &Net, dir: &std::path::Path) -> Result<Store, Unavailable> {
    let failed = |e: std::io::Error| Unavailable::Failed(format!("redis_sentinel: {e}"));
    let Some(bin) = which("redis-server") else {
        return Err(Unavailable::Missing("`redis-server` is not on PATH".into()));
    };
    let mut data = Vec::new();
    for name in ["r1", "r2"] {
        data.push(net.host(name).map_err(failed)?);
    }
    let primary = data[0].ip.to_string();
    for h in &data {
        let mut cmd = Command::new(&bin);
        cmd.args(["--port", "6379", "--bind", &h.ip.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(dir);
        if h.name == "r2" {
            cmd.args(["--replicaof", &primary, "6379"]);
        }
        serve(net, h, cmd, dir).map_err(failed)?;
    }
    let mut sentinels = Vec::new();
    for name in ["s1", "s2", "s3"] {
        let h = net.host(name).map_err(failed)?;
        let conf = dir.join(format!("{name}.conf"));
        std::fs::write(
            &conf,
            format!(
                "port 26379\nbind {}\nprotected-mode no\ndaemonize no\ndir {}\n\
                 sentinel monitor mymaster {primary} 6379 2\n\
                 sentinel down-after-milliseconds mymaster 500\n\
                 sentinel failover-timeout mymaster 3000\n\
                 sentinel parallel-syncs mymaster 1\n",
                h.ip,
                dir.display()
            ),
        )
        .map_err(failed)?;
        let mut cmd = Command::new(&bin);
        cmd.arg(&conf).arg("--sentinel");
        serve(net, &h, cmd, dir).map_err(failed)?;
        sentinels.push(h);
    }
    let nodes: Vec<SocketAddrV4> = addrs(&sentinels, 26379);
    // Ready once the replica is in sync, and every Sentinel sees it and the other two: a
    // failover needs both.
    let end = Instant::now() + Duration::from_secs(60);
    let replica = SocketAddrV4::new(data[1].ip, 6379);
    while !redis_request(replica, "INFO replication")
        .await
        .contains("master_link_status:up")
    {
        if Instant::now() > end {
            return Err(Unavailable::Failed(format!(
                "the replica in a namespace did not sync within 60 s (logs in {})",
                dir.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for node in &nodes {
        loop {
            let info = redis_request(*node, "INFO sentinel").await;
            if info.contains("status=ok") && info.contains("slaves=1,sentinels=3") {
                break;
            }
            if Instant::now() > end {
                return Err(Unavailable::Failed(format!(
                    "the Sentinels in namespaces did not see each other and the replica within \
                     60 s (logs in {}): {info}",
                    dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(Store {
        prefix: "redis+sentinel://",
        suffix: "/mymaster",
        nodes,
        also: addrs(&data, 6379),
        hosts: data.into_iter().chain(sentinels).collect(),
        direct: true,
        options: if sentinel_waits() {
            "&wait_replicas=1".into()
        } else {
            String::new()
        },
        _keep: None,
    })
}

/// Three Redis Cluster primaries (hosts c1-c3, no replicas), each on a host of its own, joined
/// with `redis-cli --cluster create`. Without replicas no failover can lose a write: a primary
/// cut off only makes its slots unavailable, and with `cluster-require-full-coverage` (the
/// default) the whole cluster refuses commands once the others mark it failed.
async fn start_cluster(net: &Net, dir: &std::path::Path) -> Result<Store, Unavailable> {
    let failed = |e: std::io::Error| Unavailable::Failed(format!("redis_cluster: {e}"));
    let (Some(bin), Some(cli)) = (which("redis-server"), which("redis-cli")) else {
        return Err(Unavailable::Missing(
            "`redis-server` or `redis-cli` is not on PATH".into(),
        ));
    };
    let mut hosts = Vec::new();
    for name in ["c1", "c2", "c3"] {
        let h = net.host(name).map_err(failed)?;
        let mut cmd = Command::new(&bin);
        cmd.args(["--port", "6379", "--bind", &h.ip.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
            .arg("--cluster-config-file")
            .arg(dir.join(format!("{name}-nodes.conf")))
            .arg("--dir")
            .arg(dir);
        serve(net, &h, cmd, dir).map_err(failed)?;
        hosts.push(h);
    }
    let nodes: Vec<SocketAddrV4> = addrs(&hosts, 6379);
    let end = Instant::now() + Duration::from_secs(60);
    for node in &nodes {
        while !redis_request(*node, "PING").await.contains("PONG") {
            if Instant::now() > end {
                return Err(Unavailable::Failed(format!(
                    "the Redis Cluster node {node} in a namespace did not answer within 60 s \
                     (logs in {})",
                    dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut create = Command::new(cli);
    create.args(["--cluster", "create"]);
    create.args(nodes.iter().map(ToString::to_string));
    create.args(["--cluster-replicas", "0", "--cluster-yes"]);
    let out = tokio::task::spawn_blocking(move || create.stdin(Stdio::null()).output())
        .await
        .map_err(|e| Unavailable::Failed(e.to_string()))?
        .map_err(failed)?;
    if !out.status.success() {
        return Err(Unavailable::Failed(format!(
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    // Every node must know every slot before the members may use it.
    for node in &nodes {
        while !redis_request(*node, "CLUSTER INFO")
            .await
            .contains("cluster_state:ok")
        {
            if Instant::now() > end {
                return Err(Unavailable::Failed(format!(
                    "the Redis Cluster in namespaces did not reach cluster_state:ok within 60 s \
                     (logs in {})",
                    dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(Store {
        prefix: "redis+cluster://",
        suffix: "",
        nodes,
        hosts,
        // A node redirects a client to the address it announces: its own.
        direct: true,
        also: Vec::new(),
        options: String::new(),
        _keep: None,
    })
}

/// Starts a server in `host`, its output in `<dir>/<host name>.log`, stopped with SIGTERM when
/// the net goes.
fn serve(net: &Net, host: &Host, cmd: Command, dir: &std::path::Path) -> std::io::Result<()> {
    net.spawn_server(
        host,
        cmd,
        &dir.join(format!("{}.log", host.name)),
        None,
        libc::SIGTERM,
    )
    .map(drop)
}

/// The address of port `port` on each of `hosts`.
fn addrs(hosts: &[Host], port: u16) -> Vec<SocketAddrV4> {
    hosts
        .iter()
        .map(|h| SocketAddrV4::new(h.ip, port))
        .collect()
}

/// Sends one inline command to a Redis server or Sentinel; its raw answer, or the error as text.
async fn redis_request(addr: SocketAddrV4, command: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let talk = async {
        let mut c = tokio::net::TcpStream::connect(addr).await?;
        c.write_all(format!("{command}\r\n").as_bytes()).await?;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_millis(200), c.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => out.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).into_owned())
    };
    match tokio::time::timeout(Duration::from_secs(2), talk).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => "error: no answer".into(),
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A member process on its host, and how it reaches each store node.
struct MemberProc {
    name: String,
    host: Host,
    child: Child,
    /// One proxy per store node, in the test process, listening on the net.
    proxies: Vec<Proxy>,
    log: PathBuf,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Live,
    Paused,
    Gone,
}

impl MemberProc {
    fn signal(&self, sig: libc::c_int) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            let _ = harness_signal(pid, sig);
        }
    }
}

#[allow(unsafe_code)]
fn harness_signal(pid: libc::pid_t, sig: libc::c_int) -> std::io::Result<()> {
    if pid <= 0 {
        return Err(std::io::Error::other("bad pid"));
    }
    // SAFETY: kill(2) on the pid of a child of ours that has not been reaped.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A cut of one member from the store in place: its record in [`Run::cuts`] and its rules.
struct StoreCut {
    cut: usize,
    rules: Vec<Rule>,
}

/// A fault that was played: what, when, when healed, and the members it cut from the store.
struct Played {
    kind: Fault,
    what: String,
    from: u64,
    healed: u64,
    cut: Vec<String>,
    /// The members the fault struck (see [`Window::side`]).
    side: Vec<String>,
    converged_after_heal: Option<u64>,
}

struct Run {
    backend: ServerKind,
    rng: StdRng,
    ttl: Duration,
    net: Net,
    store: Store,
    group: String,
    tables: String,
    dir: PathBuf,
    sink_url: String,
    sink_proxy: Proxy,
    sink: Client,
    members: Vec<MemberProc>,
    next: usize,
    played: Vec<Played>,
    started: Instant,
    generator: Option<tokio::task::JoinHandle<Result<u64, String>>>,
    stop_offering: Arc<std::sync::atomic::AtomicBool>,
    /// Every cut of a member from the whole store, for the checker.
    cuts: Vec<Cut>,
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

/// Returns Ok(false) when skipped.
async fn run(backend: ServerKind, seed: u64, long: bool) -> Result<bool, String> {
    let net = match available(backend, Net::new())? {
        Some(n) => n,
        None => return Ok(false),
    };
    let Some(sink_url) = available(ServerKind::Postgres, ServerKind::Postgres.shared().await)?
    else {
        return Ok(false);
    };
    let tag = format!("{:012x}", rand::random::<u64>() >> 16);
    let dir = std::env::temp_dir().join(format!("headcount-partitions-{tag}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let store = match available(backend, start_store(backend, &net, &dir).await)? {
        Some(s) => s,
        None => return Ok(false),
    };
    let sink_port = loopback_ports(&sink_url)
        .first()
        .copied()
        .ok_or("the sink URL names no 127.0.0.1 port")?;
    let sink_proxy = Proxy::start_at(
        net.harness_ip(),
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, sink_port),
    )
    .await
    .map_err(|e| format!("sink proxy: {e}"))?;
    let sink = connect(&sink_url).await?;
    let tables = format!("part_{tag}");
    let t = &tables;
    sink.batch_execute(&format!(
        "CREATE TABLE {t}_fence (part int PRIMARY KEY, token bigint NOT NULL);
         INSERT INTO {t}_fence SELECT g, 0 FROM generate_series(0, {}) g;
         CREATE TABLE {t}_offered (id bigint PRIMARY KEY, part int NOT NULL);
         CREATE INDEX ON {t}_offered (part);
         CREATE TABLE {t}_accepted (seq bigserial, id bigint NOT NULL, token bigint NOT NULL, member text NOT NULL);
         CREATE INDEX ON {t}_accepted (id);",
        PARTITIONS - 1
    ))
    .await
    .map_err(|e| format!("creating the sink tables: {e}"))?;
    // etcd leases are whole seconds with a server minimum.
    let ttl = if backend == ServerKind::EtcdCluster {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(1)
    };
    let mut run = Run {
        backend,
        rng: StdRng::seed_from_u64(seed),
        ttl,
        net,
        store,
        group: format!("part-{tag}"),
        tables,
        dir,
        sink_url,
        sink_proxy,
        sink,
        members: Vec::new(),
        next: 1,
        played: Vec::new(),
        started: Instant::now(),
        generator: None,
        stop_offering: Arc::default(),
        cuts: Vec::new(),
    };
    let result = run.play(long).await;
    let result = match result {
        Ok(()) => run.check(seed).await,
        Err(e) => Err(e),
    };
    for m in &mut run.members {
        if let Ok(None) = m.child.try_wait() {
            m.signal(libc::SIGCONT);
            let _ = m.child.kill();
            let _ = m.child.wait();
        }
    }
    let _ = run
        .sink
        .batch_execute(&format!(
            "DROP TABLE {t}_fence, {t}_offered, {t}_accepted",
            t = run.tables
        ))
        .await;
    if result.is_ok() && std::env::var_os("HEADCOUNT_PARTITIONS_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&run.dir);
    } else {
        eprintln!("partitions: member logs kept in {}", run.dir.display());
    }
    let net = run.net;
    // Stopping the servers in the net blocks briefly.
    let _ = tokio::task::spawn_blocking(move || drop(net)).await;
    result.map(|()| true)
}

impl Run {
    fn note(&self, line: &str) {
        eprintln!(
            "partitions::{}: [{:6.2} s] {line}",
            self.backend.name(),
            self.started.elapsed().as_secs_f64()
        );
    }

    fn heartbeat(&self) -> Duration {
        self.ttl / 3
    }

    fn store_url(&self, proxies: &[Proxy]) -> String {
        let hosts: Vec<String> = if self.store.direct {
            self.store.nodes.iter().map(ToString::to_string).collect()
        } else {
            proxies
                .iter()
                .map(|p| format!("{}:{}", self.net.harness_ip(), p.port()))
                .collect()
        };
        format!(
            "{}{}{}?timeout={}ms{}",
            self.store.prefix,
            hosts.join(","),
            self.store.suffix,
            OP_TIMEOUT.as_millis(),
            self.store.options
        )
    }

    /// The store host (index in `store.hosts`) that member path `k` leads to.
    fn path_node(&self, k: usize) -> Option<usize> {
        let addr = self.store.nodes.iter().chain(&self.store.also).nth(k)?;
        self.store.hosts.iter().position(|h| h.ip == *addr.ip())
    }

    /// The store host of the primary the Sentinels name now.
    async fn primary(&self) -> Result<usize, String> {
        let answer = redis_request(
            self.store.nodes[0],
            "SENTINEL get-master-addr-by-name mymaster",
        )
        .await;
        self.store
            .hosts
            .iter()
            .position(|h| answer.contains(&format!("\r\n{}\r\n", h.ip)))
            .ok_or_else(|| format!("no primary in the Sentinel's answer {answer:?}"))
    }

    /// The store host of the Redis Cluster primary that holds the group's slot: every key of a
    /// group carries the group as its hash tag, so one primary holds them all. A node that does
    /// not hold the slot answers `MOVED <slot> <ip>:<port>`. A cluster still down after the
    /// fault before (a primary cut off is marked failed, and Redis clears the mark only twice
    /// the node timeout after it is back) is asked again, for 10 s at most.
    async fn slot_owner(&self) -> Result<usize, String> {
        let asked = Instant::now();
        let answer = loop {
            let answer =
                redis_request(self.store.nodes[0], &format!("EXISTS {{{}}}", self.group)).await;
            if !answer.starts_with("-CLUSTERDOWN") || asked.elapsed() > Duration::from_secs(10) {
                break answer;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let ip = match answer.strip_prefix("-MOVED ") {
            Some(rest) => rest
                .split_whitespace()
                .nth(1)
                .and_then(|a| a.split(':').next())
                .unwrap_or_default()
                .to_owned(),
            None if answer.starts_with(':') => self.store.nodes[0].ip().to_string(),
            None => return Err(format!("no slot owner in the answer {answer:?}")),
        };
        self.store
            .hosts
            .iter()
            .position(|h| h.ip.to_string() == ip)
            .ok_or_else(|| format!("the slot owner {ip} is not a store host"))
    }

    /// Member `i`'s endpoints toward the store, in the order of the store's nodes (then the
    /// servers it reaches directly): its proxies' ports on the harness address, or the nodes.
    fn store_paths(&self, i: usize) -> Vec<Endpoint> {
        if self.store.direct {
            self.store
                .nodes
                .iter()
                .chain(&self.store.also)
                .map(|a| Endpoint::port(*a.ip(), a.port()))
                .collect()
        } else {
            self.members[i]
                .proxies
                .iter()
                .map(|p| Endpoint::port(self.net.harness_ip(), p.port()))
                .collect()
        }
    }

    async fn spawn_member(&mut self) -> Result<usize, String> {
        let name = format!("m{}", self.next);
        self.next += 1;
        let host = self
            .net
            .host(&name)
            .map_err(|e| format!("host {name}: {e}"))?;
        let mut proxies = Vec::new();
        for node in self.store.nodes.iter().filter(|_| !self.store.direct) {
            proxies.push(
                Proxy::start_at(self.net.harness_ip(), *node)
                    .await
                    .map_err(|e| format!("proxy for {name}: {e}"))?,
            );
        }
        let log = self.dir.join(format!("{name}.log"));
        let err = std::fs::File::create(self.dir.join(format!("{name}.err")))
            .map_err(|e| format!("{name}.err: {e}"))?;
        let store_url = self.store_url(&proxies);
        let sink_url = self.sink_url.replace(
            &format!("127.0.0.1:{}", loopback_ports(&self.sink_url)[0]),
            &format!("{}:{}", self.net.harness_ip(), self.sink_proxy.port()),
        );
        let bin = member_bin();
        let mut cmd = Command::new(&bin);
        cmd.args(["--store", &store_url])
            .args(["--sink", &sink_url])
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
            .stderr(err);
        let child = self
            .net
            .spawn(&host, cmd, None)
            .map_err(|e| format!("spawning {bin} in {name}: {e}"))?;
        self.note(&format!(
            "spawned {name} at {} (pid {})",
            host.ip,
            child.id()
        ));
        let m = MemberProc {
            name,
            host,
            child,
            proxies,
            log,
            state: State::Live,
        };
        self.members.push(m);
        Ok(self.members.len() - 1)
    }

    fn pick(&mut self) -> Result<usize, String> {
        let live: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].state == State::Live)
            .collect();
        live.choose(&mut self.rng)
            .copied()
            .ok_or_else(|| "no live member to pick".to_owned())
    }

    /// Members that exited on their own: a failure, with their stderr.
    fn check_alive(&mut self) -> Result<(), String> {
        for m in &mut self.members {
            if m.state == State::Live {
                if let Ok(Some(status)) = m.child.try_wait() {
                    let err = std::fs::read_to_string(self.dir.join(format!("{}.err", m.name)))
                        .unwrap_or_default();
                    return Err(format!("member {} exited ({status}): {err}", m.name));
                }
            }
        }
        Ok(())
    }

    /// Cuts member `i` from every store node, and records the cut for the checker (from once
    /// every rule is in place); the rules to heal it with [`Run::heal_cut`].
    fn cut_from_store(&mut self, i: usize) -> Result<StoreCut, String> {
        self.cut_from_nodes(i, None)
    }

    /// Cuts member `i` from the store host `only` (every node when `None`), recorded as a cut
    /// from the store: the caller makes sure that host is all of the store the member needs.
    fn cut_from_nodes(&mut self, i: usize, only: Option<usize>) -> Result<StoreCut, String> {
        let me = Endpoint::host(self.members[i].host.ip);
        let rules = self
            .store_paths(i)
            .into_iter()
            .enumerate()
            .filter(|(k, _)| only.is_none() || self.path_node(*k) == only)
            .map(|(_, to)| {
                self.net
                    .drop_between(me, to, false)
                    .map_err(|e| format!("cut: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.cuts.push(Cut {
            member: self.members[i].name.clone(),
            from: now_ms(),
            to: None,
        });
        Ok(StoreCut {
            cut: self.cuts.len() - 1,
            rules,
        })
    }

    /// Heals a cut (until just before its rules go).
    fn heal_cut(&mut self, cut: StoreCut) -> Result<(), String> {
        self.cuts[cut.cut].to = Some(now_ms());
        self.heal(cut.rules)
    }

    fn heal(&self, rules: Vec<Rule>) -> Result<(), String> {
        for r in rules {
            self.net.remove(r).map_err(|e| format!("heal: {e}"))?;
        }
        Ok(())
    }

    async fn sleep(&mut self, d: Duration) -> Result<(), String> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.check_alive()?;
            tokio::time::sleep(Duration::from_millis(50).min(end - Instant::now())).await;
        }
        Ok(())
    }

    fn start_generator(&mut self, over: Duration) {
        let (url, t) = (self.sink_url.clone(), self.tables.clone());
        let stop = self.stop_offering.clone();
        self.generator = Some(tokio::spawn(async move {
            let client = connect(&url).await?;
            let step = Duration::from_millis(100);
            let per_step: u64 = 10;
            let started = Instant::now();
            let mut next = 0u64;
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && started.elapsed() < over * 3 {
                client
                    .execute(
                        &format!(
                            "INSERT INTO {t}_offered SELECT g, g % {PARTITIONS} \
                             FROM generate_series($1::bigint, $2::bigint) g"
                        ),
                        &[&(next as i64), &((next + per_step) as i64 - 1)],
                    )
                    .await
                    .map_err(|e| format!("offering ids: {e}"))?;
                next += per_step;
                i += 1;
                tokio::time::sleep_until((started + step * i).into()).await;
            }
            Ok(next)
        }));
    }

    /// Waits until the live members are active under one view of exactly their slots, looking
    /// from a heartbeat after `since_ms` (a member back from a cut needs one to notice); the
    /// time from `since_ms` to the assignment that completed it (0 when nothing changed).
    async fn converge(&mut self, since_ms: u64, within: Duration) -> Result<Option<u64>, String> {
        let end = Instant::now() + within;
        self.sleep(self.heartbeat()).await?;
        loop {
            self.check_alive()?;
            if let Some(at) = self.converged_at() {
                return Ok(Some(at.saturating_sub(since_ms)));
            }
            if Instant::now() > end {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn converged_at(&self) -> Option<u64> {
        let mut latest = Vec::new();
        for m in self.members.iter().filter(|m| m.state == State::Live) {
            let text = std::fs::read_to_string(&m.log).ok()?;
            latest.push(
                text.lines()
                    .rev()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .find(|v| v["ev"] == "assign"),
            );
        }
        headcount_harness::history::one_active_view(latest.iter().map(Option::as_ref))
    }

    /// Plays the schedule drawn from the seed.
    async fn play(&mut self, long: bool) -> Result<(), String> {
        for _ in 0..4 {
            self.spawn_member().await?;
        }
        let bound = self.ttl * 4 + SLACK * 3;
        if self.converge(now_ms(), bound * 3).await?.is_none() {
            return Err("the first four members never converged".into());
        }
        let steps: Vec<Fault> = if long {
            // `HEADCOUNT_PARTITIONS_FAULTS=PrimaryIsolated,Cut` draws from those kinds only.
            let only = std::env::var("HEADCOUNT_PARTITIONS_FAULTS").unwrap_or_default();
            let mut all = Fault::ALL.to_vec();
            all.retain(|f| {
                f.applies(self.backend)
                    && (only.is_empty() || only.split(',').any(|o| o.trim() == format!("{f:?}")))
            });
            if all.is_empty() {
                return Err(format!(
                    "HEADCOUNT_PARTITIONS_FAULTS={only:?} names no fault that applies to {}",
                    self.backend.name()
                ));
            }
            (0..8)
                .map(|_| *all.choose(&mut self.rng).unwrap_or(&Fault::Cut))
                .collect()
        } else {
            Fault::SHORT
                .iter()
                .copied()
                .filter(|f| f.applies(self.backend))
                .collect()
        };
        self.note(&format!("schedule: {steps:?}"));
        self.start_generator(Duration::from_secs(8 * steps.len() as u64));
        for fault in steps {
            self.fault(fault).await?;
        }
        self.stop_offering
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    async fn fault(&mut self, fault: Fault) -> Result<(), String> {
        let ttl = self.ttl;
        let from = now_ms();
        let mut cut = Vec::new();
        let mut side = Vec::new();
        let what: String;
        match fault {
            Fault::Cut | Fault::CutLong => {
                let i = self.pick()?;
                let hold = if fault == Fault::Cut {
                    ttl.mul_f64(self.rng.random_range(0.3..0.8))
                } else {
                    ttl.mul_f64(self.rng.random_range(2.0..4.0))
                };
                what = format!("cut {} from the store for {hold:.1?}", self.members[i].name);
                self.note(&what);
                let rules = self.cut_from_store(i)?;
                cut.push(self.members[i].name.clone());
                self.sleep(hold).await?;
                self.heal_cut(rules)?;
            }
            Fault::SlotOwnerCut => {
                // Every key of the group is in one slot: the member loses its store, while the
                // other primaries still answer it (with redirections to the one it lost).
                let i = self.pick()?;
                let owner = self.slot_owner().await?;
                let hold = ttl.mul_f64(self.rng.random_range(0.3..4.0));
                what = format!(
                    "{} cut from {} (the primary of the group's slot) for {hold:.1?}, still \
                     reaching the others",
                    self.members[i].name, self.store.hosts[owner].name
                );
                self.note(&what);
                let rules = self.cut_from_nodes(i, Some(owner))?;
                cut.push(self.members[i].name.clone());
                self.sleep(hold).await?;
                self.heal_cut(rules)?;
            }
            Fault::CutDuringHandoff => {
                let i = self.pick()?;
                let j = self.spawn_member().await?;
                // The newcomer's join moves keys at the others' next heartbeat.
                self.sleep(self.heartbeat()).await?;
                let hold = ttl.mul_f64(self.rng.random_range(0.5..3.0));
                what = format!(
                    "{} joined; {} cut from the store for {hold:.1?} during the hand-off",
                    self.members[j].name, self.members[i].name
                );
                self.note(&what);
                let rules = self.cut_from_store(i)?;
                cut.push(self.members[i].name.clone());
                self.sleep(hold).await?;
                self.heal_cut(rules)?;
            }
            Fault::CutWhileLeaving => {
                let i = self.pick()?;
                let after = Duration::from_millis(self.rng.random_range(0..200));
                what = format!(
                    "{} leaves (SIGTERM) and is cut from the store {after:?} later",
                    self.members[i].name
                );
                self.note(&what);
                self.members[i].signal(libc::SIGTERM);
                self.members[i].state = State::Gone;
                self.sleep(after).await?;
                let rules = self.cut_from_store(i)?;
                cut.push(self.members[i].name.clone());
                self.sleep(ttl * 2).await?;
                self.heal_cut(rules)?;
                self.spawn_member().await?;
            }
            Fault::Flap => {
                let i = self.pick()?;
                let times = self.rng.random_range(3..8);
                what = format!(
                    "{}'s link to the store flaps {times} times",
                    self.members[i].name
                );
                self.note(&what);
                side.push(self.members[i].name.clone());
                for _ in 0..times {
                    let down = Duration::from_millis(self.rng.random_range(100..600));
                    let up = Duration::from_millis(self.rng.random_range(100..600));
                    let rules = self.cut_from_store(i)?;
                    self.sleep(down).await?;
                    self.heal_cut(rules)?;
                    self.sleep(up).await?;
                }
            }
            Fault::Delay => {
                let i = self.pick()?;
                let delay = Duration::from_millis(self.rng.random_range(200..800));
                let jitter = delay / 4;
                let hold = ttl * 3;
                what = format!(
                    "{}'s store traffic delayed {delay:?} ± {jitter:?} each way for {hold:?}",
                    self.members[i].name
                );
                self.note(&what);
                side.push(self.members[i].name.clone());
                self.members[i]
                    .proxies
                    .iter()
                    .for_each(|p| p.set_delay(delay, jitter));
                self.sleep(hold).await?;
                self.members[i]
                    .proxies
                    .iter()
                    .for_each(|p| p.set_delay(Duration::ZERO, Duration::ZERO));
            }
            Fault::Loss => {
                let i = self.pick()?;
                let percent = self.rng.random_range(10..=30);
                let hold = ttl * 3;
                what = format!(
                    "{} loses {percent} % of its store packets for {hold:?}",
                    self.members[i].name
                );
                self.note(&what);
                side.push(self.members[i].name.clone());
                let me = Endpoint::host(self.members[i].host.ip);
                let paths = self.store_paths(i);
                let mut rules = Vec::new();
                for to in paths {
                    rules.push(
                        self.net
                            .lose_between(me, to, percent)
                            .map_err(|e| format!("loss: {e}"))?,
                    );
                }
                self.sleep(hold).await?;
                self.heal(rules)?;
            }
            Fault::Kill => {
                let i = self.pick()?;
                what = format!(
                    "{} killed (SIGKILL), a replacement joins",
                    self.members[i].name
                );
                self.note(&what);
                side.push(self.members[i].name.clone());
                self.members[i].signal(libc::SIGKILL);
                let _ = self.members[i].child.wait();
                self.members[i].state = State::Gone;
                self.spawn_member().await?;
            }
            Fault::Pause => {
                let i = self.pick()?;
                let hold = ttl.mul_f64(self.rng.random_range(1.5..3.0));
                what = format!("{} paused (SIGSTOP) for {hold:.1?}", self.members[i].name);
                self.note(&what);
                side.push(self.members[i].name.clone());
                self.members[i].signal(libc::SIGSTOP);
                self.members[i].state = State::Paused;
                self.sleep(hold).await?;
                self.members[i].signal(libc::SIGCONT);
                self.members[i].state = State::Live;
            }
            Fault::StoreMinority | Fault::PrimaryIsolated => {
                // One etcd member cut from the other two, or the Redis primary cut from its
                // replica and the Sentinels, with some members reaching only it, the others
                // only the rest.
                let node = if fault == Fault::PrimaryIsolated {
                    self.primary().await?
                } else {
                    self.rng.random_range(0..self.store.hosts.len())
                };
                let live: Vec<usize> = (0..self.members.len())
                    .filter(|&i| self.members[i].state == State::Live)
                    .collect();
                let with: Vec<usize> = live
                    .iter()
                    .copied()
                    .filter(|_| self.rng.random_bool(0.4))
                    .collect();
                let hold = ttl.mul_f64(self.rng.random_range(0.5..4.0));
                what = format!(
                    "{} cut from the other store nodes with {:?} on its side for {hold:.1?}",
                    self.store.hosts[node].name,
                    with.iter()
                        .map(|&i| self.members[i].name.clone())
                        .collect::<Vec<_>>()
                );
                self.note(&what);
                side = with.iter().map(|&i| self.members[i].name.clone()).collect();
                let mut rules = Vec::new();
                let lone = Endpoint::host(self.store.hosts[node].ip);
                for (k, h) in self.store.hosts.iter().enumerate() {
                    if k != node {
                        rules.push(
                            self.net
                                .drop_between(lone, Endpoint::host(h.ip), false)
                                .map_err(|e| format!("cut: {e}"))?,
                        );
                    }
                }
                for &i in &live {
                    let me = Endpoint::host(self.members[i].host.ip);
                    for (k, to) in self.store_paths(i).into_iter().enumerate() {
                        if (self.path_node(k) == Some(node)) != with.contains(&i) {
                            rules.push(
                                self.net
                                    .drop_between(me, to, false)
                                    .map_err(|e| format!("cut: {e}"))?,
                            );
                        }
                    }
                }
                self.sleep(hold).await?;
                self.heal(rules)?;
            }
        }
        let healed = now_ms();
        // With `wait_replicas`, writes fail until the Sentinels have made the old primary a
        // replica of the new one and it has synced: about ten seconds after the heal.
        let bound = self.ttl * 6
            + SLACK * 4
            + if fault == Fault::PrimaryIsolated {
                Duration::from_secs(20)
            } else {
                Duration::ZERO
            };
        let converged = self.converge(healed, bound).await?;
        self.note(&format!(
            "healed; converged {}",
            converged.map_or("never".to_owned(), |c| format!("{c} ms after the heal"))
        ));
        if side.is_empty() {
            side.clone_from(&cut);
        }
        self.played.push(Played {
            kind: fault,
            what,
            from,
            healed,
            cut,
            side,
            converged_after_heal: converged,
        });
        if converged.is_none() {
            return Err(format!(
                "no convergence within {:?} after \"{}\"",
                bound,
                self.played.last().map_or("", |p| p.what.as_str())
            ));
        }
        Ok(())
    }

    /// Waits for the sink to catch up, reads the whole history and checks it.
    async fn check(&mut self, seed: u64) -> Result<(), String> {
        let offered = match self.generator.take() {
            Some(g) => g.await.map_err(|e| format!("generator: {e}"))??,
            None => 0,
        };
        let t = self.tables.clone();
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            self.check_alive()?;
            let row = self
                .sink
                .query_one(&format!("SELECT count(DISTINCT id) FROM {t}_accepted"), &[])
                .await
                .map_err(|e| format!("sink: {e}"))?;
            let n: i64 = row.get(0);
            if n as u64 >= offered || Instant::now() > end {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let sink: Vec<SinkRow> = self
            .sink
            .query(
                &format!("SELECT seq, id, token, member FROM {t}_accepted"),
                &[],
            )
            .await
            .map_err(|e| format!("sink: {e}"))?
            .iter()
            .map(|r| {
                let id: i64 = r.get(1);
                SinkRow {
                    seq: r.get::<_, i64>(0) as u64,
                    id: id as u64,
                    key: format!("p{}", id % PARTITIONS),
                    token: r.get::<_, i64>(2) as u64,
                    member: r.get(3),
                }
            })
            .collect();
        let mut h = History {
            ttl_ms: self.ttl.as_millis() as u64,
            slack_ms: 50,
            sink,
            offered,
            ..History::default()
        };
        for m in &self.members {
            let text = std::fs::read_to_string(&m.log).unwrap_or_default();
            for v in text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            {
                let s = |k: &str| v[k].as_str().map(str::to_owned);
                let n = |k: &str| v[k].as_u64();
                match v["ev"].as_str() {
                    Some("grant") => {
                        // A grant the checker cannot read is a failure, not a grant less: the
                        // checks would pass on what is left.
                        let (Some(member), Some(key), Some(token), Some(asked), Some(at)) =
                            (s("member"), s("key"), n("token"), n("asked"), n("t"))
                        else {
                            return Err(format!(
                                "{}: a grant without its token or time ({v}): is {} built from \
                                 this checkout?",
                                m.name,
                                member_bin()
                            ));
                        };
                        h.grants.push(GrantEvent {
                            member,
                            key,
                            token,
                            asked,
                            at,
                            deadline: n("deadline"),
                        });
                    }
                    Some("write") => {
                        if let (Some(member), Some(key), Some(token), Some(at)) =
                            (s("member"), s("key"), n("epoch"), n("t"))
                        {
                            h.writes.push(WriteEvent {
                                member,
                                key,
                                token,
                                at,
                                accepted: n("accepted").unwrap_or(0),
                            });
                        }
                    }
                    _ => {}
                }
            }
        }
        h.cuts.clone_from(&self.cuts);
        let read_at = now_ms();
        let windows: Vec<Window> = self
            .played
            .iter()
            .enumerate()
            .map(|(i, p)| Window {
                what: p.what.clone(),
                from: p.from,
                healed: p.healed,
                side: p.side.clone(),
                after_heal: self
                    .played
                    .get(i + 1)
                    .map_or(read_at, |n| n.from)
                    .saturating_sub(p.healed),
            })
            .collect();
        let stats = history::window_stats(&h, &windows);
        let anomalies = history::check(&h);
        for (p, s) in self.played.iter().zip(&stats) {
            // The cut members' grants while cut off, from each cut's start.
            let granted = h
                .cuts
                .iter()
                .filter(|c| c.from >= p.from && c.from <= p.healed)
                .filter_map(|c| history::granted_after_cut(&h, c))
                .max();
            print_row(self.backend, seed, p, s, granted, &anomalies);
        }
        self.note(&format!(
            "{} grants, {} writes, {} sink rows, {} ids offered, {} anomalies",
            h.grants.len(),
            h.writes.len(),
            h.sink.len(),
            h.offered,
            anomalies.len()
        ));
        if anomalies.is_empty() {
            Ok(())
        } else {
            let mut report = format!("{} anomalies:\n", anomalies.len());
            for a in &anomalies {
                report.push_str(&a.to_string());
            }
            report.push_str("faults played:\n");
            for p in &self.played {
                report.push_str(&format!(
                    "  {} .. {}: {} (cut: {:?})\n",
                    p.from, p.healed, p.what, p.cut
                ));
            }
            Err(report)
        }
    }
}

/// One result line per fault, for the docs' table.
fn print_row(
    backend: ServerKind,
    seed: u64,
    p: &Played,
    s: &WindowStats,
    granted_after_cut: Option<u64>,
    anomalies: &[history::Anomaly],
) {
    eprintln!(
        "RESULT backend={} seed={seed} kind={:?} fault={:?} gap_struck_side_ms={} gap_other_side_ms={} \
         gap_after_heal_ms={} converged_after_heal_ms={} keys_moved={} granted_after_cut_ms={} \
         run_anomalies={}",
        backend.name(),
        p.kind,
        p.what,
        s.gap_side,
        s.gap_others,
        s.gap_after,
        p.converged_after_heal
            .map_or("never".to_owned(), |c| c.to_string()),
        s.moved,
        granted_after_cut.map_or("-".to_owned(), |g| g.to_string()),
        anomalies.len()
    );
}

/// The kinds of fault a schedule draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Cut from the store for less than a lease.
    Cut,
    /// Cut from the store for several leases.
    CutLong,
    CutDuringHandoff,
    CutWhileLeaving,
    Flap,
    Delay,
    Loss,
    Kill,
    Pause,
    /// A store node cut from the others, with some members on its side.
    StoreMinority,
    /// Redis Cluster: a member cut from the primary that holds the group's slot, still reaching
    /// the other primaries.
    SlotOwnerCut,
    /// The Redis primary cut from its replica and the Sentinels, with some members on its side.
    PrimaryIsolated,
}

impl Fault {
    const ALL: [Fault; 12] = [
        Fault::Cut,
        Fault::CutLong,
        Fault::CutDuringHandoff,
        Fault::CutWhileLeaving,
        Fault::Flap,
        Fault::Delay,
        Fault::Loss,
        Fault::Kill,
        Fault::Pause,
        Fault::StoreMinority,
        Fault::SlotOwnerCut,
        Fault::PrimaryIsolated,
    ];

    /// The short schedule that runs with the normal tests.
    const SHORT: [Fault; 7] = [
        Fault::Cut,
        Fault::CutLong,
        Fault::Delay,
        Fault::Loss,
        Fault::StoreMinority,
        Fault::SlotOwnerCut,
        Fault::PrimaryIsolated,
    ];

    fn applies(self, backend: ServerKind) -> bool {
        match self {
            Fault::StoreMinority => {
                matches!(backend, ServerKind::EtcdCluster | ServerKind::RedisCluster)
            }
            Fault::SlotOwnerCut => backend == ServerKind::RedisCluster,
            Fault::PrimaryIsolated => backend == ServerKind::RedisSentinel,
            // The Sentinel's and the Cluster's data paths go straight to the servers they name:
            // no proxy to delay.
            Fault::Delay => !matches!(
                backend,
                ServerKind::RedisSentinel | ServerKind::RedisCluster
            ),
            _ => true,
        }
    }
}
