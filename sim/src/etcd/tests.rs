//! The model answers versions as the etcd backend does (count and newest revision, a renewal
//! that writes only when it moves a key to a lease of its own), and a restore that reuses
//! revisions repeats a version for other contents unless the client watches the revisions (the
//! case of `conformance/tests/etcd_restore.rs`, on the model).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use super::EtcdModel;
use headcount_core::clock::ManualClock;
use headcount_core::error::Result;
use headcount_core::memory::MemoryStore;
use headcount_core::store::RenewedListing;
use headcount_core::Store;

const TTL: Duration = Duration::from_secs(10);
const SLOT: &str = "hc:{g}:slot";
const DIR: &str = "hc:{g}:d:";

fn model() -> (ManualClock, EtcdModel) {
    let clock = ManualClock::at_unix_secs(1_000_000);
    let data = MemoryStore::with_clock(Arc::new(clock.clone()));
    (clock, EtcdModel::new(data))
}

async fn look(m: &EtcdModel, since: Option<&str>) -> Result<RenewedListing> {
    m.renew_and_list_if_changed(SLOT, "me", TTL, DIR, since)
        .await
}

#[tokio::test]
async fn versions_are_count_and_newest_revision() -> Result<()> {
    let (clock, m) = model();
    assert!(m.compare_and_set(SLOT, None, "me", Some(TTL)).await?);
    assert!(
        m.compare_and_set("hc:{g}:d:a", None, "1", Some(TTL))
            .await?
    );
    let first = look(&m, None).await?;
    assert!(first.version.ends_with(".1.2"), "{}", first.version);
    // The first renewal moved the slot to a lease of its own (a put); later ones write nothing.
    let moved = m.revision();
    assert_eq!(moved, 3);
    let again = look(&m, Some(&first.version)).await?;
    assert_eq!((again.listing, m.revision()), (None, moved));
    // A rewrite with the same value is a put: a new revision, a new version.
    assert!(
        m.compare_and_set("hc:{g}:d:a", Some("1"), "1", None)
            .await?
    );
    let rewritten = look(&m, Some(&first.version)).await?;
    assert_ne!(rewritten.version, first.version);
    // A lease that runs out deletes its keys: a new revision, one key fewer.
    clock.advance(TTL * 2);
    let before = m.revision();
    assert_eq!(m.get("hc:{g}:x").await?, None);
    assert_eq!(m.revision(), before + 1);
    assert!(
        m.get("hc:{g}:d:a").await?.is_some(),
        "rewritten without a TTL"
    );
    Ok(())
}

/// What a client that looked before a restore sees after it, when another client wrote the lost
/// revision again: the version it holds, or a new one.
async fn after_a_restore(watch: bool, bump: i64, look_between: bool) -> Result<(bool, usize)> {
    let (_, m) = model();
    let m = m.with_watch(watch);
    assert!(m.compare_and_set(SLOT, None, "me", Some(TTL)).await?);
    assert!(m.compare_and_set("hc:{g}:d:a", None, "1", None).await?);
    look(&m, None).await?;
    let backup = m.snapshot();
    assert!(m.compare_and_set("hc:{g}:d:b", None, "lost", None).await?);
    let held = look(&m, None).await?;
    m.restore_bumped(&backup, bump);
    if look_between {
        m.get(SLOT).await?;
    }
    let other = m.handle();
    assert!(
        other
            .compare_and_set("hc:{g}:d:b", None, "new", None)
            .await?
    );
    let after = look(&m, Some(&held.version)).await?;
    let hidden = m.hidden().len();
    match &after.listing {
        Some(listing) => {
            assert!(listing.contains(&("hc:{g}:d:b".to_owned(), "new".to_owned())));
            assert_eq!(hidden + m.unseen().len(), 0);
        }
        None => assert_eq!(hidden + m.unseen().len(), 1, "the hidden change is counted"),
    }
    Ok((after.listing.is_some(), hidden))
}

#[tokio::test]
async fn a_restore_that_reuses_revisions_is_seen_by_a_client_that_watches() -> Result<()> {
    // Without the watch, the version comes back for other contents, where the watch saw it.
    assert_eq!(after_a_restore(false, 0, true).await?, (false, 1));
    assert_eq!(after_a_restore(true, 0, true).await?, (true, 0));
    // etcd's recommended restore needs no watch.
    assert_eq!(after_a_restore(false, 1_000_000, false).await?, (true, 0));
    // The limit: a client that sees nothing of the restored store before it reaches the
    // revision the client saw cannot tell (counted apart).
    assert_eq!(after_a_restore(true, 0, false).await?, (false, 0));
    Ok(())
}

#[tokio::test]
async fn a_put_or_delete_is_seen_by_every_client_and_a_keep_alive_is_not() -> Result<()> {
    use headcount_core::notify::Notice;
    let (_, m) = model();
    assert!(m.capabilities().native_notifications);
    let mut n = m.handle().subscribe(DIR).await?;
    assert!(
        m.compare_and_set("hc:{g}:d:a", None, "me", Some(TTL))
            .await?
    );
    assert_eq!(n.try_recv(), Some(Notice::Changed));
    // The first renewal moves the key to a lease of its own (a put), the next is a keep-alive.
    m.renew_and_list_if_changed("hc:{g}:d:a", "me", TTL, DIR, None)
        .await?;
    assert_eq!(n.try_recv(), Some(Notice::Changed));
    m.renew_and_list_if_changed("hc:{g}:d:a", "me", TTL, DIR, None)
        .await?;
    assert_eq!(n.try_recv(), None);
    assert!(m.delete("hc:{g}:d:a").await?);
    assert_eq!(n.try_recv(), Some(Notice::Changed));
    m.restore(&m.snapshot());
    assert_eq!(n.try_recv(), Some(Notice::MayHaveMissed));
    Ok(())
}
