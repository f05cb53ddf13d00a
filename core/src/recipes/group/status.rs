//! What `headcount status` shows: [`status`] and [`GroupStatus`].

use std::collections::BTreeMap;
use std::sync::Arc;

use super::keys::GroupKeys;
use super::records::{parse_acks, AckRecord, StandbyRecord, ViewRecord};
use super::table::Table;
use super::view::ViewState;
use crate::assign::{hash_bytes, AssignError, AssignorKind, KeySet};
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
    /// Whether the settled mark settles the published view (its epoch and its digest, which
    /// covers its holders and any stored owners): then
    /// every holder that view names acknowledged it.
    pub view_settled: bool,
    /// For each live slot of the published view, how many of the sampled keys it owns.
    pub sample_owned: Vec<(u32, u64)>,
    /// Keys that exist but the listings did not show: the view key when no view was listed,
    /// and the slot key of each holder of the view that no listing showed. A store whose
    /// listings read an index beside the data (Redis) shows them when the index lost their
    /// names; each comes back when its writer touches it (a slot at its holder's next
    /// heartbeat). Read with one `get` per missing key, so a healthy group costs nothing more.
    pub unlisted: Vec<String>,
    /// The assignor that maps keys to the published view's slots: the one the view names, or
    /// the one [`status`] was given for a view that names none.
    pub assignor: AssignorKind,
    /// The key set counted in [`keys_owned`](Self::keys_owned): the keys given to
    /// [`status_with_keys`], else the partitions a view of the balanced assignor declares
    /// (`with_partitions`); `None` otherwise.
    pub keys: Option<Arc<KeySet>>,
    /// For each live slot of the published view, how many of [`keys`](Self::keys) it owns.
    /// For a view of the sticky assignor, which stores each declared key's owner, counted from
    /// the view even when the names are not at hand (then [`keys`](Self::keys) is `None` and
    /// [`unmapped`](Self::unmapped) says why a name cannot be looked up). Empty otherwise.
    pub keys_owned: Vec<(u32, u64)>,
    /// Why the published view could not map keys to its slots: a view of the balanced assignor
    /// over a set of named keys (`with_keys`) that the store does not hold, and that was not
    /// given to [`status_with_keys`], or other keys than the view's were given. The counts are
    /// empty then and
    /// [`key_owner`](Self::key_owner) fails with the same error.
    pub unmapped: Option<AssignError>,
    /// The members standing by for a leaving member's slot
    /// ([`GroupConfig::with_standby`](super::GroupConfig::with_standby)), oldest first.
    pub standbys: Vec<Standby>,
}

/// A member standing by (see [`GroupStatus::standbys`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standby {
    /// Its member id.
    pub member: String,
    /// When it started standing by, wall clock, milliseconds since the Unix epoch.
    pub since_ms: u64,
    /// The slot a leaving member is handing to it, once one chose it.
    pub heir_of: Option<u32>,
}

/// Who owns one key under the published view: what `headcount status --key` prints
/// ([`GroupStatus::key_owner`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyOwner {
    /// The slot the view's assignor maps the key to.
    pub slot: u32,
    /// The slot's 1-based rank among the view's slots.
    pub index: u32,
    /// How many slots the view has.
    pub replicas: u32,
    /// The member id of the slot's claim when it is the claim the view names; `None` when the
    /// slot's holder is gone or claimed the slot again since (the key waits for the next view).
    pub member: Option<String>,
    /// The published view's epoch. A key grant taken under this view carries a token of at most
    /// this epoch: the first epoch since which its owner has held the key without a break
    /// ([`Grant::token`](super::Grant::token)), which only the owner knows. The store keeps no
    /// earlier views, so the token cannot be computed from it; it equals this epoch when the
    /// key moved to its owner in this view.
    pub view_epoch: u64,
}

impl GroupStatus {
    /// The newest epoch the holder of `slot` is known to have acknowledged: in its
    /// acknowledgement, in its slot record (the epoch it claimed at), or by the settled mark of
    /// the published view when that view names this claim. Acknowledgements expire four TTLs
    /// after they are written, and a steady group writes none: without the settled mark a
    /// member's `acked` would fall back to its claim's epoch, as if its hand-off were stuck.
    pub fn acked(&self, slot: u32) -> Option<u64> {
        let record = self.table.slots.get(&slot)?;
        let own = self
            .acks
            .get(&slot)
            .map_or(record.acked, |a| a.acked.max(record.acked));
        let settled = self
            .table
            .view
            .as_ref()
            .filter(|_| self.view_settled)
            .filter(|v| {
                v.holders
                    .binary_search_by_key(&slot, |h| h.slot)
                    .is_ok_and(|i| v.holders[i] == record.holder(slot))
            })
            .map_or(0, |v| v.epoch);
        Some(own.max(settled))
    }

