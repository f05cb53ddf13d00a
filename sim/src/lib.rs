//! The store models of headcount's protocol simulation (`core/tests/simulation.rs`): stores
//! that answer listings, directory versions and change notifications the way a backend does,
//! over a [`MemoryStore`](headcount_core::memory::MemoryStore), so the simulation runs the group
//! on what each backend's change detection can get wrong and not only on the in-memory store's
//! content digests, which no fault can make miss a change.
//!
//! * [`RedisModel`]: a key index that listings read, per-directory versions that writes bump,
//!   expiries noticed by sweeps; it can lose its index or drop a version change;
//! * [`EtcdModel`]: a store revision and per-key mod revisions, versions of count and newest
//!   revision, one client per process watching the responses' revisions
//!   ([`RevisionWatch`](headcount_core::backend::RevisionWatch)); it can be restored from a
//!   snapshot with its revision (handing the lost revisions out again) or past it
//!   (`--bump-revision`), and checks that no client answers a version for other contents than
//!   before;
//! * [`SqlModel`]: the SQL backends' digests, one directory per call.
//!
//! Every model notifies the writes that change a directory, as its backend does (Redis's
//! scripts publish, PostgreSQL's triggers `pg_notify`, etcd's watches see the events), to every
//! process through the shared in-memory store's subscribers.
//!
//! Some models keep a backend's behaviour from before a fix, on purpose (`with_repair(false)`,
//! `with_watch(false)`), to show that the simulation finds what the fix repairs. This crate is
//! part of headcount's tests and is never published; the fault layer the simulation wraps every
//! store in (`headcount_core::sim`) is in the test kit (cargo feature `testkit`).

use std::sync::{Mutex, MutexGuard, PoisonError};

mod etcd;
mod redis;
mod sql;

pub use self::etcd::{EtcdModel, EtcdSnapshot};
pub use self::redis::{ModelFaults, ModelSnapshot, RedisModel};
pub use self::sql::SqlModel;

/// Locks a model's state. Every call leaves the state consistent before it can panic, so a
/// poisoned lock still guards valid state.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
