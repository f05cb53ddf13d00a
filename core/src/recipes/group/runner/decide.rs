//! The runner's decisions that need no store call: pure functions of its state (borrowed as
//! [`Facts`]) or of a table, each with its unit tests below. The files around this one do the
//! store calls these decisions ask for.

use std::sync::Arc;
use std::time::Duration;

use super::super::records::{Holder, SettledRecord, ViewRecord, MAX_EPOCH};
use super::super::table::SlotTable;
use super::notices::{ACK_GAP_DIVISOR, NOTICE_BURST, NOTICE_GAP_DIVISOR};
use super::{slot_read_every, Claim, Discrepancy, Handoff, Settler, TableCache, REREAD_AFTER};
use crate::assign::{AssignorKind, KeySet, KeySetId, Sticky, Topology};

/// The part of a runner's state its scheduling decisions read, borrowed at one instant.
#[derive(Clone, Copy)]
pub(super) struct Facts<'a> {
    pub(super) claim: Option<&'a Claim>,
    pub(super) abandoned: bool,
    pub(super) cache: &'a TableCache,
    pub(super) handoff: Option<&'a Handoff>,
    pub(super) settler: &'a Settler,
    pub(super) discrepancy: Option<&'a Discrepancy>,
    /// The member's pending view is one its claim has acknowledged.
    pub(super) pending_acked: bool,
    pub(super) change_checks: bool,
    /// The member hears the store's change notifications: a settled mark written wakes it.
    pub(super) listening: bool,
    /// The last heartbeat met a store error: the next one comes at a quarter heartbeat, so a
    /// store that is back is reached long before the lease deadline.
    pub(super) failing: bool,
    pub(super) heartbeat: Duration,
    /// Monotonic.
    pub(super) now: Duration,
}

/// What a wake between two heartbeats does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Between {
    /// A full heartbeat.
    Beat,
    /// One `get` of the settled mark: all the member awaits is that mark.
    PollSettled,
    /// One renewing call that answers the slot table only if it changed.
    Watch,
}

/// Which of the group's directories notices named: a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen(u8);

impl Seen {
    pub(super) const NONE: Seen = Seen(0);
    /// The view directory: a published view, a settled mark.
    pub(super) const VIEWS: Seen = Seen(1);
    /// The acknowledgements.
    pub(super) const ACKS: Seen = Seen(2);
    /// The slot records.
    pub(super) const SLOTS: Seen = Seen(4);
    /// The standby records.
    pub(super) const STANDBYS: Seen = Seen(8);

    /// Whether every directory of `other` is in this set.
    pub(super) fn has(self, other: Seen) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }
}

impl std::ops::BitOr for Seen {
    type Output = Seen;
    fn bitor(self, other: Seen) -> Seen {
        Seen(self.0 | other.0)
    }
}

/// When notices held since they came may be answered: a heartbeat over [`NOTICE_GAP_DIVISOR`]
/// after the last notice-driven call (`last`), so a burst of notices is answered by one call,
/// and within the budget [`charge`] keeps (`tat`, its theoretical arrival time): a burst of
/// [`NOTICE_BURST`] calls at once, then one per [`notice_period`]. A storm of changes thus
/// costs a member no more calls than the hand-off's own polling, while a planned change after a
/// quiet spell is answered at once.
pub(super) fn notice_due(
    tat: Option<Duration>,
    last: Option<Duration>,
    heartbeat: Duration,
) -> Duration {
    let gap = heartbeat / NOTICE_GAP_DIVISOR;
    let tolerance = notice_period(heartbeat) * (NOTICE_BURST - 1);
    let by_gap = last.map_or(Duration::ZERO, |l| l + gap);
    let by_budget = tat.map_or(Duration::ZERO, |t| t.saturating_sub(tolerance));
    by_gap.max(by_budget)
}

