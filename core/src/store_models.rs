//! The in-memory store's internals that the simulation's store models build on (they live in
//! `headcount-sim`, a crate of headcount's own tests): its map, and the lock, clock and
//! subscribers of a [`MemoryStore`]. Compiled only with the cargo feature `store-models`; not a
//! stable API.

use std::sync::MutexGuard;
use std::time::SystemTime;

pub use crate::memory::data::{expiry, Data, Entry};
use crate::memory::{MemoryStore, Snapshot};
use crate::notify::NotifyHub;

/// What a store model reaches inside the [`MemoryStore`] it wraps.
pub trait MemoryInternals {
    /// Locks the data. A write through [`Data`] notifies no subscriber: the model does.
    fn data(&self) -> MutexGuard<'_, Data>;
    /// The store's wall clock now, on which its TTLs run.
    fn wall_now(&self) -> SystemTime;
    /// The subscribers of this store and its clones, which a model notifies of its own writes.
    fn notify_hub(&self) -> &NotifyHub;
}

impl MemoryInternals for MemoryStore {
    fn data(&self) -> MutexGuard<'_, Data> {
        self.lock()
    }

    fn wall_now(&self) -> SystemTime {
        self.now()
    }

    fn notify_hub(&self) -> &NotifyHub {
        &self.hub
    }
}

/// A copy of `data`, whose lock the caller holds (a model with state of its own copies both at
/// one instant).
pub fn snapshot_of(data: &Data) -> Snapshot {
    Snapshot {
        map: data.map.clone(),
    }
}

/// Puts `snapshot`'s data into `data`, whose lock the caller holds.
pub fn restore_into(snapshot: &Snapshot, data: &mut Data) {
    data.map = snapshot.map.clone();
}
