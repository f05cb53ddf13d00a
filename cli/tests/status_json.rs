//! `status --json` is one documented schema (`docs/status.schema.json`): every document the
//! command prints, in every state a group can be in, is checked against it; and `status` shows
//! what it can beside foreign values at a group's keys, on a SQLite file and on Redis (where a
//! key of another type breaks the listing of its directory).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // tests fail by panicking

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use headcount_conformance::wait::eventually_blocking;
use serde_json::Value;

use common::{headcount, sqlite, text, Reap};

const SCHEMA: &str = include_str!("../../docs/status.schema.json");

/// Checks `value` against the part of JSON Schema the status schema uses: `type`, `const`,
/// `enum`, `properties`, `required`, `additionalProperties: false`, `items`, `oneOf`, `$ref`
/// to `#/$defs/...`, `minimum` and `pattern` (a `^[0-9a-f]{N}$` pattern only). Any other
/// keyword fails the check, so the schema cannot use one this check ignores.
fn check(root: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let obj = schema
        .as_object()
        .ok_or_else(|| format!("{at}: schema is not an object"))?;
    for (k, rule) in obj {
        match k.as_str() {
            "description" | "title" | "$schema" | "$id" | "$defs" => {}
            "$ref" => {
                let name = rule
                    .as_str()
                    .and_then(|r| r.strip_prefix("#/$defs/"))
                    .ok_or_else(|| format!("{at}: unsupported $ref {rule}"))?;
                check(root, &root["$defs"][name], value, at)?;
            }
            "type" => {
                let types: Vec<&str> = match rule {
                    Value::String(t) => vec![t.as_str()],
                    Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                    _ => return Err(format!("{at}: bad type {rule}")),
                };
                let ok = types.iter().any(|t| match *t {
                    "null" => value.is_null(),
                    "boolean" => value.is_boolean(),
                    "integer" => value.is_u64() || value.is_i64(),
                    "number" => value.is_number(),
                    "string" => value.is_string(),
                    "array" => value.is_array(),
                    "object" => value.is_object(),
                    _ => false,
                });
                if !ok {
                    return Err(format!("{at}: {value} is not of type {rule}"));
                }
            }
            "const" if value != rule => return Err(format!("{at}: {value} is not {rule}")),
            "const" => {}
            "enum" => {
                if !rule.as_array().is_some_and(|a| a.contains(value)) {
                    return Err(format!("{at}: {value} is not one of {rule}"));
                }
            }
            "minimum" => {
                if let (Some(v), Some(min)) = (value.as_f64(), rule.as_f64()) {
                    if v < min {
                        return Err(format!("{at}: {value} is below {rule}"));
                    }
                }
            }
            "pattern" => {
                let len: usize = rule
                    .as_str()
                    .and_then(|p| p.strip_prefix("^[0-9a-f]{"))
                    .and_then(|p| p.strip_suffix("}$"))
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| format!("{at}: unsupported pattern {rule}"))?;
                if let Some(s) = value.as_str() {
                    if s.len() != len || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err(format!("{at}: {value} does not match {rule}"));
                    }
                }
            }
            "required" => {
                if let Some(o) = value.as_object() {
                    for name in rule.as_array().into_iter().flatten() {
                        let name = name.as_str().unwrap_or_default();
                        if !o.contains_key(name) {
                            return Err(format!("{at}: missing required {name}"));
                        }
                    }
                }
            }
            "properties" => {
                if let Some(o) = value.as_object() {
                    for (name, v) in o {
                        if let Some(s) = rule.get(name) {
                            check(root, s, v, &format!("{at}.{name}"))?;
                        }
                    }
                }
            }
            "additionalProperties" => {
                if rule != &Value::Bool(false) {
                    return Err(format!("{at}: unsupported additionalProperties {rule}"));
                }
                if let Some(o) = value.as_object() {
                    for name in o.keys() {
                        if obj.get("properties").and_then(|p| p.get(name)).is_none() {
                            return Err(format!("{at}: {name} is not in the schema"));
                        }
                    }
                }
            }
            "items" => {
                for (i, v) in value.as_array().into_iter().flatten().enumerate() {
                    check(root, rule, v, &format!("{at}[{i}]"))?;
                }
            }
            "oneOf" => {
                let matched: Vec<String> = rule
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| check(root, s, value, at))
                    .filter_map(Result::err)
                    .collect();
                let n = rule.as_array().map_or(0, Vec::len);
                if n - matched.len() != 1 {
                    return Err(format!(
                        "{at}: {} of {n} alternatives match: {matched:?}",
                        n - matched.len()
                    ));
                }
            }
            other => return Err(format!("{at}: unsupported keyword {other}")),
        }
    }
    Ok(())
}

/// Checks one document against the schema, with the document in the failure message.
pub fn conforms(doc: &Value) {
    let schema: Value = serde_json::from_str(SCHEMA).expect("the schema is JSON");
    if let Err(e) = check(&schema, &schema, doc, "$") {
        panic!("status --json does not match docs/status.schema.json: {e}\n{doc:#}");
    }
}

