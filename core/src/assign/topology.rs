//! The topology an assignor works over: numbered slots, some live and some dead, with weights and
//! the order in which the dead ones died.

use std::fmt;

/// The most slots a [`Topology`] holds: far more than any group of members, and small enough that
/// per-slot tables stay a few megabytes.
pub const MAX_SLOTS: u32 = 1 << 20;

/// Why an assignor or a topology refused its input. Nothing is ever half-built: a constructor
/// that returns one of these has changed nothing.
///
/// Converts into the crate's [`Error`](crate::Error) as [`Error::InvalidArgument`](crate::Error::InvalidArgument).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssignError {
    /// The topology has no live slot, so no key can have an owner.
    #[error("the topology has no live slot, so no key can have an owner")]
    NoLiveSlot,

    /// A slot number is not below the topology's slot count.
    #[error("slot {slot} is out of range: the topology has {slots} slots")]
    SlotOutOfRange {
        /// The slot asked for.
        slot: u32,
        /// The topology's slot count.
        slots: u32,
    },

    /// More slots than [`MAX_SLOTS`].
    #[error("a topology holds at most {max} slots, not {requested}")]
    TooManySlots {
        /// How many were asked for.
        requested: u64,
        /// [`MAX_SLOTS`].
        max: u32,
    },

    /// A weight of zero. A slot that should take no keys is a dead slot; weights start at 1.
    #[error("slot {slot} has weight 0; weights start at 1 (mark the slot dead instead)")]
    ZeroWeight {
        /// The slot.
        slot: u32,
    },

    /// The assignor has no notion of weight, and the live slots' weights differ. (Equal weights,
    /// whatever their value, are accepted.)
    #[error("the {assignor} assignor ignores weights, but the live slots' weights differ")]
    WeightsUnsupported {
        /// The assignor's name.
        assignor: &'static str,
    },

    /// The ring would need more points than [`MAX_RING_POINTS`](crate::assign::MAX_RING_POINTS).
    #[error(
        "the ring would hold {points} points, more than the limit of {max}; lower the weights"
    )]
    RingTooLarge {
        /// How many points the weights ask for.
        points: u64,
        /// The limit.
        max: u64,
    },

    /// A death order lists a slot twice.
    #[error("slot {slot} appears twice in the death order")]
    DuplicateSlot {
        /// The slot.
        slot: u32,
    },

    /// Two services or two work units of a distributor matching share a name.
    #[error("the {what} name {name:?} appears twice")]
    DuplicateName {
        /// `"service"` or `"work unit"`.
        what: &'static str,
        /// The name, lossily decoded as UTF-8 and cut to 64 characters.
        name: String,
    },

    /// An assignor name that is not known.
    #[error(transparent)]
    UnknownAssignor(#[from] UnknownAssignor),

    /// A declared key with an empty name.
    #[error("declared key number {index} has an empty name")]
    EmptyKeyName {
        /// Its position among the declared keys, from 0.
        index: usize,
    },

    /// Two declared names with the same hash, which would have to share an owner.
    #[error("the declared keys {first:?} and {second:?} have the same hash; rename one")]
    KeyHashCollision {
        /// One name, lossily decoded as UTF-8 and cut to 64 characters.
        first: String,
        /// The other.
        second: String,
    },

    /// More declared keys than [`MAX_DECLARED_KEYS`](crate::assign::MAX_DECLARED_KEYS).
    #[error("a declared key set holds at most {max} keys")]
    TooManyKeys {
        /// The limit.
        max: usize,
    },

    /// The balanced or sticky assignor was asked to build for a key set it was not given (and
    /// that is not a set of partitions it could rebuild from the count).
    #[error("the assignor for a declared key set needs its keys (set {id}), which were not given")]
    KeysNotDeclared {
        /// The set's id.
        id: crate::assign::KeySetId,
    },

    /// A stored assignment of a declared key set (a view of the sticky assignor) that cannot be
    /// this topology's: another number of keys, an owner that is not live, or shares more than
    /// one key apart.
    #[error("the stored assignment is not valid for these slots and keys: {reason}")]
    StoredAssignmentInvalid {
        /// What is wrong.
        reason: String,
    },

    /// Work units to distribute but no service to take them.
    #[error("there are {units} work units but no service to take them")]
    NoServices {
        /// How many work units were waiting.
        units: usize,
    },
}

