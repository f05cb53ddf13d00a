//! `headcount-chaos-member`: one member process of the chaos test (`tests/chaos.rs`).
//!
//! Joins a group on the store under test and loops: for every partition key `p0..p{P-1}` it
//! owns, it takes the grant, **advances** the PostgreSQL fence of that partition with the grant's
//! token (so every write admitted under an older token is visible to what it reads next), works
//! for 20–50 ms, then writes the partition's pending ids in one statement that checks the fence
//! in the same statement as the write. It does NOT re-check [`Grant::is_valid`] before writing,
//! so a member paused past its lease really sends its late writes, and the fence has to refuse
//! them. The `accepted` table has no unique constraint: a broken protocol shows as duplicates.
//!
//! The fence SQL is this binary's own (the backend crate's PostgreSQL fence was not merged when
//! it was written).
//!
//! Logs one JSON line per grant used (with its token, the wall time just before it was asked
//! for, and the wall time the member's lease runs to), per write and per assignment change to
//! `--log`, with the wall time in milliseconds, so the test can check that no two members used the same
//! `(key, epoch)` and measure convergence. SIGTERM leaves the group gracefully and exits 0.
//!
//! Arguments: `--store URL --sink URL --tables PREFIX --group G --member ID --ttl-ms N
//! --log PATH [--partitions 64]`.

// prctl(PR_SET_PDEATHSIG): the member must die with the test that spawned it.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use headcount::recipes::group::{Grant, Group, GroupConfig, Member};
use serde_json::json;
use tokio_postgres::{Client, NoTls};

struct Args {
    store: String,
    sink: String,
    tables: String,
    group: String,
    member: String,
    ttl: Duration,
    log: String,
    partitions: u32,
}

fn parse_args() -> Result<Args, String> {
    let mut map = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let name = flag
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected argument {flag:?}"))?
            .to_owned();
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        map.insert(name, value);
    }
    let mut take = |k: &str| map.remove(k).ok_or_else(|| format!("--{k} is required"));
    let ttl_ms: u64 = take("ttl-ms")?
        .parse()
        .map_err(|e| format!("--ttl-ms: {e}"))?;
    let partitions = match map.remove("partitions") {
        Some(p) => p.parse().map_err(|e| format!("--partitions: {e}"))?,
        None => 64,
    };
    let mut take = |k: &str| map.remove(k).ok_or_else(|| format!("--{k} is required"));
    let args = Args {
        store: take("store")?,
        sink: take("sink")?,
        tables: take("tables")?,
        group: take("group")?,
        member: take("member")?,
        ttl: Duration::from_millis(ttl_ms),
        log: take("log")?,
        partitions,
    };
    if !args
        .tables
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err("--tables must be letters, digits and _".into());
    }
    Ok(args)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The member's log: one JSON object per line, flushed at once (the member may be killed).
struct Log {
    file: Mutex<std::fs::File>,
}

impl Log {
    fn line(&self, mut v: serde_json::Value) {
        v["t"] = json!(now_ms());
        let mut f = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = writeln!(f, "{v}");
    }
}

fn die_with_parent() {
    // SAFETY: plain prctl/getppid calls with constant arguments.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
    }
    // The parent may have died before prctl: then we were re-parented.
    if let Some(parent) = std::env::var("HEADCOUNT_CHAOS_PARENT")
        .ok()
        .and_then(|p| p.parse::<i32>().ok())
    {
        // SAFETY: getppid has no preconditions.
        if unsafe { libc::getppid() } != parent {
            std::process::exit(3);
        }
    }
}