/// When notices of the acknowledgements alone, held by the member that settles, may be
/// answered: a heartbeat over [`ACK_GAP_DIVISOR`] after the last such call (`last`), outside
/// the budget of [`notice_due`]. While a large group acknowledges a view, acknowledgements come
/// for as long as its members take to drain, and the settling member reads them every 31 ms at
/// the default TTL until the last is in, where the budget would make it wait an eighth of a
/// heartbeat after its first eight reads. Only the one or two members that settle listen to
/// them ([`Facts::listens`]), so this costs the store at most that many list calls per heartbeat
/// while a view is being settled, and nothing otherwise.
pub(super) fn acks_due(last: Option<Duration>, heartbeat: Duration) -> Duration {
    last.map_or(Duration::ZERO, |l| l + heartbeat / ACK_GAP_DIVISOR)
}

/// The budget's theoretical arrival time after a notice-driven call at `now` (the generic cell
/// rate algorithm: each call moves it a [`notice_period`] on from `now` or from where it was).
pub(super) fn charge(tat: Option<Duration>, now: Duration, heartbeat: Duration) -> Duration {
    tat.map_or(now, |t| t.max(now)) + notice_period(heartbeat)
}

/// The budget's theoretical arrival time once a notice-driven call turned out to move a planned
/// change along (a view adopted or activated, a view settled): the call is not charged. Only
/// notices that led nowhere (a foreign write under the group's directories, a spurious notice)
/// spend the budget, so a rolling deploy's steps one after another are all answered at once,
/// while a storm of junk is held to [`notice_period`].
pub(super) fn refund(tat: Option<Duration>, heartbeat: Duration) -> Option<Duration> {
    tat.map(|t| t.saturating_sub(notice_period(heartbeat)))
}

/// The sustained pace of notice-driven calls: one per eighth of a heartbeat, the pace at which a
/// member in a hand-off polls the settled mark.
pub(super) fn notice_period(heartbeat: Duration) -> Duration {
    heartbeat / 8
}

/// When the runner wakes next, and what it does then if that is before the next heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Wake {
    /// Monotonic.
    pub(super) at: Duration,
    pub(super) between: Between,
}

