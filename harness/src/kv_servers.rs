//! Redis (single, Cluster, and a primary with a replica behind three Sentinels) and etcd (single member and 3-member cluster) from their own
//! binaries (`redis-server`, `redis-cli`, `etcd`), each in a temp dir on free loopback ports,
//! with the same cleanup guarantees as PostgreSQL (see [`super::process`]).

use std::io::{self, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::process::{self, ServerProcess};
use super::Unavailable;
use headcount_conformance::ServerControl;

/// The master name the Sentinels of [`KvStore::redis_sentinel`] watch.
pub const SENTINEL_MASTER: &str = "mymaster";

/// How long a server may take to accept requests.
const READY_DEADLINE: Duration = Duration::from_secs(60);

/// Finds an executable on PATH (or in `/usr/bin`, `/usr/local/bin`).
fn find_bin(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// What kind of server process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Redis {
        cluster: bool,
    },
    /// `redis-server <dir>/sentinel.conf --sentinel`: Sentinel mode of the same binary.
    Sentinel,
    Etcd,
}

/// One server process (a Redis server, or one etcd member) with its ports, directory and log.
#[derive(Debug)]
pub struct KvServer {
    kind: Kind,
    bin: PathBuf,
    root: PathBuf,
    log: PathBuf,
    /// The client port.
    pub port: u16,
    /// etcd's peer port, Redis Cluster's bus port (`cluster-port`: the default, port + 10000,
    /// overflows for ephemeral ports above 55535).
    peer_port: u16,
    /// The port a Redis Cluster node announces to clients (a proxy in front of it), if not its
    /// own.
    announce_port: Option<u16>,
    /// etcd's `--name`, `--initial-cluster` and `--initial-cluster-token`.
    name: String,
    initial_cluster: String,
    token: String,
    /// Arguments appended after the defaults (for Redis, later arguments win).
    extra_args: Vec<String>,
    process: Arc<ServerProcess>,
}

