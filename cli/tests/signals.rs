//! What a supervisor's or a terminal's signals do to `run` and `exec`: SIGHUP and SIGQUIT stop
//! them as SIGTERM does (the member leaves at once, the command gets SIGTERM and its grace), and
//! SIGUSR1/SIGUSR2 are ignored by `run` and passed on to the command by `exec`. Real processes
//! on a SQLite file; the TTL is long (30 s), so a slot that is gone at once was given up, not
//! left to expire.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // tests fail by panicking

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use headcount_conformance::wait::{eventually_blocking, exit_within};
use serde_json::Value;

/// Long enough that a slot gone within the test was given up by its member.
const TTL: &str = "30s";
const WITHIN: Duration = Duration::from_secs(15);

mod common;

use common::{headcount, members};

fn url(dir: &Path) -> String {
    format!("sqlite://{}/signals.db", dir.display())
}

/// Sends `sig` (a name `kill` knows: HUP, QUIT, USR1...) to `child`.
fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success(), "kill -{sig}");
}

/// A `run` whose stdout lines arrive on the returned channel.
fn spawn_run(url: &str, group: &str, member: &str) -> (Child, mpsc::Receiver<Value>) {
    let mut child = headcount()
        .args(["run", "--store", url, "--group", group, "--ttl", TTL])
        .args(["--member", member])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start run");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Waits for a line of `rx` in phase `phase`.
fn wait_phase(rx: &mpsc::Receiver<Value>, phase: &str) -> Value {
    loop {
        let v = rx
            .recv_timeout(WITHIN)
            .unwrap_or_else(|_| panic!("no `{phase}` line"));
        if v["phase"] == phase {
            return v;
        }
    }
}

#[test]
fn sighup_and_sigquit_make_run_leave_as_sigterm_does_and_sigusr1_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(dir.path());
    let (mut a, a_lines) = spawn_run(&url, "g", "a");
    wait_phase(&a_lines, "active");
    let (mut b, b_lines) = spawn_run(&url, "g", "b");
    wait_phase(&b_lines, "active");

    // SIGUSR1 and SIGUSR2 are not stop requests: `a` stays.
    signal(&a, "USR1");
    signal(&a, "USR2");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        a.try_wait().unwrap().is_none(),
        "SIGUSR1 or SIGUSR2 ended run"
    );

    // SIGHUP: `a` leaves, prints its `stopped` line and exits 0; `b` sees the group shrink.
    signal(&a, "HUP");
    let status = exit_within(&mut a, "run after SIGHUP", WITHIN);
    assert_eq!(status.code(), Some(0), "{status}");
    let last = wait_phase(&a_lines, "stopped");
    assert_eq!(last["error"], Value::Null, "{last}");
    assert_eq!(members(&url, "g"), vec!["b".to_owned()]);
    eventually_blocking(
        "b alone in the group",
        WITHIN,
        Duration::from_millis(50),
        || match b_lines.try_recv() {
            Ok(v) if v["live"] == 1 && v["phase"] == "active" => Ok(v),
            Ok(v) => Err(v.to_string()),
            Err(e) => Err(e.to_string()),
        },
    );

    // SIGQUIT: the same.
    signal(&b, "QUIT");
    let status = exit_within(&mut b, "run after SIGQUIT", WITHIN);
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(members(&url, "g").is_empty());
}

#[test]
fn exec_passes_sigusr1_on_and_stops_its_command_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(dir.path());
    let log = dir.path().join("command.log");
    // The command notes what it receives; SIGTERM ends it.
    let script = format!(
        "trap 'echo usr1 >> {log}' USR1; trap 'echo term >> {log}; exit 0' TERM; \
         echo started >> {log}; while :; do sleep 0.05; done",
        log = log.display()
    );
    let mut exec = headcount()
        .args(["exec", "--store", &url, "--group", "g", "--ttl", TTL])
        .args(["--member", "x", "--grace", "10s", "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start exec");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let every = Duration::from_millis(50);
    let has = |word: &'static str| {
        move || {
            let text = read();
            if text.lines().any(|l| l == word) {
                Ok(())
            } else {
                Err(text)
            }
        }
    };
    eventually_blocking("the command started", WITHIN, every, has("started"));

    signal(&exec, "USR1");
    eventually_blocking("the command got SIGUSR1", WITHIN, every, has("usr1"));
    assert!(exec.try_wait().unwrap().is_none(), "SIGUSR1 ended exec");

    signal(&exec, "HUP");
    let status = exit_within(&mut exec, "exec after SIGHUP", WITHIN);
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(read().lines().any(|l| l == "term"), "{}", read());
    assert!(members(&url, "g").is_empty());
}
