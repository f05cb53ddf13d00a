//! `set_max`: set if the stored number is less.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::time::Instant;

use super::{concurrently, expect_expiry, put, SHORT_TTL};
use crate::{ensure, ensure_eq, CaseResult, Ctx, Failure, ResultExt};

/// `set_max` on an absent key writes (negative numbers too), and so it does on an expired key.
pub async fn set_max_from_absent(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("k");
    ensure_eq!(
        store.set_max(&k, 5, None).await.during("set_max")?,
        true,
        "set_max(5) on an absent key"
    );
    ensure_eq!(store.get(&k).await.during("get")?, Some("5".into()), "get");
    let negative = ctx.key("negative");
    ensure_eq!(
        store.set_max(&negative, -5, None).await.during("set_max")?,
        true,
        "set_max(-5) on an absent key"
    );
    ensure_eq!(
        store.get(&negative).await.during("get")?,
        Some("-5".into()),
        "get"
    );
    let expired = ctx.key("expired");
    let (sent, done) = put(ctx, &expired, "100", Some(SHORT_TTL)).await?;
    expect_expiry(ctx, &expired, "100", sent, done, SHORT_TTL).await?;
    ensure_eq!(
        store.set_max(&expired, 1, None).await.during("set_max")?,
        true,
        "set_max(1) over an expired 100"
    );
    ensure_eq!(
        store.get(&expired).await.during("get")?,
        Some("1".into()),
        "get"
    );
    Ok(())
}

/// `set_max` writes only a number larger than the stored one, and applies its TTL when it writes.
pub async fn set_max_smaller_equal_larger(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("k");
    put(ctx, &k, "10", None).await?;
    for (value, wrote, after) in [(5, false, "10"), (10, false, "10"), (-20, false, "10")] {
        ensure_eq!(
            store.set_max(&k, value, None).await.during("set_max")?,
            wrote,
            "set_max({value}) on 10"
        );
        ensure_eq!(
            store.get(&k).await.during("get")?,
            Some(after.to_owned()),
            "get after set_max({value}) on 10"
        );
    }
    let sent = Instant::now();
    ensure_eq!(
        store
            .set_max(&k, 11, Some(SHORT_TTL))
            .await
            .during("set_max")?,
        true,
        "set_max(11, with a TTL) on 10"
    );
    let done = Instant::now();
    expect_expiry(ctx, &k, "11", sent, done, SHORT_TTL).await?;
    Ok(())
}

/// `set_max` judges the value the key holds now, whatever wrote it since the last `set_max`
/// (a backend may remember what it wrote, as etcd's does to save a read): after another write
/// lowered the key it still raises it, after one raised it past the proposal it writes nothing,
/// and after a delete it creates the key; raising its own last write, it applies its TTL.
pub async fn set_max_after_other_writes(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = &ctx.key("k");
    let set_max = |value: i64| async move {
        store
            .set_max(k, value, None)
            .await
            .during(format!("set_max({value})"))
    };
    let cas = |from: &'static str, to: &'static str| async move {
        store
            .compare_and_set(k, Some(from), to, None)
            .await
            .during(format!("compare_and_set({from:?} -> {to:?})"))
    };
    let value = || async { store.get(k).await.during("get") };
    ensure_eq!(set_max(10).await?, true, "set_max(10) on an absent key");
    ensure_eq!(cas("10", "3").await?, true, "lowering 10 to 3");
    ensure_eq!(
        set_max(5).await?,
        true,
        "set_max(5) after 10 was lowered to 3"
    );
    ensure_eq!(value().await?, Some("5".into()), "after set_max(5) over 3");
    ensure_eq!(cas("5", "50").await?, true, "raising 5 to 50");
    ensure_eq!(
        set_max(20).await?,
        false,
        "set_max(20) after 5 was raised to 50"
    );
    ensure_eq!(
        value().await?,
        Some("50".into()),
        "after set_max(20) over 50"
    );
    ensure_eq!(set_max(60).await?, true, "set_max(60) over 50");
    ensure_eq!(store.delete(k).await.during("delete")?, true, "delete");
    ensure_eq!(set_max(1).await?, true, "set_max(1) after 60 was deleted");
    ensure_eq!(
        value().await?,
        Some("1".into()),
        "after set_max(1) over nothing"
    );
    ensure_eq!(store.delete(k).await.during("delete")?, true, "delete");
    ensure_eq!(set_max(70).await?, true, "set_max(70) after 1 was deleted");
    ensure_eq!(
        value().await?,
        Some("70".into()),
        "after set_max(70) over nothing"
    );
    // Raising its own last write again, with a TTL this time: the TTL applies.
    let sent = Instant::now();
    ensure_eq!(
        store
            .set_max(k, 80, Some(SHORT_TTL))
            .await
            .during("set_max(80, with a TTL)")?,
        true,
        "set_max(80, with a TTL) over 70"
    );
    let done = Instant::now();
    expect_expiry(ctx, k, "80", sent, done, SHORT_TTL).await?;
    Ok(())
}

