//! Group membership over the store under test, on the real clock (leases expire on the store's
//! clock, so a manual clock cannot drive them): members in this process, waits polled with
//! deadlines.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use headcount::fence::FencingToken;
use headcount::recipes::group::{Group, GroupConfig, GroupPhase, Member, ViewHeader};
use headcount::{DynStore, ErrorKind};
use tokio::time::Instant;

use super::expect_kind;
use crate::{ensure, ensure_eq, wait, CaseResult, Ctx, Failure, ResultExt};

/// The lease TTL of the cases, raised to the backend's shortest lease (etcd: 2 s).
fn ttl(ctx: &Ctx) -> Duration {
    Duration::from_millis(900).max(ctx.caps().min_ttl)
}

/// Generous: a loaded CI machine runs every backend's suite at once.
fn converge_within(ctx: &Ctx) -> Duration {
    ttl(ctx) * 8 + Duration::from_secs(10)
}

fn config(ctx: &Ctx, member: &str) -> Result<GroupConfig, Failure> {
    let group = ctx
        .prefix
        .strip_prefix("hct:{")
        .and_then(|r| r.strip_suffix("}:"))
        .ok_or_else(|| Failure::new(format!("unexpected case prefix {:?}", ctx.prefix)))?;
    Ok(GroupConfig::new(group, ttl(ctx))
        .with_prefix("hct")
        .with_member(member))
}

async fn join(ctx: &Ctx, member: &str) -> Result<Member, Failure> {
    Group::join(ctx.store.clone(), config(ctx, member)?)
        .await
        .during(format!("join of {member}"))
}

/// Waits until every member is active under one epoch with `n` live slots, and returns it.
async fn converged(ctx: &Ctx, members: &[&Member], n: u32) -> Result<u64, Failure> {
    let what = format!("members converged on {n} live slots");
    wait::until(&what, converge_within(ctx), wait::EVERY, || async {
        let all: Vec<_> = members.iter().map(|m| m.assignment()).collect();
        let epoch = all[0].epoch;
        if all
            .iter()
            .all(|a| a.phase == GroupPhase::Active && a.epoch == epoch && a.replicas == n)
        {
            Ok(epoch)
        } else {
            Err(all)
        }
    })
    .await
    .map_err(Failure::new)
}

/// Every key of `keys` is granted by exactly one of `members`.
fn exactly_one_owner(members: &[&Member], keys: u32) -> CaseResult {
    for k in 0..keys {
        let key = format!("task-{k}");
        let owners: Vec<_> = members
            .iter()
            .filter_map(|m| m.owns(&key).map(|g| (m.member().to_owned(), g.token())))
            .collect();
        ensure!(
            owners.len() == 1,
            "key {key} is granted by {} members: {owners:?}",
            owners.len()
        );
    }
    Ok(())
}

/// Three members get slots 0, 1, 2 and indices 1..=3; every key has one owner; a graceful leave
/// moves the others to a newer epoch; the same member id rejoins into its old slot.
pub async fn group_join_leave_rejoin(ctx: &Ctx) -> CaseResult {
    let a = join(ctx, "a").await?;
    let b = join(ctx, "b").await?;
    let c = join(ctx, "c").await?;
    let e1 = converged(ctx, &[&a, &b, &c], 3).await?;
    let slots: BTreeSet<_> = [&a, &b, &c]
        .iter()
        .filter_map(|m| m.assignment().slot)
        .collect();
    ensure_eq!(slots, BTreeSet::from([0, 1, 2]), "slots of three members");
    let pairs: BTreeSet<_> = [&a, &b, &c]
        .iter()
        .filter_map(|m| m.assignment().pair())
        .collect();
    ensure_eq!(
        pairs,
        BTreeSet::from([(1, 3), (2, 3), (3, 3)]),
        "(index, replicas) pairs"
    );
    exactly_one_owner(&[&a, &b, &c], 300)?;
    let b_slot = b.assignment().slot;
    b.leave().await.during("leave of b")?;
    let e2 = converged(ctx, &[&a, &c], 2).await?;
    ensure!(e2 > e1, "epoch after a leave {e2} is not above {e1}");
    exactly_one_owner(&[&a, &c], 300)?;
    let b = join(ctx, "b").await?;
    let e3 = converged(ctx, &[&a, &b, &c], 3).await?;
    ensure!(e3 > e2, "epoch after a rejoin {e3} is not above {e2}");
    ensure_eq!(b.assignment().slot, b_slot, "b's slot after rejoining");
    for m in [a, b, c] {
        m.leave().await.during("final leave")?;
    }
    ctx.cleanup().await
}

