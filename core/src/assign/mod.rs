//! Assignors: which live slot owns a key.
//!
//! An assignor is a pure function from a key to the slot that owns it, given a [`Topology`]:
//! numbered slots (slot `i` is the member holding `hc:{group}:slot:{i}`), some of them dead.
//! Every member computes it locally from the same topology and gets the same answer, so nobody
//! coordinates ownership of individual keys. An assignor is built once per topology
//! ([`Assignor::build`], which does any precomputation) and then answers [`Assignor::owner`]
//! without allocating.
//!
//! | assignor | source | balance | one slot dies | one slot joins | dead slot's keys go to | lookup |
//! |---|---|---|---|---|---|---|
//! | [`Modulo`] | the peer-indexing articles | ≈1 (exact for consecutive keys) | almost all keys move | almost all keys move | everyone (everything reshuffles) | `O(1)` |
//! | [`JumpFailover`] | Lamping & Veach + RavenDB's "Distributed Task Assignment With Failover" | ≈1 | only its keys move | only keys to it move¹ | all survivors, evenly | `O(log n)` per hop |
//! | [`Ring`] | the distributor (the article "Distributor"), 50 points per weight | max/avg 1.1–1.45 | only its keys move | only keys to it move | the next points' owners | `O(log 50n)` |
//! | [`Rendezvous`] | Thaler & Ravishankar, weighted | ≈1 | only its keys move | only keys to it move | all survivors, by weight | `O(n)` |
//! | [`Memento`] | Coluzzi et al. 2023 (arXiv 2306.09783) | ≈1 | only its keys move² | only keys to it move² | all survivors, evenly | `O(log n)` + table hops |
//! | [`JumpBackFailover`] | Ertl 2024 (JumpBackHash) + RavenDB | ≈1 | only its keys move | only keys to it move¹ | all survivors, evenly | `O(1)` expected per hop |
//! | [`JumpBackMemento`] | Ertl 2024 + Coluzzi et al. 2023 | ≈1 | only its keys move² | only keys to it move² | all survivors, evenly | `O(1)` expected + table hops |
//! | [`Balanced`] (a declared [`KeySet`] only) | Gale & Shapley's deferred acceptance over rendezvous scores, capacities ⌊m/n⌋ and ⌈m/n⌉ | within one key | its keys and some others move³ | keys to it and some others move³ | the next in each key's ranking, where there is room | binary search |
//! | [`Sticky`] (a declared [`KeySet`] only; not a function of the topology⁴) | the previous assignment, kept up to each slot's capacity; the rest by [`Balanced`]'s matching | within one key | only its keys move | only its share moves, to it | the slots with room, by [`Balanced`]'s matching | binary search |
//!
//! ¹ When it revives a dead slot, or is appended while no slot is dead (see [`JumpFailover`]).
//! ² See [Determinism and the order of deaths](#determinism-and-the-order-of-deaths).
//! ³ How many others is measured in `docs/assignors.md` (1.005–2.25 times the minimum in the
//! measured cases); keys outside the declared set are [`JumpBackFailover`]'s.
//! ⁴ Each assignment is computed from the previous one ([`Sticky::next`]) and stored: a group
//! keeps it in its view. The fewest moves balance allows, after any change.
//!
//! [`JumpBackFailover`] and [`JumpBackMemento`] are [`JumpFailover`] and [`Memento`] with
//! [`jump_back_hash`] (Otmar Ertl's JumpBackHash, 2024) in place of [`jump_consistent_hash`]
//! (Lamping and Veach, 2014): the same guarantees, several times faster lookups, but different
//! assignments, so every member of a group must use the same assignor.
//!
//! Measured balance, movement and lookup times are in `docs/assignors.md` and come from the
//! [`report`] module and the criterion benchmarks (`cargo bench -p headcount-core`).
//!
//! # Keys
//!
//! [`Assignor::owner`] takes a `u64` that is already a hash, as the algorithms' papers assume:
//! jump hash uses the key as the seed of its generator, the ring as a position. Pass integer IDs
//! that are not hashes (0, 1, 2, ...) through [`hash_u64`]. Byte keys go through
//! [`Assignor::owner_of_bytes`], which hashes them with [`hash_bytes`]: XXH64 with seed 0, fixed
//! forever and the same on every platform, checked against the reference implementation's
//! outputs in `testdata/xxh64.txt`.
//!
//! # Determinism and the order of deaths
//!
//! Members must agree on every key's owner, so an assignment may depend on nothing but the
//! topology: not on the order in which a member saw members die and join. (The one exception,
//! [`Sticky`], depends on the previous assignment too, so a group stores it in the view for every
//! member to read rather than compute.) [`Modulo`], [`Ring`],
//! [`Rendezvous`], [`JumpFailover`] and [`JumpBackFailover`] are pure functions of the slot count,
//! the live set and the weights, and their guarantees in the table hold for any single change
//! (within footnote ¹).
//!
//! [`Memento`] (and [`JumpBackMemento`], which shares its table and everything said here) is
//! different: MementoHash keeps a table whose content depends on the order in
//! which slots were removed, and its minimal movement is a property of appending one removal to
//! that history. Here the history is part of the topology, [`Topology::dead_slots`], in one of two
//! [`DeathOrder`]s:
//!
//! - [`DeathOrder::Canonical`] (from [`Topology::new`], [`Topology::from_live`],
//!   [`Topology::from_live_slots`]): the dead slots are removed highest first, whatever order they
//!   died in, so the assignment is a function of the live set alone. No fixed order can make
//!   every single death an append (for dead sets `{a}` then `{a, b}`, and `{b}` then `{a, b}`, one
//!   order must serve both), so this one is chosen to suit a group: movement is minimal when the
//!   slot that dies is below every dead slot (always, when none was dead) and when the lowest dead
//!   slot comes back, which is the slot a joining member claims. Any other single change may also
//!   move keys that had landed on dead slots between live ones; keys whose jump slot is live still
//!   never move unless that slot died. The tests check exactly these claims, and the report
//!   measures the extra movement.
//! - [`DeathOrder::Recorded`] (from [`Topology::from_death_order`]): the order is given, oldest
//!   death first, and [`Topology::set_dead`] appends. Members must share it, for instance by
//!   publishing it with the view. Then every single death is minimal, whichever slot, and so is the
//!   return of the most recently dead slot.
//!
//! Several changes at once (two slots dying in one view change) are never guaranteed minimal by
//! MementoHash in either order.
//!
//! Floating point is used in two places, both deterministic across platforms: jump hash's
//! reference arithmetic (IEEE-754 division and multiplication are correctly rounded everywhere),
//! and weighted [`Rendezvous`], whose logarithm is written with basic operations instead of the
//! platform's `ln`.
//!
//! # Movement preview
//!
//! Before applying a view change, [`preview`] (or [`AssignorKind::preview`]) tells which keys of
//! a sample would change owner, from where to where, so a caller can see the cost of a change;
//! [`count_moved`] counts without collecting.
//!
//! # Bad input
//!
//! Nothing here panics or loops forever on input. A topology with no live slot, a slot out of
//! range, a weight of zero, unequal weights for an assignor without weights, or a ring too large
//! is an [`AssignError`] from the constructor; after that, lookups cannot fail. Weights are
//! integers, so there is no NaN to reject. [`jump_consistent_hash`] with zero buckets returns 0.
//!
//! ```
//! use headcount_core::assign::{Assignor, AssignorKind, Memento, Topology, preview, hash_u64};
//!
//! let before = Topology::new(10)?;
//! let mut after = before.clone();
//! after.set_dead(4)?;
//!
//! let old = Memento::build(&before)?;
//! let new = Memento::build(&after)?;
//! let keys: Vec<u64> = (0..10_000).map(hash_u64).collect();
//! let movement = preview(&old, &new, keys.iter().copied());
//! // Only slot 4's keys move, and none of them to slot 4.
//! assert!(movement.moves.iter().all(|m| m.from == 4 && m.to != 4));
//! assert!(keys.iter().all(|&k| new.owner(k) != 4));
//!
//! // The same by name, as a CLI flag would choose it.
//! let kind: AssignorKind = "memento".parse()?;
//! assert_eq!(kind.preview(&before, &after, keys.iter().copied())?.moved(), movement.moved());
//! # Ok::<(), headcount_core::assign::AssignError>(())
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

