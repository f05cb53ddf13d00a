//! [`Pair`]: what a peer learned for one interval, and which tasks it owns.

/// What a peer learned for one interval: its index, the replicas, and the slots it owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pair {
    /// The interval number during which this pair is in force (the article's `n` of the tick that
    /// produced it); also the fencing epoch.
    pub epoch: u64,
    /// The peer's first slot, 1-based: its index among the peers of interval `epoch - 1`.
    pub index: u64,
    /// The total capacity of interval `epoch - 1`: the number of peers when every capacity is 1.
    pub replicas: u64,
    /// How many consecutive slots from `index` the peer owns.
    pub capacity: u64,
}

impl Pair {
    /// Whether the peer owns nothing in this interval (`index > replicas`).
    pub fn is_idle(&self) -> bool {
        self.index == 0 || self.index > self.replicas
    }

    /// Whether this pair owns `task_id`: its slot `task_id mod replicas + 1` is one of
    /// `index ..= index + capacity - 1`.
    pub fn owns(&self, task_id: u64) -> bool {
        if self.is_idle() {
            return false;
        }
        let slot = task_id % self.replicas + 1;
        slot >= self.index && slot - self.index < self.capacity
    }

    /// Whether two pairs own exactly the same tasks (the epoch aside).
    pub fn same_ownership(&self, other: &Pair) -> bool {
        (self.is_idle() && other.is_idle())
            || (self.index, self.replicas, self.capacity)
                == (other.index, other.replicas, other.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::Pair;

    #[test]
    fn ownership_maps_tasks_to_one_based_slots() {
        let p = |index, replicas, capacity| Pair {
            epoch: 1,
            index,
            replicas,
            capacity,
        };
        // The article's modulo: task % replicas == index - 1.
        for t in 0..30u64 {
            let owners: Vec<u64> = (1..=3).filter(|&i| p(i, 3, 1).owns(t)).collect();
            assert_eq!(owners, vec![t % 3 + 1]);
        }
        assert!(p(3, 2, 1).is_idle());
        assert!((0..10).all(|t| !p(3, 2, 1).owns(t)));
        // Capacity 2 owns two slots of three.
        let heavy = p(1, 3, 2);
        assert_eq!((0..300).filter(|&t| heavy.owns(t)).count(), 200);
        assert!(p(1, 3, 1).same_ownership(&Pair {
            epoch: 9,
            ..p(1, 3, 1)
        }));
    }
}
