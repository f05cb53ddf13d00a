//! The CLI's contract from outside, as a supervisor, a shell pipeline or a typo meets it: exit
//! statuses, the one error line, environment variables, closed or full stdout, and commands
//! that must refuse before they touch the store. Real processes, real SQLite files and, where
//! a server is involved, a real Redis started by the conformance harness.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // tests fail by panicking

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use headcount_conformance::wait::{eventually_blocking, exit_within};
use serde_json::Value;

mod common;

use common::{headcount, one_error_line, output, status_json, text};

fn url(dir: &Path, file: &str) -> String {
    common::sqlite(dir, file)
}

fn members(url: &str, group: &str) -> usize {
    common::members(url, group).len()
}

#[test]
fn services_without_a_store_refuse_off_a_terminal_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = output(
        headcount()
            .current_dir(dir.path())
            .args(["run", "--group", "g"]),
    );
    let line = one_error_line(&out, 2);
    assert!(line.contains("--store"), "{line}");
    let out = output(
        headcount()
            .current_dir(dir.path())
            .args(["exec", "--group", "g", "--", "true"]),
    );
    one_error_line(&out, 125);
    let out =
        output(
            headcount()
                .current_dir(dir.path())
                .args(["distributor", "units", "add", "u"]),
        );
    one_error_line(&out, 2);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn group_member_and_ttl_come_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(dir.path(), "env.db");
    let mut child = headcount()
        .args(["run", "--store", &url])
        .env("HEADCOUNT_GROUP", "from-env")
        .env("HEADCOUNT_MEMBER", "pod-0")
        .env("HEADCOUNT_TTL", "900ms")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["group"], "from-env");
    assert_eq!(first["member"], "pod-0");
    let s = status_json(&url, "from-env");
    assert_eq!(s["members"][0]["ttl_ms"], 900, "{s}");
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    assert!(exit_within(&mut child, "headcount", Duration::from_secs(10)).success());
    // A TTL without a unit is refused wherever it comes from.
    let out = output(
        headcount()
            .args(["run", "--store", &url, "--group", "g"])
            .env("HEADCOUNT_TTL", "1"),
    );
    let line = one_error_line(&out, 2);
    assert!(line.contains("unit"), "{line}");
}

#[test]
fn distributor_variables_work_unprefixed_and_prefixed_wins() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(dir.path(), "d.db");
    let add = |env: &[(&str, &str)], unit: &str| {
        let mut c = headcount();
        c.args(["--store", &url, "distributor", "units", "add", unit]);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = output(&mut c);
        assert!(out.status.success(), "{}", text(&out.stderr));
    };
    add(&[("WORKUNITS_NAMESPACE", "legacy")], "a");
    add(&[("HEADCOUNT_WORKUNITS_NAMESPACE", "prefixed")], "b");
    add(
        &[
            ("WORKUNITS_NAMESPACE", "legacy"),
            ("HEADCOUNT_WORKUNITS_NAMESPACE", "prefixed"),
        ],
        "c",
    );
    let ls = |ns: &str| {
        let out = output(headcount().args([
            "--store",
            &url,
            "distributor",
            "units",
            "--workunits-namespace",
            ns,
            "ls",
        ]));
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    assert_eq!(ls("legacy"), "{\"unit\":\"a\"}\n");
    assert_eq!(ls("prefixed"), "{\"unit\":\"b\"}\n{\"unit\":\"c\"}\n");
}