fn status_json(url: &str, group: &str, extra: &[&str]) -> Value {
    let out = headcount()
        .args(["status", "--store", url, "--group", group, "--json"])
        .args(extra)
        .output()
        .expect("status");
    assert!(out.status.success(), "status failed: {}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    conforms(&doc);
    doc
}

fn run(url: &str, group: &str, member: &str, extra: &[&str]) -> Reap {
    let ttl = if extra.contains(&"--ttl") {
        &[][..]
    } else {
        &["--ttl", "1s"][..]
    };
    Reap(
        headcount()
            .args(["run", "--store", url, "--group", group])
            .args(ttl)
            .args(["--member", member])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run"),
    )
}

/// Member `m0` of group `g`, in a settled view, then stopped (SIGSTOP) with a 60 s lease: it
/// stays listed, and no heartbeat of its replaces what a test writes at the group's keys.
fn frozen_member(url: &str) -> Reap {
    let m = run(url, "g", "m0", &["--ttl", "60s"]);
    settled(url, "g", 1, &[]);
    let stopped = Command::new("kill")
        .args(["-STOP", &m.0.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    m
}

/// Waits until `status --json` shows a settled view naming `n` members; returns it. A read
/// that fails (the members have not created the SQLite file yet) is tried again.
fn settled(url: &str, group: &str, n: usize, extra: &[&str]) -> Value {
    eventually_blocking(
        "a settled view",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || {
            let out = headcount()
                .args(["status", "--store", url, "--group", group, "--json"])
                .args(extra)
                .output()
                .expect("status");
            if !out.status.success() {
                return Err(Value::String(text(&out.stderr)));
            }
            let s: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
            conforms(&s);
            let named = s["view"]["slots"].as_array().map_or(0, Vec::len);
            let live = s["members"].as_array().map_or(0, Vec::len);
            if s["view_settled"] == true && named == n && live == n {
                Ok(s)
            } else {
                Err(s)
            }
        },
    )
}

/// The schema holds for an empty group, a group of partitions with keys asked for (one of
/// them unmapped), a group mid-change, named keys and a failed read.
#[test]
fn every_status_document_matches_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite(dir.path(), "schema.db");
    let empty = status_json("memory://", "nobody", &[]);
    assert!(empty["members"].as_array().unwrap().is_empty());
    assert_eq!(empty["format"], "headcount.status/1");
    let _a = run(&url, "parts", "a", &["--partitions", "64"]);
    let _b = run(&url, "parts", "b", &["--partitions", "64"]);
    let s = settled(&url, "parts", 2, &["--key", "7", "--key", "x"]);
    assert_eq!(s["declared_keys"], 64);
    assert_eq!(s["handoff"], Value::Null);
    assert!(s["members"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["phase"] == "active" && m["index"].is_u64() && m["holds_up"] == false));
    assert_eq!(s["timeline"][0]["first"], true);
    // A third member: documents read during its join match too.
    let _c = run(&url, "parts", "c", &["--partitions", "64"]);
    settled(&url, "parts", 3, &[]);
    // Named keys not given: unmapped, still the schema.
    let keyed = dir.path().join("keys.txt");
    std::fs::write(&keyed, "a\nb\nc\n").unwrap();
    let s = status_json(&url, "parts", &["--keys-file", keyed.to_str().unwrap()]);
    assert!(s["unmapped"].is_string(), "{s}");
    // A failed read under --watch is the error document of the same schema.
    let mut watch = Reap(
        headcount()
            .args(["status", "--store", "redis://127.0.0.1:1", "--group", "g"])
            .args(["--watch", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("status --watch"),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(watch.0.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    if !line.is_empty() {
        let doc: Value = serde_json::from_str(&line).expect("a JSON line");
        conforms(&doc);
        assert!(doc["error"].is_string(), "{doc}");
    }
}

/// `status` shows each member's lease left as the store counts it: within (0, ttl] for a member
/// that renews, and going down for one that stopped (SIGSTOP) until it is renewed again; in
/// the table and in `--json`.
fn shows_lease_left(url: &str) {
    let _live = run(url, "lease", "renewing", &["--ttl", "2s"]);
    let s = settled(url, "lease", 1, &[]);
    let left = s["members"][0]["lease_left_ms"]
        .as_u64()
        .expect("a lease left");
    assert!(left > 0 && left <= 2000, "{s:#}");
    assert_eq!(
        s["members"][0]["record_left_ms"], left,
        "no crash grace: {s:#}"
    );
    let _frozen = frozen_member(url);
    let lease = |s: &Value| {
        s["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["member"] == "m0")
            .and_then(|m| m["lease_left_ms"].as_u64())
            .expect("m0's lease left")
    };
    let first = lease(&status_json(url, "g", &[]));
    assert!(first > 0 && first <= 60_000, "{first}");
    let later = eventually_blocking(
        "the stopped member's lease to go down",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || {
            let now = lease(&status_json(url, "g", &[]));
            if now < first && now > 0 {
                Ok(now)
            } else {
                Err(Value::from(now))
            }
        },
    );
    assert!(later < first);
    let out = headcount()
        .args(["status", "--store", url, "--group", "g"])
        .output()
        .expect("status");
    let table = text(&out.stdout);
    assert!(table.contains("lease left"), "{table}");
    let row = table
        .lines()
        .find(|l| l.contains(" m0 "))
        .expect("m0's row");
    let shown: u64 = row
        .split_whitespace()
        .filter_map(|w| w.strip_suffix("ms"))
        .filter_map(|n| n.parse().ok())
        .find(|&n| n != 60_000)
        .unwrap_or_else(|| panic!("a lease left in {row}"));
    assert!(shown > 0 && shown <= first, "{row}");
}

#[test]
fn status_shows_lease_left_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    shows_lease_left(&sqlite(dir.path(), "lease.db"));
}

#[test]
fn status_shows_lease_left_on_redis() {
    use headcount_harness::{skip_unless_required, KvStore, ServerKind};
    let started = KvStore::redis(None);
    let Some(redis) = skip_unless_required(ServerKind::Redis, "lease left over Redis", started)
    else {
        return;
    };
    shows_lease_left(&redis.url());
}

/// The check above fails a document that strays from the schema (a field added, one
/// missing, a wrong type): it could catch a change of the document.
#[test]
fn the_schema_check_catches_a_stray_document() {
    let doc = status_json("memory://", "g", &[]);
    let schema: Value = serde_json::from_str(SCHEMA).unwrap();
    let mut added = doc.clone();
    added["extra"] = 1.into();
    let mut missing = doc.clone();
    missing.as_object_mut().unwrap().remove("problems");
    let mut typed = doc.clone();
    typed["view_settled"] = "no".into();
    for bad in [added, missing, typed] {
        assert!(check(&schema, &schema, &bad, "$").is_err(), "{bad}");
    }
}

/// On a SQLite file: a foreign value at the view key and at a slot key. `status` exits 0, shows
/// the member, and names each problem with its fix, in the table and in the JSON.
#[test]
fn status_shows_foreign_values_beside_the_members_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite(dir.path(), "foreign.db");
    let path = dir.path().join("foreign.db");
    let _m = frozen_member(&url);
    let db = rusqlite::Connection::open(&path).unwrap();
    for (key, value) in [
        ("hc:{g}:view:current", "hello"),
        ("hc:{g}:view:settled", "not a record"),
    ] {
        let n = db
            .execute(
                "UPDATE headcount_kv SET value = ?2 WHERE key = ?1",
                [key, value],
            )
            .unwrap();
        assert_eq!(n, 1, "{key} is in the table");
    }
    let s = status_json(&url, "g", &[]);
    let kinds: Vec<(&str, &str)> = s["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["key"].as_str().unwrap(), p["kind"].as_str().unwrap()))
        .collect();
    assert!(
        kinds.contains(&("hc:{g}:view:current", "foreign_value")),
        "{s:#}"
    );
    assert!(
        kinds.contains(&("hc:{g}:view:settled", "foreign_value")),
        "{s:#}"
    );
    assert_eq!(s["view_text"], "hello");
    let table = common::status_table(&url, "g");
    assert!(
        table.contains("problem  hc:{g}:view:current: foreign_value \"hello\""),
        "{table}"
    );
    assert!(table.contains("remove-group"), "{table}");
    assert!(table.contains(" m0 "), "the member is shown: {table}");
}

/// On Redis: a hash where the view is (another Redis type breaks the listing of the view's
/// directory). `status` exits 0, shows the members and the settled mark beside it, and the
/// view's key as a `foreign_type` problem with its fix.
#[test]
fn status_shows_a_foreign_redis_type_beside_the_members() {
    use headcount_harness::{skip_unless_required, KvStore, ServerKind};
    let started = KvStore::redis(None);
    let Some(redis) = skip_unless_required(ServerKind::Redis, "status over Redis", started) else {
        return;
    };
    let url = redis.url();
    let _m = frozen_member(&url);
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-u", &url])
            .args(args)
            .output()
            .expect("redis-cli");
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    // The view key keeps its name in headcount's key index: the listing meets the hash.
    cli(&["DEL", "hc:{g}:view:current"]);
    cli(&["HSET", "hc:{g}:view:current", "epoch", "9"]);
    let s = status_json(&url, "g", &[]);
    assert_eq!(s["members"][0]["member"], "m0", "{s:#}");
    let problem = s["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["key"] == "hc:{g}:view:current")
        .unwrap_or_else(|| panic!("the view key is a problem: {s:#}"));
    assert_eq!(problem["kind"], "foreign_type", "{problem}");
    assert!(
        problem["fix"]
            .as_str()
            .unwrap()
            .contains("redis-cli DEL hc:{g}:view:current"),
        "{problem}"
    );
    // The settled mark beside it is still read.
    assert!(s["settled"].is_u64(), "{s:#}");
    let out = headcount()
        .args(["status", "--store", &url, "--group", "g"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("foreign_type"),
        "{}",
        text(&out.stdout)
    );
}
