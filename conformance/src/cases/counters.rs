//! `incr`: from absent, from expired, TTL on create, and exactness under concurrency.

use std::time::Duration;

use tokio::time::Instant;

use super::{concurrently, expect_expiry, SHORT_TTL};
use crate::{ensure, ensure_eq, CaseResult, Ctx, Failure, ResultExt};

/// `incr` on an absent key returns 1, then 2, and the value reads back as decimal text.
pub async fn incr_from_absent(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("counter");
    ensure_eq!(store.incr(&k, None).await.during("incr")?, 1, "first incr");
    ensure_eq!(store.incr(&k, None).await.during("incr")?, 2, "second incr");
    ensure_eq!(
        store.get(&k).await.during("get")?,
        Some("2".to_owned()),
        "get after two incrs"
    );
    Ok(())
}

/// `incr` on an expired key counts from 0 again.
pub async fn incr_from_expired(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("counter");
    let sent = Instant::now();
    ensure_eq!(
        store.incr(&k, Some(SHORT_TTL)).await.during("incr")?,
        1,
        "first incr"
    );
    ensure_eq!(store.incr(&k, None).await.during("incr")?, 2, "second incr");
    let done = Instant::now();
    expect_expiry(ctx, &k, "2", sent, done, SHORT_TTL).await?;
    ensure_eq!(
        store.incr(&k, None).await.during("incr after expiry")?,
        1,
        "first incr after the key expired"
    );
    ensure_eq!(
        store.get(&k).await.during("get")?,
        Some("1".to_owned()),
        "get after the incr that recreated the key"
    );
    Ok(())
}

/// `incr` sets the TTL only when it creates the key: later calls with `None` or a longer TTL do
/// not refresh it.
pub async fn incr_ttl_set_on_create(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("counter");
    let ttl = Duration::from_secs(1);
    let effective = ctx.caps().effective_ttl(ttl);
    let sent = Instant::now();
    ensure_eq!(
        store.incr(&k, Some(ttl)).await.during("incr")?,
        1,
        "first incr"
    );
    let done = Instant::now();
    ensure_eq!(
        store.incr(&k, None).await.during("incr with None")?,
        2,
        "second incr (ttl None)"
    );
    ensure_eq!(
        store
            .incr(&k, Some(Duration::from_secs(60)))
            .await
            .during("incr with 60 s")?,
        3,
        "third incr (ttl 60 s)"
    );
    ensure!(
        Instant::now() < sent + effective,
        "three incrs took {:?}, longer than the {effective:?} TTL under test: the store is too slow for this case",
        sent.elapsed()
    );
    // Had either later incr refreshed the TTL, the key would outlive the first one's deadline.
    expect_expiry(ctx, &k, "3", sent, done, ttl).await?;
    Ok(())
}

/// 50 concurrent tasks × 100 `incr` return exactly 1..=5000: no gap, no repeat.
pub async fn incr_50x100_exact(ctx: &Ctx) -> CaseResult {
    const TASKS: usize = 50;
    const EACH: usize = 100;
    let k = ctx.key("counter");
    let per_task = concurrently(TASKS, |t| {
        let store = ctx.store.clone();
        let k = k.clone();
        async move {
            let mut got = Vec::with_capacity(EACH);
            for i in 0..EACH {
                got.push(
                    store
                        .incr(&k, None)
                        .await
                        .during(format!("task {t}, incr #{i}"))?,
                );
            }
            Ok::<_, Failure>(got)
        }
    })
    .await?;
    let mut all: Vec<i64> = per_task.into_iter().flatten().collect();
    all.sort_unstable();
    let total = i64::try_from(TASKS * EACH).unwrap_or(i64::MAX);
    for (want, got) in (1..=total).zip(all.iter().copied()) {
        ensure!(
            got == want,
            "sorted results of {total} concurrent incrs differ from 1..={total} at position {want}: \
             found {got} (a {} there)",
            if got < want { "repeat" } else { "gap" }
        );
    }
    ensure_eq!(all.len(), TASKS * EACH, "number of incr results");
    ensure_eq!(
        ctx.store.get(&k).await.during("get")?,
        Some(total.to_string()),
        "final value"
    );
    Ok(())
}