impl KvServer {
    fn new(kind: Kind, bin: PathBuf, tag: &str) -> io::Result<KvServer> {
        let root = process::temp_dir(tag)?;
        Ok(KvServer {
            kind,
            bin,
            log: root.join("server.log"),
            root,
            port: process::free_port()?,
            peer_port: process::free_port()?,
            name: String::new(),
            initial_cluster: String::new(),
            token: String::new(),
            announce_port: None,
            extra_args: Vec::new(),
            // redis-server shuts down on SIGTERM, etcd too.
            process: ServerProcess::new(libc::SIGTERM),
        })
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.bin);
        let port = self.port.to_string();
        match self.kind {
            Kind::Redis { cluster } => {
                command
                    .args(["--port", &port, "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no"])
                    .args(["--daemonize", "no", "--protected-mode", "no"])
                    .arg("--dir")
                    .arg(&self.root)
                    .arg("--logfile")
                    .arg(&self.log);
                if cluster {
                    let bus = self.peer_port.to_string();
                    command
                        .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                        .args(["--cluster-port", &bus])
                        .arg("--cluster-config-file")
                        .arg(self.root.join("nodes.conf"));
                    if let Some(announce) = self.announce_port {
                        command
                            .args(["--cluster-announce-ip", "127.0.0.1"])
                            .args(["--cluster-announce-port", &announce.to_string()])
                            .args(["--cluster-announce-bus-port", &bus]);
                    }
                }
            }
            Kind::Sentinel => {
                command
                    .arg(self.root.join("sentinel.conf"))
                    .arg("--sentinel");
            }
            Kind::Etcd => {
                let client = format!("http://127.0.0.1:{}", self.port);
                let peer = format!("http://127.0.0.1:{}", self.peer_port);
                command
                    .args(["--name", &self.name])
                    .arg("--data-dir")
                    .arg(self.root.join("data"))
                    .args(["--listen-client-urls", &client])
                    .args(["--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer])
                    .args(["--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &self.initial_cluster])
                    .args(["--initial-cluster-state", "new"])
                    .args(["--initial-cluster-token", &self.token])
                    .args(["--log-level", "warn"]);
            }
        }
        command.args(&self.extra_args);
        command.current_dir(&self.root);
        command
    }

    /// Starts the process (a no-op when it runs) without waiting for it to be ready.
    fn spawn(&self) -> io::Result<()> {
        if self.process.running() {
            return Ok(());
        }
        let mut command = self.command();
        let log = process::open_log(&self.root.join("stdout.log"), None)?;
        command
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.process.spawn(command, None)
    }

    /// Starts the process and waits until it answers.
    pub fn start(&self) -> io::Result<()> {
        self.spawn()?;
        self.wait_ready()
    }

    fn wait_ready(&self) -> io::Result<()> {
        let stdout = self.root.join("stdout.log");
        self.process.wait_ready(
            &self.bin.display().to_string(),
            READY_DEADLINE,
            &[&self.log, &stdout],
            || self.ready(),
        )
    }

    fn ready(&self) -> bool {
        match self.kind {
            Kind::Redis { .. } | Kind::Sentinel => {
                request(self.port, b"PING\r\n").is_ok_and(|r| r.starts_with("+PONG"))
            }
            Kind::Etcd => request(
                self.port,
                b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            )
            .is_ok_and(|r| r.contains("\"health\":\"true\"")),
        }
    }

    /// Kills the process (SIGKILL) and waits until it is gone.
    pub fn kill(&self) -> io::Result<()> {
        self.process.kill()
    }

    /// Stops the process with SIGSTOP.
    pub fn pause(&self) -> io::Result<()> {
        self.process.pause()
    }

    /// Continues it with SIGCONT.
    pub fn resume(&self) -> io::Result<()> {
        self.process.resume()
    }

    /// For an etcd member: whether it is the cluster's leader right now (from its own status).
    pub fn is_etcd_leader(&self) -> Option<bool> {
        let status = request(
            self.port,
            b"POST /v3/maintenance/status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        )
        .ok()?;
        let field = |name: &str| {
            let start = status.find(&format!("\"{name}\":\""))? + name.len() + 4;
            let len = status[start..].find('"')?;
            Some(status[start..start + len].to_owned())
        };
        Some(field("member_id")? == field("leader")?)
    }

    /// Stops the server and removes its directory.
    pub fn shutdown(&self) {
        self.process.stop(Duration::from_secs(5));
        process::remove_temp_dir(&self.root);
    }

    /// The temp dir of this server.
    pub fn dir(&self) -> &Path {
        &self.root
    }
}

impl Drop for KvServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Sends `bytes` to 127.0.0.1:`port` and returns what comes back within a second.
fn request(port: u16, bytes: &[u8]) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(1),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    s.write_all(bytes)?;
    let mut buf = vec![0u8; 4096];
    let mut got = 0;
    // Enough for a PONG or a small HTTP answer; stop at EOF, a full buffer or a timeout.
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                if buf[..got].ends_with(b"\r\n") && buf[0] == b'+' {
                    break;
                }
            }
            Err(_) if got > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&buf[..got]).into_owned())
}

/// One or several servers forming one store, and its URL.
#[derive(Debug)]
pub struct KvStore {
    /// The servers (one, or three for a cluster).
    pub servers: Vec<KvServer>,
    scheme: &'static str,
    op_timeout: Option<Duration>,
    /// The ports the URL names instead of the servers' own (proxies in front of them, or the
    /// Sentinels).
    url_ports: Option<Vec<u16>>,
    /// The URL's path: `/mymaster` for Sentinel, else empty.
    path: &'static str,
}

impl KvStore {
    /// The store URL.
    pub fn url(&self) -> String {
        let ports: Vec<u16> = match &self.url_ports {
            Some(ports) => ports.clone(),
            None => self.servers.iter().map(|s| s.port).collect(),
        };
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut url = format!("{}://{}{}", self.scheme, hosts.join(","), self.path);
        if let Some(t) = self.op_timeout {
            url.push_str(&format!("?timeout={}ms", t.as_millis()));
        }
        url
    }

    /// A single Redis server.
    pub fn redis(op_timeout: Option<Duration>) -> Result<KvStore, Unavailable> {
        Self::redis_with(op_timeout, &[])
    }

    /// A single Redis server with `args` after the harness's own (which they override: the
    /// defaults include `--appendonly no`), such as `["--appendonly", "yes", "--appendfsync",
    /// "always"]` for a durable server.
    pub fn redis_with(op_timeout: Option<Duration>, args: &[&str]) -> Result<KvStore, Unavailable> {
        retry_busy_ports(|| Self::redis_once(op_timeout, args))
    }

