//! `headcount demo`: peers join in stages, scale up, one leaves, one crashes, while task ids flow
//! to them; a line of progress per interval and a closing summary.
//!
//! Accounting: task ids go into a queue that every live peer scans; a peer works on the ids it
//! owns ([`Ownership::begin`] gives it a guard) for `--work`, and an id leaves the queue only when
//! that work is done, so until then the other peers still see it (a queue with at-least-once
//! delivery). **duplicates** counts ids processed more than once (by any peers, at any time);
//! **lost** counts ids never processed by the end of the run, which keeps offering them until
//! the queue is empty or a few intervals pass.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use headcount::recipes::interval::{IntervalConfig, IntervalIndexer, IntervalPeer};
use headcount::recipes::Ownership;
use headcount::{redact_url, DynStore, Error};

/// The arguments of `demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Print the closing summary as one JSON object on stdout (progress stays on stderr).
    #[arg(long)]
    pub json: bool,
    /// The interval of the indexer.
    #[arg(long, default_value = "1s", value_parser = crate::util::parse_duration)]
    pub interval: Duration,
    /// How many intervals each stage lasts.
    #[arg(long, default_value_t = 3)]
    pub stage_intervals: u32,
    /// How many task ids are offered per interval.
    #[arg(long, default_value_t = 500)]
    pub tasks_per_interval: u64,
    /// How long working on a batch of tasks takes (a tenth of the interval by default); a task
    /// stays in the queue, visible to every peer, until its work is done.
    #[arg(long, value_parser = crate::util::parse_duration)]
    pub work: Option<Duration>,
    /// Adopt every new pair at once, as in the articles, instead of the safe transition: shows
    /// what the transition prevents.
    #[arg(long)]
    pub no_transition: bool,
}

#[derive(Default)]
struct Book {
    pending: BTreeSet<u64>,
    counts: BTreeMap<u64, u32>,
    offered: u64,
}

type SharedBook = Arc<Mutex<Book>>;

fn lock(book: &SharedBook) -> std::sync::MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(PoisonError::into_inner)
}

struct DemoPeer {
    name: String,
    peer: IntervalPeer,
    worker: tokio::task::JoinHandle<()>,
}

/// Every `every`, takes the queue's ids this peer owns (and is not already working on) and
/// works on them for `work`; an id leaves the queue only when its work is done, so until then
/// every other peer still sees it.
fn spawn_worker(
    own: Ownership,
    book: SharedBook,
    every: Duration,
    work: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let ids: Vec<u64> = lock(&book).pending.iter().copied().collect();
            let batch: Vec<_> = ids.into_iter().filter_map(|id| own.begin(id)).collect();
            if !batch.is_empty() {
                tokio::time::sleep(work).await;
                let mut b = lock(&book);
                for guard in batch {
                    *b.counts.entry(guard.task_id()).or_default() += 1;
                    b.pending.remove(&guard.task_id());
                }
            }
            tokio::time::sleep(every).await;
        }
    })
}

struct Change {
    what: String,
    at: Instant,
    converged: Option<f64>,
}

