//! The `headcount` binary end to end, on the embedded SQLite store.
#![allow(clippy::expect_used)] // test helpers fail the test by panicking

use std::process::{Command, Output};

fn headcount(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_headcount"))
        .args(args)
        .env_remove("HEADCOUNT_STORE")
        .output()
        .expect("run headcount")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn conformance_on_a_fresh_sqlite_file_prints_a_passing_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/x.db", dir.path().display());
    let out = headcount(&["conformance", "--store", &url]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("incr_50x100_exact"), "{stdout}");
    for primitive in ["incr", "get", "compare_and_set", "set_max"] {
        assert!(
            stdout.lines().any(|l| l.starts_with(primitive)),
            "no latency row for {primitive}:\n{stdout}"
        );
    }
    assert!(stdout.contains(" 0 failed"), "{stdout}");
}

#[test]
fn conformance_json_is_one_object_per_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/x.db", dir.path().display());
    let out = headcount(&["conformance", "--store", &url, "--json", "--filter", "cas"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut cases = 0;
    for line in stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON object per line");
        if v["type"] == "case" {
            cases += 1;
            assert!(v["case"].as_str().unwrap_or("").contains("cas"), "{line}");
            assert_eq!(v["outcome"], "pass", "{line}");
        }
    }
    assert!(cases > 0, "{stdout}");
}

#[test]
fn the_store_comes_from_the_environment_when_no_flag_is_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_headcount"))
        .args(["conformance", "--filter", "get_absent"])
        .env(
            "HEADCOUNT_STORE",
            format!("sqlite://{}/env.db", dir.path().display()),
        )
        .output()
        .expect("run headcount");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dir.path().join("env.db").exists());
}

#[test]
fn bad_urls_fail_in_one_line_without_the_password() {
    for url in [
        "mysql://root:hunter2@localhost/db",
        "postgres://root:hunter2@localhost:notaport/db",
        "sqlite://",
    ] {
        let out = headcount(&["conformance", "--store", url]);
        assert_eq!(out.status.code(), Some(2), "{url}");
        let stderr = text(&out.stderr);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{url}: {stderr}");
        assert!(stderr.starts_with("headcount: error:"), "{stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
        assert!(out.stdout.is_empty(), "{url}");
    }
}
