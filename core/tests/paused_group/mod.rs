//! What the paused-time group tests share: a group `g` on one in-memory store and one manual
//! clock, and the waits and reads they check with.

// Test support: each test file uses what it needs of it, and fails by panicking.
#![allow(dead_code, clippy::expect_used, clippy::panic, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use headcount_core::memory::MemoryStore;
use headcount_core::recipes::group::{Group, GroupConfig, GroupPhase, Member, SlotRecord};
use headcount_core::sim::SimClock;
use headcount_core::{Clock, DynStore};

/// The lease TTL of every member.
pub const TTL: Duration = Duration::from_millis(900);
/// The keys [`owners`] looks at: `k0` to `k63`.
pub const KEYS: usize = 64;

pub struct Fixture {
    pub clock: Arc<dyn Clock>,
    pub memory: Arc<MemoryStore>,
    pub store: DynStore,
}

impl Fixture {
    pub fn new() -> Fixture {
        let clock: Arc<dyn Clock> = Arc::new(SimClock::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        ));
        let memory = Arc::new(MemoryStore::with_clock(clock.clone()));
        let store: DynStore = memory.clone();
        Fixture {
            clock,
            memory,
            store,
        }
    }

    /// Member `id` of group `g` with lease [`TTL`], on the fixture's clock.
    pub fn config(&self, id: &str) -> GroupConfig {
        GroupConfig::new("g", TTL)
            .with_member(id)
            .with_clock(self.clock.clone())
    }

    pub async fn join(&self, config: GroupConfig) -> Member {
        Group::join(self.store.clone(), config)
            .await
            .expect("joins")
    }

    /// The record at slot `slot`, if any.
    pub async fn slot_record(&self, slot: u32) -> Option<SlotRecord> {
        let text = self
            .store
            .get(&format!("hc:{{g}}:slot:{slot}"))
            .await
            .unwrap();
        text.as_deref()
            .map(|t| SlotRecord::parse(t).expect("a slot record"))
    }
}

/// Waits (in paused time) until every member is active under one epoch naming them all.
pub async fn converged(members: &[&Member]) -> u64 {
    for _ in 0..2000 {
        let a: Vec<_> = members.iter().map(|m| m.assignment()).collect();
        let epoch = a[0].epoch;
        if a.iter().all(|x| {
            x.phase == GroupPhase::Active && x.epoch == epoch && x.live.len() == members.len()
        }) {
            return epoch;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "never converged: {:?}",
        members.iter().map(|m| m.assignment()).collect::<Vec<_>>()
    );
}

/// Which of `members` would grant each of the [`KEYS`] keys now.
pub fn owners(members: &[&Member]) -> Vec<Vec<usize>> {
    (0..KEYS)
        .map(|k| {
            let key = format!("k{k}");
            (0..members.len())
                .filter(|&i| members[i].would_grant(&key).is_some())
                .collect()
        })
        .collect()
}
