//! The Redis key index heals itself: a live key missing from the
//! index (the index deleted, evicted, or the keys copied to a server without it, or a key
//! written by another client) is put back by the first script that touches it (a steady
//! renewal checks its name only when the expiry index lost it too; a loss of the index alone is
//! healed whole by the next sweep), with its directory's version changed so the next look lists
//! it; and a foreign value at the index's
//! own name is an error that names it. A Redis that may evict keys is refused by a group.
#![cfg(feature = "redis")]
// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use headcount::recipes::group::{Group, GroupConfig, GroupPhase, Member};
use headcount::{DynStore, ErrorKind};
use headcount_conformance::wait::{eventually, EVERY};
use headcount_harness::{skip_unless_required, KvStore, ServerKind};
use redis::aio::MultiplexedConnection;

/// A single Redis started from its binary (or a skip), a raw connection to it and a store on it.
async fn redis_with_store() -> Option<(KvStore, MultiplexedConnection, DynStore)> {
    let server = skip_unless_required(
        ServerKind::Redis,
        "redis_index_repair",
        KvStore::redis(None),
    )?;
    let url = server.url();
    let conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let store = headcount::connect(&url).await.unwrap();
    Some((server, conn, store))
}

/// Runs a raw command on the connection (another client than headcount).
async fn raw(conn: &MultiplexedConnection, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut conn.clone()).await.unwrap()
}

/// Deletes headcount's index keys, as `DEL`, an eviction or a copy of `hc:*` to another server
/// leaves them.
async fn lose_the_index(conn: &MultiplexedConnection) {
    raw(conn, &["DEL", "headcount:index", "headcount:expiry"]).await;
}

const TTL: Duration = Duration::from_millis(900);

async fn join(store: &DynStore, member: &str) -> Member {
    Group::join(
        store.clone(),
        GroupConfig::new("repair", TTL).with_member(member),
    )
    .await
    .unwrap()
}

/// Waits until every member is active under one epoch with `n` live slots.
async fn converged(members: &[&Member], n: u32, within: Duration) {
    let what = format!("every member active under one view of {n}");
    eventually(&what, within, EVERY, || async {
        let all: Vec<_> = members.iter().map(|m| m.assignment()).collect();
        let epoch = all[0].epoch;
        if all
            .iter()
            .all(|a| a.phase == GroupPhase::Active && a.epoch == epoch && a.replicas == n)
        {
            Ok(())
        } else {
            Err(all
                .iter()
                .map(|a| {
                    format!(
                        "{} {:?} epoch {} live {:?}",
                        a.member, a.phase, a.epoch, a.live
                    )
                })
                .collect::<Vec<_>>())
        }
    })
    .await;
}

/// Black-box: three members active, the index deleted, a fourth joins, and all four become
/// active. Without the repair the fourth would stay `joining` for good (its "only if absent"
/// writes of the view refused by a key no listing shows) while the others kept three live slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_recovers_from_a_lost_index() {
    let Some((_server, conn, store)) = redis_with_store().await else {
        return;
    };
    let (a, b, c) = (
        join(&store, "a").await,
        join(&store, "b").await,
        join(&store, "c").await,
    );
    converged(&[&a, &b, &c], 3, TTL * 20).await;
    lose_the_index(&conn).await;
    let d = join(&store, "d").await;
    // A few TTLs: each member puts its own slot back at its next renewal, and the first refused
    // write of the view puts the view back.
    converged(&[&a, &b, &c, &d], 4, TTL * 8).await;
    for m in [a, b, c, d] {
        m.leave().await.unwrap();
    }
}

