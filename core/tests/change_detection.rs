//! A group over a store whose change detection misses changes: a member must not be misled for
//! good. Each test runs on a single-threaded runtime with paused time, so it is deterministic.
//!
//! [`MissedChanges`] stands in for a backend whose bookkeeping lost a change (a Redis key index
//! or version bump lost, a restored etcd that repeats a revision): while a directory is frozen,
//! a call that names a version the caller holds is answered "unchanged", whatever changed. A
//! call that names no version gets the real listing. The member's defence is to forget the
//! version it holds whenever what it sees contradicts it (a write refused, a renewal refused),
//! so it reads the directory itself.
// Tests fail by panicking.
#![allow(clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use headcount_core::backend::Backend;
use headcount_core::memory::MemoryStore;
use headcount_core::recipes::group::{Group, GroupConfig, GroupPhase, Member};
use headcount_core::sim::SimClock;
use headcount_core::store::{Capabilities, Durability, RenewedListing};
use headcount_core::{Clock, DynStore, Result};

const TTL: Duration = Duration::from_millis(300);

/// A store over `inner` whose frozen directories answer "unchanged" to any version a caller
/// names.
#[derive(Debug, Clone)]
struct MissedChanges {
    inner: DynStore,
    frozen: Arc<Mutex<HashSet<String>>>,
}

impl MissedChanges {
    fn new(inner: DynStore) -> Self {
        MissedChanges {
            inner,
            frozen: Arc::default(),
        }
    }

    fn freeze(&self, dir: &str) {
        self.frozen.lock().expect("lock").insert(dir.to_owned());
    }

    fn frozen(&self, dir: &str) -> bool {
        self.frozen.lock().expect("lock").contains(dir)
    }
}

#[async_trait]
impl Backend for MissedChanges {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        self.inner.incr(key, ttl).await
    }
    async fn get(&self, key: &str) -> Result<Option<String>> {
        self.inner.get(key).await
    }
    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        self.inner.expire(key, ttl).await
    }
    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        self.inner.compare_and_set(key, expected, new, ttl).await
    }
    async fn delete(&self, key: &str) -> Result<bool> {
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        self.inner.list(prefix).await
    }
    async fn list_with_ttl(&self, prefix: &str) -> Result<Vec<(String, String, Option<Duration>)>> {
        self.inner.list_with_ttl(prefix).await
    }
    async fn renew_and_list_if_changed(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dir: &str,
        since: Option<&str>,
    ) -> Result<RenewedListing> {
        let answer = self
            .inner
            .renew_and_list_if_changed(key, holder, ttl, dir, since)
            .await?;
        match since {
            Some(held) if self.frozen(dir) => {
                Ok(RenewedListing::new(answer.renewed, held.to_owned(), None))
            }
            _ => Ok(answer),
        }
    }
    async fn renew_and_versions(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[(&str, Option<&str>)],
    ) -> Result<(bool, Vec<String>)> {
        let (renewed, mut versions) = self
            .inner
            .renew_and_versions(key, holder, ttl, dirs)
            .await?;
        for ((dir, since), version) in dirs.iter().zip(versions.iter_mut()) {
            if let Some(held) = since.filter(|_| self.frozen(dir)) {
                *version = held.to_owned();
            }
        }
        Ok((renewed, versions))
    }
    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool> {
        self.inner.compare_and_delete(key, expected).await
    }
    async fn durability(&self) -> Result<Durability> {
        self.inner.durability().await
    }
    async fn subscribe(&self, dir: &str) -> Result<headcount_core::notify::Notifications> {
        self.inner.subscribe(dir).await
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime")
}

