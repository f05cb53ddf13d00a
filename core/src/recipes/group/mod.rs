//! Group membership: stable slots held with a lease, views and epochs minted by the store,
//! cooperative hand-off, and a fencing token on every grant. headcount's default mode.
//!
//! # Membership
//!
//! A member claims the lowest free slot `hc:{group}:slot:{i}` with a compare-and-set "only if
//! absent" and the lease TTL, and renews it every TTL/3. The published view and the settled mark
//! live in a small directory of their own, `hc:{group}:view:`, apart from the slot table. A
//! heartbeat is one
//! [`Store::renew_and_list_if_changed`](crate::Store::renew_and_list_if_changed) round trip
//! (the default, see [`GroupConfig::with_change_checks`]): renew the slot, and read the view
//! directory only when the store's version of it changed since the member last read it (a view
//! published or settled). The view tells a member what it owns, so most members never read the
//! slot table: a join, a leave or an expiry changes it without changing what anyone owns until a
//! view that follows is published, by the joining or leaving member itself, or, for an expiry,
//! by a member that watches the table. The two lowest live slots
//! watch it at every heartbeat (a second such call, answering the table only when it changed)
//! and halfway between heartbeats (that call alone, and only when another slot is live), so a
//! slot that expires is seen soon after the store expires it. So does a member
//! that is joining, publishing or settling a view, sees the table disagree with the view, or has
//! waited two heartbeats on one pending view; every other member reads it at one heartbeat in
//! four while no hand-off is under way. So a steady group costs each member constant work and bytes per heartbeat
//! on a backend that keeps versions, and a join costs the members that do not watch nothing
//! until the view changes. A member that leaves
//! gracefully stops its work, deletes its slot and publishes the view without it, so the others
//! move on at their next heartbeat instead of waiting for the TTL. A member whose renewal fails
//! (its slot expired, or someone overwrote it) stops all work at once and claims a slot again
//! (its old number if still free); so does one whose lease deadline passes on its own monotonic
//! clock without a successful renewal: the deadline is the renewal's *send* time plus the TTL
//! less a tenth, so it passes before the store expires the slot.
//!
//! Slots are stable ordinals: a member keeps its number across the others' joins and leaves, and
//! a member restarted with the same member id gets its number back if it is still free (it waits
//! up to one TTL for its previous incarnation's lease to expire; if the slot is still held after
//! that, another live process uses the same member id and the join fails with
//! [`Error::Rejected`]).
//!
//! # Views and epochs
//!
//! The live slots (with the nonce of each claim) form the *view*. A member that sees the live
//! slots differ from the published view `hc:{group}:view:current` publishes `{epoch + 1, slots}`
//! with a compare-and-set against the view it read, so exactly one of the members that try wins
//! and the epoch is minted by the store. The lowest live slot publishes at once; when a slot of
//! the view is gone, any other member that reads the table polls at a quarter heartbeat (so it
//! adopts the new view soon after it is published) and publishes itself when the same difference outlasts a
//! heartbeat (the lowest may be the one that died); a member that joins or leaves publishes its
//! own change. The new epoch is one above the highest the publisher has seen in any view, settled
//! mark, slot record or acknowledgement it read, so a view that does not decode, was deleted, or
//! went back is replaced by one above it. A store that lost writes can still let a member that
//! never saw a view mint that view's epoch again for other holders: acknowledgements and the
//! settled mark name the view's digest as well as its epoch, so one never counts for the other,
//! and a member working towards that epoch replaces the twin with a view above both. Epochs above
//! `i64::MAX - 1` are foreign values.
//!
//! # Ownership and grants
//!
//! The [assignor](crate::assign) (default: JumpBackHash with RavenDB's failover, which moves
//! only the changed slot's keys on a join or leave and depends only on the live slots) maps each
//! key to a live slot of the view. A view counts a member only when it names the member's own
//! claim, slot *and* nonce: a member that claimed its slot number again (a restart with the same
//! member id, a lapsed lease) owns nothing under a view that names the number under its earlier
//! claim. The view records the publisher's assignor, and a member configured with another one
//! is refused at join. [`Member::owns`] returns a [`Grant`] while the key is this member's; the
//! grant stays in flight until dropped. Its fencing token is the epoch since which the key has
//! been the member's without a break (the first of the consecutive views it adopted that gave it
//! the key, or the token of a grant of the key still in flight): a key that stays the member's
//! across view changes keeps its token, so the member's older grant is not refused by a fence
//! after its newer one wrote (the false fencing Kafka fixed in KIP-1251 with an assignment
//! epoch), and a key that moved carries a newer token than any of its earlier owners'. A run
//! never reaches back to an epoch the member saw minted twice (a twin view, or another
//! member's acknowledgement of that epoch under another view's digest): the twin's holders
//! were granted keys under it too, so once a store lost writes, the member's later grants
//! carry a newer token and a fence refuses the late writes of both (the member's own older
//! grants included, the price of telling the two apart).
//! [`Member::watch`] gives the member's [`Assignment`] (`slot`, and the articles' 1-based
//! `(index, replicas)` pair: the member's rank among the live slots and their count), and
//! [`Member::changes`] a [`Change`] per activated view, which tells the keys gained and lost.
//!
//! # Cooperative hand-off
//!
//! When a member adopts a newer view:
//!
//! * keys it owns in both its active view and the new one never pause;
//! * keys it no longer owns are revoked at once ([`Member::owns`] says no, [`Grant::is_valid`]
//!   turns false); when no grant for them is in flight any more, the member *acknowledges* the
//!   new view by writing its epoch and digest, with its claim's nonce, to `hc:{group}:ack:{slot}`
//!   (outside the slot directory, so acknowledging does not change the table the others read).
//!   An acknowledgement counts for that view only: a member that skipped a view may still hold a
//!   key that moved away in it and back in the next;
//! * the member holding the lowest live slot, and the member that published the view, read the
//!   acknowledgements while the published view is unsettled and, once every live slot acknowledged it, writes the *settled mark*
//!   `hc:{group}:view:settled` (the view's epoch and digest). Should it not (it is stalled
//!   without losing its lease, say), a member that has waited two heartbeats on one pending view does it, once a heartbeat.
//!   A member whose acknowledged view stays unsettled for a heartbeat writes its acknowledgement
//!   again, in case the store lost it;
//! * keys it gains start only once the view is settled, or every other live slot's record
//!   acknowledges it (a fresh claim, an older version). A slot that is gone from the store has
//!   either released everything before deleting itself, or its lease expired and its holder
//!   stopped on its own clock; a slot claimed after the acknowledgements were read holds nothing
//!   from before. Until then [`Member::owns`] says no for them. Waiting for the mark, a member
//!   polls it with one `get` between heartbeats, so a view change costs each member a constant
//!   number of table reads. Both polls run at an eighth of a heartbeat.
//!
//! **Guarantee**: a key is granted under one epoch to at most one member (the view is a
//! function of the epoch, and the assignor of the view); and a member starts granting a key it
//! gained only after every member that could still hold a grant for it has acknowledged letting
//! go, or lost its lease, provided (a) clocks run at the same rate within 10% over one TTL (the
//! member's deadline is 10% short of the store's expiry), (b) nobody but headcount deletes slot
//! keys, and (c) a member is not paused between checking a grant and using it for longer than
//! the rest of its lease. When (b) or (c) fails (a slot deleted or overwritten by hand, a process
//! paused past its TTL), the old holder's grants carry an older token: a sink that checks
//! tokens with a [`Fence`](crate::fence::Fence) (or the PostgreSQL and Redis fences of the
//! backend crates) rejects its late writes once the new owner has written.
//!
//! A store that loses acknowledged writes (a failover to an asynchronous replica, a restore from
//! a backup) voids the guarantee until the leases renewed before the loss have run out: a lost
//! renewal lets a slot expire before its holder's deadline, and a lost view lets another member
//! mint the same epoch for other holders. Members detect both (the renewal is refused; a view
//! with their own epoch and other holders is replaced by one above both) and the guarantee holds
//! again within about one TTL. What no member can detect is an epoch re-minted while no live
//! member saw the first view of it (every member paused across the loss): a fence may then see
//! two holders of one key write with one token, or refuse a valid grant, until the grants of
//! the lost views have ended (see docs/group.md, "Tokens and views"). A member whose view compare-and-set loses adopts nothing from the
//! listing it read before and lists again.
//!
//! A member whose in-flight grants do not drain within the drain timeout (one TTL by default)
//! stops renewing, so its lease expires and the others proceed without its acknowledgement.
//!
//! # Keys
//!
//! | key | value | TTL |
//! |---|---|---|
//! | `slot:{i}` | `v1 member=<id> nonce=<hex> since=<unix ms> ttl=<ms> acked=<epoch> view=<hex>` | the lease TTL |
//! | `view:current` | `v1 epoch=<E> assignor=<name> slots=<slot>@<nonce>,...` | none |
//! | `view:settled` | `v1 epoch=<E> view=<hex>` | none |
//! | `ack:{i}` | `v2 nonce=<hex> acked=<epoch> view=<hex>` | four lease TTLs |
//!
//! Earlier versions published the view at `slot:view` and the mark at `slot:settled`. The two
//! cannot work in one group: a member that finds a view at `slot:view` naming a live claim (an
//! earlier version published it after that claim) stops with [`Error::Rejected`], and a join
//! is refused. Upgrade a group by stopping every member and starting them with one version.

