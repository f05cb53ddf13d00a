//! `headcount run` (group mode), `exec` and `status`, end to end: real processes on one SQLite
//! file. Short TTLs (900 ms, heartbeat 300 ms) keep them fast; every wait polls with a deadline.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // tests fail by panicking

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use headcount_conformance::wait::{eventually_blocking, exit_within, until_blocking, EVERY};
use serde_json::Value;

mod common;

use common::status_json_with as status_json;

const TTL: &str = "900ms";

fn headcount() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_headcount"));
    c.env_remove("HEADCOUNT_STORE");
    c
}

fn store_url(dir: &Path) -> String {
    format!("sqlite://{}/shared.db", dir.display())
}

/// Starts headcount with `args`; its stdout lines, parsed, go to `tx` tagged with `i`.
fn spawn(args: &[&str], i: usize, tx: mpsc::Sender<(usize, Value)>) -> Child {
    spawn_with(headcount().args(args), i, tx)
}

fn spawn_with(cmd: &mut Command, i: usize, tx: mpsc::Sender<(usize, Value)>) -> Child {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start headcount");
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            if tx.send((i, v)).is_err() {
                break;
            }
        }
    });
    child
}

/// Starts an `exec`: its own events are JSON lines on stderr (stdout is the command's); they
/// go to `tx` tagged with `i`, other stderr lines (logs) are echoed.
fn spawn_events(cmd: &mut Command, i: usize, tx: mpsc::Sender<(usize, Value)>) -> Child {
    let mut child = cmd
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start headcount");
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<Value>(&line) {
                Ok(v) if v.is_object() => {
                    if tx.send((i, v)).is_err() {
                        break;
                    }
                }
                _ => eprintln!("{line}"),
            }
        }
    });
    child
}

fn spawn_run(url: &str, group: &str, i: usize, tx: mpsc::Sender<(usize, Value)>) -> Child {
    spawn(
        &[
            "run",
            "--store",
            url,
            "--group",
            group,
            "--ttl",
            TTL,
            "--member",
            &format!("m{i}"),
        ],
        i,
        tx,
    )
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill {sig} {}", child.id());
}

/// Kills what is left on drop, so a failed assertion leaves no process behind.
struct Reap(Vec<Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        // SIGTERM first, so an exec stops its command; SIGKILL what is left after 5 s.
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = Command::new("kill")
                    .args(["-TERM", &c.id().to_string()])
                    .status();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for c in &mut self.0 {
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Receives lines until `done(latest)` holds, or panics at the deadline with what was seen.
fn until(
    rx: &mpsc::Receiver<(usize, Value)>,
    latest: &mut [Option<Value>],
    within: Duration,
    what: &str,
    done: impl Fn(&[Option<Value>]) -> bool,
) {
    let deadline = Instant::now() + within;
    while !done(latest) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, v)) => latest[i] = Some(v),
            Err(_) => panic!("not {what} within {within:?}: {latest:?}"),
        }
    }
}

fn active(v: &Option<Value>) -> Option<(u64, u64, u64)> {
    let v = v.as_ref()?;
    (v["phase"] == "active").then_some(())?;
    Some((
        v["index"].as_u64()?,
        v["replicas"].as_u64()?,
        v["epoch"].as_u64()?,
    ))
}

/// Every run active with replicas the number of runs, indices 1 to that number and one epoch.
fn all_active(latest: &[Option<Value>]) -> bool {
    let Some(runs) = latest.iter().map(active).collect::<Option<Vec<_>>>() else {
        return false;
    };
    let n = runs.len() as u64;
    let mut indices: Vec<u64> = runs.iter().map(|r| r.0).collect();
    indices.sort_unstable();
    runs.iter().all(|r| r.1 == n && r.2 == runs[0].2) && indices == (1..=n).collect::<Vec<_>>()
}

type Lines = mpsc::Receiver<(usize, Value)>;

/// Starts members `m0` and `m1` of `group` and waits until both are active as 1 and 2 of 2.
fn two_active_runs(url: &str, group: &str) -> (Reap, Lines, Vec<Option<Value>>) {
    active_runs(url, group, 2)
}

/// Starts members `m0` to `m<runs - 1>` of `group` and waits until they are active as 1 to
/// `runs` of `runs`.
fn active_runs(url: &str, group: &str, runs: usize) -> (Reap, Lines, Vec<Option<Value>>) {
    let (tx, rx) = mpsc::channel();
    let procs = Reap(
        (0..runs)
            .map(|i| spawn_run(url, group, i, tx.clone()))
            .collect(),
    );
    let mut latest = vec![None; runs];
    until(
        &rx,
        &mut latest,
        Duration::from_secs(20),
        &format!("all {runs} active"),
        all_active,
    );
    (procs, rx, latest)
}

