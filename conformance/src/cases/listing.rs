//! `list` and `delete`.

use super::{expect_expiry, put, SHORT_TTL};
use crate::{ensure_eq, CaseResult, Ctx, Failure, ResultExt};

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
