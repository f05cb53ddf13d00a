//! Group rules checked on the in-memory store: what a member refuses, and what it never shows.
// Tests fail by panicking.
#![allow(clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use headcount_core::assign::AssignorKind;
use headcount_core::memory::MemoryStore;
use headcount_core::recipes::group::{Group, GroupConfig};
use headcount_core::testkit::TestGroup;
use headcount_core::{DynStore, ErrorKind};

const TTL: Duration = Duration::from_millis(300);

/// A member of the group `config` names, joined on `store` and active within 5 s.
async fn join_active(
    store: DynStore,
    config: GroupConfig,
) -> headcount_core::recipes::group::Member {
    let m = Group::join(store, config).await.expect("joins");
    tokio::time::timeout(Duration::from_secs(5), m.active(0))
        .await
        .expect("active in time")
        .expect("active");
    m
}

#[tokio::test]
async fn a_member_with_another_assignor_is_refused() {
    let store: DynStore = Arc::new(MemoryStore::new());
    let a = join_active(
        store.clone(),
        GroupConfig::new("g", TTL).with_assignor(AssignorKind::JumpFailover),
    )
    .await;
    let err = Group::join(
        store.clone(),
        GroupConfig::new("g", TTL).with_assignor(AssignorKind::JumpBackFailover),
    )
    .await
    .expect_err("a second assignor is refused");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("`jump` assignor"), "{err}");
    // The same assignor joins.
    let b = Group::join(
        store.clone(),
        GroupConfig::new("g", TTL).with_assignor(AssignorKind::JumpFailover),
    )
    .await
    .expect("same assignor joins");
    b.leave().await.expect("leave b");
    a.leave().await.expect("leave a");
}

/// A handle whose member has left answers what happened, as a kind a caller can match on:
/// `Stopped`, naming the member, not a store error or a configuration error.
#[tokio::test]
async fn waiting_on_a_member_that_left_is_stopped() {
    let store: DynStore = Arc::new(MemoryStore::new());
    let a = Group::join(store, GroupConfig::new("g", TTL).with_member("m1"))
        .await
        .expect("joins");
    let other = a.clone();
    a.leave().await.expect("leave");
    let err = tokio::time::timeout(Duration::from_secs(5), other.active(0))
        .await
        .expect("answers in time")
        .expect_err("a member that left is never active");
    assert_eq!(err.kind(), ErrorKind::Stopped, "{err}");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("group member m1"), "{err}");
    // Leaving again, from the other handle, is fine.
    other.leave().await.expect("second leave");
}

#[tokio::test]
async fn epochs_never_pass_the_largest_and_the_member_says_why() {
    use headcount_core::recipes::group::MAX_EPOCH;
    let mut group = TestGroup::builder("g").build();
    let store = group.store();
    let view = format!("v1 epoch={MAX_EPOCH} slots=");
    assert!(store
        .compare_and_set("hc:{g}:view:current", None, &view, None)
        .await
        .expect("plant the view"));
    let m = group.join().await.expect("joins");
    group
        .wait_until("an error", |g| {
            g.member(m).assignment().last_error.is_some()
        })
        .await
        .expect("an error in time");
    let said = group.member(m).assignment().last_error.unwrap_or_default();
    assert!(said.contains("largest"), "{said}");
    // A few heartbeats later the stored view is still the largest epoch, nothing above it.
    group.advance(group.ttl()).await;
    assert_eq!(
        store
            .get("hc:{g}:view:current")
            .await
            .expect("get")
            .as_deref(),
        Some(view.as_str())
    );
    assert_ne!(
        group.member(m).assignment().phase,
        headcount_core::recipes::group::GroupPhase::Active
    );
}

#[tokio::test]
async fn a_stalled_renewal_turns_the_assignment_inactive_at_the_lease_deadline() {
    use headcount_core::recipes::group::GroupPhase;
    let mut group = TestGroup::start("g", 1).await.expect("starts");
    // Every store call stalls from now on, as behind a frozen connection.
    group.pause(0);
    // The watch says rejoining by the lease deadline, while the call is still stalled.
    let took = group
        .wait_until("rejoining", |g| {
            g.member(0).watch().borrow().phase == GroupPhase::Rejoining
        })
        .await
        .expect("the lease lapses");
    // The deadline is the last renewal's send time plus 0.9 TTL: within one TTL of the stall.
    assert!(took <= group.ttl(), "{took:?}");
    assert!(group.member(0).would_grant("k").is_none());
    group.leave(0).await.expect("leave");
}

