//! Modulo: the peer-indexing articles' `key mod replicas`.

use super::{AssignError, Assignor, AssignorKind, Topology};

/// `key mod live_count`, indexing the live slots in ascending order: the assignment of the
/// peer-indexing articles, where a member with index `i` of `n` takes the keys with
/// `key % n == i`.
///
/// Perfectly balanced and the fastest, but not consistent: when one slot dies or joins, about
/// `1 - 1/n` of all keys change owner (every key whose `key % n` differs from `key % (n ± 1)`,
/// plus the shift of the indices above a dead slot). Kept as the baseline the others are measured
/// against. Refuses unequal weights.
#[derive(Debug, Clone)]
pub struct Modulo {
    topology: Topology,
    live: Vec<u32>,
}

impl Assignor for Modulo {
    fn build(topology: &Topology) -> Result<Self, AssignError> {
        topology.require_live()?;
        topology.require_uniform("modulo")?;
        Ok(Modulo {
            topology: topology.clone(),
            live: topology.live_slots().collect(),
        })
    }

    fn kind(&self) -> AssignorKind {
        AssignorKind::Modulo
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }

    #[inline]
    fn owner(&self, key: u64) -> u32 {
        // `live` is non-empty (build checked), so the index is in range.
        self.live[(key % self.live.len() as u64) as usize]
    }
}
