//! `headcount ids serve` end to end: two IDs server processes over three `redis-server`s with
//! `appendonly yes` + `appendfsync always`, six clients (the library's `IdsClient`, each given
//! both servers) taking single IDs and blocks, one server killed (SIGKILL) mid-run, then one
//! Redis (a minority), then a second (no majority), then both restarted. The recorded history
//! must have no repeat and be linearizable, calls without a majority must fail within the
//! deadline with no ID, and IDs must resume above every earlier one.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // tests fail by panicking

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use headcount::recipes::ids::IdsClient;
use headcount_conformance::id_history::{check_id_history as check_history, IdLoad};
use headcount_harness::{skip_unless_required, KvStore, ServerKind};
use tokio::time::Instant;

const AOF_ALWAYS: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];
const DEADLINE: Duration = Duration::from_secs(2);
const MINUTE: Duration = Duration::from_secs(60);

/// An `ids serve` process and the address it printed.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(stores: &str) -> Server {
        let child = Command::new(env!("CARGO_BIN_EXE_headcount"))
            .args([
                "ids",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--stores",
                stores,
            ])
            .args(["--deadline", "2s"])
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start ids serve");
        Server::listening(child)
    }

    /// The server `child` is, once it printed the address it listens on.
    fn listening(mut child: Child) -> Server {
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the address");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("ids serve printed {line:?}"))
            .to_owned();
        Server { child, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `clients` clients, client `i` taking blocks of `1 + i % 3` IDs, given the servers in
/// turn-dependent order, pausing 20 ms after a failed call.
fn start_load(servers: &[String], clients: usize) -> IdLoad {
    let callers = (0..clients)
        .map(|client| {
            let mut order = servers.to_vec();
            order.rotate_left(client % servers.len());
            let ids = Arc::new(IdsClient::new(&order, DEADLINE).expect("client"));
            let count = 1 + (client as u64 % 3);
            move || {
                let ids = ids.clone();
                async move {
                    let block = ids.next_block("default", count).await.ok()?;
                    Some(block.collect::<Vec<i64>>())
                }
            }
        })
        .collect();
    IdLoad::start(callers, Duration::from_millis(20))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_fail_over_and_ids_stay_unique_and_linearizable() {
    let mut redis = Vec::new();
    for _ in 0..3 {
        let started =
            blocking(|| KvStore::redis_with(Some(Duration::from_secs(1)), AOF_ALWAYS)).await;
        let Some(server) = skip_unless_required(ServerKind::Redis, "cli ids_serve", started) else {
            return;
        };
        redis.push(Arc::new(server));
    }
    let stores = redis.iter().map(|s| s.url()).collect::<Vec<_>>().join(",");
    let (a, b) = {
        let stores = stores.clone();
        blocking(move || (Server::start(&stores), Server::start(&stores))).await
    };
    let addrs = vec![a.addr.clone(), b.addr.clone()];
    let load = start_load(&addrs, 6);
    let t0 = Instant::now();
    load.wait_ids(t0, 300, MINUTE, "both servers up").await;

    // One server killed: its clients move to the other.
    let mut a = a;
    a.child.kill().expect("kill a server");
    a.child.wait().expect("reap it");
    let t1 = Instant::now();
    load.wait_ids(t1, 300, MINUTE, "one server killed").await;

    // One Redis of three down: a majority remains.
    let r0 = redis[0].clone();
    blocking(move || r0.servers[0].kill()).await.unwrap();
    let t2 = Instant::now();
    load.wait_ids(t2, 300, MINUTE, "one store killed").await;

    // Two down: every call that starts now fails within the deadline, with no ID.
    let r1 = redis[1].clone();
    blocking(move || r1.servers[0].kill()).await.unwrap();
    let t3 = Instant::now();
    let slack = Duration::from_secs(1);
    let after = load
        .wait_calls(t3, 12, 6, Duration::from_secs(30), "failed calls")
        .await;
    for c in &after {
        assert!(c.id.is_none(), "ID {:?} with 2 of 3 stores down", c.id);
        assert!(
            c.end - c.start <= DEADLINE + slack,
            "a call failed only after {:?}",
            c.end - c.start
        );
    }
    let before: i64 = load.snapshot().iter().filter_map(|c| c.id).max().unwrap();

    // Both back (from their append-only files): IDs resume above every earlier one.
    for r in &redis[..2] {
        let r = r.clone();
        blocking(move || r.servers[0].start()).await.unwrap();
    }
    let t4 = Instant::now();
    load.wait_ids(t4, 300, MINUTE, "after the restarts").await;
    let calls = load.stop().await;
    for id in calls.iter().filter(|c| c.start >= t4).filter_map(|c| c.id) {
        assert!(id > before, "{id} after the restarts is not above {before}");
    }
    eprintln!(
        "ids serve: {} IDs in {} calls over two servers, one killed",
        calls.iter().filter(|c| c.id.is_some()).count(),
        calls.len()
    );
    check_history(&calls);
    drop(b);
}

/// `ids serve` under `ulimit -n 64` with `extra` arguments, over three SQLite files in `dir`;
/// its stderr is collected in the returned thread.
fn serve_limited(
    dir: &std::path::Path,
    extra: &[&str],
) -> (Server, std::thread::JoinHandle<String>) {
    let stores = ["a.db", "b.db", "c.db"]
        .map(|f| format!("sqlite://{}/{f}", dir.display()))
        .join(",");
    let mut child = Command::new("sh")
        .args(["-c", "ulimit -n 64 && exec \"$@\"", "sh"])
        .arg(env!("CARGO_BIN_EXE_headcount"))
        .args([
            "ids",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--stores",
            &stores,
        ])
        .args(["--allow-non-durable"])
        .args(extra)
        .env_remove("RUST_LOG")
        .env_remove("HEADCOUNT_LOG_FORMAT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ids serve");
    let stderr = child.stderr.take().expect("stderr");
    let logs = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
        text
    });
    (Server::listening(child), logs)
}

/// One `ids next --server addr`: the ID printed, or the error line.
fn next_from(addr: &str) -> Result<i64, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_headcount"))
        .args(["ids", "next", "--server", addr, "--deadline", "5s"])
        .env_remove("RUST_LOG")
        .output()
        .expect("ids next");
    if out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim().parse().map_err(|e| format!("{text:?}: {e}"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A hundred connections that never say a word, against a server allowed 64 open files (the
/// default limit is 1,024): it keeps serving, by its default connection cap (half the limit)
/// and, with a cap set above the limit, by backing off (and saying so) when `accept` runs out
/// of file descriptors and closing its idlest connection, instead of retrying at once.
#[test]
fn silent_connections_cannot_starve_ids_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    for extra in [&[][..], &["--max-connections", "1000"]] {
        let (server, logs) = serve_limited(dir.path(), extra);
        let silent: Vec<std::net::TcpStream> = (0..100)
            .map(|_| std::net::TcpStream::connect(&server.addr).expect("connect"))
            .collect();
        let id = next_from(&server.addr);
        assert!(id.is_ok(), "{extra:?}: {id:?}");
        drop(silent);
        drop(server);
        let logs = logs.join().expect("stderr");
        if !extra.is_empty() {
            assert!(
                logs.contains("cannot accept a connection") && logs.contains("file descriptors"),
                "no warning about the descriptors: {logs}"
            );
        }
        assert!(!logs.contains("panicked"), "{logs}");
    }
}