impl Facts<'_> {
    /// Whether this member holds one of the two lowest working slots of its copy of the table
    /// (live and not parked for a restart):
    /// it watches the table at every heartbeat, and halfway between heartbeats while another
    /// slot is live, so it sees a slot expire soon after the store does (two members, whatever
    /// the group's size).
    pub(super) fn watches_slots(&self) -> bool {
        match (&self.cache.slots, self.claim) {
            (Some(seen), Some(claim)) => seen.table.working().take(2).any(|s| s == claim.slot),
            _ => false,
        }
    }

    /// Whether a hand-off has waited long enough that this member settles it even though it is
    /// neither the lowest slot nor the publisher: its pending view was adopted two heartbeats
    /// ago, and it has not read the acknowledgements within the last heartbeat.
    pub(super) fn settle_overdue(&self) -> bool {
        self.handoff
            .is_some_and(|h| self.now.saturating_sub(h.adopted_at) >= 2 * self.heartbeat)
            && self
                .settler
                .acks_read
                .is_none_or(|t| self.now.saturating_sub(t) >= self.heartbeat)
    }

    /// Whether this heartbeat reads both directories whole, whatever their versions say: a
    /// hand-off or a discrepancy has lasted [`REREAD_AFTER`] heartbeats, and no heartbeat read
    /// them whole for as long. A version is only as good as the store that answers it: one
    /// that missed a change (a Redis version bump lost with its write's reply, a key index
    /// rolled back) answers the version the member holds for contents it no longer has, and the
    /// member would wait for ever on a slot that left or a mark it cannot see. Only a member
    /// that waits that long pays for it (two listings every [`REREAD_AFTER`] heartbeats), so the
    /// steady state costs what it did.
    pub(super) fn rereads_whole(&self) -> bool {
        let waiting_since = match (self.handoff, self.discrepancy) {
            (Some(h), Some(d)) => h.adopted_at.min(d.since),
            (Some(h), None) => h.adopted_at,
            (None, Some(d)) => d.since,
            (None, None) => return false,
        };
        let long = self.heartbeat * REREAD_AFTER;
        self.now.saturating_sub(waiting_since) >= long
            && self
                .cache
                .whole_read
                .is_none_or(|t| self.now.saturating_sub(t) >= long)
    }

    /// Whether this heartbeat reads the slot table (when its version changed) besides the
    /// view. Members in a large group mostly do not: the view tells them what they own, and a
    /// join, a leave or an expiry changes the table without changing the view until a member
    /// that watches the table publishes one. The two lowest live slots watch it at every
    /// heartbeat (the lowest publishes and settles; the second takes over when the lowest is the
    /// one gone), and so does a member that joins, publishes, settles, sees a discrepancy it may
    /// publish from (a slot of the view gone; any other once it has lasted a heartbeat), or
    /// has waited two heartbeats on one pending view (once a heartbeat); every other member reads
    /// it at every fourth heartbeat when no hand-off is under way (every n/8th in a group of
    /// n > 32: [`slot_read_every`]), for a twin with its member id and a lowest slot gone too.
    pub(super) fn reads_slots(&self, slot: u32) -> bool {
        let Some(seen) = &self.cache.slots else {
            return true;
        };
        let every = slot_read_every(seen.table.slots.len());
        self.cache.need_slots
            // A discrepancy left to the lowest slot is read again once it has lasted a
            // heartbeat, when this member publishes itself.
            || self.discrepancy.is_some_and(|d| {
                d.fast || self.now.saturating_sub(d.since) >= self.heartbeat
            })
            || self.settler.settling
            || self.claim.is_none()
            || self.watches_slots()
            || (self.cache.unsettled
                && seen
                    .table
                    .view
                    .as_ref()
                    .is_some_and(|v| self.settler.published == Some(v.epoch)))
            || self.settle_overdue()
            // Not in a hand-off: while views keep coming (a burst of joins) the table keeps
            // changing, and a look by every member would read it n times per change.
            || (self.handoff.is_none()
                && self.cache.beats % every == u64::from(slot) % every)
    }

    /// Whether this member wakes between heartbeats only to watch the slot table (one of the two
    /// lowest slots, nothing else under way). A member alone in its copy of the table does not:
    /// there is no other slot whose expiry it must notice, and a join is seen at its next
    /// heartbeat.
    pub(super) fn only_watching(&self) -> bool {
        self.change_checks
            && self.watches_slots()
            && self
                .cache
                .slots
                .as_ref()
                .is_some_and(|seen| seen.table.slots.len() >= 2)
            && self.handoff.is_none()
            && !self.cache.need_slots
            && !self.settler.settling
            && !self.abandoned
            && self.discrepancy.is_none()
    }

    /// Whether all this member awaits between heartbeats is the settled mark of the view it
    /// acknowledged: then it polls that small key instead of renewing and reading the table, so
    /// a hand-off costs it a constant number of table reads however many members acknowledge.
    pub(super) fn only_settling_awaited(&self) -> bool {
        if self.claim.is_none() || self.abandoned || self.settler.settling || self.failing {
            return false;
        }
        if self.discrepancy.is_some_and(|d| d.fast) {
            return false;
        }
        self.pending_acked
    }

    /// When to wake before the heartbeat due at `next`, and for what. Something under way (a
    /// hand-off, a claim to make, a table to read, a view to settle, a slot of the view gone)
    /// wakes at a quarter heartbeat, an eighth while settling (one small read each, and the
    /// last step of every hand-off); the two lowest slots look at the table halfway between
    /// heartbeats (one small call each, two members whatever the group's size); every other
    /// member sleeps until the heartbeat.
    pub(super) fn wake(&self, next: Duration) -> Wake {
        let settling_awaited = self.only_settling_awaited();
        let fast = self.handoff.is_some()
            || self.failing
            || self.claim.is_none()
            || self.cache.need_slots
            || self.settler.settling
            || self.discrepancy.is_some_and(|d| d.fast);
        let step = if self.settler.settling {
            self.heartbeat / 8
        } else if settling_awaited {
            let slots = self.cache.slots.as_ref().map_or(0, |s| s.table.slots.len());
            settle_poll_step(self.heartbeat, self.listening, slots)
        } else {
            self.heartbeat / 4
        };
        let watching = self.only_watching();
        let at = if fast {
            next.min(self.now + step)
        } else if watching {
            next.min(self.now + self.heartbeat / 2)
        } else {
            next
        };
        let between = if settling_awaited {
            Between::PollSettled
        } else if watching {
            Between::Watch
        } else {
            Between::Beat
        };
        Wake { at, between }
    }

    /// The call a notice of the directories in `seen` makes now, if any: the one a timer would
    /// make when it next wakes, made early. A view directory that changed (a view published, a
    /// view settled) is read by every member: the settled mark alone (one small read) when that
    /// is all it awaits, else a heartbeat's reads. Acknowledgements matter only to the member
    /// that settles, and the slot records only to the members that read them at every heartbeat
    /// (the two lowest slots, a member that sees a discrepancy or must look at the slots, one
    /// that holds no claim); everyone else learns of those changes from the view the watchers
    /// publish. A member that gave its lease up answers nothing: it waits for its lease to pass.
    pub(super) fn on_notices(&self, seen: Seen) -> Option<Between> {
        let listens = self.listens();
        let slots = seen.has(Seen::SLOTS) && listens.has(Seen::SLOTS);
        let acks = seen.has(Seen::ACKS) && listens.has(Seen::ACKS);
        if slots || acks {
            return Some(Between::Beat);
        }
        if !listens.has(Seen::VIEWS) {
            return None;
        }
        if seen.has(Seen::VIEWS) {
            return Some(if self.only_settling_awaited() {
                Between::PollSettled
            } else {
                Between::Beat
            });
        }
        None
    }

    /// The directories whose notices this member acts on now ([`Facts::on_notices`]): the
    /// view directory always, the acknowledgements while it settles, the slot records while it
    /// reads them at every heartbeat and may publish from them at once (not for a discrepancy
    /// it leaves to the lowest slot for a heartbeat: a burst of joins would have each joiner
    /// read the table at every other claim); nothing once it gave its lease up. Notices of the others
    /// wait in their mailboxes (coalesced) and do not wake it: in a large group only the one or
    /// two members that settle are woken by each acknowledgement.
    pub(super) fn listens(&self) -> Seen {
        if self.abandoned {
            return Seen::NONE;
        }
        let mut seen = Seen::VIEWS;
        if self.settler.settling {
            seen = seen | Seen::ACKS;
        }
        if self.claim.is_none()
            || self.watches_slots()
            || self.discrepancy.is_some_and(|d| d.fast)
            || self.cache.need_slots
        {
            seen = seen | Seen::SLOTS;
        }
        seen
    }

    /// Whether a renewed heartbeat has nothing to decide: the same table as at the last beat, an
    /// active view (a lapse revokes it: the member adopts the view again), and nothing that
    /// waits on time. A steady member thus does constant work.
    pub(super) fn idle(&self, changed: bool, active: bool) -> bool {
        !changed
            && active
            && self.discrepancy.is_none()
            && self.handoff.is_none()
            && !self.cache.need_slots
            && !self.settler.settling
            && !self.cache.unsettled
    }
}

