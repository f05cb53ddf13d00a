//! What `headcount status` shows: [`status`] and [`GroupStatus`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::header::RECORD_COST;
use super::layout::GroupLayout;
use super::records::{parse_acks, AckRecord, StandbyRecord, ViewRecord};
use super::table::SlotTable;
use super::view::ViewState;
use crate::assign::{hash_bytes, AssignError, AssignorKind, KeySet};
use crate::error::{Error, Result};
use crate::keys::Keyspace;
use crate::DynStore;

/// What `headcount status` shows: the slot table, the published view and ownership of a
/// sample of keys.
#[derive(Debug, Clone)]
pub struct GroupStatus {
    /// The parsed slot table.
    pub table: SlotTable,
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
    /// How long the store keeps each live slot's record unless it is renewed (the key's remaining
    /// time to live, read with [`Store::list_with_ttl`](crate::Store::list_with_ttl) in the
    /// listing of the slots), by slot; empty on a store that cannot read TTLs
    /// ([`Capabilities::ttl_reads`](crate::Capabilities::ttl_reads)). See
    /// [`lease_left`](Self::lease_left).
    pub record_left: BTreeMap<u32, Duration>,
    /// What is wrong at the group's keys, each with its fix: a key holding a value (or, on
    /// Redis, a type) that is not a record of ours, a key the listings miss. [`status`] shows
    /// everything else beside them instead of failing.
    pub problems: Vec<Problem>,
}

/// Something wrong at one of a group's keys (see [`GroupStatus::problems`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The key.
    pub key: String,
    /// What kind of problem: `foreign_value` (a value that is not our record),
    /// `foreign_type` (another Redis type: members cannot read or write the key),
    /// `newer_version` (a record a later version of headcount wrote) or `unlisted` (the key
    /// exists but the store's listing misses it).
    pub kind: &'static str,
    /// What the key holds (its start, at most 64 characters), or why it could not be read.
    pub found: String,
    /// What it does to the group, and what to do about it.
    pub fix: String,
}

impl Problem {
    fn new(key: &str, kind: &'static str, found: &str, fix: impl Into<String>) -> Problem {
        let mut cut: String = found.chars().take(64).collect();
        if cut.len() < found.len() {
            cut.push('…');
        }
        Problem {
            key: key.to_owned(),
            kind,
            found: cut,
            fix: fix.into(),
        }
    }

    /// A listing or a read that failed on a key holding another Redis type; `None` for any
    /// other error, which [`status`] returns.
    fn of_error(e: &Error, fix: &str) -> Option<Problem> {
        match e {
            Error::ForeignValue { key, found, .. } => Some(Problem::new(
                key,
                "foreign_type",
                found,
                format!(
                    "{fix}; members cannot read past it: delete it with the store's own client \
                     (redis-cli DEL {key}) if no program of yours uses it, or move that program to \
                     another key"
                ),
            )),
            _ => None,
        }
    }
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
    /// What [`status`] would show for `table` with no acknowledgements, standbys or keys
    /// counted: whether its view is current and settled, under `assignor` for a view that names
    /// none. For a table read or built by other means (a test, a tool that reads a backup).
    pub fn of_table(table: SlotTable, assignor: AssignorKind) -> GroupStatus {
        let (view_current, view_settled) = view_flags(&table);
        let assignor = table
            .view
            .as_ref()
            .and_then(|v| v.assignor)
            .unwrap_or(assignor);
        GroupStatus {
            table,
            acks: BTreeMap::new(),
            view_current,
            view_settled,
            sample_owned: Vec::new(),
            unlisted: Vec::new(),
            assignor,
            keys: None,
            keys_owned: Vec::new(),
            unmapped: None,
            standbys: Vec::new(),
            record_left: BTreeMap::new(),
            problems: Vec::new(),
        }
    }

    /// How long the member of `slot` holds its lease unless it renews it, as the store counts
    /// it: its record's remaining time to live ([`record_left`](Self::record_left)) less the
    /// crash grace the record outlives the lease by; zero while the record lives on in that
    /// grace (the member stopped renewing). `None` for a parked claim (its record is kept for
    /// the restart window and holds no lease), a slot not listed, or a store that cannot read
    /// TTLs. Each renewal sets it back to the member's TTL.
    pub fn lease_left(&self, slot: u32) -> Option<Duration> {
        let record = self.table.slots.get(&slot)?;
        if record.parked.is_some() {
            return None;
        }
        let left = self.record_left.get(&slot)?;
        Some(left.saturating_sub(Duration::from_millis(record.grace.unwrap_or(0))))
    }

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