    fn redis_once(op_timeout: Option<Duration>, args: &[&str]) -> Result<KvStore, Unavailable> {
        let bin = redis_bin()?;
        let failed = |e: io::Error| Unavailable::Failed(format!("redis-server: {e}"));
        let mut server =
            KvServer::new(Kind::Redis { cluster: false }, bin, "redis").map_err(failed)?;
        server.extra_args = args.iter().map(|a| (*a).to_owned()).collect();
        server.start().map_err(failed)?;
        Ok(KvStore {
            servers: vec![server],
            scheme: "redis",
            op_timeout,
            url_ports: None,
            path: "",
        })
    }

    /// A Redis Cluster of three primaries (no replicas), made with `redis-cli --cluster create`.
    /// With `announce` (one `(proxy port, upstream slot)` per node), each node announces the
    /// proxy's port to clients and the slot is set to the node's own port, so every client
    /// connection goes through the proxies.
    pub fn redis_cluster(
        op_timeout: Option<Duration>,
        announce: Option<Vec<(u16, super::proxy::Upstream)>>,
    ) -> Result<KvStore, Unavailable> {
        retry_busy_ports(|| Self::redis_cluster_once(op_timeout, announce.as_deref()))
    }

    fn redis_cluster_once(
        op_timeout: Option<Duration>,
        announce: Option<&[(u16, super::proxy::Upstream)]>,
    ) -> Result<KvStore, Unavailable> {
        let bin = redis_bin()?;
        let cli = find_bin("redis-cli").ok_or_else(|| {
            Unavailable::Missing(
                "no redis-cli on PATH, needed to create a Redis Cluster; apt-get install redis-server (or set HEADCOUNT_TEST_REDIS_CLUSTER_URL)".into(),
            )
        })?;
        let failed = |e: io::Error| Unavailable::Failed(format!("Redis Cluster: {e}"));
        let servers = (0..3)
            .map(|_| KvServer::new(Kind::Redis { cluster: true }, bin.clone(), "redis-cluster"))
            .collect::<io::Result<Vec<_>>>()
            .map_err(failed)?;
        let mut servers = servers;
        let mut url_ports = None;
        if let Some(announce) = announce {
            for (s, (proxy_port, upstream)) in servers.iter_mut().zip(announce) {
                s.announce_port = Some(*proxy_port);
                upstream.set(s.port);
            }
            url_ports = Some(announce.iter().map(|(p, _)| *p).collect());
        }
        for s in &servers {
            s.spawn().map_err(failed)?;
        }
        for s in &servers {
            s.wait_ready().map_err(failed)?;
        }
        let mut create = Command::new(cli);
        create.arg("--cluster").arg("create");
        for s in &servers {
            create.arg(format!("127.0.0.1:{}", s.port));
        }
        create.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let log = servers[0].dir().join("create.log");
        process::run(create, None, &log, Duration::from_secs(60)).map_err(failed)?;
        // Every node must know every slot before the store may use it.
        let end = Instant::now() + READY_DEADLINE;
        for s in &servers {
            while !request(s.port, b"CLUSTER INFO\r\n")
                .is_ok_and(|r| r.contains("cluster_state:ok"))
            {
                if Instant::now() > end {
                    return Err(Unavailable::Failed(
                        "Redis Cluster did not reach cluster_state:ok".into(),
                    ));
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(KvStore {
            servers,
            scheme: "redis+cluster",
            op_timeout,
            url_ports,
            path: "",
        })
    }

    /// A primary, one replica (`replicaof`) and three Sentinels watching them as
    /// [`SENTINEL_MASTER`] (quorum 2, `down-after-milliseconds` 500, `failover-timeout` 3 s);
    /// the URL is `redis+sentinel://<the three Sentinels>/mymaster`. `servers` holds the
    /// primary, the replica, then the Sentinels ([`KvStore::sentinel_ports`]).
    pub fn redis_sentinel(op_timeout: Option<Duration>) -> Result<KvStore, Unavailable> {
        retry_busy_ports(|| Self::redis_sentinel_once(op_timeout))
    }

    fn redis_sentinel_once(op_timeout: Option<Duration>) -> Result<KvStore, Unavailable> {
        let bin = redis_bin()?;
        let failed = |e: io::Error| Unavailable::Failed(format!("Redis Sentinel: {e}"));
        let redis = Kind::Redis { cluster: false };
        let primary = KvServer::new(redis, bin.clone(), "redis-sentinel").map_err(failed)?;
        let mut replica = KvServer::new(redis, bin.clone(), "redis-sentinel").map_err(failed)?;
        let primary_port = primary.port.to_string();
        replica.extra_args = ["--replicaof", "127.0.0.1", &primary_port]
            .map(str::to_owned)
            .to_vec();
        let mut servers = vec![primary, replica];
        for _ in 0..3 {
            let s = KvServer::new(Kind::Sentinel, bin.clone(), "redis-sentinel").map_err(failed)?;
            let conf = format!(
                "port {}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {}\nlogfile {}\n\
                 sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} 500\n\
                 sentinel failover-timeout {SENTINEL_MASTER} 3000\n\
                 sentinel parallel-syncs {SENTINEL_MASTER} 1\n",
                s.port,
                s.root.display(),
                s.log.display()
            );
            std::fs::write(s.root.join("sentinel.conf"), conf).map_err(failed)?;
            servers.push(s);
        }
        for s in &servers {
            s.spawn().map_err(failed)?;
        }
        for s in &servers {
            s.wait_ready().map_err(failed)?;
        }
        let store = KvStore {
            servers,
            scheme: "redis+sentinel",
            op_timeout,
            url_ports: None,
            path: "",
        };
        let sentinels = store.sentinel_ports();
        // Ready once every Sentinel sees the replica and the other two: a failover needs both.
        let end = Instant::now() + READY_DEADLINE;
        for port in &sentinels {
            while !request(*port, b"INFO sentinel\r\n")
                .is_ok_and(|r| r.contains("status=ok") && r.contains("slaves=1,sentinels=3"))
            {
                if Instant::now() > end {
                    return Err(Unavailable::Failed(format!(
                        "the Sentinels did not all see the replica and each other within \
                         {READY_DEADLINE:?}: {}",
                        request(*port, b"INFO sentinel\r\n").unwrap_or_default()
                    )));
                }
                thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(KvStore {
            url_ports: Some(sentinels),
            path: "/mymaster",
            ..store
        })
    }

    /// The Sentinels' ports of a [`KvStore::redis_sentinel`] store (empty for other stores).
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.servers
            .iter()
            .filter(|s| s.kind == Kind::Sentinel)
            .map(|s| s.port)
            .collect()
    }

    /// An etcd cluster of `members` members (1 or 3).
    pub fn etcd(members: usize, op_timeout: Option<Duration>) -> Result<KvStore, Unavailable> {
        Self::etcd_with(members, op_timeout, &[])
    }

    /// An etcd cluster of `members` members with `args` after the harness's own, such as
    /// `--auth-token jwt,...` for short-lived auth tokens.
    pub fn etcd_with(
        members: usize,
        op_timeout: Option<Duration>,
        args: &[&str],
    ) -> Result<KvStore, Unavailable> {
        retry_busy_ports(|| Self::etcd_once(members, op_timeout, args))
    }

    fn etcd_once(
        members: usize,
        op_timeout: Option<Duration>,
        args: &[&str],
    ) -> Result<KvStore, Unavailable> {
        let bin = find_bin("etcd").ok_or_else(|| {
            Unavailable::Missing(
                "no etcd on PATH; apt-get install etcd-server (or set HEADCOUNT_TEST_ETCD_URL / HEADCOUNT_TEST_ETCD_CLUSTER_URL)".into(),
            )
        })?;
        let failed = |e: io::Error| Unavailable::Failed(format!("etcd: {e}"));
        let mut servers = (0..members)
            .map(|_| KvServer::new(Kind::Etcd, bin.clone(), "etcd"))
            .collect::<io::Result<Vec<_>>>()
            .map_err(failed)?;
        let tag = rand::random::<u32>();
        for (i, s) in servers.iter_mut().enumerate() {
            s.name = format!("hc{tag:08x}m{i}");
            s.token = format!("hc{tag:08x}");
            s.extra_args = args.iter().map(|a| (*a).to_owned()).collect();
        }
        let initial = servers
            .iter()
            .map(|s| format!("{}=http://127.0.0.1:{}", s.name, s.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        for s in &mut servers {
            s.initial_cluster = initial.clone();
        }
        for s in &servers {
            s.spawn().map_err(failed)?;
        }
        for s in &servers {
            s.wait_ready().map_err(failed)?;
        }
        Ok(KvStore {
            servers,
            scheme: "etcd",
            op_timeout,
            url_ports: None,
            path: "",
        })
    }
}

/// Runs `start` again (with new ports: every attempt makes its servers anew) while it fails
/// because a port it chose was taken between the probe and the server's bind; a failed attempt's
/// servers are stopped when it drops them.
fn retry_busy_ports(
    mut start: impl FnMut() -> Result<KvStore, Unavailable>,
) -> Result<KvStore, Unavailable> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match start() {
            Err(Unavailable::Failed(why)) if attempt < 5 && process::port_in_use(&why) => {}
            other => return other,
        }
    }
}

fn redis_bin() -> Result<PathBuf, Unavailable> {
    find_bin("redis-server").ok_or_else(|| {
        Unavailable::Missing(
            "no redis-server on PATH; apt-get install redis-server (or set HEADCOUNT_TEST_REDIS_URL)"
                .into(),
        )
    })
}

/// [`ServerControl`] over a [`KvStore`] dedicated to one case: its server, or for an etcd
/// cluster one *follower* (chosen when it is killed; losing the leader adds an election, which
/// is etcd's documented unavailability window, not what the member-loss case is about).
#[derive(Debug, Clone)]
pub struct KvControl {
    store: Arc<KvStore>,
    timeout: Duration,
    target: Arc<std::sync::Mutex<usize>>,
    whole: bool,
}

impl KvControl {
    /// Control over `store`'s first server, whose URL carries `timeout`.
    pub fn new(store: Arc<KvStore>, timeout: Duration) -> Self {
        KvControl {
            store,
            timeout,
            target: Arc::default(),
            whole: false,
        }
    }

    /// Control over every server of `store` at once: kill, start, pause and resume act on the
    /// whole cluster.
    pub fn whole(store: Arc<KvStore>, timeout: Duration) -> Self {
        KvControl {
            whole: true,
            ..KvControl::new(store, timeout)
        }
    }

    /// Runs `f` on every server, in a blocking thread.
    async fn all(&self, f: fn(&KvServer) -> io::Result<()>) -> io::Result<()> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.servers.iter().try_for_each(f))
            .await
            .map_err(io::Error::other)?
    }

    fn target(&self) -> usize {
        *self
            .target
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Picks a follower of a several-member etcd cluster as the member to act on.
    fn pick_follower(&self) {
        if self.store.servers.len() < 2 {
            return;
        }
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            let leaders: Vec<Option<bool>> = self
                .store
                .servers
                .iter()
                .map(KvServer::is_etcd_leader)
                .collect();
            if let Some(i) = leaders.iter().position(|l| *l == Some(false)) {
                if leaders.contains(&Some(true)) {
                    *self
                        .target
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = i;
                    return;
                }
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    async fn blocking(
        &self,
        f: impl FnOnce(&KvServer) -> io::Result<()> + Send + 'static,
    ) -> io::Result<()> {
        let store = self.store.clone();
        let target = self.target();
        tokio::task::spawn_blocking(move || match store.servers.get(target) {
            Some(s) => f(s),
            None => Err(io::Error::other("no server")),
        })
        .await
        .map_err(io::Error::other)?
    }
}

#[async_trait]
impl ServerControl for KvControl {
    fn op_timeout(&self) -> Duration {
        self.timeout
    }

    async fn kill(&self) -> io::Result<()> {
        if self.whole {
            return self.all(KvServer::kill).await;
        }
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.pick_follower())
            .await
            .map_err(io::Error::other)?;
        self.blocking(KvServer::kill).await
    }

    async fn start(&self) -> io::Result<()> {
        if self.whole {
            // Every member first: an etcd member is healthy only once a quorum runs.
            self.all(KvServer::spawn).await?;
            return self.all(KvServer::wait_ready).await;
        }
        self.blocking(KvServer::start).await
    }

    async fn pause(&self) -> io::Result<()> {
        if self.whole {
            return self.all(KvServer::pause).await;
        }
        self.blocking(KvServer::pause).await
    }

    async fn resume(&self) -> io::Result<()> {
        if self.whole {
            return self.all(KvServer::resume).await;
        }
        self.blocking(KvServer::resume).await
    }
}
