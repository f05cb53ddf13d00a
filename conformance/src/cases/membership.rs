//! `renew_and_list`: the group member's heartbeat (renew my slot, read the slot table).

use std::time::Duration;

use headcount::store::MAX_TTL;
use headcount::ErrorKind;
use tokio::time::Instant;

use super::{expect_expiry, expect_kind, put, sleep_past, SHORT_TTL};
use crate::{ensure, ensure_eq, CaseResult, Ctx, Failure, ResultExt};

/// A TTL long enough that a key renewed with it outlives the case.
const LONG_TTL: Duration = Duration::from_secs(60);

/// Calls `renew_and_list` and returns its answer with the instants it was sent and completed.
async fn renew(
    ctx: &Ctx,
    key: &str,
    holder: &str,
    ttl: Duration,
    prefix: &str,
) -> Result<((bool, Vec<(String, String)>), Instant, Instant), Failure> {
    let sent = Instant::now();
    let answer = ctx
        .store
        .renew_and_list(key, holder, ttl, prefix)
        .await
        .during(format!(
            "renew_and_list({key:?}, {holder:?}, {ttl:?}, {prefix:?})"
        ))?;
    Ok((answer, sent, Instant::now()))
}

/// The holder's renewal resets the key's TTL to `ttl` from now and keeps its value: a key
/// renewed with a long TTL outlives its original short one, a key renewed with a short TTL
/// expires on that TTL counted from the renewal, and an expired key is neither renewed nor
/// brought back.
pub async fn renew_and_list_extends_ttl(ctx: &Ctx) -> CaseResult {
    let prefix = format!("{}slot:", ctx.prefix);
    let key = ctx.key("slot:1");
    let (_, put_done) = put(ctx, &key, "me", Some(SHORT_TTL)).await?;
    let ((renewed, listed), _, _) = renew(ctx, &key, "me", LONG_TTL, &prefix).await?;
    ensure!(renewed, "renew_and_list by the holder returned false");
    ensure_eq!(
        listed,
        vec![(key.clone(), "me".to_owned())],
        "listing after the renewal"
    );
    // Past the original expiry (with the backend's rounding and our tolerance), the key is there.
    sleep_past(put_done + ctx.caps().effective_ttl(SHORT_TTL) + ctx.tolerance()).await;
    ensure_eq!(
        ctx.store.get(&key).await.during("get")?,
        Some("me".to_owned()),
        "get after the original TTL passed (the renewal should have extended it)"
    );

    // Renewing with a short TTL sets it from now: the key expires on it, with its value kept.
    let ((renewed, _), sent, done) = renew(ctx, &key, "me", SHORT_TTL, &prefix).await?;
    ensure!(
        renewed,
        "second renew_and_list by the holder returned false"
    );
    expect_expiry(ctx, &key, "me", sent, done, SHORT_TTL).await?;

    // Expired: not renewed, not created again, not listed.
    let ((renewed, listed), _, _) = renew(ctx, &key, "me", LONG_TTL, &prefix).await?;
    ensure_eq!(renewed, false, "renew_and_list of an expired key");
    ensure_eq!(
        listed,
        Vec::<(String, String)>::new(),
        "listing after renewing an expired key"
    );
    ensure_eq!(
        ctx.store.get(&key).await.during("get")?,
        None,
        "get after renewing an expired key"
    );
    Ok(())
}

