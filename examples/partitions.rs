//! Consuming N partitions: every instance joins a group that declares the partitions `0` to
//! `N-1`, each instance works on its share (within one partition of every other's, with the
//! `balanced` assignor), stops a partition cleanly when a hand-off takes it away, and writes
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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use headcount::fence::Fence;
use headcount::recipes::group::{Grant, Group, GroupConfig, Member};
use headcount::recipes::DEFAULT_GROUP_TTL;
use tokio::task::JoinHandle;

const PARTITIONS: u32 = 16;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sqlite://partitions.db".into());
    let id = std::env::args().nth(2).filter(|s| !s.is_empty());
    let seconds: Option<u64> = std::env::args().nth(3).map(|s| s.parse()).transpose()?;
    let store = headcount::connect(&url).await?;
    let mut config = GroupConfig::new("consumers", DEFAULT_GROUP_TTL).with_partitions(PARTITIONS);
    if let Some(id) = &id {
        config = config
            .with_member(id.clone())
            .with_restart_window(Duration::from_secs(30));
    }
    let member = Group::join(store, config).await?;
    let partitions: Vec<String> = (0..PARTITIONS).map(|p| p.to_string()).collect();
    // Stands for the sink of the partitions' output (a PostgreSQL PgFence or a RedisFence across
    // processes): per partition, it refuses a write whose token is older than the newest it saw.
    let sink = Arc::new(Fence::new());

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
    Ok(())
}

/// Starts a worker for every partition the member owns that has none.
fn start_owned(
    member: &Member,
    partitions: &[String],
    sink: &Arc<Fence>,
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

/// Works on one partition while its grant lasts, then checkpoints and lets the grant go.
async fn consume(partition: String, grant: Grant, sink: &Fence) {
    let mut offset = 0u64;
    let mut every = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            () = grant.revoked() => break,
            _ = every.tick() => {
                // One "record": written through the fence with the grant's token.
                if !sink.admit(&partition, grant.token()) {
                    println!("partition {partition}: a newer owner wrote, stopping");
                    return;
                }
                offset += 1;
            }
        }
    }
    if grant.lease_lapsed() {
        // The others no longer wait for this grant: stop at once, no checkpoint.
        println!("partition {partition}: lease lapsed at offset {offset}");
    } else {
        println!("partition {partition}: revoked, checkpointed at offset {offset}");
    }
    drop(grant);
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
