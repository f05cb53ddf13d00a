//! The exit statuses of `docs/cli.md` where they were wrong: usage errors found before the store
//! is touched (so an outage does not turn them into "retry"), a server of another protocol is a
//! permanent failure (not "retry" forever), a requested stop is a success even when the store is
//! gone, and `ids next` with no stdout draws no ID. Real processes; Redis started by the
//! conformance harness where one is needed.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // tests fail by panicking

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use headcount_conformance::wait::exit_within;
use headcount_harness::{skip_unless_required, KvStore, ServerKind};
use serde_json::Value;

mod common;

use common::{headcount, one_error_line, sqlite, text};

/// Nothing listens on port 1: connecting fails at once, retryably.
const DOWN: &str = "redis://127.0.0.1:1/?timeout=500ms";

#[test]
fn usage_errors_are_found_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let never = dir.path().join("never.db");
    let fresh = sqlite(dir.path(), "never.db");
    let cases: [(&[&str], &str); 7] = [
        (&["--group", "bad group"], "group"),
        // A readiness file that could never be written: the member would never be ready.
        (
            &[
                "--group",
                "g",
                "--ready-file",
                "/nonexistent/headcount/ready",
            ],
            "does not exist",
        ),
        (&["--group", "g", "--ready-file", "/"], "is a directory"),
        (&["--group", "g", "--member", "not an id!"], "member"),
        (&["--group", "g", "--ttl", "5ms"], "TTL"),
        (&["--group", "g", "--ttl", "2h"], "TTL"),
        (
            &["--group", "g", "--mode", "interval", "--interval", "0s"],
            "interval",
        ),
    ];
    for (args, needle) in cases {
        for store in [DOWN, fresh.as_str()] {
            let out = headcount()
                .args(["run", "--store", store])
                .args(args)
                .output()
                .unwrap();
            let line = one_error_line(&out, 2);
            assert!(line.contains(needle), "run {args:?}: {line}");
            if args.contains(&"interval") {
                continue;
            }
            let out = headcount()
                .args(["exec", "--store", store])
                .args(args)
                .args(["--", "true"])
                .output()
                .unwrap();
            let line = one_error_line(&out, 125);
            assert!(line.contains(needle), "exec {args:?}: {line}");
        }
    }
    assert!(!never.exists(), "a store was opened for a usage error");
}

/// `postgres://` and `etcd://` URLs that point at a Redis port: the server will never speak
/// the protocol, so the command fails for good (1, not 75) and says what it found.
#[test]
fn a_server_of_another_protocol_is_a_permanent_failure() {
    let started = KvStore::redis(None);
    let Some(redis) = skip_unless_required(ServerKind::Redis, "another protocol", started) else {
        return;
    };
    let port = redis.servers[0].port;
    let mut urls = vec![(
        format!("postgres://u:secret@127.0.0.1:{port}/db?timeout=2s"),
        "PostgreSQL",
    )];
    if cfg!(feature = "etcd") {
        urls.push((format!("etcd://127.0.0.1:{port}?timeout=2s"), "etcd"));
    }
    for (url, needle) in urls {
        for command in [&["status", "--group", "g"][..], &["run", "--group", "g"]] {
            let out = headcount()
                .args(command)
                .args(["--store", &url])
                .output()
                .unwrap();
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{command:?} {url}: {stderr}");
            assert!(stderr.contains(needle), "{stderr}");
            assert!(!stderr.contains("secret"), "{stderr}");
        }
    }
}

/// SIGTERM while the store is down: the stop was asked for, so `run` and `exec` exit 0 (the
/// leave's failure is in the last line, and logged).
#[test]
fn a_requested_stop_exits_0_while_the_store_is_down() {
    let started = KvStore::redis(Some(Duration::from_millis(300)));
    let Some(redis) = skip_unless_required(ServerKind::Redis, "stop with the store down", started)
    else {
        return;
    };
    let url = redis.url();
    let mut run = headcount()
        .args(["run", "--store", &url, "--group", "g", "--ttl", "3s"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut run_lines = BufReader::new(run.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&run_lines.next().unwrap().unwrap()).unwrap();
    assert!(first["phase"].is_string(), "{first}");
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let mut exec = headcount()
        .args(["exec", "--store", &url, "--group", "e", "--ttl", "3s"])
        .args(["--grace", "1s", "--", "sh", "-c"])
        .arg(format!(
            "touch {}; exec sleep 60",
            started.to_str().unwrap()
        ))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !started.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "exec never ran its command"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    redis.servers[0].kill().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for child in [&run, &exec] {
        let _ = Command::new("kill").arg(child.id().to_string()).status();
    }
    let status = exit_within(&mut run, "run", Duration::from_secs(15));
    let rest: Vec<Value> = run_lines
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    let last = rest.last().expect("a stopped line");
    assert_eq!(last["phase"], "stopped", "{last}");
    let status = exit_within(&mut exec, "exec", Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "{status}");
}

/// `ids next >&-`: with no stdout to print on, no ID is drawn (the next call gets the first);
/// the same for a stdout open for reading only. `> /dev/null` is a choice: it draws.
#[test]
fn ids_next_with_stdout_closed_draws_no_id() {
    let dir = tempfile::tempdir().unwrap();
    let stores = ["a.db", "b.db", "c.db"]
        .map(|f| sqlite(dir.path(), f))
        .join(",");
    let next_with = |redirect: &str| {
        Command::new("sh")
            .args(["-c", &format!("exec \"$@\" {redirect}"), "sh"])
            .arg(env!("CARGO_BIN_EXE_headcount"))
            .args(["ids", "next", "--stores", &stores, "--allow-non-durable"])
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    };
    for redirect in [">&-", "1</dev/null"] {
        let out = next_with(redirect);
        let line = one_error_line(&out, 1);
        assert!(line.contains("stdout") && line.contains("no ID"), "{line}");
    }
    let out = headcount()
        .args(["ids", "next", "--stores", &stores, "--allow-non-durable"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "1\n",
        "an ID was spent on the closed stdout"
    );
    let out = next_with(">/dev/null");
    assert!(out.status.success(), "{}", text(&out.stderr));
}
