//! `headcount demo`: the same staged scenario under group membership (the default mode) and
//! under the articles' interval indexer, side by side: three peers join, the group scales to
//! five, one leaves gracefully, one crashes, one is paused longer than its lease and resumes,
//! while task ids flow into an in-process fenced sink.
//!
//! Accounting: task ids go into a queue that every live peer scans. A worker takes the ids its
//! peer owns (a group [`Grant`](headcount::recipes::group::Grant) or an interval
//! [`TaskGuard`](headcount::recipes::interval::TaskGuard), whose epoch is the fencing token),
//! advances the [`MemoryFence`](headcount::fence::MemoryFence) for each id with that token before reading
//! whether it is still to do, works for `--work`, and writes it to the sink through the fence.
//! **fenced rejections** counts writes the fence refused (an older token than one already seen
//! for that id); **duplicates** counts ids the sink accepted more than once; **lost** counts ids
//! never accepted by the end of the run, which keeps offering them until the queue is empty or a
//! few stages pass.
//!
//! A pause is in-process: the peer's store calls wait (a [`pause::PausableStore`]) and its worker
//! stops where it is, holding its grants, so its lease passes on its own clock; on resume the
//! worker sends its late writes without re-checking its grants, and the fence must refuse them.
//!
//! **Convergence** of a change: the time from the stage's action until every live, unpaused peer
//! works under one assignment that reflects exactly them. **Movement**: of a sample of task ids,
//! the fraction whose owner differs between the converged assignments before and after the
//! change, divided by the optimum `|Δn| / max(n_before, n_after)`.

mod pause;
mod peer;

use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use headcount::{redact_url, DynStore, Error};

use crate::exit::{emit, CliError};
use serde_json::{json, Value};

use peer::{converged, Mode, Peer, Recipe, Sink};

/// Which recipes `demo` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoMode {
    /// Group mode, then interval mode, then both side by side.
    Both,
    /// Group membership only (stable slots, store-minted epochs).
    Group,
    /// The articles' interval indexer only.
    Interval,
}

/// The arguments of `demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Print the closing summary as one JSON object on stdout (progress stays on stderr).
    #[arg(long)]
    pub json: bool,
    /// Which mode to run: both (group first, then interval, then a side-by-side table), group, or
    /// interval.
    #[arg(long, value_enum, default_value_t = DemoMode::Both)]
    pub mode: DemoMode,
    /// The interval of the interval indexer; also the unit of a stage's length.
    #[arg(long, default_value = "1s", value_parser = crate::util::parse_duration)]
    pub interval: Duration,
    /// The lease TTL of group mode (renewed every TTL/3); a stage must last longer than it.
    #[arg(long, default_value = "1s", value_parser = crate::util::parse_duration)]
    pub ttl: Duration,
    /// How many intervals each stage lasts.
    #[arg(long, default_value_t = 3)]
    pub stage_intervals: u32,
    /// How many task ids are offered per interval.
    #[arg(long, default_value_t = 500)]
    pub tasks_per_interval: u64,
    /// How long working on a batch of tasks takes (a tenth of the interval by default); a task
    /// stays in the queue, visible to every peer, until the sink accepted it.
    #[arg(long, value_parser = crate::util::parse_duration)]
    pub work: Option<Duration>,
    /// Interval mode adopts every new pair at once, as in the articles, instead of the safe
    /// transition: shows what the transition prevents.
    #[arg(long)]
    pub no_transition: bool,
    /// How many task ids the movement figures are measured on.
    #[arg(long, default_value_t = 10_000)]
    pub movement_sample: u64,
}