/// On the primitives: a renewal of a key the index lost puts it back and changes its
/// directory's version, with the quiet marker alive (the steady heartbeat) and without it (a
/// heartbeat that sweeps), through both heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_puts_its_key_back_in_the_index() {
    let Some((_server, conn, store)) = redis_with_store().await else {
        return;
    };
    let ttl = Duration::from_secs(10);
    let dir = "hc:{r}:slot:";
    let key = "hc:{r}:slot:0";
    assert!(store
        .compare_and_set(key, None, "me", Some(ttl))
        .await
        .unwrap());
    let want = vec![(key.to_owned(), "me".to_owned())];
    for quiet in [true, false] {
        // A first heartbeat sets the quiet marker; the version it answers is the one held.
        let held = store
            .renew_and_list_if_changed(key, "me", ttl, dir, None)
            .await
            .unwrap();
        assert_eq!(held.listing.as_deref(), Some(&want[..]));
        lose_the_index(&conn).await;
        if !quiet {
            raw(&conn, &["DEL", "headcount:quiet"]).await;
        }
        assert_eq!(store.list(dir).await.unwrap(), vec![], "the index is gone");
        let answer = store
            .renew_and_list_if_changed(key, "me", ttl, dir, Some(&held.version))
            .await
            .unwrap();
        assert!(answer.renewed);
        assert_ne!(
            answer.version, held.version,
            "quiet marker {quiet}: a renewal that put its key back left the version"
        );
        assert_eq!(answer.listing.as_deref(), Some(&want[..]), "quiet {quiet}");
        assert_eq!(store.list(dir).await.unwrap(), want, "quiet {quiet}");

        // The same through renew_and_versions, which lists nothing: the version moves.
        lose_the_index(&conn).await;
        if !quiet {
            raw(&conn, &["DEL", "headcount:quiet"]).await;
        }
        let (renewed, versions) = store
            .renew_and_versions(key, "me", ttl, &[(dir, Some(&answer.version))])
            .await
            .unwrap();
        assert!(renewed);
        assert_ne!(
            versions[0], answer.version,
            "quiet {quiet}: renew_and_versions"
        );
        assert_eq!(store.list(dir).await.unwrap(), want, "quiet {quiet}");
    }
}

/// The index lost apart from the expiry index (deleted alone, evicted, or one name removed by
/// another client): a steady renewal checks its name only when the expiry index lacked it, so
/// it is the next sweep that puts every name back, with the directory's version changed; and a
/// group in which it happens converges again with every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_heals_an_index_lost_apart_from_the_expiry_index() {
    let Some((_server, conn, store)) = redis_with_store().await else {
        return;
    };
    let ttl = Duration::from_secs(10);
    let dir = "hc:{h}:slot:";
    let keys = ["hc:{h}:slot:0", "hc:{h}:slot:1"];
    for key in keys {
        assert!(store
            .compare_and_set(key, None, "me", Some(ttl))
            .await
            .unwrap());
    }
    let want: Vec<(String, String)> = keys.iter().map(|k| (k.to_string(), "me".into())).collect();
    for lose in [
        &["DEL", "headcount:index"][..],
        &["ZREM", "headcount:index", keys[1]][..],
    ] {
        let held = store
            .renew_and_list_if_changed(keys[0], "me", ttl, dir, None)
            .await
            .unwrap();
        assert_eq!(held.listing.as_deref(), Some(&want[..]));
        raw(&conn, lose).await;
        assert_ne!(
            store.list(dir).await.unwrap(),
            want,
            "{lose:?}: the index lost a name"
        );
        // The quiet marker's end: the next heartbeat sweeps.
        raw(&conn, &["DEL", "headcount:quiet"]).await;
        let answer = store
            .renew_and_list_if_changed(keys[0], "me", ttl, dir, Some(&held.version))
            .await
            .unwrap();
        assert!(answer.renewed);
        assert_ne!(answer.version, held.version, "{lose:?}: the version moved");
        assert_eq!(answer.listing.as_deref(), Some(&want[..]), "{lose:?}");
        assert_eq!(store.list(dir).await.unwrap(), want, "{lose:?}");
    }
}

/// A group whose index alone is deleted converges again with every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_recovers_from_a_lost_index_alone() {
    let Some((_server, conn, store)) = redis_with_store().await else {
        return;
    };
    let (a, b, c) = (
        join(&store, "a").await,
        join(&store, "b").await,
        join(&store, "c").await,
    );
    converged(&[&a, &b, &c], 3, TTL * 20).await;
    raw(&conn, &["DEL", "headcount:index"]).await;
    let d = join(&store, "d").await;
    converged(&[&a, &b, &c, &d], 4, TTL * 8).await;
    for m in [a, b, c, d] {
        m.leave().await.unwrap();
    }
}