    /// The owner of `key` under the published view, as [`Member::owns`](super::Member::owns)
    /// hashes it; `None` when no view is published or it has no slot. During a hand-off (the
    /// view not yet settled) the key's previous owner may still be finishing its grants, and the
    /// owner named here starts the key only once they are done.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> headcount_core::Result<()> {
    /// use std::sync::Arc;
    ///
    /// use headcount_core::assign::AssignorKind;
    /// use headcount_core::recipes::group::{status, Group, GroupConfig, DEFAULT_GROUP_TTL};
    /// use headcount_core::{DynStore, MemoryStore, DEFAULT_PREFIX};
    ///
    /// let store: DynStore = Arc::new(MemoryStore::new());
    /// let member =
    ///     Group::join(store.clone(), GroupConfig::new("orders", DEFAULT_GROUP_TTL)).await?;
    /// member.active(0).await?;
    /// let s = status(&store, DEFAULT_PREFIX, "orders", AssignorKind::JumpBackFailover, 0).await?;
    /// let owner = s.key_owner("order-42")?.expect("a view is published");
    /// assert_eq!(owner.member.as_deref(), Some(member.assignment().member.as_str()));
    /// member.leave().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn key_owner(&self, key: impl AsRef<[u8]>) -> Result<Option<KeyOwner>> {
        let Some(view) = &self.table.view else {
            return Ok(None);
        };
        if let Some(e) = &self.unmapped {
            return Err(e.clone().into());
        }
        let state = ViewState::build_with(view.clone(), self.assignor, self.keys.as_ref())?;
        let Some(slot) = state.owner(hash_bytes(key.as_ref())) else {
            return Ok(None);
        };
        let Some((index, replicas)) = state.pair(slot) else {
            return Ok(None);
        };
        let member = view
            .holders
            .iter()
            .find(|h| h.slot == slot)
            .and_then(|h| self.table.slots.get(&slot).filter(|r| r.holder(slot) == *h))
            .map(|r| r.member.clone());
        Ok(Some(KeyOwner {
            slot,
            index,
            replicas,
            member,
            view_epoch: view.epoch,
        }))
    }
}

/// Reads a group's slot table and view, and counts which slot owns each of the keys `0..sample`
/// (as decimal strings) under the published view with the assignor it names (`assignor` for a
/// view that names none). In a group that declares partitions (`with_partitions`), it also
/// counts each slot's partitions ([`GroupStatus::keys_owned`]); a group that declares named
/// keys (`with_keys`) needs them given: [`status_with_keys`].
pub async fn status(
    store: &DynStore,
    prefix: &str,
    group: &str,
    assignor: AssignorKind,
    sample: u64,
) -> Result<GroupStatus> {
    status_with_keys(store, prefix, group, assignor, sample, None).await
}

