//! `get`, keys of unusual shape, foreign values and bad arguments.

use std::time::Duration;

use headcount::store::{MAX_KEY_LEN, MAX_TTL, MAX_VALUE_LEN};
use headcount::ErrorKind;

use super::{expect_kind, put};
use crate::{ensure, ensure_eq, CaseResult, Ctx, ResultExt};

/// `get` of a key never written, and of a deleted one, is `None`.
pub async fn get_absent(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let k = ctx.key("never");
    ensure_eq!(
        store.get(&k).await.during("get")?,
        None,
        "get of a never-written key"
    );
    let k = ctx.key("deleted");
    put(ctx, &k, "v", None).await?;
    store.delete(&k).await.during("delete")?;
    ensure_eq!(
        store.get(&k).await.during("get")?,
        None,
        "get of a deleted key"
    );
    Ok(())
}

/// `incr` and `set_max` over a value that is not a decimal `i64` give
/// [`ErrorKind::ForeignValue`] and leave the value as it was.
pub async fn foreign_value_typed_error(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    for (i, foreign) in [
        "abc",
        "1.5",
        "",
        " 7",
        "99999999999999999999",
        "+5",
        "007",
        "-0",
    ]
    .into_iter()
    .enumerate()
    {
        let k = ctx.key(&format!("foreign{i}"));
        put(ctx, &k, foreign, None).await?;
        expect_kind(
            &format!("incr over {foreign:?}"),
            store.incr(&k, None).await,
            ErrorKind::ForeignValue,
        )?;
        expect_kind(
            &format!("incr (with a TTL) over {foreign:?}"),
            store.incr(&k, Some(Duration::from_secs(60))).await,
            ErrorKind::ForeignValue,
        )?;
        expect_kind(
            &format!("set_max over {foreign:?}"),
            store.set_max(&k, 5, None).await,
            ErrorKind::ForeignValue,
        )?;
        ensure_eq!(
            store.get(&k).await.during("get")?,
            Some(foreign.to_owned()),
            "value after incr and set_max failed over it"
        );
    }
    Ok(())
}

/// An incompressible printable key of `len` bytes (so a database cannot shrink it to fit an index).
fn long_name(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    (0..len)
        .map(|_| {
            let i = rand::random_range(0..ALPHABET.len());
            char::from(ALPHABET.get(i).copied().unwrap_or(b'x'))
        })
        .collect()
}

/// Keys with `:`, `{`, `}`, spaces, unicode, 1 KiB and the longest accepted length
/// ([`MAX_KEY_LEN`] bytes) work with every primitive and with listing.
pub async fn odd_keys_round_trip(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let room = |total: usize| total.saturating_sub(ctx.prefix.len());
    let names = [
        "a:b:c".to_owned(),
        "{tag}:x".to_owned(),
        "}{".to_owned(),
        "ключ:群:🦀".to_owned(),
        "with space".to_owned(),
        long_name(room(1024)),
        long_name(room(MAX_KEY_LEN)),
    ];
    let mut keys = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let k = ctx.key(name);
        let short: String = k.chars().take(40).collect();
        let what = |op: &str| format!("{op} on the {}-byte key {short:?}…", k.len());
        ensure_eq!(
            store.incr(&k, None).await.during(what("incr"))?,
            1,
            "{}",
            what("incr")
        );
        ensure_eq!(
            store.get(&k).await.during(what("get"))?,
            Some("1".into()),
            "{}",
            what("get")
        );
        ensure_eq!(
            store.set_max(&k, 7, None).await.during(what("set_max"))?,
            true,
            "{}",
            what("set_max(7) on 1")
        );
        ensure_eq!(
            store
                .expire(&k, Duration::from_secs(600))
                .await
                .during(what("expire"))?,
            true,
            "{}",
            what("expire")
        );
        let v = format!("v{i}");
        ensure_eq!(
            store
                .compare_and_set(&k, Some("7"), &v, None)
                .await
                .during(what("compare_and_set"))?,
            true,
            "{}",
            what("compare_and_set(7 -> v)")
        );
        ensure_eq!(
            store.get(&k).await.during(what("get"))?,
            Some(v.clone()),
            "{}",
            what("get")
        );
        let listed = store.list(&k).await.during(what("list"))?;
        ensure!(
            listed.first() == Some(&(k.clone(), v.clone()))
                && listed.iter().all(|(l, _)| l.starts_with(&k)),
            "{}: {listed:?}",
            what("list with the key as prefix")
        );
        keys.push((k, v));
    }
    keys.sort();
    let listed = store.list(&ctx.prefix).await.during("list")?;
    ensure!(
        listed == keys,
        "list({:?}) returned keys {:?}, expected {:?}",
        ctx.prefix,
        listed.iter().map(|(k, _)| k.len()).collect::<Vec<_>>(),
        keys.iter().map(|(k, _)| k.len()).collect::<Vec<_>>()
    );
    for (k, _) in &keys {
        ensure_eq!(
            store.delete(k).await.during("delete")?,
            true,
            "delete of {k:?}"
        );
        ensure_eq!(
            store.get(k).await.during("get")?,
            None,
            "get after delete of {k:?}"
        );
    }
    Ok(())
}