#[test]
fn exit_statuses_tell_usage_from_outage_from_permanent() {
    let dir = tempfile::tempdir().unwrap();
    // Usage: clap's errors in our format.
    let out = output(headcount().args(["run", "--grup", "g"]));
    let line = one_error_line(&out, 2);
    assert!(line.contains("--group"), "{line}");
    let out = output(headcount().args(["run", "--group", "g", "--assignor", "bogus"]));
    let line = one_error_line(&out, 2);
    assert!(line.contains("jumpback"), "{line}");
    // Unreachable: nothing listens on port 1.
    let out = output(headcount().args([
        "status",
        "--store",
        "redis://127.0.0.1:1/?timeout=500ms",
        "--group",
        "g",
    ]));
    one_error_line(&out, 75);
    let out = output(headcount().args([
        "exec",
        "--store",
        "redis://127.0.0.1:1/?timeout=500ms",
        "--group",
        "g",
        "--",
        "true",
    ]));
    one_error_line(&out, 125);
    // Permanent: a member id in use ends with a `failed` line and status 1.
    let url = url(dir.path(), "dup.db");
    let mut first = headcount()
        .args(["run", "--store", &url, "--group", "g", "--member", "same"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(first.stdout.take().unwrap()).lines();
    let _ = lines.next();
    let out =
        output(headcount().args(["run", "--store", &url, "--group", "g", "--member", "same"]));
    one_error_line(&out, 1);
    let last: Value = serde_json::from_str(text(&out.stdout).trim()).expect("a failed line");
    assert_eq!(last["phase"], "failed", "{last}");
    assert!(
        last["error"].as_str().unwrap_or("").contains("same"),
        "{last}"
    );
    let _ = Command::new("kill").arg(first.id().to_string()).status();
    assert!(exit_within(&mut first, "headcount", Duration::from_secs(10)).success());
}

#[test]
fn exec_keeps_stdout_for_the_command_and_checks_it_before_joining() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(dir.path(), "exec.db");
    let out = output(headcount().args([
        "exec",
        "--store",
        &url,
        "--group",
        "g",
        "--ttl",
        "900ms",
        "--",
        "sh",
        "-c",
        "echo hello",
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello\n");
    let events: Vec<Value> = text(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0]["event"], "start");
    assert_eq!(events[1]["event"], "stop");
    // --events FILE
    let file = dir.path().join("events.jsonl");
    let out = output(headcount().args([
        "exec",
        "--store",
        &url,
        "--group",
        "g",
        "--ttl",
        "900ms",
        "--events",
        file.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "exit 4",
    ]));
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(written.lines().count(), 2, "{written}");
    assert!(!text(&out.stderr).contains("\"event\""));
    // Refused before the store is even opened: no database file appears.
    let fresh = url_file(dir.path(), "never.db");
    let plain = dir.path().join("plain.txt");
    std::fs::write(&plain, "not a program").unwrap();
    for (cmd, code) in [
        (vec!["/nonexistent/cmd"], 127),
        (vec!["no-such-command-hc"], 127),
        (vec![plain.to_str().unwrap()], 126),
        (vec!["/tmp"], 126),
    ] {
        let out = output(
            headcount()
                .args(["exec", "--store", &fresh.0, "--group", "g", "--"])
                .args(&cmd),
        );
        one_error_line(&out, code);
    }
    let out = output(headcount().args([
        "exec",
        "--store",
        &fresh.0,
        "--group",
        "g",
        "--events",
        "/nonexistent/dir/events",
        "--",
        "true",
    ]));
    one_error_line(&out, 125);
    assert!(!fresh.1.exists());
}

/// A URL and the path of a SQLite file in `dir`.
fn url_file(dir: &Path, file: &str) -> (String, std::path::PathBuf) {
    (url(dir, file), dir.join(file))
}

#[test]
fn help_version_completions_and_durations() {
    let out = output(headcount().arg("--help"));
    let help = text(&out.stdout);
    assert!(out.status.success());
    for needle in ["Exit status:", "75", "125", "completions"] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
    let out = output(headcount().args(["run", "--help"]));
    let help = text(&out.stdout);
    for needle in ["jumpback-memento", "HEADCOUNT_MEMBER", "Exit status:"] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
    let out = output(headcount().args(["--store", "x", "conformance", "--help"]));
    assert!(text(&out.stdout).contains("redis+cluster://"));
    let out = output(headcount().arg("--version"));
    let version = text(&out.stdout);
    assert!(
        version.contains("backends: sqlite, postgres, redis"),
        "{version}"
    );
    let out = output(headcount().args(["completions", "bash"]));
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("_headcount"));
    let out = output(headcount().args(["demo", "--interval", "1"]));
    let line = one_error_line(&out, 2);
    assert!(line.contains("1s"), "{line}");
}

#[test]
fn a_full_stdout_is_one_error_line_and_run_leaves_first() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(dir.path(), "full.db");
    let full = || std::fs::File::create("/dev/full").expect("/dev/full");
    let out = headcount()
        .args(["run", "--store", &url, "--group", "g", "--ttl", "900ms"])
        .stdout(full())
        .output()
        .unwrap();
    let line = one_error_line(&out, 1);
    assert!(line.contains("stdout"), "{line}");
    assert_eq!(members(&url, "g"), 0, "run left the group");
    let ids = format!(
        "{},{},{}",
        url,
        url_file(dir.path(), "b.db").0,
        url_file(dir.path(), "c.db").0
    );
    let out = headcount()
        .args([
            "ids",
            "next",
            "--stores",
            &ids,
            "--allow-non-durable",
            "-n",
            "3",
        ])
        .stdout(full())
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not delivered"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let out = headcount()
        .args(["status", "--store", &url, "--group", "g", "--watch"])
        .stdout(full())
        .output()
        .unwrap();
    one_error_line(&out, 1);
}

#[test]
fn a_closed_stdout_ends_run_and_status_watch_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(dir.path(), "pipe.db");
    // `run | head -1`: the next line (a second member joins) meets a closed pipe.
    let mut run = headcount()
        .args([
            "run", "--store", &url, "--group", "g", "--ttl", "900ms", "--member", "a",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    let _ = lines.next();
    drop(lines);
    let mut other = headcount()
        .args([
            "run", "--store", &url, "--group", "g", "--ttl", "900ms", "--member", "b",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let status = exit_within(&mut run, "headcount", Duration::from_secs(10));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let s = status_json(&url, "g");
    let left: Vec<&str> = s["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["member"].as_str())
        .collect();
    assert_eq!(left, vec!["b"], "{s}");
    let _ = Command::new("kill").arg(other.id().to_string()).status();
    exit_within(&mut other, "headcount", Duration::from_secs(10));
    // `status --watch | head -1`
    let mut watch = headcount()
        .args([
            "status", "--store", &url, "--group", "g", "--watch", "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let _ = lines.next();
    drop(lines);
    let status = exit_within(&mut watch, "headcount", Duration::from_secs(10));
    assert!(status.success(), "{status}");
}

#[test]
fn read_only_commands_never_create_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let (url, path) = url_file(dir.path(), "missing.db");
    let out = output(headcount().args(["status", "--store", &url, "--group", "g"]));
    let line = one_error_line(&out, 2);
    assert!(line.contains("does not exist"), "{line}");
    let out = output(headcount().args(["--store", &url, "distributor", "table"]));
    one_error_line(&out, 2);
    let out = output(headcount().args(["--store", &url, "distributor", "units", "ls"]));
    one_error_line(&out, 2);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "{path:?}"
    );
    // `sqlite::memory:x` is not a file named `:memory:x`.
    let out = output(headcount().current_dir(dir.path()).args([
        "conformance",
        "--store",
        "sqlite::memory:x",
    ]));
    one_error_line(&out, 2);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_foreign_sqlite_schema_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let (url, path) = url_file(dir.path(), "foreign.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE headcount_kv (id INTEGER PRIMARY KEY, body BLOB)")
        .unwrap();
    drop(conn);
    let out = output(headcount().args(["status", "--store", &url, "--group", "g"]));
    let line = one_error_line(&out, 2);
    assert!(line.contains("did not create"), "{line}");
}

#[test]
fn commands_refuse_before_writing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let (url, path) = url_file(dir.path(), "d.db");
    // A filter that matches nothing.
    let out =
        output(headcount().args(["conformance", "--store", &url, "--filter", "no-such-case"]));
    one_error_line(&out, 2);
    let (url2, path2) = url_file(dir.path(), "e.db");
    for args in [
        vec!["units", "add", "a", "b", "", "c"],
        vec!["units", "add", "a", "b", "\n", "c"],
        vec![
            "register",
            "--name",
            "s",
            "--address",
            "127.0.0.1:5,127.0.0.1:6",
        ],
        vec!["service", "--name", "s", "--watch-interval", "0s"],
        vec!["--poll-interval", "0s"],
    ] {
        let out = output(
            headcount()
                .args(["--store", &url2, "distributor"])
                .args(&args),
        );
        one_error_line(&out, 2);
    }
    assert!(!path2.exists(), "nothing was opened");
    // The demo refuses before its banner.
    let out = output(headcount().args(["demo", "--ttl", "0s"]));
    let line = one_error_line(&out, 2);
    assert!(line.contains("--ttl"), "{line}");
    let _ = path;
}

/// `status --watch` reports an outage of its store and watches on.
#[test]
fn status_watch_survives_a_store_restart() {
    use headcount_harness::{skip_unless_required, KvStore, ServerKind};
    let started = KvStore::redis(Some(Duration::from_millis(300)));
    let Some(redis) = skip_unless_required(ServerKind::Redis, "status --watch over Redis", started)
    else {
        return;
    };
    let mut watch = headcount()
        .args([
            "status",
            "--store",
            &redis.url(),
            "--group",
            "g",
            "--watch",
            "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut next = || -> Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    assert!(next().get("error").is_none());
    redis.servers[0].kill().unwrap();
    // Each line blocks until the watch prints it: no pause between reads.
    let outage = eventually_blocking(
        "an outage line",
        Duration::from_secs(10),
        Duration::ZERO,
        || {
            let v = next();
            if v.get("error").is_some() {
                Ok(v)
            } else {
                Err(v)
            }
        },
    );
    assert_eq!(outage["retryable"], true, "{outage}");
    redis.servers[0].start().unwrap();
    let recovered =
        eventually_blocking("recovered", Duration::from_secs(15), Duration::ZERO, || {
            let v = next();
            if v.get("error").is_none() {
                Ok(v)
            } else {
                Err(v)
            }
        });
    assert!(recovered["members"].is_array(), "{recovered}");
    let _ = Command::new("kill").arg(watch.id().to_string()).status();
    assert!(exit_within(&mut watch, "headcount", Duration::from_secs(10)).success());
}
