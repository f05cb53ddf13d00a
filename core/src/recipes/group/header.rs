//! Large views as a small header and a snapshot: what a member reads of a view change is the
//! change, not the whole view.
//!
//! A view whose text is at most [`INLINE_MAX`] bytes is written whole at `hc:{group}:view:current`,
//! as it always was. A longer one (hundreds of members, or the sticky assignor's owner of every
//! declared key) is written in two parts:
//!
//! * the **snapshot**, the whole view's text, at `hc:{group}:base:<epoch>-<digest>`: named by the
//!   view's epoch and [digest](ViewRecord::digest), written *before* the header, outside the
//!   view directory, so no heartbeat lists it;
//! * the **header** at `hc:{group}:view:current`, the record every member reads on every change:
//!   `v2 epoch=<E> assignor=<name> view=<digest> prev=<epoch>-<digest> deltas=<delta>;<delta>…`
//!   (`prev=` names the replaced view's snapshot, empty when it had none), where
//!   each delta (newest first) turns the view of one digest into the next: `<from
//!   digest>/<slots added>/<slots dropped>/<keys moved>` (`3@<nonce>,…` / `1,2,…` /
//!   `<slot>:<key>.<gap>.<gap>…+<slot>:…`: the keys each slot gained, by their index in the
//!   declared set, in hexadecimal, each after the first as its distance from the one before).
//!   The header carries the newest change (when it is at most [`DELTAS_BYTES`] and half the
//!   snapshot's length) and older ones only while all fit in [`CARRIED_BYTES`], at most
//!   [`DELTAS_MAX`]: a large change travels alone, so what every member reads is that change;
//! * the **change record** of each view written as a header at `hc:{group}:change:<digest>`: the
//!   text of the delta that led to that view (its `from` names the view before), written by the
//!   publisher once the header is published and living [`CHANGE_TTLS`] lease TTLs.
//!
//! A member that holds the view a delta starts from applies the deltas to its copy and checks
//! that the result has the header's digest. One that missed a few more changes than the header
//! carries walks back through the change records, from the view the header's oldest delta
//! starts from, until it reaches a view it holds, and applies them forward: at most
//! [`CHANGES_WALKED`] records, and only while they cost less than the snapshot would
//! ([`walk_pays`]). Any other member (a newcomer, one that missed more changes still) reads the
//! snapshot. Either way every member ends with the same view, which the digest proves, at the
//! cost of the header, the changes it missed and, only when it must, one snapshot read.
//!
//! A snapshot is deleted by the publisher of the view after next (the next one's `prev` keeps
//! it for members that read its header just before), or at once when the view after it is
//! written whole; a publisher that lost its compare-and-set deletes its own once the header
//! shows that epoch taken by another view (epochs only rise, so it can never be published).

use std::fmt;
use std::sync::Arc;

use super::records::{Holder, ViewRecord, MAX_EPOCH};
use crate::assign::AssignorKind;

/// The longest view written whole at `view:current`; a longer one is written as a header and a
/// snapshot.
pub(crate) const INLINE_MAX: usize = 1024;

/// The most deltas a header carries.
pub(crate) const DELTAS_MAX: usize = 4;

/// The most bytes of deltas a header carries (and never more than half the snapshot): a change
/// that moves more is read from the snapshot.
pub(crate) const DELTAS_BYTES: usize = 64 * 1024;

/// The most bytes of deltas a header carries beyond the newest: the older changes of a burst of
/// small ones (joins in a cold start) ride along; a large change travels alone, and a member
/// that missed the ones before it reads them from their change records.
pub(crate) const CARRIED_BYTES: usize = 512;

/// The most change records a member reads, one after another, to catch up with a view before
/// it reads the view's snapshot instead.
pub(crate) const CHANGES_WALKED: usize = 8;