/// A write refused because a key exists that no listing shows (written by another
/// client, or one the index lost) puts the key in the index and changes its directory's
/// version, so the caller's next read sees what refused it, instead of being refused forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_shows_what_refused_it() {
    let Some((_server, conn, store)) = redis_with_store().await else {
        return;
    };
    let ttl = Duration::from_secs(10);
    let dir = "hc:{w}:view:";
    let view = "hc:{w}:view:current";
    // The holder's key, so a heartbeat can ask for the directory's version.
    assert!(store
        .compare_and_set("hc:{w}:slot:0", None, "me", Some(ttl))
        .await
        .unwrap());
    let held = store
        .renew_and_list_if_changed("hc:{w}:slot:0", "me", ttl, dir, None)
        .await
        .unwrap();
    assert_eq!(held.listing.as_deref(), Some(&[][..]));
    // Another client writes the view; headcount's "only if absent" is refused by it.
    raw(&conn, &["SET", view, "v1 theirs"]).await;
    assert!(!store
        .compare_and_set(view, None, "v1 mine", None)
        .await
        .unwrap());
    let want = vec![(view.to_owned(), "v1 theirs".to_owned())];
    assert_eq!(store.list(dir).await.unwrap(), want);
    let answer = store
        .renew_and_list_if_changed("hc:{w}:slot:0", "me", ttl, dir, Some(&held.version))
        .await
        .unwrap();
    assert_ne!(answer.version, held.version, "the repair left the version");
    assert_eq!(answer.listing.as_deref(), Some(&want[..]));
    // With the expected text it then writes.
    assert!(store
        .compare_and_set(view, Some("v1 theirs"), "v2 mine", None)
        .await
        .unwrap());

    // The index lost, a compare-and-set with a stale expected text is refused, and repairs.
    lose_the_index(&conn).await;
    assert!(!store
        .compare_and_set(view, Some("v1 theirs"), "v3", None)
        .await
        .unwrap());
    assert_eq!(
        store.list(dir).await.unwrap(),
        vec![(view.to_owned(), "v2 mine".to_owned())]
    );
    // So do a refused compare-and-delete and set_max.
    lose_the_index(&conn).await;
    assert!(!store.compare_and_delete(view, "v1 theirs").await.unwrap());
    assert_eq!(store.list(dir).await.unwrap().len(), 1);
    raw(&conn, &["SET", "hc:{w}:n:max", "9"]).await;
    assert!(!store.set_max("hc:{w}:n:max", 3, None).await.unwrap());
    assert_eq!(
        store.list("hc:{w}:n:").await.unwrap(),
        vec![("hc:{w}:n:max".to_owned(), "9".to_owned())]
    );
    // A key with a TTL comes back scored, so the index keeps outliving it.
    raw(&conn, &["SET", "hc:{w}:ack:0", "a", "PX", "60000"]).await;
    assert!(!store
        .compare_and_set("hc:{w}:ack:0", None, "b", Some(ttl))
        .await
        .unwrap());
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg("headcount:expiry")
        .arg("hc:{w}:ack:0")
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    assert!(score.is_some(), "the repaired key has no expiry score");
}

/// A foreign value at the name of the index (or of the expiry index) is an error
/// that names that key, for writes, listings and heartbeats alike, not a `WRONGTYPE` that names
/// a script's line (or blames the caller's own key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_value_at_the_index_names_the_index() {
    let Some((_server, conn, store)) = redis_with_store().await else {
        return;
    };
    let ttl = Duration::from_secs(10);
    assert!(store
        .compare_and_set("hc:{f}:slot:0", None, "me", Some(ttl))
        .await
        .unwrap());
    for (index, foreign) in [
        ("headcount:index", ["SET", "headcount:index", "oops"]),
        ("headcount:expiry", ["SET", "headcount:expiry", "oops"]),
    ] {
        lose_the_index(&conn).await;
        raw(&conn, &foreign).await;
        let errors = [
            store.incr("hc:{f}:n", None).await.unwrap_err(),
            store
                .compare_and_set("hc:{f}:k", None, "v", Some(ttl))
                .await
                .unwrap_err(),
            store.list("hc:{f}:").await.unwrap_err(),
            store
                .renew_and_versions("hc:{f}:slot:0", "me", ttl, &[("hc:{f}:slot:", None)])
                .await
                .unwrap_err(),
        ];
        for e in errors {
            assert_eq!(e.kind(), ErrorKind::ForeignValue, "{index}: {e}");
            let text = e.to_string();
            assert!(text.contains(index), "{index}: {text}");
            assert!(!text.contains("script:"), "{index}: {text}");
        }
        raw(&conn, &["DEL", index]).await;
    }
    // Removed, the index is rebuilt by the writes that follow. (The writes refused above may
    // have changed their own keys: a script updates the index after its key.)
    store.incr("hc:{f}:n", None).await.unwrap();
    assert_eq!(store.list("hc:{f}:n").await.unwrap().len(), 1);
}

