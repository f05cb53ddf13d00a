//! The embedded SQLite backend: one file shared by the processes of one machine, or a private
//! in-memory database.
//!
//! Every store owns one connection on a dedicated worker thread, so rusqlite's blocking calls never
//! run on the async runtime's workers; operations reach it as boxed closures over a channel and
//! come back on a oneshot. Read-modify-write primitives run in `BEGIN IMMEDIATE` transactions, so
//! they are atomic across connections and processes, not just within this handle. See the crate
//! README for URLs, options and the schema.

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