/// Runs the demo on `url` (or a fresh SQLite file in a temp dir).
pub async fn demo(url: Option<&str>, args: DemoArgs) -> Result<ExitCode, Error> {
    let (url, temp_dir) = match url {
        Some(u) => (u.to_owned(), None),
        None => {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let dir = std::env::temp_dir()
                .join(format!("headcount-demo-{}-{nanos:08x}", std::process::id()));
            std::fs::create_dir_all(&dir)
                .map_err(|e| Error::config(format!("cannot create {}: {e}", dir.display())))?;
            (format!("sqlite://{}/demo.db", dir.display()), Some(dir))
        }
    };
    let store = headcount::connect(&url).await?;
    let result = scenario(store, &url, &args).await;
    if let Some(dir) = temp_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

async fn scenario(store: DynStore, url: &str, args: &DemoArgs) -> Result<ExitCode, Error> {
    let interval = args.interval;
    if args.stage_intervals == 0 {
        return Err(Error::invalid("--stage-intervals must be at least 1"));
    }
    let group = format!(
        "demo-{:06x}",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_micros())
    );
    eprintln!(
        "demo: store {}, group {group}, interval {interval:?}, {} task ids per interval, {}",
        redact_url(url),
        args.tasks_per_interval,
        if args.no_transition {
            "NO transition (the articles' behaviour)"
        } else {
            "safe transition"
        }
    );
    let book: SharedBook = Arc::default();
    let config = IntervalConfig::new(group.clone(), interval).with_transition(!args.no_transition);
    let mut peers: Vec<DemoPeer> = Vec::new();
    let started = Instant::now();
    let mut changes: Vec<Change> = Vec::new();
    let tick = interval / 10;
    let work = args.work.unwrap_or(interval / 10);
    let per_tick = (args.tasks_per_interval / 10).max(1);
    let stage = args.stage_intervals;
    let mut peak = 0;

    // (stage start in intervals, action)
    let plan: [(u32, &str); 6] = [
        (0, "start with p1, p2"),
        (stage, "p3 joins"),
        (2 * stage, "p4, p5 join"),
        (3 * stage, "p2 leaves"),
        (4 * stage, "p4 crashes"),
        (5 * stage, "tasks stop; draining"),
    ];
    let mut next_stage = 0;
    let drain_limit = 5 * stage + 6;
    let mut ticks: u64 = 0;
    let mut producing = true;
    loop {
        let elapsed_intervals = ticks as f64 / 10.0;
        // Stage changes.
        while let Some(&(at, what)) = plan.get(next_stage) {
            if elapsed_intervals + 1e-9 < f64::from(at) {
                break;
            }
            match next_stage {
                0 => {
                    for name in ["p1", "p2"] {
                        peers.push(join(&store, &config, name, &book, tick, work).await?);
                    }
                }
                1 => peers.push(join(&store, &config, "p3", &book, tick, work).await?),
                2 => {
                    for name in ["p4", "p5"] {
                        peers.push(join(&store, &config, name, &book, tick, work).await?);
                    }
                }
                3 => {
                    if let Some(i) = peers.iter().position(|p| p.name == "p2") {
                        let p = peers.remove(i);
                        p.worker.abort();
                        p.peer.stop().await?;
                    }
                }
                4 => {
                    if let Some(i) = peers.iter().position(|p| p.name == "p4") {
                        // A crash: the process is gone, nothing acknowledged or deleted.
                        let p = peers.remove(i);
                        p.worker.abort();
                        drop(p.peer);
                    }
                }
                _ => producing = false,
            }
            peak = peak.max(peers.len());
            eprintln!("demo: [{:5.1} intervals] {what}", elapsed_intervals);
            if next_stage < 5 {
                changes.push(Change {
                    what: what.to_owned(),
                    at: Instant::now(),
                    converged: None,
                });
            }
            next_stage += 1;
        }
        if producing {
            let mut b = lock(&book);
            for _ in 0..per_tick {
                let id = b.offered;
                b.pending.insert(id);
                b.offered += 1;
            }
        }
        // Convergence: the live peers' active pairs partition the tasks.
        if let Some(change) = changes.last_mut() {
            if change.converged.is_none() && partitioned(&peers) {
                change.converged = Some(change.at.elapsed().as_secs_f64() / interval.as_secs_f64());
            }
        }
        if ticks.is_multiple_of(10) {
            eprintln!("{}", progress(elapsed_intervals, &peers, &book));
        }
        let pending_empty = lock(&book).pending.is_empty();
        if !producing && (pending_empty || elapsed_intervals >= f64::from(drain_limit)) {
            break;
        }
        ticks += 1;
        let due = started + tick * u32::try_from(ticks).unwrap_or(u32::MAX);
        tokio::time::sleep_until(due.into()).await;
    }
    for p in peers {
        p.worker.abort();
        p.peer.stop().await?;
    }
    let b = lock(&book);
    let processed = b.counts.len() as u64;
    let duplicates = b.counts.values().filter(|&&n| n > 1).count() as u64;
    let lost = b.offered - processed;
    let summary = serde_json::json!({
        "store": redact_url(url),
        "interval_ms": interval.as_millis() as u64,
        "transition": !args.no_transition,
        "peers_max": peak,
        "offered": b.offered,
        "processed": processed,
        "duplicates": duplicates,
        "lost": lost,
        "elapsed_s": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "convergence_intervals": changes.iter().map(|c| serde_json::json!({
            "change": c.what,
            "intervals": c.converged.map(|x| (x * 10.0).round() / 10.0),
        })).collect::<Vec<_>>(),
    });
    if args.json {
        println!("{summary}");
    } else {
        let mut text = String::new();
        let _ = writeln!(text, "summary ({:.1} s)", started.elapsed().as_secs_f64());
        let _ = writeln!(text, "  offered      {}", b.offered);
        let _ = writeln!(text, "  processed    {processed}");
        let _ = writeln!(text, "  duplicates   {duplicates}");
        let _ = writeln!(text, "  lost         {lost}");
        let _ = writeln!(text, "  convergence, in intervals after each change:");
        for c in &changes {
            let when = c
                .converged
                .map_or("did not converge".to_owned(), |x| format!("{x:.1}"));
            let _ = writeln!(text, "    {:<20} {when}", c.what);
        }
        print!("{text}");
    }
    Ok(if duplicates == 0 && lost == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn join(
    store: &DynStore,
    config: &IntervalConfig,
    name: &str,
    book: &SharedBook,
    every: Duration,
    work: Duration,
) -> Result<DemoPeer, Error> {
    let peer = IntervalIndexer::join(store.clone(), config.clone().with_member(name)).await?;
    let worker = spawn_worker(peer.ownership(), book.clone(), every / 2, work);
    Ok(DemoPeer {
        name: name.to_owned(),
        peer,
        worker,
    })
}

fn partitioned(peers: &[DemoPeer]) -> bool {
    let n = peers.len() as u64;
    let pairs: Vec<_> = peers.iter().map(|p| p.peer.pair()).collect();
    let indices: BTreeSet<u64> = pairs.iter().flatten().map(|p| p.index).collect();
    pairs.iter().all(|p| p.is_some_and(|p| p.replicas == n)) && indices == (1..=n).collect()
}

fn progress(at: f64, peers: &[DemoPeer], book: &SharedBook) -> String {
    let mut line = format!("demo: [{at:5.1} intervals]");
    for p in peers {
        let st = p.peer.status();
        let pair = st
            .pair
            .map_or("-/-".to_owned(), |p| format!("{}/{}", p.index, p.replicas));
        let _ = write!(line, " {} {pair} {:<8}", p.name, st.phase.as_str());
    }
    let b = lock(book);
    let dup = b.counts.values().filter(|&&n| n > 1).count();
    let _ = write!(
        line,
        " | offered {} processed {} pending {} duplicates {dup}",
        b.offered,
        b.counts.len(),
        b.pending.len()
    );
    line
}
