//! Group membership: stable slots held with a lease, views and epochs minted by the store,
//! cooperative hand-off, and a fencing token on every grant. headcount's default mode.
//!
//! # Using it
//!
//! Every instance of a service joins the same group with [`Group::join`] and keeps the
//! [`Member`] it gets back. The member heartbeats in the background; ask it, whenever work
//! comes in, whether a key is yours:
//!
//! * [`Member::owns`] returns a [`Grant`] while the key is this member's; do the work while you
//!   hold it, and pass [`Grant::token`] to your sink so a fence can refuse a deposed owner's late
//!   write (a [`Fence`](crate::fence::Fence): [`MemoryFence`](crate::fence::MemoryFence) in
//!   this process, or the PostgreSQL and Redis fences of the backends);
//! * [`Member::watch`] gives the member's [`Assignment`]: its slot and the `(index, replicas)`
//!   pair (task `t` is yours when `t % replicas == index - 1`), and [`Member::share`] a grant for
//!   that whole share;
//! * [`Member::changes`] tells, per activated view, which keys were gained and lost;
//! * [`Member::leave`] drains the grants in flight, deletes the claim and publishes the view
//!   without it, so the others take over at once instead of after a lease TTL;
//!   [`Member::leave_for_restart`] drains too but keeps the member's place for a restart window,
//!   so the same member id started again takes it back with no key moved (static membership);
//! * [`Member::ready`] says whether the member is active with no hand-off of its own pending,
//!   for a readiness probe.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> headcount_core::Result<()> {
//! use std::sync::Arc;
//!
//! use headcount_core::memory::MemoryStore;
//! use headcount_core::recipes::group::{Group, GroupConfig, DEFAULT_GROUP_TTL};
//!
//! let store = Arc::new(MemoryStore::new()); // or headcount::connect("redis://...")
//! let member = Group::join(store, GroupConfig::new("orders", DEFAULT_GROUP_TTL)).await?;
//! member.active(0).await?; // the first view is active
//! if let Some(grant) = member.owns("order-42") {
//!     // ... process order 42, writing with grant.token() through a fence ...
//!     drop(grant);
//! }
//! member.leave().await?;
//! # Ok(())
//! # }
//! ```
//!
//! What happens underneath: a member claims the lowest free *slot* with a lease and renews it
//! every TTL/3; the live slots form the *view*, published with an epoch the store mints; keys
//! map to the view's slots with an [assignor](crate::assign); when the view changes, a key that
//! moves starts at its new owner only after the old owner released it or lost its lease. The
//! whole protocol, with the argument for each guarantee, is in [`protocol`].
//!
//! # Words
//!
//! * A *slot* is a number `i` whose key `hc:{group}:slot:{i}` a member holds with a lease.
//! * A *claim* is one holding of a slot: a member wrote its [`SlotRecord`] there (with a fresh
//!   random nonce) and renews it. A restart, or a lease that lapsed, makes a new claim, even
//!   of the same slot.
//! * A [`Holder`] is how a view names a claim: the slot and the claim's nonce.
//! * A *view* ([`ViewRecord`]) is the set of holders published under an epoch; the *settled
//!   mark* ([`SettledRecord`]) says every holder of a view acknowledged it ([`AckRecord`]).
//! * The *table* ([`SlotTable`]) is what a member read of the slot and view directories.
//!
//! # Files
//!
//! `config` ([`GroupConfig`]), `layout` (where the group's records live in the store), `records`
//! (the records in the store), `header` (a long view as a small header and a snapshot), `table` (the slot [`SlotTable`] as read), `view` (a view as members hold it, [`Assignment`] and
//! [`Change`]), `grants` (the member's shared state and [`Grant`]), `member` ([`Group::join`] and
//! the [`Member`] handle), `runner/` (the heartbeat task, a state machine: see its front page)
//! `status` (what `headcount status` shows) and `remove` ([`remove`], a stopped group's records).

mod config;
mod grants;
mod header;
mod layout;
mod member;
mod records;
mod remove;
mod runner;
mod status;
mod table;
mod view;

pub mod protocol {
    // The document lives in `docs/`; `core/docs/group-protocol.md` links to it, so the
    // packaged crate carries it.
    #![doc = include_str!("../../../docs/group-protocol.md")]
}

use std::time::Duration;

pub use config::GroupConfig;
pub use grants::Grant;
pub use header::{Snapshot, ViewDelta, ViewHeader};
pub use member::{Group, Member};
pub use records::{AckRecord, Holder, SettledRecord, SlotRecord, ViewRecord, MAX_EPOCH};
pub use remove::{remove, Removed};
pub use status::{status, status_with_keys, GroupStatus, KeyOwner, Problem, Standby};
pub use table::SlotTable;
pub use view::{Assignment, Cause, Change, GroupPhase, ViewState};

/// The lease TTL the `headcount` CLI uses when `--ttl` is not given, a sensible default for an
/// application too: a member renews every 2 s, and a crashed member's keys move after at most
/// 6 s plus one heartbeat. Pass it to [`GroupConfig::new`].
pub const DEFAULT_GROUP_TTL: Duration = Duration::from_secs(6);

/// The shortest lease TTL a group accepts.
pub const MIN_LEASE_TTL: Duration = Duration::from_millis(30);

/// The longest lease TTL a group accepts: a member dead this long before anyone notices is
/// almost certainly a unit mistake.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(3600);

/// The longest restart window a group accepts
/// ([`GroupConfig::with_restart_window`]): a member's keys have no owner while it is away.
pub const MAX_RESTART_WINDOW: Duration = Duration::from_secs(15 * 60);

/// The longest a new member may stand by for a leaving member's slot
/// ([`GroupConfig::with_standby`]): a scale-up waits that long before the new member works.
pub const MAX_STANDBY: Duration = Duration::from_secs(15 * 60);

/// The default limit on slot numbers (members in one group).
pub const DEFAULT_MAX_SLOTS: u32 = 4096;

/// From how many live members on a join during a hand-off is left to the lowest slot's next
/// view ([`GroupConfig::with_coalesce_from`]).
pub const COALESCE_FROM: usize = 64;

/// The name [`MIN_LEASE_TTL`] had before it was told apart from the store's
/// [`MIN_TTL`](crate::store::MIN_TTL).
#[deprecated(note = "renamed MIN_LEASE_TTL: `store::MIN_TTL` is the store's own limit")]
#[doc(hidden)]
pub const MIN_TTL: Duration = MIN_LEASE_TTL;

/// The name [`MAX_LEASE_TTL`] had before it was told apart from the store's
/// [`MAX_TTL`](crate::store::MAX_TTL).
#[deprecated(note = "renamed MAX_LEASE_TTL: `store::MAX_TTL` is the store's own limit")]
#[doc(hidden)]
pub const MAX_TTL: Duration = MAX_LEASE_TTL;
