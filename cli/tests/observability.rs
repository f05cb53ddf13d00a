//! `--metrics-addr` and `--log-format`, end to end: a real `headcount run` on a SQLite file
//! serves the documented metrics over plain HTTP; bad input fails in one line.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // tests fail by panicking

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use headcount_conformance::wait::eventually_blocking;

mod common;

use common::Reap;

fn headcount() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_headcount"));
    c.env_remove("HEADCOUNT_STORE")
        .env_remove("RUST_LOG")
        .env_remove("HEADCOUNT_LOG_FORMAT")
        .env_remove("HEADCOUNT_METRICS_ADDR");
    c
}

/// `headcount run --ttl 600ms` with `args`, serving metrics on a port of its choice and logging
/// JSON: the process, the address it serves at (from its first log line), and its later log
/// lines.
fn serving(args: &[&str]) -> (Reap, String, mpsc::Receiver<String>) {
    let mut child = headcount()
        .args(["run", "--ttl", "600ms"])
        .args(args)
        .args(["--metrics-addr", "127.0.0.1:0", "--log-format", "json"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start headcount");
    let stderr = child.stderr.take().expect("stderr");
    let reap = Reap(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The first log line says where the endpoint listens (port 0 picked one).
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a log line with the metrics address");
    assert!(!line.contains('\u{1b}'), "ANSI escapes in a pipe: {line:?}");
    let v: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
    let addr = v["fields"]["addr"]
        .as_str()
        .unwrap_or_else(|| panic!("no addr in {line}"))
        .to_owned();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    (reap, addr, rx)
}

/// `GET path` over plain TCP; returns the status line and the body.
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("read the reply");
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

#[test]
fn run_serves_the_documented_metrics_and_logs_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/m.db", dir.path().display());
    let (reap, addr, rx) = serving(&["--store", &url, "--group", "metrics"]);

    // Heartbeats every 200 ms: poll until the group's renewal shows up as a store operation.
    let what = "a heartbeat metric";
    let every = Duration::from_millis(100);
    let body = eventually_blocking(what, Duration::from_secs(20), every, || {
        let (status, body) = http_get(&addr, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
        // The store's metric and the group's are recorded one after the other: wait for both.
        if body.contains("operation=\"renew_and_list_if_changed\"")
            && body.contains("headcount_group_heartbeat_duration_seconds_count")
        {
            Ok(body)
        } else {
            Err(body)
        }
    });
    for name in [
        "# TYPE headcount_store_operation_duration_seconds histogram",
        "headcount_store_operation_duration_seconds_bucket{backend=\"sqlite\",operation=\"compare_and_set\",le=\"0.001\"}",
        "headcount_store_operation_duration_seconds_count{backend=\"sqlite\",operation=\"list\"}",
        "# TYPE headcount_group_heartbeat_duration_seconds histogram",
        "headcount_group_heartbeat_duration_seconds_count{group=\"metrics\"}",
        "headcount_group_view_changes_total{group=\"metrics\"} 1",
        "headcount_group_epoch{group=\"metrics\"} 1",
        "headcount_group_members_live{group=\"metrics\"} 1",
        "headcount_group_handoff_duration_seconds_count{group=\"metrics\"} 1",
    ] {
        assert!(body.contains(name), "{name} missing from:\n{body}");
    }
    let (status, _) = http_get(&addr, "/nothing");
    assert!(status.contains("404"), "{status}");
    let ready = http_get(&addr, "/ready");
    assert_eq!(ready, ("HTTP/1.1 200 OK".into(), "ready\n".into()));
    let working = http_get(&addr, "/working");
    assert_eq!(working, ("HTTP/1.1 200 OK".into(), "working\n".into()));
    drop(reap);
    // Every line the process wrote on stderr was a JSON object.
    for line in rx.try_iter() {
        assert!(
            serde_json::from_str::<serde_json::Value>(&line).is_ok(),
            "{line:?}"
        );
    }
}

#[test]
fn a_metrics_address_in_use_fails_in_one_line_before_joining() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("never.db");
    let url = format!("sqlite://{}", db.display());
    let out = headcount()
        .args([
            "run",
            "--store",
            &url,
            "--group",
            "g",
            "--metrics-addr",
            &addr,
        ])
        .output()
        .expect("run headcount");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot serve metrics on"), "{stderr}");
    assert!(
        !db.exists(),
        "the store was opened before the metrics failed"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn a_bad_log_format_fails_in_one_line() {
    for args in [
        &["--log-format", "xml", "run", "--group", "g"][..],
        &["run", "--group", "g", "--log-format", ""][..],
    ] {
        let out = headcount()
            .args(args)
            .args(["--store", "memory://"])
            .output()
            .expect("run headcount");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains("--log-format"), "{stderr}");
    }
}

#[test]
fn passwords_never_reach_the_logs() {
    // Nothing listens on port 1; every log level on, in both formats.
    for format in ["text", "json"] {
        let out = headcount()
            .env("RUST_LOG", "trace")
            .args(["--log-format", format, "run", "--group", "g"])
            .args([
                "--store",
                "postgres://app:hunter2@127.0.0.1:1/db?timeout=1s",
            ])
            .output()
            .expect("run headcount");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}

/// With `--log-format json`, every line on stderr is JSON, the fatal error line included (a
/// usage error found by clap, one found before connecting, and a store error).
#[test]
fn the_fatal_line_is_json_under_log_format_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/j.db", dir.path().display());
    for (args, code) in [
        (vec!["run", "--store", &url, "--grup", "g"], 2),
        (vec!["run", "--store", &url, "--group", "bad group"], 2),
        (
            vec![
                "status",
                "--store",
                "redis://127.0.0.1:1/?timeout=200ms",
                "--group",
                "g",
            ],
            75,
        ),
        (
            vec![
                "exec",
                "--store",
                &url,
                "--group",
                "g",
                "--",
                "/nonexistent",
            ],
            127,
        ),
    ] {
        for how in ["flag", "env"] {
            let mut c = headcount();
            match how {
                "flag" => c.args(["--log-format", "json"]),
                _ => c.env("HEADCOUNT_LOG_FORMAT", "json"),
            };
            let out = c.args(&args).output().expect("run headcount");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
            let lines: Vec<&str> = stderr.lines().collect();
            assert!(!lines.is_empty(), "{args:?}: nothing on stderr");
            for line in &lines {
                let v: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("{args:?} ({how}): not JSON ({e}): {line:?}"));
                assert!(v["timestamp"].is_string(), "{line}");
            }
            let last: serde_json::Value =
                serde_json::from_str(lines[lines.len() - 1]).expect("JSON");
            assert_eq!(last["level"], "ERROR", "{last}");
            assert!(
                last["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{last}"
            );
            assert_eq!(last["fields"]["exit_code"], code, "{last}");
        }
    }
}

/// `distributor service` prints one line per change of its units, stamped like `run`'s.
#[test]
fn distributor_service_lines_carry_a_timestamp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/d.db", dir.path().display());
    let added = headcount()
        .args(["--store", &url, "distributor", "units", "add", "u1"])
        .output()
        .expect("add a unit");
    assert!(added.status.success(), "{added:?}");
    let daemon = headcount()
        .args(["--store", &url, "distributor", "--poll-interval", "200ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the daemon");
    let _daemon = Reap(daemon);
    let child = headcount()
        .args(["--store", &url, "distributor", "service", "--name", "s1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the service");
    let mut reap = Reap(child);
    let stdout = reap.0.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    // The registration line, then the line of its units once the daemon gave it `u1`.
    let mut seen = Vec::new();
    while let Some(Ok(line)) = lines.next() {
        let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        let is_units = v["units"].as_array().is_some_and(|u| !u.is_empty());
        seen.push(v);
        if is_units {
            break;
        }
    }
    let last = seen.last().expect("a line");
    assert!(last.get("units").is_some(), "{seen:?}");
    let at = last["at"]
        .as_str()
        .unwrap_or_else(|| panic!("no `at` in {last}"));
    assert!(at.ends_with('Z') && at.len() == 24, "{at}");
}

/// A standby is ready (a deploy may go on) but not working (it owns nothing yet): `/ready` and
/// `/working` tell the two apart.
#[test]
fn a_standby_is_ready_but_not_working() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/m.db", dir.path().display());
    let first = headcount()
        .args(["run", "--store", &url, "--group", "surge", "--ttl", "600ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start headcount");
    let _first = Reap(first);
    let (_reap, addr, _lines) =
        serving(&["--store", &url, "--group", "surge", "--standby-for", "60s"]);
    let every = Duration::from_millis(50);
    eventually_blocking("the standby ready", Duration::from_secs(20), every, || {
        let ready = http_get(&addr, "/ready");
        if ready.0 == "HTTP/1.1 200 OK" {
            Ok(())
        } else {
            Err(ready)
        }
    });
    assert_eq!(http_get(&addr, "/ready").1, "ready (standing by)\n");
    let (status, body) = http_get(&addr, "/working");
    assert_eq!(status, "HTTP/1.1 503 Service Unavailable", "{body}");
}