#[tokio::test]
async fn status_counts_ownership_with_the_assignor_the_view_names() {
    use headcount_core::recipes::group::status;
    let group = TestGroup::builder("g")
        .members(3)
        .assignor(AssignorKind::JumpFailover)
        .start()
        .await
        .expect("three active");
    let store = group.store();
    let with_jump = status(&store, "hc", "g", AssignorKind::JumpFailover, 3000)
        .await
        .expect("status");
    let asked_other = status(&store, "hc", "g", AssignorKind::Modulo, 3000)
        .await
        .expect("status");
    assert_eq!(with_jump.sample_owned, asked_other.sample_owned);
}

/// A host suspend, as the member's clock sees it: time jumps past the lease in one step, and no
/// task of the member runs in between. Its grants must be invalid at the first check after the
/// resume, before its heartbeat task has run at all. (`SystemClock` counts suspended time by
/// reading `CLOCK_BOOTTIME`; this checks that grants judge validity by reading the clock.)
#[tokio::test]
async fn grants_are_invalid_at_once_after_a_suspend_past_the_lease() {
    let group = TestGroup::start("g", 1).await.expect("active");
    let m = group.member(0);
    let grant = m.owns("k").expect("a lone active member owns every key");
    assert!(grant.is_valid());
    // The suspend: well past the lease, in one step of the clock, no task running.
    group.clock().advance(group.ttl() * 3);
    assert!(
        !grant.is_valid(),
        "a grant outlived the lease across a suspend"
    );
    assert!(
        m.owns("k").is_none(),
        "a new grant after a suspend past the lease"
    );
    drop(grant);
}

/// A grant taken before a lapse says so after the member became active again: `exec` gives its
/// command no grace period then, since the others no longer wait for that grant. The member's
/// phase cannot tell: an `exec` that lapsed and quickly re-gained its share is active again, and
/// its old command would get the grace period beside the new owner.
#[tokio::test]
async fn a_grant_from_before_a_lapse_says_so_after_the_member_is_active_again() {
    use headcount_core::recipes::group::GroupPhase;
    let mut group = TestGroup::start("g", 1).await.expect("active");
    let old = group
        .member(0)
        .owns("k")
        .expect("a lone member owns every key");
    assert!(!old.lease_lapsed());
    group.pause(0);
    group
        .wait_until("rejoining", |g| {
            g.member(0).watch().borrow().phase == GroupPhase::Rejoining
        })
        .await
        .expect("the lease lapses");
    group.resume(0);
    group.converged().await.expect("active again");
    assert!(!old.is_valid());
    assert!(
        old.lease_lapsed(),
        "the old grant does not say its lease lapsed"
    );
    let new = group.member(0).owns("k").expect("owns the key again");
    assert!(!new.lease_lapsed());
    drop((old, new));
    group.leave(0).await.expect("leave");
}

/// A slot record with no expiry (a restore that dropped TTLs, a hand edit) holding a claim that
/// never acknowledges: the members must not wait for it forever (the lone member must not stay
/// in hand-off for good, with no error).
#[tokio::test]
async fn a_slot_record_without_expiry_does_not_stall_the_group() {
    use headcount_core::recipes::group::{GroupPhase, SlotRecord};
    let group = TestGroup::start("g", 1).await.expect("active");
    let store = group.store();
    let before = group.member(0).assignment().epoch;
    // Written by hand: fields in another order and an unpadded nonce, which parse to a claim
    // but are not the text the member would write for it.
    let ghost = format!(
        "v1 nonce=deadbeef member=ghost since=1 ttl={} acked=0 view=0",
        group.ttl().as_millis()
    );
    let parsed = SlotRecord::parse(&ghost).expect("the hand-written record parses");
    assert_ne!(parsed.to_string(), ghost);
    assert!(store
        .compare_and_set("hc:{g}:slot:5", None, &ghost, None)
        .await
        .expect("write the ghost"));
    // The member sees a new live slot, publishes a view with it, and waits for its
    // acknowledgement; it must end active in a view without the ghost.
    let settled = group
        .wait_until("active in a view without the ghost", |g| {
            let a = g.member(0).assignment();
            a.phase == GroupPhase::Active && a.replicas == 1 && a.epoch > before
        })
        .await;
    assert!(
        settled.is_ok(),
        "stalled on the record without expiry: {:?}",
        group.member(0).assignment()
    );
    assert_eq!(store.get("hc:{g}:slot:5").await.expect("get"), None);
}

