//! What the end-to-end tests of the `headcount` binary share: the command with a clean
//! environment, the one error line, and a group's status.
// Each test binary uses its own part of this module.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The binary with none of the variables that would change what a test asks for (its store,
/// group, member, TTL, log format and filter), stdin not a terminal.
pub fn headcount() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_headcount"));
    for var in [
        "HEADCOUNT_STORE",
        "HEADCOUNT_GROUP",
        "HEADCOUNT_MEMBER",
        "HEADCOUNT_TTL",
        "HEADCOUNT_LOG_FORMAT",
        "RUST_LOG",
        "WORKUNITS_NAMESPACE",
        "HEADCOUNT_WORKUNITS_NAMESPACE",
    ] {
        c.env_remove(var);
    }
    c.stdin(Stdio::null());
    c
}

/// Runs `c` to its end.
pub fn output(c: &mut Command) -> Output {
    c.output().expect("run headcount")
}

/// Bytes as text, lossily.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The URL of SQLite file `file` in `dir`.
pub fn sqlite(dir: &Path, file: &str) -> String {
    format!("sqlite://{}/{file}", dir.display())
}

/// One `headcount: error:` line on stderr, with exit status `code`; returns the line.
pub fn one_error_line(out: &Output, code: i32) -> String {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("headcount: error: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// `status --json` of `group`.
pub fn status_json(url: &str, group: &str) -> Value {
    status_json_with(url, group, &[])
}

/// `status --json` of `group` with `extra` arguments: its one JSON object.
pub fn status_json_with(url: &str, group: &str, extra: &[&str]) -> Value {
    let out = output(
        headcount()
            .args(["status", "--store", url, "--group", group, "--json"])
            .args(extra),
    );
    assert!(out.status.success(), "status failed: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

/// `status` of `group` as a table.
pub fn status_table(url: &str, group: &str) -> String {
    let out = output(headcount().args(["status", "--store", url, "--group", group]));
    assert!(out.status.success(), "status failed: {}", text(&out.stderr));
    text(&out.stdout)
}

/// The member ids `status` lists in `group`.
pub fn members(url: &str, group: &str) -> Vec<String> {
    status_json(url, group)["members"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|m| m["member"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Kills the child when the test ends, passing or not: SIGCONT (a test may have stopped it),
/// SIGTERM, then SIGKILL after 5 s.
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-CONT", &pid]).status();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
