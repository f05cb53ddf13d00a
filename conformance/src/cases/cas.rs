//! `compare_and_set`.

use std::time::Duration;

use super::{concurrently, expect_expiry, put, sleep_past, SHORT_TTL};
use crate::{ensure_eq, CaseResult, Ctx, Failure, ResultExt};

/// CAS with `expected = None` writes only when the key is absent.
pub async fn cas_when_absent(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("k");
    ensure_eq!(
        store
            .compare_and_set(&k, None, "a", None)
            .await
            .during("cas")?,
        true,
        "CAS(None -> a) on an absent key"
    );
    ensure_eq!(store.get(&k).await.during("get")?, Some("a".into()), "get");
    ensure_eq!(
        store
            .compare_and_set(&k, None, "b", None)
            .await
            .during("cas")?,
        false,
        "CAS(None -> b) on a live key"
    );
    ensure_eq!(
        store.get(&k).await.during("get")?,
        Some("a".into()),
        "get after the failed CAS"
    );
    Ok(())
}

/// CAS with the current value writes, also when the new value is the same.
pub async fn cas_when_equal(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("k");
    put(ctx, &k, "a", None).await?;
    ensure_eq!(
        store
            .compare_and_set(&k, Some("a"), "b", None)
            .await
            .during("cas")?,
        true,
        "CAS(a -> b) on a"
    );
    ensure_eq!(store.get(&k).await.during("get")?, Some("b".into()), "get");
    ensure_eq!(
        store
            .compare_and_set(&k, Some("b"), "b", None)
            .await
            .during("cas")?,
        true,
        "CAS(b -> b) on b"
    );
    ensure_eq!(store.get(&k).await.during("get")?, Some("b".into()), "get");
    Ok(())
}

/// CAS with another value than the stored one, or with a value on an absent key, writes nothing.
pub async fn cas_when_different(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("k");
    put(ctx, &k, "a", None).await?;
    ensure_eq!(
        store
            .compare_and_set(&k, Some("x"), "b", None)
            .await
            .during("cas")?,
        false,
        "CAS(x -> b) on a"
    );
    ensure_eq!(
        store
            .compare_and_set(&k, Some(""), "b", None)
            .await
            .during("cas")?,
        false,
        "CAS(\"\" -> b) on a"
    );
    ensure_eq!(
        store.get(&k).await.during("get")?,
        Some("a".into()),
        "get after failed CASes"
    );
    let absent = ctx.key("absent");
    ensure_eq!(
        store
            .compare_and_set(&absent, Some("a"), "b", None)
            .await
            .during("cas")?,
        false,
        "CAS(a -> b) on an absent key"
    );
    ensure_eq!(
        store.get(&absent).await.during("get")?,
        None,
        "get of the absent key after a failed CAS"
    );
    Ok(())
}

/// Over an expired key, CAS with `expected = None` succeeds and CAS with the expired value fails.
pub async fn cas_absent_over_expired(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("k");
    let (sent, done) = put(ctx, &k, "a", Some(SHORT_TTL)).await?;
    expect_expiry(ctx, &k, "a", sent, done, SHORT_TTL).await?;
    ensure_eq!(
        store
            .compare_and_set(&k, Some("a"), "b", None)
            .await
            .during("cas")?,
        false,
        "CAS(a -> b) over an expired a"
    );
    ensure_eq!(
        store.get(&k).await.during("get")?,
        None,
        "get after the failed CAS"
    );
    ensure_eq!(
        store
            .compare_and_set(&k, None, "c", None)
            .await
            .during("cas")?,
        true,
        "CAS(None -> c) over an expired key"
    );
    ensure_eq!(store.get(&k).await.during("get")?, Some("c".into()), "get");
    Ok(())
}

/// Of 32 concurrent CAS on the same expected value exactly one wins and its value is stored; the
/// same for 32 concurrent CAS(None) on an absent key.
pub async fn cas_32_concurrent_one_winner(ctx: &Ctx) -> CaseResult {
    const N: usize = 32;
    let k = ctx.key("k");
    put(ctx, &k, "start", None).await?;
    let fresh = ctx.key("fresh");
    for (key, expected) in [(&k, Some("start")), (&fresh, None)] {
        let results = concurrently(N, |i| {
            let store = ctx.store.clone();
            let key = key.clone();
            async move {
                let wrote = store
                    .compare_and_set(&key, expected, &format!("w{i}"), None)
                    .await
                    .during(format!("task {i}: cas"))?;
                Ok::<_, Failure>(wrote)
            }
        })
        .await?;
        let winners: Vec<usize> = results
            .iter()
            .enumerate()
            .filter_map(|(i, &won)| won.then_some(i))
            .collect();
        let [winner] = winners[..] else {
            return Err(Failure::new(format!(
                "{N} concurrent CAS({expected:?} -> w<i>) on {key:?}: winners {winners:?}, expected exactly one"
            )));
        };
        let winner = format!("w{winner}");
        ensure_eq!(
            ctx.store.get(key).await.during("get")?,
            Some(winner),
            "value after the race on {key:?}"
        );
    }
    Ok(())
}

