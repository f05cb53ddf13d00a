//! `list` on a Redis shared with unrelated data: a prefix holding 10, 100 and 1,000 keys, with 0
//! and with 1,000,000 unrelated keys in the database.
//!
//! ```sh
//! cargo bench -p headcount-conformance --bench listing
//! ```
//!
//! The Redis is a dedicated `redis-server` the conformance harness starts (with
//! `enable-debug-command yes`, so `DEBUG POPULATE` fills it). For each size it reports the client
//! latency of `Store::list` (median and 99th percentile, this process, release build) beside the
//! server's time per call (`usec_per_call` of `EVALSHA` in `INFO commandstats`). The rows marked
//! "SCAN (before the index)" run the listing script headcount used before its key index (kept
//! below, verbatim) over the same keys, for comparison.
//!
//! Run without `--bench` (as `cargo test --all-targets` does) it makes a smoke run: 10,000
//! unrelated keys, a prefix of 10 keys, 5 calls. It prints a Markdown table;
//! `docs/benchmarks.md` ("Listing on a shared Redis") holds a run of it.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use headcount::DynStore;
use headcount_harness::{KvStore, ServerKind, Unavailable};
use redis::aio::MultiplexedConnection;

/// The listing script before the key index: a SCAN of the whole keyspace inside Lua.
const OLD_LIST_LUA: &str = include_str!("scripts/scan_list.lua");

struct Plan {
    fillers: Vec<u64>,
    sizes: Vec<usize>,
    reps: usize,
    old_reps: usize,
}

fn plan() -> Plan {
    if std::env::args().any(|a| a == "--bench") {
        Plan {
            fillers: vec![0, 1_000_000],
            sizes: vec![10, 100, 1000],
            reps: 200,
            old_reps: 10,
        }
    } else {
        Plan {
            fillers: vec![10_000],
            sizes: vec![10],
            reps: 5,
            old_reps: 2,
        }
    }
}

async fn query<T: redis::FromRedisValue>(
    conn: &mut MultiplexedConnection,
    cmd: &mut redis::Cmd,
) -> T {
    cmd.query_async(conn).await.unwrap()
}

/// `usec_per_call` of EVALSHA since the last `CONFIG RESETSTAT`.
async fn evalsha_usec(conn: &mut MultiplexedConnection) -> f64 {
    let info: String = query(conn, redis::cmd("INFO").arg("commandstats")).await;
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|s| {
            s.split(',')
                .find_map(|kv| kv.strip_prefix("usec_per_call="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn glob_escape(prefix: &str) -> String {
    let mut out = String::new();
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

/// Median and 99th percentile.
fn spread(mut times: Vec<Duration>) -> (Duration, Duration) {
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

async fn measure(
    store: &DynStore,
    conn: &mut MultiplexedConnection,
    prefix: &str,
    n: usize,
    reps: usize,
    old: bool,
) -> (Duration, Duration, f64) {
    let script = redis::Script::new(OLD_LIST_LUA);
    let pattern = glob_escape(prefix);
    let calls_conn = conn.clone();
    let call = || {
        let store = store.clone();
        let mut conn = calls_conn.clone();
        let script = script.clone();
        let pattern = pattern.clone();
        let prefix = prefix.to_owned();
        async move {
            let started = Instant::now();
            let got = if old {
                let v: redis::Value = script
                    .key(&prefix)
                    .arg(&pattern)
                    .arg(&prefix)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                match v {
                    redis::Value::Array(items) => (items.len() - 1) / 2,
                    other => panic!("old script: {other:?}"),
                }
            } else {
                store.list(&prefix).await.unwrap().len()
            };
            assert_eq!(got, n, "listing of {prefix}");
            started.elapsed()
        }
    };
    // One call loads the script (NOSCRIPT) and warms up; the statistics start after it.
    call().await;
    let _: () = query(conn, redis::cmd("CONFIG").arg("RESETSTAT")).await;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        times.push(call().await);
    }
    let usec = evalsha_usec(conn).await;
    let (median, p99) = spread(times);
    (median, p99, usec)
}

fn main() {
    let plan = plan();
    let server = match KvStore::redis_with(None, &["--enable-debug-command", "yes"]) {
        Ok(s) => s,
        Err(Unavailable::Missing(why)) if !ServerKind::Redis.required() => {
            eprintln!("SKIP listing bench: {why}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let url = server.url();
        let store = headcount::connect(&format!("{url}?timeout=30s")).await.unwrap();
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let mut rows = Vec::new();
        for &filler in &plan.fillers {
            let _: () = query(&mut conn, &mut redis::cmd("FLUSHALL")).await;
            if filler > 0 {
                let _: () = query(
                    &mut conn,
                    redis::cmd("DEBUG").arg("POPULATE").arg(filler).arg("filler"),
                )
                .await;
            }
            for &n in &plan.sizes {
                let prefix = format!("hc:{{bench{n}}}:slot:");
                for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
                    futures::future::try_join_all(chunk.iter().map(|i| {
                        let store = store.clone();
                        let key = format!("{prefix}{i}");
                        async move {
                            store
                                .compare_and_set(&key, None, "member", Some(Duration::from_secs(3600)))
                                .await
                        }
                    }))
                    .await
                    .unwrap();
                }
                let dbsize: u64 = query(&mut conn, &mut redis::cmd("DBSIZE")).await;
                for old in [false, true] {
                    let reps = if old { plan.old_reps } else { plan.reps };
                    let (median, p99, usec) =
                        measure(&store, &mut conn, &prefix, n, reps, old).await;
                    let design = if old { "SCAN (before the index)" } else { "key index" };
                    eprintln!("{filler} unrelated, {n} under the prefix, {design}: median {median:?}");
                    rows.push(format!(
                        "| {filler} | {dbsize} | {n} | {design} | {reps} | {} | {} | {usec:.1} |",
                        ms(median),
                        ms(p99)
                    ));
                }
            }
        }
        println!("\n| unrelated keys | keys in the database | keys under the prefix | listing | calls | client median ms | client p99 ms | server µs per call |");
        println!("|---:|---:|---:|---|---:|---:|---:|---:|");
        for r in rows {
            println!("{r}");
        }
    });
}