mod balanced;
mod hash;
mod jump;
mod memento;
mod modulo;
mod movement;
mod rendezvous;
pub mod report;
mod ring;
mod sticky;
mod topology;
#[cfg(test)]
mod vectors;

pub use balanced::{Balanced, KeySet, KeySetId, MAX_DECLARED_KEYS};
pub use hash::{combine_hash, hash_bytes, hash_u64, jump_back_hash, jump_consistent_hash, xxh64};
pub use jump::{JumpBackFailover, JumpFailover};
pub use memento::{JumpBackMemento, Memento};
pub use modulo::Modulo;
pub use movement::{count_moved, preview, preview_bytes, Move, Movement};
pub use rendezvous::Rendezvous;
pub use ring::{match_work_units, Ring, MAX_RING_POINTS, POINTS_PER_WEIGHT};
pub use sticky::Sticky;
pub(crate) use sticky::{check_shares, decode_owners, encode_owners};
pub use topology::{AssignError, DeathOrder, Topology, UnknownAssignor, MAX_SLOTS};

/// The owner of a key, given a topology of slots some of which may be dead.
///
/// Implementations are built once per topology and then answer lookups without allocating and
/// without failing: every failure (no live slot, bad weights) is reported by [`Assignor::build`].
/// The owner is always a live slot of [`Assignor::topology`].
pub trait Assignor: fmt::Debug + Send + Sync {
    /// Builds the assignor for `topology`, doing any precomputation (the ring's points,
    /// MementoHash's table). Fails with [`AssignError::NoLiveSlot`] when no slot is live, and
    /// with [`AssignError::WeightsUnsupported`] when the assignor has no weights but the live
    /// slots' weights differ.
    fn build(topology: &Topology) -> Result<Self, AssignError>
    where
        Self: Sized;