/// A name that is not one of [`AssignorKind::name`](crate::assign::AssignorKind::name)'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown assignor {0:?}; expected one of modulo, jump, ring, rendezvous, memento, jumpback, jumpback-memento, balanced:<partitions>, balanced:<count>:<digest>, sticky:<partitions>, sticky:<count>:<digest>")]
pub struct UnknownAssignor(pub String);

impl From<AssignError> for crate::Error {
    fn from(e: AssignError) -> Self {
        crate::Error::invalid(e.to_string())
    }
}

/// How a [`Topology`] orders its dead slots, which only [`Memento`](crate::assign::Memento)
/// depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeathOrder {
    /// Dead slots are taken highest first, whatever order they died in, so the assignment is a
    /// pure function of the set of live slots: every member that sees the same live set agrees,
    /// however it learned of it. What this costs is in the [module docs](crate::assign#determinism-and-the-order-of-deaths).
    Canonical,
    /// Dead slots are taken in the order recorded with the topology (oldest death first), which
    /// the members must share, for instance in the published view. A new death is appended, so
    /// MementoHash moves only the dead slot's keys whichever slot it is.
    Recorded,
}

/// Numbered slots `0..slot_count`, each live or dead, each with a weight (1 unless set), plus the
/// order of the dead slots ([`DeathOrder`]).
///
/// This is what a group's view looks like to an assignor: slot `i` is the member holding
/// `hc:{group}:slot:{i}`. Slots keep their numbers when others die or join, which is what lets
/// the consistent assignors move few keys.
///
/// A topology may have no live slot at all (everyone left); building an assignor over it then
/// fails with [`AssignError::NoLiveSlot`].
///
/// ```
/// use headcount_core::assign::Topology;
/// let mut topology = Topology::from_live(5, [0, 1, 3])?;
/// assert_eq!(topology.live_count(), 3);
/// topology.set_live(4)?;
/// topology.set_dead(0)?;
/// assert_eq!(topology.live_slots().collect::<Vec<_>>(), [1, 3, 4]);
/// # Ok::<(), headcount_core::assign::AssignError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Topology {
    live: Vec<bool>,
    weights: Vec<u32>,
    live_count: u32,
    /// The dead slots in the order an assignor should remove them: descending for
    /// [`DeathOrder::Canonical`], as recorded otherwise.
    dead: Vec<u32>,
    order: DeathOrder,
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Topology");
        s.field("slots", &self.slot_count())
            .field("live", &self.live_count)
            .field("dead", &self.dead)
            .field("order", &self.order);
        if !self.has_uniform_weights() {
            s.field("weights", &self.weights);
        }
        s.finish()
    }
}

fn check_count(slots: u64) -> Result<u32, AssignError> {
    match u32::try_from(slots) {
        Ok(n) if n <= MAX_SLOTS => Ok(n),
        _ => Err(AssignError::TooManySlots {
            requested: slots,
            max: MAX_SLOTS,
        }),
    }
}

impl Topology {
    /// `slots` live slots of weight 1. Zero slots is allowed and has no live slot.
    pub fn new(slots: u32) -> Result<Self, AssignError> {
        let n = check_count(u64::from(slots))?;
        Ok(Topology {
            live: vec![true; n as usize],
            weights: vec![1; n as usize],
            live_count: n,
            dead: Vec::new(),
            order: DeathOrder::Canonical,
        })
    }

    /// `slots` slots of which those listed in `live` are live (repeats are harmless), with the
    /// [canonical](DeathOrder::Canonical) death order.
    pub fn from_live(slots: u32, live: impl IntoIterator<Item = u32>) -> Result<Self, AssignError> {
        let n = check_count(u64::from(slots))?;
        let mut flags = vec![false; n as usize];
        for slot in live {
            *flags
                .get_mut(slot as usize)
                .ok_or(AssignError::SlotOutOfRange { slot, slots: n })? = true;
        }
        let live_count = flags.iter().filter(|&&l| l).count() as u32;
        let dead = (0..n).rev().filter(|&s| !flags[s as usize]).collect();
        Ok(Topology {
            live: flags,
            weights: vec![1; n as usize],
            live_count,
            dead,
            order: DeathOrder::Canonical,
        })
    }

