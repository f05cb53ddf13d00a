//! The sticky assignor for a declared key set: [`Sticky`], balanced like [`Balanced`] and
//! minimal in movement because each assignment is computed from the previous one, which a group
//! stores in its view.

use std::sync::Arc;

use super::balanced::{deferred_acceptance, Declared};
use super::{
    combine_hash, hash_u64, AssignError, Assignor, AssignorKind, Balanced, JumpBackFailover,
    KeySet, Topology,
};

/// A balanced and sticky assignor for a declared [`KeySet`]: every live slot owns
/// `⌊keys / live⌋` or `⌈keys / live⌉` of the declared keys, as with [`Balanced`], and a change of
/// the live slots moves the fewest keys that balance allows. Kafka's sticky assignors aim for the
/// same; this one reaches the minimum exactly.
///
/// Unlike every other assignor, the assignment is not a function of the live slots alone: it
/// depends on the assignment before. A group stores it in each view it publishes (the
/// `owners=` field of the view record, covered by the view's digest, so acknowledging a view
/// acknowledges its assignment), and members read it instead of computing it. Only the member
/// that publishes a view computes one, with [`Sticky::next`].
///
/// ```
/// use std::sync::Arc;
/// use headcount_core::assign::{Assignor, KeySet, Sticky, Topology};
///
/// let keys = Arc::new(KeySet::partitions(256)?);
/// let three = Sticky::new(&Topology::new(3)?, keys.clone())?;
/// // A fourth member joins: it takes 64 keys, 21 or 22 from each of the others, and nothing else moves.
/// let four = Sticky::next(&Topology::new(4)?, keys.clone(), three.owners())?;
/// let moved = keys.hashes().iter().filter(|&&h| three.owner(h) != four.owner(h)).count();
/// assert_eq!(moved, 64);
/// # Ok::<(), headcount_core::assign::AssignError>(())
/// ```
///
/// # The algorithm
///
/// With `m` keys over `n` live slots, `m mod n` slots hold `⌈m/n⌉` keys and the others `⌊m/n⌋`.
/// [`Sticky::next`] gives the larger capacities to the live slots that held the most keys before
/// (ties to the lower slot). Each live slot keeps its previous keys up to its capacity (when it
/// has too many, the ones it scores highest, with the rendezvous score [`Balanced`] uses); the
/// keys of slots that are gone and the keys shed go to the slots with room by the same deferred
/// acceptance as [`Balanced`], over those keys only.
///
/// That is the minimum: the keys of a slot that is gone must move, and a live slot holding `c`
/// keys with capacity `k` must give up `c − k`, which handing the larger capacities to the
/// fullest slots makes smallest. Every other key stays. So a join moves exactly the newcomer's
/// share, a leave or a crash exactly the keys of the slot gone, and a restart that takes a slot
/// back (same slot number) moves nothing.
///
/// [`Sticky::new`], the first assignment, is [`Balanced`]'s.
///
/// # Keys outside the set
///
/// As with [`Balanced`]: [`JumpBackFailover`]'s owner over the same topology.
///
/// # Cost
///
/// [`Sticky::next`] scores only the keys that move against the live slots: `O(moved · n)`
/// hashes, plus a sort of each over-full slot's keys. Reading an assignment back
/// ([`Sticky::from_owners`]) is `O(m)`. A lookup is a binary search of the declared hashes. The
/// stored assignment costs `⌈log₂ n⌉` bits per key in the view: 256 keys over 20 slots, 214
/// bytes; 4,096 keys, about 3.4 KB; the most, 65,536 keys over 65,536 slots, about 175 KB.
#[derive(Debug, Clone)]
pub struct Sticky(Declared);

impl Sticky {
    /// The first assignment of `keys` over `topology`'s live slots, with nothing before it:
    /// [`Balanced::new`]'s.
    pub fn new(topology: &Topology, keys: Arc<KeySet>) -> Result<Sticky, AssignError> {
        let balanced = Balanced::new(topology, keys.clone())?;
        let owners: Vec<u32> = keys.hashes().iter().map(|&h| balanced.owner(h)).collect();
        Sticky::from_owners(topology, keys, owners)
    }

