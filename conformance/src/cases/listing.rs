//! `list` and `delete`.

use std::time::Duration;

use super::{expect_expiry, put, SHORT_TTL};
use crate::{ensure, ensure_eq, CaseResult, Ctx, Failure, ResultExt};

fn pairs(items: &[(&str, &str)], base: &str) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(k, v)| (format!("{base}{k}"), (*v).to_owned()))
        .collect()
}

async fn list(ctx: &Ctx, prefix: &str) -> Result<Vec<(String, String)>, Failure> {
    ctx.store
        .list(prefix)
        .await
        .during(format!("list({prefix:?})"))
}

/// `list` returns exactly the live keys under the prefix with their values, sorted bytewise:
/// expired keys, keys beside the prefix and a key equal to a shorter prefix are excluded.
pub async fn list_live_under_prefix(ctx: &Ctx) -> CaseResult {
    let base = format!("{}l/", ctx.prefix);
    let gone = ctx.key("l/gone");
    let (sent, done) = put(ctx, &gone, "x", Some(SHORT_TTL)).await?;
    // Bytewise order: 'B' < 'a' < "a/c" < "ab" < 'b' < 'é' (0xC3 0xA9).
    let live = [
        ("b", "2"),
        ("a", "1"),
        ("ab", "3"),
        ("a/c", "4"),
        ("B", "5"),
        ("é", "6"),
    ];
    for (k, v) in live {
        put(ctx, &ctx.key(&format!("l/{k}")), v, None).await?;
    }
    // Outside the prefix: the prefix itself without its last character, a sibling, a longer
    // key that only shares the start.
    for k in ["l", "m/a", "l0"] {
        put(ctx, &ctx.key(k), "out", None).await?;
    }
    expect_expiry(ctx, &gone, "x", sent, done, SHORT_TTL).await?;

    let mut sorted = live;
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    ensure_eq!(
        list(ctx, &base).await?,
        pairs(&sorted, &base),
        "list({base:?})"
    );
    ensure_eq!(
        list(ctx, &format!("{base}a")).await?,
        pairs(&[("a", "1"), ("a/c", "4"), ("ab", "3")], &base),
        "list({base:?} + \"a\")"
    );
    ensure_eq!(
        list(ctx, &format!("{base}zz")).await?,
        Vec::<(String, String)>::new(),
        "list of a prefix with no key"
    );
    ensure_eq!(
        list(ctx, &gone).await?,
        Vec::<(String, String)>::new(),
        "list with the expired key as the prefix"
    );
    Ok(())
}

/// `list` treats pattern characters in the prefix (`%`, `_`, `\`, `[`, `*`, `?`, `'`)
/// literally.
pub async fn list_prefix_is_literal(ctx: &Ctx) -> CaseResult {
    let base = format!("{}p/", ctx.prefix);
    let names = [
        "%x", "_y", "ab", "\\z", "[q]", "*s", "?t", "'u", "a_b", "axb", "a%b",
    ];
    for (i, k) in names.iter().enumerate() {
        put(ctx, &ctx.key(&format!("p/{k}")), &i.to_string(), None).await?;
    }
    let value = |name: &str| {
        names
            .iter()
            .position(|n| *n == name)
            .map(|i| i.to_string())
            .unwrap_or_default()
    };
    for (prefix, want) in [
        ("%", vec!["%x"]),
        ("_", vec!["_y"]),
        ("\\", vec!["\\z"]),
        ("[", vec!["[q]"]),
        ("*", vec!["*s"]),
        ("?", vec!["?t"]),
        ("'", vec!["'u"]),
        ("a_", vec!["a_b"]),
        ("a%", vec!["a%b"]),
        ("a", vec!["a%b", "a_b", "ab", "axb"]),
    ] {
        let want: Vec<(String, String)> = want
            .into_iter()
            .map(|k| (format!("{base}{k}"), value(k)))
            .collect();
        ensure_eq!(
            list(ctx, &format!("{base}{prefix}")).await?,
            want,
            "list({base:?} + {prefix:?})"
        );
    }
    Ok(())
}

/// `delete` returns true for a live key and removes it; false for an absent, an already deleted
/// and an expired key.
pub async fn delete_live_absent_expired(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("live");
    put(ctx, &k, "v", None).await?;
    ensure_eq!(
        store.delete(&k).await.during("delete")?,
        true,
        "delete of a live key"
    );
    ensure_eq!(store.get(&k).await.during("get")?, None, "get after delete");
    ensure_eq!(
        store.delete(&k).await.during("delete")?,
        false,
        "second delete of the same key"
    );
    let absent = ctx.key("absent");
    ensure_eq!(
        store.delete(&absent).await.during("delete")?,
        false,
        "delete of an absent key"
    );
    let expired = ctx.key("expired");
    let (sent, done) = put(ctx, &expired, "v", Some(SHORT_TTL)).await?;
    expect_expiry(ctx, &expired, "v", sent, done, SHORT_TTL).await?;
    ensure_eq!(
        store.delete(&expired).await.during("delete")?,
        false,
        "delete of an expired key"
    );
    let counter = ctx.key("counter");
    store.incr(&counter, None).await.during("incr")?;
    ensure_eq!(
        store.delete(&counter).await.during("delete")?,
        true,
        "delete of a counter"
    );
    ensure_eq!(
        store.incr(&counter, None).await.during("incr")?,
        1,
        "incr after the counter was deleted"
    );
    Ok(())
}