/// Waits (in virtual time) until `m` is active under an epoch of at least `epoch`, at most
/// `within`; returns how long it took, or `None`.
async fn active_within(m: &Member, epoch: u64, within: Duration) -> Option<Duration> {
    let start = tokio::time::Instant::now();
    while start.elapsed() < within {
        let a = m.assignment();
        if a.phase == GroupPhase::Active && a.epoch >= epoch {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    None
}

fn config(clock: &Arc<dyn Clock>, member: &str) -> GroupConfig {
    GroupConfig::new("g", TTL)
        .with_member(member)
        .with_clock(clock.clone())
}

/// Two active members on one in-memory store: `a` through a [`MissedChanges`] wrapper, `b`
/// directly. Returns the clock, the store, the wrapper and both members.
async fn two_members() -> (Arc<dyn Clock>, DynStore, Arc<MissedChanges>, Member, Member) {
    let clock: Arc<dyn Clock> = Arc::new(SimClock::new(SystemTime::UNIX_EPOCH));
    let memory: DynStore = Arc::new(MemoryStore::with_clock(clock.clone()));
    let missed = Arc::new(MissedChanges::new(memory.clone()));
    let a_store: DynStore = missed.clone();
    let a = Group::join(a_store, config(&clock, "a"))
        .await
        .expect("a joins");
    let b = Group::join(memory.clone(), config(&clock, "b"))
        .await
        .expect("b joins");
    active_within(&a, 1, TTL * 10).await.expect("a active");
    active_within(&b, 1, TTL * 10).await.expect("b active");
    (clock, memory, missed, a, b)
}

/// Three members join on one store; the first one's view directory is frozen `after` the
/// first two are active, before the third joins. Panics unless the third and then the first
/// become active under the third's view.
async fn a_joiner_is_adopted_despite_missed_changes(after: Duration) {
    let (clock, memory, missed, a, b) = two_members().await;
    tokio::time::sleep(after).await;
    let epoch = a.assignment().epoch.max(b.assignment().epoch);
    // From now on a's view directory never reports a change to a version a holds.
    missed.freeze("hc:{g}:view:");
    let c = Group::join(memory.clone(), config(&clock, "c"))
        .await
        .expect("c joins");
    let took = active_within(&c, epoch + 1, TTL * 20).await;
    assert!(
        took.is_some(),
        "the joiner never became active: a {:?}, c {:?}",
        a.assignment(),
        c.assignment()
    );
    if active_within(&a, c.assignment().epoch, TTL * 10)
        .await
        .is_none()
    {
        panic!(
            "a never became active under the joiner's view: a {:?}, b {:?}, c {:?}, view {:?}",
            a.assignment(),
            b.assignment(),
            c.assignment(),
            memory.get("hc:{g}:view:current").await
        );
    }
    for m in [c, b, a] {
        m.leave().await.expect("leave");
    }
}

/// A member whose view compare-and-set loses (the joiner published first) reads the view
/// directory again, even when the store's version says it did not change: otherwise it would keep
/// the version it held, hear "unchanged" at every heartbeat, and retry with the same stale
/// expected text for ever, so it would never adopt the joiner's view and the joiner would wait
/// for its acknowledgement for ever. Here the first member holds a version of the
/// view directory when it is frozen.
#[test]
fn a_lost_view_write_makes_the_member_read_the_view_again() {
    runtime().block_on(a_joiner_is_adopted_despite_missed_changes(TTL * 2));
}

/// The same for the settled mark: a settler whose compare-and-set of the mark loses (another
/// settler wrote it) reads the view directory again; otherwise the mark would stay unseen behind
/// the version it held, and it would never activate the view. Here the first member
/// holds no version of the view directory when it is frozen (it has just written there), so it
/// adopts the joiner's view and then waits on the mark.
#[test]
fn a_lost_settled_mark_write_makes_the_member_read_the_view_again() {
    runtime().block_on(a_joiner_is_adopted_despite_missed_changes(Duration::ZERO));
}

/// A renewal the store refused is judged on the slot table as the store holds it, not on the
/// member's copy: a member whose slot was deleted (or expired early, or overwritten) while the
/// store's version of the slot directory said nothing changed stops all work at that heartbeat,
/// as documented, instead of finding its own record in its copy and granting until its lease
/// deadline.
#[test]
fn a_refused_renewal_is_judged_on_the_store_not_on_the_copy() {
    runtime().block_on(async {
        let (_clock, memory, missed, a, b) = two_members().await;
        // Let both reach their steady heartbeats, then lose a's slot behind the version.
        tokio::time::sleep(TTL * 2).await;
        let slot = a.assignment().slot.expect("a slot");
        missed.freeze("hc:{g}:slot:");
        let deleted = tokio::time::Instant::now();
        assert!(memory
            .delete(&format!("hc:{{g}}:slot:{slot}"))
            .await
            .expect("delete"));
        // The next renewal is refused within a heartbeat (TTL/3); the lease deadline is 0.9 TTL
        // after the last renewal, so at least 0.9 TTL - TTL/3 after the delete.
        let heartbeat = TTL / 3;
        while a.assignment().phase == GroupPhase::Active {
            assert!(
                deleted.elapsed() <= heartbeat + Duration::from_millis(5),
                "still active {:?} after its slot was deleted: {:?}",
                deleted.elapsed(),
                a.assignment()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(a.owns("k").is_none() && a.owns("j").is_none());
        for m in [b, a] {
            m.leave().await.expect("leave");
        }
    });
}