/// The slot a claim tries: the preferred one when it is free and nothing is to be skipped,
/// else the lowest free one after skipping `skip` free ones. A skip past the last free slot
/// below `max_slots` wraps around the free slots there are, so a lost race never calls a group
/// full while it is not. The answer is `max_slots` or more only when the group is full.
pub(super) fn choose_slot(
    table: &SlotTable,
    preferred: Option<u32>,
    skip: u32,
    max_slots: u32,
) -> u32 {
    if let Some(p) = preferred {
        if skip == 0 && !table.slots.contains_key(&p) && !table.foreign.contains_key(&p) {
            return p;
        }
    }
    let first = table.lowest_free(0);
    let mut free = 1u32;
    let mut s = first;
    while free <= skip {
        s = table.lowest_free(s + 1);
        if s >= max_slots {
            break;
        }
        free += 1;
    }
    let skip = skip % free;
    (0..skip).fold(first, |s, _| table.lowest_free(s + 1))
}

/// Whether the published `view` must be replaced: its holders are not the live ones, its epoch
/// is below one some member already acted on (`floor`), or a store that lost writes minted its
/// epoch twice (`twin`). No view at all is stale.
pub(super) fn view_is_stale(
    view: Option<&ViewRecord>,
    live: &[Holder],
    floor: u64,
    twin: bool,
) -> bool {
    match view {
        Some(v) => v.holders != live || v.epoch < floor || twin,
        None => true,
    }
}