/// The long TTL of keys that must stay for the whole case.
const LONG_TTL: Duration = Duration::from_secs(60);

/// `list` sees what every write primitive wrote under the prefix, and only that: a key written
/// by `incr`, `compare_and_set` (absent and expected), `set_max`, `incr_and_get`, extended by
/// `expire` or renewed by `renew_and_list` is listed, also after its first, short TTL has
/// passed; a deleted key and an expired one are not; keys under a sibling prefix are listed
/// only under theirs.
pub async fn list_follows_every_write(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let base = format!("{}w:", ctx.prefix);
    let sibling = format!("{}w2:", ctx.prefix);
    let k = |name: &str| ctx.key(&format!("w:{name}"));

    store.incr(&k("incr"), None).await.during("incr")?;
    store
        .incr(&k("incr-ttl"), Some(LONG_TTL))
        .await
        .during("incr with a TTL")?;
    put(ctx, &k("cas-absent"), "a", None).await?;
    // Written with a short TTL, then by the primitive under test: each must outlive the short
    // TTL, so the listing must follow the expiry the last write gave.
    put(ctx, &k("cas-expected"), "x", Some(SHORT_TTL)).await?;
    ensure_eq!(
        store
            .compare_and_set(&k("cas-expected"), Some("x"), "y", None)
            .await
            .during("compare_and_set expected")?,
        true,
        "compare_and_set with the current value"
    );
    put(ctx, &k("expire"), "e", Some(SHORT_TTL)).await?;
    ensure_eq!(
        store
            .expire(&k("expire"), LONG_TTL)
            .await
            .during("expire")?,
        true,
        "expire of a live key"
    );
    put(ctx, &k("renew"), "me", Some(SHORT_TTL)).await?;
    let (renewed, listed) = store
        .renew_and_list(&k("renew"), "me", LONG_TTL, &base)
        .await
        .during("renew_and_list")?;
    ensure!(
        renewed && listed.contains(&(k("renew"), "me".to_owned())),
        "renew_and_list by the holder: renewed {renewed}, listing {listed:?}"
    );
    store
        .set_max(&k("set-max"), 7, Some(LONG_TTL))
        .await
        .during("set_max")?;
    store
        .incr_and_get(&k("incr-and-get"), 5, Some(LONG_TTL), &k("cas-absent"))
        .await
        .during("incr_and_get")?;
    put(ctx, &k("deleted"), "d", None).await?;
    ensure_eq!(
        store.delete(&k("deleted")).await.during("delete")?,
        true,
        "delete of a live key"
    );
    for name in ["w2:a", "w2:b"] {
        put(ctx, &ctx.key(name), "sibling", None).await?;
    }
    // Written last with the short TTL: once it is gone, every earlier short TTL has passed.
    let expired = k("expired");
    let (sent, done) = put(ctx, &expired, "z", Some(SHORT_TTL)).await?;
    expect_expiry(ctx, &expired, "z", sent, done, SHORT_TTL).await?;

    let want = pairs(
        &[
            ("cas-absent", "a"),
            ("cas-expected", "y"),
            ("expire", "e"),
            ("incr", "1"),
            ("incr-and-get", "5"),
            ("incr-ttl", "1"),
            ("renew", "me"),
            ("set-max", "7"),
        ],
        &base,
    );
    ensure_eq!(list(ctx, &base).await?, want, "list({base:?})");
    ensure_eq!(
        list(ctx, &sibling).await?,
        pairs(&[("a", "sibling"), ("b", "sibling")], &sibling),
        "list({sibling:?})"
    );
    Ok(())
}

/// `list` of a prefix holding 1,000 keys returns exactly them; after deleting every tenth, exactly
/// the rest.
pub async fn list_thousand_keys_exactly(ctx: &Ctx) -> CaseResult {
    const N: usize = 1000;
    let base = format!("{}n:", ctx.prefix);
    let keys: Vec<String> = (0..N).map(|i| ctx.key(&format!("n:{i:04}"))).collect();
    // Beside the prefix: not listed.
    put(ctx, &ctx.key("n"), "out", None).await?;
    put(ctx, &ctx.key("n0:x"), "out", None).await?;
    let values: Vec<String> = (0..N).map(|i| i.to_string()).collect();
    // Fifty at a time: quick on every backend without flooding a small server.
    for (ks, vs) in keys.chunks(50).zip(values.chunks(50)) {
        futures::future::try_join_all(
            ks.iter()
                .zip(vs)
                .map(|(k, v)| put(ctx, k, v, Some(LONG_TTL))),
        )
        .await?;
    }
    let want: Vec<(String, String)> = keys.iter().cloned().zip(values).collect();
    let got = list(ctx, &base).await?;
    ensure!(
        got == want,
        "list of {N} keys returned {} keys; first differences: {:?}",
        got.len(),
        got.iter()
            .zip(&want)
            .filter(|(g, w)| g != w)
            .take(3)
            .collect::<Vec<_>>()
    );
    for key in keys.iter().step_by(10) {
        ensure_eq!(
            ctx.store.delete(key).await.during("delete")?,
            true,
            "delete of {key:?}"
        );
    }
    let rest: Vec<(String, String)> = want
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 10 != 0)
        .map(|(_, p)| p)
        .collect();
    let got = list(ctx, &base).await?;
    ensure!(
        got == rest,
        "after deleting every tenth key, list returned {} keys, expected {}",
        got.len(),
        rest.len()
    );
    Ok(())
}
