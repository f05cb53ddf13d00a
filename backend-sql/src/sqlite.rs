//! The embedded SQLite backend: one file shared by the processes of one machine, or a private
//! in-memory database.
//!
//! Every store owns one connection on a dedicated worker thread, so rusqlite's blocking calls never
//! run on the async runtime's workers; operations reach it as boxed closures over a channel and
//! come back on a oneshot. A write is one autocommit statement that reads the clock in SQL under
//! the write lock it takes; `incr_and_get`, `renew_and_list`, and an `incr` or `set_max` whose one
//! statement did not apply (a value that is not a plain counter, an overflow, a `set_max` that does
//! not raise the value) run in `BEGIN IMMEDIATE` transactions. Either way a write is atomic
//! across connections and processes, not just within this handle. See the crate README for URLs,
//! options and the schema.

mod config;
mod connection;
mod errors;
mod sql;
mod store;

pub use config::{SqliteConfig, SqliteOptions, Synchronous};
pub use sql::TABLE;
pub use store::SqliteStore;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod write_tests;
