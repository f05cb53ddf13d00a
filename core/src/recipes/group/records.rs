//! The records of a group in the store, as text a person can read with the store's own client:
//! a slot record (`hc:{group}:slot:{i}`), the published view (`hc:{group}:view:current`), the mark
//! of the newest view every live slot acknowledged (`hc:{group}:view:settled`), and each slot's
//! acknowledgement (`hc:{group}:ack:{i}`).

use std::collections::BTreeMap;
use std::fmt;

use crate::assign::AssignorKind;

/// The format tag every record starts with, so a later format can be told apart.
const TAG: &str = "v1";

/// The format tag of an [`AckRecord`]. Earlier versions wrote acknowledgements tagged `v1` and
/// counted one for every older view as well; tagging this version's records `v2` keeps an older
/// member that shares a group by mistake from counting a newer member's acknowledgement of a
/// later view for its own (it reads `v2` as foreign, so it waits instead of settling).
const ACK_TAG: &str = "v2";

/// The most slots a view may name: a view of this many slots is about 24 bytes each.
pub(crate) const MAX_VIEW_SLOTS: usize = 1 << 16;

/// The highest epoch a record may carry: tokens must fit a signed 64-bit column (the PostgreSQL
/// fence), and `epoch + 1` must never overflow. A record above it is foreign.
pub const MAX_EPOCH: u64 = i64::MAX as u64 - 1;

/// One live slot's record: who holds it, since when, and the newest epoch it acknowledged.
///
/// `v1 member=<id> nonce=<16 hex> since=<unix ms> ttl=<ms> acked=<epoch> view=<16 hex>`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRecord {
    /// The member's stable id.
    pub member: String,
    /// Random per claim: tells two holders of one slot, or two processes with one member id,
    /// apart.
    pub nonce: u64,
    /// When the slot was claimed, wall clock, milliseconds since the Unix epoch.
    pub since_ms: u64,
    /// The lease TTL the holder renews with, in milliseconds.
    pub ttl_ms: u64,
    /// An epoch whose hand-off this holder completed: it holds no grant for a key it does not
    /// own in that view, and will never again start a key under an older one. This version
    /// writes the highest epoch it had seen when it claimed (holding nothing) and acknowledges
    /// later views in an [`AckRecord`]; earlier versions rewrote it at every acknowledgement.
    pub acked: u64,
    /// The [digest](ViewRecord::digest) of the view acknowledged under `acked`, or 0 when the
    /// holder acknowledged every view up to `acked` at once (a fresh claim holds nothing). A
    /// store that lost writes can mint one epoch twice, for two different views: the digest
    /// says which of them was acknowledged.
    pub view: u64,
}

impl SlotRecord {
    /// Whether this holder has acknowledged `view`: that epoch for that view, or that epoch or
    /// a newer one for every view (a claim holding nothing).
    ///
    /// An acknowledgement of a newer view does not count for an older one: a member that skipped
    /// view E and acknowledged E+1 may still hold a key it owns in E-1 and E+1 but not in E (a
    /// key that moved away in E and back in E+1), and activating E elsewhere would grant it twice.
    pub fn has_acked(&self, view: &ViewRecord) -> bool {
        self.has_acked_digest(view.epoch, view.digest())
    }

    /// [`SlotRecord::has_acked`] for the view of `epoch` whose [digest](ViewRecord::digest) the
    /// caller computed once: checking every record of a large group against one view must not
    /// recompute the view's digest per record.
    pub fn has_acked_digest(&self, epoch: u64, digest: u64) -> bool {
        (self.view == 0 && self.acked >= epoch) || (self.acked == epoch && self.view == digest)
    }

    /// Parses a slot record; `None` for anything else (a foreign value).
    pub fn parse(text: &str) -> Option<SlotRecord> {
        let mut parts = text.split(' ');
        if parts.next()? != TAG {
            return None;
        }
        let fields = fields(parts)?;
        let member = fields.get("member")?.to_string();
        crate::recipes::interval::check_member(&member).ok()?;
        let record = SlotRecord {
            member,
            nonce: u64::from_str_radix(fields.get("nonce")?, 16).ok()?,
            since_ms: fields.get("since")?.parse().ok()?,
            ttl_ms: fields.get("ttl")?.parse().ok()?,
            acked: fields.get("acked")?.parse().ok()?,
            view: u64::from_str_radix(fields.get("view")?, 16).ok()?,
        };
        (fields.len() == 6 && record.acked <= MAX_EPOCH).then_some(record)
    }

