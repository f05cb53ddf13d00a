//! PgBouncer in transaction mode in front of a PostgreSQL server of the harness: the pooler most
//! production PostgreSQL sits behind, where each transaction may run on another server
//! connection, so nothing that lives in a server session (named prepared statements, `SET`,
//! session advisory locks, `LISTEN`) carries from one transaction to the next.
//!
//! Started from its own binary (`pgbouncer`, from PATH or `/usr/sbin`, where Debian installs it)
//! with a generated ini in a temp dir, listening on a free loopback port, with a small pool
//! ([`POOL_SIZE`] server connections) so that clients share server connections all the time.

use std::fs;
use std::io;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::postgres::{self, PgControl, PgServer};
use super::process::{self, RunAs, ServerProcess};
use super::Unavailable;
use headcount_conformance::ServerControl;

/// The `pgbouncer` binary to use instead of looking on PATH and in `/usr/sbin`.
pub const BIN_VAR: &str = "HEADCOUNT_TEST_PGBOUNCER_BIN";

/// Server connections per database and user (`default_pool_size`): small, so that the store's
/// connections (16 per store, and the tests run several stores at once) take turns on them.
pub const POOL_SIZE: usize = 2;

const INSTALL_HINT: &str = "apt-get install pgbouncer (the tests start their own; the \
                            package's service is not used), or set HEADCOUNT_TEST_PGBOUNCER_URL \
                            to a PostgreSQL URL through a pooler of yours";

