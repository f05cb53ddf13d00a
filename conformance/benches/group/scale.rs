//! The **scale** part (Redis): `n` members joined one after the other (or `--join-batch` at a
//! time) on a Redis of the bench's
//! own holding unrelated keys; the join time, the time to converge, the steady-state calls (the
//! wrapper's and the server's), the server's and this process's CPU, the records' sizes, and
//! the convergence after a graceful leave and a crash.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use headcount::DynStore;

use crate::common::{live_heap, ms, own_cpu, own_rss, redis_info};
use crate::fleet::{delta, first_looks, group_name, round_trips, Counting, Fleet, PREFIX, SLOW};
use crate::{fill_redis, own_redis, Opts};

/// The scale part's tables: the main one's rows, their detail, and the cold start's rows
/// (`--cold-start-only`).
#[derive(Default)]
struct Tables {
    rows: Vec<String>,
    detail: Vec<String>,
    cold: Vec<String>,
}

/// The counts of `now` above those of `before`, as `name count, ...` (the nonzero ones).
fn counts_since(before: &BTreeMap<&'static str, u64>, now: &BTreeMap<&'static str, u64>) -> String {
    let counts: Vec<String> = delta(before, now)
        .iter()
        .map(|(name, c)| format!("{name} {c}"))
        .collect();
    counts.join(", ")
}

