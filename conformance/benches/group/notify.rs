//! The **notify** part (each backend): members that listen to the store's change notifications
//! against members that only poll, side by side on one store: each event's time until every
//! member is active under a view naming them all, and each mode's steady-state load.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use headcount::recipes::group::GroupPhase;
use headcount::{Capabilities, DynStore};
use headcount_conformance::Decorated;
use headcount_harness::ServerKind;

use crate::common::{behind_proxy, etcd_metrics, fill_store, ms, own_cpu, redis_info, shared_url};
use crate::fleet::{delta, group_name, round_trips, Counting, Fleet, PREFIX};
use crate::Opts;

/// The notify part's two modes, run side by side: members that listen to the store's change
/// notifications (the default) and members that only poll (`with_notifications(false)`).
const MODES: [(&str, bool); 2] = [("notices", true), ("polling", false)];

/// The notify part's events, in the order of its table.
const NOTIFY_EVENTS: [&str; 3] = ["join", "graceful leave", "hand-over to a standby"];

impl Fleet {
    /// Every member is active on one epoch above `e0` whose view names exactly them: as many
    /// live slots as members, each member's slot among them.
    fn named_after(&self, e0: u64) -> bool {
        let n = self.members.len();
        let Some((_, first)) = self.members.first() else {
            return false;
        };
        let epoch = first.borrow().epoch;
        epoch > e0
            && self.members.iter().all(|(_, rx)| {
                let a = rx.borrow();
                a.phase == GroupPhase::Active
                    && a.epoch == epoch
                    && a.live.len() == n
                    && a.slot.is_some_and(|s| a.live.contains(&s))
            })
    }