/// What one read of a change record costs, in bytes of a snapshot, by default
/// ([`GroupConfig::with_change_record_cost`](super::GroupConfig::with_change_record_cost)): a
/// round trip to the store (its latency, a command on the server) is worth about this many bytes
/// of one large read.
pub(crate) const RECORD_COST: usize = 8 * 1024;

/// [`walk_pays`] for a member holding `held` that reads `header`; the snapshot's length is
/// estimated from `held` (26 bytes a slot, and at least a byte per declared key's owner).
pub(crate) fn walk_pays_from(held: &ViewRecord, header: &ViewHeader, record_cost: usize) -> bool {
    let len = held.holders.len() * 26 + held.owners.as_ref().map_or(0, |o| o.len());
    walk_pays(
        held.epoch,
        len,
        header.epoch,
        header.deltas.len(),
        record_cost,
    )
}

/// Whether a member holding a view of `held_epoch`, `held_len` bytes long (about: the
/// snapshot's length), walks the change records back to it from a header of `epoch` that
/// carries `carried` changes, when one record costs `record_cost` bytes of the snapshot: when
/// the records it would read (one per epoch between, at most) are at most [`CHANGES_WALKED`]
/// and cost less than the snapshot.
pub(crate) fn walk_pays(
    held_epoch: u64,
    held_len: usize,
    epoch: u64,
    carried: usize,
    record_cost: usize,
) -> bool {
    let missed = epoch
        .saturating_sub(held_epoch)
        .saturating_sub(carried as u64);
    let missed = usize::try_from(missed).unwrap_or(usize::MAX);
    (1..=CHANGES_WALKED).contains(&missed) && missed.saturating_mul(record_cost) < held_len
}

/// How long a change record lives, in lease TTLs: long enough for a member that polls to catch
/// up through it.
pub(crate) const CHANGE_TTLS: u32 = 8;

/// How often, in epochs, the publisher of a view deletes the snapshots left behind
/// (`Runner::write_publication`).
pub(crate) const SWEEP_EVERY: u64 = 32;

/// The format tag of a header (a whole view is `v1`).
const TAG: &str = "v2";

/// One view change: what turns the view of digest `from` into the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewDelta {
    /// The digest of the view it applies to.
    pub from: u64,
    /// Slots added, or held under a new claim, ascending.
    pub added: Vec<Holder>,
    /// Slots no longer live, ascending.
    pub dropped: Vec<u32>,
    /// For the sticky assignor, the keys (by index in the declared set) that changed owner, with
    /// their new owner, ascending by key.
    pub moved: Vec<(u32, u32)>,
}

impl ViewDelta {
    /// The change from `prev` to `next`; `None` when it cannot be written as one (the sticky
    /// owners appear or vanish, or the key sets differ).
    pub fn between(prev: &ViewRecord, next: &ViewRecord) -> Option<ViewDelta> {
        if prev.assignor != next.assignor {
            return None;
        }
        let moved = match (&prev.owners, &next.owners) {
            (None, None) => Vec::new(),
            (Some(a), Some(b)) if a.len() == b.len() => a
                .iter()
                .zip(b.iter())
                .enumerate()
                .filter(|(_, (x, y))| x != y)
                .map(|(k, (_, &y))| (k as u32, y))
                .collect(),
            _ => return None,
        };
        let mut added = Vec::new();
        let mut dropped = Vec::new();
        let (mut i, mut j) = (0, 0);
        while i < prev.holders.len() || j < next.holders.len() {
            match (prev.holders.get(i), next.holders.get(j)) {
                (Some(p), Some(n)) if p.slot == n.slot => {
                    if p.nonce != n.nonce {
                        added.push(*n);
                    }
                    i += 1;
                    j += 1;
                }
                (Some(p), Some(n)) if p.slot < n.slot => {
                    dropped.push(p.slot);
                    i += 1;
                }
                (Some(p), None) => {
                    dropped.push(p.slot);
                    i += 1;
                }
                (_, Some(n)) => {
                    added.push(*n);
                    j += 1;
                }
                (None, None) => break,
            }
        }
        Some(ViewDelta {
            from: prev.digest(),
            added,
            dropped,
            moved,
        })
    }