    /// Whether [`keys`](Self::keys) are the partitions `"0"`, `"1"`, ... (`with_partitions`,
    /// `run --partitions N`) rather than named keys.
    pub fn keys_are_partitions(&self) -> bool {
        self.keys.as_ref().is_some_and(|k| {
            u32::try_from(k.len())
                .ok()
                .and_then(|n| KeySet::partitions(n).ok())
                .is_some_and(|p| p.id() == k.id())
        })
    }

    /// The slot that owns each key of a set under the published view (`None` for a key no
    /// slot owns), for a page to draw as a grid: the declared partitions in their order `0`,
    /// `1`, ...; named declared keys ([`keys`](Self::keys)) in the order of their hashes
    /// ([`KeySet::keys`]); the owners a sticky view stores when the names are not at hand
    /// (the same order); else the `sample` keys `"0"`, `"1"`, ... (at most
    /// [`MAX_DECLARED_KEYS`](crate::assign::MAX_DECLARED_KEYS)). `None` without a view.
    pub fn owners(&self, sample: u64) -> Option<Vec<Option<u32>>> {
        let view = self.table.view.as_ref()?;
        if self.unmapped.is_some() {
            return view
                .owners
                .as_ref()
                .map(|o| o.iter().map(|&s| Some(s)).collect());
        }
        let state = ViewState::build_with(view.clone(), self.assignor, self.keys.as_ref()).ok()?;
        let numbered = |n: u64| {
            (0..n)
                .map(|k| state.owner(hash_bytes(k.to_string().as_bytes())))
                .collect()
        };
        Some(match &self.keys {
            Some(keys) if self.keys_are_partitions() => numbered(keys.len() as u64),
            Some(keys) => keys.hashes().iter().map(|&h| state.owner(h)).collect(),
            None => numbered(sample.min(crate::assign::MAX_DECLARED_KEYS as u64)),
        })
    }