    /// Which algorithm this is.
    fn kind(&self) -> AssignorKind;

    /// The topology this was built for.
    fn topology(&self) -> &Topology;

    /// The live slot that owns `key`, a key that is already a hash (see [`hash_u64`] for plain
    /// integer IDs).
    fn owner(&self, key: u64) -> u32;

    /// The live slot that owns a byte key: [`Assignor::owner`] of [`hash_bytes`]`(key)`.
    fn owner_of_bytes(&self, key: &[u8]) -> u32 {
        self.owner(hash_bytes(key))
    }
}

/// The assignors by name, for choosing one at run time (a flag, a config file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AssignorKind {
    /// [`Modulo`], named `modulo`.
    Modulo,
    /// [`JumpFailover`], named `jump`.
    JumpFailover,
    /// [`Ring`], named `ring`.
    Ring,
    /// [`Rendezvous`], named `rendezvous`.
    Rendezvous,
    /// [`Memento`], named `memento`.
    Memento,
    /// [`JumpBackFailover`], named `jumpback`.
    JumpBackFailover,
    /// [`JumpBackMemento`], named `jumpback-memento`.
    JumpBackMemento,
    /// [`Balanced`] over the declared [`KeySet`] with this id, named `balanced` and written
    /// `balanced:<count>:<digest>` (see [`AssignorKind`]'s `Display`). Not in
    /// [`AssignorKind::ALL`]: it needs its keys, so build it with
    /// [`build_with`](AssignorKind::build_with).
    Balanced(KeySetId),
    /// [`Sticky`] over the declared [`KeySet`] with this id, named `sticky` and written
    /// `sticky:<count>:<digest>`: balanced like [`AssignorKind::Balanced`], and minimal in
    /// movement because a group stores each assignment in its view. Not in
    /// [`AssignorKind::ALL`]; [`build_with`](AssignorKind::build_with) builds the first
    /// assignment, [`Sticky::next`] the ones after it.
    Sticky(KeySetId),
}

