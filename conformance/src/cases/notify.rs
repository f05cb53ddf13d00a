//! Change notifications ([`Store::subscribe`]): hints, so the cases check what a hint promises
//! on a store that says it notifies (a write under the directory is notified within
//! [`NOTICE_BOUND`], other directories' writes are not delivered, a lost connection is made up
//! for) and that a store that does not notify hands out silent notifications without failing.

use std::time::Duration;

use async_trait::async_trait;
use headcount::backend::Backend;
use headcount::notify::{Notice, Notifications};
use headcount::{Capabilities, DynStore, ErrorKind};
use tokio::time::Instant;

use super::expect_kind;
use crate::{ensure, CaseResult, Ctx, Failure, ResultExt};

/// How soon after a write completes its notification must arrive.
pub const NOTICE_BOUND: Duration = Duration::from_secs(1);

/// How long a subscription may take to become active (it is opened in the background), and to
/// come back after its server restarted (its retries back off).
const ACTIVE_WITHIN: Duration = Duration::from_secs(20);

/// Waits up to `within` for a notice.
async fn notice_within(n: &mut Notifications, within: Duration) -> Option<Notice> {
    tokio::time::timeout(within, n.recv()).await.ok()
}

/// Writes a fresh value at `key` until `n` notices it (a subscription is active some time after
/// `subscribe` returns), within [`ACTIVE_WITHIN`]; then drains what is pending.
async fn until_active(ctx: &Ctx, n: &mut Notifications, key: &str) -> CaseResult {
    let start = Instant::now();
    let mut i = 0u64;
    loop {
        i += 1;
        ctx.store
            .compare_and_set(
                key,
                None,
                &format!("warm-{i}"),
                Some(Duration::from_secs(60)),
            )
            .await
            .during(format!("warming up {key:?}"))?;
        if notice_within(n, Duration::from_millis(200)).await.is_some() {
            break;
        }
        ctx.store.delete(key).await.during("delete")?;
        ensure!(
            start.elapsed() < ACTIVE_WITHIN,
            "no notification of {:?} arrived within {ACTIVE_WITHIN:?} of subscribing, over {i} writes",
            n.dir()
        );
    }
    // Drain the warm-up's notices (its last write, a confirmation).
    while notice_within(n, Duration::from_millis(100)).await.is_some() {}
    Ok(())
}

/// A store that does not notify says so, hands out silent notifications, and fails nothing:
/// the rest of a notification case is skipped for it. Prints a note, so the skip is visible.
async fn silent_store(ctx: &Ctx, case: &str) -> Result<bool, Failure> {
    if ctx.caps().native_notifications {
        return Ok(false);
    }
    let dir = ctx.key("silent:");
    let mut n = ctx.store.subscribe(&dir).await.during("subscribe")?;
    ensure!(
        !n.is_native(),
        "native_notifications is false, yet subscribe handed out notifications that may fire"
    );
    super::put(ctx, &ctx.key("silent:k"), "v", None).await?;
    ensure!(n.try_recv().is_none(), "silent notifications fired");
    eprintln!(
        "NOTE {case}: the {} backend does not notify (native_notifications is false): checked that its notifications stay silent",
        ctx.caps().backend
    );
    Ok(true)
}