/// The epoch at which a member's token runs must break because the group moved on without it:
/// the published `view` is newer than the view it works towards (`target`) and does not name
/// its claim (`holder`). Such a view can give its keys to others without waiting for its grants
/// (a store that hid its slot, say: a lost Redis key index), so a grant it makes from now on
/// must not take the token of one still in flight from before, which a fence would then order
/// before the other owner's: it takes a token above that epoch instead. A member the group left
/// out in the ordinary way (it left, or its lease lapsed) holds no grants, and nothing changes.
pub(super) fn left_out(
    view: Option<&ViewRecord>,
    target: Option<u64>,
    holder: Option<Holder>,
) -> Option<u64> {
    let (view, target, holder) = (view?, target?, holder?);
    (view.epoch > target && !view.holders.contains(&holder)).then_some(view.epoch)
}

/// Whether a member that did not read the slots in this heartbeat must read them at the next:
/// the view is missing, went back below `floor`, or took this member's epoch (`twin`), and only
/// a member that read the slots publishes the view above it.
pub(super) fn view_needs_slots(view: Option<&ViewRecord>, floor: u64, twin: bool) -> bool {
    view.is_none_or(|v| v.epoch < floor || twin)
}

/// Whether a slot of the published view is gone from the table (a crash, a lapse), or there is
/// no view: then every member watches closely, in case the lowest slot is the one gone.
pub(super) fn view_slot_gone(table: &SlotTable) -> bool {
    table.view.as_ref().is_none_or(|v| {
        v.holders
            .iter()
            .any(|h| table.slots.get(&h.slot).is_none_or(|r| r.nonce != h.nonce))
    })
}

/// Whether a heartbeat lists the slot directory whole before it acts on `table`: its slots were
/// read in this heartbeat but came from the copy held (the store's version said they had not
/// changed), and a slot of the view is missing from them. A member publishes a view without a
/// slot only on a listing, never on a version: a Redis key index that lost the slot's name and
/// was then rolled back to before the repair that put it back answers the version of the copy,
/// whose listing lacked the slot, and members that trusted it would publish views without a
/// live slot for ever while its holder put itself back. It costs a
/// listing while a slot of the view is gone, which a crash or a leave ends within a heartbeat.
pub(super) fn lists_before_dropping(fresh: bool, listed: bool, table: &SlotTable) -> bool {
    fresh && !listed && view_slot_gone(table)
}

/// How often a member whose only wait is the settled mark of the view it acknowledged polls
/// that mark: an eighth of a heartbeat, so a hand-off ends soon after it is settled. A member
/// that hears the store's notifications (`listening`) is woken by the mark's own notice, and
/// its poll only covers a notice lost: in a group of more than [`SETTLE_POLLERS`] slots it
/// polls every n / [`SETTLE_POLLERS`] eighths of a heartbeat (rounded up), once a heartbeat
/// at most (from 897 slots on), so while views keep coming (a cold start of thousands) the
/// group's polls stay about [`SETTLE_POLLERS`] × 8 per heartbeat up to 1,024 slots, and one
/// per member per heartbeat past them, instead of eight per member.
pub(super) fn settle_poll_step(heartbeat: Duration, listening: bool, slots: usize) -> Duration {
    let step = heartbeat / 8;
    if listening {
        per_slots(step, slots, SETTLE_POLLERS, 8)
    } else {
        step
    }
}