fn main() -> std::process::ExitCode {
    die_with_parent();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("headcount-chaos-member: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("headcount-chaos-member: runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("headcount-chaos-member: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

async fn connect_sink(url: &str) -> Result<Client, String> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("sink: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

async fn run(args: Args) -> Result<(), String> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.log)
        .map_err(|e| format!("log {}: {e}", args.log))?;
    let log = Arc::new(Log {
        file: Mutex::new(file),
    });
    // A store that does not answer yet (a Sentinel on a link just made, a loaded machine) is
    // tried again for a while, as a supervisor would restart the process.
    let mut tries = 0;
    let store = loop {
        match headcount::connect(&args.store).await {
            Ok(store) => break store,
            Err(e) if e.is_retryable() && tries < 20 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(format!("store: {e}")),
        }
    };
    let sink = Arc::new(connect_sink(&args.sink).await?);
    let config = GroupConfig::new(args.group.clone(), args.ttl).with_member(args.member.clone());
    // So is a join the store refuses for now (a Redis Cluster that marked a node failed answers
    // CLUSTERDOWN for a while after the node is back): `headcount run` exits with the
    // retryable code and its supervisor starts it again.
    let mut tries = 0;
    let member = loop {
        match Group::join(store.clone(), config.clone()).await {
            Ok(member) => break Arc::new(member),
            Err(e) if e.is_retryable() && tries < 20 => {
                tries += 1;
                log.line(
                    json!({"ev": "join_failed", "member": args.member, "error": e.to_string()}),
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(format!("join: {e}")),
        }
    };
    log.line(json!({"ev": "joined", "member": args.member, "pid": std::process::id()}));

    // One line per assignment change.
    let mut rx = member.watch();
    let (m, l) = (args.member.clone(), log.clone());
    tokio::spawn(async move {
        loop {
            {
                let a = rx.borrow_and_update().clone();
                l.line(json!({
                    "ev": "assign", "member": m, "slot": a.slot, "epoch": a.epoch,
                    "replicas": a.replicas, "live": a.live, "phase": a.phase.as_str(),
                }));
            }
            if rx.changed().await.is_err() {
                break;
            }
        }
    });

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("SIGTERM handler: {e}"))?;
    let sql = Sql::new(&args.tables);
    loop {
        let round = work_round(&member, &sink, &sql, &args, &log);
        tokio::select! {
            _ = term.recv() => break,
            r = round => r?,
        }
    }
    log.line(json!({"ev": "leaving", "member": args.member}));
    match Arc::try_unwrap(member) {
        Ok(m) => m.leave().await.map_err(|e| format!("leave: {e}"))?,
        Err(_) => return Err("a task still holds the member".into()),
    }
    log.line(json!({"ev": "left", "member": args.member}));
    Ok(())
}

struct Sql {
    advance: String,
    pending: String,
    write: String,
}

impl Sql {
    fn new(t: &str) -> Sql {
        Sql {
            advance: format!(
                "UPDATE {t}_fence SET token = $2 WHERE part = $1 AND token <= $2 RETURNING 1"
            ),
            // What is left to do, read after the fence was advanced: every write of an older
            // owner either committed before the advance (and is seen here) or is refused.
            pending: format!(
                "SELECT o.id FROM {t}_offered o WHERE o.part = $1 \
                 AND NOT EXISTS (SELECT 1 FROM {t}_accepted a WHERE a.id = o.id)"
            ),
            // The fence check and the write in one statement: the UPDATE locks the fence row,
            // so an older token cannot write in between, and refuses a token below the newest.
            // The ids are exactly those read as pending, with no re-check against `accepted`:
            // a broken hand-off shows up as ids accepted twice.
            write: format!(
                "WITH f AS (UPDATE {t}_fence SET token = $2 WHERE part = $1 AND token <= $2 \
                 RETURNING 1), \
                 ins AS (INSERT INTO {t}_accepted (id, token, member) \
                 SELECT x, $2, $3 FROM unnest($4::bigint[]) AS x, f RETURNING 1) \
                 SELECT (SELECT count(*) FROM f), (SELECT count(*) FROM ins)"
            ),
        }
    }
}

/// Takes every partition this member owns now and works on each concurrently.
async fn work_round(
    member: &Member,
    sink: &Client,
    sql: &Sql,
    args: &Args,
    log: &Log,
) -> Result<(), String> {
    // Every grant below was valid at or after this instant (the checker's lower bound).
    let asked = now_ms();
    let grants: Vec<(i32, Grant)> = (0..args.partitions)
        .filter_map(|p| member.owns(format!("p{p}")).map(|g| (p as i32, g)))
        .collect();
    if grants.is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
        return Ok(());
    }
    let jobs = grants.into_iter().map(|(part, grant)| async move {
        let token = grant.token().get() as i64;
        log.line(json!({
            "ev": "grant", "member": args.member, "slot": grant.slot(),
            "key": format!("p{part}"), "epoch": grant.epoch(), "token": token, "asked": asked,
            // Read beside the clock: the line's own time is taken later, when it is written.
            "deadline": grant.lease_remaining().map(|d| now_ms() + d.as_millis() as u64),
        }));
        let advanced = sink
            .query(&sql.advance, &[&part, &token])
            .await
            .map_err(|e| format!("advance: {e}"))?;
        if advanced.is_empty() {
            log.line(json!({
                "ev": "stale", "member": args.member, "key": format!("p{part}"), "epoch": token,
            }));
            return Ok::<(), String>(());
        }
        log.line(json!({
            "ev": "advanced", "member": args.member, "key": format!("p{part}"), "epoch": token,
        }));
        let pending: Vec<i64> = sink
            .query(&sql.pending, &[&part])
            .await
            .map_err(|e| format!("pending: {e}"))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let work = 20 + rand::random::<u64>() % 31;
        tokio::time::sleep(Duration::from_millis(work)).await;
        // Logged before the statement goes out: a member stopped before this line writes late.
        log.line(json!({
            "ev": "sending", "member": args.member, "key": format!("p{part}"), "epoch": token,
        }));
        let row = sink
            .query_one(&sql.write, &[&part, &token, &args.member, &pending])
            .await
            .map_err(|e| format!("write: {e}"))?;
        let fenced: i64 = row.get(0);
        let accepted: i64 = row.get(1);
        log.line(json!({
            "ev": "write", "member": args.member, "key": format!("p{part}"), "epoch": token,
            "fenced": fenced == 0, "accepted": accepted,
        }));
        drop(grant);
        Ok(())
    });
    for r in futures::future::join_all(jobs).await {
        r?;
    }
    Ok(())
}
