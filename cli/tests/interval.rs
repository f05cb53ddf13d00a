//! `headcount run --mode interval` and `headcount demo`, end to end on SQLite files.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // tests fail by panicking

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use headcount_conformance::wait::exit_within;

fn headcount() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_headcount"));
    c.env_remove("HEADCOUNT_STORE");
    c
}

/// Starts `headcount run` and forwards its stdout lines, parsed, to `tx` with its number.
fn spawn_run(url: &str, i: usize, tx: mpsc::Sender<(usize, serde_json::Value)>) -> Child {
    let mut child = headcount()
        .args([
            "run", "--store", url, "--group", "trio", "--mode", "interval",
        ])
        .args(["--interval", "1s", "--member", &format!("m{i}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start headcount run");
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let v: serde_json::Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            if tx.send((i, v)).is_err() {
                break;
            }
        }
    });
    child
}

#[test]
fn three_runs_on_one_sqlite_file_get_indices_1_2_3_of_3_and_stop_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/shared.db", dir.path().display());
    let (tx, rx) = mpsc::channel();
    let mut children: Vec<Child> = (0..3).map(|i| spawn_run(&url, i, tx.clone())).collect();
    drop(tx);
    let mut latest: [Option<serde_json::Value>; 3] = [None, None, None];
    let deadline = Instant::now() + Duration::from_secs(40);
    let converged = loop {
        let pairs: Vec<Option<(u64, u64)>> = latest
            .iter()
            .map(|l| {
                let l = l.as_ref()?;
                (l["phase"] == "active")
                    .then(|| Some((l["index"].as_u64()?, l["replicas"].as_u64()?)))
                    .flatten()
            })
            .collect();
        let mut indices: Vec<u64> = pairs.iter().flatten().map(|p| p.0).collect();
        indices.sort_unstable();
        if indices == [1, 2, 3] && pairs.iter().flatten().all(|p| p.1 == 3) {
            break true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break false;
        }
        match rx.recv_timeout(left) {
            Ok((i, v)) => {
                for key in [
                    "group", "member", "mode", "index", "replicas", "epoch", "live", "at",
                ] {
                    assert!(v.get(key).is_some(), "no {key:?} in {v}");
                }
                assert_eq!(v["mode"], "interval");
                latest[i] = Some(v);
            }
            Err(_) => break false,
        }
    };
    for child in &children {
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }
    let stop_deadline = Instant::now() + Duration::from_secs(15);
    for child in &mut children {
        let left = stop_deadline.saturating_duration_since(Instant::now());
        let status = exit_within(child, "headcount run after SIGTERM", left);
        assert!(status.success(), "exit status after SIGTERM: {status}");
    }
    assert!(
        converged,
        "the three runs did not reach 1, 2, 3 of 3: {latest:?}"
    );
    // Each one's last line says it stopped.
    let mut stopped = [false; 3];
    while let Ok((i, v)) = rx.recv_timeout(Duration::from_secs(5)) {
        stopped[i] = v["phase"] == "stopped";
    }
    assert_eq!(stopped, [true; 3]);
}

#[test]
fn run_rejects_bad_input_in_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/x.db", dir.path().display());
    for (args, needle) in [
        (
            vec!["--group", "g", "--mode", "interval", "--ttl", "5s"],
            "--ttl",
        ),
        (
            vec!["--group", "g", "--mode", "interval", "--interval", "0s"],
            "interval",
        ),
        (vec!["--group", "a:b", "--mode", "interval"], "group name"),
        (
            vec!["--group", "g", "--mode", "interval", "--capacity", "0"],
            "capacity",
        ),
    ] {
        let out = headcount()
            .args(["run", "--store", &url])
            .args(&args)
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    }
}

#[test]
fn the_demo_processes_every_task_once() {
    let out = headcount()
        .args(["demo", "--json", "--stage-intervals", "2"])
        .output()
        .expect("demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(summary["duplicates"], 0, "{summary}");
    assert_eq!(summary["lost"], 0, "{summary}");
    assert!(summary["offered"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(summary["processed"], summary["offered"], "{summary}");
    assert!(stderr.contains("p4 crashes"), "{stderr}");
}