    /// `view` changed by this delta (the epoch is left as it was); `None` when the delta does
    /// not fit it (a slot dropped that it does not name, a key past its owners).
    pub fn apply(&self, view: &ViewRecord) -> Option<ViewRecord> {
        let mut holders: Vec<Holder> = view
            .holders
            .iter()
            .filter(|h| self.dropped.binary_search(&h.slot).is_err())
            .copied()
            .collect();
        if holders.len() + self.dropped.len() != view.holders.len() {
            return None;
        }
        for h in &self.added {
            match holders.binary_search_by_key(&h.slot, |x| x.slot) {
                Ok(i) => holders[i] = *h,
                Err(i) => holders.insert(i, *h),
            }
        }
        let owners = match (&view.owners, holders.is_empty()) {
            (Some(owners), false) => {
                let mut owners: Vec<u32> = owners.to_vec();
                for &(k, slot) in &self.moved {
                    *owners.get_mut(k as usize)? = slot;
                }
                Some(Arc::from(owners))
            }
            (Some(_), true) | (None, _) if self.moved.is_empty() => None,
            _ => return None,
        };
        Some(ViewRecord {
            epoch: view.epoch,
            holders,
            assignor: view.assignor,
            owners,
        })
    }

    /// The length of the delta's text.
    fn len(&self) -> usize {
        self.to_string().len()
    }
}

impl fmt::Display for ViewDelta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}/", self.from)?;
        for (i, h) in self.added.iter().enumerate() {
            let sep = if i > 0 { "," } else { "" };
            write!(f, "{sep}{}@{:016x}", h.slot, h.nonce)?;
        }
        f.write_str("/")?;
        for (i, s) in self.dropped.iter().enumerate() {
            let sep = if i > 0 { "," } else { "" };
            write!(f, "{sep}{s}")?;
        }
        f.write_str("/")?;
        // Keys moved, grouped by their new owner: `<slot>:<first key>.<gap>.<gap>…`, the key
        // indices in hexadecimal, each after the first as its distance from the one before.
        let mut by_slot: Vec<(u32, u32)> = self.moved.iter().map(|&(k, s)| (s, k)).collect();
        by_slot.sort_unstable();
        let mut last: Option<(u32, u32)> = None;
        for (s, k) in by_slot {
            match last {
                Some((ls, lk)) if ls == s => write!(f, ".{:x}", k - lk)?,
                Some(_) => write!(f, "+{s}:{k:x}")?,
                None => write!(f, "{s}:{k:x}")?,
            }
            last = Some((s, k));
        }
        Ok(())
    }
}

/// Whether the values are strictly ascending.
fn ascending<T: PartialOrd>(values: impl Iterator<Item = T>) -> bool {
    let mut last: Option<T> = None;
    for v in values {
        if last.as_ref().is_some_and(|l| *l >= v) {
            return false;
        }
        last = Some(v);
    }
    true
}

