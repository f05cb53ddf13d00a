//! The **stores** part (PostgreSQL, SQLite, etcd): the scale part on the shared test servers,
//! each holding unrelated keys and reached through a counting TCP proxy: store calls, bytes and
//! server requests per member per heartbeat, and a crash's convergence.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use headcount::DynStore;
use headcount_harness::ServerKind;

use crate::common::{behind_proxy, etcd_metrics, fill_store, ms, own_cpu, shared_url};
use crate::fleet::{delta, first_looks, group_name, round_trips, Counting, Fleet};
use crate::Opts;

/// `n` members on the store at `url` (PostgreSQL, SQLite, etcd), reached through a counting
/// proxy when it is a server; returns a Markdown row: store calls and bytes per member per
/// heartbeat in the steady state, and a crash's convergence.
async fn scale_store(
    backend: ServerKind,
    url: &str,
    n: usize,
    ttl: Duration,
    unrelated: u64,
) -> std::result::Result<String, String> {
    let (proxy, url, upstream) = behind_proxy(url).await?;
    let inner = headcount::connect(&url).await.map_err(|e| e.to_string())?;
    let caps = inner.capabilities();
    let counting = Counting::new(inner);
    let store: DynStore = counting.clone();
    let hb = ttl / 3;
    let limit = ttl * 20 + Duration::from_secs(60);
    let mut fleet = Fleet {
        store: store.clone(),
        group: group_name(),
        ttl,
        full_reads: false,
        two_calls: false,
        notices: true,
        partitions: None,
        whole_views: false,
        own_views: false,
        members: Vec::new(),
    };
    let t0 = Instant::now();
    for i in 0..n {
        fleet.join(&format!("m{i}")).await?;
    }
    fleet.wait_converged(n as u32, limit).await?;
    let converged = t0.elapsed();
    // The window below is the steady state, after every member's first look at the table.
    tokio::time::sleep(hb * first_looks(n)).await;
    let e0 = fleet.wait_converged(n as u32, limit).await?;
    let bytes0 = proxy.as_ref().map(|p| p.bytes());
    let etcd_port = match backend {
        ServerKind::Etcd => upstream,
        _ => None,
    };
    let metrics0 = match etcd_port {
        Some(port) => etcd_metrics(port).await,
        None => BTreeMap::new(),
    };
    let own0 = own_cpu();
    let before = counting.hooks().snapshot();
    let t = Instant::now();
    let beats = 5u32;
    tokio::time::sleep(hb * beats).await;
    let secs = t.elapsed().as_secs_f64();
    let calls = delta(&before, &counting.hooks().snapshot());
    let own = own_cpu() - own0;
    let bytes1 = proxy.as_ref().map(|p| p.bytes());
    let metrics1 = match etcd_port {
        Some(port) => etcd_metrics(port).await,
        None => BTreeMap::new(),
    };
    let e1 = fleet.wait_converged(n as u32, limit).await?;
    let steady = if e0 == e1 {
        ""
    } else {
        " (the view changed during the window!)"
    };
    let heartbeats = secs / hb.as_secs_f64();
    let per_member_hb = |x: u64| x as f64 / n as f64 / heartbeats;
    let bytes = match (bytes0, bytes1) {
        (Some((t0, f0)), Some((t1, f1))) => format!(
            "{:.0} / {:.0}",
            per_member_hb(t1 - t0),
            per_member_hb(f1 - f0)
        ),
        _ => "in process".to_owned(),
    };
    let server: Vec<String> = metrics1
        .iter()
        .map(|(k, v)| (k, v - metrics0.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .map(|(k, d)| format!("{k} {:.2}", d / n as f64 / heartbeats))
        .collect();
    let server = if server.is_empty() {
        "-".to_owned()
    } else {
        server.join(", ")
    };
    let i = fleet.index_of_slot(n as u32 / 3);
    let t0 = Instant::now();
    drop(fleet.members.remove(i));
    let (cv, ca) = fleet
        .measure(t0, e1, n as u32 - 1, Duration::from_millis(10), limit)
        .await?;
    let row = format!(
        "| {} | {n} | {unrelated} | {} | {:.1} s | {:.2} | {:.2} | {bytes} | {server} | {:.0}% | {} / {} |{steady} {calls:?} |",
        backend.name(),
        ms(ttl),
        converged.as_secs_f64(),
        per_member_hb(calls.values().sum()),
        per_member_hb(round_trips(&calls, &caps)),
        own / secs * 100.0,
        ms(cv),
        ms(ca),
    );
    eprintln!("{row}");
    fleet.leave_all().await;
    Ok(row)
}

/// The stores part on every backend of `--backends` and size of `--scale`; prints its table.
pub(crate) async fn run(o: &Opts) {
    let mut rows = Vec::new();
    for &backend in &o.backends {
        let Some(url) = shared_url(backend, "group").await else {
            continue;
        };
        let unrelated = o.unrelated.min(100_000);
        if let Err(e) = fill_store(&url, unrelated).await {
            panic!("{}: filling: {e}", backend.name());
        }
        for &n in &o.scale {
            eprintln!("stores: {} members on {}", n, backend.name());
            match scale_store(backend, &url, n, o.scale_ttl, unrelated).await {
                Ok(row) => rows.push(row),
                Err(e) => rows.push(format!("| {} | {n} | failed: {e} |", backend.name())),
            }
        }
    }
    println!("\n### One group on the other stores, each holding unrelated keys\n");
    println!("| backend | members | unrelated keys | TTL ms | all active | store calls per member per heartbeat | round trips | bytes per member per heartbeat (to / from the server) | server requests per member per heartbeat | client CPU | crash: view / active ms | calls in the window |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|");
    for r in &rows {
        println!("{r}");
    }
}