/// Another holder's renewal returns false and touches nothing: the value stays, a short expiry
/// still happens on time, a persistent key stays persistent; an absent key is not created.
pub async fn renew_and_list_refuses_others(ctx: &Ctx) -> CaseResult {
    let prefix = format!("{}slot:", ctx.prefix);
    let foreign = ctx.key("slot:1");
    let persistent = ctx.key("slot:2");
    let absent = ctx.key("slot:3");
    let (sent, done) = put(ctx, &foreign, "other", Some(SHORT_TTL)).await?;
    put(ctx, &persistent, "other", None).await?;

    let ((renewed, listed), _, _) = renew(ctx, &foreign, "me", LONG_TTL, &prefix).await?;
    ensure_eq!(renewed, false, "renew_and_list of a key held by another");
    // The foreign key may expire while we list, so only the persistent one is certain.
    ensure!(
        listed.contains(&(persistent.clone(), "other".to_owned())),
        "listing {listed:?} misses {persistent:?}"
    );
    let ((renewed, _), _, _) = renew(ctx, &persistent, "me", SHORT_TTL, &prefix).await?;
    ensure_eq!(
        renewed,
        false,
        "renew_and_list of a persistent key held by another"
    );
    let ((renewed, listed), _, _) = renew(ctx, &absent, "me", LONG_TTL, &prefix).await?;
    ensure_eq!(renewed, false, "renew_and_list of an absent key");
    ensure!(
        !listed.iter().any(|(k, _)| *k == absent),
        "the absent key {absent:?} was listed after renew_and_list: {listed:?}"
    );
    ensure_eq!(
        ctx.store.get(&absent).await.during("get")?,
        None,
        "get of the absent key after renew_and_list"
    );
    // The foreign key expires on its own TTL, value unchanged: the refused renewal did not
    // extend it.
    expect_expiry(ctx, &foreign, "other", sent, done, SHORT_TTL).await?;
    // The persistent key outlived the short TTL the refused renewal asked for.
    sleep_past(done + ctx.caps().effective_ttl(SHORT_TTL) + ctx.tolerance()).await;
    ensure_eq!(
        ctx.store.get(&persistent).await.during("get")?,
        Some("other".to_owned()),
        "get of the persistent key after another holder's short renewal"
    );
    Ok(())
}

/// The listing is what `list` returns: only live keys under the prefix, sorted bytewise, with
/// the renewed key; the renewed key may lie outside the prefix (then it is renewed, not listed),
/// even in another Redis Cluster hash slot; bad arguments are `InvalidArgument` and renew
/// nothing.
pub async fn renew_and_list_lists_prefix(ctx: &Ctx) -> CaseResult {
    let prefix = format!("{}slot:", ctx.prefix);
    let mine = ctx.key("slot:2");
    let gone = ctx.key("slot:0");
    let (gone_sent, gone_done) = put(ctx, &gone, "x", Some(SHORT_TTL)).await?;
    put(ctx, &mine, "me", Some(LONG_TTL)).await?;
    // Bytewise order: "slot:10" < "slot:2" < "slot:9" < "slot:view".
    for (name, value) in [
        ("slot:9", "c"),
        ("slot:10", "b"),
        ("slot:view", "{\"epoch\":3}"),
    ] {
        put(ctx, &ctx.key(name), value, Some(LONG_TTL)).await?;
    }
    // Beside the prefix: not listed.
    for name in ["slot", "slots:1", "other:1"] {
        put(ctx, &ctx.key(name), "out", Some(LONG_TTL)).await?;
    }
    expect_expiry(ctx, &gone, "x", gone_sent, gone_done, SHORT_TTL).await?;
    let want: Vec<(String, String)> = [
        ("slot:10", "b"),
        ("slot:2", "me"),
        ("slot:9", "c"),
        ("slot:view", "{\"epoch\":3}"),
    ]
    .iter()
    .map(|(k, v)| (format!("{}{k}", ctx.prefix), (*v).to_owned()))
    .collect();

    let ((renewed, listed), _, _) = renew(ctx, &mine, "me", LONG_TTL, &prefix).await?;
    ensure!(renewed, "renew_and_list by the holder returned false");
    ensure_eq!(listed, want, "renew_and_list's listing of {prefix:?}");
    let plain = ctx
        .store
        .list(&prefix)
        .await
        .during(format!("list({prefix:?})"))?;
    ensure_eq!(listed, plain, "renew_and_list's listing against list");

    // A key outside the prefix, in the same hash slot: renewed, not listed.
    let outside = ctx.key("other:1");
    let ((renewed, listed), _, _) = renew(ctx, &outside, "out", LONG_TTL, &prefix).await?;
    ensure!(
        renewed,
        "renew_and_list of a key outside the prefix returned false"
    );
    ensure_eq!(
        listed,
        want,
        "listing when the renewed key is outside the prefix"
    );

    // A key in another Redis Cluster hash slot (other tag): the backend may take two calls but
    // must answer the same.
    let elsewhere = format!("hct:{{{:016x}}}:slot", rand::random::<u64>());
    put(ctx, &elsewhere, "me", Some(LONG_TTL)).await?;
    let answer = renew(ctx, &elsewhere, "me", LONG_TTL, &prefix).await;
    let deleted = ctx.store.delete(&elsewhere).await;
    let ((renewed, listed), _, _) = answer?;
    deleted.during(format!("delete({elsewhere:?})"))?;
    ensure!(
        renewed,
        "renew_and_list of a key with another hash tag returned false"
    );
    ensure_eq!(
        listed,
        want,
        "listing when the renewed key has another hash tag"
    );

    // Bad arguments: InvalidArgument, and the short-lived key is not renewed by any of them.
    let short = ctx.key("slot:short");
    let (sent, done) = put(ctx, &short, "me", Some(SHORT_TTL)).await?;
    let store = &ctx.store;
    let cases: [(&str, &str, &str, Duration, &str); 6] = [
        ("empty key", "", "me", LONG_TTL, &prefix),
        ("empty prefix", &short, "me", LONG_TTL, ""),
        ("zero TTL", &short, "me", Duration::ZERO, &prefix),
        (
            "TTL over MAX_TTL",
            &short,
            "me",
            MAX_TTL + Duration::from_secs(1),
            &prefix,
        ),
        ("NUL in the holder", &short, "m\0e", LONG_TTL, &prefix),
        (
            "control character in the key",
            "a\nb",
            "me",
            LONG_TTL,
            &prefix,
        ),
    ];
    for (what, key, holder, ttl, pfx) in cases {
        expect_kind(
            &format!("renew_and_list with {what}"),
            store.renew_and_list(key, holder, ttl, pfx).await,
            ErrorKind::InvalidArgument,
        )?;
    }
    expect_expiry(ctx, &short, "me", sent, done, SHORT_TTL).await?;
    Ok(())
}