fn check_line(v: &Value) {
    for key in [
        "group", "member", "mode", "slot", "index", "replicas", "epoch", "live", "phase", "at",
        "error",
    ] {
        assert!(v.get(key).is_some(), "no {key:?} in {v}");
    }
    assert_eq!(v["mode"], "group", "{v}");
}

#[test]
fn two_runs_split_the_group_and_a_sigterm_hands_over_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    two_runs_hand_over(&store_url(dir.path()), "pair");
}

#[cfg(feature = "postgres")]
#[test]
fn two_runs_hand_over_on_postgres() {
    use headcount_harness::ServerKind;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let Some(url) =
        runtime.block_on(ServerKind::Postgres.shared_or_skip("two_runs_hand_over_on_postgres"))
    else {
        return;
    };
    // The shared server outlives this test's keys: a group of its own.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .subsec_nanos();
    two_runs_hand_over(&url, &format!("pair-{}-{nanos}", std::process::id()));
}

/// Three `run`s and `status` through PgBouncer in transaction mode, whose two server connections
/// the runs' connections take turns on: the runs reach 1, 2 and 3 of 3 under one epoch, stay so
/// for several heartbeats, and `status` shows them. With named prepared statements, a statement
/// prepared on one server connection was executed on another ("prepared statement \"s3\" does
/// not exist") or collided with another process's ("prepared statement \"s0\" already
/// exists"), and the runs failed for good.
#[cfg(feature = "postgres")]
#[test]
fn three_runs_and_status_through_pgbouncer_in_transaction_mode() {
    use headcount_harness::{skip_unless_required, PgBouncer, ServerKind};
    let label = "three_runs_and_status_through_pgbouncer_in_transaction_mode";
    let Some(bouncer) =
        skip_unless_required(ServerKind::PgBouncer, label, PgBouncer::start_new(None))
    else {
        return;
    };
    let url = bouncer.url();
    let (procs, rx, mut latest) = active_runs(&url, "pooled", 3);
    let epoch = active(&latest[0]).unwrap().2;
    // Each run renews every 300 ms: over 2 s, any line it prints must still say all are active.
    let end = Instant::now() + Duration::from_secs(2);
    while let Ok((i, v)) = rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
        latest[i] = Some(v);
        assert!(all_active(&latest), "no longer all active: {latest:?}");
    }
    status_shows(&url, "pooled", &["m0", "m1", "m2"], epoch);
    drop(procs);
}