/// (a) Every kind of write under a watched directory is notified within [`NOTICE_BOUND`].
pub async fn notify_write_under_dir(ctx: &Ctx) -> CaseResult {
    if silent_store(ctx, "notify_write_under_dir").await? {
        return Ok(());
    }
    let dir = ctx.key("slot:");
    let mut n = ctx.store.subscribe(&dir).await.during("subscribe")?;
    ensure!(
        n.is_native(),
        "native_notifications, yet silent notifications"
    );
    ensure!(n.dir() == dir, "subscribed to {dir:?}, got {:?}", n.dir());
    until_active(ctx, &mut n, &ctx.key("slot:warm")).await?;
    let a = ctx.key("slot:a");
    let c = ctx.key("slot:c");
    let ttl = Some(Duration::from_secs(60));
    let writes = [
        "compare_and_set creating a key",
        "compare_and_set changing a value",
        "compare_and_delete",
        "incr",
        "set_max",
        "delete",
    ];
    let mut took = Vec::new();
    for what in writes {
        while n.try_recv().is_some() {}
        let sent = Instant::now();
        let s = &ctx.store;
        let wrote = match what {
            "compare_and_set creating a key" => s.compare_and_set(&a, None, "m1", ttl).await,
            "compare_and_set changing a value" => {
                s.compare_and_set(&a, Some("m1"), "m2", ttl).await
            }
            "compare_and_delete" => s.compare_and_delete(&a, "m2").await,
            "incr" => s.incr(&c, ttl).await.map(|v| v == 1),
            "set_max" => s.set_max(&c, 10, ttl).await,
            _ => s.delete(&c).await,
        }
        .during(what)?;
        ensure!(wrote, "{what} wrote nothing");
        let done = Instant::now();
        match notice_within(&mut n, NOTICE_BOUND).await {
            Some(_) => took.push((Instant::now() - sent, Instant::now() - done)),
            None => {
                return Err(Failure::new(format!(
                    "{what} under {dir:?} was not notified within {NOTICE_BOUND:?} of completing"
                )))
            }
        }
    }
    let mut from_send: Vec<Duration> = took.iter().map(|t| t.0).collect();
    from_send.sort();
    eprintln!(
        "NOTE notify_write_under_dir on {}: notified {:?} after sending the write (median {:?}, max {:?})",
        ctx.caps().backend,
        from_send,
        from_send[from_send.len() / 2],
        from_send[from_send.len() - 1]
    );
    Ok(())
}

/// (b) Writes under other directories (a sibling, another group's directory of the same name,
/// the parent) are not delivered to a directory's subscribers.
pub async fn notify_other_dirs_not_delivered(ctx: &Ctx) -> CaseResult {
    if silent_store(ctx, "notify_other_dirs_not_delivered").await? {
        return Ok(());
    }
    let other = Ctx::new(ctx.store.clone(), None);
    let result = other_dirs(ctx, &other).await;
    let cleaned = other.cleanup().await;
    result.and(cleaned)
}

async fn other_dirs(ctx: &Ctx, other: &Ctx) -> CaseResult {
    let watched = ctx.key("a:");
    let beside = ctx.key("b:");
    let elsewhere = other.key("a:");
    let mut a = ctx.store.subscribe(&watched).await.during("subscribe")?;
    let mut b = ctx.store.subscribe(&beside).await.during("subscribe")?;
    let mut o = ctx.store.subscribe(&elsewhere).await.during("subscribe")?;
    until_active(ctx, &mut a, &ctx.key("a:warm")).await?;
    until_active(ctx, &mut b, &ctx.key("b:warm")).await?;
    until_active(other, &mut o, &other.key("a:warm")).await?;
    while a.try_recv().is_some() || o.try_recv().is_some() || b.try_recv().is_some() {}
    // Not under `watched`: its parent, a sibling whose name starts alike, another group's
    // directories; then, last, one under `beside`, whose notice says the others had their turn.
    for key in [
        ctx.key("a"),
        ctx.key("ab:k"),
        other.key("b:k"),
        ctx.key("c:k"),
        ctx.key("b:k"),
    ] {
        super::put(ctx, &key, "v", None).await?;
    }
    ensure!(
        notice_within(&mut b, NOTICE_BOUND).await.is_some(),
        "a write under {beside:?} was not notified within {NOTICE_BOUND:?}"
    );
    // The notices of one connection arrive in order; a little more time for a backend whose
    // notices of different directories may be reordered.
    tokio::time::sleep(Duration::from_millis(100)).await;
    ensure!(
        a.try_recv().is_none(),
        "the subscribers of {watched:?} were notified of writes under other directories"
    );
    ensure!(
        o.try_recv().is_none(),
        "the subscribers of another group's {elsewhere:?} were notified of this group's writes"
    );
    // And a write under `watched` still reaches them.
    super::put(ctx, &ctx.key("a:k"), "v", None).await?;
    ensure!(
        notice_within(&mut a, NOTICE_BOUND).await.is_some(),
        "a write under {watched:?} was not notified within {NOTICE_BOUND:?}"
    );
    ensure!(
        o.try_recv().is_none(),
        "the subscribers of another group's {elsewhere:?} were notified of this group's write"
    );
    Ok(())
}

