//! The **convergence** part (each backend): five members, and per repetition a join, a graceful
//! leave, a join again, a crash, a crash of the lowest slot and a join that fills it, each timed
//! until every member adopted the new view and until every one is active on it; and the
//! **load** part beside it: the calls of every method over 10 heartbeats with nothing
//! changing, per member per heartbeat.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use headcount::DynStore;
use headcount_harness::ServerKind;

use crate::common::{ms, shared_url};
use crate::fleet::{delta, group_name, round_trips, Counting, Fleet};
use crate::Opts;

#[derive(Default)]
struct Samples(BTreeMap<&'static str, (Vec<Duration>, Vec<Duration>)>);

impl Samples {
    fn add(&mut self, event: &'static str, (view, active): (Duration, Duration)) {
        let e = self.0.entry(event).or_default();
        e.0.push(view);
        e.1.push(active);
    }
}

fn median_max(v: &[Duration]) -> (Duration, Duration) {
    let mut s = v.to_vec();
    s.sort();
    (s[s.len() / 2], s[s.len() - 1])
}

/// The convergence and steady-state load of one backend; appends Markdown rows to the tables.
async fn convergence(
    backend: ServerKind,
    url: &str,
    reps: usize,
    ttl: Option<Duration>,
    conv: &mut Vec<String>,
    load: &mut Vec<String>,
) -> std::result::Result<(), String> {
    let inner = headcount::connect(url).await.map_err(|e| e.to_string())?;
    let caps = inner.capabilities();
    let counting = Counting::new(inner);
    let store: DynStore = counting.clone();
    let ttl = ttl.unwrap_or(Duration::from_millis(1500)).max(caps.min_ttl);
    let hb = ttl / 3;
    let limit = ttl * 6 + Duration::from_secs(5);
    let poll = Duration::from_millis(2);
    let mut fleet = Fleet {
        store,
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
    for i in 0..5 {
        fleet.join(&format!("m{i}")).await?;
    }
    fleet.wait_converged(5, limit).await?;

    // Steady state: 10 heartbeats with nothing changing.
    let beats = 10u32;
    let e0 = fleet.wait_converged(5, limit).await?;
    let before = counting.hooks().snapshot();
    let t = Instant::now();
    tokio::time::sleep(hb * beats).await;
    let elapsed = t.elapsed();
    let calls = delta(&before, &counting.hooks().snapshot());
    let e1 = fleet.wait_converged(5, limit).await?;
    if e1 != e0 {
        return Err(format!(
            "the view changed during the steady-state window ({e0} -> {e1})"
        ));
    }
    let per = |n: u64| n as f64 / 5.0 / (elapsed.as_secs_f64() / hb.as_secs_f64());
    let methods = calls
        .iter()
        .map(|(m, n)| format!("{m} {:.2}", per(*n)))
        .collect::<Vec<_>>()
        .join(", ");
    load.push(format!(
        "| {} | {} | {:.2} | {:.2} | {} | {} |",
        backend.name(),
        ms(ttl),
        per(calls.values().sum()),
        per(round_trips(&calls, &caps)),
        methods,
        if caps.native_renew_and_list {
            "native (1 round trip)"
        } else {
            "provided: compare_and_set + list (2)"
        }
    ));

    let mut samples = Samples::default();
    for rep in 0..reps {
        // Join of slot 5.
        let e0 = fleet.wait_converged(5, limit).await?;
        let t0 = Instant::now();
        fleet.join(&format!("x{rep}")).await?;
        samples.add(
            "join (new slot 5)",
            fleet.measure(t0, e0, 6, poll, limit).await?,
        );

        // Graceful leave of slot 5.
        let e0 = fleet.wait_converged(6, limit).await?;
        let i = fleet.index_of_slot(5);
        let (m, _) = fleet.members.remove(i);
        let t0 = Instant::now();
        let leaving = tokio::spawn(m.leave());
        samples.add(
            "graceful leave",
            fleet.measure(t0, e0, 5, poll, limit).await?,
        );
        leaving
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;

        // Join again, then crash it.
        let e0 = fleet.wait_converged(5, limit).await?;
        let t0 = Instant::now();
        fleet.join(&format!("y{rep}")).await?;
        samples.add(
            "join (new slot 5)",
            fleet.measure(t0, e0, 6, poll, limit).await?,
        );
        let e0 = fleet.wait_converged(6, limit).await?;
        let i = fleet.index_of_slot(5);
        let t0 = Instant::now();
        drop(fleet.members.remove(i));
        samples.add(
            "crash (slot 5)",
            fleet.measure(t0, e0, 5, poll, limit).await?,
        );

        // Crash of the lowest slot, the one that publishes a changed view at once.
        let e0 = fleet.wait_converged(5, limit).await?;
        let i = fleet.index_of_slot(0);
        let (m, _) = fleet.members.remove(i);
        let id = m.member().to_owned();
        let t0 = Instant::now();
        drop(m);
        samples.add(
            "crash (lowest slot 0)",
            fleet.measure(t0, e0, 4, poll, limit).await?,
        );
        // The same member id comes back and fills the hole at slot 0.
        let e0 = fleet.wait_converged(4, limit).await?;
        let t0 = Instant::now();
        fleet.join(&id).await?;
        samples.add(
            "join (fills slot 0)",
            fleet.measure(t0, e0, 5, poll, limit).await?,
        );
        eprintln!("{}: repetition {} done", backend.name(), rep + 1);
    }
    let goal = |event: &str| {
        if event.starts_with("crash") {
            ttl + hb
        } else {
            hb
        }
    };
    for (event, (views, actives)) in &samples.0 {
        let (vm, vx) = median_max(views);
        let (am, ax) = median_max(actives);
        let g = goal(event);
        conv.push(format!(
            "| {} | {} | {event} | {} | {} / {} | {} / {} | {} | {:.2} |",
            backend.name(),
            ms(ttl),
            views.len(),
            ms(vm),
            ms(vx),
            ms(am),
            ms(ax),
            ms(g),
            am.as_secs_f64() / g.as_secs_f64(),
        ));
    }
    for (m, _) in fleet.members.drain(..) {
        let _ = m.leave().await;
    }
    Ok(())
}

/// The convergence and load parts on every backend of `--backends`; prints their tables.
pub(crate) async fn run(o: &Opts) {
    let mut conv = Vec::new();
    let mut load = Vec::new();
    for &backend in &o.backends {
        let Some(url) = shared_url(backend, "group").await else {
            continue;
        };
        if let Err(e) = convergence(backend, &url, o.reps, o.ttl, &mut conv, &mut load).await {
            panic!("{}: {e}", backend.name());
        }
    }
    println!(
        "\n### Steady state: store calls per member per heartbeat (5 members, 10 heartbeats)\n"
    );
    println!("| backend | TTL ms | calls | round trips | by method | renew_and_list |");
    println!("|---|---:|---:|---:|---|---|");
    for r in &load {
        println!("{r}");
    }
    println!("\n### Convergence per event (5 members; ms, median / max)\n");
    println!("| backend | TTL ms | event | n | view adopted | all active | goal | active median / goal |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for r in &conv {
        println!("{r}");
    }
}
