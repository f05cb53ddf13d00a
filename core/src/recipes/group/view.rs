//! Views as members see them: [`ViewState`], the [`Assignment`] a member publishes, its [`GroupPhase`], and the [`Change`] of an activated view.

use std::fmt;
use std::sync::Arc;

use super::records::{Holder, SlotRecord, ViewRecord};
use crate::assign::{hash_bytes, Assignor, AssignorKind, KeySet, Sticky, Topology};
use crate::error::Result;

/// Where a member stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GroupPhase {
    /// Claimed a slot, waiting for its first view to become active.
    Joining,
    /// Working under its active view.
    Active,
    /// A newer view was adopted: revoked keys are draining or the others' acknowledgements are
    /// awaited; kept keys keep working.
    Handoff,
    /// Lost its lease (renewal failed or the deadline passed): all work stopped, claiming again.
    Rejoining,
    /// Left the group.
    Stopped,
    /// Gave up for good (another live process uses the same member id).
    Failed,
    /// Joined as a standby ([`GroupConfig::with_standby`](super::GroupConfig::with_standby)):
    /// outside the view, waiting for a leaving member to hand it its slot, or for its wait to
    /// end. Counts as ready.
    Standby,
}

impl GroupPhase {
    /// Lower-case name for logs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupPhase::Joining => "joining",
            GroupPhase::Active => "active",
            GroupPhase::Handoff => "handoff",
            GroupPhase::Rejoining => "rejoining",
            GroupPhase::Stopped => "stopped",
            GroupPhase::Failed => "failed",
            GroupPhase::Standby => "standby",
        }
    }
}

/// A member's place in the group under its active view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The member id.
    pub member: String,
    /// The member's stable slot, while it holds one.
    pub slot: Option<u32>,
    /// The articles' index: the member's 1-based rank among the live slots of the active view
    /// (`None` when it is not in it).
    pub index: Option<u32>,
    /// The number of live slots in the active view.
    pub replicas: u32,
    /// The active view's epoch (0 before the first).
    pub epoch: u64,
    /// The live slots of the active view, ascending.
    pub live: Vec<u32>,
    /// Where the member stands.
    pub phase: GroupPhase,
    /// The last error met while renewing or publishing, cleared by the next success.
    pub last_error: Option<String>,
}

impl Assignment {
    /// Whether the member is *ready*: active under a view that names it (it holds a share and
    /// grants its keys), with no hand-off of its own pending. A deploy tool that waits for
    /// readiness before stopping the next instance never stops one in the middle of a
    /// hand-off. See [`Member::ready`](super::Member::ready).
    ///
    /// A standby ([`GroupPhase::Standby`]) is ready too: it holds nothing, and it is there to
    /// take over the slot of a member the deploy tool stops next, which a tool waiting for
    /// readiness would otherwise never stop. So with standbys a tool may stop the next member
    /// while the previous replacement is still taking its slot over: safe, as any two view
    /// changes in a row are, but the two hand-overs overlap.
    pub fn is_ready(&self) -> bool {
        self.is_working() || self.phase == GroupPhase::Standby
    }

    /// Whether the member *works*: active under a view that names it, so it owns its share of
    /// the keys. Unlike [`Assignment::is_ready`], a standby that waits is not working: a probe
    /// that must tell an instance that serves from one that waits for a place asks this
    /// (`headcount run` and `exec` serve it as `/working`).
    pub fn is_working(&self) -> bool {
        self.phase == GroupPhase::Active && self.index.is_some()
    }

    /// The articles' `(index, replicas)`: task `t` belongs to this member when
    /// `t % replicas == index - 1`.
    pub fn pair(&self) -> Option<(u32, u32)> {
        self.index.map(|i| (i, self.replicas))
    }
}

/// A view with its assignor built.
pub struct ViewState {
    pub(super) record: ViewRecord,
    pub(super) assignor: Option<Box<dyn Assignor>>,
    /// The record's digest, computed once: acknowledgements are checked against it per slot.
    pub(super) digest: u64,
}

