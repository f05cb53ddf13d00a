//! The records of a group in the store, as text a person can read with the store's own client:
//! a slot record (`hc:{group}:slot:{i}`), the published view (`hc:{group}:view:current`), the mark
//! of the newest view every live slot acknowledged (`hc:{group}:view:settled`), and each slot's
//! acknowledgement (`hc:{group}:ack:{i}`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::assign::AssignorKind;

/// The format tag every record starts with, so a later format can be told apart.
const TAG: &str = "v1";

/// The most slots a view may name: a view of this many slots is about 24 bytes each.
pub(crate) const MAX_VIEW_SLOTS: usize = 1 << 16;

/// The longest text of a view of `slots` live slots (numbered below `slots`, at the largest
/// epoch), published with `assignor`, whose owners (the sticky assignor's) name `owners` keys:
/// what a group of `slots` members needs from one store value.
pub(crate) fn longest_view(slots: u32, assignor: AssignorKind, owners: Option<usize>) -> usize {
    let n = slots as usize;
    // The digits of every slot number below `slots`: a smaller group names fewer slots, each
    // no longer than these, and needs no more bits per owner.
    let mut digits = 0;
    let mut width = 1;
    let mut from = 0u64;
    while from < u64::from(slots) {
        let to = (10u64.pow(width as u32)).min(u64::from(slots));
        digits += (to - from) as usize * width;
        from = to;
        width += 1;
    }
    let header = TAG.len() + " epoch=".len() + MAX_EPOCH.to_string().len();
    let assignor = " assignor=".len() + assignor.to_string().len();
    // `<slot>@<16 hex>`, separated by commas.
    let holders = " slots=".len() + digits + n * (1 + 16) + n.saturating_sub(1);
    let owners = owners.map_or(0, |keys| {
        let bits = (usize::BITS - n.saturating_sub(1).leading_zeros()).max(1) as usize;
        // Unpadded base64 of the packed ranks.
        " owners=".len() + ((keys * bits).div_ceil(8) * 4).div_ceil(3)
    });
    header + assignor + holders + owners
}

/// The largest group whose every view fits one store value ([`longest_view`]), and no more
/// than a view may name ([`MAX_VIEW_SLOTS`]).
pub(crate) fn largest_group(assignor: AssignorKind, owners: Option<usize>) -> u32 {
    let (mut lo, mut hi) = (1u32, MAX_VIEW_SLOTS as u32);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if longest_view(mid, assignor, owners) <= crate::store::MAX_VALUE_LEN {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The highest epoch a record may carry: tokens must fit a signed 64-bit column (the PostgreSQL
/// fence), and `epoch + 1` must never overflow. A record above it is foreign.
pub const MAX_EPOCH: u64 = i64::MAX as u64 - 1;

/// One live slot's record: who holds it, since when, and the newest epoch it acknowledged.
///
/// `v1 member=<id> nonce=<16 hex> since=<unix ms> ttl=<ms> acked=<epoch> view=<16 hex>`, then
/// ` grace=<ms>` when the member has a crash grace (see [`SlotRecord::grace`]), and
/// ` parked=<unix ms>` at the end while the member is away for a restart (see
/// [`SlotRecord::parked`]).
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
    /// own in that view, and will never again start a key under an older one. A claim writes
    /// the highest epoch it had seen when it claimed (holding nothing) and acknowledges later
    /// views in an [`AckRecord`].
    pub acked: u64,
    /// The [digest](ViewRecord::digest) of the view acknowledged under `acked`, or 0 when the
    /// holder acknowledged every view up to `acked` at once. A claim holds nothing and writes 0;
    /// later acknowledgements, with their digest, go to an [`AckRecord`]. Read and written back
    /// as it is, so a record keeps its text.
    pub view: u64,
    /// Set while the claim is *parked*: its member left for a restart
    /// ([`Member::leave_for_restart`](super::Member::leave_for_restart)) after releasing every
    /// grant, and the record (kept for the restart window instead of the lease TTL) reserves the
    /// slot, under the same claim, for the same member id to take back. When the member left,
    /// wall clock, milliseconds since the Unix epoch. A parked claim holds nothing and grants
    /// nothing until it is taken back, so it counts as having acknowledged every view.
    pub parked: Option<u64>,
    /// The member's crash grace in milliseconds
    /// ([`GroupConfig::with_crash_grace`](super::GroupConfig::with_crash_grace)), when it has
    /// one: the record lives that much longer than the lease in the store, so after a crash its
    /// slot and keys wait that long for the same member id to come back.
    pub grace: Option<u64>,
}

impl SlotRecord {
    /// How long the store keeps the record after a renewal: the lease TTL plus the crash grace.
    pub fn kept_for(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ttl_ms.saturating_add(self.grace.unwrap_or(0)))
    }

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
        self.parked.is_some()
            || (self.view == 0 && self.acked >= epoch)
            || (self.acked == epoch && self.view == digest)
    }

    /// Whether the claim is parked for a restart (see [`SlotRecord::parked`]).
    pub fn is_parked(&self) -> bool {
        self.parked.is_some()
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
            parked: match fields.get("parked") {
                Some(ms) => Some(ms.parse().ok()?),
                None => None,
            },
            grace: match fields.get("grace") {
                Some(ms) => Some(ms.parse().ok()?),
                None => None,
            },
        };
        let expected =
            6 + usize::from(record.parked.is_some()) + usize::from(record.grace.is_some());
        (fields.len() == expected && record.acked <= MAX_EPOCH).then_some(record)
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
        )?;
        if let Some(ms) = self.grace {
            write!(f, " grace={ms}")?;
        }
        match self.parked {
            Some(ms) => write!(f, " parked={ms}"),
            None => Ok(()),
        }
    }
}

