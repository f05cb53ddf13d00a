#![doc = include_str!("../README.md")]

pub mod assign;
pub mod clock;
pub mod error;
pub mod fence;
pub mod keys;
pub mod recipes;
pub mod store;
pub mod url;

pub use clock::{Clock, ManualClock, OffsetClock, SystemClock};
pub use error::{BoxError, Error, ErrorKind, Result};
pub use keys::{validate_group, validate_prefix, Keyspace, DEFAULT_PREFIX};
pub use store::{Capabilities, Durability, Store};

/// A store shared between tasks and recipes.
pub type DynStore = std::sync::Arc<dyn Store>;