/// A directory's version never repeats, even after a rollback on a server whose clock is behind
/// the versions it minted (a backward clock step, a failover to a replica whose clock lags):
/// versions minted only as "one above the last" would walk the same numbers again for other
/// contents. The lagging clock is played by a version set far ahead of the server's
/// clock; the rollback by putting back the version and the keys a replica would have had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_never_repeat_after_a_rollback() {
    let Some((_server, conn, store)) = redis_with_store().await else {
        return;
    };
    let ttl = Duration::from_secs(10);
    let dir = "hc:{v}:slot:";
    let vk = "headcount:version:hc:{v}:slot:";
    assert!(store
        .compare_and_set("hc:{v}:slot:0", None, "me", Some(ttl))
        .await
        .unwrap());
    // Minted by a clock 10^12 µs (11 days) ahead of the server's.
    let ahead = "9000000000000000";
    raw(&conn, &["SET", vk, ahead]).await;
    assert!(store
        .compare_and_set("hc:{v}:slot:1", None, "b", Some(ttl))
        .await
        .unwrap());
    let first = store
        .renew_and_list_if_changed("hc:{v}:slot:0", "me", ttl, dir, None)
        .await
        .unwrap();
    // A failover to a replica that had the version before that write, and not the write.
    raw(&conn, &["SET", vk, ahead]).await;
    raw(&conn, &["DEL", "hc:{v}:slot:1"]).await;
    raw(&conn, &["ZREM", "headcount:index", "hc:{v}:slot:1"]).await;
    raw(&conn, &["ZREM", "headcount:expiry", "hc:{v}:slot:1"]).await;
    assert!(store
        .compare_and_set("hc:{v}:slot:2", None, "c", Some(ttl))
        .await
        .unwrap());
    let second = store
        .renew_and_list_if_changed("hc:{v}:slot:0", "me", ttl, dir, Some(&first.version))
        .await
        .unwrap();
    assert_ne!(
        second.version, first.version,
        "one version for two contents: {:?} then {:?}",
        first.listing, second.listing
    );
}

/// A Redis that may evict keys (a `maxmemory` limit with an evicting policy) is refused by a
/// joining member, naming the policy, unless the configuration allows it; with `noeviction`, or
/// no limit, it is joined. An evicted lease lets two members hold one key: with `allkeys-lru`
/// and another client filling memory, two members can be active as (1, 1) under one epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_refuses_a_redis_that_evicts_keys() {
    let Some((_server, conn, store)) = redis_with_store().await else {
        return;
    };
    let config = || GroupConfig::new("evict", TTL).with_member("a");
    for policy in ["volatile-ttl", "allkeys-lru"] {
        raw(&conn, &["CONFIG", "SET", "maxmemory", "100mb"]).await;
        raw(&conn, &["CONFIG", "SET", "maxmemory-policy", policy]).await;
        let e = Group::join(store.clone(), config()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Rejected, "{policy}: {e}");
        let text = e.to_string();
        assert!(
            text.contains(policy) && text.contains("noeviction"),
            "{policy}: {text}"
        );
        let allowed = Group::join(store.clone(), config().with_eviction_allowed(true))
            .await
            .unwrap();
        allowed.leave().await.unwrap();
    }
    // No limit: nothing is ever evicted, whatever the policy says.
    raw(&conn, &["CONFIG", "SET", "maxmemory", "0"]).await;
    Group::join(store.clone(), config())
        .await
        .unwrap()
        .leave()
        .await
        .unwrap();
    raw(&conn, &["CONFIG", "SET", "maxmemory", "100mb"]).await;
    raw(&conn, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).await;
    Group::join(store, config())
        .await
        .unwrap()
        .leave()
        .await
        .unwrap();
}

/// In `status`: keys that exist although the index lost their names are reported as
/// unlisted (the view key when no view was listed, a holder's slot key missing from the
/// listing), read with one `get` each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_the_keys_the_index_lost() {
    let Some((_server, conn, store)) = redis_with_store().await else {
        return;
    };
    // A long TTL and no notifications: no heartbeat puts a name back while the test looks (with
    // notifications, the member's reaction to its own settled mark can renew just after it
    // converged).
    let a = Group::join(
        store.clone(),
        GroupConfig::new("unlisted", Duration::from_secs(30))
            .with_member("a")
            .with_notifications(false),
    )
    .await
    .unwrap();
    converged(&[&a], 1, Duration::from_secs(10)).await;
    let status = || async {
        headcount::recipes::group::status(
            &store,
            "hc",
            "unlisted",
            headcount::assign::AssignorKind::JumpBackFailover,
            0,
        )
        .await
        .unwrap()
    };
    assert!(status().await.unlisted.is_empty());
    let slot = "hc:{unlisted}:slot:0";
    raw(&conn, &["ZREM", "headcount:index", slot]).await;
    let s = status().await;
    assert!(s.table.slots.is_empty(), "the listing still shows the slot");
    assert_eq!(s.unlisted, vec![slot.to_owned()]);
    lose_the_index(&conn).await;
    let s = status().await;
    assert!(s.table.view.is_none(), "the listing still shows the view");
    assert_eq!(s.unlisted, vec!["hc:{unlisted}:view:current".to_owned()]);
    a.leave().await.unwrap();
}