/// `status --json` of `group` names exactly `members`, each with the runs' TTL, a view at
/// `epoch` or later, and owners for every one of 1000 sampled keys.
fn status_shows(url: &str, group: &str, members: &[&str], epoch: u64) {
    let s = status_json(url, group, &["--sample", "1000"]);
    let want = members;
    let mut members: Vec<&str> = s["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["member"].as_str().unwrap())
        .collect();
    members.sort_unstable();
    assert_eq!(members, want, "{s}");
    assert!(s["view"]["epoch"].as_u64().unwrap() >= epoch, "{s}");
    let owned: u64 = s["sample_owned"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["keys"].as_u64().unwrap())
        .sum();
    assert_eq!(owned, 1000, "{s}");
    for m in s["members"].as_array().unwrap() {
        assert_eq!(m["ttl_ms"], 900, "{s}");
    }
}

/// Two `run`s reach 1 and 2 of 2 under one epoch, `status --json` shows them, and a SIGTERM to
/// one leaves the other alone under a newer epoch long before a lease could expire.
fn two_runs_hand_over(url: &str, group: &str) {
    let url = url.to_owned();
    let (mut procs, rx, mut latest) = two_active_runs(&url, group);
    for v in latest.iter().flatten() {
        check_line(v);
    }
    let epoch = active(&latest[1]).unwrap().2;

    // status --json names both members and a view that matches them.
    status_shows(&url, group, &["m0", "m1"], epoch);

    // SIGTERM m0: it leaves at once and says so; m1 is alone well before m0's lease could expire.
    signal(&procs.0[0], "-TERM");
    let status = exit_within(&mut procs.0[0], "headcount", Duration::from_secs(10));
    assert!(status.success(), "run after SIGTERM: {status}");
    until(
        &rx,
        &mut latest,
        Duration::from_secs(5),
        "m0 stopped and m1 alone",
        |l| {
            l[0].as_ref().is_some_and(|v| v["phase"] == "stopped")
                && active(&l[1]).is_some_and(|(i, r, e)| i == 1 && r == 1 && e > epoch)
        },
    );
}

/// `status --key` (repeated and comma-separated) names each key's owner under the published
/// view, in JSON and in the table, with the index its owner's own `run` reports.
#[test]
fn status_names_each_keys_owner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    let (_procs, _rx, latest) = two_active_runs(&url, "keyed");
    // The index each member's own run reports, by member id.
    let index_of = |member: &str| {
        latest
            .iter()
            .flatten()
            .find(|v| v["member"] == member)
            .and_then(|v| v["index"].as_u64())
    };
    let keys: Vec<String> = (0..16).map(|k| format!("order-{k}")).collect();
    let (first, rest) = (keys[..8].join(","), keys[8..].join(","));
    let s = status_json(&url, "keyed", &["--key", &first, "--key", &rest]);
    let listed = s["keys"].as_array().expect("a keys array");
    assert_eq!(listed.len(), keys.len(), "{s}");
    let mut owners = std::collections::BTreeSet::new();
    for (k, o) in keys.iter().zip(listed) {
        assert_eq!(o["key"], k.as_str(), "{s}");
        let member = o["member"].as_str().expect("a member");
        assert_eq!(o["index"].as_u64(), index_of(member), "{o} vs {latest:?}");
        assert_eq!(o["replicas"], 2, "{o}");
        assert_eq!(o["view_epoch"], s["view"]["epoch"], "{s}");
        let slot = s["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["member"] == member)
            .map(|m| m["slot"].clone());
        assert_eq!(Some(o["slot"].clone()), slot, "{s}");
        owners.insert(member.to_owned());
    }
    assert_eq!(owners.len(), 2, "16 keys all on one member: {s}");

    // The table: one line per key, naming the same member.
    let out = headcount()
        .args(["status", "--store", &url, "--group", "keyed"])
        .args(["--key", "order-0", "--key", "order-1"])
        .output()
        .expect("status");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for (k, o) in keys.iter().zip(listed).take(2) {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(k.as_str()))
            .unwrap_or_else(|| panic!("no line for {k}: {text}"));
        assert!(
            line.contains(o["member"].as_str().unwrap()),
            "{line} vs {o}"
        );
    }
    assert!(text.contains("view epoch"), "{text}");
}

/// Two members of `group` joined in this process with `configure` on the store at `url`,
/// both ready under one view (the runtime's threads keep them heartbeating meanwhile).
fn two_members(
    url: &str,
    group: &str,
    configure: impl Fn(headcount::recipes::group::GroupConfig) -> headcount::recipes::group::GroupConfig,
) -> (
    tokio::runtime::Runtime,
    Vec<headcount::recipes::group::Member>,
) {
    use headcount::recipes::group::{Group, GroupConfig};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let members = runtime.block_on(async {
        let store = headcount::connect(url).await.expect("store");
        let mut members = Vec::new();
        for i in 0..2 {
            let config = configure(
                GroupConfig::new(group, Duration::from_millis(900)).with_member(format!("m{i}")),
            );
            members.push(Group::join(store.clone(), config).await.expect("join"));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let all: Vec<_> = members.iter().map(|m| m.assignment()).collect();
            if all
                .iter()
                .all(|a| a.replicas == 2 && a.epoch == all[0].epoch && a.index.is_some())
            {
                break;
            }
            assert!(Instant::now() < deadline, "not both active: {all:?}");
            tokio::time::sleep(EVERY).await;
        }
        members
    });
    (runtime, members)
}