/// `n` members on one Redis; appends a Markdown row.
async fn scale(
    url: &str,
    n: usize,
    o: &Opts,
    design: &str,
    partitions: Option<u32>,
    out: &mut Tables,
) -> std::result::Result<(), String> {
    let Tables { rows, detail, cold } = out;
    let inner = headcount::connect(url).await.map_err(|e| e.to_string())?;
    let caps = inner.capabilities();
    let counting = Counting::new(inner);
    let store: DynStore = counting.clone();
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let (ttl, join_batch) = (o.scale_ttl, o.join_batch);
    let hb = ttl / 3;
    let limit = ttl * 20 + Duration::from_secs(60);
    let join_cap = Duration::from_secs(150);
    let mut fleet = Fleet {
        store: store.clone(),
        group: group_name(),
        ttl,
        full_reads: design == "full",
        two_calls: design == "two-calls",
        notices: design != "polling",
        partitions,
        whole_views: design == "whole-views",
        own_views: design == "own-views",
        members: Vec::new(),
    };
    let (rss0, heap0) = (own_rss(), live_heap());
    let before_joins = counting.hooks().snapshot();
    let t0 = Instant::now();
    let ids: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
    let batch = join_batch.max(1);
    let mut last = before_joins.clone();
    let mut last_reads = counting.hooks().reads_snapshot();
    for (b, chunk) in ids.chunks(batch).enumerate() {
        fleet.join_batches(chunk, batch).await?;
        let joined = (b * batch + chunk.len()).min(n);
        if joined % 100 < batch.min(100) || joined == n {
            // The store calls since the last line, by method (and the reads by key kind), and
            // the newest epoch any member has active: where a slow cold start spends its calls.
            let now = counting.hooks().snapshot();
            let calls = counts_since(&last, &now);
            last = now;
            let reads_now = counting.hooks().reads_snapshot();
            let reads = counts_since(&last_reads, &reads_now);
            last_reads = reads_now;
            let newest = fleet.members.iter().map(|(_, rx)| rx.borrow().epoch).max();
            eprintln!(
                "scale {n}: {joined} joined after {:.1} s, newest active epoch {}, calls: {} (reads by key kind: {})",
                t0.elapsed().as_secs_f64(),
                newest.unwrap_or(0),
                calls, reads
            );
        }
        if t0.elapsed() > join_cap {
            let rate = joined as f64 / t0.elapsed().as_secs_f64();
            drop(fleet);
            return Err(format!(
                "gave up joining after {:.0} s with {joined} of {n} members joined ({rate:.1} joins/s on average)",
                t0.elapsed().as_secs_f64(),
            ));
        }
    }
    let joined = t0.elapsed();
    let e_join = fleet.wait_converged(n as u32, limit).await?;
    let join_calls = delta(&before_joins, &counting.hooks().snapshot());
    let converged = t0.elapsed();
    if o.cold_start_only {
        let total: u64 = join_calls.values().sum();
        let per = |m: &str| join_calls.get(m).copied().unwrap_or(0) as f64 / n as f64;
        let row = format!(
            "| {n} | {design} | {} | {:.1} s | {:.1} s | {e_join} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} |",
            join_batch.max(1),
            joined.as_secs_f64(),
            converged.as_secs_f64(),
            total as f64 / n as f64,
            per("get"),
            per("compare_and_set"),
            per("renew_and_list_if_changed") + per("renew_and_versions"),
            per("list"),
        );
        eprintln!("{row}");
        cold.push(row);
        fleet.leave_all().await;
        return Ok(());
    }
    let rss_per_member = own_rss().saturating_sub(rss0) / n as u64;
    let heap_per_member = live_heap().saturating_sub(heap0) / n as u64;

    // Steady state over 5 heartbeats, after every member's first look at the slot table.
    let beats = 5u32;
    fleet.wait_converged(n as u32, limit).await?;
    tokio::time::sleep(hb * first_looks(n)).await;
    let e0 = fleet.wait_converged(n as u32, limit).await?;
    let (rc0, cpu0, tot0) = redis_info(&mut conn).await;
    let own0 = own_cpu();
    let before = counting.hooks().snapshot();
    let t = Instant::now();
    tokio::time::sleep(hb * beats).await;
    let secs = t.elapsed().as_secs_f64();
    let calls = delta(&before, &counting.hooks().snapshot());
    let own = own_cpu() - own0;
    let (rc1, cpu1, tot1) = redis_info(&mut conn).await;
    let e1 = fleet.wait_converged(n as u32, limit).await?;
    let steady = if e0 == e1 {
        ""
    } else {
        " (the view changed during the window!)"
    };
    let server_cmds: BTreeMap<String, u64> = rc1
        .iter()
        .map(|(c, v)| (c.clone(), v - rc0.get(c).copied().unwrap_or(0)))
        .filter(|(_, d)| *d > 0)
        .collect();
    let heartbeats = secs / hb.as_secs_f64();
    let per_member_hb = |x: u64| x as f64 / n as f64 / heartbeats;
    let script_usec = server_cmds.get("evalsha usec").copied().unwrap_or(0) as f64
        / server_cmds.get("evalsha").copied().unwrap_or(1).max(1) as f64;
    let view_key = format!("{PREFIX}:{{{}}}:view:current", fleet.group);
    let view_len = store
        .get(&view_key)
        .await
        .map_err(|e| e.to_string())?
        .map_or(0, |v| v.len());
    let slot_len = store
        .get(&format!("{PREFIX}:{{{}}}:slot:0", fleet.group))
        .await
        .map_err(|e| e.to_string())?
        .map_or(0, |v| v.len());

    // One graceful leave of a middle slot, then one crash of another middle slot.
    let e0 = fleet.wait_converged(n as u32, limit).await?;
    let before_changes = counting.hooks().snapshot();
    let (net0, _, _) = redis_info(&mut conn).await;
    let i = fleet.index_of_slot(n as u32 / 2);
    let (m, _) = fleet.members.remove(i);
    let t0 = Instant::now();
    let leaving = tokio::spawn(m.leave());
    let (lv, la) = fleet
        .measure(t0, e0, n as u32 - 1, Duration::from_millis(10), limit)
        .await?;
    leaving
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let e0 = fleet.wait_converged(n as u32 - 1, limit).await?;
    let i = fleet.index_of_slot(n as u32 / 3);
    let t0 = Instant::now();
    drop(fleet.members.remove(i));
    let (cv, ca) = fleet
        .measure(t0, e0, n as u32 - 2, Duration::from_millis(10), limit)
        .await?;
    let change_calls = delta(&before_changes, &counting.hooks().snapshot());
    let (net1, _, _) = redis_info(&mut conn).await;
    let net = |m: &BTreeMap<String, u64>| m.get("net output bytes").copied().unwrap_or(0);
    // The bytes Redis sent per member per view change, over the two changes (heartbeats in
    // between included).
    let change_bytes = net(&net1).saturating_sub(net(&net0)) / n as u64 / 2;

    let row = format!(
        "| {n} | {} | {} | {} | {:.1} s | {:.1} s (epoch {e_join}) | {:.0} | {:.2} | {:.0} | {:.2} | {script_usec:.1} | {:.0}% | {:.0}% | {} / {} | {} / {} | {} B | {} B | {} B | {} KB | {} KB |",
        match design {
            "full" => "full table every heartbeat (before)",
            "two-calls" => "versioned, one call per directory (before)",
            "whole-views" => "every view written whole (before)",
            "own-views" => "every joiner publishes its own view (before)",
            "polling" => "versioned, polling only (no change notifications)",
            _ => "versioned, both versions in one call",
        }
        .to_owned()
            + &if batch > 1 {
                format!(", joins {batch} at a time")
            } else {
                String::new()
            },
        partitions.map_or("none".to_owned(), |p| format!("sticky, {p}")),
        ms(ttl),
        joined.as_secs_f64(),
        converged.as_secs_f64(),
        round_trips(&calls, &caps) as f64 / secs,
        per_member_hb(round_trips(&calls, &caps)),
        (tot1 - tot0) as f64 / secs,
        per_member_hb(tot1 - tot0),
        (cpu1 - cpu0) / secs * 100.0,
        own / secs * 100.0,
        ms(lv),
        ms(la),
        ms(cv),
        ms(ca),
        view_len,
        slot_len,
        change_bytes,
        rss_per_member / 1024,
        heap_per_member / 1024,
    );
    eprintln!("{row}");
    rows.push(row);
    detail.push(format!(
        "{n} members{steady}: wrapper calls from the first join to all active {join_calls:?}; steady wrapper calls {calls:?}; server commands {server_cmds:?} over {secs:.1} s; wrapper calls from the leave to the crash's convergence: {change_calls:?}; calls over {SLOW:?} or failed, whole run: {:?}",
        counting.hooks().slow_snapshot()
    ));
    fleet.leave_all().await;
    Ok(())
}

