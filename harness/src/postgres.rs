//! PostgreSQL from its own binaries (`initdb`, `postgres`), in a temp dir on a free loopback port.
//!
//! `initdb` runs once per machine and PostgreSQL version into a cached template data directory;
//! each server copies it, which takes a fraction of initdb's time, so that one process per test
//! (`cargo nextest`) stays quick.

use std::fs;
use std::hash::{Hash as _, Hasher as _};
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::process::{self, RunAs, ServerProcess};
use super::Unavailable;
use headcount_conformance::ServerControl;

/// Where to look for the binaries instead of PATH and `/usr/lib/postgresql/*/bin` (only there).
pub const BIN_DIR_VAR: &str = "HEADCOUNT_TEST_POSTGRES_BIN_DIR";

/// Where to keep the initdb'd template (default: `$TMPDIR/headcount-conformance-cache`).
pub const CACHE_DIR_VAR: &str = "HEADCOUNT_TEST_CACHE_DIR";

const INSTALL_HINT: &str = "apt-get install postgresql (or your system's PostgreSQL server \
                            package), or set HEADCOUNT_TEST_POSTGRES_URL to a server of yours";

/// How long a server may take to accept connections (crash recovery after a kill included).
const READY_DEADLINE: Duration = Duration::from_secs(60);