/// Zero and over-long TTLs, empty / control-character / over-long keys, over-long and NUL values
/// and an empty listing prefix give [`ErrorKind::InvalidArgument`] from every primitive, and
/// nothing is written.
pub async fn bad_arguments_rejected(ctx: &Ctx) -> CaseResult {
    let store = &ctx.store;
    let bad = ErrorKind::InvalidArgument;
    let ok = ctx.key("ok");
    let live = ctx.key("live");
    put(ctx, &live, "v", None).await?;

    let bad_keys = [
        String::new(),
        format!("{}a\nb", ctx.prefix),
        format!("{}a\0b", ctx.prefix),
        format!("{}a\u{7f}", ctx.prefix),
        format!("{}{}", ctx.prefix, "k".repeat(MAX_KEY_LEN)),
    ];
    for key in &bad_keys {
        let shown: String = key.chars().take(40).collect();
        let call = |op: &str| format!("{op} with the key {shown:?} ({} bytes)", key.len());
        expect_kind(&call("incr"), store.incr(key, None).await, bad)?;
        expect_kind(&call("get"), store.get(key).await, bad)?;
        expect_kind(
            &call("expire"),
            store.expire(key, Duration::from_secs(1)).await,
            bad,
        )?;
        expect_kind(
            &call("compare_and_set"),
            store.compare_and_set(key, None, "v", None).await,
            bad,
        )?;
        expect_kind(&call("delete"), store.delete(key).await, bad)?;
        expect_kind(&call("set_max"), store.set_max(key, 1, None).await, bad)?;
        expect_kind(&call("list"), store.list(key).await, bad)?;
    }

    let too_long = MAX_TTL + Duration::from_secs(1);
    for (what, ttl) in [("zero TTL", Duration::ZERO), ("TTL over MAX_TTL", too_long)] {
        expect_kind(
            &format!("incr with a {what}"),
            store.incr(&ok, Some(ttl)).await,
            bad,
        )?;
        expect_kind(
            &format!("expire with a {what}"),
            store.expire(&live, ttl).await,
            bad,
        )?;
        expect_kind(
            &format!("compare_and_set with a {what}"),
            store.compare_and_set(&ok, None, "v", Some(ttl)).await,
            bad,
        )?;
        expect_kind(
            &format!("compare_and_set with a {what} over a live key"),
            store
                .compare_and_set(&live, Some("v"), "w", Some(ttl))
                .await,
            bad,
        )?;
        expect_kind(
            &format!("set_max with a {what}"),
            store.set_max(&ok, 1, Some(ttl)).await,
            bad,
        )?;
    }

    let huge = "v".repeat(MAX_VALUE_LEN + 1);
    expect_kind(
        "compare_and_set with a value over MAX_VALUE_LEN",
        store.compare_and_set(&ok, None, &huge, None).await,
        bad,
    )?;
    expect_kind(
        "compare_and_set with a value holding NUL",
        store.compare_and_set(&ok, None, "a\0b", None).await,
        bad,
    )?;
    expect_kind(
        "compare_and_set of a live key to a value holding NUL",
        store.compare_and_set(&live, Some("v"), "a\0b", None).await,
        bad,
    )?;
    expect_kind("list with an empty prefix", store.list("").await, bad)?;

    ensure_eq!(
        store.list(&ctx.prefix).await.during("list")?,
        vec![(live.clone(), "v".to_owned())],
        "keys under the case's prefix after the rejected calls (only the one written before)"
    );
    ensure_eq!(
        store.get(&ok).await.during("get")?,
        None,
        "get of the key every rejected call named"
    );
    // The live key kept no TTL from a rejected expire: still there and still settable.
    ensure_eq!(
        store
            .compare_and_set(&live, Some("v"), "w", None)
            .await
            .during("compare_and_set")?,
        true,
        "CAS on the live key after the rejected calls"
    );
    Ok(())
}
