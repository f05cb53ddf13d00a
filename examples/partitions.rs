//! Consuming N partitions: every instance joins a group that declares the partitions `0` to
//! `N-1`, each instance works on its share (within one partition of every other's, and moved as
//! little as that allows, with the `sticky` assignor), stops a partition cleanly when a hand-off takes it away, and writes
//! through a fence so a deposed owner's late write is refused.
//!
//! The shape of a real consumer: a worker per owned partition, started when the member gains the
//! partition ([`Member::changes`]) and stopped when [`Grant::revoked`] fires, which happens before
//! the member acknowledges the hand-off: the worker checkpoints and drops its grant, and only
//! then does the new owner start the partition. [`Member::revocations`] names the partitions
//! about to go, for a log line or a metric.
//!
//! Run it in two or three terminals on one store and watch the partitions split, then stop one
//! (Ctrl-C or SIGTERM) and watch its partitions move:
//!
//! ```sh
//! cargo run --example partitions -- sqlite://partitions.db
//! cargo run --features redis --example partitions -- redis://127.0.0.1:6379
//! ```
//!
//! A second argument gives the member id: then Ctrl-C leaves *for a restart*, and the same id
//! started again within the restart window gets its partitions back with none moved. A third
//! stops it after that many seconds (`memory://` runs it alone in-process).
//!
//! **The sink.** Each worker commits its partition's offset with the grant's fencing token. By
//! default the sink is an in-process [`MemoryFence`], which only stands for a real one; with
//! `PARTITIONS_SINK=postgres://user:pass@host/db` (and `--features postgres`) the offsets go to
//! a PostgreSQL table, `partition_offsets`, each write fenced by a `headcount::PgFence` in the same
//! statement, so the instances can run on different machines and a deposed owner's late commit
//! is refused by the database itself:
//!
//! ```sh
//! PARTITIONS_SINK=postgres://user:pass@127.0.0.1:5432/db \
//!   cargo run --features postgres --example partitions -- postgres://user:pass@127.0.0.1:5432/db
//! ```
//!
//! **Metrics.** headcount records through the `metrics` facade (version 0.24); this example
//! installs `metrics-exporter-prometheus` 0.18 as the recorder, with headcount's histogram
//! buckets, and prints the member's `headcount_group_keys_owned` gauge after every change. A
//! service serves `handle.render()` at its `/metrics` instead (docs/observability.md).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use headcount::fence::{FencingToken, MemoryFence};
use headcount::metrics::{DURATION_BUCKETS, GROUP_KEYS_OWNED, NAME_PREFIX};
use headcount::recipes::group::{Grant, Group, GroupConfig, Member};
use headcount::recipes::DEFAULT_GROUP_TTL;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::task::JoinHandle;

const PARTITIONS: u32 = 16;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sqlite://partitions.db".into());
    let id = std::env::args().nth(2).filter(|s| !s.is_empty());
    let seconds: Option<u64> = std::env::args().nth(3).map(|s| s.parse()).transpose()?;
    // The recorder first, so that everything headcount records lands in it. Without the
    // buckets, the exporter would turn headcount's histograms into summaries.
    let metrics = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Prefix(NAME_PREFIX.into()), DURATION_BUCKETS)?
        .install_recorder()?;
    headcount::metrics::describe();
    let sink = Arc::new(Sink::open(std::env::var("PARTITIONS_SINK").ok().as_deref()).await?);
    let store = headcount::connect(&url).await?;
    let mut config = GroupConfig::new("consumers", DEFAULT_GROUP_TTL).with_partitions(PARTITIONS);
    if let Some(id) = &id {
        config = config
            .with_member(id.clone())
            .with_restart_window(Duration::from_secs(30));
    }
    let member = Group::join(store, config).await?;
    let partitions: Vec<String> = (0..PARTITIONS).map(|p| p.to_string()).collect();

    let mut changes = member.changes();
    let mut revocations = member.revocations();
    let ready = member.wait_ready().await?;
    println!(
        "{} ready: index {:?} of {}",
        member.member(),
        ready.index,
        ready.replicas
    );
    let mut workers: BTreeMap<String, JoinHandle<()>> = BTreeMap::new();
    start_owned(&member, &partitions, &sink, &mut workers);
    println!(
        "epoch {}: owns {} of {PARTITIONS} partitions",
        ready.epoch,
        workers.len()
    );
    print_gauge(&metrics);

    // SIGTERM (what Kubernetes and systemd send) or Ctrl-C: stop cleanly.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = async {
        match seconds {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            },
        }
    };
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Ok(change) = revocations.recv() => {
                let lost = change.lost(&partitions);
                if !lost.is_empty() {
                    println!("about to lose partitions {lost:?} (epoch {})", change.epoch());
                }
            }
            Ok(change) = changes.recv() => {
                // The lost partitions' workers stopped themselves; start the gained ones.
                workers.retain(|_, w| !w.is_finished());
                start_owned(&member, &partitions, &sink, &mut workers);
                println!(
                    "epoch {}: owns {} of {PARTITIONS} partitions",
                    change.epoch(),
                    workers.len()
                );
                print_gauge(&metrics);
            }
        }
    }
    // Leaving revokes every grant: the workers checkpoint and drop theirs, then the member goes.
    let leaving = if id.is_some() {
        tokio::spawn(member.clone().leave_for_restart())
    } else {
        tokio::spawn(member.clone().leave())
    };
    for (_, w) in workers {
        let _ = w.await;
    }
    leaving.await??;
    println!("left");
    print_gauge(&metrics);
    Ok(())
}

