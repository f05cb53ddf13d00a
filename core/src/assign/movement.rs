//! Movement preview: which keys a topology change would move, before it is applied.

use super::{hash_bytes, Assignor};

/// One key of a sample that changes owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Move {
    /// The key's position in the sample, so byte keys can be found again.
    pub index: usize,
    /// The key (for byte keys, its [`hash_bytes`]).
    pub key: u64,
    /// Its owner before.
    pub from: u32,
    /// Its owner after.
    pub to: u32,
}

/// The keys of a sample that change owner between two assignors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Movement {
    /// How many keys the sample had.
    pub sampled: usize,
    /// The keys that change owner, in sample order.
    pub moves: Vec<Move>,
}

impl Movement {
    /// How many keys move.
    pub fn moved(&self) -> usize {
        self.moves.len()
    }

    /// The fraction of the sample that moves; 0 for an empty sample.
    pub fn fraction(&self) -> f64 {
        if self.sampled == 0 {
            0.0
        } else {
            self.moves.len() as f64 / self.sampled as f64
        }
    }

    /// How many of the moving keys leave `slot`.
    pub fn lost_by(&self, slot: u32) -> usize {
        self.moves.iter().filter(|m| m.from == slot).count()
    }

    /// How many of the moving keys go to `slot`.
    pub fn gained_by(&self, slot: u32) -> usize {
        self.moves.iter().filter(|m| m.to == slot).count()
    }
}

/// The keys of `keys` whose owner under `old` differs from their owner under `new`: the cost of
/// going from `old`'s topology to `new`'s, seen before it happens. Build `new` from the proposed
/// topology with the same algorithm (or use [`AssignorKind::preview`](crate::assign::AssignorKind::preview)).
pub fn preview(
    old: &dyn Assignor,
    new: &dyn Assignor,
    keys: impl IntoIterator<Item = u64>,
) -> Movement {
    let mut movement = Movement::default();
    for (index, key) in keys.into_iter().enumerate() {
        movement.sampled += 1;
        let (from, to) = (old.owner(key), new.owner(key));
        if from != to {
            movement.moves.push(Move {
                index,
                key,
                from,
                to,
            });
        }
    }
    movement
}

/// [`preview`] for byte keys, hashed with [`hash_bytes`]; [`Move::index`] finds the key again.
pub fn preview_bytes<K: AsRef<[u8]>>(
    old: &dyn Assignor,
    new: &dyn Assignor,
    keys: impl IntoIterator<Item = K>,
) -> Movement {
    preview(old, new, keys.into_iter().map(|k| hash_bytes(k.as_ref())))
}

/// How many keys of `keys` change owner between `old` and `new`, without collecting them.
pub fn count_moved(
    old: &dyn Assignor,
    new: &dyn Assignor,
    keys: impl IntoIterator<Item = u64>,
) -> usize {
    keys.into_iter()
        .filter(|&k| old.owner(k) != new.owner(k))
        .count()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::{count_moved, preview_bytes, Movement};
    use crate::assign::{hash_bytes, AssignorKind, Topology};

    #[test]
    fn preview_lists_exactly_the_changed_keys() {
        let before = Topology::new(4).unwrap();
        let after = Topology::new(5).unwrap();
        let old = AssignorKind::JumpFailover.build(&before).unwrap();
        let new = AssignorKind::JumpFailover.build(&after).unwrap();
        let names: Vec<String> = (0..2000).map(|i| format!("task-{i}")).collect();
        let m = preview_bytes(old.as_ref(), new.as_ref(), &names);
        assert_eq!(m.sampled, 2000);
        assert_eq!(m.gained_by(4), m.moved());
        assert_eq!(m.lost_by(4), 0);
        for mv in &m.moves {
            assert_eq!(old.owner_of_bytes(names[mv.index].as_bytes()), mv.from);
            assert_eq!(new.owner_of_bytes(names[mv.index].as_bytes()), mv.to);
        }
        let hashes = names.iter().map(|n| hash_bytes(n.as_bytes()));
        assert_eq!(count_moved(old.as_ref(), new.as_ref(), hashes), m.moved());
        assert!(m.fraction() > 0.1 && m.fraction() < 0.3, "{}", m.fraction());
        assert_eq!(Movement::default().fraction(), 0.0);
    }
}
