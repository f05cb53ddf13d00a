//! Where a peer stands: [`IntervalPhase`] and the [`IntervalStatus`] it publishes.

use super::Pair;

/// Where a peer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IntervalPhase {
    /// Joined; no pair yet (the first arrives at the second tick).
    Warming,
    /// Taking tasks under [`IntervalStatus::pair`].
    Active,
    /// A new pair arrived: not taking new tasks, waiting for in-flight ones to finish.
    Draining,
    /// Drained and acknowledged: waiting for the other peers' acknowledgements.
    Waiting,
    /// The last tick could not be confirmed (store fault, foreign value, or it ran in the second
    /// half of its interval and skipped drawing): the pair shown is the last confirmed one, and
    /// it stops owning tasks when it expires.
    Faulted,
    /// Stopped.
    Stopped,
}

impl IntervalPhase {
    /// A short lower-case name: `warming`, `active`, `draining`, `waiting`, `faulted`, `stopped`.
    pub fn as_str(self) -> &'static str {
        match self {
            IntervalPhase::Warming => "warming",
            IntervalPhase::Active => "active",
            IntervalPhase::Draining => "draining",
            IntervalPhase::Waiting => "waiting",
            IntervalPhase::Faulted => "faulted",
            IntervalPhase::Stopped => "stopped",
        }
    }
}

/// The value a peer publishes on its watch channel whenever it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntervalStatus {
    /// The member id.
    pub member: String,
    /// The last pair the peer confirmed (kept through faults); whether it owns tasks right now is
    /// [`Ownership::pair`](super::Ownership::pair).
    pub pair: Option<Pair>,
    /// Where the peer stands.
    pub phase: IntervalPhase,
    /// The interval number of the last tick attempted.
    pub last_tick: Option<u64>,
    /// The last error, cleared by the next clean tick.
    pub last_error: Option<String>,
}
