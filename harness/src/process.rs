//! Server processes that cannot outlive the tests, and temporary directories that are removed.
//!
//! * Every server is spawned from one dedicated thread that lives as long as the process, with
//!   `prctl(PR_SET_PDEATHSIG, SIGKILL)` set in the child: Linux sends that signal when the thread
//!   that forked the child exits, so a spawner thread that never exits means "when this test
//!   process dies, however it dies".
//! * A normal exit (all tests done, some failed or not) runs an `atexit` hook that stops every
//!   server still running and removes every temporary directory.
//! * Directories left by a test process that was killed outright are swept by the next one.
//!
//! Servers such as PostgreSQL fork one process per connection and put each in its own session,
//! so signals to the server's process group miss them: pausing and killing go through every
//! child of the server's main process, found in `/proc`. The test process makes itself the
//! subreaper of what it spawns, so the children of a killed server are reaped here instead of
//! lingering as zombies in containers whose init does not reap.

// `unsafe` is needed for what std has no safe API for: the child-side `pre_exec` hook (prctl,
// dropping privileges), kill(2) and waitpid(2) on processes we hold no `Child` for, prctl for
// the subreaper, getpwnam_r, and atexit(3). Each block is a plain libc call with checked arguments.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs;
use std::io::{self, Write as _};
use std::net::TcpListener;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::{mpsc, Arc, Mutex, Once, OnceLock, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

/// A Unix user to run a server as (servers such as PostgreSQL refuse to run as root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    /// User id.
    pub uid: u32,
    /// Its primary group id.
    pub gid: u32,
}

impl RunAs {
    /// The user called `name`, if it exists.
    pub fn lookup(name: &str) -> Option<RunAs> {
        let name = CString::new(name).ok()?;
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        // SAFETY: all-zero is a valid `passwd` (integers and null pointers).
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call and `buf.len()` is its real length; the
        // strings written into `buf` are not used after it.
        let rc = unsafe {
            libc::getpwnam_r(
                name.as_ptr(),
                &mut pwd,
                buf.as_mut_ptr(),
                buf.len(),
                &mut result,
            )
        };
        (rc == 0 && !result.is_null()).then_some(RunAs {
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
        })
    }

    /// Makes `path` and everything under it owned by this user.
    pub fn chown_tree(&self, path: &Path) -> io::Result<()> {
        std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid))?;
        if fs::symlink_metadata(path)?.is_dir() {
            for entry in fs::read_dir(path)? {
                self.chown_tree(&entry?.path())?;
            }
        }
        Ok(())
    }
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// The channel to the spawner thread, started on first use.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        // The thread never exits (the sender lives in this static), so PR_SET_PDEATHSIG fires
        // only when the whole process goes. If it cannot start, `rx` is dropped and every spawn
        // fails with a clear error instead.
        let _ = thread::Builder::new()
            .name("headcount-harness-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            });
        Mutex::new(tx)
    })
}