impl fmt::Debug for ViewState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ViewState")
            .field("epoch", &self.record.epoch)
            .field("live", &self.record.holders.len())
            .finish()
    }
}

impl ViewState {
    /// The state of `record` under assignor `kind`, giving the balanced assignor its declared
    /// `keys` (see [`AssignorKind::build_with`]).
    ///
    /// Fails with [`ErrorKind::Config`](crate::ErrorKind::Config) when the view names another
    /// assignor: its publisher maps keys another way, and a member that computed owners with its
    /// own assignor for that view would grant keys another member holds under the same epoch.
    /// The member then neither adopts nor acknowledges the view, so no member can act on it.
    pub(super) fn build_with(
        record: ViewRecord,
        kind: AssignorKind,
        keys: Option<&Arc<KeySet>>,
    ) -> Result<ViewState> {
        if let Some(theirs) = record.assignor.filter(|&a| a != kind) {
            return Err(crate::Error::config(format!(
                "the view of epoch {} was published with the `{theirs}` assignor and this member is configured with `{kind}`: it is not adopted (every member of a group must use the same assignor)",
                record.epoch
            )));
        }
        let assignor = if record.holders.is_empty() {
            None
        } else {
            let topology = Topology::from_live_slots(record.slots())?;
            match (kind, &record.owners) {
                // The sticky assignment is the one the view stores.
                (AssignorKind::Sticky(id), Some(owners)) => Some(Box::new(Sticky::from_owners(
                    &topology,
                    KeySet::declared(id, keys)?,
                    owners.clone(),
                )?)
                    as Box<dyn Assignor>),
                _ => Some(kind.build_with(&topology, keys)?),
            }
        };
        let digest = record.digest();
        Ok(ViewState {
            record,
            assignor,
            digest,
        })
    }

    /// Whether `slot_record` acknowledged this view (see [`SlotRecord::has_acked`]).
    pub(super) fn acked_by(&self, slot_record: &SlotRecord) -> bool {
        slot_record.has_acked_digest(self.record.epoch, self.digest)
    }

    /// How many assignment entries the view holds in memory: its slots, and the keys of its
    /// declared set (the sticky and balanced assignors keep an owner per key).
    pub(super) fn weight(&self) -> usize {
        let declared = self
            .record
            .assignor
            .and_then(AssignorKind::declared)
            .map_or(0, |id| id.count as usize);
        self.record.holders.len() + declared
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.record.epoch
    }

    /// The published record.
    pub fn record(&self) -> &ViewRecord {
        &self.record
    }

    /// The slot owning a key hash, if any slot is live.
    pub fn owner(&self, hash: u64) -> Option<u32> {
        self.assignor.as_ref().map(|a| a.owner(hash))
    }

    /// `slot`'s 1-based rank and the live count.
    pub fn pair(&self, slot: u32) -> Option<(u32, u32)> {
        let live = self.record.holders.len() as u32;
        self.record
            .holders
            .binary_search_by_key(&slot, |h| h.slot)
            .ok()
            .map(|i| (i as u32 + 1, live))
    }

    /// `holder`'s 1-based rank and the live count, when the view names exactly this holder (the
    /// slot *and* the claim): a view that names the slot under an earlier claim is not this
    /// holder's, whoever holds the number now.
    pub fn pair_of(&self, holder: Holder) -> Option<(u32, u32)> {
        let live = self.record.holders.len() as u32;
        self.record
            .holders
            .binary_search_by_key(&holder.slot, |h| h.slot)
            .ok()
            .filter(|&i| self.record.holders[i] == holder)
            .map(|i| (i as u32 + 1, live))
    }

    /// Whether the key hash belongs to `holder` in this view.
    pub fn owned_by(&self, hash: u64, holder: Holder) -> bool {
        self.pair_of(holder).is_some() && self.owner(hash) == Some(holder.slot)
    }

