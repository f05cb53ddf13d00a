//! `headcount ids next` end to end on SQLite files (and unreachable Redis URLs for the
//! no-majority case).
#![allow(clippy::expect_used, clippy::panic)] // test helpers fail the test by panicking

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn headcount(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_headcount"))
        .args(args)
        .env_remove("HEADCOUNT_STORE")
        .env_remove("RUST_LOG")
        .output()
        .expect("run headcount")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ids(out: &Output) -> Vec<i64> {
    assert!(out.status.success(), "stderr:\n{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| l.parse().expect("one ID per line"))
        .collect()
}

/// The error line of a failed run: exactly one `headcount: error:` line, non-zero status.
fn error_line(out: &Output) -> String {
    assert!(!out.status.success(), "stdout:\n{}", text(&out.stdout));
    assert!(
        out.stdout.is_empty(),
        "printed an ID: {}",
        text(&out.stdout)
    );
    let stderr = text(&out.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("headcount: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    errors[0].to_owned()
}

fn sqlite_urls(dir: &tempfile::TempDir, n: usize, query: &str) -> String {
    (0..n)
        .map(|i| format!("sqlite://{}/ids{i}.db{query}", dir.path().display()))
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn three_durable_sqlite_files_give_increasing_ids_across_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stores = sqlite_urls(&dir, 3, "?synchronous=full");
    let first = ids(&headcount(&["ids", "next", "--stores", &stores, "-n", "5"]));
    assert_eq!(first, vec![1, 2, 3, 4, 5]);
    let again = ids(&headcount(&[
        "ids", "next", "--stores", &stores, "--key", "default",
    ]));
    assert_eq!(again, vec![6]);
    let other = ids(&headcount(&[
        "ids", "next", "--stores", &stores, "--key", "orders",
    ]));
    assert_eq!(other, vec![1], "another key is another sequence");
}

#[test]
fn bad_store_lists_are_one_line_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = error_line(&headcount(&["ids", "next", "--stores", ""]));
    assert!(empty.contains("names no store"), "{empty}");
    let one = format!("sqlite://{}/a.db?synchronous=full", dir.path().display());
    let twice = format!("{one},{one},{}", sqlite_urls(&dir, 1, "?synchronous=full"));
    let dup = error_line(&headcount(&["ids", "next", "--stores", &twice]));
    assert!(dup.contains("twice"), "{dup}");
    let zero = error_line(&headcount(&["ids", "next", "--stores", &one, "-n", "0"]));
    assert!(zero.contains("-n"), "{zero}");
}

#[test]
fn a_non_durable_store_is_refused_without_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    // SQLite's default is synchronous=NORMAL: not durable.
    let stores = sqlite_urls(&dir, 3, "");
    let refused = error_line(&headcount(&["ids", "next", "--stores", &stores]));
    assert!(
        refused.contains("not durable") && refused.contains("--allow-non-durable"),
        "{refused}"
    );
    let out = headcount(&["ids", "next", "--stores", &stores, "--allow-non-durable"]);
    assert_eq!(ids(&out), vec![1]);
    assert!(
        text(&out.stderr).contains("not durable"),
        "the opt-out is logged"
    );
}

#[test]
fn no_majority_fails_closed_within_the_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stores = format!(
        "{},redis://127.0.0.1:1?timeout=500ms,redis://127.0.0.1:2?timeout=500ms",
        sqlite_urls(&dir, 1, "?synchronous=full")
    );
    let started = Instant::now();
    let out = headcount(&["ids", "next", "--stores", &stores, "--deadline", "1s"]);
    let line = error_line(&out);
    assert!(line.contains("no majority (2 of 3)"), "{line}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// The value, or None with a SKIP line when the backend is missing and not required.
fn available<T>(
    backend: headcount_harness::ServerKind,
    r: Result<T, headcount_harness::Unavailable>,
) -> Option<T> {
    headcount_harness::skip_unless_required(backend, "cli ids", r)
}

/// Every store the README names, in one set: Redis (AOF always), PostgreSQL (fsync on), etcd,
/// a SQLite file (synchronous=full), and a Redis Cluster, which the harness runs without
/// persistence: refused until `--allow-non-durable`.
#[test]
fn every_readme_store_in_one_set() {
    use headcount_harness::{KvStore, PgServer, ServerKind};
    let aof = &["--appendonly", "yes", "--appendfsync", "always"];
    let Some(redis) = available(ServerKind::Redis, KvStore::redis_with(None, aof)) else {
        return;
    };
    let Some(pg) = available(
        ServerKind::Postgres,
        PgServer::start_with(None, &["fsync=on"]),
    ) else {
        return;
    };
    let Some(etcd) = available(ServerKind::Etcd, KvStore::etcd(1, None)) else {
        return;
    };
    let Some(cluster) = available(ServerKind::RedisCluster, KvStore::redis_cluster(None, None))
    else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = [
        redis.url(),
        pg.url(),
        etcd.url(),
        sqlite_urls(&dir, 1, "?synchronous=full"),
    ]
    .join(",");
    let got = ids(&headcount(&[
        "ids", "next", "--stores", &durable, "-n", "3",
    ]));
    assert_eq!(got, vec![1, 2, 3]);
    // The cluster's URL lists three hosts: its commas join them, the next scheme starts a store.
    let with_cluster = format!("{durable},{}", cluster.url());
    let refused = error_line(&headcount(&["ids", "next", "--stores", &with_cluster]));
    assert!(refused.contains("store #4 (redis)"), "{refused}");
    let got = ids(&headcount(&[
        "ids",
        "next",
        "--stores",
        &with_cluster,
        "--allow-non-durable",
        "-n",
        "2",
    ]));
    assert_eq!(got, vec![4, 5]);
}

/// `ids serve` and `ids next --server` with bad input: one error line each, the right exit
/// status, and no hang past the deadline.
#[test]
fn ids_servers_refuse_bad_input_in_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let even = sqlite_urls(&dir, 2, "?synchronous=full");
    let out = headcount(&["ids", "serve", "--listen", "127.0.0.1:0", "--stores", &even]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(error_line(&out).contains("odd number"));
    let out = headcount(&[
        "ids",
        "serve",
        "--listen",
        "nowhere",
        "--stores",
        &sqlite_urls(&dir, 3, "?synchronous=full"),
    ]);
    assert!(error_line(&out).contains("cannot listen on nowhere"));

    let bad = headcount(&["ids", "next", "--server", "no port here"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    assert!(error_line(&bad).contains("not a server address"));
    let both = headcount(&["ids", "next", "--server", "127.0.0.1:1", "--stores", &even]);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both.stderr));

    // Nothing listens on port 1: fails closed within the deadline, retryable (75).
    let started = Instant::now();
    let gone = headcount(&["ids", "next", "--server", "127.0.0.1:1", "--deadline", "1s"]);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(gone.status.code(), Some(75), "{}", text(&gone.stderr));
    assert!(error_line(&gone).contains("no IDs server answered"));

    // A running server: unknown generators and bad counts are the caller's errors.
    let stores = sqlite_urls(&dir, 3, "?synchronous=full");
    let mut server = Command::new(env!("CARGO_BIN_EXE_headcount"))
        .args([
            "ids",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--stores",
            &stores,
        ])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start ids serve");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("the address");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .expect("address line")
        .to_owned();
    let got = ids(&headcount(&["ids", "next", "--server", &addr, "-n", "3"]));
    assert_eq!(got, vec![1, 2, 3]);
    let unknown = headcount(&["ids", "next", "--server", &addr, "--key", "nope"]);
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown.stderr));
    assert!(error_line(&unknown).contains("no ID generator `nope`"));
    let zero = headcount(&["ids", "next", "--server", &addr, "-n", "0"]);
    assert!(error_line(&zero).contains("-n"));
    let huge = headcount(&["ids", "next", "--server", &addr, "-n", "99999999"]);
    assert!(error_line(&huge).contains("1 to 1048576"));
    let _ = server.kill();
    let _ = server.wait();
}

/// `ids next` through PgBouncer in transaction mode (two server connections, which the processes'
/// connections take turns on): three processes at once get 20 increasing IDs each, 60 distinct
/// ones in all. With named
/// prepared statements they failed on statements prepared on another server connection, or
/// named like another process's.
#[cfg(feature = "postgres")]
#[test]
fn ids_through_pgbouncer_in_transaction_mode() {
    use headcount_harness::{PgBouncer, ServerKind};
    let Some(bouncer) = available(ServerKind::PgBouncer, PgBouncer::start_new(None)) else {
        return;
    };
    // The harness's server runs with fsync off: not durable.
    let url = bouncer.url();
    let runs: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                ids(&headcount(&[
                    "ids",
                    "next",
                    "--stores",
                    &url,
                    "--allow-non-durable",
                    "-n",
                    "20",
                ]))
            })
        })
        .collect();
    let mut all = Vec::new();
    for run in runs {
        let got = run.join().expect("an ids run");
        assert_eq!(got.len(), 20, "{got:?}");
        assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
        all.extend(got);
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 60, "{all:?}");
}