/// Counts, per store, the writes that changed a key of the slot directory and, per renewed key,
/// the heartbeats that carried the slot table and those that carried the view directory.
#[derive(Debug)]
struct Counting {
    inner: DynStore,
    dir: String,
    dir_writes: std::sync::atomic::AtomicUsize,
    reads: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
    view_reads: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
}

impl Counting {
    fn new(inner: DynStore) -> Self {
        Counting {
            inner,
            dir: "hc:{g}:slot:".into(),
            dir_writes: Default::default(),
            reads: Default::default(),
            view_reads: Default::default(),
        }
    }

    fn wrote(&self, key: &str, changed: bool) {
        if changed && key.starts_with(&self.dir) {
            self.dir_writes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn reset(&self) {
        self.dir_writes
            .store(0, std::sync::atomic::Ordering::SeqCst);
        self.reads.lock().expect("lock").clear();
        self.view_reads.lock().expect("lock").clear();
    }
}

#[async_trait::async_trait]
impl headcount_core::backend::Backend for Counting {
    fn capabilities(&self) -> headcount_core::Capabilities {
        self.inner.capabilities()
    }
    async fn incr(&self, key: &str, ttl: Option<Duration>) -> headcount_core::Result<i64> {
        let r = self.inner.incr(key, ttl).await;
        self.wrote(key, r.is_ok());
        r
    }
    async fn get(&self, key: &str) -> headcount_core::Result<Option<String>> {
        self.inner.get(key).await
    }
    async fn expire(&self, key: &str, ttl: Duration) -> headcount_core::Result<bool> {
        self.inner.expire(key, ttl).await
    }
    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> headcount_core::Result<bool> {
        let r = self.inner.compare_and_set(key, expected, new, ttl).await;
        // Writing the same text again (a TTL refresh) changes nothing a reader sees.
        self.wrote(key, matches!(r, Ok(true)) && expected != Some(new));
        r
    }
    async fn delete(&self, key: &str) -> headcount_core::Result<bool> {
        let r = self.inner.delete(key).await;
        self.wrote(key, matches!(r, Ok(true)));
        r
    }
    async fn compare_and_delete(&self, key: &str, expected: &str) -> headcount_core::Result<bool> {
        let r = self.inner.compare_and_delete(key, expected).await;
        self.wrote(key, matches!(r, Ok(true)));
        r
    }
    async fn list(&self, prefix: &str) -> headcount_core::Result<Vec<(String, String)>> {
        self.inner.list(prefix).await
    }
    async fn list_with_ttl(
        &self,
        prefix: &str,
    ) -> headcount_core::Result<Vec<(String, String, Option<Duration>)>> {
        self.inner.list_with_ttl(prefix).await
    }
    async fn renew_and_list_if_changed(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dir: &str,
        since: Option<&str>,
    ) -> headcount_core::Result<headcount_core::store::RenewedListing> {
        let r = self
            .inner
            .renew_and_list_if_changed(key, holder, ttl, dir, since)
            .await;
        if matches!(&r, Ok(answer) if answer.listing.is_some()) {
            let reads = if dir == self.dir {
                &self.reads
            } else {
                &self.view_reads
            };
            *reads
                .lock()
                .expect("lock")
                .entry(key.to_owned())
                .or_default() += 1;
        }
        r
    }
    /// Versions only, no listing: not a read of either directory.
    async fn renew_and_versions(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        dirs: &[(&str, Option<&str>)],
    ) -> headcount_core::Result<(bool, Vec<String>)> {
        self.inner.renew_and_versions(key, holder, ttl, dirs).await
    }
    async fn subscribe(
        &self,
        dir: &str,
    ) -> headcount_core::Result<headcount_core::notify::Notifications> {
        self.inner.subscribe(dir).await
    }
}

/// A view change costs each member a constant number of reads, however many members acknowledge
/// it: acknowledgements are written outside the slot directory, one member settles the view, and
/// the view and the mark live in a directory of their own, so a member reads the slot table once
/// for the leave (at most) and the small view directory for the new view and its mark. Before,
/// every acknowledgement changed the table, so during a hand-off each member read the table again
/// at every poll that followed one (16 members: 15 more writes to the directory per view change).
#[tokio::test]
async fn acknowledgements_do_not_change_the_slot_table() {
    const N: usize = 16;
    // One counting layer over the store, for every member.
    let counting: Arc<std::sync::OnceLock<Arc<Counting>>> = Arc::default();
    let layer = counting.clone();
    let mut group = TestGroup::builder("g")
        .members(N)
        .layer(move |_, store, _| {
            layer.get_or_init(|| Arc::new(Counting::new(store))).clone() as DynStore
        })
        .start()
        .await
        .expect("converged");
    let counting = counting.get().expect("layered").clone();
    assert!(
        !counting.reads.lock().expect("lock").is_empty(),
        "the layer saw no member read the table while they joined"
    );
    let ttl = group.ttl();
    // Let the last heartbeats that read the joins' tables pass.
    group.advance(ttl).await;
    counting.reset();
    // Steady: four heartbeats (a slot-table look by every member) carry no table and no view.
    group.advance(ttl * 4 / 3).await;
    {
        let reads = counting.reads.lock().expect("lock").clone();
        let view_reads = counting.view_reads.lock().expect("lock").clone();
        assert!(
            reads.is_empty() && view_reads.is_empty(),
            "a steady group read {reads:?} {view_reads:?}"
        );
    }
    counting.reset();
    let epoch = group.member(0).assignment().epoch;
    group.leave(N / 2).await.expect("leave");
    let done = group.converged().await.expect("converged without it");
    assert_eq!(done.live.len(), N - 1);
    assert!(done.epoch > epoch);
    // Two more heartbeats: reads that follow the change late are counted too.
    group.advance(ttl).await;
    let writes = counting
        .dir_writes
        .load(std::sync::atomic::Ordering::SeqCst);
    let reads = counting.reads.lock().expect("lock").clone();
    let view_reads = counting.view_reads.lock().expect("lock").clone();
    // The leave's delete: the new view and its settled mark are written outside the slot table.
    assert!(
        writes <= 1,
        "{writes} writes to the slot directory for one view change"
    );
    let most = reads.values().copied().max().unwrap_or(0);
    assert!(most <= 1, "a member read the table {most} times: {reads:?}");
    let most = view_reads.values().copied().max().unwrap_or(0);
    assert!(
        most <= 2,
        "a member read the view directory {most} times: {view_reads:?}"
    );
}

/// Many members started at once all race for the lowest free slot; every one of them must get a
/// slot (a join that loses the race again and again must not fail).
/// An in-memory store behind a fault layer that delays every call by up to `max_delay` (seeded),
/// as over a network, so concurrent joins interleave.
fn delayed_store(seed: u64, max_delay: Duration) -> DynStore {
    use headcount_core::sim::{FaultRates, Faults, FaultyStore};
    use headcount_core::SystemClock;
    let faults = Faults::new(seed);
    faults.set_rates(FaultRates {
        fail_before: 0.0,
        fail_after: 0.0,
        delay: 1.0,
        max_delay,
    });
    Arc::new(FaultyStore::new(
        Arc::new(MemoryStore::new()),
        faults,
        Arc::new(SystemClock::new()),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_joins_all_get_slots() {
    // Every call delayed by up to 5 ms, as over a network: the joins interleave.
    let store = delayed_store(7, Duration::from_millis(5));
    let joins: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                Group::join(
                    store,
                    GroupConfig::new("g", Duration::from_secs(6)).with_member(format!("m{i}")),
                )
                .await
            })
        })
        .collect();
    let mut members = Vec::new();
    let mut failed = Vec::new();
    for j in joins {
        match j.await.expect("join task") {
            Ok(m) => members.push(m),
            Err(e) => failed.push(e.to_string()),
        }
    }
    assert!(
        failed.is_empty(),
        "{} joins failed: {failed:?}",
        failed.len()
    );
    for m in members {
        m.leave().await.expect("leave");
    }
}

/// A burst of joins that fills the group to its maximum: a join that lost a race picks among
/// the free slots there are, never past the last one, so none is refused as "full" while a slot
/// is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_that_fills_the_group_is_not_refused_as_full() {
    const SLOTS: u32 = 6;
    let store = delayed_store(11, Duration::from_millis(3));
    let mut failed = Vec::new();
    for round in 0..8 {
        let joins: Vec<_> = (0..SLOTS)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    Group::join(
                        store,
                        GroupConfig::new(format!("g{round}"), Duration::from_secs(6))
                            .with_member(format!("m{i}"))
                            .with_max_slots(SLOTS),
                    )
                    .await
                })
            })
            .collect();
        let mut members = Vec::new();
        for j in joins {
            match j.await.expect("join task") {
                Ok(m) => members.push(m),
                Err(e) => failed.push(format!("round {round}: {e}")),
            }
        }
        for m in members {
            m.leave().await.expect("leave");
        }
    }
    assert!(
        failed.is_empty(),
        "{} joins failed: {failed:?}",
        failed.len()
    );
}

