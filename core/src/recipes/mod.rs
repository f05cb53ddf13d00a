//! The recipes: coordination algorithms written once over [`Store`](crate::Store), so they run on
//! every backend.
//!
//! * [`interval`]: the interval indexer of the "Distributed Peer Indexing" articles, with the safe
//!   index transition they leave out.
//! * [`group`]: group membership with stable slots, store-minted epochs, cooperative hand-off
//!   and fencing tokens (the default mode).

pub mod group;
pub mod interval;

pub use interval::{
    IntervalConfig, IntervalIndexer, IntervalPeer, IntervalStatus, Ownership, Pair, PeerHealth,
    Phase, TaskGuard,
};