/// The scale part for every size of `--scale` and design of `--designs`; prints its table.
pub(crate) async fn run(o: &Opts) {
    // A Redis of its own, holding unrelated data first, as a user's would.
    let Some(server) = own_redis("scale") else {
        return;
    };
    let url = server.url();
    let mut out = Tables::default();
    for &n in &o.scale {
        for &partitions in &o.partitions {
            let partitions = (partitions > 0).then_some(partitions);
            for design in &o.designs {
                fill_redis(&url, o.unrelated).await;
                eprintln!(
                    "scale: {n} members, {design}, partitions {partitions:?}, {} unrelated keys, joins {} at a time",
                    o.unrelated, o.join_batch
                );
                if let Err(e) = scale(&url, n, o, design, partitions, &mut out).await {
                    eprintln!("scale {n}: FAILED: {e}");
                    out.rows
                        .push(format!("| {n} | {design} | {partitions:?} | failed: {e} |"));
                }
            }
        }
    }
    let Tables { rows, detail, cold } = out;
    if o.cold_start_only {
        println!(
            "\n### A cold start on one local Redis holding {} unrelated keys\n",
            o.unrelated
        );
        println!("| members | design | started at a time | all joined | all active | views | store calls per member, first join to all active | `get` | `compare_and_set` | renewals | listings |");
        println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in cold.iter().chain(&rows) {
            println!("{r}");
        }
        return;
    }
    println!(
        "\n### One group on one local Redis holding {} unrelated keys\n",
        o.unrelated
    );
    println!("| members | heartbeat | assignor | TTL ms | all joined | all active | round trips/s (wrapper) | per member per heartbeat | server commands/s | per member per heartbeat | server µs per script call | Redis CPU | client CPU | leave: view / active ms | crash: view / active ms | view record | slot record | bytes from Redis per member per change | client memory (resident) per member | live heap per member |");
    println!("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!("{r}");
    }
    println!();
    for d in &detail {
        println!("- {d}");
    }
}