    /// The topology whose live slots are `live` and whose slot count is the highest of them plus
    /// one, as a member sees a group from the live keys `hc:{group}:slot:{i}` alone.
    ///
    /// Leaving out dead slots above the highest live one is harmless for every assignor except
    /// [`JumpFailover`](crate::assign::JumpFailover) with other slots dead as well (see its docs);
    /// with the canonical order, [`Memento`](crate::assign::Memento) builds exactly the same state
    /// either way.
    pub fn from_live_slots(live: impl IntoIterator<Item = u32>) -> Result<Self, AssignError> {
        let live: Vec<u32> = live.into_iter().collect();
        let slots = live.iter().map(|&s| u64::from(s) + 1).max().unwrap_or(0);
        Self::from_live(check_count(slots)?, live)
    }

    /// `slots` slots of which those in `dead_in_order` are dead, with that [recorded](DeathOrder::Recorded)
    /// order (oldest death first). Every other slot is live.
    pub fn from_death_order(
        slots: u32,
        dead_in_order: impl IntoIterator<Item = u32>,
    ) -> Result<Self, AssignError> {
        let n = check_count(u64::from(slots))?;
        let mut live = vec![true; n as usize];
        let mut dead = Vec::new();
        for slot in dead_in_order {
            let flag = live
                .get_mut(slot as usize)
                .ok_or(AssignError::SlotOutOfRange { slot, slots: n })?;
            if !*flag {
                return Err(AssignError::DuplicateSlot { slot });
            }
            *flag = false;
            dead.push(slot);
        }
        Ok(Topology {
            live,
            weights: vec![1; n as usize],
            live_count: n - dead.len() as u32,
            dead,
            order: DeathOrder::Recorded,
        })
    }

    /// How many slots, live or dead.
    pub fn slot_count(&self) -> u32 {
        self.live.len() as u32
    }

    /// How many live slots.
    pub fn live_count(&self) -> u32 {
        self.live_count
    }

    /// Whether `slot` is live; false for a slot out of range.
    pub fn is_live(&self, slot: u32) -> bool {
        self.live.get(slot as usize).copied().unwrap_or(false)
    }

