//! Tests of the PostgreSQL harness itself, with a minimal wire-protocol client so they depend on
//! no backend: pausing stalls existing connections as well as new ones, a kill leaves no process
//! behind and the server starts again on the same port and data, shutdown removes everything.

// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{self, Read as _, Write as _};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use headcount_conformance::wait::eventually_blocking;
use headcount_conformance::ServerControl;
use headcount_harness::{skip_unless_required, PgControl, PgServer, ServerKind};

/// A dedicated server, or None (with a SKIP line) when PostgreSQL is not installed.
fn server() -> Option<Arc<PgServer>> {
    let started = PgServer::start_new(Some(Duration::from_secs(2)));
    skip_unless_required(ServerKind::Postgres, "harness test", started).map(Arc::new)
}

fn port(server: &PgServer) -> u16 {
    let url = server.url();
    let after = url.rsplit_once(':').map(|(_, p)| p).unwrap_or_default();
    after.split('/').next().unwrap_or_default().parse().unwrap()
}

/// Just enough of the PostgreSQL protocol: trust login and simple queries.
struct Pg(TcpStream);

impl Pg {
    fn connect(port: u16, timeout: Duration) -> io::Result<Pg> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(timeout))?;
        let body = b"\0\x03\0\0user\0postgres\0database\0postgres\0\0";
        let len = u32::try_from(body.len() + 4).unwrap().to_be_bytes();
        s.write_all(&len)?;
        s.write_all(body)?;
        let mut pg = Pg(s);
        pg.ready()?;
        Ok(pg)
    }

    /// Reads messages until ReadyForQuery; fails on an ErrorResponse.
    fn ready(&mut self) -> io::Result<()> {
        loop {
            let mut head = [0u8; 5];
            self.0.read_exact(&mut head)?;
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            let mut body = vec![0; len - 4];
            self.0.read_exact(&mut body)?;
            match head[0] {
                b'Z' => return Ok(()),
                b'E' => {
                    return Err(io::Error::other(
                        String::from_utf8_lossy(&body).into_owned(),
                    ))
                }
                _ => {}
            }
        }
    }

    fn send(&mut self, sql: &str) -> io::Result<()> {
        let mut msg = vec![b'Q'];
        msg.extend_from_slice(&u32::try_from(sql.len() + 5).unwrap().to_be_bytes());
        msg.extend_from_slice(sql.as_bytes());
        msg.push(0);
        self.0.write_all(&msg)
    }

    fn query(&mut self, sql: &str) -> io::Result<()> {
        self.send(sql)?;
        self.ready()
    }
}

fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !matches!(s.rsplit(')').next().map(str::trim_start), Some(r) if r.starts_with('Z') || r.starts_with('X')))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stalls_existing_and_new_connections_then_resume_serves_them() {
    let Some(server) = server() else { return };
    let control = PgControl::new(server.clone(), Duration::from_secs(2));
    let port = port(&server);
    let short = Duration::from_millis(700);
    let mut existing = Pg::connect(port, short).unwrap();
    existing.query("SELECT 1").unwrap();

    // Why every process must be stopped: each connection has its own backend process, in its
    // own session, which keeps serving when only the postmaster is stopped.
    let postmaster = server.pids()[0];
    let stop = |sig: &str, pid: u32| {
        assert!(Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success());
    };
    stop("-STOP", postmaster);
    existing
        .query("SELECT 1")
        .expect("a connection keeps working with only the postmaster stopped");
    stop("-CONT", postmaster);

    control.pause().await.unwrap();
    existing.send("SELECT 1").unwrap();
    let err = existing
        .ready()
        .expect_err("an existing connection answered while paused");
    assert!(timed_out(&err), "{err}");
    let err = Pg::connect(port, short)
        .err()
        .expect("a new connection was served while paused");
    assert!(timed_out(&err), "{err}");

    control.resume().await.unwrap();
    existing
        .0
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    existing
        .ready()
        .expect("the stalled query is answered after resume");
    Pg::connect(port, Duration::from_secs(10))
        .unwrap()
        .query("SELECT 1")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_leaves_no_process_and_start_reuses_port_and_data() {
    let Some(server) = server() else { return };
    let control = PgControl::new(server.clone(), Duration::from_secs(2));
    let port = port(&server);
    let mut conn = Pg::connect(port, Duration::from_secs(10)).unwrap();
    conn.query("CREATE TABLE survives (x int); INSERT INTO survives VALUES (1)")
        .unwrap();
    let pids = server.pids();
    assert!(pids.len() > 2, "postmaster and children: {pids:?}");

    control.kill().await.unwrap();
    for pid in &pids {
        assert!(
            !alive(*pid),
            "process {pid} of the killed server is still alive"
        );
    }
    assert!(
        conn.query("SELECT 1").is_err(),
        "a connection survived the kill"
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port {port} still accepts"
    );

    control.start().await.unwrap();
    control.start().await.unwrap(); // a no-op when running
    let mut conn = Pg::connect(port, Duration::from_secs(10)).unwrap();
    conn.query("SELECT x FROM survives")
        .expect("the data directory was kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_every_process_and_removes_the_directory() {
    let Some(server) = server() else { return };
    let port = port(&server);
    let _conn = Pg::connect(port, Duration::from_secs(10)).unwrap();
    let pids = server.pids();
    let dir = server.dir().to_owned();
    assert!(dir.join("data").is_dir());
    control_drop(server);
    for pid in pids {
        eventually_blocking(
            "server processes gone",
            Duration::from_secs(10),
            Duration::from_millis(10),
            || !alive(pid),
        );
    }
    assert!(!dir.exists(), "{} still exists", dir.display());
}

fn control_drop(server: Arc<PgServer>) {
    let server = Arc::try_unwrap(server).expect("the only handle");
    drop(server);
}