// The files of this module, each holding one part of the recipe described above:
// `config` (GroupConfig), `records` (the slot and view records and the parsed slot table), `view`
// (a view as members hold it, the published Assignment and Change), `grants` (the member's
// shared state and Grant), `member` (Group::join and the Member handle), `runner` (the heartbeat:
// renewal, publishing and adopting views, acknowledgements, hand-off) and `status`.
mod config;
mod grants;
mod member;
mod records;
mod runner;
mod status;
mod view;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use tokio::sync::{broadcast, watch, Notify};

use crate::assign::{hash_bytes, Assignor, AssignorKind, Topology};
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::keys::{Keyspace, DEFAULT_PREFIX};
use crate::store::RenewedListing;
use crate::task::{Background, OnDrop};
use crate::DynStore;

pub use config::GroupConfig;
pub use grants::Grant;
use grants::{Scope, Shared, State};
pub use member::{Group, Member};
use records::parse_acks;
pub use records::{AckRecord, Holder, SettledRecord, SlotRecord, Table, ViewRecord, MAX_EPOCH};
use runner::Runner;
pub use status::{status, GroupStatus};
pub use view::{Assignment, Change, GroupPhase, ViewState};

/// The shortest lease TTL accepted.
pub const MIN_TTL: Duration = Duration::from_millis(30);

/// The longest lease TTL accepted: a member dead this long before anyone notices is almost
/// certainly a unit mistake.
pub const MAX_TTL: Duration = Duration::from_secs(3600);

/// The default limit on slot numbers (members in one group).
pub const DEFAULT_MAX_SLOTS: u32 = 4096;