    /// The holder: member and nonce, as a view names it.
    pub fn holder(&self, slot: u32) -> Holder {
        Holder {
            slot,
            nonce: self.nonce,
        }
    }
}

impl fmt::Display for SlotRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{TAG} member={} nonce={:016x} since={} ttl={} acked={} view={:016x}",
            self.member, self.nonce, self.since_ms, self.ttl_ms, self.acked, self.view
        )
    }
}

/// `key=value` fields, each once.
fn fields<'a>(parts: impl Iterator<Item = &'a str>) -> Option<BTreeMap<&'a str, &'a str>> {
    let mut map = BTreeMap::new();
    for part in parts {
        let (k, v) = part.split_once('=')?;
        if map.insert(k, v).is_some() {
            return None;
        }
    }
    Some(map)
}

/// One slot of a view and the claim that held it: a new claim of the same slot is a different
/// holder, so it makes a new view and a new epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Holder {
    /// The slot number.
    pub slot: u32,
    /// The nonce of the claim.
    pub nonce: u64,
}

/// A slot holder's acknowledgement, kept outside the slot directory (`hc:{group}:ack:{i}`) so
/// that acknowledging does not change the slot table every member reads.
///
/// `v2 nonce=<16 hex> acked=<epoch> view=<16 hex>`: the claim it belongs to (an acknowledgement
/// whose nonce is not the live claim's counts for nothing), the epoch and the
/// [digest](ViewRecord::digest) of the view whose hand-off the holder completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckRecord {
    /// The nonce of the claim that acknowledged.
    pub nonce: u64,
    /// The acknowledged epoch.
    pub acked: u64,
    /// The acknowledged view's digest.
    pub view: u64,
}

impl AckRecord {
    /// Whether this acknowledges the view of `epoch` with `digest`: exactly that view. An
    /// acknowledgement of a newer view does not count for an older one (see
    /// [`SlotRecord::has_acked`]).
    pub fn has_acked_digest(&self, epoch: u64, digest: u64) -> bool {
        self.acked == epoch && self.view == digest
    }

    /// Parses an acknowledgement; `None` for anything else, including an earlier version's
    /// `v1` acknowledgement (it meant every older view as well).
    pub fn parse(text: &str) -> Option<AckRecord> {
        let mut parts = text.split(' ');
        if parts.next()? != ACK_TAG {
            return None;
        }
        let fields = fields(parts)?;
        let record = AckRecord {
            nonce: u64::from_str_radix(fields.get("nonce")?, 16).ok()?,
            acked: fields.get("acked")?.parse().ok()?,
            view: u64::from_str_radix(fields.get("view")?, 16).ok()?,
        };
        (fields.len() == 3 && record.acked <= MAX_EPOCH).then_some(record)
    }
}

impl fmt::Display for AckRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{ACK_TAG} nonce={:016x} acked={} view={:016x}",
            self.nonce, self.acked, self.view
        )
    }
}

/// The newest view every slot live at the time had acknowledged (or, gone from the store, had
/// lost its lease): `hc:{group}:view:settled`, written by one member after it read the
/// acknowledgements, so the others need not read them.
///
/// `v1 epoch=<E> view=<16 hex>`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettledRecord {
    /// The settled view's epoch.
    pub epoch: u64,
    /// The settled view's [digest](ViewRecord::digest).
    pub view: u64,
}

impl SettledRecord {
    /// Whether this settles the view of `epoch` with `digest`.
    pub fn settles(&self, epoch: u64, digest: u64) -> bool {
        self.epoch == epoch && self.view == digest
    }

    /// Parses a mark; `None` for anything else.
    pub fn parse(text: &str) -> Option<SettledRecord> {
        let mut parts = text.split(' ');
        if parts.next()? != TAG {
            return None;
        }
        let fields = fields(parts)?;
        let record = SettledRecord {
            epoch: fields.get("epoch")?.parse().ok()?,
            view: u64::from_str_radix(fields.get("view")?, 16).ok()?,
        };
        (fields.len() == 2 && record.epoch <= MAX_EPOCH).then_some(record)
    }
}

