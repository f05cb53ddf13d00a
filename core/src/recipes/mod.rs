//! The recipes: coordination algorithms written once over [`Store`](crate::Store), so they run on
//! every backend.
//!
//! * [`interval`]: the interval indexer of the "Distributed Peer Indexing" articles, with the safe
//!   index transition they leave out.
//! * [`ids`]: monotonically increasing IDs (fencing tokens) agreed by a majority of independent
//!   stores, failing closed.

pub mod ids;
pub mod interval;

pub use ids::{DurabilityPolicy, IdsConfig, IdsStats, MajorityIds, MediatedIds};

pub use interval::{
    IntervalConfig, IntervalIndexer, IntervalPeer, IntervalStatus, Ownership, Pair, PeerHealth,
    Phase, TaskGuard,
};