/// Which of `members` owns each of the partitions `"0"` to `"count - 1"` (by index in
/// `members`), when exactly one does.
fn partition_owners(members: &[&Member], count: u32) -> Result<Vec<usize>, Failure> {
    (0..count)
        .map(|p| {
            let key = p.to_string();
            let owners: Vec<usize> = (0..members.len())
                .filter(|&i| members[i].would_grant(&key).is_some())
                .collect();
            match owners[..] {
                [one] => Ok(one),
                _ => Err(Failure::new(format!(
                    "partition {key} has {} owners",
                    owners.len()
                ))),
            }
        })
        .collect()
}

/// The sticky assignor over 4,096 declared partitions, its assignment stored in the view on the
/// store under test: three members own 1,365 or 1,366 each, a fourth member's join moves exactly
/// its share (1,024) and only to it, and a leave moves exactly the leaver's partitions.
pub async fn group_sticky_partitions(ctx: &Ctx) -> CaseResult {
    const COUNT: u32 = 4096;
    let join = |m: &'static str| async move {
        Group::join(ctx.store.clone(), config(ctx, m)?.with_partitions(COUNT))
            .await
            .during(format!("join of {m}"))
    };
    let (a, b, c) = (join("a").await?, join("b").await?, join("c").await?);
    converged(ctx, &[&a, &b, &c], 3).await?;
    let three = partition_owners(&[&a, &b, &c], COUNT)?;
    for i in 0..3 {
        let share = three.iter().filter(|&&o| o == i).count();
        ensure!(share == 1365 || share == 1366, "member {i} owns {share}");
    }
    let current = ctx
        .store
        .get(&format!("{}view:current", ctx.prefix))
        .await
        .during("reading the view")?
        .unwrap_or_default();
    // 4,096 owners make a long view: a header at `view:current`, the whole view in the
    // snapshot it names, which the store must hand back as written.
    let Some(header) = ViewHeader::parse(&current) else {
        return Err(Failure::new(format!(
            "a long view is not written as a header: {}",
            current.chars().take(200).collect::<String>()
        )));
    };
    let view = ctx
        .store
        .get(&format!("{}base:{}", ctx.prefix, header.snapshot()))
        .await
        .during("reading the view's snapshot")?
        .unwrap_or_default();
    ensure!(
        view.contains(" assignor=sticky:4096:") && view.contains(" owners="),
        "the view does not carry its assignment: {}",
        view.chars().take(200).collect::<String>()
    );
    ensure!(
        header.from_snapshot(&view).is_some(),
        "the snapshot is not the view its header names"
    );
    let d = join("d").await?;
    converged(ctx, &[&a, &b, &c, &d], 4).await?;
    let four = partition_owners(&[&a, &b, &c, &d], COUNT)?;
    let moved: Vec<usize> = (0..COUNT as usize)
        .filter(|&k| three[k] != four[k])
        .collect();
    ensure_eq!(moved.len(), 1024, "partitions moved by a join");
    ensure!(
        moved.iter().all(|&k| four[k] == 3),
        "a join moved a partition to a member that was there before"
    );
    b.leave().await.during("leave of b")?;
    converged(ctx, &[&a, &c, &d], 3).await?;
    let after = partition_owners(&[&a, &c, &d], COUNT)?;
    // a, c, d are 0, 1, 2 now; b was 1.
    let renamed = [Some(0), None, Some(1), Some(2)];
    let stayed = (0..COUNT as usize)
        .filter(|&k| renamed[four[k]] == Some(after[k]))
        .count();
    let b_share = four.iter().filter(|&&o| o == 1).count();
    ensure_eq!(
        COUNT as usize - stayed,
        b_share,
        "partitions moved by a leave (the leaver's)"
    );
    for m in [a, c, d] {
        m.leave().await.during("final leave")?;
    }
    ctx.cleanup().await
}

