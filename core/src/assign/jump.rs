//! Jump consistent hash and JumpBackHash with RavenDB's failover re-hash.

use super::{
    combine_hash, jump_back_hash, jump_consistent_hash, AssignError, Assignor, AssignorKind,
    Topology,
};

/// Jump consistent hash over all slots, live or dead, with the failover loop of RavenDB
/// (Oren Eini, "Distributed Task Assignment With Failover"):
///
/// ```text
/// topology = local copy of the slots
/// loop:
///     index = JumpConsistentHash(key, topology.Count)
///     if topology[index] is live: return it
///     remove topology[index]
///     key = CombineHash(key, topology.Count)      // the count after the removal
/// ```
///
/// The listing as the article prints it shows no removal line, but its text says the dead node
/// is removed and the key re-hashed "with the new number of nodes", which is what this does. The loop ends because
/// each turn removes a dead slot and at least one slot is live ([`Assignor::build`] checks).
///
/// Properties (each checked by the property tests):
/// - a key whose jump slot is live stays there, so with every slot live this is exactly
///   [`jump_consistent_hash`]: max/avg load close to 1 and, on an appended slot, only the
///   `1/(n+1)` keys it takes move;
/// - a dead slot's keys re-hash over all remaining slots, so they spread evenly over the
///   survivors rather than falling onto a neighbour;
/// - the result is a pure function of (slot count, live set): when one slot dies, only its keys
///   move; when a dead slot comes back, only keys that go to it move.
///
/// Not minimal: changing the slot count while other slots are dead (appending a slot, or
/// dropping dead slots off the end as [`Topology::from_live_slots`] does) changes the re-hash of
/// every key that met a dead slot. Keep the slot count fixed, or fill dead slots before growing
/// it (a group claims the lowest free slot, which does exactly that).
///
/// No allocation per lookup unless a single key meets more than 32 dead slots in a row, which
/// needs more than 32 dead slots and then happens with probability about `(dead/slots)^32`.
/// Refuses unequal weights.
#[derive(Debug, Clone)]
pub struct JumpFailover {
    topology: Topology,
    slots: u32,
}

impl Assignor for JumpFailover {
    fn build(topology: &Topology) -> Result<Self, AssignError> {
        topology.require_live()?;
        topology.require_uniform("jump")?;
        Ok(JumpFailover {
            topology: topology.clone(),
            slots: topology.slot_count(),
        })
    }

    fn kind(&self) -> AssignorKind {
        AssignorKind::JumpFailover
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }

    #[inline]
    fn owner(&self, key: u64) -> u32 {
        owner_with_failover(&self.topology, self.slots, key, jump_consistent_hash)
    }
}

/// [`JumpFailover`] with [`jump_back_hash`] (JumpBackHash, Otmar Ertl, 2024) in place of jump
/// consistent hash, for the first slot and for every re-hash of RavenDB's failover loop (Oren
/// Eini, "Distributed Task Assignment With Failover").
///
/// The same properties as [`JumpFailover`], for the same reasons, since both rest only on the hash
/// being consistent: with every slot live this is exactly [`jump_back_hash`], balanced, and an
/// appended slot takes only its `1/(n+1)` share; a dead slot's keys re-hash over all remaining
/// slots, spreading evenly over the survivors; the result is a pure function of (slot count, live
/// set), so one death moves only the dead slot's keys and one return only keys to it. Not minimal
/// when the slot count changes while other slots are dead, as [`JumpFailover`] explains.
///
/// A different function from [`JumpFailover`]: the two place most keys on different slots, so
/// all the members of a group must use the same one. JumpBackHash makes a lookup with every slot
/// live several times faster than jump consistent hash; a key that meets dead slots pays one
/// JumpBackHash and a scan of the slots it removed per dead slot met.
///
/// No allocation per lookup unless a single key meets more than 32 dead slots in a row. Refuses
/// unequal weights.
#[derive(Debug, Clone)]
pub struct JumpBackFailover {
    topology: Topology,
    slots: u32,
}

impl Assignor for JumpBackFailover {
    fn build(topology: &Topology) -> Result<Self, AssignError> {
        topology.require_live()?;
        topology.require_uniform("jumpback")?;
        Ok(JumpBackFailover {
            topology: topology.clone(),
            slots: topology.slot_count(),
        })
    }

    fn kind(&self) -> AssignorKind {
        AssignorKind::JumpBackFailover
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }

    #[inline]
    fn owner(&self, key: u64) -> u32 {
        owner_with_failover(&self.topology, self.slots, key, jump_back_hash)
    }
}

