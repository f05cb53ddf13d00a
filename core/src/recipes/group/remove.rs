//! Removing a stopped group's keys: [`remove`].

use super::header::RECORD_COST;
use super::layout::GroupLayout;
use super::table::SlotTable;
use crate::error::{Error, Result};
use crate::keys::Keyspace;
use crate::DynStore;

/// What [`remove`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Removed {
    /// The keys deleted, in the order they were.
    pub keys: Vec<String>,
    /// Keys left in place: a slot key holding something that is not a slot record (written by
    /// another program, so not ours to delete), or a key that changed while it was removed (a
    /// member joined meanwhile).
    pub kept: Vec<String>,
}

/// Deletes what a group leaves behind once every member has stopped: its published view (and
/// the snapshots and change records of long views), its settled mark and its acknowledgements, which have no TTL or outlive the members (slot
/// records expire with their leases). Refuses with [`Error::Rejected`] while any member is
/// live, naming them, so it cannot pull the view from under a running group. Each key is
/// deleted only if it still holds what was read ([`Store::compare_and_delete`]), so a member
/// that joins meanwhile keeps the view it publishes (the key is reported in
/// [`Removed::kept`]).
///
/// A group that is removed and later joined again starts at epoch 1: fencing tokens start over,
/// so a sink that fenced the old group's writes must be reset too (or keep the group).
///
/// [`Store::compare_and_delete`]: crate::Store::compare_and_delete
pub async fn remove(store: &DynStore, prefix: &str, group: &str) -> Result<Removed> {
    let layout = GroupLayout::new(Keyspace::with_prefix(prefix, group)?);
    let table = SlotTable::read(store, &layout, &[], RECORD_COST).await?;
    if !table.slots.is_empty() {
        let live: Vec<String> = table
            .slots
            .iter()
            .map(|(slot, r)| format!("{} (slot {slot})", r.member))
            .collect();
        return Err(Error::Rejected {
            backend: store.capabilities().backend,
            message: format!(
                "group `{group}` has {} live member(s): {}; stop them (or wait for their leases to expire) before removing it",
                live.len(),
                live.join(", ")
            ),
            source: None,
        });
    }
    let mut removed = Removed::default();
    let mut candidates: Vec<(String, String)> = Vec::new();
    if let Some(text) = &table.view_text {
        candidates.push((layout.view.clone(), text.clone()));
    }
    if let Some(text) = &table.settled_text {
        candidates.push((layout.settled.clone(), text.clone()));
    }
    candidates.extend(store.list(&layout.acks).await?);
    candidates.extend(store.list(&layout.bases).await?);
    candidates.extend(store.list(&layout.changes).await?);
    for (key, text) in candidates {
        if store.compare_and_delete(&key, &text).await? {
            removed.keys.push(key);
        } else {
            removed.kept.push(key);
        }
    }
    removed
        .kept
        .extend(table.foreign.keys().map(|&slot| layout.slot(slot)));
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::error::ErrorKind;
    use crate::memory::MemoryStore;
    use crate::recipes::group::{Group, GroupConfig};

    #[tokio::test]
    async fn a_stopped_group_leaves_nothing_and_a_live_one_is_refused() {
        let store: DynStore = Arc::new(MemoryStore::new());
        let config = || GroupConfig::new("gone", Duration::from_millis(300));
        let a = Group::join(store.clone(), config().with_member("a"))
            .await
            .unwrap();
        let b = Group::join(store.clone(), config().with_member("b"))
            .await
            .unwrap();
        for m in [&a, &b] {
            m.active(0).await.unwrap();
        }
        // A foreign value at a slot key is not ours to delete.
        assert!(store
            .compare_and_set("hc:{gone}:slot:7", None, "not a record", None)
            .await
            .unwrap());
        let e = remove(&store, "hc", "gone").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Rejected);
        assert!(e.to_string().contains("a (slot 0)"), "{e}");
        assert!(store.get("hc:{gone}:view:current").await.unwrap().is_some());
        a.leave().await.unwrap();
        b.leave().await.unwrap();
        let removed = remove(&store, "hc", "gone").await.unwrap();
        assert!(
            removed.keys.contains(&"hc:{gone}:view:current".to_owned()),
            "{removed:?}"
        );
        assert_eq!(removed.kept, vec!["hc:{gone}:slot:7".to_owned()]);
        let left: Vec<String> = store
            .list("hc:{gone}:")
            .await
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(left, vec!["hc:{gone}:slot:7".to_owned()]);
        // Removing again finds nothing more to do, and the group can be joined afresh.
        assert!(remove(&store, "hc", "gone").await.unwrap().keys.is_empty());
        let c = Group::join(store.clone(), config().with_member("c"))
            .await
            .unwrap();
        c.active(0).await.unwrap();
        c.leave().await.unwrap();
    }
}
