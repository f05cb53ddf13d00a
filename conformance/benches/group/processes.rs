//! The **processes** part (Redis): `headcount run` processes in one group on a Redis of the
//! bench's own: the time until all are active, the server's load in the steady state, and the
//! convergence after a `kill -9` of one.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::{ms, redis_info, rss_of};
use crate::fleet::group_name;
use crate::{fill_redis, own_redis, Opts};

/// What one `headcount run` process printed last, and when.
#[derive(Default, Clone)]
struct Printed {
    phase: String,
    index: Option<u64>,
    replicas: u64,
    epoch: u64,
}

/// Kills (SIGKILL) the processes left on drop, so a failed run leaves none behind.
struct Procs(Vec<std::process::Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The CPU time (user and system, seconds) and the resident memory (bytes) of the processes
/// `pids`, from `/proc/<pid>/stat` and `/proc/<pid>/status`; zeros where there is no `/proc`.
#[allow(unsafe_code)]
fn cpu_and_rss(pids: &[u32]) -> (f64, u64) {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut cpu = 0.0;
    let mut rss = 0;
    for pid in pids {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // The fields after the command's closing parenthesis: utime and stime are the
            // 12th and 13th of them (the 14th and 15th of the line).
            let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            let f: Vec<&str> = after.split_whitespace().collect();
            let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            cpu += (t(11) + t(12)) / ticks;
        }
        rss += rss_of(&pid.to_string());
    }
    (cpu, rss)
}

/// How many of `printed` are in each phase, and the highest epoch, as text for a progress line.
fn phases(printed: &[Printed]) -> String {
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for p in printed {
        let phase = if p.phase.is_empty() {
            "silent"
        } else {
            &p.phase
        };
        *by.entry(phase).or_default() += 1;
    }
    let top = printed.iter().map(|p| p.epoch).max().unwrap_or(0);
    format!("{by:?}, highest epoch {top}")
}

