//! What `run` prints is what a user may act on: a line with an `index` is printed only once the
//! member holds that pair's share, and the share is held until the member's next line. So two
//! members' lines never claim overlapping modulo shares at the same time, through joins and
//! leaves, on a real SQLite file.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // tests fail by panicking

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::{headcount, sqlite, Reap};

fn start(url: &str, member: &str, tx: mpsc::Sender<(String, Value)>) -> Reap {
    let mut child = headcount()
        .args(["run", "--store", url, "--group", "pairs", "--ttl", "1s"])
        .args(["--member", member])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run");
    let stdout = child.stdout.take().unwrap();
    let name = member.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let v: Value = serde_json::from_str(&line).expect("a JSON line");
            if tx.send((name.clone(), v)).is_err() {
                break;
            }
        }
    });
    Reap(child)
}

/// Milliseconds since the Unix epoch of `2026-11-28T08:52:00.351Z`.
fn unix_ms(at: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| at[r].parse::<i64>().expect("a number");
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    ((days * 24 + n(11..13)) * 60 + n(14..16)) * 60_000 + n(17..19) * 1000 + n(20..23)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Whether tasks exist that both `index/replicas` pairs own under modulo sharding (task `t`
/// belongs to index `t % replicas + 1`): by the Chinese remainder theorem, when the indexes
/// agree modulo the gcd of the replica counts.
fn overlap((i1, r1): (u64, u64), (i2, r2): (u64, u64)) -> bool {
    let g = gcd(r1, r2);
    (i1 - 1) % g == (i2 - 1) % g
}

#[test]
fn two_members_lines_never_claim_overlapping_shares_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite(dir.path(), "pairs.db");
    let (tx, rx) = mpsc::channel();
    let mut lines: Vec<(String, Value)> = Vec::new();
    // Waits until the newest line of every member in `want` holds a pair of `replicas`.
    let wait = |want: &[&str], replicas: u64, lines: &mut Vec<(String, Value)>| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let all = want.iter().all(|m| {
                lines
                    .iter()
                    .rev()
                    .find(|(who, _)| who == m)
                    .is_some_and(|(_, v)| {
                        v["index"].is_u64() && v["replicas"].as_u64() == Some(replicas)
                    })
            });
            if all {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(_) => panic!("{want:?} never all held a pair of {replicas}: {lines:#?}"),
            }
        }
    };
    let mut members = vec![
        Some(start(&url, "a", tx.clone())),
        Some(start(&url, "b", tx.clone())),
    ];
    wait(&["a", "b"], 2, &mut lines);
    members.push(Some(start(&url, "c", tx.clone())));
    wait(&["a", "b", "c"], 3, &mut lines);
    members.push(Some(start(&url, "d", tx.clone())));
    wait(&["a", "b", "c", "d"], 4, &mut lines);
    members[0] = None; // a leaves
    wait(&["b", "c", "d"], 3, &mut lines);
    members[1] = None; // b leaves
    wait(&["c", "d"], 2, &mut lines);
    members.push(Some(start(&url, "e", tx.clone())));
    wait(&["c", "d", "e"], 3, &mut lines);
    drop(members);
    drop(tx);
    lines.extend(rx.iter());
    // Each line with a pair claims it from its `at` to the member's next line.
    let mut claims: Vec<(String, i64, i64, (u64, u64))> = Vec::new();
    for (k, (who, v)) in lines.iter().enumerate() {
        let (Some(i), Some(r)) = (v["index"].as_u64(), v["replicas"].as_u64()) else {
            continue;
        };
        let from = unix_ms(v["at"].as_str().unwrap());
        let to = lines[k + 1..]
            .iter()
            .find(|(w, _)| w == who)
            .map_or(i64::MAX, |(_, n)| unix_ms(n["at"].as_str().unwrap()));
        claims.push((who.clone(), from, to, (i, r)));
    }
    let log: Vec<String> = lines
        .iter()
        .map(|(w, v)| {
            format!(
                "{w} {} {} {}/{} @{}",
                v["at"], v["phase"], v["index"], v["replicas"], v["epoch"]
            )
        })
        .collect();
    let epochs: std::collections::BTreeSet<u64> = lines
        .iter()
        .filter_map(|(_, v)| v["epoch"].as_u64())
        .collect();
    assert!(epochs.len() >= 6, "too few changes to tell: {epochs:?}");
    for (n, a) in claims.iter().enumerate() {
        for b in &claims[n + 1..] {
            let at_once = a.1 < b.2 && b.1 < a.2;
            assert!(
                a.0 == b.0 || !at_once || !overlap(a.3, b.3),
                "{} claimed {:?} over [{}, {}) while {} claimed {:?} over [{}, {}):\n{}",
                a.0,
                a.3,
                a.1,
                a.2,
                b.0,
                b.3,
                b.1,
                b.2,
                log.join("\n")
            );
        }
    }
}

#[test]
fn the_rfc3339_parser_counts_from_the_unix_epoch() {
    assert_eq!(unix_ms("1970-01-01T00:00:00.000Z"), 0);
    assert_eq!(unix_ms("2000-03-01T00:00:01.250Z"), 951_868_801_250);
    assert!(overlap((1, 2), (1, 4)) && !overlap((1, 2), (2, 4)) && overlap((1, 3), (2, 2)));
}