impl ViewDelta {
    /// Parses a delta's text; `None` for anything else.
    pub fn parse(text: &str) -> Option<ViewDelta> {
        let mut parts = text.split('/');
        let from = u64::from_str_radix(parts.next()?, 16).ok()?;
        let added = items_by(parts.next()?, ',')
            .map(|item| {
                let (slot, nonce) = item.split_once('@')?;
                Some(Holder {
                    slot: slot.parse().ok()?,
                    nonce: u64::from_str_radix(nonce, 16).ok()?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let dropped = items_by(parts.next()?, ',')
            .map(|s| s.parse().ok())
            .collect::<Option<Vec<u32>>>()?;
        let mut moved = Vec::new();
        for group in items_by(parts.next()?, '+') {
            let (slot, keys) = group.split_once(':')?;
            let slot: u32 = slot.parse().ok()?;
            let mut key: Option<u32> = None;
            for step in keys.split('.') {
                let step = u32::from_str_radix(step, 16).ok()?;
                let k = match key {
                    None => step,
                    // Each key after the first is strictly above the one before.
                    Some(k) if step > 0 => k.checked_add(step)?,
                    Some(_) => return None,
                };
                moved.push((k, slot));
                key = Some(k);
            }
        }
        moved.sort_unstable();
        if parts.next().is_some()
            || !ascending(added.iter().map(|h| h.slot))
            || !ascending(dropped.iter())
            || !ascending(moved.iter().map(|m| m.0))
        {
            return None;
        }
        Some(ViewDelta {
            from,
            added,
            dropped,
            moved,
        })
    }
}

/// Where a view's snapshot is: `base:<epoch>-<digest>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Snapshot {
    /// The epoch it was published under.
    pub epoch: u64,
    /// The view's digest.
    pub view: u64,
}

impl Snapshot {
    /// Parses the name of a snapshot (`<epoch>-<digest>`, the key after `base:`).
    pub(crate) fn parse(text: &str) -> Option<Snapshot> {
        let (epoch, view) = text.split_once('-')?;
        Some(Snapshot {
            epoch: epoch.parse().ok()?,
            view: u64::from_str_radix(view, 16).ok()?,
        })
    }
}

impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{:016x}", self.epoch, self.view)
    }
}

/// The record at `hc:{group}:view:current` of a long view, written as a header and a snapshot.
///
/// A view longer than [`GroupConfig::with_view_inline_max`](super::GroupConfig::with_view_inline_max)
/// (1,024 bytes by default) is written whole at `hc:{group}:base:<epoch>-<digest>` first (its
/// [`Snapshot`]), then this header at `view:current`, with the usual compare-and-set:
/// `v2 epoch=<E> assignor=<name> view=<digest> prev=<epoch>-<digest> deltas=<delta>;<delta>…`.
/// Each [`ViewDelta`] (newest first: the newest, in at most 64 KiB and half the snapshot, and
/// older ones while all fit in 512 bytes, up to four) turns the view of one digest into the
/// next. A member holding the view a delta starts from follows the deltas
/// ([`ViewHeader::follow`]); one that holds an older view follows the change records
/// ([`ViewHeader::follow_through`]); any other reads the snapshot
/// ([`ViewHeader::from_snapshot`]); each checks the result against the header's digest. So a
/// view change costs each member the change, not the whole view.
///
/// ```
/// use headcount_core::recipes::group::{Holder, ViewHeader, ViewRecord};
///
/// let before = ViewRecord { epoch: 1, holders: vec![Holder { slot: 0, nonce: 7 }], assignor: None, owners: None };
/// let mut after = before.clone();
/// after.epoch = 2;
/// after.holders.push(Holder { slot: 1, nonce: 9 });
/// let header = ViewHeader::of(&after, Some(&before), None, 64 * 1024);
/// let text = header.to_string();
/// assert!(text.starts_with("v2 epoch=2 "));
/// // A member that held `before` gets `after` from the header alone.
/// assert_eq!(ViewHeader::parse(&text).unwrap().follow(&before), Some(after));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewHeader {
    /// The view's epoch.
    pub epoch: u64,
    /// The assignor of the member that published it.
    pub assignor: Option<AssignorKind>,
    /// The view's [digest](ViewRecord::digest): its snapshot is at `base:<digest>`.
    pub view: u64,
    /// The snapshot of the view it replaced (its epoch and digest), when that view was written
    /// as a header: kept until the next view, for members that read its header just before
    /// this one.
    pub prev: Option<Snapshot>,
    /// The last changes, newest first: the first turns the view of its `from` digest into this
    /// one.
    pub deltas: Vec<ViewDelta>,
}