/// A key that stays a member's across a view change keeps one fencing token: the epoch since
/// which the member has owned it without a break. So a grant taken before the change and still
/// valid is admitted by a fence after a grant taken since wrote (the false fencing that Kafka's
/// KIP-1251 fixed with an assignment epoch), while a key that moved gets a newer token than its
/// old owner's.
#[tokio::test]
async fn a_members_older_grant_is_not_fenced_off_by_its_newer_one() {
    use headcount_core::fence::MemoryFence;
    let mut group = TestGroup::start("g", 1).await.expect("a active");
    let first = group.member(0).assignment();
    let keys: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
    let mut older: Vec<_> = keys
        .iter()
        .map(|k| {
            let g = group
                .member(0)
                .owns(k)
                .expect("a lone member owns every key");
            (k.clone(), g)
        })
        .collect();
    assert!(older.iter().all(|(_, g)| g.token().get() == first.epoch));
    let b = group.join().await.expect("b joins");
    // Drop the grants of the keys that move to b (the hand-off waits for them); keep the rest.
    group
        .wait_until("both active on the two-member view", |g| {
            older.retain(|(_, g)| g.is_valid());
            g.is_converged()
        })
        .await
        .expect("in time");
    let (a, b) = (group.member(0), group.member(b));
    let second = b.assignment();
    assert_eq!(second.replicas, 2);
    assert!(second.epoch > first.epoch);
    assert!(
        !older.is_empty() && older.len() < keys.len(),
        "some keys stay a's and some move ({} stay)",
        older.len()
    );
    let fence = MemoryFence::new();
    for (k, old) in &older {
        let new = a.owns(k).expect("a still owns what stayed");
        assert!(fence.admit(k, new.token()), "{k}: the newer grant");
        assert!(old.is_valid());
        assert!(
            fence.admit(k, old.token()),
            "{k}: a's grant from epoch {} (token {}) is refused after its grant from epoch {} \
             (token {}) wrote, though both are valid and a owned {k} all along",
            old.epoch(),
            old.token(),
            new.epoch(),
            new.token()
        );
    }
    // A key that moved: b's token is newer than any a used for it.
    for k in &keys {
        if let Some(g) = b.owns(k) {
            assert!(
                g.token().get() > first.epoch,
                "{k}: b's token {}",
                g.token()
            );
        }
    }
    drop(older);
}

