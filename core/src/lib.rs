#![doc = include_str!("../README.md")]

pub mod assign;
pub mod backend;
pub mod clock;
pub mod decorated;
pub mod error;
pub mod fence;
pub mod instrumented;
pub mod keys;
pub mod memory;
pub mod metrics;
pub mod notify;
mod op;
pub mod recipes;
#[cfg(any(test, feature = "testkit"))]
pub mod sim;
pub mod store;
#[cfg(feature = "store-models")]
#[doc(hidden)]
pub mod store_models;
mod task;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use clock::{Clock, ManualClock, OffsetClock, SystemClock};
pub use error::{BoxError, Error, ErrorKind, Result};
pub use keys::{validate_group, validate_prefix, Keyspace, DEFAULT_PREFIX};
pub use memory::MemoryStore;
pub use op::Op;
pub use store::{Capabilities, Durability, RenewedListing, Store};

/// A store shared between tasks and recipes.
pub type DynStore = std::sync::Arc<dyn Store>;
