//! `headcount distributor` end to end on an SQLite file: bad flags, work units with commas, and a
//! daemon with two services next to it, one of which stops.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn cmd(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_headcount"));
    c.args(args)
        .env("HEADCOUNT_STORE", url)
        .env_remove("SERVICES_NAMESPACE")
        .env_remove("WORKUNITS_NAMESPACE")
        .env_remove("DISTRIBUTION_NAMESPACE")
        .env_remove("POLL_INTERVAL")
        .env_remove("PING_TIMEOUT");
    c
}

fn run(url: &str, args: &[&str]) -> Output {
    cmd(url, args).output().expect("run headcount")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn spawn(url: &str, args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut c = cmd(url, args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn headcount")
}

fn sigterm(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success());
}

fn table(url: &str) -> serde_json::Value {
    let out = run(url, &["distributor", "table"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("table JSON")
}

fn wait_table(
    url: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let t = table(url);
        if done(&t) {
            return t;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{what}: {t}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn units_of(t: &serde_json::Value, s: &str) -> usize {
    t["services"][s].as_array().map_or(0, Vec::len)
}

#[test]
fn bad_flags_are_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/d.db", dir.path().display());
    for args in [
        &["distributor", "--poll-interval", "0s"][..],
        &["distributor", "--ping-timeout", "0ms"],
        &["distributor", "--services-namespaces", ","],
        &["distributor", "--services-namespaces", "a:b"],
        &["distributor", "--workunits-namespace", ""],
        &["distributor", "--poll-interval", "99999999h"],
        &[
            "distributor",
            "register",
            "--name",
            "x",
            "--address",
            "nope",
        ],
    ] {
        let out = run(&url, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.contains("error"), "{args:?}: {err}");
    }
    let out = run(&url, &["distributor", "--services-namespaces", ""]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).lines().count(),
        1,
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn daemon_and_services_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/d.db", dir.path().display());
    let out = run(
        &url,
        &["distributor", "units", "add", "a,1", "b 2", "c", "d"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(&url, &["distributor", "units", "ls"]);
    let listed: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(listed.len(), 4);
    assert!(listed.iter().any(|u| u["unit"] == "a,1"));

    let s1 = spawn(&url, &["distributor", "service", "--name", "s1"], &[]);
    let mut s2 = spawn(&url, &["distributor", "service", "--name", "s2"], &[]);
    let daemon = spawn(
        &url,
        &["distributor"],
        &[("POLL_INTERVAL", "200ms"), ("PING_TIMEOUT", "300ms")],
    );
    let t = wait_table(&url, "balanced", |t| {
        units_of(t, "s1") == 2 && units_of(t, "s2") == 2
    });
    assert_eq!(t["down"], serde_json::json!([]));

    s2.kill().unwrap();
    s2.wait().unwrap();
    wait_table(&url, "failover", |t| {
        units_of(t, "s1") == 4 && t["down"] == serde_json::json!(["s2"])
    });
    let out = run(&url, &["distributor", "table", "--service", "s1"]);
    let mine: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(mine["units"].as_array().unwrap().len(), 4, "{mine}");

    for child in [daemon, s1] {
        sigterm(&child);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{:?}", out.status);
    }
}