    /// Whether both views name the same holders and give every key the same owner (only the
    /// epoch differs: a view republished after it was lost or garbled), so no key changes hands
    /// between them.
    pub(super) fn same_assignment(&self, other: &ViewState) -> bool {
        self.record.same_assignment(&other.record)
    }

    /// Whether a key may change owner between the two views: they differ in their slots or, for
    /// the sticky assignor, in their owners. (A claim taken back from a restart changes a slot's
    /// holder and moves nothing.)
    pub(super) fn moves_keys_from(&self, other: &ViewState) -> bool {
        self.record.slots().ne(other.record.slots()) || self.record.owners != other.record.owners
    }
}

/// A view change as one member lived it: emitted when it activates a new view
/// ([`Member::changes`](super::Member::changes)), and when it adopts one that is about to
/// change what it owns ([`Member::revocations`](super::Member::revocations)).
#[derive(Debug, Clone)]
pub struct Change {
    /// The view active before (none on the first).
    pub from: Option<Arc<ViewState>>,
    /// The view now active (for a revocation: the view adopted, which becomes active once the
    /// hand-off completes).
    pub to: Arc<ViewState>,
    /// The member's slot.
    pub slot: u32,
    /// Why the member's keys change.
    pub cause: Cause,
    /// The member's claim of that slot.
    pub(super) holder: Holder,
}

/// Why a member's keys change ([`Change::cause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cause {
    /// A new view: a join, a leave or a crash of another member, or this member's own join.
    View,
    /// The member leaves ([`Member::leave`](super::Member::leave),
    /// [`leave_for_restart`](super::Member::leave_for_restart)): it loses every key, and the
    /// leave waits for their grants (up to the drain timeout).
    Leave,
    /// The member's lease lapsed (its renewals failed until its deadline) or its slot was lost:
    /// it loses every key at once, and nobody waits for its grants, so stop their work now.
    Lapse,
}

impl Change {
    /// The epoch now active.
    pub fn epoch(&self) -> u64 {
        self.to.epoch()
    }

    /// Everything the member owned under `from` is lost (a leave or a lapse, `cause`): the
    /// change goes to a view that names nobody, under the same epoch.
    pub(super) fn losing_all(from: Arc<ViewState>, holder: Holder, cause: Cause) -> Change {
        let nothing = ViewRecord {
            epoch: from.epoch(),
            holders: Vec::new(),
            assignor: from.record.assignor,
            owners: None,
        };
        let digest = nothing.digest();
        Change {
            to: Arc::new(ViewState {
                record: nothing,
                assignor: None,
                digest,
            }),
            from: Some(from),
            slot: holder.slot,
            cause,
            holder,
        }
    }

    /// Of `keys`, those this member owns now and did not before.
    pub fn gained<'a, K: AsRef<[u8]> + ?Sized + 'a>(
        &self,
        keys: impl IntoIterator<Item = &'a K>,
    ) -> Vec<&'a K> {
        keys.into_iter()
            .filter(|k| {
                let h = hash_bytes(k.as_ref());
                self.to.owned_by(h, self.holder)
                    && !self
                        .from
                        .as_ref()
                        .is_some_and(|f| f.owned_by(h, self.holder))
            })
            .collect()
    }

    /// Of `keys`, those this member owned before and does not now.
    pub fn lost<'a, K: AsRef<[u8]> + ?Sized + 'a>(
        &self,
        keys: impl IntoIterator<Item = &'a K>,
    ) -> Vec<&'a K> {
        keys.into_iter()
            .filter(|k| {
                let h = hash_bytes(k.as_ref());
                self.from
                    .as_ref()
                    .is_some_and(|f| f.owned_by(h, self.holder))
                    && !self.to.owned_by(h, self.holder)
            })
            .collect()
    }
}