/// Waits until every process in `alive` printed `active` with `replicas = n` on one epoch above
/// `above`, with distinct indexes; returns that epoch.
async fn all_active(
    rx: &std::sync::mpsc::Receiver<(usize, Printed)>,
    last: &mut [Printed],
    alive: &[usize],
    n: u64,
    above: u64,
    limit: Instant,
) -> std::result::Result<u64, String> {
    let mut report = Instant::now() + Duration::from_secs(10);
    loop {
        while let Ok((i, p)) = rx.try_recv() {
            last[i] = p;
        }
        if Instant::now() > report {
            eprintln!("processes: waiting for all active; {}", phases(last));
            report += Duration::from_secs(10);
        }
        let epoch = last[alive[0]].epoch;
        let mut indexes: Vec<u64> = alive.iter().filter_map(|&i| last[i].index).collect();
        indexes.sort_unstable();
        indexes.dedup();
        let done = epoch > above
            && indexes.len() == alive.len()
            && alive.iter().all(|&i| {
                let p = &last[i];
                p.phase == "active" && p.replicas == n && p.epoch == epoch
            });
        if done {
            return Ok(epoch);
        }
        if Instant::now() > limit {
            let active = alive.iter().filter(|&&i| last[i].phase == "active").count();
            let behind: Vec<String> = alive
                .iter()
                .filter(|&&i| {
                    let p = &last[i];
                    p.phase != "active" || p.replicas != n || p.epoch != epoch
                })
                .take(5)
                .map(|&i| {
                    let p = &last[i];
                    format!(
                        "process {i}: {} epoch {} replicas {} index {:?}",
                        p.phase, p.epoch, p.replicas, p.index
                    )
                })
                .collect();
            return Err(format!(
                "{active} of {} active, not all with replicas {n} on one epoch above {above} (epoch of the first: {epoch}; behind: {})",
                alive.len(),
                behind.join("; ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `n` `headcount run` processes on the Redis at `url`, started `rate` a second (all at once
/// when `rate` is 0); returns a Markdown row.
async fn processes(
    bin: &std::path::Path,
    url: &str,
    n: usize,
    rate: f64,
    ttl: Duration,
    unrelated: u64,
) -> std::result::Result<String, String> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    if !bin.exists() {
        return Err(format!(
            "no headcount binary at {} (cargo build --release -p headcount-cli, or --headcount PATH)",
            bin.display()
        ));
    }
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let group = group_name();
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Printed)>();
    let mut procs = Procs(Vec::new());
    let logs = std::env::var_os("HEADCOUNT_BENCH_LOGS").map(std::path::PathBuf::from);
    let level = std::env::var("HEADCOUNT_BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into());
    let first = Instant::now();
    let mut seen = vec![Printed::default(); n];
    for i in 0..n {
        if rate > 0.0 {
            // Paced from the first start, so that a slow spawn does not slow the rate.
            let due = first + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
            if i > 0 && i % (rate.ceil() as usize).max(1) == 0 {
                while let Ok((j, p)) = rx.try_recv() {
                    seen[j] = p;
                }
                eprintln!(
                    "processes: {i} started after {:.1} s; {}",
                    first.elapsed().as_secs_f64(),
                    phases(&seen[..i])
                );
            }
        }
        let mut child = Command::new(bin)
            .args([
                "run",
                "--store",
                url,
                "--group",
                &group,
                "--member",
                &format!("m{i}"),
            ])
            .arg("--ttl")
            .arg(format!("{}ms", ttl.as_millis()))
            .env("RUST_LOG", &level)
            .stdout(Stdio::piped())
            .stderr(match &logs {
                // Each process's warnings to a file of its own, to see why a run stalls.
                Some(dir) => std::fs::File::create(dir.join(format!("m{i}.log")))
                    .map_err(|e| format!("{}: {e}", dir.display()))?
                    .into(),
                None => Stdio::null(),
            })
            .spawn()
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        let out = child.stdout.take().expect("stdout");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                let p = Printed {
                    phase: v["phase"].as_str().unwrap_or_default().to_owned(),
                    index: v["index"].as_u64(),
                    replicas: v["replicas"].as_u64().unwrap_or(0),
                    epoch: v["epoch"].as_u64().unwrap_or(0),
                };
                if tx.send((i, p)).is_err() {
                    break;
                }
            }
        });
        procs.0.push(child);
    }
    let started = Instant::now();
    let limit = ttl * 20 + Duration::from_secs(60);
    let mut last = seen;
    let mut alive: Vec<usize> = (0..n).collect();
    let e0 = all_active(&rx, &mut last, &alive, n as u64, 0, started + limit).await?;
    let active_after = started.elapsed();

    // Steady state over 5 heartbeats, after five more (as in the scale part: a member that does
    // not watch the slot table looks at it one heartbeat in four, and its first look after the
    // joins reads it).
    let hb = ttl / 3;
    tokio::time::sleep(hb * 5).await;
    let pids: Vec<u32> = procs.0.iter().map(std::process::Child::id).collect();
    let (rc0, cpu0, tot0) = redis_info(&mut conn).await;
    let (client0, _) = cpu_and_rss(&pids);
    let t = Instant::now();
    tokio::time::sleep(hb * 5).await;
    let secs = t.elapsed().as_secs_f64();
    let (client1, rss) = cpu_and_rss(&pids);
    let (rc1, cpu1, tot1) = redis_info(&mut conn).await;
    let script_calls =
        rc1.get("evalsha").copied().unwrap_or(0) - rc0.get("evalsha").copied().unwrap_or(0);
    let script_usec = (rc1.get("evalsha usec").copied().unwrap_or(0)
        - rc0.get("evalsha usec").copied().unwrap_or(0)) as f64
        / script_calls.max(1) as f64;
    let per_member_hb = (tot1 - tot0) as f64 / n as f64 / (secs / hb.as_secs_f64());
    let commands: BTreeMap<&String, u64> = rc1
        .iter()
        .map(|(c, v)| (c, v - rc0.get(c).copied().unwrap_or(0)))
        .filter(|(_, d)| *d > 0)
        .collect();
    eprintln!("processes {n}: server commands over {secs:.1} s: {commands:?}");

    // kill -9 of a middle process.
    let victim = n / 2;
    let killed = Instant::now();
    procs.0[victim].kill().map_err(|e| e.to_string())?;
    alive.retain(|&i| i != victim);
    let e1 = all_active(&rx, &mut last, &alive, n as u64 - 1, e0, killed + limit).await?;
    let converged = killed.elapsed();
    let starts = starts(rate);
    Ok(format!(
        "| {n} | {starts} | {unrelated} | {} | {:.1} s (epoch {e0}) | {:.0} | {per_member_hb:.2} | {script_usec:.1} | {:.0}% | {:.2} ms | {:.1} MB | {:.1} s (epoch {e1}) | {:.1} s |",
        ms(ttl),
        active_after.as_secs_f64(),
        (tot1 - tot0) as f64 / secs,
        (cpu1 - cpu0) / secs * 100.0,
        (client1 - client0) / secs / n as f64 * 1000.0,
        rss as f64 / n as f64 / 1e6,
        converged.as_secs_f64(),
        (ttl + hb * 2).as_secs_f64(),
    ))
}

/// How the processes were started, for the table.
fn starts(rate: f64) -> String {
    if rate > 0.0 {
        format!("{rate} a second")
    } else {
        "at once".to_owned()
    }
}

/// The processes part; prints its table.
pub(crate) async fn run(o: &Opts) {
    let Some(server) = own_redis("processes") else {
        return;
    };
    let url = server.url();
    fill_redis(&url, o.unrelated).await;
    eprintln!(
        "processes: {} `headcount run`, {} unrelated keys",
        o.processes, o.unrelated
    );
    let row = match processes(
        &o.headcount,
        &url,
        o.processes,
        o.start_rate,
        o.scale_ttl,
        o.unrelated,
    )
    .await
    {
        Ok(row) => row,
        Err(e) => {
            eprintln!("processes: FAILED: {e}");
            format!(
                "| {} | {} | {} | failed: {e} |",
                o.processes,
                starts(o.start_rate),
                o.unrelated
            )
        }
    };
    println!("\n### `headcount run` processes in one group on one local Redis\n");
    println!("| processes | started | unrelated keys | TTL ms | all active after the last start | server commands/s | per member per heartbeat | server µs per script call | Redis CPU | CPU per process per second (steady) | resident memory per process | kill -9 of one: all others active on a newer view | goal (TTL + 2 heartbeats) |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!("{row}");
}