/// `status` counts a group's declared keys per member: a group of partitions from the store
/// alone, a group of named keys (`with_keys`, the sticky assignor) from the owners its view
/// stores, and a name is looked up with `--keys-file`; without the file (or with another set)
/// it says what is missing instead of failing; a bad file is a usage error. Under the stateless
/// balanced assignor named keys need the file to be counted.
#[test]
fn status_counts_a_declared_key_set_per_member() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    let owns = |s: &Value| -> Vec<u64> {
        s["members"]
            .as_array()
            .expect("members")
            .iter()
            .map(|m| m["keys_owned"].as_u64().expect("keys_owned"))
            .collect()
    };

    // Partitions: the view's key set id names them, no file needed.
    let (_rt, _members) = two_members(&url, "parts", |c| c.with_partitions(16));
    let s = status_json(&url, "parts", &[]);
    assert_eq!(s["declared_keys"], 16, "{s}");
    assert_eq!(owns(&s), [8, 8], "{s}");
    assert!(s["unmapped"].is_null(), "{s}");

    // Named keys: the store holds only their count and digest.
    let names: Vec<String> = (0..12).map(|i| format!("tenant-{i:02}")).collect();
    let (_rt2, members) = two_members(&url, "named", |c| {
        c.with_keys(headcount::assign::KeySet::new(&names).expect("a valid key set"))
    });
    let s = status_json(&url, "named", &["--key", "tenant-03"]);
    // Counted from the owners the sticky view stores; a name needs the file.
    assert_eq!(s["declared_keys"], 12, "{s}");
    assert_eq!(owns(&s), [6, 6], "{s}");
    let why = s["unmapped"].as_str().expect("unmapped says why");
    assert!(why.contains("--keys-file"), "{why}");
    assert!(s["keys"][0]["error"].is_string(), "{s}");
    // The stateless balanced assignor stores no owners: without the file, nothing is counted.
    let (_rt3, _balanced) = two_members(&url, "named-balanced", |c| {
        let keys = headcount::assign::KeySet::new(&names).expect("a valid key set");
        let id = keys.id();
        c.with_keys(keys)
            .with_assignor(headcount::assign::AssignorKind::Balanced(id))
    });
    let s = status_json(&url, "named-balanced", &[]);
    assert!(s["declared_keys"].is_null(), "{s}");
    assert!(
        s["unmapped"]
            .as_str()
            .is_some_and(|w| w.contains("--keys-file")),
        "{s}"
    );

    let file = dir.path().join("tenants.txt");
    std::fs::write(&file, format!("{}\n\n", names.join("\n"))).expect("write");
    let file_arg = file.to_str().expect("utf-8 path");
    let s = status_json(
        &url,
        "named",
        &["--keys-file", file_arg, "--key", "tenant-03"],
    );
    assert_eq!(s["declared_keys"], 12, "{s}");
    assert_eq!(owns(&s), [6, 6], "{s}");
    let owner = s["keys"][0]["member"].as_str().expect("an owner");
    let holder = members
        .iter()
        .find(|m| m.owns("tenant-03").is_some())
        .map(|m| m.member().to_owned());
    assert_eq!(Some(owner.to_owned()), holder, "{s}");
    // The table counts them too.
    let table_with = |file: &str| {
        headcount()
            .args(["status", "--store", &url, "--group", "named"])
            .args(["--keys-file", file])
            .output()
            .expect("status")
    };
    let out = table_with(file_arg);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("6 of 12"), "{text}");
    assert!(text.contains("of the 12 declared keys"), "{text}");
    // Without the file, the table counts the stored owners and says a name needs the file.
    let out = headcount()
        .args(["status", "--store", &url, "--group", "named"])
        .output()
        .expect("status");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("6 of 12"), "{text}");
    assert!(text.contains("counted from the owners it stores"), "{text}");
    assert!(text.contains("--keys-file"), "{text}");

    // Another set than the group's: said, and counted only from the stored owners.
    let other = dir.path().join("other.txt");
    std::fs::write(&other, "tenant-00\ntenant-01\n").expect("write");
    let s = status_json(&url, "named", &["--keys-file", other.to_str().unwrap()]);
    assert_eq!(s["declared_keys"], 12, "{s}");
    assert!(
        s["unmapped"]
            .as_str()
            .is_some_and(|w| w.contains("names another set")),
        "{s}"
    );

    // A duplicate name, or a file that cannot be read: one line, status 2.
    let dup = dir.path().join("dup.txt");
    std::fs::write(&dup, "a\nb\na\n").expect("write");
    for bad in [dup.to_str().unwrap(), "/nonexistent/keys.txt"] {
        let out = table_with(bad);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("--keys-file"), "{err}");
    }
}

#[test]
fn a_killed_run_is_replaced_within_ttl_plus_a_heartbeat() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    let (mut procs, rx, mut latest) = two_active_runs(&url, "pair");
    let epoch = active(&latest[1]).unwrap().2;
    signal(&procs.0[0], "-KILL");
    let killed = Instant::now();
    let _ = procs.0[0].wait();
    // TTL 900 ms + heartbeat 300 ms + 1.8 s slack for a loaded machine.
    until(
        &rx,
        &mut latest,
        Duration::from_secs(3),
        "m1 alone after the kill",
        |l| active(&l[1]).is_some_and(|(i, r, e)| i == 1 && r == 1 && e > epoch),
    );
    eprintln!("m1 alone {:?} after SIGKILL of m0", killed.elapsed());
}

/// `exec` of a shell that appends `INDEX REPLICAS EPOCH` to `file`, and `term` when SIGTERMed.
fn spawn_exec(
    url: &str,
    i: usize,
    file: &Path,
    extra: &[&str],
    script: &str,
    tx: mpsc::Sender<(usize, Value)>,
) -> Child {
    spawn_events(
        headcount()
            .args(["exec", "--store", url, "--group", "workers", "--ttl", TTL])
            .args(["--member", &format!("w{i}")])
            .args(extra)
            .args(["--", "sh", "-c", script])
            .env("FILE", file),
        i,
        tx,
    )
}