/// The staged scenario: what happens, and how many live, unpaused peers it leaves.
#[derive(Debug, Clone, Copy)]
enum Action {
    Join(&'static [&'static str]),
    Leave(&'static str),
    Crash(&'static str),
    Pause(&'static str),
    Resume(&'static str),
}

const PLAN: [(&str, Action, usize); 6] = [
    ("p1, p2, p3 join", Action::Join(&["p1", "p2", "p3"]), 3),
    ("p4, p5 join", Action::Join(&["p4", "p5"]), 5),
    ("p2 leaves", Action::Leave("p2"), 4),
    ("p4 crashes", Action::Crash("p4"), 3),
    ("p5 paused past its TTL", Action::Pause("p5"), 2),
    ("p5 resumes", Action::Resume("p5"), 3),
];

/// One change as measured.
struct Measured {
    what: &'static str,
    expected: usize,
    convergence: Option<Duration>,
    moved: Option<f64>,
    optimum: Option<f64>,
}

impl Measured {
    fn ratio(&self) -> Option<f64> {
        match (self.moved, self.optimum) {
            (Some(m), Some(o)) if o > 0.0 => Some(m / o),
            _ => None,
        }
    }

    fn json(&self) -> Value {
        json!({
            "change": self.what,
            "live": self.expected,
            "convergence_s": self.convergence.map(|d| round(d.as_secs_f64(), 2)),
            "moved_fraction": self.moved.map(|x| round(x, 4)),
            "optimum_fraction": self.optimum.map(|x| round(x, 4)),
            "movement_ratio": self.ratio().map(|x| round(x, 2)),
        })
    }
}

/// What one mode's run measured.
struct Outcome {
    mode: Mode,
    offered: u64,
    processed: u64,
    duplicates: u64,
    lost: u64,
    fenced_rejections: u64,
    pause_hit_work: bool,
    elapsed: Duration,
    changes: Vec<Measured>,
}

impl Outcome {
    fn json(&self) -> Value {
        json!({
            "offered": self.offered,
            "processed": self.processed,
            "duplicates": self.duplicates,
            "lost": self.lost,
            "fenced_rejections": self.fenced_rejections,
            "pause_hit_work": self.pause_hit_work,
            "elapsed_s": round(self.elapsed.as_secs_f64(), 1),
            "changes": self.changes.iter().map(Measured::json).collect::<Vec<_>>(),
        })
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Runs the demo on `url` (or a fresh SQLite file in a temp dir).
pub async fn demo(url: Option<&str>, args: DemoArgs) -> Result<ExitCode, CliError> {
    use headcount::recipes::group::{MAX_LEASE_TTL, MIN_LEASE_TTL};
    // Everything the scenario would refuse is refused here, before the banner.
    if !(MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&args.ttl) {
        return Err(Error::invalid(format!(
            "--ttl {:?} is outside {MIN_LEASE_TTL:?}..={MAX_LEASE_TTL:?}",
            args.ttl
        ))
        .into());
    }
    if args
        .work
        .is_some_and(|w| w > args.interval * args.stage_intervals.max(1))
    {
        return Err(Error::invalid("--work must be shorter than a stage").into());
    }
    if args.stage_intervals == 0 {
        return Err(Error::invalid("--stage-intervals must be at least 1").into());
    }
    if args.interval.is_zero() {
        return Err(Error::invalid("--interval must be above zero").into());
    }
    let stage = args.interval * args.stage_intervals;
    if stage <= args.ttl {
        return Err(Error::invalid(format!(
            "a stage ({stage:?}: --interval times --stage-intervals) must last longer than --ttl \
             ({:?}), or the paused peer would resume before its lease passed",
            args.ttl
        ))
        .into());
    }
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
    let result = run_modes(&url, &args).await;
    if let Some(dir) = temp_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

async fn run_modes(url: &str, args: &DemoArgs) -> Result<ExitCode, CliError> {
    let store = headcount::connect(url).await?;
    let modes: &[Mode] = match args.mode {
        DemoMode::Both => &[Mode::Group, Mode::Interval],
        DemoMode::Group => &[Mode::Group],
        DemoMode::Interval => &[Mode::Interval],
    };
    let mut outcomes = Vec::new();
    for &mode in modes {
        outcomes.push(scenario(store.clone(), url, args, mode).await?);
    }
    let ok = outcomes.iter().all(|o| o.duplicates == 0 && o.lost == 0);
    if args.json {
        let sum = |f: fn(&Outcome) -> u64| outcomes.iter().map(f).sum::<u64>();
        let mut summary = json!({
            "store": redact_url(url),
            "interval_ms": args.interval.as_millis() as u64,
            "ttl_ms": args.ttl.as_millis() as u64,
            "transition": !args.no_transition,
            "modes": outcomes.iter().map(|o| o.mode.as_str()).collect::<Vec<_>>(),
            "offered": sum(|o| o.offered),
            "processed": sum(|o| o.processed),
            "duplicates": sum(|o| o.duplicates),
            "lost": sum(|o| o.lost),
            "fenced_rejections": sum(|o| o.fenced_rejections),
        });
        for o in &outcomes {
            summary[o.mode.as_str()] = o.json();
        }
        emit(summary)?;
    } else {
        crate::exit::emit_raw(table(&outcomes).as_bytes())?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The closing summary: one column per mode.
fn table(outcomes: &[Outcome]) -> String {
    let mut t = String::new();
    let _ = write!(t, "{:<32}", "summary");
    for o in outcomes {
        let _ = write!(t, " {:>18}", o.mode.as_str());
    }
    t.push('\n');
    type Row = (&'static str, fn(&Outcome) -> String);
    let rows: [Row; 7] = [
        ("elapsed", |o| format!("{:.1} s", o.elapsed.as_secs_f64())),
        ("offered", |o| o.offered.to_string()),
        ("processed", |o| o.processed.to_string()),
        ("duplicates", |o| o.duplicates.to_string()),
        ("lost", |o| o.lost.to_string()),
        ("fenced rejections", |o| o.fenced_rejections.to_string()),
        ("pause hit work in flight", |o| {
            if o.pause_hit_work { "yes" } else { "no" }.to_owned()
        }),
    ];
    for (name, f) in rows {
        let _ = write!(t, "  {name:<30}");
        for o in outcomes {
            let _ = write!(t, " {:>18}", f(o));
        }
        t.push('\n');
    }
    let _ = writeln!(t, "  convergence (s) / movement vs optimum, per change:");
    for (i, (what, _, _)) in PLAN.iter().enumerate() {
        let _ = write!(t, "    {what:<28}");
        for o in outcomes {
            let cell = o.changes.get(i).map_or("-".to_owned(), |c| {
                let conv = c
                    .convergence
                    .map_or("never".to_owned(), |d| format!("{:.2}", d.as_secs_f64()));
                let ratio = c.ratio().map_or("-".to_owned(), |r| format!("{r:.2}x"));
                format!("{conv} / {ratio}")
            });
            let _ = write!(t, " {cell:>18}");
        }
        t.push('\n');
    }
    t
}

async fn scenario(
    store: DynStore,
    url: &str,
    args: &DemoArgs,
    mode: Mode,
) -> Result<Outcome, Error> {
    let interval = args.interval;
    let group = format!(
        "demo-{}-{:06x}",
        mode.as_str(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_micros())
    );
    let tick = interval / 10;
    let recipe = Recipe {
        mode,
        group: group.clone(),
        interval,
        ttl: args.ttl,
        transition: !args.no_transition,
        every: tick / 2,
        work: args.work.unwrap_or(interval / 10),
    };
    eprintln!(
        "demo: {} mode: store {}, group {group}, {}, {} task ids per interval of {interval:?}",
        mode.as_str(),
        redact_url(url),
        match mode {
            Mode::Group => format!("lease TTL {:?}", args.ttl),
            Mode::Interval if args.no_transition =>
                "NO transition (the articles' behaviour)".to_owned(),
            Mode::Interval => "safe transition".to_owned(),
        },
        args.tasks_per_interval,
    );
    let sink: Arc<Sink> = Arc::default();
    let mut peers: Vec<Peer> = Vec::new();
    let started = Instant::now();
    let stage_ticks = 10 * u64::from(args.stage_intervals);
    let per_tick = (args.tasks_per_interval / 10).max(1);
    let drain_limit = stage_ticks * (PLAN.len() as u64 + 2);
    let mut changes: Vec<Measured> = Vec::new();
    // The owners of the sample under the last converged assignment, by peer name.
    let mut owners: Option<Vec<String>> = None;
    let mut change_at = started;
    let mut ticks: u64 = 0;
    let mut producing = true;
    let mut pause_hit_work = false;
    loop {
        let next = usize::try_from(ticks / stage_ticks).unwrap_or(usize::MAX);
        if ticks.is_multiple_of(stage_ticks) {
            if let Some(&(what, action, expected)) = PLAN.get(next) {
                eprintln!("demo: [{:5.1} s] {what}", started.elapsed().as_secs_f64());
                let before = peers.iter().filter(|p| !p.gate.is_paused()).count();
                apply(action, &mut peers, &recipe, &store, &sink).await?;
                change_at = Instant::now();
                let optimum = (before > 0)
                    .then(|| (expected as f64 - before as f64).abs() / expected.max(before) as f64);
                changes.push(Measured {
                    what,
                    expected,
                    convergence: None,
                    moved: None,
                    optimum,
                });
            } else if next == PLAN.len() {
                eprintln!(
                    "demo: [{:5.1} s] tasks stop; draining",
                    started.elapsed().as_secs_f64()
                );
                producing = false;
            }
        }
        if producing {
            let mut b = sink.book();
            for _ in 0..per_tick {
                let id = b.offered;
                b.pending.insert(id);
                b.offered += 1;
            }
        }
        if let Some(change) = changes.last_mut().filter(|c| c.convergence.is_none()) {
            let live: Vec<&Peer> = peers.iter().filter(|p| !p.gate.is_paused()).collect();
            if live.len() == change.expected {
                if let Some(now) = converged(&live, args.movement_sample) {
                    change.convergence = Some(change_at.elapsed());
                    let now: Vec<String> = now.iter().map(|&i| live[i].name.clone()).collect();
                    if let Some(before) = &owners {
                        let moved = before.iter().zip(&now).filter(|(a, b)| a != b).count();
                        change.moved = Some(moved as f64 / now.len().max(1) as f64);
                    }
                    eprintln!(
                        "demo: [{:5.1} s]   converged {:.2} s after \"{}\"{}",
                        started.elapsed().as_secs_f64(),
                        change_at.elapsed().as_secs_f64(),
                        change.what,
                        change.ratio().map_or(String::new(), |r| format!(
                            ", moved {:.1}% of keys, {r:.2}x the optimum",
                            change.moved.unwrap_or(0.0) * 100.0
                        )),
                    );
                    owners = Some(now);
                }
            }
        }
        if peers.iter().any(|p| p.gate.froze_holding()) {
            pause_hit_work = true;
        }
        if ticks.is_multiple_of(10) {
            eprintln!("{}", progress(started, &peers, &sink));
        }
        let pending_empty = sink.book().pending.is_empty();
        if !producing && (pending_empty || ticks >= drain_limit) {
            break;
        }
        ticks += 1;
        let due = started + tick * u32::try_from(ticks).unwrap_or(u32::MAX);
        tokio::time::sleep_until(due.into()).await;
    }
    let elapsed = started.elapsed();
    for p in peers {
        p.gate.resume();
        p.leave().await?;
    }
    let b = sink.book();
    let processed = b.counts.len() as u64;
    Ok(Outcome {
        mode,
        offered: b.offered,
        processed,
        duplicates: b.counts.values().filter(|&&n| n > 1).count() as u64,
        lost: b.offered - processed,
        fenced_rejections: b.fenced_rejections,
        pause_hit_work,
        elapsed,
        changes,
    })
}

async fn apply(
    action: Action,
    peers: &mut Vec<Peer>,
    recipe: &Recipe,
    store: &DynStore,
    sink: &Arc<Sink>,
) -> Result<(), Error> {
    let take = |peers: &mut Vec<Peer>, name: &str| {
        peers
            .iter()
            .position(|p| p.name == name)
            .map(|i| peers.remove(i))
    };
    match action {
        Action::Join(names) => {
            for name in names {
                peers.push(recipe.join(store, name, sink).await?);
            }
        }
        Action::Leave(name) => {
            if let Some(p) = take(peers, name) {
                p.leave().await?;
            }
        }
        Action::Crash(name) => {
            if let Some(p) = take(peers, name) {
                p.crash().await;
            }
        }
        Action::Pause(name) | Action::Resume(name) => {
            if let Some(p) = peers.iter().find(|p| p.name == name) {
                if matches!(action, Action::Pause(_)) {
                    p.gate.request_pause();
                } else {
                    p.gate.resume();
                }
            }
        }
    }
    Ok(())
}

fn progress(started: Instant, peers: &[Peer], sink: &Sink) -> String {
    let mut line = format!("demo: [{:5.1} s]", started.elapsed().as_secs_f64());
    for p in peers {
        let _ = write!(line, " {} {:<18}", p.name, p.describe());
    }
    let b = sink.book();
    let dup = b.counts.values().filter(|&&n| n > 1).count();
    let _ = write!(
        line,
        "| offered {} accepted {} pending {} duplicates {dup} fenced {}",
        b.offered,
        b.counts.len(),
        b.pending.len(),
        b.fenced_rejections
    );
    line
}
