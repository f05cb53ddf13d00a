//! MementoHash: a consistent hash (jump consistent hash or JumpBackHash) plus a replacement
//! table, minimal and balanced when any slot dies.

use super::hash::reduce;
use super::{
    combine_hash, jump_back_hash, jump_consistent_hash, AssignError, Assignor, AssignorKind,
    Topology,
};

/// Marks a slot that was not removed.
const NONE: u32 = u32::MAX;

/// MementoHash (Massimo Coluzzi, Amos Brocco, Paolo Antonucci and Tiziano Leidi, "MementoHash: A
/// Stateful, Minimal Memory, Best Performing Consistent Hash Algorithm", 2023,
/// [arXiv:2306.09783](https://arxiv.org/abs/2306.09783)).
///
/// Jump consistent hash over the "b-array" of slots, plus the paper's replacement table: removing
/// slot `b` while `w` slots work records that `b` is replaced by `w - 1`, and a key that lands on
/// `b` re-hashes into `0..w-1`, following replacements, until it lands on a working slot. While
/// no slot in the middle has died, removing the last slot just shrinks the b-array, as jump hash
/// does. Each removal moves only the removed slot's keys, and spreads them evenly over the rest,
/// whichever slot it is: what the paper proves and the property tests check.
///
/// MementoHash is stateful: its table depends on the order of removals. Here the table is
/// rebuilt from the [`Topology`] by removing its dead slots in [the topology's death
/// order](Topology::dead_slots), so the assignment is a pure function of the topology and every
/// member that holds the same topology agrees, whatever order it learned of events in. What that
/// costs, per [`DeathOrder`](crate::assign::DeathOrder):
///
/// - **Canonical** (the default; dead slots removed highest first): minimal when the slot that
///   dies is below every dead slot (always so when none was dead) and when the lowest dead slot
///   comes back (which is the slot a joining group member claims). Otherwise the change reorders
///   the removals, and keys that had landed on dead slots may move between live ones; keys whose
///   jump slot is live never move unless that slot died.
/// - **Recorded** (the members share the order of deaths, e.g. in the published view): minimal
///   for every single death, whichever slot, and for the return of the most recently dead slot.
///
/// Several changes at once are never guaranteed minimal. With the canonical order, a dead tail
/// (dead slots above every live one) shrinks the b-array, so [`Topology::from_live_slots`] gives
/// the same assignment as the full slot count.
///
/// The table is a dense array (4 bytes per slot) rather than the paper's hash map, for a lookup
/// without hashing the table; re-hashes use [`combine_hash`]`(key, slot)` reduced by multiply-shift.
/// Allocation-free. Refuses unequal weights.
#[derive(Debug, Clone)]
pub struct Memento {
    topology: Topology,
    table: ReplacementTable,
}

impl Assignor for Memento {
    fn build(topology: &Topology) -> Result<Self, AssignError> {
        topology.require_live()?;
        topology.require_uniform("memento")?;
        Ok(Memento {
            topology: topology.clone(),
            table: ReplacementTable::build(topology),
        })
    }

    fn kind(&self) -> AssignorKind {
        AssignorKind::Memento
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }

    #[inline]
    fn owner(&self, key: u64) -> u32 {
        self.table
            .owner(&self.topology, key, jump_consistent_hash, combine_rehash)
    }
}

/// MementoHash (Coluzzi, Brocco, Antonucci and Leidi, 2023, as in [`Memento`]) over
/// [`jump_back_hash`] (JumpBackHash, Otmar Ertl, 2024) instead of jump consistent hash.
///
/// MementoHash needs of its underlying hash only that it be consistent (shrinking the b-array by
/// its last slot moves only that slot's keys, spread evenly) and uniform, which JumpBackHash is.
/// So everything [`Memento`] promises holds here unchanged: the same replacement table, rebuilt
/// from the [`Topology`]'s death order, the same re-hash of a key that lands on a removed slot,
/// and the same guarantees per [`DeathOrder`](crate::assign::DeathOrder): each removal appended
/// to the order moves only the removed slot's keys, spread evenly over the rest, and the return of
/// the most recently removed slot moves keys only to it (with the canonical order: any slot dying
/// below every dead slot, and the lowest dead slot coming back).
///
/// A different function from [`Memento`]: the two place most keys on different slots, so all the
/// members of a group must use the same one. The table is the same; the hops are cheaper. The
/// first is an expected constant number of integer operations instead of jump consistent hash's
/// `ln n` floating-point divisions, which makes a lookup with every slot live several times
/// faster. A key that lands on a removed slot `b` re-hashes with one multiplication,
/// `(key ^ b·φ)·M` (φ the 64-bit golden ratio, `M` an odd mixing constant) reduced into the
/// working range by multiply-shift, rather than [`Memento`]'s three-multiplication
/// [`combine_hash`]: enough because the key is already a hash ([`Assignor::owner`]), every
/// re-hash of it is a bijection of the key for a fixed `b`, and the reduction keeps the product's
/// high bits, which depend on all of the key's bits. Balance with half the slots dead is the same as
/// [`Memento`]'s to sampling error (the assignor report and the property tests check it).
/// Allocation-free. Refuses unequal weights.
#[derive(Debug, Clone)]
pub struct JumpBackMemento {
    topology: Topology,
    table: ReplacementTable,
}