    /// The assignment that follows `previous`, the owner of each declared key in the set's
    /// order (as [`Sticky::owners`] gives it), when the live slots become `topology`'s. Keys
    /// whose previous owner is not live, or a `previous` of another length (another key set),
    /// count as having no owner: with no key owned, this is [`Sticky::new`]'s assignment.
    pub fn next(
        topology: &Topology,
        keys: Arc<KeySet>,
        previous: &[u32],
    ) -> Result<Sticky, AssignError> {
        topology.require_live()?;
        topology.require_uniform("sticky")?;
        if previous.len() != keys.len() || !previous.iter().any(|&s| topology.is_live(s)) {
            return Sticky::new(topology, keys);
        }
        let live: Vec<u32> = topology.live_slots().collect();
        let n = live.len();
        let m = keys.len();
        let rank = |slot: u32| live.binary_search(&slot).ok();
        // The keys each live slot held, by rank.
        let mut held: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (i, &s) in previous.iter().enumerate() {
            if let Some(r) = rank(s) {
                held[r].push(i as u32);
            }
        }
        // The larger capacities go to the slots that held the most, ties to the lower slot.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&r| (std::cmp::Reverse(held[r].len()), live[r]));
        let mut capacity = vec![m / n; n];
        for &r in order.iter().take(m % n) {
            capacity[r] += 1;
        }
        let mut owners = vec![u32::MAX; m];
        let mut room = vec![0usize; n];
        for r in 0..n {
            let slot = live[r];
            let keep = &mut held[r];
            if keep.len() > capacity[r] {
                // Keep the keys this slot scores highest, ties by key hash (distinct in a set).
                let seed = hash_u64(u64::from(slot));
                let score = |i: u32| {
                    let h = keys.hashes()[i as usize];
                    (combine_hash(h, seed), h)
                };
                keep.sort_unstable_by_key(|&i| std::cmp::Reverse(score(i)));
                keep.truncate(capacity[r]);
            }
            for &i in keep.iter() {
                owners[i as usize] = slot;
            }
            room[r] = capacity[r] - keep.len();
        }
        let free: Vec<(u32, u64)> = owners
            .iter()
            .enumerate()
            .filter(|(_, &o)| o == u32::MAX)
            .map(|(i, _)| (i as u32, keys.hashes()[i]))
            .collect();
        deferred_acceptance(&live, free.into_iter(), &mut owners, |r| {
            let has_room = room[r] > 0;
            if has_room {
                room[r] -= 1;
            }
            has_room
        });
        Sticky::from_owners(topology, keys, owners)
    }

    /// An assignment read back from where it was stored: `owners[i]` owns the `i`th declared
    /// key. Fails with [`AssignError::StoredAssignmentInvalid`] unless there is one owner per
    /// key, every owner is live, and the live slots' shares are within one key of each other.
    ///
    /// The owners may be shared (an `Arc<[u32]>`, as a view record holds them) or owned (a
    /// `Vec<u32>`).
    pub fn from_owners(
        topology: &Topology,
        keys: Arc<KeySet>,
        owners: impl Into<Arc<[u32]>>,
    ) -> Result<Sticky, AssignError> {
        let owners: Arc<[u32]> = owners.into();
        topology.require_live()?;
        topology.require_uniform("sticky")?;
        let fallback = JumpBackFailover::build(topology)?;
        let invalid = |reason: String| Err(AssignError::StoredAssignmentInvalid { reason });
        if owners.len() != keys.len() {
            return invalid(format!(
                "{} owners for {} declared keys",
                owners.len(),
                keys.len()
            ));
        }
        let live: Vec<u32> = topology.live_slots().collect();
        if let Err(reason) = check_shares(&owners, &live) {
            return invalid(reason);
        }
        Ok(Sticky(Declared {
            keys,
            owners,
            fallback,
        }))
    }

    /// The owner of each declared key, shared: what a view record carries without a copy.
    pub fn shared_owners(&self) -> Arc<[u32]> {
        self.0.owners.clone()
    }

    /// The owner of each declared key, in the set's order ([`KeySet::hashes`]).
    pub fn owners(&self) -> &[u32] {
        &self.0.owners
    }

    /// The declared keys.
    pub fn keys(&self) -> &Arc<KeySet> {
        &self.0.keys
    }