impl ViewHeader {
    /// The header of `next`, replacing the published `prev` (whole, when this member read it)
    /// and its header, if it was written as one: the change from `prev` (when it fits in
    /// `limit`), then the changes `prev`'s header carried while all of them fit in
    /// 512 bytes.
    pub fn of(
        next: &ViewRecord,
        prev: Option<&ViewRecord>,
        prev_header: Option<&ViewHeader>,
        limit: usize,
    ) -> ViewHeader {
        let view = next.digest();
        let mut deltas = Vec::new();
        if let Some(delta) = prev.and_then(|p| ViewDelta::between(p, next)) {
            let mut bytes = delta.len();
            let from = delta.from;
            if bytes <= limit {
                deltas.push(delta);
                // The older changes still lead here when `prev` is the view the header stood for.
                if let Some(h) = prev_header.filter(|h| h.view == from) {
                    for d in &h.deltas {
                        bytes += d.len() + 1;
                        if deltas.len() >= DELTAS_MAX || bytes > limit.min(CARRIED_BYTES) {
                            break;
                        }
                        deltas.push(d.clone());
                    }
                }
            }
        }
        ViewHeader {
            epoch: next.epoch,
            assignor: next.assignor,
            view,
            prev: prev_header.map(ViewHeader::snapshot),
            deltas,
        }
    }

    /// Parses a header; `None` for anything else.
    pub fn parse(text: &str) -> Option<ViewHeader> {
        let mut parts = text.split(' ');
        if parts.next()? != TAG {
            return None;
        }
        let mut fields = std::collections::BTreeMap::new();
        for part in parts {
            let (k, v) = part.split_once('=')?;
            if fields.insert(k, v).is_some() {
                return None;
            }
        }
        let assignor = match fields.get("assignor") {
            Some(name) => Some(name.parse::<AssignorKind>().ok()?),
            None => None,
        };
        if fields.len() != 4 + usize::from(assignor.is_some()) {
            return None;
        }
        let prev = match *fields.get("prev")? {
            "" => None,
            text => Some(Snapshot::parse(text)?),
        };
        let epoch: u64 = fields.get("epoch")?.parse().ok()?;
        let deltas = items_by(fields.get("deltas")?, ';')
            .map(ViewDelta::parse)
            .collect::<Option<Vec<_>>>()?;
        (epoch <= MAX_EPOCH && deltas.len() <= DELTAS_MAX).then_some(())?;
        Some(ViewHeader {
            epoch,
            assignor,
            view: u64::from_str_radix(fields.get("view")?, 16).ok()?,
            prev,
            deltas,
        })
    }

    /// Where the view's snapshot is.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            epoch: self.epoch,
            view: self.view,
        }
    }

    /// The view this header stands for, from `held` (a view this member holds) by its deltas;
    /// `None` when they do not lead from `held` to this view (then the snapshot is read).
    pub fn follow(&self, held: &ViewRecord) -> Option<ViewRecord> {
        self.follow_from(held, held.digest())
    }

    /// [`ViewHeader::follow`] for `held` whose digest is `digest` (kept beside it, so a member
    /// does not compute it again).
    pub fn follow_from(&self, held: &ViewRecord, digest: u64) -> Option<ViewRecord> {
        if held.assignor != self.assignor {
            return None;
        }
        let mut view = if digest == self.view {
            held.clone()
        } else {
            let start = self.deltas.iter().position(|d| d.from == digest)?;
            let mut view = held.clone();
            for d in self.deltas[..=start].iter().rev() {
                view = d.apply(&view)?;
            }
            if view.digest() != self.view {
                return None;
            }
            view
        };
        view.epoch = self.epoch;
        Some(view)
    }

    /// [`ViewHeader::follow_from`] through `older`, the changes before this header's oldest one
    /// (newest first, read from their change records): the view this header stands for, from
    /// `held` (whose digest is `digest`), when `held` is where one of them starts.
    pub fn follow_through(
        &self,
        older: &[ViewDelta],
        held: &ViewRecord,
        digest: u64,
    ) -> Option<ViewRecord> {
        let chain = ViewHeader {
            deltas: self.deltas.iter().chain(older).cloned().collect(),
            ..self.clone()
        };
        chain.follow_from(held, digest)
    }

    /// The view its snapshot's text stands for: the snapshot's view under this header's epoch,
    /// when the snapshot is the view the header names.
    pub fn from_snapshot(&self, text: &str) -> Option<ViewRecord> {
        let mut view = ViewRecord::parse(text)?;
        if view.assignor != self.assignor || view.digest() != self.view {
            return None;
        }
        view.epoch = self.epoch;
        Some(view)
    }
}

