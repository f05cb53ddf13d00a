//! The model answers like the Redis backend (the cases of `conformance/tests/redis_index.rs`
//! and `redis_index_repair.rs`, on the model), and its faults do what they say.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use super::{ModelFaults, RedisModel};
use headcount_core::clock::ManualClock;
use headcount_core::error::Result;
use headcount_core::memory::MemoryStore;
use headcount_core::Store;

const TTL: Duration = Duration::from_secs(10);
const DIR: &str = "hc:{g}:slot:";
const KEY: &str = "hc:{g}:slot:0";

fn model() -> (ManualClock, RedisModel) {
    let clock = ManualClock::at_unix_secs(1_000_000);
    let data = MemoryStore::with_clock(Arc::new(clock.clone()));
    (clock, RedisModel::new(data, 7))
}

fn me() -> Vec<(String, String)> {
    vec![(KEY.to_owned(), "me".to_owned())]
}

#[tokio::test]
async fn a_lost_index_hides_keys_until_a_renewal_puts_them_back() -> Result<()> {
    for repair in [true, false] {
        let (_, m) = model();
        let m = m.with_repair(repair);
        assert!(m.compare_and_set(KEY, None, "me", Some(TTL)).await?);
        let held = m
            .renew_and_list_if_changed(KEY, "me", TTL, DIR, None)
            .await?;
        assert_eq!(held.listing, Some(me()));
        m.lose_index();
        assert!(m.list(DIR).await?.is_empty());
        // The quiet marker lives: the steady heartbeat.
        let answer = m
            .renew_and_list_if_changed(KEY, "me", TTL, DIR, Some(&held.version))
            .await?;
        assert!(answer.renewed);
        if repair {
            assert_ne!(answer.version, held.version);
            assert_eq!(answer.listing, Some(me()));
        } else {
            // Without the repair: renewed, yet unlisted and unchanged.
            assert_eq!(answer.version, held.version);
            assert!(m.list(DIR).await?.is_empty());
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_refused_write_repairs_the_index() -> Result<()> {
    let (_, m) = model();
    let view = "hc:{g}:view:current";
    assert!(m.compare_and_set(view, None, "v1", None).await?);
    m.lose_index_entry(0);
    assert!(m.list("hc:{g}:view:").await?.is_empty());
    assert!(!m.compare_and_set(view, None, "v2", None).await?);
    assert_eq!(
        m.list("hc:{g}:view:").await?,
        vec![(view.to_owned(), "v1".to_owned())]
    );
    let (_, m) = model();
    let m = m.with_repair(false);
    assert!(m.compare_and_set(view, None, "v1", None).await?);
    m.lose_index();
    assert!(!m.compare_and_set(view, None, "v2", None).await?);
    assert!(m.list("hc:{g}:view:").await?.is_empty(), "refused forever");
    Ok(())
}

#[tokio::test]
async fn an_expiry_changes_the_version_at_a_sweep() -> Result<()> {
    let (clock, m) = model();
    let short = Duration::from_millis(900);
    assert!(m.compare_and_set(KEY, None, "me", Some(TTL)).await?);
    assert!(
        m.compare_and_set("hc:{g}:slot:1", None, "it", Some(short))
            .await?
    );
    let (_, v1) = m.renew_and_versions(KEY, "me", TTL, &[(DIR, None)]).await?;
    clock.advance(short);
    // The quiet marker ended by the expiry score: this heartbeat sweeps.
    let (_, v2) = m.renew_and_versions(KEY, "me", TTL, &[(DIR, None)]).await?;
    assert_ne!(v1, v2);
    assert_eq!(m.list(DIR).await?, me());
    // A renewal and a rewrite of the same value change no version.
    let (_, v3) = m.renew_and_versions(KEY, "me", TTL, &[(DIR, None)]).await?;
    assert!(m.compare_and_set(KEY, Some("me"), "me", Some(TTL)).await?);
    let (_, v4) = m.renew_and_versions(KEY, "me", TTL, &[(DIR, None)]).await?;
    assert_eq!(v2, v3);
    assert_eq!(v3, v4);
    Ok(())
}

#[tokio::test]
async fn versions_repeat_after_a_rollback_only_when_counters_are_reused() -> Result<()> {
    for reuse in [false, true] {
        let (_, m) = model();
        m.set_faults(ModelFaults {
            drop_bumps: 0.0,
            reuse_counters: reuse,
        });
        assert!(m.compare_and_set(KEY, None, "me", Some(TTL)).await?);
        let snap = m.snapshot();
        assert!(
            m.compare_and_set("hc:{g}:slot:1", None, "a", Some(TTL))
                .await?
        );
        let (_, before) = m.renew_and_versions(KEY, "me", TTL, &[(DIR, None)]).await?;
        m.restore(&snap);
        assert!(
            m.compare_and_set("hc:{g}:slot:2", None, "b", Some(TTL))
                .await?
        );
        let (_, after) = m.renew_and_versions(KEY, "me", TTL, &[(DIR, None)]).await?;
        assert_eq!(before == after, reuse, "{before:?} {after:?}");
    }
    Ok(())
}

#[tokio::test]
async fn a_dropped_bump_leaves_the_version() -> Result<()> {
    let (_, m) = model();
    assert!(m.compare_and_set(KEY, None, "me", Some(TTL)).await?);
    let (_, v1) = m.renew_and_versions(KEY, "me", TTL, &[(DIR, None)]).await?;
    m.set_faults(ModelFaults {
        drop_bumps: 1.0,
        reuse_counters: false,
    });
    assert!(
        m.compare_and_set("hc:{g}:slot:1", None, "a", Some(TTL))
            .await?
    );
    let (_, v2) = m.renew_and_versions(KEY, "me", TTL, &[(DIR, None)]).await?;
    assert_eq!(v1, v2);
    assert_eq!(m.list(DIR).await?.len(), 2);
    Ok(())
}

#[tokio::test]
async fn a_write_publishes_its_directory_and_a_renewal_does_not() -> Result<()> {
    use headcount_core::notify::Notice;
    let (_, m) = model();
    assert!(m.capabilities().native_notifications);
    let mut n = m.subscribe(DIR).await?;
    assert!(m.compare_and_set(KEY, None, "me", Some(TTL)).await?);
    assert_eq!(n.try_recv(), Some(Notice::Changed));
    m.renew_and_list_if_changed(KEY, "me", TTL, DIR, None)
        .await?;
    assert_eq!(n.try_recv(), None);
    assert!(m.delete(KEY).await?);
    assert_eq!(n.try_recv(), Some(Notice::Changed));
    let snap = m.snapshot();
    m.restore(&snap);
    assert_eq!(n.try_recv(), Some(Notice::MayHaveMissed));
    Ok(())
}