/// How long PgBouncer may take to listen.
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// Finds `pgbouncer`: `HEADCOUNT_TEST_PGBOUNCER_BIN` if set (and only it), else the first PATH
/// entry holding it, else `/usr/sbin/pgbouncer` (Debian's place, which is not on a normal user's
/// PATH).
pub fn find_bin() -> Result<PathBuf, Unavailable> {
    if let Some(bin) = std::env::var_os(BIN_VAR) {
        let bin = PathBuf::from(bin);
        return if is_executable(&bin) {
            Ok(bin)
        } else {
            Err(Unavailable::Missing(format!(
                "no pgbouncer at {BIN_VAR}={}; {INSTALL_HINT}",
                bin.display()
            )))
        };
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("pgbouncer"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin/pgbouncer")])
        .find(|b| is_executable(b))
        .ok_or_else(|| {
            Unavailable::Missing(format!(
                "no pgbouncer found on PATH or in /usr/sbin; {INSTALL_HINT}"
            ))
        })
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A PgBouncer started by the harness in front of one [`PgServer`], in transaction mode, trusting
/// every user its `userlist.txt` names (`postgres`), as the server trusts them.
#[derive(Debug)]
pub struct PgBouncer {
    bin: PathBuf,
    root: PathBuf,
    ini: PathBuf,
    log: PathBuf,
    port: AtomicU16,
    run_as: Option<RunAs>,
    process: Arc<ServerProcess>,
    op_timeout: Option<Duration>,
    server: Arc<PgServer>,
    pool_mode: &'static str,
}

impl PgBouncer {
    /// Starts a PostgreSQL server and a PgBouncer in front of it. `op_timeout` goes into the
    /// URL's `timeout` option when given.
    pub fn start_new(op_timeout: Option<Duration>) -> Result<PgBouncer, Unavailable> {
        // Look for PgBouncer first: without it, starting PostgreSQL is wasted.
        find_bin()?;
        let server = PgServer::start_new(op_timeout)?;
        Self::start_in_front(Arc::new(server), op_timeout)
    }

    /// Starts a PgBouncer in transaction mode in front of `server`.
    pub fn start_in_front(
        server: Arc<PgServer>,
        op_timeout: Option<Duration>,
    ) -> Result<PgBouncer, Unavailable> {
        Self::start_in_front_as(server, op_timeout, "transaction")
    }

    /// Starts a PgBouncer in front of `server` with `pool_mode` (`session`, `transaction`).
    pub fn start_in_front_as(
        server: Arc<PgServer>,
        op_timeout: Option<Duration>,
        pool_mode: &'static str,
    ) -> Result<PgBouncer, Unavailable> {
        let bin = find_bin()?;
        // PgBouncer refuses to run as root, like PostgreSQL: run it as the server's user.
        let run_as = postgres::run_as()?;
        let failed = |what: &str, e: io::Error| {
            Unavailable::Failed(format!("PgBouncer from {}: {what}: {e}", bin.display()))
        };
        let root = process::temp_dir("pgbouncer").map_err(|e| failed("temp dir", e))?;
        let bouncer = PgBouncer {
            bin: bin.clone(),
            ini: root.join("pgbouncer.ini"),
            log: root.join("pgbouncer.log"),
            root,
            port: AtomicU16::new(0),
            run_as,
            process: ServerProcess::new(libc::SIGTERM),
            op_timeout,
            server,
            pool_mode,
        };
        process::start_on_free_port(&bouncer.log, |port| {
            bouncer.port.store(port, Ordering::SeqCst);
            bouncer.configure()?;
            bouncer.start()
        })
        .map_err(|e| failed("starting it", e))?;
        Ok(bouncer)
    }

    /// Writes `pgbouncer.ini` and `userlist.txt`.
    fn configure(&self) -> io::Result<()> {
        let sock = self.root.join("sock");
        if !sock.is_dir() {
            fs::create_dir(&sock)?;
        }
        let userlist = self.root.join("userlist.txt");
        fs::write(&userlist, "\"postgres\" \"\"\n")?;
        let ini = format!(
            "[databases]\n\
             * = host=127.0.0.1 port={server_port}\n\
             \n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir = {sock}\n\
             auth_type = trust\n\
             auth_file = {userlist}\n\
             pidfile = {pid}\n\
             pool_mode = {pool_mode}\n\
             default_pool_size = {pool_size}\n\
             min_pool_size = 0\n\
             reserve_pool_size = 0\n\
             max_client_conn = 2000\n\
             ; After a failed login to the server (it was killed), try again after 1 s, not\n\
             ; the default 15 s, so a restarted server is found soon.\n\
             server_login_retry = 1\n\
             log_connections = 0\n\
             log_disconnections = 0\n",
            server_port = self.server.port(),
            port = self.port(),
            sock = sock.display(),
            userlist = userlist.display(),
            pid = self.root.join("pgbouncer.pid").display(),
            pool_mode = self.pool_mode,
            // In session mode each client connection holds a server connection for its whole
            // life: a pool of two would leave a third client (a listener) waiting.
            pool_size = if self.pool_mode == "session" {
                64
            } else {
                POOL_SIZE
            },
        );
        fs::write(&self.ini, ini)?;
        process::open_log(&self.log, self.run_as)?;
        if let Some(user) = self.run_as {
            user.chown_tree(&self.root)?;
        }
        Ok(())
    }

    /// Starts PgBouncer (a no-op when it runs) and waits until it accepts connections.
    pub fn start(&self) -> io::Result<()> {
        if self.process.running() {
            return Ok(());
        }
        let mut command = Command::new(&self.bin);
        command.arg(&self.ini).current_dir(&self.root);
        self.process.spawn_logged(command, &self.log, self.run_as)?;
        self.wait_ready()
    }

    fn wait_ready(&self) -> io::Result<()> {
        self.process
            .wait_ready("pgbouncer", READY_DEADLINE, &[&self.log], || {
                TcpStream::connect(("127.0.0.1", self.port())).is_ok()
            })
    }

    /// The store URL through PgBouncer.
    pub fn url(&self) -> String {
        let mut url = format!("postgres://postgres@127.0.0.1:{}/postgres", self.port());
        if let Some(t) = self.op_timeout {
            url.push_str(&format!("?timeout={}ms", t.as_millis()));
        }
        url
    }

    /// The URL of the PostgreSQL server behind PgBouncer, bypassing it.
    pub fn server_url(&self) -> String {
        self.server.url()
    }

    /// The port PgBouncer listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// The PostgreSQL server behind PgBouncer.
    pub fn server(&self) -> &Arc<PgServer> {
        &self.server
    }

    /// PgBouncer's log (its own lines; the server's are in the server's directory).
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops PgBouncer and removes its directory (the server goes with its last handle).
    pub fn shutdown(&self) {
        self.process.stop(Duration::from_secs(5));
        process::remove_temp_dir(&self.root);
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// [`ServerControl`] over the PostgreSQL server behind a [`PgBouncer`] dedicated to one case:
/// kill, start, pause and resume act on the server, while PgBouncer keeps running (as it does in
/// production when the database restarts).
#[derive(Debug)]
pub struct PgBouncerControl {
    server: PgControl,
    _bouncer: Arc<PgBouncer>,
}

impl PgBouncerControl {
    /// Control over the server behind `bouncer`, whose store URL carries `timeout`.
    pub fn new(bouncer: Arc<PgBouncer>, timeout: Duration) -> Self {
        PgBouncerControl {
            server: PgControl::new(bouncer.server().clone(), timeout),
            _bouncer: bouncer,
        }
    }
}

#[async_trait]
impl ServerControl for PgBouncerControl {
    fn op_timeout(&self) -> Duration {
        self.server.op_timeout()
    }

    async fn kill(&self) -> io::Result<()> {
        self.server.kill().await
    }

    async fn start(&self) -> io::Result<()> {
        self.server.start().await
    }

    async fn pause(&self) -> io::Result<()> {
        self.server.pause().await
    }

    async fn resume(&self) -> io::Result<()> {
        self.server.resume().await
    }
}