/// `step` once per `per` slots of `slots` (rounded up), once at least and `most` times at most:
/// a pace that slows as the group grows, so the group's calls for it stay bounded.
fn per_slots(step: Duration, slots: usize, per: usize, most: u32) -> Duration {
    let times = slots.div_ceil(per).clamp(1, most as usize);
    // At most `most`, a u32: the cast keeps every bit.
    step * times as u32
}

/// See [`settle_poll_step`]: from this many slots on (and eight times as many for the longest
/// step), a listening member polls the settled mark less often than an eighth of a heartbeat.
pub(super) const SETTLE_POLLERS: usize = 128;

/// A burst of joins is published by the lowest slot at most once per this fraction of a
/// heartbeat ([`publishes`]).
pub(super) const PUBLISH_GAP_DIVISOR: u32 = 4;

/// Whether a member that sees the published view stale publishes the next one now:
///
/// * `own_alone`: its own claim or leave changed the table, and no other new claim waits
///   beside its own, nor did the claim lose a race for a slot since the table was read (a join
///   on its own is published by the joiner at once), or the view must be repaired (it is below
///   an epoch some member acted on, or its epoch was minted twice), which waits for no one;
/// * `lowest`: it holds the lowest live slot, and it published no view within the last gap
///   (`since_published`; [`publish_gap`]: a [`PUBLISH_GAP_DIVISOR`]th of a heartbeat, longer in
///   a group of more than 256 `live` slots): in a burst of joins (a cold start, a scale-up) the
///   lowest publishes for all the claims it sees, at most once per gap, so n joins make a few
///   views instead of n, and every member reads a few;
/// * or the same discrepancy has lasted a heartbeat (the lowest may be the one that died).
pub(super) fn publishes(
    own_alone: bool,
    lowest: bool,
    since_published: Option<Duration>,
    lasted: Duration,
    heartbeat: Duration,
    live: usize,
) -> bool {
    let paced = since_published.is_none_or(|d| d >= publish_gap(heartbeat, live));
    own_alone || (lowest && paced) || lasted >= heartbeat
}

/// The least time between two views the lowest slot publishes for a burst of joins in a group
/// of `live` slots: a [`PUBLISH_GAP_DIVISOR`]th of a heartbeat, and one more for every 256
/// slots past the first 256, a heartbeat at most (from 769 slots on). Each view costs every
/// member a read and an acknowledgement, so while joins keep coming the group's calls for
/// views stay about 2 × 256 × [`PUBLISH_GAP_DIVISOR`] per heartbeat up to 1,024 slots, and two
/// per member per heartbeat past them; a member that sees one difference for a heartbeat
/// publishes it itself anyway.
pub(super) fn publish_gap(heartbeat: Duration, live: usize) -> Duration {
    per_slots(
        heartbeat / PUBLISH_GAP_DIVISOR,
        live,
        PUBLISH_GAP_SLOTS,
        PUBLISH_GAP_DIVISOR,
    )
}

/// See [`publish_gap`]: the slots per [`PUBLISH_GAP_DIVISOR`]th of a heartbeat between two views
/// of a burst.
const PUBLISH_GAP_SLOTS: usize = 256;

/// Whether a member's own change (a join) is left to the lowest slot's next view instead of
/// published at once: the group has `from` live members or more (`live`), and the
/// published `view` is not settled yet (a hand-off is under way, as in a burst of joins). See
/// [`GroupConfig::with_coalesce_from`](super::super::GroupConfig::with_coalesce_from).
pub(super) fn coalesces(
    live: usize,
    from: usize,
    view: Option<&ViewRecord>,
    settled: Option<SettledRecord>,
) -> bool {
    live >= from && unsettled(view, settled)
}

/// Whether live claims other than `mine` are missing from the published `view` (or hold their
/// slot under another claim): joins under way beside this member's own.
pub(super) fn others_joining(
    view: Option<&ViewRecord>,
    live: &[Holder],
    mine: Option<Holder>,
) -> bool {
    live.iter()
        .any(|h| Some(*h) != mine && view.is_none_or(|v| !v.names(h)))
}