    /// The slots that hold up the published view's hand-off, ascending: the view names their
    /// claims, is not settled, and they have not acknowledged it. Empty once it settles.
    pub fn holding_up(&self) -> Vec<u32> {
        let Some(view) = self.table.view.as_ref().filter(|_| !self.view_settled) else {
            return Vec::new();
        };
        let digest = view.digest();
        view.holders
            .iter()
            .filter(|h| {
                self.table
                    .slots
                    .get(&h.slot)
                    .is_some_and(|r| r.nonce == h.nonce)
                    && !self
                        .table
                        .slot_acked(h.slot, &self.acks, view.epoch, digest)
            })
            .map(|h| h.slot)
            .collect()
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
    let layout = GroupLayout::new(Keyspace::with_prefix(prefix, group)?);
    let mut problems = Vec::new();
    let (table, record_left) = read_table(store, &layout, &mut problems).await?;
    let acks = match store.list(&layout.acks).await {
        Ok(listing) => parse_acks(&layout.acks, listing),
        Err(e) => match Problem::of_error(&e, "an acknowledgement key holds another type") {
            Some(p) => {
                problems.push(p);
                BTreeMap::new()
            }
            None => return Err(e),
        },
    };
    let mut acks = acks;
    acks.retain(|slot, a| table.slots.get(slot).is_some_and(|r| r.nonce == a.nonce));
    let (view_current, view_settled) = view_flags(&table);
    let standby_listing = match store.list(&layout.standbys).await {
        Ok(listing) => listing,
        Err(e) => match Problem::of_error(&e, "a standby key holds another type") {
            Some(p) => {
                problems.push(p);
                Vec::new()
            }
            None => return Err(e),
        },
    };
    let mut standbys = Vec::new();
    for (key, text) in standby_listing {
        let (Some(member), Some(record)) = (
            key.strip_prefix(&layout.standbys),
            StandbyRecord::parse(&text),
        ) else {
            problems.push(Problem::new(
                &key,
                "foreign_value",
                &text,
                "not a standby record: members ignore it; delete it if no program of yours wrote it",
            ));
            continue;
        };
        standbys.push(Standby {
            member: member.to_owned(),
            since_ms: record.since_ms,
            heir_of: record.heir_of.map(|(slot, _)| slot),
        });
    }
    standbys.sort_by(|a, b| (a.since_ms, &a.member).cmp(&(b.since_ms, &b.member)));
    for (slot, value) in &table.foreign {
        problems.push(Problem::new(
            &layout.slot(*slot),
            "foreign_value",
            value,
            format!(
                "not a slot record: slot {slot} counts as occupied, so no member claims it; \
                 delete the key if no program of yours wrote it"
            ),
        ));
    }
    match (&table.view, &table.view_text) {
        (None, Some(text)) if table.view_newer.is_some() => problems.push(Problem::new(
            &layout.view,
            "newer_version",
            text,
            "a view a later version of headcount published: members of this version neither \
             replace it nor join while a holder it names is live; upgrade this headcount",
        )),
        (None, Some(text)) if table.view_header.is_some() => problems.push(Problem::new(
            &layout.view,
            "missing_snapshot",
            text,
            "the header of a long view whose snapshot (`base:<epoch>-<digest>` beside it) is gone \
             or is not that view: live members replace the view at their next change; with none \
             running, `headcount remove-group` deletes it",
        )),
        (None, Some(text)) => problems.push(Problem::new(
            &layout.view,
            "foreign_value",
            text,
            "not a view record: live members replace it with a view of their own at their next \
             change; with none running, `headcount remove-group` deletes it",
        )),
        _ => {}
    }
    if let (None, Some(text)) = (&table.settled, &table.settled_text) {
        problems.push(Problem::new(
            &layout.settled,
            "foreign_value",
            text,
            "not a settled mark: the view shows as not settled until the lowest member writes \
             a mark over it; with none running, `headcount remove-group` deletes it",
        ));
    }
    let mut unlisted = Vec::new();
    let mut missing = Vec::new();
    match &table.view {
        None if table.view_text.is_none() => missing.push(layout.view.clone()),
        None => {}
        Some(v) => missing.extend(
            v.slots()
                .filter(|s| !table.slots.contains_key(s) && !table.foreign.contains_key(s))
                .map(|s| layout.slot(s)),
        ),
    }
    for key in missing {
        // A key already reported (another Redis type at the view key) is not read again.
        if problems.iter().any(|p| p.key == key) {
            continue;
        }
        if store.get(&key).await?.is_some() {
            problems.push(Problem::new(
                &key,
                "unlisted",
                "",
                "the key exists but the store's listing misses it (a Redis key index that lost \
                 its name): it comes back when its writer touches it (a slot at its holder's next \
                 heartbeat); if it stays, restart that member",
            ));
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
        record_left,
        problems,
    })
}

/// [`SlotTable::read`], but a directory whose listing meets a key of another Redis type is a
/// [`Problem`], not a failure: the view directory's two keys are then read one by one (so a
/// view beside a foreign settled mark still shows), and a slot directory shows no members.
/// The slots are listed with their remaining TTLs where the store reads them (in the same
/// round trip on Redis and the SQL stores), answered by slot beside the table.
///
/// A long view's header is resolved from its snapshot; when a newer view replaced the snapshot
/// between the two reads, the table is read again (three times at most, as members do), so a
/// publication under way is not reported as a missing snapshot.
async fn read_table(
    store: &DynStore,
    layout: &GroupLayout,
    problems: &mut Vec<Problem>,
) -> Result<(SlotTable, BTreeMap<u32, Duration>)> {
    let mut tries = 0;
    loop {
        tries += 1;
        let mut found = Vec::new();
        let (table, left, resolved) = read_table_once(store, layout, &mut found).await?;
        if resolved || tries >= 3 {
            problems.extend(found);
            return Ok((table, left));
        }
    }
}

/// One reading of [`read_table`]'s; also answers whether the view is resolved.
async fn read_table_once(
    store: &DynStore,
    layout: &GroupLayout,
    problems: &mut Vec<Problem>,
) -> Result<(SlotTable, BTreeMap<u32, Duration>, bool)> {
    let views = match store.list(&layout.views).await {
        Ok(listing) => listing,
        Err(e) => {
            let Some(p) = Problem::of_error(&e, "a key of the view directory holds another type")
            else {
                return Err(e);
            };
            problems.push(p);
            let mut listing = Vec::new();
            for key in [&layout.view, &layout.settled] {
                match store.get(key).await {
                    Ok(Some(text)) => listing.push((key.clone(), text)),
                    Ok(None) => {}
                    Err(e) => match Problem::of_error(
                        &e,
                        "a key of the view directory holds another type",
                    ) {
                        // Already reported by the listing.
                        Some(p) if problems.iter().any(|q| q.key == p.key) => {}
                        Some(p) => problems.push(p),
                        None => return Err(e),
                    },
                }
            }
            listing
        }
    };
    let mut left = std::collections::HashMap::new();
    let listed = if store.capabilities().ttl_reads {
        store.list_with_ttl(&layout.slots).await.map(|listing| {
            listing
                .into_iter()
                .map(|(k, v, ttl)| {
                    if let Some(ttl) = ttl {
                        left.insert(k.clone(), ttl);
                    }
                    (k, v)
                })
                .collect()
        })
    } else {
        store.list(&layout.slots).await
    };
    let slots = match listed {
        Ok(listing) => listing,
        Err(e) => match Problem::of_error(
            &e,
            "a key of the slot directory holds another type: no member can be listed",
        ) {
            Some(p) => {
                problems.push(p);
                Vec::new()
            }
            None => return Err(e),
        },
    };
    let mut table = SlotTable::parse(&layout.slots, slots);
    table.set_view(&layout.views, views);
    // A long view's header is shown with its snapshot; one that is gone is a problem (below).
    let resolved = match table.resolve(store, layout, &[], RECORD_COST).await {
        Ok(resolved) => resolved,
        Err(e) => match Problem::of_error(&e, "the view's snapshot holds another type") {
            Some(p) => {
                problems.push(p);
                true
            }
            None => return Err(e),
        },
    };
    let record_left = table
        .slots
        .keys()
        .filter_map(|&slot| left.get(&layout.slot(slot)).map(|&ttl| (slot, ttl)))
        .collect();
    Ok((table, record_left, resolved))
}

/// Whether the table's view names exactly its live claims, and whether its settled mark
/// settles that view.
fn view_flags(table: &SlotTable) -> (bool, bool) {
    let current = table
        .view
        .as_ref()
        .is_some_and(|v| v.holders == table.live());
    let settled = match (&table.view, table.settled) {
        (Some(v), Some(mark)) => mark.settles(v.epoch, v.digest()),
        _ => false,
    };
    (current, settled)
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
        let mut table = SlotTable::default();
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
        table.view = Some(view);
        GroupStatus::of_table(table, AssignorKind::JumpBackFailover)
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

    /// `status` shows the members beside every foreign value at the group's keys, each
    /// named with a fix, instead of failing.
    #[tokio::test]
    async fn foreign_values_are_problems_shown_beside_the_members() {
        use crate::{MemoryStore, DEFAULT_PREFIX};
        // A member's slot record written by hand: no heartbeat replaces what the test writes.
        let store: DynStore = Arc::new(MemoryStore::new());
        let layout = GroupLayout::new(Keyspace::with_prefix(DEFAULT_PREFIX, "g").expect("keys"));
        let member = record(10, 0).to_string();
        for (key, value) in [
            (layout.slot(0), member.as_str()),
            (layout.view.clone(), "abc"),
            (layout.settled.clone(), "not a mark"),
            (layout.slot(7), "someone else's"),
            (layout.standby("x"), "?"),
        ] {
            store.delete(&key).await.expect("delete");
            assert!(store
                .compare_and_set(&key, None, value, None)
                .await
                .expect("write"));
        }
        let s = status(
            &store,
            DEFAULT_PREFIX,
            "g",
            AssignorKind::JumpBackFailover,
            10,
        )
        .await
        .expect("status shows what it can");
        assert_eq!(s.table.slots.len(), 1, "the member is shown");
        assert!(s.table.view.is_none());
        let mut found: Vec<(&str, &str)> = s
            .problems
            .iter()
            .map(|p| (p.key.as_str(), p.kind))
            .collect();
        found.sort_unstable();
        let mut expected = vec![
            (layout.view.as_str(), "foreign_value"),
            (layout.settled.as_str(), "foreign_value"),
            (layout.slot(7).leak() as &str, "foreign_value"),
            (layout.standby("x").leak() as &str, "foreign_value"),
        ];
        expected.sort_unstable();
        assert_eq!(found, expected);
        assert!(s
            .problems
            .iter()
            .all(|p| !p.fix.is_empty() && !p.found.is_empty()));
    }
}