/// A lone member active at its first epoch, and the keys it was granted there.
async fn lone_member_with_grants(
    store: &DynStore,
) -> (
    headcount_core::recipes::group::Member,
    u64,
    Vec<(String, headcount_core::recipes::group::Grant)>,
) {
    let a = Group::join(store.clone(), GroupConfig::new("g", TTL))
        .await
        .expect("a joins");
    let first = tokio::time::timeout(Duration::from_secs(5), a.active(0))
        .await
        .expect("active in time")
        .expect("active");
    let held = (0..16)
        .map(|i| {
            let k = format!("k{i}");
            let g = a.owns(&k).expect("a lone member owns every key");
            assert_eq!(g.token().get(), first.epoch);
            (k, g)
        })
        .collect();
    (a, first.epoch, held)
}

/// Waits until `a` grants `key` under a view above `epoch`, and returns that grant.
async fn grant_above(
    a: &headcount_core::recipes::group::Member,
    key: &str,
    epoch: u64,
) -> headcount_core::recipes::group::Grant {
    tokio::time::timeout(TTL * 20, async {
        loop {
            if let Some(g) = a.owns(key).filter(|g| g.epoch() > epoch) {
                return g;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a grant under a newer view in time")
}

#[tokio::test]
async fn an_epoch_minted_twice_is_never_a_token_again() {
    // A store that lost writes let another member publish this member's epoch again for other
    // holders (written here by hand: the same epoch, one more slot). Grants under the twin
    // carry the epoch as their token too, so after the member replaced the twin, a token from
    // that epoch would let the other member's late writes through a fence: every new grant,
    // even of a key with a grant in flight, must carry a newer token.
    let store: DynStore = Arc::new(MemoryStore::new());
    let (a, epoch, held) = lone_member_with_grants(&store).await;
    let view = store
        .get("hc:{g}:view:current")
        .await
        .expect("get")
        .expect("a view");
    let twin = format!("{view},9@0000000000000001");
    assert!(store
        .compare_and_set("hc:{g}:view:current", Some(&view), &twin, None)
        .await
        .expect("plant the twin"));
    for (k, old) in &held {
        let new = grant_above(&a, k, epoch).await;
        assert!(
            new.token().get() > epoch,
            "{k}: granted under epoch {} with token {}, the epoch minted twice",
            new.epoch(),
            new.token()
        );
        assert!(old.is_valid(), "{k} stayed a's");
    }
    drop(held);
    a.leave().await.expect("leave");
}

/// A hook that panics in every call once armed: the heartbeat task's next store call panics.
#[derive(Debug, Default)]
struct PanicWhenArmed(std::sync::atomic::AtomicBool);

#[async_trait::async_trait]
impl headcount_core::decorated::Hooks for PanicWhenArmed {
    async fn before(&self, op: headcount_core::Op) -> headcount_core::Result<()> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("a store call ({op}) panicked, as this test wants");
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_heartbeat_task_that_panics_fails_the_member_instead_of_hanging_its_waiters() {
    let decorated = Arc::new(headcount_core::decorated::Decorated::with(
        Arc::new(MemoryStore::new()),
        PanicWhenArmed::default(),
    ));
    let m = join_active(decorated.clone(), GroupConfig::new("g", TTL)).await;
    decorated
        .hooks()
        .0
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // An epoch no view reaches: only the end of the task can answer.
    let err = tokio::time::timeout(Duration::from_secs(5), m.active(u64::MAX))
        .await
        .expect("answers once the task panicked")
        .expect_err("never active");
    assert_eq!(err.kind(), ErrorKind::Stopped, "{err}");
    assert!(err.to_string().contains("panicked"), "{err}");
}

/// `status` keeps reporting the epoch each live member acknowledged after its acknowledgement
/// record expired (four TTLs without a view change): the settled mark of the published view
/// says every slot in that view acknowledged it, so `acked` never goes back to the epoch the
/// slot was claimed at.
#[tokio::test]
async fn status_keeps_the_acknowledged_epoch_after_the_acknowledgements_expire() {
    use headcount_core::recipes::group::{status, GroupStatus};
    let group = TestGroup::start("g", 2).await.expect("both active");
    let store = group.store();
    let read = || async {
        status(&store, "hc", "g", AssignorKind::JumpBackFailover, 0)
            .await
            .expect("status")
    };
    let view_epoch = |s: &GroupStatus| s.table.view.as_ref().map(|v| v.epoch);
    // The settled mark follows the last acknowledgement within a heartbeat or so.
    let settled = loop {
        let s = read().await;
        if s.table.settled.map(|m| m.epoch) == view_epoch(&s) && s.view_current {
            break s;
        }
        assert!(group.elapsed() < group.ttl() * 40, "never settled: {s:?}");
        group.advance(group.ttl() / 10).await;
    };
    let epoch = view_epoch(&settled).expect("a view");
    assert_eq!(settled.table.slots.len(), 2);
    for &slot in settled.table.slots.keys() {
        assert_eq!(
            settled.acked(slot),
            Some(epoch),
            "slot {slot} before: {settled:?}"
        );
    }
    // Six TTLs of heartbeats and no view change: the acknowledgements (kept four TTLs) expire.
    group.advance(group.ttl() * 6).await;
    let later = read().await;
    assert_eq!(
        view_epoch(&later),
        Some(epoch),
        "the view changed: {later:?}"
    );
    assert!(later.acks.is_empty(), "the acknowledgements did not expire");
    for &slot in later.table.slots.keys() {
        assert_eq!(
            later.acked(slot),
            Some(epoch),
            "slot {slot} went back: {later:?}"
        );
    }
}

/// `status`'s `key_owner` names, for each key, the member whose `owns` grants it: the owner
/// read from the store alone agrees with the members' own view of who owns what.
#[tokio::test]
async fn status_names_the_member_that_grants_each_key() {
    use headcount_core::recipes::group::status;

    let group = TestGroup::builder("g")
        .members(2)
        .member_ids(["a", "b"])
        .start()
        .await
        .expect("settled");
    let keys: Vec<String> = (0..32).map(|k| format!("order-{k}")).collect();
    // Once settled, every key is granted by exactly one of them.
    group.assert_exclusive(&keys);
    let s = status(
        &group.store(),
        headcount_core::DEFAULT_PREFIX,
        "g",
        AssignorKind::JumpBackFailover,
        0,
    )
    .await
    .expect("status");
    let mut by = std::collections::BTreeMap::new();
    for k in &keys {
        let owner = s.key_owner(k).expect("maps").expect("an owner");
        let granter = group.owner_of(k).expect("granted");
        assert_eq!(
            owner.member.as_deref(),
            Some(group.id(granter)),
            "{k}: {owner:?}"
        );
        assert_eq!(
            owner.view_epoch,
            group.member(0).assignment().epoch,
            "{owner:?}"
        );
        // The token a grant would carry is never newer than the view's epoch.
        let token = group.member(granter).would_grant(k).expect("granted");
        assert!(
            token.get() <= owner.view_epoch,
            "{k}: token {token} > {owner:?}"
        );
        *by.entry(group.id(granter)).or_insert(0) += 1;
    }
    assert_eq!(by.len(), 2, "32 keys all on one member: {by:?}");
}

/// Holds the first `n` compare-and-sets on the group's view key until all `n` arrived: `n`
/// members that claimed their slots before any of them published a view, as members started at
/// the same moment do.
#[derive(Debug)]
struct PublishTogether {
    barrier: tokio::sync::Barrier,
    left: std::sync::atomic::AtomicUsize,
    /// The key of the call about to run: `span` sees it just before `before` runs, with no
    /// await between them.
    key: std::sync::Mutex<String>,
}

#[async_trait::async_trait]
impl headcount_core::decorated::Hooks for PublishTogether {
    fn span(&self, _op: headcount_core::Op, key: &str) -> tracing::Span {
        *self.key.lock().expect("lock") = key.to_owned();
        tracing::Span::none()
    }

    async fn before(&self, op: headcount_core::Op) -> headcount_core::Result<()> {
        use std::sync::atomic::Ordering;
        let view = self.key.lock().expect("lock").ends_with(":view:current");
        let first = op == headcount_core::Op::CompareAndSet
            && view
            && self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if first {
            self.barrier.wait().await;
        }
        Ok(())
    }
}

/// Three members with three assignors (`--partitions 8`, `--partitions 16`, `--assignor
/// modulo`: a fleet restarted with a half-applied configuration change) join at the same
/// moment: whichever view is published first is the group's, the other two end `failed` with
/// a configuration error naming both assignors (the CLI's exit 2), and the first is active
/// alone. Started one after another, the later ones are refused at join: the same outcome.
#[tokio::test]
async fn members_of_other_assignors_started_together_fail_and_the_first_view_stands() {
    use headcount_core::decorated::Decorated;
    use headcount_core::recipes::group::GroupPhase;
    let memory: DynStore = Arc::new(MemoryStore::new());
    let store: DynStore = Arc::new(Decorated::with(
        memory,
        PublishTogether {
            barrier: tokio::sync::Barrier::new(3),
            left: 3.into(),
            key: std::sync::Mutex::default(),
        },
    ));
    let configs = [
        GroupConfig::new("g", TTL)
            .with_member("p8")
            .with_partitions(8),
        GroupConfig::new("g", TTL)
            .with_member("p16")
            .with_partitions(16),
        GroupConfig::new("g", TTL)
            .with_member("modulo")
            .with_assignor(AssignorKind::Modulo),
    ];
    let [a, b, c] = configs.map(|config| Group::join(store.clone(), config));
    let (a, b, c) = tokio::join!(a, b, c);
    // A join that read another assignor's view after its claim lost a race is refused at once,
    // as a later join would be; the others join and end as below.
    let mut members = Vec::new();
    let mut refused = 0;
    for joined in [a, b, c] {
        match joined {
            Ok(m) => members.push(m),
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::Config, "{err}");
                assert!(err.to_string().contains("assignor"), "{err}");
                refused += 1;
            }
        }
    }
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let phases: Vec<_> = members.iter().map(|m| m.assignment()).collect();
            let failed = phases
                .iter()
                .filter(|a| a.phase == GroupPhase::Failed)
                .count();
            let alone = phases
                .iter()
                .filter(|a| a.phase == GroupPhase::Active && a.replicas == 1)
                .count();
            if refused + failed == 2 && alone == 1 {
                return phases;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        let now: Vec<_> = members.iter().map(|m| m.assignment()).collect();
        panic!("no single assignor won within 10 s ({refused} refused at join): {now:#?}")
    });
    for (member, now) in members.into_iter().zip(ended) {
        let left = member.leave().await;
        if now.phase == GroupPhase::Failed {
            let err = left.expect_err("a member that failed says why when it leaves");
            assert_eq!(err.kind(), ErrorKind::Config, "{err}");
            assert!(err.to_string().contains("assignor"), "{err}");
            assert!(
                now.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("assignor")),
                "{now:?}"
            );
        } else {
            left.expect("the member of the group's assignor leaves cleanly");
        }
    }
}

/// A standby of another key set (`--standby-for 30s --partitions 16` beside a group of
/// `--partitions 12`) is refused before it stands by: a deploy tool would otherwise read it as
/// ready and stop a member for a standby that can never take over.
#[tokio::test]
async fn a_standby_that_could_never_take_over_is_refused_before_it_stands_by() {
    let store: DynStore = Arc::new(MemoryStore::new());
    let a = join_active(
        store.clone(),
        GroupConfig::new("g", TTL)
            .with_member("a")
            .with_partitions(12),
    )
    .await;
    let err = Group::join(
        store.clone(),
        GroupConfig::new("g", TTL)
            .with_member("b")
            .with_partitions(16)
            .with_standby(Duration::from_secs(30)),
    )
    .await
    .expect_err("a standby of another key set is refused");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("sticky"), "{err}");
    // One of the same key set stands by.
    let b = Group::join(
        store.clone(),
        GroupConfig::new("g", TTL)
            .with_member("b")
            .with_partitions(12)
            .with_standby(Duration::from_secs(30)),
    )
    .await
    .expect("a standby of the same key set stands by");
    b.leave().await.expect("leave b");
    a.leave().await.expect("leave a");
}

