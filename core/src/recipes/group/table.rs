//! The slot table: what the listings of a group's slot and view directories hold, parsed.

use std::collections::BTreeMap;

use super::header::{walk_pays_from, ViewDelta, ViewHeader, CHANGES_WALKED};
use super::layout::GroupLayout;
use super::records::{AckRecord, Holder, SettledRecord, SlotRecord, ViewRecord};
use crate::error::Result;
use crate::DynStore;

/// A view a reader holds, to resolve a long view's header from, with its digest when the
/// reader keeps it.
#[derive(Debug, Clone, Copy)]
pub(super) struct HeldView<'a> {
    pub(super) view: &'a ViewRecord,
    pub(super) digest: Option<u64>,
}

/// What the listings of `hc:{group}:view:` and `hc:{group}:slot:` hold, parsed.
#[derive(Debug, Clone, Default)]
pub struct SlotTable {
    /// Live slots whose record parses, by slot.
    pub slots: BTreeMap<u32, SlotRecord>,
    /// Slot keys holding something that is not a slot record (written by hand, or by another
    /// program): occupied, so nobody claims them, but not members.
    pub foreign: BTreeMap<u32, String>,
    /// The published view as stored (for a compare-and-set), when there is one.
    pub view_text: Option<String>,
    /// The published view, when there is one and it parses (for a long view, once its header
    /// was resolved from its deltas or its snapshot: see [`ViewHeader`]).
    pub view: Option<ViewRecord>,
    /// The header of the published view, when it is a long one written as a header and a
    /// snapshot (see [`ViewHeader`]).
    pub view_header: Option<ViewHeader>,
    /// The epoch and holders of the published view when a later version of headcount wrote it
    /// (see [`ViewRecord::newer_version`]).
    pub view_newer: Option<(u64, Vec<Holder>)>,
    /// The settled mark as stored (for a compare-and-set), when there is one.
    pub settled_text: Option<String>,
    /// The settled mark, when there is one and it parses.
    pub settled: Option<SettledRecord>,
}