const RECORDING: &str = r#"trap 'echo term >> "$FILE"; exit 0' TERM
echo "$HEADCOUNT_INDEX $HEADCOUNT_REPLICAS $HEADCOUNT_EPOCH" >> "$FILE"
sleep 1000 & wait"#;

/// The lines of `file` (none when it does not exist yet).
fn lines(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .map(|t| t.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

fn wait_lines(file: &Path, within: Duration, what: &str, done: impl Fn(&[String]) -> bool) {
    let what = format!("{}: {what}", file.display());
    eventually_blocking(&what, within, EVERY, || {
        let l = lines(file);
        if done(&l) {
            Ok(())
        } else {
            Err(l)
        }
    });
}

fn triple(line: &str) -> Option<(u64, u64, u64)> {
    let mut p = line.split(' ').map(|x| x.parse::<u64>().ok());
    Some((p.next()??, p.next()??, p.next()??))
}

#[test]
fn exec_restarts_the_survivors_command_with_the_new_pair() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    let files = [dir.path().join("w0.txt"), dir.path().join("w1.txt")];
    let (tx, rx) = mpsc::channel();
    let mut procs = Reap(
        (0..2)
            .map(|i| spawn_exec(&url, i, &files[i], &[], RECORDING, tx.clone()))
            .collect(),
    );
    // Both commands run with replicas 2 and distinct indices (a command started while the other
    // member was not yet in the view was restarted: look at the last line of each).
    let what = "a pair of commands with replicas 2";
    let (first0, first1) = eventually_blocking(what, Duration::from_secs(20), EVERY, || {
        let last = |f: &Path| lines(f).last().and_then(|l| triple(l));
        if let (Some(a), Some(b)) = (last(&files[0]), last(&files[1])) {
            if a.1 == 2 && b.1 == 2 && a.0 != b.0 && a.2 == b.2 {
                return Ok((a, b));
            }
        }
        Err((lines(&files[0]), lines(&files[1])))
    });
    assert_eq!([first0.0.min(first1.0), first0.0.max(first1.0)], [1, 2]);
    let before = lines(&files[1]).len();

    // Stop w0: its command gets SIGTERM, it exits 0; w1's command is stopped with SIGTERM and
    // restarted as 1 of 1 under a newer epoch.
    signal(&procs.0[0], "-TERM");
    let status = exit_within(&mut procs.0[0], "headcount", Duration::from_secs(10));
    assert!(status.success(), "exec after SIGTERM: {status}");
    assert_eq!(lines(&files[0]).last().map(String::as_str), Some("term"));
    wait_lines(
        &files[1],
        Duration::from_secs(10),
        "restarted as 1 of 1",
        |l| {
            l.len() >= before + 2
                && l[before] == "term"
                && l.last()
                    .and_then(|x| triple(x))
                    .is_some_and(|(i, r, e)| i == 1 && r == 1 && e > first1.2)
        },
    );
    // Its stdout said why: the run as one of 2 stopped for "revoked" (after its command exited
    // 0 on SIGTERM), then a start as 1 of 1 under a newer epoch.
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !events.iter().any(|v: &Value| {
        v["event"] == "start" && v["replicas"] == 1 && v["epoch"].as_u64() > Some(first1.2)
    }) {
        let left = deadline.saturating_duration_since(Instant::now());
        let (i, v) = rx.recv_timeout(left).expect("w1's start event");
        if i == 1 {
            events.push(v);
        }
    }
    assert!(
        events.iter().any(|v| v["event"] == "stop"
            && v["reason"] == "revoked"
            && v["replicas"] == 2
            && v["code"] == 0),
        "{events:?}"
    );
    signal(&procs.0[1], "-TERM");
    assert!(exit_within(&mut procs.0[1], "headcount", Duration::from_secs(10)).success());
}

#[test]
fn exec_kills_a_command_that_ignores_sigterm_after_the_grace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    let file = dir.path().join("stubborn.txt");
    let (tx, rx) = mpsc::channel();
    let script = r#"trap '' TERM; echo started >> "$FILE"; while :; do sleep 0.1; done"#;
    let mut procs = Reap(vec![spawn_exec(
        &url,
        0,
        &file,
        &["--grace", "500ms"],
        script,
        tx,
    )]);
    let (_, start) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a start event");
    assert_eq!(start["event"], "start", "{start}");
    let pid = start["pid"].as_u64().unwrap();
    wait_lines(&file, Duration::from_secs(5), "started", |l| !l.is_empty());
    signal(&procs.0[0], "-TERM");
    let status = exit_within(&mut procs.0[0], "headcount", Duration::from_secs(10));
    assert!(status.success(), "exec after SIGTERM: {status}");
    let (_, stop) = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("a stop event");
    assert_eq!(stop["event"], "stop", "{stop}");
    assert_eq!(stop["reason"], "signal", "{stop}");
    assert_eq!(stop["signal"], 9, "SIGKILLed after the grace: {stop}");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the command {pid} outlived exec"
    );
}

