//! Weighted rendezvous hashing (highest random weight).

use super::hash::neg_ln_unit;
use super::{combine_hash, hash_u64, AssignError, Assignor, AssignorKind, Topology};

/// Rendezvous or highest-random-weight hashing (Thaler and Ravishankar, 1998), weighted by the
/// logarithmic method (Schindelhauer and Schomaker, 2005): every live slot scores the key and
/// the best score wins.
///
/// Slot `s` scores key `k` with `h = combine_hash(k, hash_u64(s))`. With equal weights the highest
/// `h` wins (ties, which need a 64-bit collision, to the lower slot). With unequal weights the
/// score is `-ln(u) / weight` with `u` the uniform variate taken from `h`, and the lowest wins:
/// a slot of weight 2 takes twice the keys of a slot of weight 1. The logarithm is computed with
/// basic IEEE operations only, so all members agree to the bit (see the module docs).
///
/// Each key's scores are independent of the other slots, so: a dead slot's keys spread over all
/// survivors in proportion to their weights; a slot that dies moves only its keys; a slot that
/// joins takes keys from every other slot and moves nothing else. The cost is one hash per live
/// slot per lookup, `O(n)`: fine for tens of slots, slow for thousands (the report measures it).
/// Allocation-free.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    topology: Topology,
    /// `(slot, seed, weight)` for each live slot, ascending by slot.
    slots: Vec<(u32, u64, f64)>,
    uniform: bool,
}

impl Assignor for Rendezvous {
    fn build(topology: &Topology) -> Result<Self, AssignError> {
        topology.require_live()?;
        let slots = topology
            .live_slots()
            .map(|s| {
                let weight = f64::from(topology.weight(s).unwrap_or(1));
                (s, hash_u64(u64::from(s)), weight)
            })
            .collect();
        Ok(Rendezvous {
            topology: topology.clone(),
            slots,
            uniform: topology.has_uniform_weights(),
        })
    }

    fn kind(&self) -> AssignorKind {
        AssignorKind::Rendezvous
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }

    #[inline]
    fn owner(&self, key: u64) -> u32 {
        if self.uniform {
            let mut best = (0u64, 0u32);
            let mut first = true;
            for &(slot, seed, _) in &self.slots {
                let h = combine_hash(key, seed);
                if first || h > best.0 {
                    best = (h, slot);
                    first = false;
                }
            }
            best.1
        } else {
            let mut best = (f64::INFINITY, 0u32);
            let mut first = true;
            for &(slot, seed, weight) in &self.slots {
                let score = neg_ln_unit(combine_hash(key, seed)) / weight;
                if first || score < best.0 {
                    best = (score, slot);
                    first = false;
                }
            }
            best.1
        }
    }
}