/// Items of a list separated by `sep`, none for an empty one.
fn items_by(list: &str, sep: char) -> impl Iterator<Item = &str> {
    list.split(sep).filter(|_| !list.is_empty())
}

impl fmt::Display for ViewHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{TAG} epoch={} ", self.epoch)?;
        if let Some(a) = self.assignor {
            write!(f, "assignor={a} ")?;
        }
        write!(f, "view={:016x} prev=", self.view)?;
        if let Some(p) = self.prev {
            write!(f, "{p}")?;
        }
        f.write_str(" deltas=")?;
        for (i, d) in self.deltas.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// How a view is written: whole, or as a header and a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Publication {
    /// The epoch of the view.
    pub(crate) epoch: u64,
    /// The text of `view:current`.
    pub(crate) current: String,
    /// The snapshot to write first, with its text; none for a view written whole.
    pub(crate) snapshot: Option<(Snapshot, String)>,
    /// Snapshots nobody needs once this view is published: the one of two views ago, and the
    /// replaced view's when this one is written whole.
    pub(crate) stale: Vec<Snapshot>,
    /// The snapshot the header keeps for the members that read the replaced view's header.
    pub(crate) prev: Option<Snapshot>,
    /// The change record of this view: its digest (the key's suffix) and the text of the delta
    /// that led to it, written once the header is published, when the header carries it.
    pub(crate) change: Option<(u64, String)>,
}

impl Publication {
    /// How to publish `next` over the view directory's `prev` (whole, when this member read
    /// it) and its `prev_header` (when it was written as one), writing a view longer than
    /// `inline_max` bytes as a header and a snapshot.
    pub(crate) fn of(
        next: &ViewRecord,
        prev: Option<&ViewRecord>,
        prev_header: Option<&ViewHeader>,
        inline_max: usize,
    ) -> Publication {
        let whole = next.to_string();
        // The replaced view's own snapshot stays while the next is a header (members may have
        // read its header just now); the one it kept goes.
        let mut stale: Vec<Snapshot> = prev_header.and_then(|h| h.prev).into_iter().collect();
        if whole.len() <= inline_max {
            // Nobody reads a snapshot of a view written whole: the replaced view's goes too.
            stale.extend(prev_header.map(ViewHeader::snapshot));
            return Publication {
                epoch: next.epoch,
                current: whole,
                snapshot: None,
                stale,
                prev: None,
                change: None,
            };
        }
        let limit = DELTAS_BYTES.min(whole.len() / 2);
        let header = ViewHeader::of(next, prev, prev_header, limit);
        let change = header.deltas.first().map(|d| (header.view, d.to_string()));
        Publication {
            epoch: next.epoch,
            current: header.to_string(),
            snapshot: Some((header.snapshot(), whole)),
            stale,
            prev: header.prev,
            change,
        }
    }

    /// Whether the view this publishes needs `snapshot`: its own, or the one its header keeps.
    pub(crate) fn keeps(&self, snapshot: Snapshot) -> bool {
        self.snapshot.as_ref().is_some_and(|(s, _)| *s == snapshot) || self.prev == Some(snapshot)
    }

    /// Whether it is one compare-and-set of `view:current`: a view written whole over one that
    /// was too.
    pub(crate) fn is_whole(&self) -> bool {
        self.snapshot.is_none() && self.stale.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