impl AssignorKind {
    /// Every assignor that needs nothing but a topology, in the order of the table in the module
    /// docs: all but [`AssignorKind::Balanced`] and [`AssignorKind::Sticky`].
    pub const ALL: [AssignorKind; 7] = [
        AssignorKind::Modulo,
        AssignorKind::JumpFailover,
        AssignorKind::Ring,
        AssignorKind::Rendezvous,
        AssignorKind::Memento,
        AssignorKind::JumpBackFailover,
        AssignorKind::JumpBackMemento,
    ];

    /// The assignor's name: `modulo`, `jump`, `ring`, `rendezvous`, `memento`, `jumpback`,
    /// `jumpback-memento`, `balanced` or `sticky` (without the key set's id, which `Display`
    /// adds).
    pub fn name(self) -> &'static str {
        match self {
            AssignorKind::Modulo => "modulo",
            AssignorKind::JumpFailover => "jump",
            AssignorKind::Ring => "ring",
            AssignorKind::Rendezvous => "rendezvous",
            AssignorKind::Memento => "memento",
            AssignorKind::JumpBackFailover => "jumpback",
            AssignorKind::JumpBackMemento => "jumpback-memento",
            AssignorKind::Balanced(_) => "balanced",
            AssignorKind::Sticky(_) => "sticky",
        }
    }

    /// The id of the key set a [`Balanced`] or [`Sticky`] assignor declares; `None` for the
    /// hashing assignors, which take any key.
    pub fn declared(self) -> Option<KeySetId> {
        match self {
            AssignorKind::Balanced(id) | AssignorKind::Sticky(id) => Some(id),
            _ => None,
        }
    }

    /// Builds this assignor for `topology` (see [`Assignor::build`]). [`AssignorKind::Balanced`]
    /// needs its keys: it builds here only when its id is that of [`KeySet::partitions`] of its
    /// count, or of the empty set, and fails with [`AssignError::KeysNotDeclared`] otherwise
    /// (use [`build_with`](Self::build_with)).
    pub fn build(self, topology: &Topology) -> Result<Box<dyn Assignor>, AssignError> {
        self.build_with(topology, None)
    }

    /// Builds this assignor for `topology`, giving [`AssignorKind::Balanced`] and
    /// [`AssignorKind::Sticky`] their declared `keys` (ignored by every other assignor, and by
    /// those two when their id differs, which then build as [`build`](Self::build) does). For
    /// `Sticky` this is the first assignment, with nothing to stick to ([`Sticky::new`]).
    pub fn build_with(
        self,
        topology: &Topology,
        keys: Option<&Arc<KeySet>>,
    ) -> Result<Box<dyn Assignor>, AssignError> {
        Ok(match self {
            AssignorKind::Modulo => Box::new(Modulo::build(topology)?),
            AssignorKind::JumpFailover => Box::new(JumpFailover::build(topology)?),
            AssignorKind::Ring => Box::new(Ring::build(topology)?),
            AssignorKind::Rendezvous => Box::new(Rendezvous::build(topology)?),
            AssignorKind::Memento => Box::new(Memento::build(topology)?),
            AssignorKind::JumpBackFailover => Box::new(JumpBackFailover::build(topology)?),
            AssignorKind::JumpBackMemento => Box::new(JumpBackMemento::build(topology)?),
            AssignorKind::Balanced(id) => {
                Box::new(Balanced::new(topology, KeySet::declared(id, keys)?)?)
            }
            AssignorKind::Sticky(id) => {
                Box::new(Sticky::new(topology, KeySet::declared(id, keys)?)?)
            }
        })
    }

    /// The keys of `keys` that change owner when this assignor goes from topology `old` to `new`
    /// (see [`preview`]).
    pub fn preview(
        self,
        old: &Topology,
        new: &Topology,
        keys: impl IntoIterator<Item = u64>,
    ) -> Result<Movement, AssignError> {
        let before = self.build(old)?;
        let after = self.build(new)?;
        Ok(preview(before.as_ref(), after.as_ref(), keys))
    }
}

/// The name, and for [`AssignorKind::Balanced`] its key set's id: `balanced:<count>:<digest>`,
/// which is what a group's view records.
impl fmt::Display for AssignorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AssignorKind::Balanced(id) => write!(f, "balanced:{id}"),
            AssignorKind::Sticky(id) => write!(f, "sticky:{id}"),
            _ => f.write_str(self.name()),
        }
    }
}

