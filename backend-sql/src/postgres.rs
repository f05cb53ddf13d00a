//! The PostgreSQL backend: one table, a pool of connections, and one atomic statement per
//! primitive with expiry judged by the server's `now()`.
//!
//! See the crate README for URLs, options, the schema and the guarantee of each primitive.

mod config;
mod connection;
mod errors;
mod fence;
mod notify;
mod pooler;
mod probe;
mod sql;
mod store;
mod tls;

pub use config::{PostgresConfig, SslMode, DEFAULT_POOL_SIZE, DEFAULT_PORT, DEFAULT_TABLE};
#[doc(hidden)]
pub use connection::GarbageCollection;
/// The pool crate [`PostgresStore::from_pool`] takes, re-exported so an application names the
/// same version.
pub use deadpool_postgres;
pub use fence::{FencedOutcome, PgFence};
pub use store::PostgresStore;
/// The client crate of [`PgFence`], re-exported so an application names the same version.
pub use tokio_postgres;