/// A notification lost on purpose (the write made while nobody listened, its notice thrown
/// away) is made up for by the next poll: the directory's version (what a heartbeat compares)
/// changed, and the listing shows the write. On every backend, notifying or not.
pub async fn notify_lost_made_up_by_poll(ctx: &Ctx) -> CaseResult {
    let dir = ctx.key("slot:");
    let me = ctx.key("slot:me");
    let ttl = Duration::from_secs(60);
    super::put(ctx, &me, "m0", Some(ttl)).await?;
    let first = ctx
        .store
        .renew_and_list_if_changed(&me, "m0", ttl, &dir, None)
        .await
        .during("renew_and_list_if_changed")?;
    let mut n = ctx.store.subscribe(&dir).await.during("subscribe")?;
    if n.is_native() {
        until_active(ctx, &mut n, &ctx.key("slot:warm")).await?;
    }
    let polled = ctx
        .store
        .renew_and_list_if_changed(&me, "m0", ttl, &dir, None)
        .await
        .during("renew_and_list_if_changed")?;
    // Lost: one write while unsubscribed, one whose notice is thrown away.
    drop(n);
    super::put(ctx, &ctx.key("slot:a"), "m1", Some(ttl)).await?;
    let mut n = ctx.store.subscribe(&dir).await.during("subscribe")?;
    super::put(ctx, &ctx.key("slot:b"), "m2", Some(ttl)).await?;
    if n.is_native() {
        let _ = notice_within(&mut n, NOTICE_BOUND).await;
    }
    while n.try_recv().is_some() {}
    let next = ctx
        .store
        .renew_and_list_if_changed(&me, "m0", ttl, &dir, Some(&polled.version))
        .await
        .during("the next poll")?;
    ensure!(
        next.renewed,
        "the next poll did not renew its own key (first poll: {first:?})"
    );
    ensure!(
        next.version != polled.version,
        "the next poll saw the same version {:?} after two writes whose notices were lost",
        next.version
    );
    let listed: Vec<&str> = next
        .listing
        .iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    for key in [ctx.key("slot:a"), ctx.key("slot:b")] {
        ensure!(
            listed.contains(&key.as_str()),
            "the next poll's listing {listed:?} lacks {key:?}"
        );
    }
    Ok(())
}