/// Waits, looking every 2 ms, until every member is active under one epoch with `n` live slots.
async fn converged_within(limit: Duration, members: &[&Member], n: u32) -> Result<u64, Failure> {
    let what = format!("members converged on {n} live slots");
    wait::until(&what, limit, Duration::from_millis(2), || async {
        let all: Vec<_> = members.iter().map(|m| m.assignment()).collect();
        let epoch = all[0].epoch;
        if all
            .iter()
            .all(|x| x.phase == GroupPhase::Active && x.epoch == epoch && x.replicas == n)
        {
            Ok(epoch)
        } else {
            Err(all)
        }
    })
    .await
    .map_err(Failure::new)
}

/// With the store's change notifications, a planned change takes round trips, not heartbeats: at
/// TTL 6 s (a heartbeat every 2 s), a join, a graceful leave and a standby's hand-over each have
/// every member active under the new view within half a heartbeat (typically tens of
/// milliseconds: printed), where polling takes up to a heartbeat per step. A store that does not
/// notify is only noted.
pub async fn group_planned_changes_notified(ctx: &Ctx) -> CaseResult {
    if !ctx.caps().native_notifications {
        println!(
            "NOTE group_planned_changes_notified: the {} backend does not notify here: members poll",
            ctx.caps().backend
        );
        return ctx.cleanup().await;
    }
    let ttl = Duration::from_secs(6).max(ctx.caps().min_ttl);
    let bound = ttl / 6;
    let join_ttl =
        |member: &str| -> Result<GroupConfig, Failure> { Ok(config(ctx, member)?.with_ttl(ttl)) };
    let start = |cfg: GroupConfig| {
        let store = ctx.store.clone();
        async move { Group::join(store, cfg).await.during("join".to_owned()) }
    };
    let a = start(join_ttl("a")?).await?;
    let b = start(join_ttl("b")?).await?;
    let c = start(join_ttl("c")?).await?;
    let limit = ttl * 4;
    converged_within(limit, &[&a, &b, &c], 3).await?;
    // The subscriptions open in the background: give them a moment past the joins.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let t = Instant::now();
    let d = start(join_ttl("d")?).await?;
    converged_within(limit, &[&a, &b, &c, &d], 4).await?;
    let joined = t.elapsed();

    let t = Instant::now();
    b.leave().await.during("leave of b")?;
    converged_within(limit, &[&a, &c, &d], 3).await?;
    let left = t.elapsed();

    let e = start(join_ttl("e")?.with_standby(ttl * 10)).await?;
    ensure_eq!(e.assignment().phase, GroupPhase::Standby, "e stands by");
    let t = Instant::now();
    c.leave().await.during("leave of c")?;
    converged_within(limit, &[&a, &d, &e], 3).await?;
    let handed = t.elapsed();
    println!(
        "NOTE group_planned_changes_notified ({}): converged after a join in {joined:?}, a leave in {left:?}, a hand-over to a standby in {handed:?} (TTL {ttl:?})",
        ctx.caps().backend
    );
    for (what, took) in [("join", joined), ("leave", left), ("hand-over", handed)] {
        ensure!(
            took <= bound,
            "a {what} took {took:?} to converge, more than {bound:?} (half a heartbeat): were the notifications heard?"
        );
    }
    for m in [a, d, e] {
        m.leave().await.during("final leave")?;
    }
    ctx.cleanup().await
}

/// Members crash (dropped without leaving): the others take over their keys after the lease
/// expires, within TTL plus a heartbeat and slack.
pub async fn group_crash_expires(ctx: &Ctx) -> CaseResult {
    let a = join(ctx, "a").await?;
    let b = join(ctx, "b").await?;
    let e1 = converged(ctx, &[&a, &b], 2).await?;
    let crashed = Instant::now();
    drop(b);
    let e2 = converged(ctx, &[&a], 1).await?;
    let took = crashed.elapsed();
    ensure!(e2 > e1, "epoch after a crash {e2} is not above {e1}");
    exactly_one_owner(&[&a], 100)?;
    // The bound the docs state: TTL (on the store's clock, rounded up) + one heartbeat; the
    // slack covers a loaded machine.
    let bound = ctx.caps().effective_ttl(ttl(ctx)) + ttl(ctx) / 3 + Duration::from_secs(5);
    ensure!(
        took <= bound,
        "took {took:?} to take over after a crash, more than {bound:?}"
    );
    a.leave().await.during("leave")?;
    ctx.cleanup().await
}

