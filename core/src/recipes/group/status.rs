//! What `headcount status` shows: [`status`] and [`GroupStatus`].

use std::collections::BTreeMap;

use super::keys::GroupKeys;
use super::records::{parse_acks, AckRecord};
use super::table::Table;
use super::view::ViewState;
use crate::assign::{hash_bytes, AssignorKind};
use crate::error::Result;
use crate::keys::Keyspace;
use crate::DynStore;

/// What `headcount status` shows: the slot table, the published view and ownership of a
/// sample of keys.
#[derive(Debug, Clone)]
pub struct GroupStatus {
    /// The parsed slot table.
    pub table: Table,
    /// The acknowledgements (`hc:{group}:ack:{i}`) that belong to a live slot's claim, by slot.
    pub acks: BTreeMap<u32, AckRecord>,
    /// Whether the published view names exactly the live slots.
    pub view_current: bool,
    /// For each live slot of the published view, how many of the sampled keys it owns.
    pub sample_owned: Vec<(u32, u64)>,
}

impl GroupStatus {
    /// The newest epoch the holder of `slot` acknowledged: in its acknowledgement, or in its
    /// slot record (the epoch it claimed at).
    pub fn acked(&self, slot: u32) -> Option<u64> {
        let record = self.table.slots.get(&slot)?;
        Some(
            self.acks
                .get(&slot)
                .map_or(record.acked, |a| a.acked.max(record.acked)),
        )
    }
}

/// Reads a group's slot table and view, and counts which slot owns each of the keys `0..sample`
/// (as decimal strings) under the published view with the assignor it names (`assignor` for a
/// view that names none).
pub async fn status(
    store: &DynStore,
    prefix: &str,
    group: &str,
    assignor: AssignorKind,
    sample: u64,
) -> Result<GroupStatus> {
    let keys = GroupKeys::new(Keyspace::with_prefix(prefix, group)?);
    let table = Table::read(store, &keys).await?;
    let mut acks = parse_acks(&keys.acks, store.list(&keys.acks).await?);
    acks.retain(|slot, a| table.slots.get(slot).is_some_and(|r| r.nonce == a.nonce));
    let view_current = table
        .view
        .as_ref()
        .is_some_and(|v| v.holders == table.live());
    let mut sample_owned = Vec::new();
    if let Some(v) = &table.view {
        // The view names the assignor its publisher used; `assignor` is for older views.
        let state = ViewState::build(v.clone(), v.assignor.unwrap_or(assignor))?;
        let mut counts: std::collections::BTreeMap<u32, u64> = v.slots().map(|s| (s, 0)).collect();
        for k in 0..sample {
            if let Some(owner) = state.owner(hash_bytes(k.to_string().as_bytes())) {
                *counts.entry(owner).or_insert(0) += 1;
            }
        }
        sample_owned = counts.into_iter().collect();
    }
    Ok(GroupStatus {
        table,
        acks,
        view_current,
        sample_owned,
    })
}