/// Whether a member back from an outage of the store holds back the view the `live` holders
/// call for: its grace runs until `until`, and a slot of the view it worked under before the
/// outage (`before`) or of the `published` one is not claimed again yet. A view without that
/// slot would give its keys to the others, and the slot's member would take them back when it
/// claims it a moment later: every such key would move twice.
pub(super) fn awaits_returning(
    until: Option<Duration>,
    now: Duration,
    before: Option<&ViewRecord>,
    published: Option<&ViewRecord>,
    live: &[Holder],
) -> bool {
    if until.is_none_or(|u| now >= u) {
        return false;
    }
    [before, published]
        .into_iter()
        .flatten()
        .flat_map(ViewRecord::slots)
        .any(|s| !live.iter().any(|h| h.slot == s))
}

/// The view to publish over `highest`, the highest epoch seen anywhere, for the `live` holders;
/// `None` when the next epoch would pass [`MAX_EPOCH`] (a foreign value holds the largest), or
/// when the sticky assignment cannot be computed, which the configuration check rules out.
///
/// For the sticky assignor the view carries its assignment, computed from the first of
/// `previous` that has one for the same key set (the view it replaces, then the member's own
/// newest): [`Sticky::next`] moves the fewest keys from it. With none, it is the first
/// assignment ([`Sticky::new`]). Which previous view is used matters only for movement: members
/// read the owners from the view, so they agree whatever the publisher started from.
pub(super) fn next_view(
    highest: u64,
    live: Vec<Holder>,
    assignor: AssignorKind,
    keys: Option<&Arc<KeySet>>,
    previous: &[Option<&ViewRecord>],
) -> Option<ViewRecord> {
    if highest >= MAX_EPOCH {
        return None;
    }
    let owners = match assignor {
        AssignorKind::Sticky(id) if !live.is_empty() => {
            Some(sticky_owners(&live, id, keys, previous)?)
        }
        _ => None,
    };
    Some(ViewRecord {
        epoch: highest.saturating_add(1),
        holders: live,
        assignor: Some(assignor),
        owners,
    })
}

/// The sticky assignment for `live` (see [`next_view`]); `None` when the keys of `id` are not
/// at hand (the configuration check makes sure they are).
fn sticky_owners(
    live: &[Holder],
    id: KeySetId,
    keys: Option<&Arc<KeySet>>,
    previous: &[Option<&ViewRecord>],
) -> Option<Arc<[u32]>> {
    let keys = KeySet::declared(id, keys).ok()?;
    let topology = Topology::from_live_slots(live.iter().map(|h| h.slot)).ok()?;
    let before = previous.iter().flatten().find_map(|v| {
        (v.assignor == Some(AssignorKind::Sticky(id)))
            .then_some(v.owners.as_deref())
            .flatten()
    });
    let next = match before {
        Some(owners) => Sticky::next(&topology, keys, owners),
        None => Sticky::new(&topology, keys),
    };
    Some(next.ok()?.shared_owners())
}

/// Whether the published `view` is newer than the newest settled mark. Compared by digest too:
/// after a rollback one epoch can stand for two views, and a mark for the other one settles
/// nothing.
pub(super) fn unsettled(view: Option<&ViewRecord>, settled: Option<SettledRecord>) -> bool {
    view.is_some_and(|v| {
        settled.is_none_or(|m| m.epoch < v.epoch || (m.epoch == v.epoch && m.view != v.digest()))
    })
}

/// Whether `mark` settles the view of `epoch` and `digest`, or a newer one: nothing is left to
/// settle or re-acknowledge for it.
pub(super) fn settled_at_or_past(mark: Option<SettledRecord>, epoch: u64, digest: u64) -> bool {
    mark.is_some_and(|m| m.epoch > epoch || m.settles(epoch, digest))
}

/// Whether a hand-off whose grants have not drained has outlasted the drain timeout: the member
/// then gives its lease up so the others proceed without its acknowledgement.
pub(super) fn drain_timed_out(since: Duration, now: Duration, drain_timeout: Duration) -> bool {
    now.saturating_sub(since) > drain_timeout
}

#[cfg(test)]
mod tests;