/// A process paused past its lease while a new process with its member id took its place
/// yields when it resumes, before claiming a slot or publishing a view: the group's view and
/// every key's owner stay as they are, and the process that had been away ends `failed`,
/// saying why.
#[tokio::test]
async fn a_resumed_process_whose_id_was_taken_yields_without_claiming() {
    use headcount_core::recipes::group::GroupPhase;
    let mut group = TestGroup::builder("g")
        .member_ids(["a", "b", "c", "a"])
        .members(3)
        .start()
        .await
        .expect("active");
    group.pause(0);
    group.advance(group.ttl() * 2).await;
    let replacement = group.join().await.expect("the replacement joins");
    let before = group.converged().await.expect("converged without a");
    let keys: Vec<String> = (0..64).map(|k| format!("k{k}")).collect();
    let owners: Vec<_> = keys.iter().map(|k| group.owner_of(k)).collect();
    group.resume(0);
    group.advance(group.ttl() * 2).await;
    for i in [1, 2, replacement] {
        let a = group.member(i).assignment();
        assert!(
            a.phase == GroupPhase::Active && a.epoch == before.epoch,
            "member {i} is not active under epoch {}: {a:?}",
            before.epoch
        );
    }
    let now: Vec<_> = keys.iter().map(|k| group.owner_of(k)).collect();
    assert_eq!(now, owners, "keys moved among the members that stayed");
    let resumed = group.member(0).assignment();
    assert_eq!(resumed.phase, GroupPhase::Failed, "{resumed:?}");
    assert!(
        resumed
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("yields")),
        "{resumed:?}"
    );
    assert_eq!(
        group.member(replacement).assignment().phase,
        GroupPhase::Active
    );
}

