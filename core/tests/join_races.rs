//! A join that lost the race for a free slot to another joiner leaves the view to the lowest
//! slot: the table it read lacks the other's claim, so a view it published at once would name
//! one new member of two, and a second view would follow at once for the other.
// Tests fail by panicking.
#![allow(clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use headcount_core::backend::Backend;
use headcount_core::memory::MemoryStore;
use headcount_core::recipes::group::{Group, GroupConfig, Member};
use headcount_core::{Capabilities, DynStore, Result, Store};
use tokio::sync::{oneshot, watch};

const TTL: Duration = Duration::from_secs(2);
const SLOT_1: &str = "hc:{g}:slot:1";

fn config(id: &str) -> GroupConfig {
    GroupConfig::new("g", TTL).with_member(id)
}

/// One member's way to the shared in-memory store.
///
/// * `gate`: the member's writes of a view wait until it is opened (another joiner, claimed but
///   not yet published);
/// * `rival`: before the member's first claim of slot 1 goes through, the other joiner joins
///   through its own wrapper and claims slot 1 first (the member loses that race);
/// * `tell`: told once the member's own claim of slot 1 is written (the rival's);
/// * `views`: the writes of a view (whole, header or snapshot) the member attempted.
#[derive(Debug)]
struct Race {
    inner: Arc<MemoryStore>,
    gate: Option<watch::Receiver<bool>>,
    rival: std::sync::Mutex<Option<oneshot::Sender<()>>>,
    claimed: std::sync::Mutex<Option<oneshot::Receiver<()>>>,
    tell: std::sync::Mutex<Option<oneshot::Sender<()>>>,
    views: AtomicU64,
}

impl Race {
    fn new(inner: Arc<MemoryStore>) -> Race {
        Race {
            inner,
            gate: None,
            rival: std::sync::Mutex::new(None),
            claimed: std::sync::Mutex::new(None),
            tell: std::sync::Mutex::new(None),
            views: AtomicU64::new(0),
        }
    }
}

#[async_trait]
impl Backend for Race {
    fn capabilities(&self) -> Capabilities {
        Capabilities::new("race")
    }
    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        Store::incr(&*self.inner, key, ttl).await
    }
    async fn get(&self, key: &str) -> Result<Option<String>> {
        Store::get(&*self.inner, key).await
    }
    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        Store::expire(&*self.inner, key, ttl).await
    }
    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        if key.starts_with("hc:{g}:view:current") || key.starts_with("hc:{g}:base:") {
            self.views.fetch_add(1, Ordering::SeqCst);
            if let Some(gate) = &self.gate {
                let mut gate = gate.clone();
                gate.wait_for(|&open| open).await.expect("the gate is kept");
            }
        }
        if key == SLOT_1 && expected.is_none() {
            // This member's claim of slot 1: the rival claims it first.
            let start = self.rival.lock().expect("lock").take();
            let claimed = self.claimed.lock().expect("lock").take();
            if let (Some(start), Some(claimed)) = (start, claimed) {
                start.send(()).expect("the rival waits");
                claimed.await.expect("the rival claims");
            }
        }
        let written = Store::compare_and_set(&*self.inner, key, expected, new, ttl).await?;
        if key == SLOT_1 && written {
            if let Some(tell) = self.tell.lock().expect("lock").take() {
                let _ = tell.send(());
            }
        }
        Ok(written)
    }
    async fn delete(&self, key: &str) -> Result<bool> {
        Store::delete(&*self.inner, key).await
    }
    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        Store::compare_and_delete(&*self.inner, key, expected).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        Store::list(&*self.inner, prefix).await
    }
}

/// Waits (10 s at most) until every member is active under one view of `n` slots.
async fn converged(members: &[&Member], n: u32) -> u64 {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let views: Vec<_> = members.iter().map(|m| m.assignment()).collect();
            if views
                .iter()
                .all(|a| a.replicas == n && a.index.is_some() && a.epoch == views[0].epoch)
            {
                return views[0].epoch;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("converged")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_that_lost_a_race_leaves_the_view_to_the_lowest_slot() {
    let inner = Arc::new(MemoryStore::new());
    let a = Group::join(inner.clone() as DynStore, config("a"))
        .await
        .expect("a joins");
    converged(&[&a], 1).await;

    // The rival: claims slot 1 when told to, and publishes nothing until the gate opens.
    let (gate, gated) = watch::channel(false);
    let (start_tx, start_rx) = oneshot::channel();
    let (claimed_tx, claimed_rx) = oneshot::channel();
    let rival_store: DynStore = Arc::new(Race {
        gate: Some(gated),
        tell: std::sync::Mutex::new(Some(claimed_tx)),
        ..Race::new(inner.clone())
    });
    let c = tokio::spawn(async move {
        start_rx.await.expect("told to start");
        Group::join(rival_store, config("c")).await
    });

    let race = Arc::new(Race::new(inner.clone()));
    *race.rival.lock().expect("lock") = Some(start_tx);
    *race.claimed.lock().expect("lock") = Some(claimed_rx);
    let b = Group::join(race.clone() as DynStore, config("b"))
        .await
        .expect("b joins");
    // After a lost race a join skips a random number of the lowest free slots.
    assert!(
        b.assignment().slot.is_some_and(|s| s >= 2),
        "b lost slot 1 to c: {:?}",
        b.assignment().slot
    );
    assert_eq!(
        race.views.load(Ordering::SeqCst),
        0,
        "b, which saw another claim win slot 1, published a view of its own table (which lacks that claim)"
    );

    // The rival publishes from here on; the lowest slot publishes for both joins.
    gate.send(true).expect("the rival's store keeps the gate");
    let c = c.await.expect("join task").expect("c joins");
    converged(&[&a, &b, &c], 3).await;
    for m in [a, b, c] {
        m.leave().await.expect("leave");
    }
}