/// While members join, leave and crash, workers holding grants never overlap on a key: no two
/// members hold a valid grant for the same key at once, and one epoch grants a key to one member.
pub async fn group_handoff_no_double_grant(ctx: &Ctx) -> CaseResult {
    const KEYS: u32 = 64;
    /// (key, member, epoch, start, end) of work done under a grant valid at its end.
    type Entry = (u32, String, FencingToken, Instant, Instant);
    type Log = Arc<Mutex<Vec<Entry>>>;
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut members: BTreeMap<String, (Arc<Member>, tokio::task::JoinHandle<()>)> = BTreeMap::new();
    let spawn_worker = |m: Arc<Member>, log: Log, stop: Arc<std::sync::atomic::AtomicBool>| {
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut held = Vec::new();
                for k in 0..KEYS {
                    if let Some(g) = m.owns(format!("task-{k}")) {
                        held.push((k, g, Instant::now()));
                    }
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
                let mut entries = Vec::new();
                for (k, g, start) in held {
                    // Only work done under a grant still valid at its end counts.
                    if g.is_valid() {
                        entries.push((k, m.member().to_owned(), g.token(), start, Instant::now()));
                    }
                    drop(g);
                }
                log.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .extend(entries);
                tokio::task::yield_now().await;
            }
        })
    };
    let add = |name: &str, members: &mut BTreeMap<_, _>, m: Member| {
        let m = Arc::new(m);
        let h = spawn_worker(m.clone(), log.clone(), stop.clone());
        members.insert(name.to_owned(), (m, h));
    };
    for name in ["m0", "m1", "m2"] {
        let m = join(ctx, name).await?;
        add(name, &mut members, m);
    }
    let wait = |members: &BTreeMap<String, (Arc<Member>, tokio::task::JoinHandle<()>)>| {
        members.values().map(|(m, _)| m.clone()).collect::<Vec<_>>()
    };
    {
        let ms = wait(&members);
        let refs: Vec<&Member> = ms.iter().map(|m| m.as_ref()).collect();
        converged(ctx, &refs, 3).await?;
    }
    // Join two, leave one gracefully, crash one.
    for name in ["m3", "m4"] {
        let m = join(ctx, name).await?;
        add(name, &mut members, m);
    }
    {
        let ms = wait(&members);
        let refs: Vec<&Member> = ms.iter().map(|m| m.as_ref()).collect();
        converged(ctx, &refs, 5).await?;
    }
    if let Some((m, h)) = members.remove("m1") {
        h.abort();
        let _ = h.await;
        let m = Arc::try_unwrap(m).map_err(|_| Failure::new("m1 still shared"))?;
        m.leave().await.during("leave of m1")?;
    }
    if let Some((m, h)) = members.remove("m3") {
        h.abort();
        let _ = h.await;
        drop(m);
    }
    {
        let ms = wait(&members);
        let refs: Vec<&Member> = ms.iter().map(|m| m.as_ref()).collect();
        converged(ctx, &refs, 3).await?;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for (_, (m, h)) in std::mem::take(&mut members) {
        let _ = h.await;
        if let Ok(m) = Arc::try_unwrap(m) {
            m.leave().await.during("final leave")?;
        }
    }
    let log = std::mem::take(&mut *log.lock().unwrap_or_else(PoisonError::into_inner));
    ensure!(!log.is_empty(), "no work was recorded");
    let mut by_key: BTreeMap<u32, Vec<&Entry>> = BTreeMap::new();
    let mut epoch_owner: BTreeMap<(u32, FencingToken), &str> = BTreeMap::new();
    for e in &log {
        by_key.entry(e.0).or_default().push(e);
        if let Some(prev) = epoch_owner.insert((e.0, e.2), &e.1) {
            ensure!(
                prev == e.1,
                "key {} granted to {prev} and {} in epoch {}",
                e.0,
                e.1,
                e.2
            );
        }
    }
    for (k, mut entries) in by_key {
        entries.sort_by_key(|e| e.3);
        for w in entries.windows(2) {
            let (x, y) = (w[0], w[1]);
            ensure!(
                x.1 == y.1 || x.4 <= y.3,
                "key {k}: {} (epoch {}) held it until {:?} after {} (epoch {}) took it",
                x.1,
                x.2,
                x.4 - y.3,
                y.1,
                y.2
            );
        }
    }
    ctx.cleanup().await
}