impl fmt::Display for SettledRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{TAG} epoch={} view={:016x}", self.epoch, self.view)
    }
}

/// The acknowledgements of a group's slots (a listing of `hc:{group}:ack:`), by slot. Values
/// that do not parse count as no acknowledgement.
pub(super) fn parse_acks(prefix: &str, listing: Vec<(String, String)>) -> BTreeMap<u32, AckRecord> {
    listing
        .into_iter()
        .filter_map(|(key, value)| {
            let suffix = key.strip_prefix(prefix)?;
            let slot: u32 = suffix.parse().ok()?;
            (slot.to_string() == suffix).then_some(())?;
            Some((slot, AckRecord::parse(&value)?))
        })
        .collect()
}

/// A published view: the epoch and the live slots with their holders.
///
/// `v1 epoch=<E> assignor=<name> slots=<slot>@<nonce hex>,...` (slots ascending; `slots=` empty
/// when nobody is live; `assignor=` absent in views written before it was recorded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewRecord {
    /// The epoch: minted by the store (a compare-and-set from the previous view), only increases.
    pub epoch: u64,
    /// The live slots, ascending.
    pub holders: Vec<Holder>,
    /// The assignor of the member that published it: members configured with another one
    /// would map keys differently, so they refuse to join.
    pub assignor: Option<AssignorKind>,
}

impl ViewRecord {
    /// Parses a view; `None` for anything else.
    pub fn parse(text: &str) -> Option<ViewRecord> {
        let mut parts = text.split(' ');
        if parts.next()? != TAG {
            return None;
        }
        let fields = fields(parts)?;
        let assignor = match fields.get("assignor") {
            Some(name) => Some(name.parse::<AssignorKind>().ok()?),
            None => None,
        };
        if fields.len() != 2 + usize::from(assignor.is_some()) {
            return None;
        }
        let epoch: u64 = fields.get("epoch")?.parse().ok()?;
        if epoch > MAX_EPOCH {
            return None;
        }
        let list = fields.get("slots")?;
        let mut holders = Vec::new();
        if !list.is_empty() {
            for item in list.split(',') {
                let (slot, nonce) = item.split_once('@')?;
                let slot: u32 = slot.parse().ok()?;
                if slot >= crate::assign::MAX_SLOTS {
                    return None;
                }
                holders.push(Holder {
                    slot,
                    nonce: u64::from_str_radix(nonce, 16).ok()?,
                });
                if holders.len() > MAX_VIEW_SLOTS {
                    return None;
                }
            }
        }
        // Strictly ascending slots: one holder per slot, one canonical text per view.
        if holders.windows(2).any(|w| w[0].slot >= w[1].slot) {
            return None;
        }
        Some(ViewRecord {
            epoch,
            holders,
            assignor,
        })
    }

    /// A digest of the holders (not the epoch), never 0: what a slot record's `view=` names.
    pub fn digest(&self) -> u64 {
        let mut text = String::with_capacity(self.holders.len() * 24);
        for h in &self.holders {
            text.push_str(&format!("{}@{:016x},", h.slot, h.nonce));
        }
        crate::assign::hash_bytes(text.as_bytes()) | 1
    }

    /// The live slot numbers, ascending.
    pub fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.holders.iter().map(|h| h.slot)
    }
}

impl fmt::Display for ViewRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{TAG} epoch={} ", self.epoch)?;
        if let Some(a) = self.assignor {
            write!(f, "assignor={} ", a.name())?;
        }
        f.write_str("slots=")?;
        for (i, h) in self.holders.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}@{:016x}", h.slot, h.nonce)?;
        }
        Ok(())
    }
}