/// Finds the directory holding `initdb` and `postgres`: `HEADCOUNT_TEST_POSTGRES_BIN_DIR` if set (and only it),
/// else the first PATH entry with both, else the highest version in `/usr/lib/postgresql/*/bin`.
pub fn find_bin_dir() -> Result<PathBuf, Unavailable> {
    let has_both =
        |dir: &Path| is_executable(&dir.join("initdb")) && is_executable(&dir.join("postgres"));
    if let Some(dir) = std::env::var_os(BIN_DIR_VAR) {
        let dir = PathBuf::from(dir);
        return if has_both(&dir) {
            Ok(dir)
        } else {
            Err(Unavailable::Missing(format!(
                "no initdb/postgres in {BIN_DIR_VAR}={}; {INSTALL_HINT}",
                dir.display()
            )))
        };
    }
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(dir) = std::env::split_paths(&path).find(|d| has_both(d)) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(Vec<u32>, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e
                .file_name()
                .to_str()?
                .split('.')
                .map(|p| p.parse().ok())
                .collect::<Option<Vec<u32>>>()?;
            let bin = e.path().join("bin");
            has_both(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir).ok_or_else(|| {
        Unavailable::Missing(format!(
            "no initdb/postgres found on PATH or in /usr/lib/postgresql/*/bin; {INSTALL_HINT}"
        ))
    })
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The user to run the server as: ourselves, or `postgres` when we are root.
pub(super) fn run_as() -> Result<Option<RunAs>, Unavailable> {
    if !process::is_root() {
        return Ok(None);
    }
    RunAs::lookup("postgres").map(Some).ok_or_else(|| {
        Unavailable::Missing(
            "the tests run as root, which PostgreSQL refuses, and there is no `postgres` user to \
             run it as: create one (useradd --system postgres) or run the tests as another user"
                .into(),
        )
    })
}

/// A PostgreSQL server started by the harness: its own data directory, socket directory and log
/// under one temp dir, listening on 127.0.0.1 only.
#[derive(Debug)]
pub struct PgServer {
    bin: PathBuf,
    root: PathBuf,
    data: PathBuf,
    sock: PathBuf,
    log: PathBuf,
    port: AtomicU16,
    run_as: Option<RunAs>,
    process: Arc<ServerProcess>,
    op_timeout: Option<Duration>,
    /// `-c name=value` settings after the defaults, which they override.
    settings: Vec<String>,
}

impl PgServer {
    /// Creates a data directory from the template and starts a server on it. `op_timeout` goes
    /// into the URL's `timeout` option (the store's per-operation deadline) when given.
    pub fn start_new(op_timeout: Option<Duration>) -> Result<PgServer, Unavailable> {
        Self::start_with(op_timeout, &[])
    }

    /// Like [`start_new`](Self::start_new), with `settings` (`name=value`, each passed as `-c`)
    /// after the harness's own, which they override: `["fsync=on"]` for a durable server.
    pub fn start_with(
        op_timeout: Option<Duration>,
        settings: &[&str],
    ) -> Result<PgServer, Unavailable> {
        let bin = find_bin_dir()?;
        let run_as = run_as()?;
        let failed = |what: &str, e: io::Error| {
            Unavailable::Failed(format!("PostgreSQL from {}: {what}: {e}", bin.display()))
        };
        let template = template(&bin, run_as).map_err(|e| failed("initdb", e))?;
        let root = process::temp_dir("pg").map_err(|e| failed("temp dir", e))?;
        let server = PgServer {
            data: root.join("data"),
            sock: root.join("sock"),
            log: root.join("server.log"),
            root,
            bin: bin.clone(),
            port: AtomicU16::new(0),
            run_as,
            process: ServerProcess::new(libc::SIGQUIT),
            op_timeout,
            settings: settings.iter().map(|s| (*s).to_owned()).collect(),
        };
        server
            .prepare(&template)
            .map_err(|e| failed("preparing the data directory", e))?;
        process::start_on_free_port(&server.log, |port| {
            server.port.store(port, Ordering::SeqCst);
            server.start()
        })
        .map_err(|e| failed("starting the server", e))?;
        Ok(server)
    }

    fn prepare(&self, template: &Path) -> io::Result<()> {
        copy_tree(template, &self.data)?;
        fs::set_permissions(&self.data, fs::Permissions::from_mode(0o700))?;
        fs::create_dir(&self.sock)?;
        process::open_log(&self.log, self.run_as)?;
        if let Some(user) = self.run_as {
            user.chown_tree(&self.data)?;
            user.chown_tree(&self.sock)?;
        }
        Ok(())
    }

    /// The store URL of this server.
    pub fn url(&self) -> String {
        let mut url = format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.port.load(Ordering::SeqCst)
        );
        if let Some(t) = self.op_timeout {
            url.push_str(&format!("?timeout={}ms", t.as_millis()));
        }
        url
    }

    /// The TCP port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// The temp dir holding the server's data, socket directory and log; removed at shutdown.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// The pids of the server's processes: the postmaster first, then its children.
    pub fn pids(&self) -> Vec<u32> {
        let Some(pid) = self.process.pid() else {
            return Vec::new();
        };
        let children = libc::pid_t::try_from(pid)
            .map(process::children_of)
            .unwrap_or_default();
        std::iter::once(pid)
            .chain(children.into_iter().filter_map(|c| u32::try_from(c).ok()))
            .collect()
    }

    /// Starts the server (a no-op when it runs) and waits until it accepts connections.
    pub fn start(&self) -> io::Result<()> {
        if self.process.running() {
            return Ok(());
        }
        let port = self.port.load(Ordering::SeqCst).to_string();
        let mut command = Command::new(self.bin.join("postgres"));
        let args: [&[&str]; 2] = [
            &["-p", &port],
            &[
                "-c",
                "listen_addresses=127.0.0.1",
                // Tests need no durability across a machine crash; kill -9 of the server keeps
                // everything written, since the OS still holds it.
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
                "-c",
                "shared_buffers=32MB",
                "-c",
                "dynamic_shared_memory_type=mmap",
                "-c",
                "logging_collector=off",
                "-c",
                "log_min_messages=warning",
            ],
        ];
        command
            .arg("-D")
            .arg(&self.data)
            .arg("-k")
            .arg(&self.sock)
            .args(args.iter().flat_map(|a| a.iter()))
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .current_dir(&self.root);
        self.process.spawn_logged(command, &self.log, self.run_as)?;
        self.wait_ready()
    }

    /// Polls `postmaster.pid` until the server (this very process) says it is ready.
    fn wait_ready(&self) -> io::Result<()> {
        let end = Instant::now() + READY_DEADLINE;
        let pid_file = self.data.join("postmaster.pid");
        loop {
            if let Some(status) = self.process.exited()? {
                return Err(io::Error::other(format!(
                    "postgres exited ({status}) while starting:\n{}",
                    process::log_tail(&self.log)
                )));
            }
            let Some(pid) = self.process.pid() else {
                return Err(io::Error::other("postgres is not running"));
            };
            // Line 1 is the postmaster's pid, line 8 its status ("ready" once it accepts
            // connections); an old file from a killed server names another pid.
            if let Ok(text) = fs::read_to_string(&pid_file) {
                let lines: Vec<&str> = text.lines().collect();
                if lines.first().map(|l| l.trim()) == Some(pid.to_string().as_str())
                    && lines.get(7).map(|l| l.trim()) == Some("ready")
                {
                    return Ok(());
                }
            }
            if Instant::now() > end {
                return Err(io::Error::other(format!(
                    "postgres did not become ready within {READY_DEADLINE:?}:\n{}",
                    process::log_tail(&self.log)
                )));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the server and removes its directory.
    pub fn shutdown(&self) {
        self.process.stop(Duration::from_secs(5));
        process::remove_temp_dir(&self.root);
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The cached template data directory for the PostgreSQL in `bin`, made with initdb on first use.
fn template(bin: &Path, run_as: Option<RunAs>) -> io::Result<PathBuf> {
    let cache = std::env::var_os(CACHE_DIR_VAR)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("headcount-conformance-cache"));
    fs::create_dir_all(&cache)?;
    fs::set_permissions(&cache, fs::Permissions::from_mode(0o755))?;
    let version = Command::new(bin.join("postgres"))
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        version.trim(),
        fs::canonicalize(bin).unwrap_or_else(|_| bin.into()),
        run_as.map(|u| u.uid),
    )
        .hash(&mut hasher);
    let template = cache.join(format!("pg-template-{:016x}", hasher.finish()));
    if template.join("PG_VERSION").is_file() {
        return Ok(template);
    }
    process::sweep_dead_owners(&cache, "staging-");
    // Build in a private staging dir and rename it into place, so concurrent test processes
    // (nextest) never see a half-made template; the loser of the race uses the winner's.
    let staging = cache.join(format!(
        "staging-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    fs::create_dir(&staging)?;
    fs::set_permissions(&staging, fs::Permissions::from_mode(0o755))?;
    let result =
        initdb(bin, run_as, &staging).and_then(|data| match fs::rename(&data, &template) {
            Ok(()) => Ok(()),
            Err(_) if template.join("PG_VERSION").is_file() => Ok(()),
            Err(e) => Err(e),
        });
    let _ = fs::remove_dir_all(&staging);
    result.map(|()| template)
}

fn initdb(bin: &Path, run_as: Option<RunAs>, staging: &Path) -> io::Result<PathBuf> {
    let data = staging.join("data");
    fs::create_dir(&data)?;
    if let Some(user) = run_as {
        user.chown_tree(staging)?;
    }
    let mut command = Command::new(bin.join("initdb"));
    command
        .arg("-D")
        .arg(&data)
        .args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        ])
        .current_dir(staging)
        .env("LC_ALL", "C");
    process::run(
        command,
        run_as,
        &staging.join("initdb.log"),
        Duration::from_secs(120),
    )?;
    Ok(data)
}

/// Copies a directory tree, keeping file modes.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
            fs::set_permissions(&target, entry.metadata()?.permissions())?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(entry.path())?, &target)?;
        } else {
            fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// [`ServerControl`] over a [`PgServer`] dedicated to one case.
#[derive(Debug, Clone)]
pub struct PgControl {
    server: Arc<PgServer>,
    timeout: Duration,
}

impl PgControl {
    /// Control over `server`, whose store URL carries `timeout`.
    pub fn new(server: Arc<PgServer>, timeout: Duration) -> Self {
        PgControl { server, timeout }
    }

    async fn blocking(
        &self,
        f: impl FnOnce(&PgServer) -> io::Result<()> + Send + 'static,
    ) -> io::Result<()> {
        let server = self.server.clone();
        tokio::task::spawn_blocking(move || f(&server))
            .await
            .map_err(io::Error::other)?
    }
}

#[async_trait]
impl ServerControl for PgControl {
    fn op_timeout(&self) -> Duration {
        self.timeout
    }

    async fn kill(&self) -> io::Result<()> {
        self.blocking(|s| s.process.kill()).await
    }

    async fn start(&self) -> io::Result<()> {
        self.blocking(PgServer::start).await
    }

    async fn pause(&self) -> io::Result<()> {
        self.blocking(|s| s.process.pause()).await
    }

    async fn resume(&self) -> io::Result<()> {
        self.blocking(|s| s.process.resume()).await
    }
}