/// Calls `renew_and_list_if_changed` and returns its answer.
async fn check(
    ctx: &Ctx,
    key: &str,
    holder: &str,
    dir: &str,
    since: Option<&str>,
) -> Result<headcount::RenewedListing, Failure> {
    ctx.store
        .renew_and_list_if_changed(key, holder, LONG_TTL, dir, since)
        .await
        .during(format!(
            "renew_and_list_if_changed({key:?}, {holder:?}, {dir:?}, {since:?})"
        ))
}

/// `renew_and_list_if_changed` renews like `renew_and_list`, and lists exactly the keys directly
/// under the directory (not deeper ones, not siblings) when no version is given; bad arguments
/// (a directory without the final `:`) are `InvalidArgument` and renew nothing.
pub async fn renew_if_changed_renews_and_lists(ctx: &Ctx) -> CaseResult {
    let dir = format!("{}slot:", ctx.prefix);
    let mine = ctx.key("slot:1");
    let (_, put_done) = put(ctx, &mine, "me", Some(SHORT_TTL)).await?;
    put(ctx, &ctx.key("slot:view"), "v", None).await?;
    for name in ["slot:deep:1", "slots:1", "slot"] {
        put(ctx, &ctx.key(name), "out", Some(LONG_TTL)).await?;
    }
    let answer = check(ctx, &mine, "me", &dir, None).await?;
    ensure!(answer.renewed, "the holder's renewal returned false");
    ensure_eq!(
        answer.listing,
        Some(vec![
            (mine.clone(), "me".to_owned()),
            (ctx.key("slot:view"), "v".to_owned()),
        ]),
        "listing of {dir:?} with no version given"
    );
    // The renewal extended the short TTL.
    sleep_past(put_done + ctx.caps().effective_ttl(SHORT_TTL) + ctx.tolerance()).await;
    ensure_eq!(
        ctx.store.get(&mine).await.during("get")?,
        Some("me".to_owned()),
        "get after the original TTL passed (the renewal should have extended it)"
    );
    // Another holder renews nothing.
    let answer = check(ctx, &mine, "someone else", &dir, None).await?;
    ensure_eq!(answer.renewed, false, "another holder's renewal");
    // A directory must end with ':'.
    let bad = ctx
        .store
        .renew_and_list_if_changed(&mine, "me", LONG_TTL, &ctx.key("slot"), None)
        .await;
    expect_kind(
        "renew_and_list_if_changed with a directory without ':'",
        bad,
        ErrorKind::InvalidArgument,
    )?;
    Ok(())
}