/// [`status`], also counting how many of the `declared` keys each slot owns ([`GroupStatus::keys_owned`]).
/// The store holds only the id of a group's declared key set (its count and a digest), so a
/// view of the balanced assignor over named keys (`GroupConfig::with_keys`) maps keys only when
/// given the same set; under any other assignor `declared` is any set to count.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> headcount_core::Result<()> {
/// use std::sync::Arc;
///
/// use headcount_core::assign::{AssignorKind, KeySet};
/// use headcount_core::recipes::group::{status_with_keys, Group, GroupConfig, DEFAULT_GROUP_TTL};
/// use headcount_core::{DynStore, MemoryStore, DEFAULT_PREFIX};
///
/// let names: Vec<String> = (0..8).map(|i| format!("tenant-{i}")).collect();
/// let keys = Arc::new(KeySet::new(&names)?);
/// let store: DynStore = Arc::new(MemoryStore::new());
/// let config = GroupConfig::new("tenants", DEFAULT_GROUP_TTL).with_keys((*keys).clone());
/// let member = Group::join(store.clone(), config).await?;
/// member.active(0).await?;
/// let kind = AssignorKind::JumpBackFailover; // for a view that names no assignor
/// let s = status_with_keys(&store, DEFAULT_PREFIX, "tenants", kind, 0, Some(keys)).await?;
/// assert_eq!(s.keys_owned.iter().map(|&(_, n)| n).sum::<u64>(), 8);
/// assert!(s.key_owner("tenant-3")?.is_some());
/// member.leave().await?;
/// # Ok(())
/// # }
/// ```
pub async fn status_with_keys(
    store: &DynStore,
    prefix: &str,
    group: &str,
    assignor: AssignorKind,
    sample: u64,
    declared: Option<Arc<KeySet>>,
) -> Result<GroupStatus> {
    let keys = GroupKeys::new(Keyspace::with_prefix(prefix, group)?);
    let table = Table::read(store, &keys).await?;
    let mut acks = parse_acks(&keys.acks, store.list(&keys.acks).await?);
    acks.retain(|slot, a| table.slots.get(slot).is_some_and(|r| r.nonce == a.nonce));
    let view_current = table
        .view
        .as_ref()
        .is_some_and(|v| v.holders == table.live());
    let view_settled = match (&table.view, table.settled) {
        (Some(v), Some(mark)) => mark.settles(v.epoch, v.digest()),
        _ => false,
    };
    let mut standbys: Vec<Standby> = store
        .list(&keys.standbys)
        .await?
        .into_iter()
        .filter_map(|(key, text)| {
            let record = StandbyRecord::parse(&text)?;
            Some(Standby {
                member: key.strip_prefix(&keys.standbys)?.to_owned(),
                since_ms: record.since_ms,
                heir_of: record.heir_of.map(|(slot, _)| slot),
            })
        })
        .collect();
    standbys.sort_by(|a, b| (a.since_ms, &a.member).cmp(&(b.since_ms, &b.member)));
    let mut unlisted = Vec::new();
    let mut missing = Vec::new();
    match &table.view {
        None if table.view_text.is_none() => missing.push(keys.view.clone()),
        None => {}
        Some(v) => missing.extend(
            v.slots()
                .filter(|s| !table.slots.contains_key(s) && !table.foreign.contains_key(s))
                .map(|s| keys.slot(s)),
        ),
    }
    for key in missing {
        if store.get(&key).await?.is_some() {
            unlisted.push(key);
        }
    }
    let mut sample_owned = Vec::new();
    let mut keys_owned = Vec::new();
    let mut unmapped = None;
    // The view names the assignor its publisher used; `assignor` is for older views.
    let assignor = table
        .view
        .as_ref()
        .and_then(|v| v.assignor)
        .unwrap_or(assignor);
    // A balanced or sticky view maps keys only with its declared set: the keys given, or the
    // partitions its key set's id names. Other keys given are not that set: reported as
    // unmapped.
    let declared = match assignor.declared() {
        Some(id) => match declared {
            Some(k) if k.id() == id => Some(k),
            Some(_) => None,
            None => KeySet::partitions(id.count)
                .ok()
                .filter(|p| p.id() == id)
                .map(Arc::new),
        },
        _ => declared,
    };
    if let Some(v) = &table.view {
        match assignor.declared() {
            Some(id) if declared.is_none() => {
                unmapped = Some(AssignError::KeysNotDeclared { id });
                // A sticky view stores every declared key's owner: count them without names.
                if let Some(owners) = &v.owners {
                    keys_owned = tally(v, owners.iter().copied());
                }
            }
            _ => {
                let state = ViewState::build_with(v.clone(), assignor, declared.as_ref())?;
                let count = |hashes: &mut dyn Iterator<Item = u64>| {
                    tally(v, hashes.filter_map(|h| state.owner(h)))
                };
                sample_owned =
                    count(&mut (0..sample).map(|k| hash_bytes(k.to_string().as_bytes())));
                if let Some(d) = &declared {
                    keys_owned = count(&mut d.hashes().iter().copied());
                }
            }
        }
    }
    Ok(GroupStatus {
        table,
        acks,
        view_current,
        view_settled,
        sample_owned,
        unlisted,
        assignor,
        keys: declared,
        keys_owned,
        unmapped,
        standbys,
    })
}