impl From<UnknownAssignor> for crate::Error {
    fn from(e: UnknownAssignor) -> Self {
        crate::Error::invalid(e.to_string())
    }
}

/// Builds a declared-set assignor from its key set's id.
type DeclaredKind = fn(KeySetId) -> AssignorKind;

/// The assignors for a declared key set, by name, as `FromStr` reads `<name>:<id>`.
const DECLARED_KINDS: [(&str, DeclaredKind); 2] = [
    ("balanced", AssignorKind::Balanced),
    ("sticky", AssignorKind::Sticky),
];

impl AssignorKind {
    /// Whether `name` (without a key set's id) names an assignor this version knows: a view
    /// that names another one was written by a later version.
    pub(crate) fn is_known_name(name: &str) -> bool {
        AssignorKind::ALL.iter().any(|k| k.name() == name)
            || DECLARED_KINDS.iter().any(|(n, _)| *n == name)
    }
}

impl FromStr for AssignorKind {
    type Err = UnknownAssignor;

    /// A name of [`AssignorKind::ALL`], or `balanced:<count>:<digest>` or
    /// `sticky:<count>:<digest>` as `Display` writes them, or `balanced:<count>` or
    /// `sticky:<count>` for [`KeySet::partitions`]`(count)`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        for (name, kind) in DECLARED_KINDS {
            if let Some(id) = s.strip_prefix(name).and_then(|r| r.strip_prefix(':')) {
                return KeySetId::parse(id)
                    .map(kind)
                    .ok_or_else(|| UnknownAssignor(s.chars().take(64).collect()));
            }
        }
        AssignorKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownAssignor(s.chars().take(64).collect()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::{hash_u64, AssignError, AssignorKind, Topology};

    #[test]
    fn names_round_trip() {
        for kind in AssignorKind::ALL {
            assert_eq!(kind.name().parse::<AssignorKind>().unwrap(), kind);
            assert_eq!(kind.to_string(), kind.name());
        }
        assert!("hash".parse::<AssignorKind>().is_err());
    }

    #[test]
    fn every_assignor_refuses_a_dead_topology() {
        for topology in [
            Topology::new(0).unwrap(),
            Topology::from_live(5, []).unwrap(),
            Topology::from_death_order(2, [1, 0]).unwrap(),
        ] {
            for kind in AssignorKind::ALL {
                assert_eq!(
                    kind.build(&topology).err(),
                    Some(AssignError::NoLiveSlot),
                    "{kind}"
                );
            }
        }
    }

    #[test]
    fn unweighted_assignors_refuse_unequal_weights() {
        let mut t = Topology::new(3).unwrap();
        t.set_weight(1, 2).unwrap();
        for kind in [
            AssignorKind::Modulo,
            AssignorKind::JumpFailover,
            AssignorKind::Memento,
            AssignorKind::JumpBackFailover,
            AssignorKind::JumpBackMemento,
        ] {
            assert!(
                matches!(kind.build(&t), Err(AssignError::WeightsUnsupported { .. })),
                "{kind}"
            );
        }
        for kind in [AssignorKind::Ring, AssignorKind::Rendezvous] {
            assert!(kind.build(&t).is_ok(), "{kind}");
        }
        // Equal weights, whatever the value, are fine everywhere.
        let mut t = Topology::new(3).unwrap();
        for s in 0..3 {
            t.set_weight(s, 5).unwrap();
        }
        for kind in AssignorKind::ALL {
            assert!(kind.build(&t).is_ok(), "{kind}");
        }
    }

    #[test]
    fn a_single_live_slot_owns_everything() {
        let t = Topology::from_live(9, [6]).unwrap();
        for kind in AssignorKind::ALL {
            let a = kind.build(&t).unwrap();
            for k in 0..500 {
                assert_eq!(a.owner(hash_u64(k)), 6, "{kind}");
            }
            assert_eq!(a.owner_of_bytes(b"anything"), 6);
        }
    }
}