    /// The live slots, ascending.
    pub fn live_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.live
            .iter()
            .enumerate()
            .filter(|(_, &l)| l)
            .map(|(s, _)| s as u32)
    }

    /// The dead slots in the order an assignor removes them: highest first for
    /// [`DeathOrder::Canonical`], oldest death first for [`DeathOrder::Recorded`].
    pub fn dead_slots(&self) -> &[u32] {
        &self.dead
    }

    /// How the dead slots are ordered.
    pub fn death_order(&self) -> DeathOrder {
        self.order
    }

    /// The weight of `slot`, or `None` for a slot out of range.
    pub fn weight(&self, slot: u32) -> Option<u32> {
        self.weights.get(slot as usize).copied()
    }

    /// Whether all live slots have the same weight (true when there are none).
    pub fn has_uniform_weights(&self) -> bool {
        let mut live = self.live_slots().filter_map(|s| self.weight(s));
        match live.next() {
            Some(first) => live.all(|w| w == first),
            None => true,
        }
    }

    fn check(&self, slot: u32) -> Result<usize, AssignError> {
        if slot < self.slot_count() {
            Ok(slot as usize)
        } else {
            Err(AssignError::SlotOutOfRange {
                slot,
                slots: self.slot_count(),
            })
        }
    }

    /// Marks `slot` dead; nothing changes if it already is. With the canonical order the dead
    /// slots stay sorted highest first; with a recorded order `slot` becomes the newest death.
    pub fn set_dead(&mut self, slot: u32) -> Result<(), AssignError> {
        let i = self.check(slot)?;
        if !self.live[i] {
            return Ok(());
        }
        self.live[i] = false;
        self.live_count -= 1;
        match self.order {
            DeathOrder::Canonical => {
                let at = self.dead.partition_point(|&d| d > slot);
                self.dead.insert(at, slot);
            }
            DeathOrder::Recorded => self.dead.push(slot),
        }
        Ok(())
    }

    /// Marks `slot` live; nothing changes if it already is. The slot leaves the death order.
    pub fn set_live(&mut self, slot: u32) -> Result<(), AssignError> {
        let i = self.check(slot)?;
        if self.live[i] {
            return Ok(());
        }
        self.live[i] = true;
        self.live_count += 1;
        self.dead.retain(|&d| d != slot);
        Ok(())
    }

    /// Appends a new live slot of weight 1 and returns its number.
    pub fn push_slot(&mut self) -> Result<u32, AssignError> {
        let slot = check_count(u64::from(self.slot_count()) + 1)? - 1;
        self.live.push(true);
        self.weights.push(1);
        self.live_count += 1;
        Ok(slot)
    }

    /// Sets the weight of `slot`, live or dead. Only [`Ring`](crate::assign::Ring) and
    /// [`Rendezvous`](crate::assign::Rendezvous) use weights; the others refuse unequal ones.
    /// Weights are integers so that every member computes with exactly the same numbers.
    pub fn set_weight(&mut self, slot: u32, weight: u32) -> Result<(), AssignError> {
        let i = self.check(slot)?;
        if weight == 0 {
            return Err(AssignError::ZeroWeight { slot });
        }
        self.weights[i] = weight;
        Ok(())
    }

    /// Fails with [`AssignError::NoLiveSlot`] when no slot is live.
    pub(crate) fn require_live(&self) -> Result<(), AssignError> {
        if self.live_count == 0 {
            Err(AssignError::NoLiveSlot)
        } else {
            Ok(())
        }
    }

    /// Fails with [`AssignError::WeightsUnsupported`] when the live slots' weights differ.
    pub(crate) fn require_uniform(&self, assignor: &'static str) -> Result<(), AssignError> {
        if self.has_uniform_weights() {
            Ok(())
        } else {
            Err(AssignError::WeightsUnsupported { assignor })
        }
    }

    pub(crate) fn live_flags(&self) -> &[bool] {
        &self.live
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::{AssignError, Topology, MAX_SLOTS};

    #[test]
    fn canonical_order_is_highest_first_whatever_the_events() {
        let mut a = Topology::new(8).unwrap();
        for s in [2, 6, 0, 4] {
            a.set_dead(s).unwrap();
        }
        let mut b = Topology::new(8).unwrap();
        for s in [4, 0, 6, 2, 5] {
            b.set_dead(s).unwrap();
        }
        b.set_live(5).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.dead_slots(), [6, 4, 2, 0]);
        assert_eq!(a, Topology::from_live(8, [1, 3, 5, 7]).unwrap());
    }

    #[test]
    fn recorded_order_keeps_the_order_of_deaths() {
        let mut t = Topology::from_death_order(6, [4, 1]).unwrap();
        t.set_dead(3).unwrap();
        assert_eq!(t.dead_slots(), [4, 1, 3]);
        t.set_live(1).unwrap();
        assert_eq!(t.dead_slots(), [4, 3]);
        assert_eq!(t.live_count(), 4);
        assert_eq!(
            Topology::from_death_order(6, [4, 4]),
            Err(AssignError::DuplicateSlot { slot: 4 })
        );
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        assert_eq!(
            Topology::from_live(3, [3]),
            Err(AssignError::SlotOutOfRange { slot: 3, slots: 3 })
        );
        assert!(matches!(
            Topology::new(MAX_SLOTS + 1),
            Err(AssignError::TooManySlots { .. })
        ));
        assert!(matches!(
            Topology::from_live_slots([u32::MAX]),
            Err(AssignError::TooManySlots { .. })
        ));
        let mut t = Topology::new(2).unwrap();
        assert_eq!(t.set_weight(1, 0), Err(AssignError::ZeroWeight { slot: 1 }));
        assert!(t.set_dead(2).is_err());
        assert!(t.set_live(9).is_err());
        assert!(!t.is_live(9));
        assert_eq!(t.weight(9), None);
        let e: crate::Error = AssignError::NoLiveSlot.into();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
    }

    #[test]
    fn from_live_slots_counts_up_to_the_highest() {
        let t = Topology::from_live_slots([3, 0]).unwrap();
        assert_eq!(t.slot_count(), 4);
        assert_eq!(t.dead_slots(), [2, 1]);
        let empty = Topology::from_live_slots([]).unwrap();
        assert_eq!(empty.slot_count(), 0);
        assert_eq!(empty.live_count(), 0);
        assert!(empty.has_uniform_weights());
    }

    #[test]
    fn weights_of_dead_slots_do_not_break_uniformity() {
        let mut t = Topology::from_live(3, [0, 1]).unwrap();
        t.set_weight(2, 7).unwrap();
        assert!(t.has_uniform_weights());
        t.set_weight(1, 2).unwrap();
        assert!(!t.has_uniform_weights());
    }
}
