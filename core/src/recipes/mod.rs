//! The recipes: coordination algorithms written once over [`Store`](crate::Store), so they run on
//! every backend.
//!
//! * [`interval`]: the interval indexer of the "Distributed Peer Indexing" articles, with the safe
//!   index transition they leave out.
//! * [`group`]: group membership with stable slots, store-minted epochs, cooperative hand-off
//!   and fencing tokens (the default mode).
//! * [`distributor`]: the Distributor (from the article "Distributor"): a deterministic matching of services to work
//!   units kept in the store, recomputed when a service fails its health check.
//! * [`ids`]: monotonically increasing IDs (fencing tokens) agreed by a majority of independent
//!   stores, failing closed.

pub mod distributor;
pub mod group;
pub mod ids;
pub mod interval;

pub use distributor::{
    DistributionTable, Distributor, DistributorConfig, Health, Liveness, PollOutcome, Prober,
    Registration, RunningDistributor, Service, ServiceAssignment, ServiceAssignmentWatch,
};
pub use ids::{DurabilityPolicy, IdsConfig, IdsStats, MajorityIds, MediatedIds};

pub use interval::{
    IntervalConfig, IntervalIndexer, IntervalPeer, IntervalPhase, IntervalStatus, Ownership, Pair,
    PeerHealth, TaskGuard,
};

/// The group lease TTL the `headcount` CLI uses when `--ttl` is not given (defined with the
/// group recipe, re-exported here where it was first published).
pub use group::DEFAULT_GROUP_TTL;
