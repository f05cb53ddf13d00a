//! Where one group's records live in the store: its directories and the two keys of the view
//! directory. (A group's *keys* in the user's sense are the partition keys of a `KeySet`; these
//! are the store keys the protocol writes.)

use crate::keys::Keyspace;

/// The store keys of one group's records, built once.
///
/// | key | holds |
/// |---|---|
/// | `hc:{group}:slot:{i}` | the slot records: one per claim, with the lease TTL |
/// | `hc:{group}:view:current` | the published view, or its header when it is long |
/// | `hc:{group}:base:{epoch}-{digest}` | the snapshot of a long view (see [`super::header`]) |
/// | `hc:{group}:change:{digest}` | the change that led to a long view, for members that missed it |
/// | `hc:{group}:view:settled` | the settled mark |
/// | `hc:{group}:ack:{i}` | each slot's acknowledgement |
/// | `hc:{group}:standby:{member}` | the standbys waiting to inherit a leaving member's slot |
#[derive(Debug, Clone)]
pub(super) struct GroupLayout {
    pub(super) space: Keyspace,
    /// `hc:{group}:slot:`, the directory of the slot records.
    pub(super) slots: String,
    /// `hc:{group}:view:`, the directory of the published view and the settled mark.
    pub(super) views: String,
    /// `hc:{group}:view:current`.
    pub(super) view: String,
    /// `hc:{group}:view:settled`.
    pub(super) settled: String,
    /// `hc:{group}:ack:`, the directory of the acknowledgements.
    pub(super) acks: String,
    /// `hc:{group}:base:`, the directory of the snapshots of long views.
    pub(super) bases: String,
    /// `hc:{group}:change:`, the directory of the change records of long views.
    pub(super) changes: String,
    /// `hc:{group}:standby:`, the directory of the standbys.
    pub(super) standbys: String,
}

impl GroupLayout {
    pub(super) fn new(space: Keyspace) -> GroupLayout {
        GroupLayout {
            slots: space.key("slot:"),
            views: space.key("view:"),
            view: space.key("view:current"),
            settled: space.key("view:settled"),
            acks: space.key("ack:"),
            bases: space.key("base:"),
            changes: space.key("change:"),
            standbys: space.key("standby:"),
            space,
        }
    }

    /// The group's name.
    pub(super) fn group(&self) -> &str {
        self.space.group()
    }

    /// `hc:{group}:slot:{i}`.
    pub(super) fn slot(&self, i: u32) -> String {
        self.space.slot(i)
    }

    /// `hc:{group}:standby:{member}`.
    pub(super) fn standby(&self, member: &str) -> String {
        format!("{}{member}", self.standbys)
    }

    /// `hc:{group}:base:{epoch}-{digest}`, where the snapshot of a long view is.
    pub(super) fn base(&self, snapshot: super::header::Snapshot) -> String {
        format!("{}{snapshot}", self.bases)
    }

    /// `hc:{group}:change:{digest}`, the record of the change that led to the long view of
    /// that digest.
    pub(super) fn change(&self, view: u64) -> String {
        format!("{}{view:016x}", self.changes)
    }

    /// `hc:{group}:ack:{i}`.
    pub(super) fn ack(&self, i: u32) -> String {
        format!("{}{i}", self.acks)
    }
}