/// Bad TTLs, member ids, group names and slot limits: `InvalidArgument` at join.
pub async fn group_bad_config_rejected(ctx: &Ctx) -> CaseResult {
    let store: DynStore = ctx.store.clone();
    for (what, cfg) in [
        ("zero TTL", config(ctx, "x")?.with_ttl(Duration::ZERO)),
        (
            "1 ms TTL",
            config(ctx, "x")?.with_ttl(Duration::from_millis(1)),
        ),
        (
            "a 10-day TTL",
            config(ctx, "x")?.with_ttl(Duration::from_secs(864_000)),
        ),
        ("a member id with a space", config(ctx, "a b")?),
        ("an empty member id", config(ctx, "")?),
        ("zero slots", config(ctx, "x")?.with_max_slots(0)),
    ] {
        expect_kind(
            &format!("join with {what}"),
            Group::join(store.clone(), cfg).await.map(|_| ()),
            ErrorKind::InvalidArgument,
        )?;
    }
    let min = ctx.caps().min_ttl;
    if min > Duration::from_millis(30) {
        expect_kind(
            "join with a TTL below the store's shortest lease",
            Group::join(store.clone(), config(ctx, "x")?.with_ttl(min / 2))
                .await
                .map(|_| ()),
            ErrorKind::InvalidArgument,
        )?;
    }
    expect_kind(
        "join with a bad group name",
        Group::join(
            store.clone(),
            GroupConfig::new("bad group", ttl(ctx)).with_prefix("hct"),
        )
        .await
        .map(|_| ()),
        ErrorKind::InvalidArgument,
    )?;
    ctx.cleanup().await
}

/// Members `a` and `b` joined and converged on two live slots; returns them and their epoch.
async fn active_pair(ctx: &Ctx) -> Result<(Member, Member, u64), Failure> {
    let a = join(ctx, "a").await?;
    let b = join(ctx, "b").await?;
    let epoch = converged(ctx, &[&a, &b], 2).await?;
    Ok((a, b, epoch))
}

async fn leave_both(a: Member, b: Member) -> CaseResult {
    a.leave().await.during("leave a")?;
    b.leave().await.during("leave b")
}

/// A foreign value in slot 0: the members skip it, take slots 1 and 2, and leave it alone.
pub async fn group_foreign_slot_left_alone(ctx: &Ctx) -> CaseResult {
    let slot0 = ctx.key("slot:0");
    ensure!(
        ctx.store
            .compare_and_set(&slot0, None, "garbage", None)
            .await
            .during("write garbage to slot 0")?,
        "slot 0 was not absent"
    );
    let (a, b, _) = active_pair(ctx).await?;
    let slots: BTreeSet<_> = [&a, &b]
        .iter()
        .filter_map(|m| m.assignment().slot)
        .collect();
    ensure_eq!(
        slots,
        BTreeSet::from([1, 2]),
        "slots next to a foreign slot 0"
    );
    ensure_eq!(
        ctx.store
            .get(&slot0)
            .await
            .during("read slot 0")?
            .as_deref(),
        Some("garbage"),
        "the foreign value is left alone"
    );
    exactly_one_owner(&[&a, &b], 100)?;
    leave_both(a, b).await?;
    ctx.cleanup().await
}

