//! What the `group` and `rolling` benches share: their command line, the shared servers, a store
//! seeded with unrelated data, and the readings of a server's and this process's work (Redis
//! `INFO`, etcd's `/metrics`, CPU time).
//!
//! Included by each bench as `mod common`; a bench uses only a part of it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use headcount_harness::{Proxy, ServerKind};

/// Whether `cargo bench` runs this binary (it passes `--bench`). `cargo test --all-targets` runs
/// it without, in a debug build: each bench then makes a small smoke run unless the arguments
/// say otherwise.
pub fn benching() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// The command line as `--flag value` pairs. The caller matches each flag and takes its value
/// with one of the methods below; an unknown flag (`--bench` among them) takes no value and is
/// ignored. A flag given last without a value reads an empty one.
pub struct Args(std::iter::Skip<std::env::Args>);

impl Args {
    /// This process's arguments, after its name.
    pub fn new() -> Args {
        Args(std::env::args().skip(1))
    }

    /// The next flag (or any other argument the caller skips).
    pub fn flag(&mut self) -> Option<String> {
        self.0.next()
    }

    /// The value after a flag, as it is.
    pub fn value(&mut self) -> String {
        self.0.next().unwrap_or_default()
    }

    /// The value after a flag, parsed; `usage` (such as `--reps N`) names the flag when it is not
    /// one.
    pub fn parse<T: FromStr>(&mut self, usage: &str) -> T
    where
        T::Err: std::fmt::Debug,
    {
        self.value().parse().expect(usage)
    }

    /// A comma-separated list of values, each parsed.
    pub fn list<T: FromStr>(&mut self, usage: &str) -> Vec<T>
    where
        T::Err: std::fmt::Debug,
    {
        self.value()
            .split(',')
            .map(|v| v.parse().expect(usage))
            .collect()
    }

    /// A comma-separated list of names.
    pub fn names(&mut self) -> Vec<String> {
        self.value().split(',').map(str::to_owned).collect()
    }

    /// A number of seconds (`1.5`).
    pub fn seconds(&mut self, usage: &str) -> Duration {
        Duration::from_secs_f64(self.parse(usage))
    }

    /// A comma-separated list of backends: `sqlite`, `postgres`, `redis`, `etcd`.
    pub fn backends(&mut self) -> Vec<ServerKind> {
        self.value()
            .split(',')
            .map(|b| match b {
                "sqlite" => ServerKind::Sqlite,
                "postgres" => ServerKind::Postgres,
                "redis" => ServerKind::Redis,
                "etcd" => ServerKind::Etcd,
                other => panic!("unknown backend {other}"),
            })
            .collect()
    }
}

/// The backends a bench runs on unless `--backends` says otherwise.
pub fn every_backend() -> Vec<ServerKind> {
    vec![
        ServerKind::Sqlite,
        ServerKind::Postgres,
        ServerKind::Redis,
        ServerKind::Etcd,
    ]
}

/// The runtime every bench runs on: two worker threads, as the figures in docs/benchmarks.md.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The URL of the harness's shared store of `backend`, or `None` after a `SKIP` line naming
/// `bench` when it is not there and not required.
pub async fn shared_url(backend: ServerKind, bench: &str) -> Option<String> {
    match backend.shared().await {
        Ok(url) => Some(url),
        Err(e) => {
            assert!(!backend.required(), "{}: {e}", backend.name());
            eprintln!("SKIP {bench} bench on {}: {e}", backend.name());
            None
        }
    }
}