#[cfg(target_os = "linux")]
#[test]
fn the_command_dies_with_a_killed_exec() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    let file = dir.path().join("orphan.txt");
    let (tx, rx) = mpsc::channel();
    let mut procs = Reap(vec![spawn_exec(&url, 0, &file, &[], "exec sleep 1000", tx)]);
    let (_, start) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a start event");
    let pid = start["pid"].as_u64().unwrap();
    signal(&procs.0[0], "-KILL");
    let _ = procs.0[0].wait();
    let what = format!("the command {pid} gone with its SIGKILLed exec");
    let gone = until_blocking(&what, Duration::from_secs(5), EVERY, || {
        !(Path::new(&format!("/proc/{pid}")).exists()
            && std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.contains(") Z ")))
    });
    if let Err(message) = gone {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        panic!("{message}");
    }
}

#[test]
fn exec_exits_with_the_commands_own_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    let out = headcount()
        .args(["exec", "--store", &url, "--group", "once", "--ttl", TTL])
        .args([
            "--",
            "sh",
            "-c",
            "test \"$HEADCOUNT_REPLICAS\" = 1 && exit 3",
        ])
        .output()
        .expect("exec");
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_arguments_fail_in_one_line_with_status_2_or_125_for_exec() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    for (args, needle) in [
        (vec!["run", "--group", "a:b"], "group name"),
        (vec!["run", "--group", "g", "--ttl", "0s"], "TTL"),
        (vec!["run", "--group", "g", "--ttl", "2h"], "TTL"),
        (
            vec!["run", "--group", "g", "--mode", "interval", "--ttl", "5s"],
            "--ttl",
        ),
        (
            vec!["run", "--group", "g", "--interval", "1s"],
            "--interval",
        ),
        (vec!["run", "--group", "g", "--member", "a b"], "member"),
        (vec!["exec", "--group", "g"], "command"),
        (vec!["exec", "--group", "a:b", "--", "true"], "group name"),
        (
            vec!["exec", "--group", "g", "--ttl", "0s", "--", "true"],
            "TTL",
        ),
        (
            vec!["exec", "--group", "g", "--grace", "2h", "--", "true"],
            "--grace",
        ),
        (vec!["status", "--group", "a:b"], "group name"),
    ] {
        let out = headcount()
            .arg(args[0])
            .args(["--store", &url])
            .args(&args[1..])
            .output()
            .expect("headcount");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let expected = if args[0] == "exec" { 125 } else { 2 };
        assert_eq!(out.status.code(), Some(expected), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    }
}

/// A stopped `exec` (SIGSTOP) cannot renew its lease, and another member may take its share
/// once the lease runs out: its watchdog kills the command by the lease deadline, while exec
/// itself is still stopped.
#[cfg(target_os = "linux")]
#[test]
fn a_stopped_exec_s_command_dies_by_the_lease_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    let file = dir.path().join("stopped.txt");
    let (tx, rx) = mpsc::channel();
    let mut procs = Reap(vec![spawn_exec(&url, 0, &file, &[], "exec sleep 1000", tx)]);
    let (_, start) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a start event");
    let pid = start["pid"].as_u64().unwrap();
    signal(&procs.0[0], "-STOP");
    let stopped = Instant::now();
    let alive = |pid: u64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    };
    // The lease deadline is at most 0.9 TTL (900 ms) after the stop; 2 s of slack for a loaded
    // machine.
    let what = format!("the command {pid} gone with its stopped exec's lease");
    let within = Duration::from_secs(3).saturating_sub(stopped.elapsed());
    if let Err(message) = until_blocking(&what, within, EVERY, || !alive(pid)) {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        signal(&procs.0[0], "-CONT");
        panic!("{message}");
    }
    eprintln!(
        "the command died {:?} after the SIGSTOP of exec",
        stopped.elapsed()
    );
    signal(&procs.0[0], "-CONT");
    signal(&procs.0[0], "-TERM");
    let _ = procs.0[0].wait();
}