/// Renewals with the same TTL keep a key alive for as long as they come, each extending it from
/// its own send (also when another write rewrote the key with the same value and a TTL of its
/// own in between, and whether they go through `renew_and_list` or `renew_and_list_if_changed`);
/// once they stop, the key expires on the last one's TTL. A backend that renews differently the
/// first time and the next times (etcd moves the key to a lease of its own, then keeps that lease
/// alive) shows here whether the later renewals extend anything.
pub async fn renewals_keep_a_key_alive(ctx: &Ctx) -> CaseResult {
    let dir = format!("{}slot:", ctx.prefix);
    let key = ctx.key("slot:1");
    let effective = ctx.caps().effective_ttl(SHORT_TTL);
    let (first_sent, _) = put(ctx, &key, "me", Some(SHORT_TTL)).await?;
    let mut last = (first_sent, first_sent);
    for round in 0..6 {
        if round == 3 {
            let set = ctx
                .store
                .compare_and_set(&key, Some("me"), "me", Some(SHORT_TTL))
                .await
                .during("compare_and_set with the same value between renewals")?;
            ensure!(
                set,
                "compare_and_set(me -> me) of a live key returned false"
            );
        }
        let sent = Instant::now();
        let renewed = if round % 2 == 0 {
            ctx.store
                .renew_and_list(&key, "me", SHORT_TTL, &dir)
                .await
                .during(format!("renew_and_list, renewal {round}"))?
                .0
        } else {
            ctx.store
                .renew_and_list_if_changed(&key, "me", SHORT_TTL, &dir, None)
                .await
                .during(format!("renew_and_list_if_changed, renewal {round}"))?
                .renewed
        };
        let done = Instant::now();
        ensure!(
            renewed,
            "renewal {round} (every one {:?} after the previous, TTL {effective:?} effective) \
             returned false: the key expired between renewals",
            effective / 2
        );
        last = (sent, done);
        if round < 5 {
            tokio::time::sleep(effective / 2).await;
        }
    }
    // Two and a half effective TTLs after the first write: only the renewals kept it.
    ensure!(
        last.0 > first_sent + effective + ctx.tolerance(),
        "the renewals ended too soon to show anything"
    );
    expect_expiry(ctx, &key, "me", last.0, last.1, SHORT_TTL).await?;
    Ok(())
}