/// A standby's record (`hc:{group}:standby:{member}`): a member that waits, outside the view, to
/// inherit the slot of a member that leaves (see
/// [`GroupConfig::with_standby`](super::GroupConfig::with_standby)).
///
/// `v1 nonce=<16 hex> since=<unix ms>`, with ` heir_of=<slot> from=<16 hex>` at the end once a
/// leaving member chose it: that member (the claim with nonce `from`) then parks its claim of the
/// slot under the standby's member id, and the standby takes it back as a returning member does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StandbyRecord {
    /// Random per standby: tells this process's record from another one's with the same id.
    pub(super) nonce: u64,
    /// When it started standing by, wall clock, milliseconds since the Unix epoch: the oldest
    /// standby inherits first.
    pub(super) since_ms: u64,
    /// The slot a leaving member is handing to it, and the nonce of that member's claim.
    pub(super) heir_of: Option<(u32, u64)>,
}

impl StandbyRecord {
    /// Parses a standby record; `None` for anything else.
    pub(super) fn parse(text: &str) -> Option<StandbyRecord> {
        let mut parts = text.split(' ');
        if parts.next()? != TAG {
            return None;
        }
        let fields = fields(parts)?;
        let record = StandbyRecord {
            nonce: u64::from_str_radix(fields.get("nonce")?, 16).ok()?,
            since_ms: fields.get("since")?.parse().ok()?,
            heir_of: match (fields.get("heir_of"), fields.get("from")) {
                (Some(slot), Some(from)) => {
                    Some((slot.parse().ok()?, u64::from_str_radix(from, 16).ok()?))
                }
                (None, None) => None,
                _ => return None,
            },
        };
        let expected = 2 + 2 * usize::from(record.heir_of.is_some());
        (fields.len() == expected).then_some(record)
    }
}