/// `remove-group` refuses while members run (status 1, naming them), and once they stopped
/// deletes the view and what else they left, so `status` shows no view.
#[test]
fn remove_group_deletes_a_stopped_group_and_refuses_a_live_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    let remove = || {
        headcount()
            .args(["remove-group", "--store", &url, "--group", "gone", "--json"])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("remove-group")
    };
    let (mut procs, _rx, _) = two_active_runs(&url, "gone");
    let refused = remove();
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("m0") && stderr.contains("live"), "{stderr}");
    for p in &mut procs.0 {
        signal(p, "-TERM");
        let _ = p.wait();
    }
    let out = remove();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let removed: Vec<&str> = v["removed"]
        .as_array()
        .expect("removed")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(removed.contains(&"hc:{gone}:view:current"), "{v}");
    let status = headcount()
        .args(["status", "--store", &url, "--group", "gone", "--json"])
        .output()
        .expect("status");
    let s: Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert!(
        s["view"].is_null() && s["members"].as_array().is_some_and(Vec::is_empty),
        "{s}"
    );
}

/// A member stopped with `--on-stop restart` keeps its place: the other stays active under its
/// pair the whole time, and the same `--member` started again is back at its index under the
/// next epoch (the same holders, no key moved). `--ready-file` follows readiness.
#[test]
fn a_run_stopped_for_a_restart_comes_back_to_its_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    let ready = dir.path().join("m1.ready");
    let (tx, rx) = mpsc::channel();
    let restartable = |i: usize, tx: mpsc::Sender<(usize, Value)>| {
        spawn_with(
            headcount()
                .args(["run", "--store", &url, "--group", "static", "--ttl", TTL])
                .args(["--member", &format!("m{i}"), "--on-stop", "restart"])
                .args(["--restart-window", "10s"])
                .args(["--ready-file", ready.to_str().unwrap()]),
            i,
            tx,
        )
    };
    let first = spawn_run(&url, "static", 0, tx.clone());
    let mut procs = Reap(vec![first, restartable(1, tx.clone())]);
    let mut latest = vec![None, None];
    until(
        &rx,
        &mut latest,
        Duration::from_secs(20),
        "both active",
        all_active,
    );
    let (index, _, epoch) = active(&latest[1]).unwrap();
    let kept = active(&latest[0]).unwrap();
    eventually_blocking("the ready file", Duration::from_secs(5), EVERY, || {
        ready.exists()
    });

    signal(&procs.0[1], "-TERM");
    let stopped = procs.0[1].wait().expect("wait");
    assert!(stopped.success(), "{stopped:?}");
    assert!(!ready.exists(), "not ready once stopped");
    // Four TTLs away: far past a lease, within the window. m0 never changes.
    let away = Instant::now();
    while away.elapsed() < Duration::from_millis(3600) {
        if let Ok((i, v)) = rx.recv_timeout(Duration::from_millis(100)) {
            latest[i] = Some(v);
        }
        assert_eq!(active(&latest[0]), Some(kept), "m0 moved: {:?}", latest[0]);
    }
    let status = status_json(&url, "static", &[]);
    assert!(status.to_string().contains("parked"), "{status}");

    procs.0.push(restartable(1, tx));
    until(&rx, &mut latest, Duration::from_secs(10), "m1 back", |l| {
        active(&l[1]).is_some_and(|(_, _, e)| e > epoch) && all_active(l)
    });
    let (back, replicas, later) = active(&latest[1]).unwrap();
    assert_eq!((back, replicas, later), (index, 2, epoch + 1), "{latest:?}");
    assert_eq!(active(&latest[0]).unwrap().0, kept.0, "{latest:?}");
    eventually_blocking(
        "the ready file again",
        Duration::from_secs(5),
        EVERY,
        || ready.exists(),
    );
}