/// The version stays the same across renewals and writes beside the directory (a renewal
/// through `compare_and_set` or a write below the directory may change it, with the same
/// listing), and changes
/// (with the listing sent again) when a key directly under it is created, changed, deleted,
/// compare-and-deleted, or expires with nobody writing.
pub async fn renew_if_changed_follows_changes(ctx: &Ctx) -> CaseResult {
    let dir = format!("{}slot:", ctx.prefix);
    let mine = ctx.key("slot:1");
    put(ctx, &mine, "me", Some(LONG_TTL)).await?;
    let first = check(ctx, &mine, "me", &dir, None).await?;
    let mut version = first.version.clone();
    // A renewal through compare_and_set rewrites the key: the version may change (the contract
    // allows it for a renewal), but then the listing sent is the same.
    ctx.store
        .compare_and_set(&mine, Some("me"), "me", Some(LONG_TTL))
        .await
        .during("compare_and_set with the same value")?;
    // So may a write below the directory (a key with a further ':'), which is not in it.
    put(ctx, &ctx.key("slot:deep:1"), "out", Some(LONG_TTL)).await?;
    let rewritten = check(ctx, &mine, "me", &dir, Some(&version)).await?;
    if let Some(listing) = &rewritten.listing {
        ensure_eq!(
            listing,
            &vec![(mine.clone(), "me".to_owned())],
            "listing after a compare_and_set with the same value and a write below"
        );
        version = rewritten.version.clone();
    }
    let settled = check(ctx, &mine, "me", &dir, Some(&version)).await?;
    ensure_eq!(
        settled.listing,
        None,
        "listing at the second renewal after a compare_and_set with the same value"
    );
    version = settled.version;
    // Unchanged: renewals, writes beside.
    for name in ["slots:1", "other:1"] {
        put(ctx, &ctx.key(name), "out", Some(LONG_TTL)).await?;
    }
    let again = check(ctx, &mine, "me", &dir, Some(&version)).await?;
    ensure!(again.renewed, "the holder's renewal returned false");
    ensure_eq!(
        again.listing,
        None,
        "listing after renewals and writes outside the directory (version {version:?} then {:?})",
        again.version
    );
    ensure_eq!(again.version, version, "version after nothing changed");

    // Each change below is seen once, with the listing as it now is.
    let other = ctx.key("slot:2");
    let steps: Vec<(&str, Vec<(String, String)>)> = vec![
        (
            "create",
            vec![(mine.clone(), "me".into()), (other.clone(), "a".into())],
        ),
        (
            "change",
            vec![(mine.clone(), "me".into()), (other.clone(), "b".into())],
        ),
        ("compare_and_delete", vec![(mine.clone(), "me".into())]),
        (
            "create again",
            vec![(mine.clone(), "me".into()), (other.clone(), "c".into())],
        ),
        ("delete", vec![(mine.clone(), "me".into())]),
    ];
    for (step, want) in steps {
        match step {
            "create" => drop(put(ctx, &other, "a", Some(LONG_TTL)).await?),
            "change" => {
                ctx.store
                    .compare_and_set(&other, Some("a"), "b", Some(LONG_TTL))
                    .await
                    .during("compare_and_set a -> b")?;
            }
            "compare_and_delete" => {
                ctx.store
                    .compare_and_delete(&other, "b")
                    .await
                    .during("compare_and_delete")?;
            }
            "create again" => drop(put(ctx, &other, "c", Some(LONG_TTL)).await?),
            _ => {
                ctx.store.delete(&other).await.during("delete")?;
            }
        }
        // A backend without a native compare_and_delete lets the key expire within its
        // shortest TTL: poll until the listing shows it.
        let deadline =
            Instant::now() + ctx.caps().min_ttl + ctx.tolerance() + Duration::from_secs(2);
        loop {
            let answer = check(ctx, &mine, "me", &dir, Some(&version)).await?;
            if answer.listing.as_ref() == Some(&want) {
                ensure!(
                    answer.version != version,
                    "after {step}: a new listing under the old version {version:?}"
                );
                version = answer.version;
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "after {step}: listing {:?} (version {:?}, was {version:?}), want {want:?}",
                answer.listing,
                answer.version
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let same = check(ctx, &mine, "me", &dir, Some(&version)).await?;
        ensure_eq!(same.listing, None, "listing right after {step} was seen");
    }

    // An expiry with nobody writing: seen by the heartbeat alone.
    let (sent, done) = put(ctx, &other, "short", Some(SHORT_TTL)).await?;
    let seen = check(ctx, &mine, "me", &dir, Some(&version)).await?;
    ensure!(
        seen.listing.is_some(),
        "the short-lived key's creation went unseen"
    );
    version = seen.version;
    let deadline =
        done + ctx.caps().effective_ttl(SHORT_TTL) + ctx.tolerance() + Duration::from_secs(3);
    loop {
        let answer = check(ctx, &mine, "me", &dir, Some(&version)).await?;
        if let Some(listing) = answer.listing {
            ensure_eq!(
                listing,
                vec![(mine.clone(), "me".to_owned())],
                "listing after the short-lived key expired"
            );
            ensure!(
                Instant::now()
                    >= sent
                        + ctx
                            .caps()
                            .effective_ttl(SHORT_TTL)
                            .saturating_sub(ctx.tolerance()),
                "the version changed before the key could have expired"
            );
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the expiry of {other:?} did not change the version within the TTL + 3 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Calls `renew_and_versions` over the two directories and returns its answer.
async fn versions(
    ctx: &Ctx,
    key: &str,
    holder: &str,
    dirs: [&str; 2],
    held: &[String],
) -> Result<(bool, Vec<String>), Failure> {
    versions_of(ctx, key, holder, LONG_TTL, &dirs, held).await
}

/// The holder's versions of `dirs` once they settle: a first renewal may change a version (the
/// contract allows it, etcd moves the key onto a lease of its own), so versions are taken until
/// two calls in a row agree.
async fn settled_versions(ctx: &Ctx, mine: &str, dirs: &[&str]) -> Result<Vec<String>, Failure> {
    let mut held: Vec<String> = Vec::new();
    for _ in 0..4 {
        let (renewed, got) = versions_of(ctx, mine, "me", LONG_TTL, dirs, &held).await?;
        ensure!(renewed, "the holder's renewal returned false");
        if got == held {
            return Ok(held);
        }
        held = got;
    }
    Err(Failure::new(format!(
        "the versions never settled across renewals: {held:?}"
    )))
}

/// `renew_and_versions` renews like `renew_and_list_if_changed` and answers, per directory, the
/// version that call answers: the same while nothing changes, a new one for the directory a
/// write changed and only for it; another holder renews nothing; no directory, or one without
/// the final `:`, is `InvalidArgument`.
pub async fn renew_and_versions_follow_changes(ctx: &Ctx) -> CaseResult {
    let slots = format!("{}slot:", ctx.prefix);
    let views = format!("{}view:", ctx.prefix);
    let dirs = [slots.as_str(), views.as_str()];
    let mine = ctx.key("slot:1");
    put(ctx, &mine, "me", Some(LONG_TTL)).await?;
    put(ctx, &ctx.key("view:current"), "v1", Some(LONG_TTL)).await?;
    let mut held = settled_versions(ctx, &mine, &dirs).await?;
    // The versions are renew_and_list_if_changed's: it answers them with no listing.
    for (dir, version) in dirs.iter().zip(&held) {
        let answer = check(ctx, &mine, "me", dir, Some(version)).await?;
        ensure_eq!(&answer.version, version, "the version of {dir}");
        ensure_eq!(answer.listing, None, "the listing of unchanged {dir}");
    }
    // A write in one directory changes its version only.
    for (changed, key) in [(1, ctx.key("view:current")), (0, ctx.key("slot:2"))] {
        if changed == 1 {
            let wrote = ctx
                .store
                .compare_and_set(&key, Some("v1"), "v2", Some(LONG_TTL))
                .await
                .during("compare_and_set v1 -> v2")?;
            ensure!(wrote, "compare_and_set v1 -> v2 returned false");
        } else {
            put(ctx, &key, "new", Some(LONG_TTL)).await?;
        }
        let (_, got) = versions(ctx, &mine, "me", dirs, &held).await?;
        ensure!(
            got[changed] != held[changed],
            "a write to {key:?} left the version of {} unchanged",
            dirs[changed]
        );
        ensure_eq!(
            got[1 - changed],
            held[1 - changed],
            "the version of {} after a write to {key:?}",
            dirs[1 - changed]
        );
        held = got;
    }
    let (renewed, _) = versions(ctx, &mine, "someone else", dirs, &held).await?;
    ensure!(!renewed, "another holder's renewal returned true");
    ensure_eq!(
        ctx.store.get(&mine).await.during("get")?,
        Some("me".to_owned()),
        "the key after another holder's renewal"
    );
    expect_kind(
        "renew_and_versions with no directory",
        ctx.store
            .renew_and_versions(&mine, "me", LONG_TTL, &[])
            .await,
        ErrorKind::InvalidArgument,
    )?;
    let no_colon = ctx.key("slot");
    expect_kind(
        "renew_and_versions with a directory without ':'",
        ctx.store
            .renew_and_versions(&mine, "me", LONG_TTL, &[(&slots, None), (&no_colon, None)])
            .await,
        ErrorKind::InvalidArgument,
    )?;
    Ok(())
}

/// Calls `renew_and_versions` with `ttl` over `dirs`, each with the version held for it (none
/// when `held` has none), and returns its answer.
async fn versions_of(
    ctx: &Ctx,
    key: &str,
    holder: &str,
    ttl: Duration,
    dirs: &[&str],
    held: &[String],
) -> Result<(bool, Vec<String>), Failure> {
    let asked: Vec<(&str, Option<&str>)> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| (*d, held.get(i).map(String::as_str)))
        .collect();
    let (renewed, got) = ctx
        .store
        .renew_and_versions(key, holder, ttl, &asked)
        .await
        .during(format!(
            "renew_and_versions({key:?}, {holder:?}, {ttl:?}, {dirs:?})"
        ))?;
    ensure_eq!(
        got.len(),
        dirs.len(),
        "versions answered for {} directories",
        dirs.len()
    );
    Ok((renewed, got))
}

/// `renew_and_versions` renews only a live key that holds the holder: the holder's call resets
/// the TTL (the key outlives its original short one); a key held by another, one holding a
/// value of another program, an absent key and an expired one are not renewed (false), keep
/// their value and expiry, and are not created.
pub async fn renew_and_versions_renews_only_the_holder(ctx: &Ctx) -> CaseResult {
    let slots = format!("{}slot:", ctx.prefix);
    let views = format!("{}view:", ctx.prefix);
    let dirs = [slots.as_str(), views.as_str()];
    let mine = ctx.key("slot:1");
    let (_, mine_done) = put(ctx, &mine, "me", Some(SHORT_TTL)).await?;
    let (renewed, _) = versions_of(ctx, &mine, "me", LONG_TTL, &dirs, &[]).await?;
    ensure!(renewed, "renew_and_versions by the holder returned false");

    // Held by another: not renewed, expires on its own TTL with its value.
    let others = ctx.key("slot:2");
    let (sent, done) = put(ctx, &others, "other", Some(SHORT_TTL)).await?;
    let (renewed, _) = versions_of(ctx, &others, "me", LONG_TTL, &dirs, &[]).await?;
    ensure_eq!(
        renewed,
        false,
        "renew_and_versions of a key held by another"
    );
    expect_expiry(ctx, &others, "other", sent, done, SHORT_TTL).await?;

    // The holder's renewal outlived the original TTL.
    sleep_past(mine_done + ctx.caps().effective_ttl(SHORT_TTL) + ctx.tolerance()).await;
    ensure_eq!(
        ctx.store.get(&mine).await.during("get")?,
        Some("me".to_owned()),
        "get after the original TTL passed (renew_and_versions should have extended it)"
    );

    // A value of another program, with no TTL: not renewed, and it stays without a TTL.
    let foreign = ctx.key("slot:3");
    let value = "{\"not\":\"a holder\"}";
    let (_, done) = put(ctx, &foreign, value, None).await?;
    let (renewed, _) = versions_of(ctx, &foreign, "me", SHORT_TTL, &dirs, &[]).await?;
    ensure_eq!(renewed, false, "renew_and_versions of a foreign value");
    sleep_past(done + ctx.caps().effective_ttl(SHORT_TTL) + ctx.tolerance()).await;
    ensure_eq!(
        ctx.store.get(&foreign).await.during("get")?,
        Some(value.to_owned()),
        "get of the foreign value after a refused short renewal"
    );

    // Absent, and expired: not renewed, not created.
    let absent = ctx.key("slot:4");
    let (renewed, _) = versions_of(ctx, &absent, "me", LONG_TTL, &dirs, &[]).await?;
    ensure_eq!(renewed, false, "renew_and_versions of an absent key");
    ensure_eq!(
        ctx.store.get(&absent).await.during("get")?,
        None,
        "get of the absent key after renew_and_versions"
    );
    let expired = ctx.key("slot:5");
    let (sent, done) = put(ctx, &expired, "me", Some(SHORT_TTL)).await?;
    expect_expiry(ctx, &expired, "me", sent, done, SHORT_TTL).await?;
    let (renewed, _) = versions_of(ctx, &expired, "me", LONG_TTL, &dirs, &[]).await?;
    ensure_eq!(renewed, false, "renew_and_versions of an expired key");
    ensure_eq!(
        ctx.store.get(&expired).await.during("get")?,
        None,
        "get of the expired key after renew_and_versions"
    );
    Ok(())
}

/// Checks that `versions`, answered by `renew_and_versions` for `dirs`, are what
/// `renew_and_list_if_changed` answers for each directory: asked with the version, it answers
/// the same one and no listing.
async fn same_as_single_checks(
    ctx: &Ctx,
    key: &str,
    dirs: &[&str],
    versions: &[String],
    when: &str,
) -> CaseResult {
    for (dir, version) in dirs.iter().zip(versions) {
        let answer = check(ctx, key, "me", dir, Some(version)).await?;
        ensure_eq!(
            &answer.version,
            version,
            "{when}: renew_and_list_if_changed's version of {dir} against renew_and_versions'"
        );
        ensure_eq!(
            answer.listing,
            None,
            "{when}: the listing of unchanged {dir}"
        );
    }
    Ok(())
}

/// `renew_and_versions` over three directories at once, one of them empty: each version is the
/// one `renew_and_list_if_changed` answers for its directory, and changes when a key directly
/// under that directory is created, changed, deleted, compare-and-deleted or expires with
/// nobody writing, while the other directories' versions stay.
pub async fn renew_and_versions_each_directory(ctx: &Ctx) -> CaseResult {
    let slots = format!("{}slot:", ctx.prefix);
    let views = format!("{}view:", ctx.prefix);
    let empty = format!("{}idle:", ctx.prefix);
    let dirs = [slots.as_str(), views.as_str(), empty.as_str()];
    let mine = ctx.key("slot:1");
    put(ctx, &mine, "me", Some(LONG_TTL)).await?;
    put(ctx, &ctx.key("view:current"), "v1", Some(LONG_TTL)).await?;
    let mut held = settled_versions(ctx, &mine, &dirs).await?;
    same_as_single_checks(ctx, &mine, &dirs, &held, "settled").await?;
    // The empty directory, asked with no version, lists nothing under the same version.
    let listed = check(ctx, &mine, "me", &empty, None).await?;
    ensure_eq!(&listed.version, &held[2], "the empty directory's version");
    ensure_eq!(
        listed.listing,
        Some(Vec::new()),
        "the empty directory's listing"
    );

    let other = ctx.key("slot:2");
    let idle = ctx.key("idle:1");
    let steps: [(&str, usize); 7] = [
        ("create", 0),
        ("change", 0),
        ("compare_and_delete", 0),
        ("create again", 0),
        ("delete", 0),
        ("create in the empty directory", 2),
        ("delete in the once empty directory", 2),
    ];
    for (step, changed) in steps {
        match step {
            "create" => drop(put(ctx, &other, "a", Some(LONG_TTL)).await?),
            "change" => {
                let wrote = ctx
                    .store
                    .compare_and_set(&other, Some("a"), "b", Some(LONG_TTL))
                    .await
                    .during("compare_and_set a -> b")?;
                ensure!(wrote, "compare_and_set a -> b returned false");
            }
            "compare_and_delete" => {
                ctx.store
                    .compare_and_delete(&other, "b")
                    .await
                    .during("compare_and_delete")?;
            }
            "create again" => drop(put(ctx, &other, "c", Some(LONG_TTL)).await?),
            "delete" => {
                ctx.store.delete(&other).await.during("delete")?;
            }
            "create in the empty directory" => drop(put(ctx, &idle, "x", Some(LONG_TTL)).await?),
            _ => {
                ctx.store.delete(&idle).await.during("delete")?;
            }
        }
        // A backend without a native compare_and_delete lets the key expire within its
        // shortest TTL: poll until the version moves.
        let deadline =
            Instant::now() + ctx.caps().min_ttl + ctx.tolerance() + Duration::from_secs(2);
        let got = loop {
            let (_, got) = versions_of(ctx, &mine, "me", LONG_TTL, &dirs, &held).await?;
            if got[changed] != held[changed] {
                break got;
            }
            ensure!(
                Instant::now() < deadline,
                "after {step}: the version of {} stayed {:?}",
                dirs[changed],
                held[changed]
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        for i in (0..dirs.len()).filter(|i| *i != changed) {
            ensure_eq!(
                &got[i],
                &held[i],
                "after {step}: the version of {}, where nothing changed",
                dirs[i]
            );
        }
        // renew_and_list_if_changed, asked with the old version, answers the new one.
        let answer = check(ctx, &mine, "me", dirs[changed], Some(&held[changed])).await?;
        ensure_eq!(
            &answer.version,
            &got[changed],
            "after {step}: renew_and_list_if_changed's version of {} against renew_and_versions'",
            dirs[changed]
        );
        held = got;
        same_as_single_checks(ctx, &mine, &dirs, &held, &format!("after {step}")).await?;
    }

    // An expiry with nobody writing: seen by renew_and_versions alone.
    let (sent, done) = put(ctx, &other, "short", Some(SHORT_TTL)).await?;
    let (_, got) = versions_of(ctx, &mine, "me", LONG_TTL, &dirs, &held).await?;
    ensure!(
        got[0] != held[0],
        "the short-lived key's creation left the version of {slots} unchanged"
    );
    held = got;
    let ttl = ctx.caps().effective_ttl(SHORT_TTL);
    let deadline = done + ttl + ctx.tolerance() + Duration::from_secs(3);
    loop {
        let (_, got) = versions_of(ctx, &mine, "me", LONG_TTL, &dirs, &held).await?;
        if got[0] != held[0] {
            ensure!(
                Instant::now() >= sent + ttl.saturating_sub(ctx.tolerance()),
                "the version changed before the key could have expired"
            );
            ensure_eq!(
                &got[1..],
                &held[1..],
                "the other versions after an expiry in {slots}"
            );
            same_as_single_checks(ctx, &mine, &dirs, &got, "after the expiry").await?;
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the expiry of {other:?} did not change the version within the TTL + 3 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