impl fmt::Display for StandbyRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{TAG} nonce={:016x} since={}", self.nonce, self.since_ms)?;
        match self.heir_of {
            Some((slot, from)) => write!(f, " heir_of={slot} from={from:016x}"),
            None => Ok(()),
        }
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
/// `v1 nonce=<16 hex> acked=<epoch> view=<16 hex>`: the claim it belongs to (an acknowledgement
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

    /// Parses an acknowledgement; `None` for anything else.
    pub fn parse(text: &str) -> Option<AckRecord> {
        let mut parts = text.split(' ');
        if parts.next()? != TAG {
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
            "{TAG} nonce={:016x} acked={} view={:016x}",
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

/// A published view: the epoch and the live slots with their holders, and for the sticky
/// assignor the owner of every declared key.
///
/// `v1 epoch=<E> assignor=<name> slots=<slot>@<nonce hex>,...` (slots ascending; `slots=` empty
/// when nobody is live; `assignor=` absent in views written before it was recorded), followed
/// by ` owners=<text>` when the assignor is `sticky:…` and a slot is live: each declared key's
/// owner as its rank among the slots, in `⌈log₂ slots⌉` bits, in URL-safe base64 (see
/// [`Sticky`](crate::assign::Sticky)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewRecord {
    /// The epoch: minted by the store (a compare-and-set from the previous view), only increases.
    pub epoch: u64,
    /// The live slots, ascending.
    pub holders: Vec<Holder>,
    /// The assignor of the member that published it: members configured with another one
    /// would map keys differently, so they refuse to join.
    pub assignor: Option<AssignorKind>,
    /// For the sticky assignor, the slot owning each declared key, in the key set's order
    /// ([`KeySet::hashes`](crate::assign::KeySet::hashes)); `None` for every other assignor and
    /// for a view with no live slot. A view that parses has one owner per key, every owner a
    /// slot of the view, and shares within one key of each other.
    pub owners: Option<Arc<[u32]>>,
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
        let owners_text = fields.get("owners");
        if fields.len() != 2 + usize::from(assignor.is_some()) + usize::from(owners_text.is_some())
        {
            return None;
        }
        let epoch: u64 = fields.get("epoch")?.parse().ok()?;
        if epoch > MAX_EPOCH {
            return None;
        }
        let holders = parse_holders(fields.get("slots")?)?;
        // Owners exactly when the assignor is sticky and a slot is live.
        let sticky = matches!(assignor, Some(AssignorKind::Sticky(_)));
        let owners = match (assignor, owners_text) {
            (Some(AssignorKind::Sticky(id)), Some(text)) if !holders.is_empty() => {
                let slots: Vec<u32> = holders.iter().map(|h| h.slot).collect();
                let owners = crate::assign::decode_owners(text, id.count as usize, &slots)?;
                crate::assign::check_shares(&owners, &slots).ok()?;
                Some(owners.into())
            }
            (_, None) if !sticky || holders.is_empty() => None,
            _ => return None,
        };
        Some(ViewRecord {
            epoch,
            holders,
            assignor,
            owners,
        })
    }

    /// A digest of the holders and, for the sticky assignor, the owners (not the epoch), never
    /// 0: what a slot record's `view=` names, so an acknowledgement covers the assignment.
    pub fn digest(&self) -> u64 {
        // The text hashed is `{slot}@{nonce:016x},` per holder, then `owners=` and the owners'
        // text; written by hand, as a member computes it for every view it reads and `write!`
        // took most of the time in groups of thousands.
        let mut text = Vec::with_capacity(self.holders.len() * 28);
        for h in &self.holders {
            push_holder(&mut text, h);
        }
        if let Some(owners) = self.owners_text() {
            text.extend_from_slice(b"owners=");
            text.extend_from_slice(owners.as_bytes());
        }
        crate::assign::hash_bytes(&text) | 1
    }

    /// Whether the view names `holder`: its slot, under that claim.
    pub fn names(&self, holder: &Holder) -> bool {
        // The holders are ascending by slot.
        self.holders
            .binary_search_by_key(&holder.slot, |h| h.slot)
            .is_ok_and(|i| self.holders[i] == *holder)
    }

    /// Whether both views give every key the same owner and name the same holders: only the
    /// epoch may differ (a view republished after it was lost or garbled).
    pub fn same_assignment(&self, other: &ViewRecord) -> bool {
        self.holders == other.holders && self.owners == other.owners
    }

    /// The `owners=` text, when the view has owners.
    fn owners_text(&self) -> Option<String> {
        let owners = self.owners.as_ref()?;
        let slots: Vec<u32> = self.slots().collect();
        // A view built by this crate names only its own slots; one that does not is written
        // with no owner text, and fails to parse back.
        Some(crate::assign::encode_owners(owners, &slots).unwrap_or_default())
    }

    /// The epoch and holders of a view this version cannot read because a later version of
    /// headcount wrote it: this format's tag, an epoch and a slot list, and an assignor this
    /// version does not know or a field it does not know. `None` for anything else, which is a
    /// garbled view (replaced by the members) or one this version reads.
    ///
    /// While a holder it names is live, members neither replace nor adopt such a view, and a
    /// member does not join the group: replacing it would undo every change the newer members
    /// make, and a field left unread (an assignment, say) would have this member compute other
    /// owners under the same epoch. Once none of its holders is live it is replaced like a
    /// garbled view.
    pub fn newer_version(text: &str) -> Option<(u64, Vec<Holder>)> {
        let mut parts = text.split(' ');
        if parts.next()? != TAG || ViewRecord::parse(text).is_some() {
            return None;
        }
        let fields = fields(parts)?;
        let epoch: u64 = fields.get("epoch")?.parse().ok()?;
        let holders = parse_holders(fields.get("slots")?)?;
        let unknown_field = fields
            .keys()
            .any(|k| !matches!(*k, "epoch" | "slots" | "assignor" | "owners"));
        // A known name with a bad argument (`sticky:x`) is garbled, not newer.
        let unknown_assignor = fields
            .get("assignor")
            .is_some_and(|a| !AssignorKind::is_known_name(a.split(':').next().unwrap_or(a)));
        (epoch <= MAX_EPOCH && (unknown_field || unknown_assignor)).then_some((epoch, holders))
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
            write!(f, "assignor={a} ")?;
        }
        f.write_str("slots=")?;
        for (i, h) in self.holders.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}@{:016x}", h.slot, h.nonce)?;
        }
        if let Some(owners) = self.owners_text() {
            write!(f, " owners={owners}")?;
        }
        Ok(())
    }
}