/// `run --standby-for`: a replacement with a new member id stands by (ready, printing phase
/// `standby`), and when the member it replaces stops, it takes that member's index in one epoch;
/// the member that stays keeps its index throughout.
#[test]
fn a_standby_run_takes_the_place_of_the_member_that_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    let ready = dir.path().join("m2.ready");
    let (tx, rx) = mpsc::channel();
    let first = spawn_run(&url, "surge", 0, tx.clone());
    let second = spawn_run(&url, "surge", 1, tx.clone());
    let mut procs = Reap(vec![first, second]);
    let mut latest = vec![None, None, None];
    until(
        &rx,
        &mut latest,
        Duration::from_secs(20),
        "both active",
        |l| all_active(&l[..2]),
    );
    let (index, _, epoch) = active(&latest[1]).unwrap();
    let kept = active(&latest[0]).unwrap();
    procs.0.push(spawn_with(
        headcount()
            .args(["run", "--store", &url, "--group", "surge", "--ttl", TTL])
            .args(["--member", "m2", "--standby-for", "30s"])
            .args(["--ready-file", ready.to_str().unwrap()]),
        2,
        tx,
    ));
    until(
        &rx,
        &mut latest,
        Duration::from_secs(10),
        "m2 standing by",
        |l| l[2].as_ref().is_some_and(|v| v["phase"] == "standby"),
    );
    eventually_blocking(
        "the standby's ready file",
        Duration::from_secs(5),
        EVERY,
        || ready.exists(),
    );
    let status = status_json(&url, "surge", &[]);
    assert_eq!(status["standbys"][0]["member"], "m2", "{status}");
    assert_eq!(
        status["members"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );
    signal(&procs.0[1], "-TERM");
    let stopped = procs.0[1].wait().expect("wait");
    assert!(stopped.success(), "{stopped:?}");
    until(
        &rx,
        &mut latest,
        Duration::from_secs(10),
        "m2 in m1's place",
        |l| {
            active(&l[2]).is_some()
                && active(&l[0]).is_some_and(|(_, _, e)| active(&l[2]).is_some_and(|x| x.2 == e))
        },
    );
    let (took, replicas, later) = active(&latest[2]).unwrap();
    assert_eq!((took, replicas, later), (index, 2, epoch + 1), "{latest:?}");
    assert_eq!(active(&latest[0]).unwrap().0, kept.0, "{latest:?}");
}

#[test]
fn on_stop_restart_without_a_member_id_is_a_usage_error() {
    let out = headcount()
        .args(["run", "--store", "sqlite::memory:", "--group", "g"])
        .args(["--on-stop", "restart"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--on-stop restart needs --member"), "{err}");
    let out = headcount()
        .args(["run", "--store", "sqlite::memory:", "--group", "g"])
        .args([
            "--member",
            "a",
            "--on-stop",
            "restart",
            "--restart-window",
            "1h",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("restart window"), "{err}");
}

#[test]
fn a_crash_grace_without_a_member_id_or_past_its_bound_is_a_usage_error() {
    let run = |extra: &[&str]| {
        let out = headcount()
            .args(["run", "--store", "sqlite::memory:", "--group", "g"])
            .args(extra)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--crash-grace", "20s"]);
    assert!(err.contains("--crash-grace needs --member"), "{err}");
    let err = run(&["--member", "a", "--crash-grace", "1h"]);
    assert!(err.contains("crash grace"), "{err}");
    let err = run(&["--outage-grace", "1h"]);
    assert!(err.contains("outage grace"), "{err}");
}

/// `run --partitions 10`: three runs list disjoint partitions, 3 or 4 each, covering 0 to 9,
/// and `status` counts the same split under the view's sticky assignor.
#[test]
fn three_runs_split_declared_partitions_within_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = store_url(dir.path());
    let (tx, rx) = mpsc::channel();
    let _procs = Reap(
        (0..3)
            .map(|i| {
                let member = format!("m{i}");
                let args = [
                    "run",
                    "--store",
                    &url,
                    "--group",
                    "parts",
                    "--ttl",
                    TTL,
                    "--member",
                    &member,
                    "--partitions",
                    "10",
                ];
                spawn(&args, i, tx.clone())
            })
            .collect(),
    );
    let mut latest = vec![None; 3];
    let split = |latest: &[Option<Value>]| -> Option<Vec<Vec<u64>>> {
        if !all_active(latest) {
            return None;
        }
        latest
            .iter()
            .map(|v| {
                let list = v.as_ref()?["partitions"].as_array()?;
                list.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>()
            })
            .collect()
    };
    let covered = |latest: &[Option<Value>]| {
        split(latest).is_some_and(|lists| {
            let mut all: Vec<u64> = lists.concat();
            all.sort_unstable();
            all == (0..10).collect::<Vec<u64>>()
        })
    };
    until(
        &rx,
        &mut latest,
        Duration::from_secs(20),
        "all 3 active over 10 partitions",
        covered,
    );
    let lists = split(&latest).expect("lists");
    assert!(
        lists.iter().all(|l| l.len() == 3 || l.len() == 4),
        "{lists:?}"
    );
    let status = status_json(&url, "parts", &["--sample", "10"]);
    assert!(
        status["assignor"]
            .as_str()
            .is_some_and(|a| a.starts_with("sticky:10:")),
        "{status}"
    );
    let mut counts: Vec<u64> = status["sample_owned"]
        .as_array()
        .expect("sample_owned")
        .iter()
        .map(|c| c["keys"].as_u64().expect("keys"))
        .collect();
    counts.sort_unstable();
    assert_eq!(counts, [3, 3, 4], "{status}");
}