    /// The times from `t0` until [`Fleet::named_after`] `e0`, looking every millisecond, until
    /// every member had adopted a view above `e0` ([`Fleet::adopted`]), and until the first
    /// member had.
    async fn until_named(
        &self,
        t0: Instant,
        e0: u64,
        limit: Duration,
    ) -> std::result::Result<[Duration; 3], String> {
        let mut adopted = None;
        let mut first = None;
        loop {
            if first.is_none()
                && self.members.iter().any(|(_, rx)| {
                    let a = rx.borrow();
                    a.epoch > e0 || a.phase == GroupPhase::Handoff
                })
            {
                first = Some(t0.elapsed());
            }
            if adopted.is_none() && self.adopted(e0) {
                adopted = Some(t0.elapsed());
            }
            if self.named_after(e0) {
                let named = t0.elapsed();
                return Ok([named, adopted.unwrap_or(named), first.unwrap_or(named)]);
            }
            if t0.elapsed() >= limit {
                return Err(format!(
                    "no view naming all {} members above epoch {e0} within {limit:?}: {}",
                    self.members.len(),
                    self.dump()
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The member holding the middle one of the held slots.
    fn middle(&self) -> usize {
        let mut held: Vec<(u32, usize)> = self
            .members
            .iter()
            .enumerate()
            .filter_map(|(i, (_, rx))| rx.borrow().slot.map(|s| (s, i)))
            .collect();
        held.sort_unstable();
        held[held.len() / 2].1
    }
}

/// What one event of the notify part took: until every member was active under a view naming
/// them all, until every member had adopted it, the store calls made meanwhile (by every member
/// of both groups) and this process's CPU time.
#[derive(Clone, Copy)]
struct Took {
    named: Duration,
    adopted: Duration,
    /// Until the first member adopted it.
    first: Duration,
    calls: u64,
    cpu: f64,
    /// Bytes from the server through the proxy (both groups).
    bytes: u64,
}

/// What an event is measured by, and from where it is measured.
#[derive(Clone, Copy)]
struct Meters<'a> {
    counting: &'a Counting,
    proxy: Option<&'a headcount_harness::Proxy>,
}

/// Starts measuring an event at `t0`.
struct EventStart {
    t0: Instant,
    calls: BTreeMap<&'static str, u64>,
    cpu: f64,
    bytes: u64,
}

impl EventStart {
    fn now(meters: Meters<'_>) -> EventStart {
        EventStart {
            calls: meters.counting.snapshot(),
            cpu: own_cpu(),
            bytes: meters.proxy.map_or(0, |p| p.bytes().1),
            t0: Instant::now(),
        }
    }

    async fn until_named(
        self,
        fleet: &Fleet,
        meters: Meters<'_>,
        e0: u64,
        limit: Duration,
    ) -> std::result::Result<Took, String> {
        let [named, adopted, first] = fleet.until_named(self.t0, e0, limit).await?;
        Ok(Took {
            named,
            adopted,
            first,
            calls: delta(&self.calls, &meters.counting.snapshot())
                .values()
                .sum(),
            cpu: own_cpu() - self.cpu,
            bytes: meters.proxy.map_or(0, |p| p.bytes().1) - self.bytes,
        })
    }
}

/// One repetition of the notify part's events on a converged fleet of `n` members, which it leaves
/// with `n` members: a join, a graceful leave of the member in the middle, and a hand-over of
/// the middle member's slot to a standby.
async fn notify_events(
    fleet: &mut Fleet,
    meters: Meters<'_>,
    n: usize,
    rep: usize,
    limit: Duration,
    samples: &mut BTreeMap<&'static str, Vec<Took>>,
) -> std::result::Result<(), String> {
    let n32 = n as u32;
    // A join: a new member, from the join call.
    let e0 = fleet.wait_converged(n32, limit).await?;
    let start = EventStart::now(meters);
    fleet.join(&format!("j{rep}")).await?;
    let took = start.until_named(fleet, meters, e0, limit).await?;
    samples.entry(NOTIFY_EVENTS[0]).or_default().push(took);

    // A graceful leave of the member in the middle, from the leave call.
    let e0 = fleet.wait_converged(n32 + 1, limit).await?;
    let (m, _) = fleet.members.remove(fleet.middle());
    let start = EventStart::now(meters);
    let leaving = tokio::spawn(m.leave());
    let took = start.until_named(fleet, meters, e0, limit).await?;
    samples.entry(NOTIFY_EVENTS[1]).or_default().push(took);
    leaving
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("leave: {e}"))?;

    // A view change replacing a member: a standby (a new member id) stands by, ready; the
    // member in the middle leaves gracefully and hands it its slot. From the leave call until
    // every member, the standby included, is active under one view naming them all.
    let e0 = fleet.wait_converged(n32, limit).await?;
    let id = format!("s{rep}");
    let cfg = fleet.config(&id).with_standby(limit);
    fleet.join_with(&id, cfg).await?;
    let standby = &fleet.members.last().expect("just joined").0;
    tokio::time::timeout(limit, standby.wait_ready())
        .await
        .map_err(|_| format!("standby {id} not ready within {limit:?}"))?
        .map_err(|e| format!("standby {id}: {e}"))?;
    let phase = standby.assignment().phase;
    if phase != GroupPhase::Standby {
        return Err(format!("{id} is {} instead of standing by", phase.as_str()));
    }
    let (m, _) = fleet.members.remove(fleet.middle());
    let start = EventStart::now(meters);
    let leaving = tokio::spawn(m.leave());
    let took = start.until_named(fleet, meters, e0, limit).await?;
    samples.entry(NOTIFY_EVENTS[2]).or_default().push(took);
    leaving
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("leave before a hand-over: {e}"))?;
    Ok(())
}

/// What the notify part reads of a server around a steady-state window: the bytes through the
/// counting proxy, Redis's commands, etcd's requests.
struct ServerProbe {
    proxy: Option<headcount_harness::Proxy>,
    redis: Option<redis::aio::MultiplexedConnection>,
    etcd_port: Option<u16>,
}

#[derive(Default)]
struct ServerReading {
    bytes: Option<(u64, u64)>,
    redis: Option<(BTreeMap<String, u64>, u64)>,
    etcd: BTreeMap<String, f64>,
}

impl ServerProbe {
    async fn read(&mut self) -> ServerReading {
        let redis = match &mut self.redis {
            Some(conn) => {
                let (calls, _, total) = redis_info(conn).await;
                Some((calls, total))
            }
            None => None,
        };
        ServerReading {
            bytes: self.proxy.as_ref().map(|p| p.bytes()),
            redis,
            etcd: match self.etcd_port {
                Some(port) => etcd_metrics(port).await,
                None => BTreeMap::new(),
            },
        }
    }
}

/// Steady-state load of one mode, per member per heartbeat.
struct Load {
    calls: f64,
    round_trips: f64,
    /// Bytes to and from the server.
    bytes: Option<(f64, f64)>,
    /// Redis commands processed, or etcd gRPC messages received.
    requests: Option<f64>,
    detail: String,
}

/// The steady-state load of `fleet` (alone on its store) over `beats` heartbeats.
#[allow(clippy::too_many_arguments)]
async fn steady_load(
    fleet: &Fleet,
    counting: &Decorated<Counting>,
    caps: &Capabilities,
    probe: &mut ServerProbe,
    hb: Duration,
    beats: u32,
    limit: Duration,
) -> std::result::Result<Load, String> {
    let n = fleet.members.len() as u32;
    let e0 = fleet.wait_converged(n, limit).await?;
    let s0 = probe.read().await;
    let before = counting.hooks().snapshot();
    let t = Instant::now();
    tokio::time::sleep(hb * beats).await;
    let secs = t.elapsed().as_secs_f64();
    let calls = delta(&before, &counting.hooks().snapshot());
    let s1 = probe.read().await;
    let e1 = fleet.wait_converged(n, limit).await?;
    if e1 != e0 {
        return Err(format!(
            "the view changed during the steady-state window ({e0} -> {e1})"
        ));
    }
    let per = |x: f64| x / f64::from(n) / (secs / hb.as_secs_f64());
    let bytes = match (s0.bytes, s1.bytes) {
        (Some((t0, f0)), Some((t1, f1))) => Some((per((t1 - t0) as f64), per((f1 - f0) as f64))),
        _ => None,
    };
    let mut server: Vec<String> = Vec::new();
    let requests = match (&s0.redis, &s1.redis) {
        (Some((c0, tot0)), Some((c1, tot1))) => {
            for (c, v) in c1 {
                let d = v - c0.get(c).copied().unwrap_or(0);
                if d > 0 && c != "evalsha usec" {
                    server.push(format!("{c} {:.2}", per(d as f64)));
                }
            }
            // The PEXPIREs beyond a renewal's one per script call refresh version keys, in a
            // window placed by a hash of the member's key (the group name is random): take
            // them out, so the two modes compare what they do rather than where their windows
            // fall; the detail lists them.
            let d = |c: &str| c1.get(c).copied().unwrap_or(0) - c0.get(c).copied().unwrap_or(0);
            let refresh = d("pexpire").saturating_sub(d("evalsha"));
            Some(per((tot1 - tot0 - refresh) as f64))
        }
        _ if !s1.etcd.is_empty() => {
            let mut received = 0.0;
            for (k, v) in &s1.etcd {
                let d = v - s0.etcd.get(k).copied().unwrap_or(0.0);
                if d > 0.0 {
                    server.push(format!("{k} {:.2}", per(d)));
                    if !k.contains(' ') && k != "puts" {
                        received += d;
                    }
                }
            }
            Some(per(received))
        }
        _ => None,
    };
    let methods = calls
        .iter()
        .map(|(m, c)| format!("{m} {:.2}", per(*c as f64)))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(Load {
        calls: per(calls.values().sum::<u64>() as f64),
        round_trips: per(round_trips(&calls, caps) as f64),
        bytes,
        requests,
        detail: if server.is_empty() {
            format!("store calls: {methods}")
        } else {
            format!("store calls: {methods}; server: {}", server.join(", "))
        },
    })
}

/// The sorted samples' median and tail: the 99th percentile with 100 samples or more, else the
/// maximum (named so).
fn median_tail(v: &[Duration]) -> (Duration, Duration, &'static str) {
    let mut s = v.to_vec();
    s.sort();
    let median = s[s.len() / 2];
    if s.len() >= 100 {
        let i = (s.len() * 99).div_ceil(100) - 1;
        (median, s[i], "p99")
    } else {
        (median, s[s.len() - 1], "max")
    }
}

fn change(polling: f64, notices: f64) -> String {
    if polling == 0.0 {
        return "-".to_owned();
    }
    format!("{:+.1}%", (notices / polling - 1.0) * 100.0)
}

/// One group of `n` members per mode on the store at `url`, both alive on their own store
/// handles: the steady-state load of each alone, and `reps` repetitions of the events,
/// alternating the modes. Appends Markdown rows.
#[allow(clippy::too_many_arguments)]
async fn notify(
    backend: ServerKind,
    url: &str,
    n: usize,
    ttl: Option<Duration>,
    reps: usize,
    conv: &mut Vec<String>,
    load: &mut Vec<String>,
    detail: &mut Vec<String>,
) -> std::result::Result<(), String> {
    // A counting proxy in front of a server, as in the stores part.
    let (proxy, url, upstream) = behind_proxy(url).await?;
    let redis = match backend {
        ServerKind::Redis => Some(
            redis::Client::open(url.as_str())
                .map_err(|e| e.to_string())?
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?,
        ),
        _ => None,
    };
    let mut probe = ServerProbe {
        proxy,
        redis,
        etcd_port: if backend == ServerKind::Etcd {
            upstream
        } else {
            None
        },
    };

    // One store handle per mode (one subscription for the members that listen).
    let mut counting = Vec::new();
    let mut fleets = Vec::new();
    let mut caps = None;
    let mut limit = Duration::ZERO;
    let mut hb = Duration::ZERO;
    for (_, notices) in MODES {
        let inner = headcount::connect(&url).await.map_err(|e| e.to_string())?;
        let c = inner.capabilities();
        let ttl = ttl.unwrap_or(Duration::from_secs(6)).max(c.min_ttl);
        hb = ttl / 3;
        limit = ttl * 6 + Duration::from_secs(10);
        caps = Some(c);
        let wrapped = Counting::new(inner);
        let store: DynStore = wrapped.clone();
        counting.push(wrapped);
        fleets.push(Fleet {
            store,
            group: group_name(),
            ttl,
            full_reads: false,
            two_calls: false,
            notices,
            partitions: None,
            whole_views: false,
            own_views: false,
            members: Vec::new(),
        });
    }
    let caps = caps.expect("two modes");
    let ttl = fleets[0].ttl;
    let ids: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
    let beats = 5;
    let mut loads: [Option<Load>; 2] = [None, None];

    // Polling first, alone on the store: start, converge, four heartbeats, then its load.
    let t = Instant::now();
    fleets[1].join_batches(&ids, 50).await?;
    fleets[1].wait_converged(n as u32, limit).await?;
    eprintln!(
        "notify {} {n}: polling group active after {:.1} s",
        backend.name(),
        t.elapsed().as_secs_f64()
    );
    tokio::time::sleep(hb * 4).await;
    loads[1] = Some(
        steady_load(
            &fleets[1],
            &counting[1],
            &caps,
            &mut probe,
            hb,
            beats,
            limit,
        )
        .await?,
    );

    // Then the group that listens, beside it.
    let t = Instant::now();
    fleets[0].join_batches(&ids, 50).await?;
    fleets[0].wait_converged(n as u32, limit).await?;
    eprintln!(
        "notify {} {n}: listening group active after {:.1} s",
        backend.name(),
        t.elapsed().as_secs_f64()
    );
    let view_key = format!("{PREFIX}:{{{}}}:view:current", fleets[0].group);
    let view_len = fleets[0]
        .store
        .get(&view_key)
        .await
        .map_err(|e| e.to_string())?
        .map_or(0, |v| v.len());
    detail.push(format!(
        "{} {n}: view record {view_len} bytes",
        backend.name()
    ));
    tokio::time::sleep(hb * 2).await;

    let mut samples: [BTreeMap<&'static str, Vec<Took>>; 2] = Default::default();
    let t = Instant::now();
    for rep in 0..reps {
        let order = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
        for mode in order {
            let meters = Meters {
                counting: counting[mode].hooks(),
                proxy: probe.proxy.as_ref(),
            };
            notify_events(&mut fleets[mode], meters, n, rep, limit, &mut samples[mode])
                .await
                .map_err(|e| format!("{} repetition {}: {e}", MODES[mode].0, rep + 1))?;
        }
        eprintln!(
            "notify {} {n}: repetition {} done after {:.1} s",
            backend.name(),
            rep + 1,
            t.elapsed().as_secs_f64()
        );
    }

    // The listening group's load, alone again, as long after its last change as the polling
    // group's was.
    fleets[1].leave_all().await;
    tokio::time::sleep(hb * 4).await;
    loads[0] = Some(
        steady_load(
            &fleets[0],
            &counting[0],
            &caps,
            &mut probe,
            hb,
            beats,
            limit,
        )
        .await?,
    );
    fleets[0].leave_all().await;

    for event in NOTIFY_EVENTS {
        let named = |mode: usize| -> Vec<Duration> {
            samples[mode][event].iter().map(|t| t.named).collect()
        };
        let on = median_tail(&named(0));
        let off = median_tail(&named(1));
        let met = on.0 < Duration::from_millis(100) && on.1 < Duration::from_millis(250);
        conv.push(format!(
            "| {} | {n} | {} | {event} | {} | {} / {} {} | {} / {} {} | {:.1} | {} |",
            backend.name(),
            ms(ttl),
            samples[0][event].len(),
            ms(on.0),
            ms(on.1),
            on.2,
            ms(off.0),
            ms(off.1),
            off.2,
            off.0.as_secs_f64() / on.0.as_secs_f64().max(1e-6),
            if met { "yes" } else { "**no**" },
        ));
        for (mode, name) in [(0, "notices"), (1, "polling")] {
            let v = &samples[mode][event];
            let mut calls: Vec<u64> = v.iter().map(|t| t.calls).collect();
            calls.sort_unstable();
            let mut cpu: Vec<f64> = v.iter().map(|t| t.cpu).collect();
            cpu.sort_by(f64::total_cmp);
            let mut bytes: Vec<u64> = v.iter().map(|t| t.bytes).collect();
            bytes.sort_unstable();
            detail.push(format!(
                "{} {n} {event}, {name}: all active {:?} ms; all adopted the view {:?} ms; the first adopted it {:?} ms; median {} store calls, {} bytes from the server and {:.0} ms of this process's CPU per event",
                backend.name(),
                v.iter().map(|t| t.named.as_millis()).collect::<Vec<_>>(),
                v.iter().map(|t| t.adopted.as_millis()).collect::<Vec<_>>(),
                v.iter().map(|t| t.first.as_millis()).collect::<Vec<_>>(),
                calls[calls.len() / 2],
                bytes[bytes.len() / 2],
                cpu[cpu.len() / 2] * 1000.0,
            ));
        }
    }
    let [Some(on), Some(off)] = loads else {
        unreachable!("both loads measured")
    };
    let both = |f: &dyn Fn(&Load) -> Option<f64>| match (f(&off), f(&on)) {
        (Some(a), Some(b)) => format!("{a:.2} / {b:.2} | {}", change(a, b)),
        _ => "- | -".to_owned(),
    };
    load.push(format!(
        "| {} | {n} | {} | {} | {} | {} | {} |",
        backend.name(),
        ms(ttl),
        both(&|l| Some(l.calls)),
        both(&|l| Some(l.round_trips)),
        both(&|l| l.requests),
        both(&|l| l.bytes.map(|(to, from)| to + from)),
    ));
    for (mode, l) in [("polling", &off), ("notices", &on)] {
        detail.push(format!(
            "{} {n} steady state, {mode}: {}{}",
            backend.name(),
            l.detail,
            l.bytes
                .map(|(to, from)| format!("; bytes to / from the server {to:.0} / {from:.0}"))
                .unwrap_or_default()
        ));
    }
    Ok(())
}

/// The notify part on every backend of `--backends` and size of `--sizes`; prints its tables.
pub(crate) async fn run(o: &Opts) {
    let started = Instant::now();
    let (mut conv, mut load, mut detail) = (Vec::new(), Vec::new(), Vec::new());
    for &backend in &o.backends {
        let Some(url) = shared_url(backend, "group").await else {
            continue;
        };
        let unrelated = o.unrelated.min(100_000);
        if let Err(e) = fill_store(&url, unrelated).await {
            panic!("{}: filling: {e}", backend.name());
        }
        for &n in &o.sizes {
            let reps = o.notify_reps.unwrap_or(10);
            eprintln!(
                "notify: {n} members on {}, {reps} repetitions",
                backend.name()
            );
            let t = Instant::now();
            if let Err(e) = notify(
                backend,
                &url,
                n,
                o.ttl,
                reps,
                &mut conv,
                &mut load,
                &mut detail,
            )
            .await
            {
                eprintln!("notify {} {n}: FAILED: {e}", backend.name());
                conv.push(format!("| {} | {n} | failed: {e} |", backend.name()));
            }
            detail.push(format!(
                "{} {n}: {:.0} s",
                backend.name(),
                t.elapsed().as_secs_f64()
            ));
        }
    }
    println!("\n### Convergence with and without change notifications (ms from the call until every member is active under one view naming all)\n");
    println!("| backend | members | TTL ms | event | reps | notices: median / tail | polling: median / tail | polling ÷ notices (medians) | goal (< 100 median, < 250 p99) |");
    println!("|---|---:|---:|---|---:|---:|---:|---:|---|");
    for r in &conv {
        println!("{r}");
    }
    println!("\n### Steady-state load per member per heartbeat, polling / notices (each group alone on its store)\n");
    println!("| backend | members | TTL ms | store calls | change | round trips | change | server requests (Redis commands without version-key refreshes, etcd gRPC messages) | change | bytes to + from the server | change |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &load {
        println!("{r}");
    }
    println!();
    for d in &detail {
        println!("- {d}");
    }
    println!("- whole part: {:.0} s", started.elapsed().as_secs_f64());
}