/// Spawns `command` from the spawner thread, so it is killed when this process dies, optionally
/// as another user.
pub fn spawn(mut command: Command, run_as: Option<RunAs>) -> io::Result<Child> {
    register_cleanup();
    become_subreaper();
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the hook only makes async-signal-safe system calls (setgroups, setgid, setuid,
    // prctl, getppid) and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            // Drop privileges first: changing credentials clears the parent-death signal.
            if let Some(RunAs { uid, gid }) = run_as {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The spawner thread lives as long as the process; if the process is already gone
            // the signal was missed, so do not start at all.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send((command, reply_tx))
        .map_err(|_| io::Error::other("the harness's spawner thread is not running"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("the harness's spawner thread did not answer"))?
}

/// Runs `command` to completion (through [`spawn`]) with its output appended to `log`, and fails
/// with the log's tail unless it exits successfully within `deadline`.
pub fn run(
    mut command: Command,
    run_as: Option<RunAs>,
    log: &Path,
    deadline: Duration,
) -> io::Result<()> {
    let out = open_log(log, run_as)?;
    command
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    let what = format!("{command:?}");
    let mut child = spawn(command, run_as)?;
    let end = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait()? {
            if status.success() {
                return Ok(());
            }
            return Err(io::Error::other(format!(
                "{what} failed ({status}):\n{}",
                log_tail(log)
            )));
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other(format!(
                "{what} did not finish within {deadline:?}:\n{}",
                log_tail(log)
            )));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Opens `path` for appending (creating it), owned by `run_as` when given.
pub fn open_log(path: &Path, run_as: Option<RunAs>) -> io::Result<fs::File> {
    let file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    if let Some(user) = run_as {
        user.chown_tree(path)?;
    }
    Ok(file)
}

/// The last lines of a log file, for error messages.
pub fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(20);
    lines.get(start..).unwrap_or_default().join("\n")
}

/// A port on 127.0.0.1 that was free a moment ago, chosen below the kernel's ephemeral range.
///
/// A port the kernel hands out for `bind(0)` comes from the range it also takes the local ports
/// of outgoing connections from, so between our probe and the server's own bind a client
/// connection of another test (a PostgreSQL or etcd client) can take it: CI saw an etcd member
/// fail with "address already in use" that way. Ports below that range are only ever taken by
/// an explicit bind. Each port is handed out once per test process; other test processes pick
/// at random, and the servers' start-up retries on a port that turns out busy
/// ([`port_in_use`]).
pub fn free_port() -> io::Result<u16> {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const FIRST: u16 = 20000;
    if low > FIRST + 1000 {
        let mut given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
        for _ in 0..200 {
            let port = FIRST + rand::random::<u16>() % (low - FIRST);
            if given.contains(&port) {
                continue;
            }
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.push(port);
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// Whether a server's start-up failure (its message and log) says a port was taken.
pub fn port_in_use(text: &str) -> bool {
    text.contains("address already in use")
        || text.contains("Address already in use")
        || text.contains("could not bind")
}

/// Starts a server on a free port: `start(port)` starts it on `port`. A free port can be taken
/// between our probe and the server's bind, so up to five ports are tried while the server's
/// `log` says its port was taken; returns the last attempt's error otherwise.
pub fn start_on_free_port(
    log: &Path,
    mut start: impl FnMut(u16) -> io::Result<()>,
) -> io::Result<()> {
    let mut last = None;
    for _ in 0..5 {
        match start(free_port()?) {
            Ok(()) => return Ok(()),
            Err(e) => {
                let busy = fs::read_to_string(log).is_ok_and(|l| port_in_use(&l));
                last = Some(e);
                if !busy {
                    break;
                }
            }
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no attempt made")))
}

/// One server's main process, which may be killed and started again. Registered so the exit
/// hook stops it.
#[derive(Debug)]
pub struct ServerProcess {
    child: Mutex<Option<Child>>,
    /// The signal that asks the server to shut down at once (SIGQUIT for PostgreSQL).
    stop_signal: libc::c_int,
}

impl ServerProcess {
    /// A slot for a server process that shuts down on `stop_signal`.
    pub fn new(stop_signal: libc::c_int) -> Arc<Self> {
        let me = Arc::new(ServerProcess {
            child: Mutex::new(None),
            stop_signal,
        });
        registry().servers.push(Arc::downgrade(&me));
        me
    }

    fn child(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Spawns the server's main process into this slot.
    pub fn spawn(&self, command: Command, run_as: Option<RunAs>) -> io::Result<()> {
        let child = spawn(command, run_as)?;
        *self.child() = Some(child);
        Ok(())
    }

    /// [`spawn`](Self::spawn)s `command` with no stdin, its output appended to `log` (owned by
    /// `run_as`, like the process).
    pub fn spawn_logged(
        &self,
        mut command: Command,
        log: &Path,
        run_as: Option<RunAs>,
    ) -> io::Result<()> {
        let log = open_log(log, run_as)?;
        command
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.spawn(command, run_as)
    }

    /// The main process's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child().as_ref().map(Child::id)
    }

    /// Whether the main process has exited (and reaps it if so).
    pub fn exited(&self) -> io::Result<Option<ExitStatus>> {
        let mut child = self.child();
        match child.as_mut() {
            None => Ok(None),
            Some(c) => {
                let status = c.try_wait()?;
                if status.is_some() {
                    *child = None;
                }
                Ok(status)
            }
        }
    }

    /// Polls `ready` until it says the server `what` (its binary, for messages) accepts
    /// connections; fails with the tails of `logs` when the process exits first, or `within`
    /// passes.
    pub fn wait_ready(
        &self,
        what: &str,
        within: Duration,
        logs: &[&Path],
        mut ready: impl FnMut() -> bool,
    ) -> io::Result<()> {
        let end = Instant::now() + within;
        let tails = || {
            logs.iter()
                .map(|l| log_tail(l))
                .collect::<Vec<_>>()
                .join("\n")
        };
        loop {
            if let Some(status) = self.exited()? {
                return Err(io::Error::other(format!(
                    "{what} exited ({status}) while starting:\n{}",
                    tails()
                )));
            }
            if ready() {
                return Ok(());
            }
            if Instant::now() > end {
                return Err(io::Error::other(format!(
                    "{what} did not become ready within {within:?}:\n{}",
                    tails()
                )));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the main process is running (not exited, maybe paused).
    pub fn running(&self) -> bool {
        matches!(self.exited(), Ok(None)) && self.pid().is_some()
    }

    /// Kills the main process and all its children with SIGKILL, and waits until they are gone.
    pub fn kill(&self) -> io::Result<()> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        let pid = to_pid(pid)?;
        // Freeze the main process first so it forks no new child while we collect them.
        signal(pid, libc::SIGSTOP)?;
        wait_for_state(pid, |s| s == 'T' || s == 't', Duration::from_secs(5))?;
        let children = children_of(pid);
        for &c in &children {
            let _ = signal(c, libc::SIGKILL);
        }
        signal(pid, libc::SIGKILL)?;
        if let Some(mut child) = self.child().take() {
            child.wait()?;
        }
        // The main process is reaped, so its orphans were handed to us (we are their
        // subreaper): reap them too, rather than leave zombies where init does not reap.
        for c in children {
            reap(c, Duration::from_secs(10))?;
        }
        Ok(())
    }

    /// Stops every process of the server with SIGSTOP: the main process, then each child.
    pub fn pause(&self) -> io::Result<()> {
        let Some(pid) = self.pid() else {
            return Err(io::Error::other("the server is not running"));
        };
        let pid = to_pid(pid)?;
        signal(pid, libc::SIGSTOP)?;
        wait_for_state(pid, |s| s == 'T' || s == 't', Duration::from_secs(5))?;
        // The main process is stopped, so the set of children is fixed now.
        for c in children_of(pid) {
            if signal(c, libc::SIGSTOP).is_ok() {
                wait_for_state(
                    c,
                    |s| matches!(s, 'T' | 't' | 'Z' | 'X'),
                    Duration::from_secs(5),
                )?;
            }
        }
        Ok(())
    }

    /// Continues every process of the server with SIGCONT (harmless when it is not paused).
    pub fn resume(&self) -> io::Result<()> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        let pid = to_pid(pid)?;
        for c in children_of(pid) {
            let _ = signal(c, libc::SIGCONT);
        }
        signal(pid, libc::SIGCONT)
    }

    /// Shuts the server down: resumes it if paused, sends the stop signal, waits up to
    /// `grace`, then kills what is left.
    pub fn stop(&self, grace: Duration) {
        let Some(pid) = self.pid() else {
            return;
        };
        let Ok(pid) = to_pid(pid) else {
            return;
        };
        let _ = self.resume();
        let _ = signal(pid, self.stop_signal);
        let end = Instant::now() + grace;
        while Instant::now() < end {
            match self.exited() {
                Ok(None) => thread::sleep(Duration::from_millis(5)),
                _ => return,
            }
        }
        let _ = self.kill();
    }
}

fn to_pid(pid: u32) -> io::Result<libc::pid_t> {
    libc::pid_t::try_from(pid).map_err(|_| io::Error::other(format!("pid {pid} out of range")))
}

/// Waits for `pid`, one of our children, to exit and reaps it; a process that is not our child
/// only has to be gone (or a zombie of someone else).
fn reap(pid: libc::pid_t, within: Duration) -> io::Result<()> {
    let end = Instant::now() + within;
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; WNOHANG never blocks.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        match rc {
            0 if Instant::now() < end => thread::sleep(Duration::from_millis(2)),
            0 => {
                return Err(io::Error::other(format!(
                    "process {pid} still running {within:?} after SIGKILL"
                )))
            }
            r if r == pid => return Ok(()),
            _ => return wait_for_state(pid, |s| s == 'Z' || s == 'X', within),
        }
    }
}

/// Makes this process the subreaper of its descendants, so the processes a server forks are
/// handed to us, not to init, when the server dies, and can be reaped (see
/// [`ServerProcess::kill`]).
fn become_subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes one integer argument.
        let _ = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    });
}

/// Sends `sig` to `pid`.
pub fn signal(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    if pid <= 0 {
        return Err(io::Error::other(format!("refusing to signal pid {pid}")));
    }
    // SAFETY: kill has no memory preconditions; pid > 0 names exactly one process.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The state letter and parent pid of a process, from `/proc/<pid>/stat`; None when it is gone.
pub fn proc_stat(pid: libc::pid_t) -> Option<(char, libc::pid_t)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Every live process whose parent is `pid`.
pub fn children_of(pid: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|&p| matches!(proc_stat(p), Some((s, ppid)) if ppid == pid && s != 'Z' && s != 'X'))
        .collect()
}

/// Polls until the state of `pid` satisfies `ok` (a process that is gone satisfies every
/// wait), or fails after `within`.
pub fn wait_for_state(
    pid: libc::pid_t,
    ok: impl Fn(char) -> bool,
    within: Duration,
) -> io::Result<()> {
    let end = Instant::now() + within;
    loop {
        match proc_stat(pid) {
            None => return Ok(()),
            Some((s, _)) if ok(s) => return Ok(()),
            Some((s, _)) if Instant::now() > end => {
                return Err(io::Error::other(format!(
                    "process {pid} still in state {s} after {within:?}"
                )))
            }
            Some(_) => thread::sleep(Duration::from_millis(2)),
        }
    }
}

const DIR_PREFIX: &str = "headcount-conformance-";

/// Makes a fresh directory under the system temp dir, traversable by other users (so a server
/// running as `postgres` can reach its data inside), removed at exit.
pub fn temp_dir(tag: &str) -> io::Result<PathBuf> {
    register_cleanup();
    sweep_stale_dirs();
    let base = std::env::temp_dir();
    for _ in 0..16 {
        let path = base.join(format!(
            "{DIR_PREFIX}{}-{tag}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        match fs::DirBuilder::new().mode(0o755).create(&path) {
            Ok(()) => {
                // The umask may have narrowed the mode.
                fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
                registry().dirs.push(path.clone());
                return Ok(path);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(
        "could not create a fresh temporary directory",
    ))
}

/// Removes a directory made by [`temp_dir`] now, instead of at exit.
pub fn remove_temp_dir(path: &Path) {
    let _ = fs::remove_dir_all(path);
    registry().dirs.retain(|d| d != path);
}

/// Removes directories left by test processes that no longer exist (killed before their exit
/// hook could run).
fn sweep_stale_dirs() {
    static SWEPT: Once = Once::new();
    SWEPT.call_once(|| sweep_dead_owners(&std::env::temp_dir(), DIR_PREFIX));
}

/// Removes the directories in `parent` named `<prefix><pid>-...` whose process is gone.
pub fn sweep_dead_owners(parent: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        let Some(Ok(pid)) = rest.split('-').next().map(str::parse::<libc::pid_t>) else {
            continue;
        };
        if pid > 0 && proc_stat(pid).is_none() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

#[derive(Default)]
struct Registry {
    servers: Vec<Weak<ServerProcess>>,
    dirs: Vec<PathBuf>,
    at_exit: Vec<Box<dyn FnOnce() + Send>>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f` at normal process exit, before servers are stopped and directories removed.
#[cfg_attr(not(feature = "containers"), allow(dead_code))]
pub fn at_exit(f: impl FnOnce() + Send + 'static) {
    register_cleanup();
    registry().at_exit.push(Box::new(f));
}

fn register_cleanup() {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `cleanup_at_exit` is an `extern "C" fn()` that never unwinds.
        let rc = unsafe { libc::atexit(cleanup_at_exit) };
        if rc != 0 {
            let _ = writeln!(
                io::stderr(),
                "headcount-conformance: atexit failed; servers are still killed with this \
                 process (PR_SET_PDEATHSIG) but temporary directories may remain"
            );
        }
    });
}

extern "C" fn cleanup_at_exit() {
    // Unwinding out of an extern "C" function aborts; nothing here should panic, but be sure.
    let _ = std::panic::catch_unwind(cleanup);
}

/// Stops every server still running and removes every temporary directory. Also runs at exit.
pub fn cleanup() {
    let (hooks, servers, dirs) = {
        let mut r = registry();
        (
            std::mem::take(&mut r.at_exit),
            std::mem::take(&mut r.servers),
            std::mem::take(&mut r.dirs),
        )
    };
    for hook in hooks {
        hook();
    }
    for server in servers.iter().filter_map(Weak::upgrade) {
        server.stop(Duration::from_secs(5));
    }
    for dir in dirs {
        let _ = fs::remove_dir_all(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports come from below the ephemeral range (where outgoing connections cannot take them),
    /// never twice in one process, and are free when handed out.
    #[test]
    fn free_ports_are_distinct_and_below_the_ephemeral_range() {
        let low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok());
        let ports: Vec<u16> = (0..50).map(|_| free_port().expect("a free port")).collect();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            ports.len(),
            "a port handed out twice: {ports:?}"
        );
        if let Some(low) = low.filter(|l| *l > 21000) {
            assert!(ports.iter().all(|p| *p < low), "{ports:?} vs {low}");
        }
        assert!(port_in_use("bind: address already in use"));
        assert!(!port_in_use("permission denied"));
    }
}