/// Appends `{slot}@{nonce:016x},`, the text of `holder` in a view's digest.
fn push_holder(text: &mut Vec<u8>, holder: &Holder) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    let mut slot = holder.slot;
    loop {
        at -= 1;
        // A decimal digit: below 10.
        digits[at] = b'0' + (slot % 10) as u8;
        slot /= 10;
        if slot == 0 {
            break;
        }
    }
    text.extend_from_slice(&digits[at..]);
    text.push(b'@');
    for shift in (0..16).rev() {
        text.push(HEX[((holder.nonce >> (shift * 4)) & 0xf) as usize]);
    }
    text.push(b',');
}

/// The holders of a view's `slots=` list; `None` unless strictly ascending (one holder per
/// slot, one canonical text per view), every slot addressable, and at most [`MAX_VIEW_SLOTS`].
fn parse_holders(list: &str) -> Option<Vec<Holder>> {
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
    (!holders.windows(2).any(|w| w[0].slot >= w[1].slot)).then_some(holders)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{
        largest_group, longest_view, parse_acks, push_holder, AckRecord, Holder, SettledRecord,
        SlotRecord, StandbyRecord, ViewRecord, MAX_EPOCH,
    };
    use crate::assign::{AssignorKind, KeySet};
    use crate::store::MAX_VALUE_LEN;

    /// A holder's text in the digest is what `write!` gives, so digests (which slot records
    /// and headers carry) are those of earlier versions.
    #[test]
    fn a_holders_digest_text_is_the_formatted_one() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut values: Vec<(u32, u64)> = vec![(0, 0), (9, 15), (10, 16), (u32::MAX, u64::MAX)];
        for _ in 0..1000 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let slot = (seed >> 32) as u32 >> (seed % 32);
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            values.push((slot, seed >> (seed % 64)));
        }
        for (slot, nonce) in values {
            let mut text = Vec::new();
            push_holder(&mut text, &Holder { slot, nonce });
            assert_eq!(
                String::from_utf8(text).unwrap(),
                format!("{slot}@{nonce:016x},")
            );
        }
    }

    /// A whole view's digest is the hash of its holders' text, written out here by hand: a
    /// member of an earlier version computes the same digest, so their acknowledgements match.
    #[test]
    fn a_views_digest_is_the_hash_of_its_holders_text() {
        let view = ViewRecord {
            epoch: 7,
            holders: vec![
                Holder { slot: 0, nonce: 1 },
                Holder {
                    slot: 3,
                    nonce: 0xff,
                },
                Holder {
                    slot: 12,
                    nonce: u64::MAX,
                },
            ],
            assignor: Some(AssignorKind::Modulo),
            owners: None,
        };
        let text = b"0@0000000000000001,3@00000000000000ff,12@ffffffffffffffff,";
        assert_eq!(view.digest(), crate::assign::hash_bytes(text) | 1);
        // Not the epoch: a view republished under a new epoch keeps its digest.
        assert_eq!(
            ViewRecord {
                epoch: 8,
                ..view.clone()
            }
            .digest(),
            view.digest()
        );
    }

    /// The longest view of `n` slots: the highest slots, nonces and epoch there are.
    fn longest(n: u32, assignor: AssignorKind, keys: Option<usize>) -> ViewRecord {
        ViewRecord {
            epoch: MAX_EPOCH,
            holders: (0..n)
                .map(|slot| Holder {
                    slot,
                    nonce: u64::MAX,
                })
                .collect(),
            assignor: Some(assignor),
            owners: keys.map(|k| (0..k).map(|i| i as u32 % n).collect()),
        }
    }

    /// `longest_view` is the exact length of the longest view a group of `n` slots publishes,
    /// so the configuration check refuses exactly the groups that could not publish theirs.
    #[test]
    fn the_longest_view_is_counted_exactly() {
        let sticky = AssignorKind::Sticky(KeySet::partitions(4096).unwrap().id());
        for n in [1, 2, 9, 10, 11, 100, 101, 1000, 4096, 20_000] {
            let plain = longest(n, AssignorKind::Modulo, None);
            assert_eq!(
                plain.to_string().len(),
                longest_view(n, AssignorKind::Modulo, None),
                "{n} slots"
            );
            let v = longest(n, sticky, Some(4096));
            assert_eq!(
                v.to_string().len(),
                longest_view(n, sticky, Some(4096)),
                "{n} slots, sticky"
            );
        }
    }

    /// The largest group is the largest whose longest view fits a store value.
    #[test]
    fn the_largest_group_fits_and_one_more_does_not() {
        for (assignor, keys) in [
            (AssignorKind::JumpBackFailover, None),
            (
                AssignorKind::Sticky(KeySet::partitions(65_536).unwrap().id()),
                Some(65_536),
            ),
        ] {
            let n = largest_group(assignor, keys);
            assert!(longest_view(n, assignor, keys) <= MAX_VALUE_LEN);
            assert!(longest_view(n + 1, assignor, keys) > MAX_VALUE_LEN);
        }
    }

    #[test]
    fn slot_records_round_trip_and_reject_garbage() {
        let r = SlotRecord {
            member: "web-1".into(),
            nonce: 0xabc,
            since_ms: 1_700_000_000_000,
            ttl_ms: 3000,
            acked: 7,
            view: 0x1f,
            parked: None,
            grace: None,
        };
        let text = r.to_string();
        assert_eq!(
            text,
            "v1 member=web-1 nonce=0000000000000abc since=1700000000000 ttl=3000 acked=7 view=000000000000001f"
        );
        assert_eq!(SlotRecord::parse(&text), Some(r.clone()));
        // Parked for a restart: one more field, and every view counts as acknowledged.
        let parked = SlotRecord {
            parked: Some(1_700_000_005_000),
            ..r.clone()
        };
        let text = parked.to_string();
        assert!(text.ends_with(" view=000000000000001f parked=1700000005000"));
        assert_eq!(SlotRecord::parse(&text), Some(parked.clone()));
        // With a crash grace: kept that much longer than the lease.
        let graced = SlotRecord {
            grace: Some(20_000),
            ..parked.clone()
        };
        let text = graced.to_string();
        assert!(
            text.ends_with(" grace=20000 parked=1700000005000"),
            "{text}"
        );
        assert_eq!(SlotRecord::parse(&text), Some(graced.clone()));
        assert_eq!(graced.kept_for(), std::time::Duration::from_millis(23_000));
        assert_eq!(
            SlotRecord::parse(&text.replace("grace=20000", "grace=x")),
            None
        );
        assert!(parked.has_acked_digest(99, 0x1234) && !r.has_acked_digest(99, 0x1234));
        assert_eq!(SlotRecord::parse(&format!("{text} parked=1")), None);
        assert_eq!(
            SlotRecord::parse(&text.replace("parked=1700000005000", "parked=x")),
            None
        );
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
    fn sticky_views_carry_their_owners_and_reject_bad_ones() {
        use crate::assign::{KeySet, Sticky, Topology};
        use std::sync::Arc;
        let keys = Arc::new(KeySet::partitions(10).unwrap());
        let kind = AssignorKind::Sticky(keys.id());
        let holders = vec![
            Holder { slot: 1, nonce: 1 },
            Holder { slot: 4, nonce: 2 },
            Holder { slot: 7, nonce: 3 },
        ];
        let sticky = Sticky::new(&Topology::from_live_slots([1, 4, 7]).unwrap(), keys).unwrap();
        let v = ViewRecord {
            epoch: 5,
            holders: holders.clone(),
            assignor: Some(kind),
            owners: Some(sticky.shared_owners()),
        };
        let text = v.to_string();
        assert!(text.starts_with(&format!("v1 epoch=5 assignor={kind} slots=1@")));
        // Ten keys of two bits: three bytes, four characters.
        let owners = text.split(" owners=").nth(1).unwrap();
        assert_eq!(owners.len(), 4, "{text}");
        assert_eq!(ViewRecord::parse(&text), Some(v.clone()));
        // Owners are required for a sticky view with a live slot, refused for any other view,
        // and must be one per key, ranks of the view's slots, within one key of each other.
        let without = text.split(" owners=").next().unwrap();
        assert_eq!(ViewRecord::parse(without), None);
        let jb = without.replace(&kind.to_string(), "jumpback");
        assert!(ViewRecord::parse(&jb).is_some());
        assert_eq!(ViewRecord::parse(&format!("{jb} owners={owners}")), None);
        let empty = format!("v1 epoch=5 assignor={kind} slots=");
        assert_eq!(ViewRecord::parse(&empty).map(|v| v.owners), Some(None));
        assert_eq!(ViewRecord::parse(&format!("{empty} owners=AAAA")), None);
        let bad_owners = |owners: &[u32]| {
            let text = crate::assign::encode_owners(owners, &[1, 4, 7]).unwrap();
            ViewRecord::parse(&format!("{without} owners={text}"))
        };
        assert!(bad_owners(&[1, 4, 7, 1, 4, 7, 1, 4, 7, 1]).is_some());
        assert_eq!(bad_owners(&[1, 4, 7, 1, 4]), None, "five owners");
        assert!(
            bad_owners(&[1, 1, 1, 1, 4, 4, 4, 7, 7, 7]).is_some(),
            "4-3-3 is fine"
        );
        assert_eq!(
            bad_owners(&[1, 1, 1, 1, 1, 4, 4, 7, 7, 7]),
            None,
            "5-2-3 is not"
        );
        assert_eq!(ViewRecord::parse(&format!("{without} owners=////")), None);
    }

    #[test]
    fn views_of_a_later_version_are_told_from_garbage() {
        let newer = |text: &str| ViewRecord::newer_version(text).map(|(epoch, _)| epoch);
        assert_eq!(newer("v1 epoch=7 assignor=quantum:9 slots=0@1"), Some(7));
        assert_eq!(
            ViewRecord::newer_version("v1 epoch=7 assignor=quantum:9 slots=0@1,3@2").map(|v| v.1),
            Some(vec![
                Holder { slot: 0, nonce: 1 },
                Holder { slot: 3, nonce: 2 }
            ])
        );
        assert_eq!(
            newer("v1 epoch=7 assignor=jumpback slots=0@0000000000000001 shards=3"),
            Some(7)
        );
        assert_eq!(newer("v1 epoch=7 slots= weights=1"), Some(7));
        for not_newer in [
            "v1 epoch=7 assignor=jumpback slots=0@0000000000000001",
            "{not a view",
            "v1 epoch=7 assignor=sticky:x slots=",
            "v1 epoch=7 assignor=jumpback slots=0@1 owners=AA",
            "v1 epoch=x assignor=quantum slots=",
            "v1 assignor=quantum slots=",
            "v1 epoch=7 assignor=quantum",
            "v1 epoch=7 assignor=quantum slots=3@1,2@1",
            "v2 epoch=7 assignor=quantum slots=",
            "v1 epoch=9223372036854775807 assignor=quantum slots=",
        ] {
            assert_eq!(newer(not_newer), None, "{not_newer}");
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
            owners: None,
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
            owners: None,
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
            "v1 nonce=0000000000000abc acked=7 view=000000000000001f"
        );
        assert_eq!(AckRecord::parse(&a.to_string()), Some(a));
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
            "v1 nonce=1 acked=1",
            "v1 nonce=1 acked=1 view=1 x=1",
            "v1 nonce=1 acked=-1 view=1",
            "v1 nonce=1 acked=9223372036854775807 view=1",
            "v2 nonce=1 acked=1 view=1",
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
    fn standby_records_round_trip_and_reject_garbage() {
        let mut r = StandbyRecord {
            nonce: 0xabc,
            since_ms: 1_700_000_000_000,
            heir_of: None,
        };
        assert_eq!(
            r.to_string(),
            "v1 nonce=0000000000000abc since=1700000000000"
        );
        assert_eq!(StandbyRecord::parse(&r.to_string()), Some(r.clone()));
        r.heir_of = Some((3, 0xdef));
        assert_eq!(
            r.to_string(),
            "v1 nonce=0000000000000abc since=1700000000000 heir_of=3 from=0000000000000def"
        );
        assert_eq!(StandbyRecord::parse(&r.to_string()), Some(r));
        for bad in [
            "",
            "v1 nonce=1",
            "v1 nonce=x since=1",
            "v1 nonce=1 since=1 heir_of=3",
            "v1 nonce=1 since=1 from=1",
            "v1 nonce=1 since=1 heir_of=-1 from=1",
            "v1 nonce=1 since=1 extra=1",
            "v2 nonce=1 since=1",
        ] {
            assert_eq!(StandbyRecord::parse(bad), None, "{bad:?}");
        }
    }
}