/// (c) After the server restarts (every connection dropped, the subscription's too), the
/// subscription comes back by itself: its subscribers hear that they may have missed changes,
/// and later writes are notified again.
pub async fn notify_resubscribes_after_restart(ctx: &Ctx) -> CaseResult {
    if silent_store(ctx, "notify_resubscribes_after_restart").await? {
        return Ok(());
    }
    let Some(control) = ctx.control.clone() else {
        return Err(Failure::new("no server control"));
    };
    let dir = ctx.key("slot:");
    let mut n = ctx.store.subscribe(&dir).await.during("subscribe")?;
    until_active(ctx, &mut n, &ctx.key("slot:warm")).await?;
    control.kill().await.during("killing the server")?;
    control.start().await.during("starting the server again")?;
    let back = Instant::now();
    let mut missed = false;
    let deadline = back + ACTIVE_WITHIN;
    while !missed && Instant::now() < deadline {
        missed =
            notice_within(&mut n, Duration::from_millis(200)).await == Some(Notice::MayHaveMissed);
    }
    ensure!(
        missed,
        "no MayHaveMissed within {ACTIVE_WITHIN:?} of the server's restart"
    );
    let resubscribed = back.elapsed();
    // The store's own connection notices the restart on its first call (a retryable error):
    // read until it answers, so the writes below are not the calls that find out.
    let key = ctx.key("slot:after");
    while let Err(e) = ctx.store.get(&key).await {
        ensure!(
            e.is_retryable() && Instant::now() < deadline,
            "the store did not answer again within {ACTIVE_WITHIN:?} of the restart: {e}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Later writes are notified again, each within the bound.
    while n.try_recv().is_some() {}
    for i in 0..3 {
        let value = format!("v{i}");
        let expected = (i > 0).then(|| format!("v{}", i - 1));
        let wrote = ctx
            .store
            .compare_and_set(
                &key,
                expected.as_deref(),
                &value,
                Some(Duration::from_secs(60)),
            )
            .await
            .during("compare_and_set after the restart")?;
        ensure!(wrote, "compare_and_set after the restart wrote nothing");
        ensure!(
            notice_within(&mut n, NOTICE_BOUND).await.is_some(),
            "write {i} after the restart was not notified within {NOTICE_BOUND:?}"
        );
    }
    eprintln!(
        "NOTE notify_resubscribes_after_restart on {}: subscribed again {resubscribed:?} after the server was back",
        ctx.caps().backend
    );
    Ok(())
}

/// (d) The provided fallback: notifications that never fire and never fail, whatever is
/// written; and a directory without its final `:` is [`ErrorKind::InvalidArgument`].
pub async fn notify_fallback_silent(ctx: &Ctx) -> CaseResult {
    let plain: DynStore = std::sync::Arc::new(NoNotifications(ctx.store.clone()));
    ensure!(
        !plain.capabilities().native_notifications,
        "a backend without its own subscribe says it notifies"
    );
    let dir = ctx.key("slot:");
    let mut n = plain.subscribe(&dir).await.during("subscribe (fallback)")?;
    ensure!(!n.is_native(), "the fallback's notifications may fire");
    super::put(ctx, &ctx.key("slot:a"), "v", None).await?;
    ctx.store
        .delete(&ctx.key("slot:a"))
        .await
        .during("delete")?;
    ensure!(
        notice_within(&mut n, Duration::from_millis(200))
            .await
            .is_none(),
        "the fallback's notifications fired"
    );
    for store in [&plain, &ctx.store] {
        expect_kind(
            "subscribe to a directory without the final ':'",
            store.subscribe(&ctx.key("slot")).await.map(drop),
            ErrorKind::InvalidArgument,
        )?;
        expect_kind(
            "subscribe to an empty directory",
            store.subscribe("").await.map(drop),
            ErrorKind::InvalidArgument,
        )?;
    }
    Ok(())
}

/// The store under test with only the provided `subscribe`.
#[derive(Debug)]
struct NoNotifications(DynStore);

#[async_trait]
impl Backend for NoNotifications {
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.0.capabilities();
        caps.native_notifications = false;
        caps
    }
    async fn incr(&self, key: &str, ttl: Option<Duration>) -> headcount::Result<i64> {
        self.0.incr(key, ttl).await
    }
    async fn get(&self, key: &str) -> headcount::Result<Option<String>> {
        self.0.get(key).await
    }
    async fn expire(&self, key: &str, ttl: Duration) -> headcount::Result<bool> {
        self.0.expire(key, ttl).await
    }
    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> headcount::Result<bool> {
        self.0.compare_and_set(key, expected, new, ttl).await
    }
    async fn delete(&self, key: &str) -> headcount::Result<bool> {
        self.0.delete(key).await
    }
    async fn list(&self, prefix: &str) -> headcount::Result<Vec<(String, String)>> {
        self.0.list(prefix).await
    }
    async fn list_with_ttl(
        &self,
        prefix: &str,
    ) -> headcount::Result<Vec<(String, String, Option<Duration>)>> {
        self.0.list_with_ttl(prefix).await
    }
}