/// A group never reaches a size whose view no member can publish: the configuration refuses a
/// `with_max_slots` whose largest view passes what one store value holds, names the largest
/// group it allows, and accepts the default.
#[test]
fn a_group_larger_than_a_store_value_can_name_is_refused() {
    use headcount_core::assign::{AssignorKind, KeySet};
    use headcount_core::recipes::group::GroupConfig;
    use headcount_core::ErrorKind;
    let ttl = std::time::Duration::from_secs(6);
    assert!(GroupConfig::new("g", ttl).validate().is_ok());
    assert!(GroupConfig::new("g", ttl)
        .with_max_slots(23_275)
        .validate()
        .is_ok());
    let e = GroupConfig::new("g", ttl)
        .with_max_slots(23_276)
        .validate()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(
        e.to_string().contains("the largest group is 23275 members"),
        "{e}"
    );
    let keys = KeySet::partitions(65_536).unwrap();
    let sticky = GroupConfig::new("g", ttl)
        .with_keys(keys.clone())
        .with_assignor(AssignorKind::Sticky(keys.id()));
    assert!(sticky.clone().with_max_slots(16_384).validate().is_ok());
    let e = sticky.with_max_slots(16_385).validate().unwrap_err();
    assert!(
        e.to_string()
            .contains("65536 declared keys the largest group is 16384"),
        "{e}"
    );
}
