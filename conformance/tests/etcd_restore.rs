//! An etcd restored from an older copy of its data (a snapshot restore without
//! `--bump-revision`, a disk snapshot put back) hands the revisions it lost out again, to other
//! writes: a directory's version of count and newest revision could then repeat for other
//! contents, and a member would keep a view the store lost. A store handle
//! that sees a response below the revision it saw before starts a new generation of versions,
//! so every version it answered before the restore differs from every one after.
#![cfg(feature = "etcd")]
// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::{Duration, Instant};

use headcount::{DynStore, RenewedListing};
use headcount_harness::{skip_unless_required, KvServer, KvStore, ServerKind};

const TTL: Duration = Duration::from_secs(30);
const SLOT: &str = "hc:{restore}:slot";
const HOLDER: &str = "me";
/// The directory whose version the restore would repeat, and one the member also reads.
const DIR: &str = "hc:{restore}:d:";
const OTHER: &str = "hc:{restore}:view:";

/// Copies the directory `from` to `to`, which must not exist.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Stops the member, runs `f` on its directory (the data directory is `data` in it), starts it.
fn offline(server: &KvServer, f: impl FnOnce(&Path)) {
    server.kill().unwrap();
    f(server.dir());
    server.start().unwrap();
}

/// Runs `call` until the store answers (a handle reconnects after a restart by itself).
async fn retried<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = headcount::Result<T>>,
{
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match call().await {
            Ok(v) => return v,
            Err(e) if e.is_retryable() && Instant::now() < end => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

async fn look(store: &DynStore, dir: &str, since: Option<&str>) -> RenewedListing {
    let since = since.map(str::to_owned);
    retried("renew_and_list_if_changed", || {
        let since = since.clone();
        async move {
            store
                .renew_and_list_if_changed(SLOT, HOLDER, TTL, dir, since.as_deref())
                .await
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_that_reuses_revisions_changes_every_version() {
    let Some(etcd) = skip_unless_required(ServerKind::Etcd, "etcd_restore", KvStore::etcd(1, None))
    else {
        return;
    };
    let server = &etcd.servers[0];
    let member = headcount::connect(&etcd.url()).await.unwrap();
    assert!(member
        .compare_and_set(SLOT, None, HOLDER, Some(TTL))
        .await
        .unwrap());
    assert!(member
        .compare_and_set(&format!("{DIR}a"), None, "1", None)
        .await
        .unwrap());
    // The first renewal moves the slot to a lease of its own, which the backup then holds.
    assert!(look(&member, OTHER, None).await.renewed);

    // The backup, at revision R.
    offline(server, |dir| {
        copy_dir(&dir.join("data"), &dir.join("backup"))
    });

    // Lost with the restore: `b` written at R + 1, and the member's look at the directory.
    let lost = format!("{DIR}b");
    assert!(
        retried("a write after the backup", || member
            .compare_and_set(&lost, None, "lost", None))
        .await
    );
    let before = look(&member, DIR, None).await;
    let listed = before.listing.clone().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");

    // Restored, the store is back at revision R.
    offline(server, |dir| {
        std::fs::remove_dir_all(dir.join("data")).unwrap();
        copy_dir(&dir.join("backup"), &dir.join("data"));
    });
    // A heartbeat of the member reaches the restored store before anything is written to it (a
    // read: it writes nothing).
    retried("a read after the restore", || member.get(SLOT)).await;
    // Another process writes `b` again: at revision R + 1 too, so the directory has the count
    // and newest revision it had when the member looked.
    let other = headcount::connect(&etcd.url()).await.unwrap();
    assert!(other
        .compare_and_set(&lost, None, "new", None)
        .await
        .unwrap());

    let after = look(&member, DIR, Some(&before.version)).await;
    assert!(after.renewed);
    let Some(listing) = after.listing else {
        panic!(
            "the version {} came back after the restore, for other contents: the member keeps \
             `b` = \"lost\", which the store no longer holds",
            after.version
        );
    };
    assert!(
        listing.contains(&(lost.clone(), "new".to_owned())),
        "{listing:?}"
    );
    assert_ne!(after.version, before.version);
}
