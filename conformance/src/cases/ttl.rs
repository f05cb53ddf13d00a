//! TTLs on the store's clock, and `expire`.

use std::time::Duration;

use tokio::time::Instant;

use super::{expect_expiry, put, sleep_past, SHORT_TTL};
use crate::{ensure, ensure_eq, CaseResult, Ctx, ResultExt};

/// A key written with a TTL is visible to every read that completes before `write_sent + ttl`
/// and gone for every read sent after `write_completed + ttl + tolerance` (see
/// [`Ctx::tolerance`]), for a key written by CAS and one created by `incr`.
pub async fn ttl_on_store_clock(ctx: &Ctx) -> CaseResult {
    let ttl = Duration::from_secs(1);
    let by_cas = async {
        let k = ctx.key("cas");
        let (sent, done) = put(ctx, &k, "v", Some(ttl)).await?;
        expect_expiry(ctx, &k, "v", sent, done, ttl).await
    };
    let by_incr = async {
        let k = ctx.key("incr");
        let sent = Instant::now();
        let n = ctx.store.incr(&k, Some(ttl)).await.during("incr")?;
        let done = Instant::now();
        ensure_eq!(n, 1, "first incr");
        expect_expiry(ctx, &k, "1", sent, done, ttl).await
    };
    let (by_cas, by_incr) = futures::join!(by_cas, by_incr);
    for (what, seen) in [("CAS", by_cas?), ("incr", by_incr?)] {
        ensure!(
            seen.reads_within_ttl > 0,
            "no read of the {what} key completed within its TTL of {ttl:?}, so nothing showed \
             the key was visible: the store is too slow for this case"
        );
    }
    Ok(())
}

/// `expire` on an absent key, and on an expired one, returns false and creates nothing.
pub async fn expire_absent(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("never");
    ensure_eq!(
        store
            .expire(&k, Duration::from_secs(10))
            .await
            .during("expire")?,
        false,
        "expire on an absent key"
    );
    ensure_eq!(
        store.get(&k).await.during("get")?,
        None,
        "get after expire on an absent key"
    );
    let k = ctx.key("expired");
    let (sent, done) = put(ctx, &k, "v", Some(SHORT_TTL)).await?;
    expect_expiry(ctx, &k, "v", sent, done, SHORT_TTL).await?;
    ensure_eq!(
        store
            .expire(&k, Duration::from_secs(10))
            .await
            .during("expire")?,
        false,
        "expire on an expired key"
    );
    ensure_eq!(
        store.get(&k).await.during("get")?,
        None,
        "get after expire on an expired key"
    );
    Ok(())
}

/// `expire` on a live key returns true and replaces its TTL: it extends a short one, and gives a
/// key that had none one.
pub async fn expire_live_extends(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let extend = async {
        let k = ctx.key("extended");
        let (_, done) = put(ctx, &k, "a", Some(SHORT_TTL)).await?;
        ensure_eq!(
            store
                .expire(&k, Duration::from_secs(60))
                .await
                .during("expire")?,
            true,
            "expire(60 s) on a live key"
        );
        sleep_past(done + ctx.caps().effective_ttl(SHORT_TTL) + ctx.tolerance()).await;
        ensure_eq!(
            store.get(&k).await.during("get")?,
            Some("a".to_owned()),
            "get after the original TTL passed (expire should have extended it)"
        );
        Ok(())
    };
    let shorten = async {
        let k = ctx.key("persistent");
        put(ctx, &k, "b", None).await?;
        let sent = Instant::now();
        ensure_eq!(
            store.expire(&k, SHORT_TTL).await.during("expire")?,
            true,
            "expire on a key without TTL"
        );
        let done = Instant::now();
        expect_expiry(ctx, &k, "b", sent, done, SHORT_TTL).await?;
        Ok(())
    };
    let (extend, shorten) = futures::join!(extend, shorten);
    extend.and(shorten)
}

/// `list_with_ttl` lists what `list` lists, with each key's time left: within (0, ttl] for a
/// key written or renewed with a TTL, `None` for one without; the time left goes down, and a
/// renewal sets it back up. A store without TTL reads says so in its capabilities and answers
/// `Unsupported`, noted on stderr.
pub async fn list_with_ttl_counts_down(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let dir = ctx.key("left:");
    if !ctx.caps().ttl_reads {
        let e = store.list_with_ttl(&dir).await;
        ensure!(
            matches!(e, Err(headcount::Error::Unsupported { .. })),
            "ttl_reads is false, yet list_with_ttl answered {e:?}"
        );
        eprintln!(
            "NOTE list_with_ttl_counts_down: the {} backend does not read TTLs (ttl_reads is false)",
            ctx.caps().backend
        );
        return Ok(());
    }
    let ttl = Duration::from_secs(10);
    let most = ctx.caps().effective_ttl(ttl);
    let (written, renewed, forever) = (ctx.key("left:a"), ctx.key("left:b"), ctx.key("left:c"));
    put(ctx, &written, "a", Some(ttl)).await?;
    put(ctx, &renewed, "b", Some(Duration::from_secs(2))).await?;
    ensure!(
        store.expire(&renewed, ttl).await.during("expire")?,
        "expire on a live key"
    );
    put(ctx, &forever, "c", None).await?;
    put(ctx, &ctx.key("other:d"), "d", Some(ttl)).await?;
    let left_of = |listed: &[(String, String, Option<Duration>)], key: &str| {
        listed
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, _, left)| *left)
    };
    let listed = store.list_with_ttl(&dir).await.during("list_with_ttl")?;
    let plain = store.list(&dir).await.during("list")?;
    ensure_eq!(
        listed
            .iter()
            .map(|(k, v, _)| (k.clone(), v.clone()))
            .collect::<Vec<_>>(),
        plain,
        "list_with_ttl lists what list lists"
    );
    ensure_eq!(
        left_of(&listed, &forever),
        Some(None),
        "a key without a TTL"
    );
    let mut first = Duration::ZERO;
    for key in [&written, &renewed] {
        let left = left_of(&listed, key).flatten();
        ensure!(
            left.is_some_and(|l| l > Duration::ZERO && l <= most),
            "{key} was given {ttl:?} (at most {most:?} on this backend); time left: {left:?}"
        );
        if key == &written {
            first = left.unwrap_or_default();
        }
    }
    // Down: etcd counts whole seconds, so this takes a second there. The
    // step must be larger than the time a renewal and a listing take, or a
    // millisecond-granular backend can list the renewed key a millisecond
    // below where it stood before (9.999 s after 9.999 s, as CI once saw).
    let step = Duration::from_millis(250);
    let later = crate::wait::until(
        "the time left to go down",
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async {
            let listed = store.list_with_ttl(&dir).await;
            match listed.map(|l| left_of(&l, &written).flatten()) {
                Ok(Some(left)) if left + step <= first => Ok(left),
                other => Err(other),
            }
        },
    )
    .await
    .map_err(crate::Failure::new)?;
    ensure!(later > Duration::ZERO, "{written} live, yet 0 left");
    // And back up on a renewal.
    ensure!(
        store.expire(&written, ttl).await.during("expire")?,
        "expire on a live key"
    );
    let listed = store.list_with_ttl(&dir).await.during("list_with_ttl")?;
    let renewed_left = left_of(&listed, &written).flatten();
    ensure!(
        renewed_left.is_some_and(|l| l > later && l <= most),
        "renewed with {ttl:?}: time left {renewed_left:?}, {later:?} before the renewal"
    );
    Ok(())
}