/// How many of `owners` each slot of `view` is, by slot (every slot listed, 0 when none).
fn tally(view: &ViewRecord, owners: impl Iterator<Item = u32>) -> Vec<(u32, u64)> {
    let mut counts: BTreeMap<u32, u64> = view.slots().map(|s| (s, 0)).collect();
    for owner in owners {
        *counts.entry(owner).or_insert(0) += 1;
    }
    counts.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipes::group::records::{Holder, SettledRecord, SlotRecord, ViewRecord};

    fn record(nonce: u64, acked: u64) -> SlotRecord {
        SlotRecord {
            member: format!("m{nonce}"),
            nonce,
            since_ms: 1,
            ttl_ms: 1000,
            acked,
            view: 0,
            parked: None,
            grace: None,
        }
    }

    /// Slots 0 (nonce 10, claimed at epoch 1) and 1 (nonce 11, claimed at epoch 4), no
    /// acknowledgement left, and a view of epoch 5 over `holders` settled or not.
    fn status_of(holders: Vec<Holder>, settled: bool) -> GroupStatus {
        let mut table = Table::default();
        table.slots.insert(0, record(10, 1));
        table.slots.insert(1, record(11, 4));
        let view = ViewRecord {
            epoch: 5,
            holders,
            assignor: None,
            owners: None,
        };
        table.settled = Some(SettledRecord {
            epoch: 5,
            view: if settled { view.digest() } else { 7 },
        });
        let view_settled = table.settled.is_some_and(|m| m.settles(5, view.digest()));
        table.view = Some(view);
        GroupStatus {
            table,
            acks: BTreeMap::new(),
            view_current: true,
            view_settled,
            sample_owned: Vec::new(),
            unlisted: Vec::new(),
            assignor: AssignorKind::JumpBackFailover,
            keys: None,
            keys_owned: Vec::new(),
            unmapped: None,
            standbys: Vec::new(),
        }
    }

    #[test]
    fn a_settled_view_vouches_for_the_claims_it_names_only() {
        let both = vec![Holder { slot: 0, nonce: 10 }, Holder { slot: 1, nonce: 11 }];
        let s = status_of(both.clone(), true);
        assert_eq!((s.acked(0), s.acked(1)), (Some(5), Some(5)));
        // A mark for other holders than the published view's vouches for nobody.
        let s = status_of(both, false);
        assert_eq!((s.acked(0), s.acked(1)), (Some(1), Some(4)));
        // Slot 1's claim is not the one the view names (it was claimed again since).
        let s = status_of(
            vec![Holder { slot: 0, nonce: 10 }, Holder { slot: 1, nonce: 99 }],
            true,
        );
        assert_eq!((s.acked(0), s.acked(1)), (Some(5), Some(4)));
        assert_eq!(s.acked(2), None);
    }

    #[test]
    fn a_keys_owner_is_the_slot_the_view_maps_it_to() {
        let both = vec![Holder { slot: 0, nonce: 10 }, Holder { slot: 1, nonce: 11 }];
        let s = status_of(both, true);
        let state = ViewState::build_with(
            s.table.view.clone().expect("a view"),
            AssignorKind::JumpBackFailover,
            None,
        )
        .expect("a view state");
        let mut seen = [false; 2];
        for k in 0..64 {
            let key = format!("order-{k}");
            let owner = s.key_owner(&key).expect("no error").expect("an owner");
            assert_eq!(Some(owner.slot), state.owner(hash_bytes(key.as_bytes())));
            assert_eq!((owner.index, owner.replicas), (owner.slot + 1, 2));
            assert_eq!(owner.member, Some(format!("m{}", 10 + owner.slot)));
            assert_eq!(owner.view_epoch, 5);
            seen[owner.slot as usize] = true;
        }
        assert_eq!(seen, [true, true], "64 keys all on one slot");
        // Slot 1 claimed again since the view: its keys have no member until the next view.
        let s = status_of(
            vec![Holder { slot: 0, nonce: 10 }, Holder { slot: 1, nonce: 99 }],
            true,
        );
        let on_1 = (0..64)
            .map(|k| format!("order-{k}"))
            .find(|k| s.key_owner(k).ok().flatten().is_some_and(|o| o.slot == 1))
            .expect("a key on slot 1");
        assert_eq!(
            s.key_owner(&on_1).ok().flatten().and_then(|o| o.member),
            None
        );
        // No view, no owner.
        let mut s = s;
        s.table.view = None;
        assert_eq!(s.key_owner("order-1").ok().flatten(), None);
    }
}