/// RavenDB's loop over `slots` slots with the consistent hash `hash`: the first slot if it is
/// live, otherwise the failover re-hash.
#[inline]
fn owner_with_failover(
    topology: &Topology,
    slots: u32,
    key: u64,
    hash: impl Fn(u64, u32) -> u32,
) -> u32 {
    let live = topology.live_flags();
    let first = hash(key, slots);
    if live[first as usize] {
        return first;
    }
    failover(topology, slots, key, first, hash)
}

#[cold]
fn failover(
    topology: &Topology,
    slots: u32,
    mut key: u64,
    first: u32,
    hash: impl Fn(u64, u32) -> u32,
) -> u32 {
    let live = topology.live_flags();
    let mut removed = Removed::new();
    let mut count = slots;
    let mut slot = first;
    loop {
        removed.insert(slot);
        count -= 1;
        if count == 0 {
            // Unreachable: live slots are never removed and there is one. Answer something
            // valid rather than loop or panic.
            return topology.live_slots().next().unwrap_or(0);
        }
        key = combine_hash(key, u64::from(count));
        let index = hash(key, count);
        slot = removed.nth_kept(index);
        if live[slot as usize] {
            return slot;
        }
    }
}

const INLINE: usize = 32;

/// The slots removed from the local copy of the topology, ascending: inline up to [`INLINE`],
/// on the heap beyond.
struct Removed {
    inline: [u32; INLINE],
    len: usize,
    spill: Vec<u32>,
}

impl Removed {
    fn new() -> Self {
        Removed {
            inline: [0; INLINE],
            len: 0,
            spill: Vec::new(),
        }
    }

    fn as_slice(&self) -> &[u32] {
        if self.spill.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }

    fn insert(&mut self, slot: u32) {
        if self.spill.is_empty() && self.len < INLINE {
            let at = self.inline[..self.len].partition_point(|&s| s < slot);
            self.inline.copy_within(at..self.len, at + 1);
            self.inline[at] = slot;
            self.len += 1;
        } else {
            if self.spill.is_empty() {
                self.spill.extend_from_slice(&self.inline[..self.len]);
            }
            let at = self.spill.partition_point(|&s| s < slot);
            self.spill.insert(at, slot);
        }
    }

    /// The slot at position `index` of the local copy: the `index`-th slot, counting from 0, that
    /// has not been removed.
    fn nth_kept(&self, index: u32) -> u32 {
        let mut slot = index;
        for &r in self.as_slice() {
            if r <= slot {
                slot += 1;
            } else {
                break;
            }
        }
        slot
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::{JumpBackFailover, JumpFailover, Removed};
    use crate::assign::{combine_hash, jump_back_hash, Assignor, Topology};

    #[test]
    fn removed_spills_and_stays_sorted() {
        let mut r = Removed::new();
        for s in (0..100u32).rev().step_by(2) {
            r.insert(s);
        }
        let v = r.as_slice().to_vec();
        let mut sorted = v.clone();
        sorted.sort_unstable();
        assert_eq!(v, sorted);
        assert_eq!(v.len(), 50);
        // Removed: the odd numbers 1..=99; kept: the even ones.
        assert_eq!(r.nth_kept(0), 0);
        assert_eq!(r.nth_kept(1), 2);
        assert_eq!(r.nth_kept(49), 98);
        assert_eq!(r.nth_kept(50), 100);
    }

    #[test]
    fn almost_every_slot_dead_still_terminates_on_the_live_one() {
        let topology = Topology::from_live(200, [137]).unwrap();
        let a = JumpFailover::build(&topology).unwrap();
        let b = JumpBackFailover::build(&topology).unwrap();
        for key in 0..2000u64 {
            assert_eq!(a.owner(crate::assign::hash_u64(key)), 137);
            assert_eq!(b.owner(crate::assign::hash_u64(key)), 137);
        }
    }

    #[test]
    fn jump_back_failover_is_jump_back_hash_while_all_live_and_fails_over_like_jump() {
        let all = Topology::new(50).unwrap();
        let a = JumpBackFailover::build(&all).unwrap();
        for key in 0..2000u64 {
            let k = crate::assign::hash_u64(key);
            assert_eq!(a.owner(k), jump_back_hash(k, 50));
        }
        // The failover loop written out naively, as RavenDB's article describes it, with
        // JumpBackHash as the hash.
        let t = Topology::from_live(12, [0, 2, 3, 7, 11]).unwrap();
        let a = JumpBackFailover::build(&t).unwrap();
        for key in 0..2000u64 {
            let mut k = crate::assign::hash_u64(key);
            let mut nodes: Vec<u32> = (0..12).collect();
            let expected = loop {
                let index = jump_back_hash(k, nodes.len() as u32) as usize;
                if t.is_live(nodes[index]) {
                    break nodes[index];
                }
                nodes.remove(index);
                k = combine_hash(k, nodes.len() as u64);
            };
            assert_eq!(a.owner(crate::assign::hash_u64(key)), expected);
        }
    }
}