/// Prints the member's keys-owned gauge as Prometheus would scrape it.
fn print_gauge(metrics: &PrometheusHandle) {
    for line in metrics.render().lines() {
        if line.starts_with(GROUP_KEYS_OWNED) {
            println!("metrics: {line}");
        }
    }
}

/// Where the partitions' offsets are committed, behind a fence: per partition, a commit whose
/// token is older than the newest one seen is refused. A partition's next owner resumes from
/// the offset committed last.
enum Sink {
    /// In process: stands for a real sink when every instance runs in one process.
    Memory {
        fence: MemoryFence,
        offsets: Mutex<HashMap<String, u64>>,
    },
    /// A PostgreSQL table, each commit fenced in the same statement.
    #[cfg(feature = "postgres")]
    Postgres {
        pool: headcount::postgres::deadpool_postgres::Pool,
        fence: headcount::PgFence,
    },
}

impl Sink {
    /// The sink at `url` (a `postgres://` URL), or the in-process fence without one.
    async fn open(url: Option<&str>) -> Result<Sink, Box<dyn std::error::Error>> {
        let Some(url) = url.filter(|u| !u.is_empty()) else {
            return Ok(Sink::Memory {
                fence: MemoryFence::new(),
                offsets: Mutex::default(),
            });
        };
        #[cfg(feature = "postgres")]
        {
            use headcount::postgres::deadpool_postgres::{Manager, Pool};
            use headcount::postgres::tokio_postgres::{Config, NoTls};

            // The application's own pool (TLS, sizes and the like are its business).
            let config: Config = url.parse()?;
            let pool = Pool::builder(Manager::new(config, NoTls))
                .max_size(4)
                .build()?;
            let fence = headcount::PgFence::new("partition_offsets_fence")?;
            let client = pool.get().await?;
            fence.ensure_table(&**client).await?;
            client
                .batch_execute(
                    "CREATE TABLE IF NOT EXISTS partition_offsets \
                     (partition text PRIMARY KEY, committed bigint NOT NULL, token bigint NOT NULL)",
                )
                .await?;
            drop(client);
            Ok(Sink::Postgres { pool, fence })
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = url;
            Err("PARTITIONS_SINK needs the example built with --features postgres".into())
        }
    }

    /// The offset committed last for `partition` (0 when none was).
    async fn committed(
        &self,
        partition: &str,
    ) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
        match self {
            Sink::Memory { offsets, .. } => Ok(offsets
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(partition)
                .copied()
                .unwrap_or(0)),
            #[cfg(feature = "postgres")]
            Sink::Postgres { pool, .. } => {
                let row = pool
                    .get()
                    .await?
                    .query_opt(
                        "SELECT committed FROM partition_offsets WHERE partition = $1",
                        &[&partition],
                    )
                    .await?;
                Ok(match row {
                    Some(row) => u64::try_from(row.try_get::<_, i64>(0)?)?,
                    None => 0,
                })
            }
        }
    }

    /// Commits `offset` for `partition` with the grant's `token`; `false` when the fence refused
    /// it (a newer owner committed).
    async fn commit(
        &self,
        partition: &str,
        token: FencingToken,
        offset: u64,
    ) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
        match self {
            Sink::Memory { fence, offsets } => Ok(fence
                .admit_with(partition, token, || {
                    offsets
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(partition.to_owned(), offset)
                })
                .is_some()),
            #[cfg(feature = "postgres")]
            Sink::Postgres { pool, fence } => {
                let client = pool.get().await?;
                // The write reads FROM hc_fence: it writes nothing when the fence refuses.
                let outcome = fence
                    .execute_fenced(
                        &**client,
                        "INSERT INTO partition_offsets (partition, committed, token) \
                         SELECT $3, $4, token FROM hc_fence \
                         ON CONFLICT (partition) DO UPDATE \
                         SET committed = EXCLUDED.committed, token = EXCLUDED.token",
                        partition,
                        token,
                        &[&partition, &i64::try_from(offset)?],
                    )
                    .await?;
                Ok(outcome.admitted)
            }
        }
    }
}