/// Puts `n` unrelated keys (`unrelated:00000000`..., no TTL, 64 bytes each) in the store at
/// `url`, as a user's store holding other data would, unless it already has the last one.
pub async fn fill_store(url: &str, n: u64) -> Result<(), String> {
    if n == 0 {
        return Ok(());
    }
    let store = headcount::connect(url).await.map_err(|e| e.to_string())?;
    let last = format!("unrelated:{:08}", n - 1);
    if store.get(&last).await.map_err(|e| e.to_string())?.is_some() {
        return Ok(());
    }
    let value = "u".repeat(64);
    let t = Instant::now();
    let mut next = 0u64;
    while next < n {
        let batch: Vec<u64> = (next..(next + 256).min(n)).collect();
        next += batch.len() as u64;
        futures::future::try_join_all(batch.iter().map(|i| {
            let key = format!("unrelated:{i:08}");
            let (store, value) = (&store, &value);
            async move { store.compare_and_set(&key, None, value, None).await }
        }))
        .await
        .map_err(|e| e.to_string())?;
    }
    eprintln!(
        "filled {n} unrelated keys in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `INFO commandstats` (calls per command, and the scripts' server time in µs as
/// `evalsha usec`), `INFO cpu` (server CPU seconds) and the commands processed of a Redis.
pub async fn redis_info(
    conn: &mut redis::aio::MultiplexedConnection,
) -> (BTreeMap<String, u64>, f64, u64) {
    let text: String = redis::cmd("INFO")
        .arg("all")
        .query_async(conn)
        .await
        .unwrap();
    let mut calls = BTreeMap::new();
    let mut cpu = 0.0;
    let mut total = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("cmdstat_") {
            if let Some((cmd, stats)) = rest.split_once(':') {
                let field = |name: &str| -> u64 {
                    stats
                        .split(',')
                        .find_map(|kv| kv.strip_prefix(name))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0)
                };
                calls.insert(cmd.to_owned(), field("calls="));
                // The server time of the scripts, in µs, under a name of its own.
                if cmd == "evalsha" {
                    calls.insert("evalsha usec".to_owned(), field("usec="));
                }
            }
        } else if let Some(v) = line
            .strip_prefix("used_cpu_sys:")
            .or_else(|| line.strip_prefix("used_cpu_user:"))
        {
            cpu += v.trim().parse::<f64>().unwrap_or(0.0);
        } else if let Some(v) = line.strip_prefix("total_commands_processed:") {
            total = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("total_net_output_bytes:") {
            // The bytes the server sent its clients, under a name of its own.
            calls.insert("net output bytes".to_owned(), v.trim().parse().unwrap_or(0));
        }
    }
    (calls, cpu, total)
}

/// etcd's request counters (its Prometheus `/metrics` on the client port): gRPC messages
/// received and RPCs started by method, keys put, and write-ahead-log syncs.
pub async fn etcd_metrics(port: u16) -> BTreeMap<String, f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut out = BTreeMap::new();
    let Ok(mut conn) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return out;
    };
    let request =
        format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if conn.write_all(request.as_bytes()).await.is_err() {
        return out;
    }
    let mut text = String::new();
    let _ = conn.read_to_string(&mut text).await;
    for line in text.lines() {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let method = |rest: &str| {
            rest.split("grpc_method=\"")
                .nth(1)
                .and_then(|m| m.split('"').next())
                .map(str::to_owned)
        };
        let key = if let Some(rest) = name.strip_prefix("grpc_server_msg_received_total{") {
            match method(rest) {
                Some(method) => method,
                None => continue,
            }
        } else if let Some(rest) = name.strip_prefix("grpc_server_started_total{") {
            match method(rest) {
                Some(method) => format!("{method} RPCs started"),
                None => continue,
            }
        } else if name == "etcd_mvcc_put_total" || name == "etcd_debugging_mvcc_put_total" {
            "puts".to_owned()
        } else if name == "etcd_disk_wal_fsync_duration_seconds_count" {
            "WAL syncs".to_owned()
        } else {
            continue;
        };
        *out.entry(key).or_default() += value;
    }
    out
}

/// A counting TCP proxy in front of the server at `url` when it is one (`127.0.0.1:PORT`): the
/// proxy, the URL that goes through it, and the server's own port. A URL that names no port
/// (SQLite) comes back as it is, with neither.
pub async fn behind_proxy(url: &str) -> Result<(Option<Proxy>, String, Option<u16>), String> {
    let Some((_, upstream)) = via_port(url, 0) else {
        return Ok((None, url.to_owned(), None));
    };
    let proxy = Proxy::start(upstream).await.map_err(|e| e.to_string())?;
    let through = via_port(url, proxy.port())
        .map(|(u, _)| u)
        .unwrap_or_default();
    Ok((Some(proxy), through, Some(upstream)))
}

/// `url` with the port of its first `127.0.0.1:PORT` replaced by `port`, and the old port.
pub fn via_port(url: &str, port: u16) -> Option<(String, u16)> {
    let host = "127.0.0.1:";
    let at = url.find(host)? + host.len();
    let end = url[at..]
        .find(|c: char| !c.is_ascii_digit())
        .map_or(url.len(), |e| at + e);
    let old: u16 = url[at..end].parse().ok()?;
    Some((format!("{}{port}{}", &url[..at], &url[end..]), old))
}

/// This process's resident memory in bytes (`VmRSS` of `/proc/self/status`; 0 where there is
/// none).
#[allow(dead_code)]
pub fn own_rss() -> u64 {
    rss_of("self")
}

/// The resident memory in bytes of the process `pid` (`"self"`, or a number), from `VmRSS` of
/// `/proc/<pid>/status`; 0 where there is none.
#[allow(dead_code)]
pub fn rss_of(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The system allocator, counting the bytes it has handed out and not had back: what a bench
/// installs as its `#[global_allocator]` to read the live heap ([`live_heap`]) beside the
/// resident set, which also holds what the allocator keeps after frees (fragmentation).
pub struct CountingAlloc;

static LIVE_HEAP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The bytes allocated and not yet freed, when the bench installed [`CountingAlloc`]; 0 if not.
pub fn live_heap() -> u64 {
    LIVE_HEAP.load(std::sync::atomic::Ordering::Relaxed) as u64
}

#[allow(unsafe_code)]
// SAFETY: every call is passed on to the system allocator unchanged; the counter is only
// arithmetic beside it.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if !p.is_null() {
            LIVE_HEAP.fetch_add(layout.size(), std::sync::atomic::Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as for `alloc`.
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        LIVE_HEAP.fetch_sub(layout.size(), std::sync::atomic::Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_HEAP.fetch_add(layout.size(), std::sync::atomic::Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new) };
        if !p.is_null() {
            LIVE_HEAP.fetch_add(new, std::sync::atomic::Ordering::Relaxed);
            LIVE_HEAP.fetch_sub(layout.size(), std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
}

/// CPU seconds (user + system) used by this process so far.
#[allow(unsafe_code)]
pub fn own_cpu() -> f64 {
    // SAFETY: rusage is a plain C struct of integers, so all-zero is a valid value, and
    // getrusage only writes into the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0.0;
        }
        ru
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Whole milliseconds, for a table.
pub fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}
