//! The interval indexer of the "Distributed Peer Indexing" articles: every interval each peer
//! draws an index with one round trip, and processes the tasks `task_id mod replicas + 1 ==
//! index` (idle when its index is above the replica count). Pairs change safely: a peer stops
//! taking new tasks, drains, and resumes under its new pair when every peer acknowledged.
//!
//! Run it in two or three terminals on one store; the first pair arrives one to two intervals
//! after start:
//!
//! ```sh
//! cargo run --example interval_indexer -- sqlite://interval.db
//! cargo run --features redis --example interval_indexer -- redis://127.0.0.1:6379
//! ```
//!
//! A second argument stops it after that many seconds (`memory://` runs it alone in-process).

use std::time::Duration;

use headcount::recipes::interval::{IntervalConfig, IntervalIndexer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sqlite://interval.db".into());
    let seconds: Option<u64> = std::env::args().nth(2).map(|s| s.parse()).transpose()?;
    let store = headcount::connect(&url).await?;
    let peer = IntervalIndexer::join(
        store,
        IntervalConfig::new("indexers", Duration::from_secs(1)),
    )
    .await?;
    eprintln!("joined as {} (skew {:?})", peer.member(), peer.skew());

    let stop = async {
        match seconds {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut last = None;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {}
        }
        let Some(pair) = peer.pair() else { continue };
        if last == Some((pair.index, pair.replicas)) {
            continue;
        }
        last = Some((pair.index, pair.replicas));
        // The tasks of this interval: hold a guard while working on one, so a pair change
        // waits for it before the peer acknowledges.
        let mine: Vec<u64> = (0..12)
            .filter_map(|task| peer.begin(task).map(|guard| guard.task_id()))
            .collect();
        println!(
            "index {} of {} (epoch {}): tasks {mine:?}",
            pair.index, pair.replicas, pair.epoch
        );
    }
    peer.leave().await?;
    Ok(())
}