/// Under many tasks proposing random numbers with `set_max`, the stored number never goes
/// backwards (each task's reads, and a watcher's, are non-decreasing and at least what the task
/// proposed last) and ends at the largest proposal.
pub async fn set_max_concurrent_monotonic(ctx: &Ctx) -> CaseResult {
    const TASKS: usize = 16;
    const EACH: usize = 25;
    let k = ctx.key("k");
    let proposals: Vec<Vec<i64>> = (0..TASKS)
        .map(|_| {
            (0..EACH)
                .map(|_| rand::random_range(0..1_000_000))
                .collect()
        })
        .collect();
    let max = proposals.iter().flatten().copied().max().unwrap_or(0);

    let done = Arc::new(AtomicBool::new(false));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let watcher = {
        let store = ctx.store.clone();
        let k = k.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut last = i64::MIN;
            let mut reads = 0usize;
            let mut started_tx = Some(started_tx);
            loop {
                let finished = done.load(Ordering::Relaxed);
                if let Some(text) = store.get(&k).await.during("watcher: get")? {
                    let n = parse(&k, &text)?;
                    ensure!(
                        n >= last,
                        "the watcher read {n} after {last}: set_max went backwards"
                    );
                    last = n;
                }
                reads += 1;
                if let Some(tx) = started_tx.take() {
                    let _ = tx.send(());
                }
                if finished {
                    return Ok::<_, Failure>(reads);
                }
            }
        })
    };
    // Writers start once the watcher is reading, so it watches them.
    let _ = started.await;

    let writers = concurrently(TASKS, |t| {
        let store = ctx.store.clone();
        let k = k.clone();
        let mine = proposals.get(t).cloned().unwrap_or_default();
        async move {
            let mut last = i64::MIN;
            for v in mine {
                store
                    .set_max(&k, v, None)
                    .await
                    .during(format!("task {t}: set_max({v})"))?;
                let text = store.get(&k).await.during(format!("task {t}: get"))?;
                let Some(text) = text else {
                    return Err(Failure::new(format!(
                        "task {t}: {k:?} absent right after set_max({v})"
                    )));
                };
                let n = parse(&k, &text)?;
                ensure!(
                    n >= v,
                    "task {t}: read {n} right after set_max({v}): smaller than the proposal"
                );
                ensure!(
                    n >= last,
                    "task {t}: read {n} after {last}: set_max went backwards"
                );
                last = n;
            }
            Ok::<_, Failure>(())
        }
    })
    .await;
    done.store(true, Ordering::Relaxed);
    let watched = watcher
        .await
        .map_err(|e| Failure::new(format!("watcher died: {e}")))?;
    writers?;
    watched?;
    ensure_eq!(
        ctx.store.get(&k).await.during("get")?,
        Some(max.to_string()),
        "final value (the largest of {} proposals)",
        TASKS * EACH
    );
    Ok(())
}

fn parse(key: &str, text: &str) -> Result<i64, Failure> {
    text.parse()
        .map_err(|_| Failure::new(format!("{key:?} holds {text:?}, not a number")))
}