/// What the listings of `hc:{group}:view:` and `hc:{group}:slot:` hold, parsed.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// Live slots whose record parses, by slot.
    pub slots: BTreeMap<u32, SlotRecord>,
    /// Slot keys holding something that is not a slot record (written by hand, or by another
    /// program): occupied, so nobody claims them, but not members.
    pub foreign: BTreeMap<u32, String>,
    /// The published view as stored (for a compare-and-set), when there is one.
    pub view_text: Option<String>,
    /// The published view, when there is one and it parses.
    pub view: Option<ViewRecord>,
    /// The settled mark as stored (for a compare-and-set), when there is one.
    pub settled_text: Option<String>,
    /// The settled mark, when there is one and it parses.
    pub settled: Option<SettledRecord>,
    /// A view at `hc:{group}:slot:view`, where earlier versions published it, when it parses.
    /// One that names a live claim was published after that claim: an older version of
    /// headcount is running in the group.
    pub legacy_view: Option<ViewRecord>,
}

impl Table {
    /// Parses the listing of the slot directory `prefix` (which ends in `slot:`), with no view.
    pub fn parse(prefix: &str, listing: Vec<(String, String)>) -> Table {
        let mut table = Table::default();
        for (key, value) in listing {
            let Some(suffix) = key.strip_prefix(prefix) else {
                continue;
            };
            if suffix == "view" {
                table.legacy_view = ViewRecord::parse(&value);
                continue;
            }
            if suffix == "settled" {
                continue;
            }
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
        for (key, value) in listing {
            match key.strip_prefix(prefix) {
                Some("current") => {
                    self.view = ViewRecord::parse(&value);
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
    pub fn take_view(&mut self, other: &Table) {
        self.view.clone_from(&other.view);
        self.view_text.clone_from(&other.view_text);
        self.settled = other.settled;
        self.settled_text.clone_from(&other.settled_text);
    }

    /// Whether a view at the place where earlier versions published it names a live claim:
    /// an older version of headcount published it after that claim, and is running in the group.
    pub fn legacy_member(&self) -> bool {
        self.legacy_view.as_ref().is_some_and(|v| {
            v.holders
                .iter()
                .any(|h| self.slots.get(&h.slot).is_some_and(|r| r.nonce == h.nonce))
        })
    }

    /// The highest epoch this listing shows: the view's, the settled mark's, or any member's
    /// acknowledgement in its slot record.
    pub fn highest_epoch(&self) -> u64 {
        let acked = self.slots.values().map(|r| r.acked).max().unwrap_or(0);
        let settled = self.settled.map_or(0, |s| s.epoch);
        self.view
            .as_ref()
            .map_or(0, |v| v.epoch)
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

    /// The live holders, ascending by slot: the view this listing calls for.
    pub fn live(&self) -> Vec<Holder> {
        self.slots.iter().map(|(&s, r)| r.holder(s)).collect()
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
    use super::*;

    #[test]
    fn slot_records_round_trip_and_reject_garbage() {
        let r = SlotRecord {
            member: "web-1".into(),
            nonce: 0xabc,
            since_ms: 1_700_000_000_000,
            ttl_ms: 3000,
            acked: 7,
            view: 0x1f,
        };
        let text = r.to_string();
        assert_eq!(
            text,
            "v1 member=web-1 nonce=0000000000000abc since=1700000000000 ttl=3000 acked=7 view=000000000000001f"
        );
        assert_eq!(SlotRecord::parse(&text), Some(r));
        for bad in [
            "",
            "garbage",
            "v2 member=a nonce=1 since=1 ttl=1 acked=1",
            "v1 member=a nonce=1 since=1 ttl=1",
            "v1 member=a nonce=1 since=1 ttl=1 acked=1 extra=2",
            "v1 member=a nonce=1 since=1 ttl=1 acked=1 acked=2",
            "v1 member=a b nonce=1 since=1 ttl=1 acked=1",
            "v1 member= nonce=1 since=1 ttl=1 acked=1",
            "v1 member=a nonce=zz since=1 ttl=1 acked=1",
            "v1 member=a nonce=1 since=-1 ttl=1 acked=1",
        ] {
            assert_eq!(SlotRecord::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn views_round_trip_and_reject_garbage() {
        let v = ViewRecord {
            epoch: 12,
            holders: vec![
                Holder { slot: 0, nonce: 1 },
                Holder {
                    slot: 4,
                    nonce: u64::MAX,
                },
            ],
            assignor: None,
        };
        let text = v.to_string();
        assert_eq!(
            text,
            "v1 epoch=12 slots=0@0000000000000001,4@ffffffffffffffff"
        );
        assert_eq!(ViewRecord::parse(&text), Some(v.clone()));
        let named = ViewRecord {
            assignor: Some(AssignorKind::JumpBackFailover),
            ..v
        };
        assert_eq!(
            named.to_string(),
            "v1 epoch=12 assignor=jumpback slots=0@0000000000000001,4@ffffffffffffffff"
        );
        assert_eq!(ViewRecord::parse(&named.to_string()), Some(named));
        assert_eq!(ViewRecord::parse("v1 epoch=1 assignor=nope slots="), None);
        let empty = ViewRecord {
            epoch: 3,
            holders: vec![],
            assignor: None,
        };
        assert_eq!(ViewRecord::parse(&empty.to_string()), Some(empty));
        for bad in [
            "",
            "{}",
            "v1 epoch=1",
            "v1 epoch=x slots=",
            "v1 epoch=1 slots=1@1,1@2",
            "v1 epoch=1 slots=2@1,1@2",
            "v1 epoch=1 slots=1",
            "v1 epoch=1 slots=1@1, ",
            "v1 epoch=-1 slots=",
        ] {
            assert_eq!(ViewRecord::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn acks_and_settled_marks_round_trip_and_reject_garbage() {
        let a = AckRecord {
            nonce: 0xabc,
            acked: 7,
            view: 0x1f,
        };
        assert_eq!(
            a.to_string(),
            "v2 nonce=0000000000000abc acked=7 view=000000000000001f"
        );
        assert_eq!(AckRecord::parse(&a.to_string()), Some(a));
        // Earlier versions parsed only `v1` acknowledgements and counted one for every older view
        // too: an older member sharing the group must read this version's as foreign, or it would
        // settle its own view on a newer member's acknowledgement of a later one.
        assert!(!a.to_string().starts_with("v1 "));
        // And an earlier version's acknowledgement means something else: not counted here.
        assert_eq!(
            AckRecord::parse("v1 nonce=0000000000000abc acked=7 view=000000000000001f"),
            None
        );
        assert!(a.has_acked_digest(7, 0x1f));
        assert!(!a.has_acked_digest(7, 0x20) && !a.has_acked_digest(8, 0x1f));
        // A member that skipped view 6 and acknowledged 7 may hold a key it lost in 6 and got
        // back in 7: its acknowledgement says nothing about 6.
        assert!(!a.has_acked_digest(6, 0x99));
        let s = SettledRecord {
            epoch: 9,
            view: 0x2b,
        };
        assert_eq!(s.to_string(), "v1 epoch=9 view=000000000000002b");
        assert_eq!(SettledRecord::parse(&s.to_string()), Some(s));
        assert!(s.settles(9, 0x2b) && !s.settles(9, 0x2c) && !s.settles(8, 0x2b));
        for bad in [
            "",
            "v2 nonce=1 acked=1",
            "v2 nonce=1 acked=1 view=1 x=1",
            "v2 nonce=1 acked=-1 view=1",
            "v2 nonce=1 acked=9223372036854775807 view=1",
            "v3 nonce=1 acked=1 view=1",
        ] {
            assert_eq!(AckRecord::parse(bad), None, "{bad:?}");
        }
        for bad in ["", "v1 epoch=1", "v1 epoch=x view=1", "v2 epoch=1 view=1"] {
            assert_eq!(SettledRecord::parse(bad), None, "{bad:?}");
        }
        let p = "hc:{g}:ack:";
        let acks = parse_acks(
            p,
            vec![
                (format!("{p}0"), a.to_string()),
                (format!("{p}01"), a.to_string()),
                (format!("{p}2"), "garbage".into()),
                (format!("{p}x"), a.to_string()),
            ],
        );
        assert_eq!(acks.into_iter().collect::<Vec<_>>(), [(0, a)]);
    }

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
            }
            .to_string()
        };
        let mut table = Table::parse(
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
        assert_eq!(table.view, None);
        // A view where earlier versions published it, naming a live claim.
        assert!(table.legacy_member());
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