/// Garbage in the view before anyone joins: the members replace it and converge.
pub async fn group_garbled_view_replaced(ctx: &Ctx) -> CaseResult {
    let view = ctx.key("view:current");
    ctx.store
        .compare_and_set(&view, None, "{not a view", None)
        .await
        .during("write garbage to the view")?;
    let (a, b, epoch) = active_pair(ctx).await?;
    ensure!(epoch >= 1, "epoch {epoch}");
    ensure!(
        ctx.store
            .get(&view)
            .await
            .during("read the view")?
            .as_deref()
            != Some("{not a view"),
        "the garbage view was not replaced"
    );
    exactly_one_owner(&[&a, &b], 100)?;
    leave_both(a, b).await?;
    ctx.cleanup().await
}

/// The view overwritten by hand while members are active, then a join: the new view's epoch is
/// above every epoch the members acted on, although the joiner never saw the old view; a leave
/// raises it again.
pub async fn group_overwritten_view_epoch_rises(ctx: &Ctx) -> CaseResult {
    let store: DynStore = ctx.store.clone();
    let view = ctx.key("view:current");
    let (a, b, epoch) = active_pair(ctx).await?;
    let current = store.get(&view).await.during("read the view")?;
    ensure!(
        store
            .compare_and_set(&view, current.as_deref(), "garbage", None)
            .await
            .during("overwrite the view")?,
        "the view changed under the case"
    );
    let c = join(ctx, "c").await?;
    let epoch = {
        let e = converged(ctx, &[&a, &b, &c], 3).await?;
        ensure!(
            e > epoch,
            "epoch after the view was overwritten {e} is not above {epoch}"
        );
        e
    };
    c.leave().await.during("leave c")?;
    let e = converged(ctx, &[&a, &b], 2).await?;
    ensure!(e > epoch, "epoch after c left {e} is not above {epoch}");
    leave_both(a, b).await?;
    ctx.cleanup().await
}

/// The same member id again while `a` lives: `Rejected` within about a TTL, and `a` stays
/// active.
pub async fn group_twin_member_rejected(ctx: &Ctx) -> CaseResult {
    let (a, b, _) = active_pair(ctx).await?;
    let started = Instant::now();
    expect_kind(
        "join with the member id of a live member",
        join_raw(ctx, "a").await,
        ErrorKind::Rejected,
    )?;
    let bound = ctx.caps().effective_ttl(ttl(ctx)) + ttl(ctx) + Duration::from_secs(5);
    ensure!(
        started.elapsed() <= bound,
        "refusing a twin took {:?}, more than {bound:?}",
        started.elapsed()
    );
    ensure_eq!(
        a.assignment().phase,
        GroupPhase::Active,
        "a after the twin was refused"
    );
    leave_both(a, b).await?;
    ctx.cleanup().await
}

/// A member's slot overwritten by hand: it stops, claims again under a newer epoch, and every
/// key has one owner again.
pub async fn group_overwritten_slot_reclaimed(ctx: &Ctx) -> CaseResult {
    let store: DynStore = ctx.store.clone();
    let (a, b, epoch) = active_pair(ctx).await?;
    let b_slot = b
        .assignment()
        .slot
        .ok_or_else(|| Failure::new("b has no slot"))?;
    let b_key = ctx.key(&format!("slot:{b_slot}"));
    let current = store.get(&b_key).await.during("read b's slot")?;
    store
        .compare_and_set(
            &b_key,
            current.as_deref(),
            "overwritten",
            Some(ttl(ctx) * 4),
        )
        .await
        .during("overwrite b's slot")?;
    let what = format!("b left its overwritten slot {b_slot} for a newer epoch than {epoch}");
    wait::until(&what, converge_within(ctx), wait::EVERY, || async {
        let now = b.assignment();
        if now.slot == Some(b_slot) || now.epoch <= epoch {
            Err(now)
        } else {
            Ok(())
        }
    })
    .await
    .map_err(Failure::new)?;
    let after = converged(ctx, &[&a, &b], 2).await?;
    ensure!(
        after > epoch,
        "epoch after b reclaimed {after} is not above {epoch}"
    );
    exactly_one_owner(&[&a, &b], 100)?;
    leave_both(a, b).await?;
    ctx.cleanup().await
}

async fn join_raw(ctx: &Ctx, member: &str) -> headcount::Result<()> {
    let cfg = config(ctx, member).map_err(|f| headcount::Error::invalid(f.to_string()))?;
    Group::join(ctx.store.clone(), cfg).await.map(|_| ())
}