impl SlotTable {
    /// Reads a group's view directory, then its slot directory: every slot a view names was
    /// claimed before the view was published, so it is in the listing unless it is gone.
    ///
    /// A long view's header is resolved from one of the views in `held` (the reader's own
    /// copies) by its changes, or else from its snapshot. When the snapshot is gone because a
    /// newer view replaced it meanwhile, the table is read again (three times at most; then the
    /// view is left unresolved, as a garbled one, and members replace it).
    pub(super) async fn read(
        store: &DynStore,
        layout: &GroupLayout,
        held: &[HeldView<'_>],
        record_cost: usize,
    ) -> Result<SlotTable> {
        let mut tries = 0;
        loop {
            let views = store.list(&layout.views).await?;
            let listing = store.list(&layout.slots).await?;
            let mut table = SlotTable::parse(&layout.slots, listing);
            table.set_view(&layout.views, views);
            tries += 1;
            if table.resolve(store, layout, held, record_cost).await? || tries >= 3 {
                return Ok(table);
            }
        }
    }

    /// Resolves a long view's header ([`SlotTable::view_header`]) into [`SlotTable::view`]:
    /// from one of the views in `held` by the header's changes, which costs no store call; else
    /// through the change records when a few lead back to one of them, each read costing
    /// `record_cost` bytes of the snapshot (see [`walk_pays`]); else from its snapshot, one read.
    /// Returns `false` when the snapshot is gone or is not the view the header names: a newer
    /// view replaced it since the header was read (read the table again), or it was lost
    /// (members replace the view as a garbled one).
    ///
    /// [`walk_pays`]: super::header::walk_pays
    pub(super) async fn resolve(
        &mut self,
        store: &DynStore,
        layout: &GroupLayout,
        held: &[HeldView<'_>],
        record_cost: usize,
    ) -> Result<bool> {
        let Some(header) = &self.view_header else {
            return Ok(true);
        };
        if self.view.is_some() {
            return Ok(true);
        }
        // Views whose digest is known first: a member usually holds the view the newest change
        // starts from. The others' digests are computed once, for both ways.
        let known: Vec<(&ViewRecord, u64)> = held
            .iter()
            .filter_map(|h| Some((h.view, h.digest?)))
            .collect();
        if let Some(view) = known.iter().find_map(|&(v, d)| header.follow_from(v, d)) {
            self.view = Some(view);
            return Ok(true);
        }
        let mut digests = known;
        for h in held.iter().filter(|h| h.digest.is_none()) {
            let digest = h.view.digest();
            if let Some(view) = header.follow_from(h.view, digest) {
                self.view = Some(view);
                return Ok(true);
            }
            digests.push((h.view, digest));
        }
        if self
            .resolve_by_changes(store, layout, &digests, record_cost)
            .await?
        {
            return Ok(true);
        }
        let Some(header) = &self.view_header else {
            return Ok(true);
        };
        let text = store.get(&layout.base(header.snapshot())).await?;
        self.view = text.as_deref().and_then(|t| header.from_snapshot(t));
        Ok(self.view.is_some())
    }

    /// [`SlotTable::resolve`] through the change records (see [`super::header`]): walks back
    /// from the view the header's oldest delta starts from, one record at a time, until a record
    /// starts from one of `held` (with their digests), then follows the changes forward. Only
    /// when it pays ([`walk_pays`]: a few records, cheaper than the snapshot). Returns whether
    /// the view is resolved; a record missing, garbled or leading elsewhere ends the walk (the
    /// snapshot is read instead).
    ///
    /// [`walk_pays`]: super::header::walk_pays
    async fn resolve_by_changes(
        &mut self,
        store: &DynStore,
        layout: &GroupLayout,
        held: &[(&ViewRecord, u64)],
        record_cost: usize,
    ) -> Result<bool> {
        let Some(header) = &self.view_header else {
            return Ok(false);
        };
        let Some(oldest) = header.deltas.last() else {
            return Ok(false);
        };
        let walkable: Vec<(&ViewRecord, u64)> = held
            .iter()
            .copied()
            .filter(|(v, _)| walk_pays_from(v, header, record_cost))
            .collect();
        if walkable.is_empty() {
            return Ok(false);
        }
        let (mut at, mut older) = (oldest.from, Vec::new());
        for _ in 0..CHANGES_WALKED {
            let text = store.get(&layout.change(at)).await?;
            let Some(delta) = text.as_deref().and_then(ViewDelta::parse) else {
                return Ok(false);
            };
            at = delta.from;
            older.push(delta);
            if let Some(&(view, digest)) = walkable.iter().find(|(_, d)| *d == at) {
                self.view = header.follow_through(&older, view, digest);
                return Ok(self.view.is_some());
            }
        }
        Ok(false)
    }

    /// Parses the listing of the slot directory `prefix` (which ends in `slot:`), with no view.
    pub fn parse(prefix: &str, listing: Vec<(String, String)>) -> SlotTable {
        let mut table = SlotTable::default();
        for (key, value) in listing {
            let Some(suffix) = key.strip_prefix(prefix) else {
                continue;
            };
            // Only canonical numbers: `007` is not slot 7.
            let Ok(slot) = suffix.parse::<u32>() else {
                continue;
            };
            if slot.to_string() != suffix {
                continue;
            }
            // A slot no assignor can address is not a member: nobody can claim it either.
            if slot >= crate::assign::MAX_SLOTS {
                table.foreign.insert(slot, value);
                continue;
            }
            match SlotRecord::parse(&value) {
                Some(record) => {
                    table.slots.insert(slot, record);
                }
                None => {
                    table.foreign.insert(slot, value);
                }
            }
        }
        table
    }

    /// Takes the view and the settled mark from the listing of the view directory `prefix`
    /// (which ends in `view:`), replacing those it had.
    pub fn set_view(&mut self, prefix: &str, listing: Vec<(String, String)>) {
        (self.view, self.view_text, self.settled, self.settled_text) = (None, None, None, None);
        (self.view_newer, self.view_header) = (None, None);
        for (key, value) in listing {
            match key.strip_prefix(prefix) {
                Some("current") => {
                    self.view = ViewRecord::parse(&value);
                    if self.view.is_none() {
                        self.view_header = ViewHeader::parse(&value);
                    }
                    if self.view.is_none() && self.view_header.is_none() {
                        self.view_newer = ViewRecord::newer_version(&value);
                    }
                    self.view_text = Some(value);
                }
                Some("settled") => {
                    self.settled = SettledRecord::parse(&value);
                    self.settled_text = Some(value);
                }
                _ => {}
            }
        }
    }

    /// Takes the view and the settled mark of `other`.
    pub fn take_view(&mut self, other: &SlotTable) {
        self.view.clone_from(&other.view);
        self.view_header.clone_from(&other.view_header);
        self.view_newer.clone_from(&other.view_newer);
        self.view_text.clone_from(&other.view_text);
        self.settled = other.settled;
        self.settled_text.clone_from(&other.settled_text);
    }

    /// The highest epoch this listing shows: the view's, the settled mark's, or any member's
    /// acknowledgement in its slot record.
    pub fn highest_epoch(&self) -> u64 {
        let acked = self.slots.values().map(|r| r.acked).max().unwrap_or(0);
        let settled = self.settled.map_or(0, |s| s.epoch);
        self.view
            .as_ref()
            .map_or(0, |v| v.epoch)
            .max(self.view_header.as_ref().map_or(0, |h| h.epoch))
            .max(self.view_newer.as_ref().map_or(0, |(e, _)| *e))
            .max(acked)
            .max(settled)
    }

    /// Whether the holder of `slot` acknowledged the view of `epoch` with `digest`, in its slot
    /// record or in an acknowledgement of `acks` that belongs to its claim.
    pub fn slot_acked(
        &self,
        slot: u32,
        acks: &BTreeMap<u32, AckRecord>,
        epoch: u64,
        digest: u64,
    ) -> bool {
        self.slots.get(&slot).is_some_and(|r| {
            r.has_acked_digest(epoch, digest)
                || acks
                    .get(&slot)
                    .is_some_and(|a| a.nonce == r.nonce && a.has_acked_digest(epoch, digest))
        })
    }

    /// The epoch of the published view when a later version of headcount wrote it and a holder
    /// it names is live: then members neither replace nor adopt it, nor join (see
    /// [`ViewRecord::newer_version`]). Once its holders are all gone it is replaced like a
    /// garbled view.
    pub fn newer_view_in_use(&self) -> Option<u64> {
        let (epoch, holders) = self.view_newer.as_ref()?;
        holders
            .iter()
            .any(|h| self.slots.get(&h.slot).is_some_and(|r| r.nonce == h.nonce))
            .then_some(*epoch)
    }

    /// The live holders, ascending by slot: the view this listing calls for.
    pub fn live(&self) -> Vec<Holder> {
        self.slots.iter().map(|(&s, r)| r.holder(s)).collect()
    }

    /// The slots whose claims are working, ascending: every live slot but those parked for a
    /// restart ([`SlotRecord::parked`]). The lowest of them publishes and settles views, and the
    /// two lowest watch the table: a parked claim is in the view but does nothing.
    pub fn working(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .filter(|(_, r)| !r.is_parked())
            .map(|(&s, _)| s)
    }

    /// The lowest slot number at or above `from` that holds no key (neither a member nor a
    /// foreign value).
    pub fn lowest_free(&self, from: u32) -> u32 {
        let mut i = from;
        while self.slots.contains_key(&i) || self.foreign.contains_key(&i) {
            i += 1;
        }
        i
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::records::{Holder, SlotRecord};
    use super::SlotTable;

    #[test]
    fn tables_sort_members_foreign_values_and_the_view() {
        let p = "hc:{g}:slot:";
        let rec = |m: &str, n: u64| {
            SlotRecord {
                member: m.into(),
                nonce: n,
                since_ms: 0,
                ttl_ms: 1000,
                acked: 0,
                view: 0,
                parked: None,
                grace: None,
            }
            .to_string()
        };
        let mut table = SlotTable::parse(
            p,
            vec![
                (format!("{p}0"), rec("a", 1)),
                (format!("{p}1"), "garbage".into()),
                (format!("{p}007"), rec("x", 9)),
                (format!("{p}3"), rec("c", 3)),
                (format!("{p}view"), "v1 epoch=4 slots=3@3".into()),
                (format!("{p}other"), "ignored".into()),
            ],
        );
        assert_eq!(table.slots.keys().copied().collect::<Vec<_>>(), [0, 3]);
        assert_eq!(table.foreign.keys().copied().collect::<Vec<_>>(), [1]);
        // A view is read from the view directory, never from the slot directory.
        assert_eq!(table.view, None);
        let v = "hc:{g}:view:";
        table.set_view(
            v,
            vec![
                (format!("{v}current"), "not a view".into()),
                (
                    format!("{v}settled"),
                    "v1 epoch=2 view=000000000000000a".into(),
                ),
            ],
        );
        assert_eq!(table.view, None);
        assert_eq!(table.view_text.as_deref(), Some("not a view"));
        assert_eq!(table.settled.map(|m| m.epoch), Some(2));
        assert_eq!(table.highest_epoch(), 2);
        assert_eq!(table.lowest_free(0), 2);
        assert_eq!(table.lowest_free(3), 4);
        assert_eq!(
            table.live(),
            [Holder { slot: 0, nonce: 1 }, Holder { slot: 3, nonce: 3 }]
        );
    }
}