/// Starts a worker for every partition the member owns that has none.
fn start_owned(
    member: &Member,
    partitions: &[String],
    sink: &Arc<Sink>,
    workers: &mut BTreeMap<String, JoinHandle<()>>,
) {
    for p in partitions {
        if workers.contains_key(p) {
            continue;
        }
        if let Some(grant) = member.owns(p) {
            let sink = sink.clone();
            let name = p.clone();
            workers.insert(
                p.clone(),
                tokio::spawn(async move { consume(name, grant, &sink).await }),
            );
        }
    }
}

/// Works on one partition while its grant lasts, committing its offset now and then, and
/// checkpoints (commits the last offset) when the grant is revoked, before letting it go.
async fn consume(partition: String, grant: Grant, sink: &Sink) {
    let mut offset = match sink.committed(&partition).await {
        Ok(offset) => offset,
        Err(e) => {
            // A real service retries; dropping the grant leaves the partition to the next change.
            eprintln!("partition {partition}: cannot read its committed offset: {e}");
            return;
        }
    };
    let mut every = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            () = grant.revoked() => break,
            _ = every.tick() => {
                // One "record" consumed; every tenth, the offset is committed.
                offset += 1;
                if offset % 10 == 0 && !commit(sink, &partition, &grant, offset).await {
                    return;
                }
            }
        }
    }
    if grant.lease_lapsed() {
        // The others no longer wait for this grant: stop at once, no checkpoint.
        println!("partition {partition}: lease lapsed at offset {offset}");
    } else if commit(sink, &partition, &grant, offset).await {
        // The hand-off waits for this grant to be dropped, so no new owner committed yet.
        println!("partition {partition}: revoked, checkpointed at offset {offset}");
    }
    drop(grant);
}

/// Commits `offset` with the grant's token; `false` when the worker must stop (a newer owner
/// committed). A failed commit is only reported: the next one covers it.
async fn commit(sink: &Sink, partition: &str, grant: &Grant, offset: u64) -> bool {
    match sink.commit(partition, grant.token(), offset).await {
        Ok(true) => true,
        Ok(false) => {
            println!("partition {partition}: a newer owner committed, stopping");
            false
        }
        Err(e) => {
            eprintln!("partition {partition}: commit of offset {offset} failed: {e}");
            true
        }
    }
}

/// The service's own test, with the test kit: three members on the in-memory store and a manual
/// clock, in milliseconds of real time.
#[cfg(test)]
mod tests {
    use headcount::testkit::TestGroup;

    use super::PARTITIONS;

    #[tokio::test]
    async fn shares_stay_within_one_partition_through_a_crash() {
        let mut group = TestGroup::builder("consumers")
            .members(3)
            .configure(|c| c.with_partitions(PARTITIONS))
            .start()
            .await
            .unwrap();
        let partitions: Vec<String> = (0..PARTITIONS).map(|p| p.to_string()).collect();
        let shares = |g: &TestGroup| {
            let mut counts = vec![0; g.len()];
            for p in &partitions {
                counts[g.owner_of(p).expect("every partition has an owner")] += 1;
            }
            counts
        };
        let mut counts = shares(&group);
        counts.sort_unstable();
        assert_eq!(counts, [5, 5, 6]);
        // A crash: once its lease ran out (on the kit's clock), the two others split its share.
        group.crash(0);
        group.converged().await.unwrap();
        group.assert_exclusive(&partitions);
        assert_eq!(shares(&group), [0, 8, 8]);
    }
}
