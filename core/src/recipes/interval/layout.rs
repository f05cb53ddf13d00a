//! Where one group's interval indexer keeps its records in the store, and how long they live.

use crate::keys::Keyspace;

/// How many intervals the counter and acknowledgement keys live.
pub const KEY_INTERVALS: u32 = 3;

/// The store keys of one group's interval indexer.
#[derive(Debug, Clone)]
pub(super) struct IntervalLayout {
    pub(super) space: Keyspace,
}

impl IntervalLayout {
    pub(super) fn counter(&self, n: u64) -> String {
        self.space.key(format_args!("interval:{n}"))
    }

    pub(super) fn transition(&self, n: u64) -> String {
        self.space.key(format_args!("interval:transition:{n}"))
    }

    pub(super) fn seal(&self, n: u64) -> String {
        self.space.key(format_args!("interval:seal:{n}"))
    }

    pub(super) fn health_prefix(&self) -> String {
        self.space.key("interval:health:")
    }

    pub(super) fn health(&self, member: &str) -> String {
        self.space.key(format_args!("interval:health:{member}"))
    }
}