impl Assignor for JumpBackMemento {
    fn build(topology: &Topology) -> Result<Self, AssignError> {
        topology.require_live()?;
        topology.require_uniform("jumpback-memento")?;
        Ok(JumpBackMemento {
            topology: topology.clone(),
            table: ReplacementTable::build(topology),
        })
    }

    fn kind(&self) -> AssignorKind {
        AssignorKind::JumpBackMemento
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }

    #[inline]
    fn owner(&self, key: u64) -> u32 {
        self.table
            .owner(&self.topology, key, jump_back_hash, multiply_rehash)
    }
}

/// [`Memento`]'s re-hash of `key` from removed slot `b` into `0..r`.
#[inline]
fn combine_rehash(key: u64, b: u32, r: u32) -> u32 {
    reduce(combine_hash(key, u64::from(b)), r)
}

/// [`JumpBackMemento`]'s re-hash of `key` from removed slot `b` into `0..r`.
#[inline]
fn multiply_rehash(key: u64, b: u32, r: u32) -> u32 {
    const SLOT: u64 = 0x9e37_79b9_7f4a_7c15;
    const MIX: u64 = 0xd6e8_feb8_6659_fd93;
    reduce((key ^ u64::from(b).wrapping_mul(SLOT)).wrapping_mul(MIX), r)
}

/// MementoHash's state: the b-array's size and the replacement table.
#[derive(Debug, Clone)]
struct ReplacementTable {
    b_array: u32,
    /// For each slot, the size of the working set after it was removed, or [`NONE`].
    replacer: Vec<u32>,
}

impl ReplacementTable {
    /// Removes `topology`'s dead slots in its death order. The topology has a live slot.
    fn build(topology: &Topology) -> Self {
        let mut b_array = topology.slot_count();
        let mut replacer = vec![NONE; b_array as usize];
        let mut removed_in_table = 0u32;
        for &slot in topology.dead_slots() {
            if removed_in_table == 0 && slot + 1 == b_array {
                // The paper's jump-hash case: nothing remembered yet and the last slot goes.
                b_array = slot;
                continue;
            }
            let working = b_array - removed_in_table;
            replacer[slot as usize] = working - 1;
            removed_in_table += 1;
        }
        ReplacementTable { b_array, replacer }
    }

    /// The owner of `key`, with `hash` as the consistent hash over the b-array.
    #[inline]
    fn owner(
        &self,
        topology: &Topology,
        key: u64,
        hash: impl Fn(u64, u32) -> u32,
        rehash: impl Fn(u64, u32, u32) -> u32,
    ) -> u32 {
        let b = hash(key, self.b_array);
        let r = self.replacer[b as usize];
        if r == NONE {
            return b;
        }
        self.follow(topology, key, b, r, rehash)
    }

    /// The paper's loop for a key whose first slot `b` was removed, replaced by `r`.
    #[inline]
    fn follow(
        &self,
        topology: &Topology,
        key: u64,
        mut b: u32,
        mut r: u32,
        rehash: impl Fn(u64, u32, u32) -> u32,
    ) -> u32 {
        // Every slot number below is < b_array: the hash's result is, and so are re-hashes into
        // 0..r and replacers (r <= b_array - 1). The outer loop's r strictly decreases, and the
        // paper shows the inner loop ends too; `budget` only guards against a broken table,
        // answering a live slot rather than looping.
        let mut budget = 2 * self.replacer.len() + 2;
        while r != NONE {
            b = rehash(key, b, r);
            let mut next = self.replacer[b as usize];
            while next != NONE && next >= r {
                b = next;
                next = self.replacer[b as usize];
                budget = budget.saturating_sub(1);
            }
            r = next;
            budget = budget.saturating_sub(1);
            if budget == 0 {
                return topology.live_slots().next().unwrap_or(0);
            }
        }
        b
    }
}