    /// How many declared keys each live slot owns, by slot, ascending.
    pub fn shares(&self) -> Vec<(u32, usize)> {
        self.0.shares()
    }
}

impl Assignor for Sticky {
    /// The sticky assignor over an empty set: every key falls back to [`JumpBackFailover`].
    /// Use [`Sticky::new`] or [`Sticky::next`] to declare keys.
    fn build(topology: &Topology) -> Result<Self, AssignError> {
        Sticky::new(topology, Arc::new(KeySet::new::<&str>([])?))
    }

    fn kind(&self) -> AssignorKind {
        AssignorKind::Sticky(self.0.keys.id())
    }

    fn topology(&self) -> &Topology {
        self.0.fallback.topology()
    }

    #[inline]
    fn owner(&self, key: u64) -> u32 {
        self.0.owner(key)
    }
}

/// Checks that every owner is one of the `live` slots (ascending) and that their shares are
/// within one key of each other; the reason when not.
pub(crate) fn check_shares(owners: &[u32], live: &[u32]) -> Result<(), String> {
    let mut shares = vec![0usize; live.len()];
    for &o in owners {
        match live.binary_search(&o) {
            Ok(r) => shares[r] += 1,
            Err(_) => return Err(format!("slot {o} owns a key but is not live")),
        }
    }
    let (lo, hi) = (
        shares.iter().min().copied().unwrap_or(0),
        shares.iter().max().copied().unwrap_or(0),
    );
    if hi > lo + 1 {
        return Err(format!("shares range from {lo} to {hi} keys"));
    }
    Ok(())
}

/// Writes an assignment as the view record stores it: each owner as its rank among the view's
/// `live` slots (ascending), in `⌈log₂ live⌉` bits (at least one), packed from the low bit up and
/// written in the URL-safe base64 alphabet without padding (RFC 4648 §5). `None` when an owner
/// is not in `live`.
pub(crate) fn encode_owners(owners: &[u32], live: &[u32]) -> Option<String> {
    let bits = rank_bits(live.len());
    let mut bytes = Vec::with_capacity((owners.len() * bits).div_ceil(8));
    let (mut acc, mut filled) = (0u64, 0usize);
    for &o in owners {
        let rank = live.binary_search(&o).ok()? as u64;
        acc |= rank << filled;
        filled += bits;
        while filled >= 8 {
            bytes.push(acc as u8);
            acc >>= 8;
            filled -= 8;
        }
    }
    if filled > 0 {
        bytes.push(acc as u8);
    }
    Some(base64_encode(&bytes))
}

/// Reads what [`encode_owners`] wrote for `count` keys over `live`: `None` for text that is not
/// exactly that (another length, a character outside the alphabet, a rank past the live slots,
/// padding bits set).
pub(crate) fn decode_owners(text: &str, count: usize, live: &[u32]) -> Option<Vec<u32>> {
    let bits = rank_bits(live.len());
    let bytes = base64_decode(text)?;
    if bytes.len() != count.checked_mul(bits)?.div_ceil(8) {
        return None;
    }
    let mut owners = Vec::with_capacity(count);
    let (mut acc, mut filled) = (0u64, 0usize);
    let mut input = bytes.iter();
    let mask = (1u64 << bits) - 1;
    for _ in 0..count {
        while filled < bits {
            acc |= u64::from(*input.next()?) << filled;
            filled += 8;
        }
        owners.push(*live.get((acc & mask) as usize)?);
        acc >>= bits;
        filled -= bits;
    }
    // One text per assignment: the bits after the last owner are zero.
    (acc == 0 && input.next().is_none()).then_some(owners)
}

/// The bits a rank among `live` slots takes: `⌈log₂ live⌉`, at least 1.
fn rank_bits(live: usize) -> usize {
    (usize::BITS - live.saturating_sub(1).leading_zeros()).max(1) as usize
}

const BASE64_URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(BASE64_URL[(n >> (18 - 6 * i)) as usize & 63] as char);
        }
    }
    out
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| BASE64_URL.iter().position(|&a| a == c).map(|v| v as u32);
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.as_bytes().chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let len = chunk.len() - 1;
        // Canonical: the bits past the last byte are zero.
        if n & ((1 << (24 - 8 * len)) - 1) != 0 {
            return None;
        }
        for i in 0..len {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