/// CAS with `ttl = None` removes a previous expiry (the key outlives its old TTL), and CAS with a
/// TTL gives one to a key that had none.
pub async fn cas_ttl_none_persists(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("k");
    let (_, done) = put(ctx, &k, "a", Some(SHORT_TTL)).await?;
    ensure_eq!(
        store
            .compare_and_set(&k, Some("a"), "b", None)
            .await
            .during("cas")?,
        true,
        "CAS(a -> b, ttl None) on a live key"
    );
    sleep_past(done + ctx.caps().effective_ttl(SHORT_TTL) + ctx.tolerance()).await;
    ensure_eq!(
        store.get(&k).await.during("get")?,
        Some("b".into()),
        "get after the first TTL passed (CAS with ttl None should have removed it)"
    );
    let sent = tokio::time::Instant::now();
    ensure_eq!(
        store
            .compare_and_set(&k, Some("b"), "c", Some(SHORT_TTL))
            .await
            .during("cas")?,
        true,
        "CAS(b -> c, with a TTL) on a key without one"
    );
    let done = tokio::time::Instant::now();
    expect_expiry(ctx, &k, "c", sent, done, SHORT_TTL).await?;
    Ok(())
}

/// compare_and_delete removes the key only when it holds the expected value, at once, and never
/// a value written after the one it expected.
pub async fn compare_and_delete_only_expected(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    ensure_eq!(
        ctx.caps().native_compare_and_delete,
        true,
        "native_compare_and_delete (every headcount backend deletes in one atomic step)"
    );
    let k = ctx.key("k");
    ensure_eq!(
        store
            .compare_and_delete(&k, "a")
            .await
            .during("cad on absent")?,
        false,
        "compare_and_delete on an absent key"
    );
    put(ctx, &k, "a", Some(Duration::from_secs(30))).await?;
    ensure_eq!(
        store.compare_and_delete(&k, "b").await.during("cad(b)")?,
        false,
        "compare_and_delete with another value"
    );
    ensure_eq!(
        store.get(&k).await.during("get")?,
        Some("a".to_owned()),
        "value after a compare_and_delete with another value"
    );
    ensure_eq!(
        store.compare_and_delete(&k, "a").await.during("cad(a)")?,
        true,
        "compare_and_delete with the current value"
    );
    ensure_eq!(
        store.get(&k).await.during("get")?,
        None,
        "value right after a successful compare_and_delete"
    );
    // A late (delayed, repeated) delete of the old value must not remove the next holder's.
    put(ctx, &k, "c", Some(Duration::from_secs(30))).await?;
    ensure_eq!(
        store
            .compare_and_delete(&k, "a")
            .await
            .during("late cad(a)")?,
        false,
        "a late compare_and_delete of the previous value"
    );
    ensure_eq!(
        store.get(&k).await.during("get")?,
        Some("c".to_owned()),
        "the next holder's value after a late compare_and_delete"
    );
    // An expired key is not deleted (it is not there).
    let e = ctx.key("expiring");
    let (sent, done) = put(ctx, &e, "x", Some(SHORT_TTL)).await?;
    expect_expiry(ctx, &e, "x", sent, done, SHORT_TTL).await?;
    ensure_eq!(
        store
            .compare_and_delete(&e, "x")
            .await
            .during("cad on expired")?,
        false,
        "compare_and_delete of an expired key"
    );
    Ok(())
}

/// Of 32 concurrent compare_and_delete calls with the current value, exactly one deletes.
pub async fn compare_and_delete_32_concurrent_one_winner(ctx: &Ctx) -> CaseResult {
    const N: usize = 32;
    let k = ctx.key("k");
    put(ctx, &k, "v", None).await?;
    let results = concurrently(N, |i| {
        let store = ctx.store.clone();
        let key = k.clone();
        async move {
            store
                .compare_and_delete(&key, "v")
                .await
                .during(format!("task {i}: compare_and_delete"))
        }
    })
    .await?;
    let winners = results.iter().filter(|&&w| w).count();
    ensure_eq!(winners, 1, "winners of {N} concurrent compare_and_delete");
    ensure_eq!(
        ctx.store.get(&k).await.during("get")?,
        None,
        "value after the race"
    );
    Ok(())
}
