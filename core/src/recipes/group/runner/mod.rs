//! The heartbeat runner: one background task per member that renews its claim, reads the slot
//! table and the view, publishes and adopts views, and moves a hand-off along.
//!
//! It is two parts. The [`Engine`] holds the member's protocol state and makes every decision,
//! synchronously, with no store: given what the store answered (a heartbeat's table, a
//! compare-and-set's result, a listing of acknowledgements) it changes its state and says what
//! to do next. The [`Runner`] around it owns the store handle and the change notifications: it
//! sleeps until the engine's next wake, makes the store calls the engine asks for, and hands
//! the answers back. The runner decides nothing of the protocol; a change to the protocol is a
//! change to an engine method and to its test.
//!
//! # Where to change what
//!
//! | to change | the engine's handler | its tests |
//! |---|---|---|
//! | when a member wakes, and what each wake does (a heartbeat, a watch, a poll of the settled mark) | [`decide::Facts::wake`], [`decide::Facts::on_notices`] | `decide/tests.rs` |
//! | how a heartbeat starts, and what its answer means (a lapse, a lost slot, a write applied after all) | `Engine::open_beat`, `Engine::relist`, `Engine::on_heard` in `heartbeat.rs` | `heartbeat/tests.rs` |
//! | riding through a store outage | `Engine::store_failed`, `Engine::store_answered` in `heartbeat.rs`, [`decide::awaits_returning`] | `decide/tests.rs`, `tests/ride_through.rs` |
//! | when a member publishes a view, and which | `Engine::views` in `round/views.rs`, [`decide::next_view`], [`decide::publishes`] | `round/tests.rs`, `decide/tests.rs` |
//! | acknowledging and activating a view | `Engine::progress`, `Engine::activate_if_ready` in `round/acks.rs` | `round/tests.rs` |
//! | settling a view, and nudging slots that stall it | `Engine::settle`, `Engine::acks_read`, `Engine::expire_stalled` in `round/settle.rs` | `round/tests.rs` |
//! | joining, claiming, taking a claim back, twins of a member id | `Engine::join_step`, `Engine::new_claim`, `Engine::take_back_record`, `Engine::reclaiming` in `claims.rs` | `claims/tests.rs` |
//! | draining and leaving (parked for a restart, handed to a standby, deleted) | `Engine::drain_step`, `Engine::exit`, `Engine::view_without` in `leaving.rs` | `leaving/tests.rs` |
//! | standing by, and choosing the standby that inherits a slot | `Engine::standby_record`, `Engine::handing_of`, `Engine::heirs` in `standby.rs` | `standby/tests.rs` |
//! | the phase a member publishes | [`Engine::group_phase`] and [`Phase`] here | `round/tests.rs` |
//!
//! Every handler test starts from the members of `fixture.rs` and plays the store's part by
//! hand: it feeds a table or an answer and checks the call asked for and the state left. The
//! whole protocol is then checked under faults by the simulation (`tests/simulation.rs`) and on
//! real servers by the conformance suite.
//!
//! A table's round (publish, adopt, acknowledge, activate, settle, re-acknowledge) is a small
//! state machine ([`round`]): [`Engine::advance`] returns the next [`round::Call`] and takes
//! its [`round::Answer`]. The other flows keep their loops in the runner and ask the engine at
//! each step.
//!
//! # The engine's state
//!
//! Grouped by what it belongs to:
//!
//! * [`Settings`]: what the member was built with, fixed for its life;
//! * [`Phase`]: where the member is in its life (a member, standing by, rejoining, stopped,
//!   failed);
//! * [`Claims`]: this process's claim on a slot (the record as stored), the nonces of every claim
//!   it made, whether it gave its lease up, and the acknowledgement it last wrote;
//! * [`TableCache`]: what the member last read of the slot table and the view directory, and at
//!   which of the store's versions, so a steady heartbeat reads nothing;
//! * `handoff`: the hand-off in progress (a view adopted but not yet active), one
//!   `Option<`[`Handoff`]`>` whose fields vanish together when it ends;
//! * [`Settler`]: the member's part in settling a view it published or, as the lowest slot, watches;
//! * `discrepancy`: live slots that disagree with the published view, while they do;
//! * [`Outage`]: whether the store answers the heartbeats, and the grace after it did not;
//! * the grants (`grants::State`, shared with the application's [`Grant`]s): the active and
//!   pending views, the lease deadline, the grants in flight.
//!
//! [`Grant`]: super::Grant
//!
//! # The runner's files
//!
//! | file | the runner's part (store calls) |
//! |---|---|
//! | `driver.rs` | the loop: sleeps until the engine's wake or a notice, then runs the call it names |
//! | `heartbeat.rs` | a heartbeat's renewing reads, a watching wake, a poll of the settled mark |
//! | `claims.rs` | the join's loop, a claim's and a take-back's writes, waiting out a predecessor |
//! | `leaving.rs` | the drain's renewals, parking, deleting, publishing the view without the slot |
//! | `standby.rs` | the standby record's renewals, waiting for an inheritance, handing a slot over |
//! | `views.rs` | publishing a view (a take-back's, a leave's), beside the engine's adopt and activate |
//! | `notices.rs` | the store's change notifications for the group's directories |

mod claims;
mod decide;
mod driver;
#[cfg(test)]
mod fixture;
mod heartbeat;
mod leaving;
mod notices;
mod round;
mod standby;
mod views;

use std::sync::Arc;
use std::time::Duration;

use crate::assign::AssignorKind;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::keys::Keyspace;
use crate::metrics::GroupMetrics;
use crate::{Capabilities, DynStore};

use super::config::GroupConfig;
use super::grants::Shared;
use super::layout::GroupLayout;
use super::records::{AckRecord, Holder, SettledRecord, SlotRecord, ViewRecord};
use super::table::{HeldView, SlotTable};
use super::view::{GroupPhase, ViewState};

/// The most stalled slots one beat re-applies a lease TTL to ([`Engine::expire_stalled`]).
const NUDGES_PER_BEAT: usize = 8;

/// A member that does not watch the slot table (see [`decide::Facts::reads_slots`]) reads it at every
/// this many heartbeats at least, at a beat set by its slot, so in a large group the reads spread out.
const SLOT_READS: u64 = 4;

/// In a group of more than [`SLOT_READS`] times this many slots, the members that do not watch
/// the slot table read it less often ([`slot_read_every`]): about this many of them in each
/// heartbeat, whatever the group's size. A read of the table costs the group's size, so each
/// member then pays a constant per change, not the size of the group.
const SLOT_READERS: u64 = 8;

/// The heartbeats between two reads of the slot table by a member that does not watch it, in a
/// table of `slots` slots: [`SLOT_READS`], or one [`SLOT_READERS`]th of the slots when more.
fn slot_read_every(slots: usize) -> u64 {
    (slots as u64).div_ceil(SLOT_READERS).max(SLOT_READS)
}

/// A member that has waited this many heartbeats on one hand-off or discrepancy reads both
/// directories whole at its next heartbeat, and again every this many (see
/// [`decide::Facts::rereads_whole`]).
const REREAD_AFTER: u32 = 6;

/// How many times a join tries to claim a slot before it reports contention.
const CLAIM_ATTEMPTS: u32 = 32;

/// A join that lost the race for a slot tries other free slots of the same listing, and reads
/// the slot table again only every this many tries.
const RELIST_EVERY: u32 = 4;

/// How long an acknowledgement lives, in lease TTLs: it matters only until its view is settled,
/// and a member whose view stays unsettled writes it again every heartbeat.
const ACK_TTLS: u32 = 4;

/// What the runner was built with: fixed for its life.
pub(super) struct Settings {
    /// The store's backend name, for errors.
    backend: &'static str,
    /// The store delivers change notifications.
    native_notifications: bool,
    /// The shortest TTL the store applies.
    min_ttl: Duration,
    clock: Arc<dyn Clock>,
    layout: GroupLayout,
    /// The member's metrics (`docs/observability.md`).
    metrics: GroupMetrics,
    member: String,
    ttl: Duration,
    /// The TTL the store actually applies (rounded up to its granularity).
    effective_ttl: Duration,
    heartbeat: Duration,
    assignor: AssignorKind,
    /// The balanced assignor's declared keys ([`GroupConfig::with_keys`]).
    declared: Option<Arc<crate::assign::KeySet>>,
    max_slots: u32,
    drain_timeout: Duration,
    /// How long a parked claim waits for this member id to come back
    /// ([`GroupConfig::with_restart_window`]).
    restart_window: Duration,
    /// The crash grace ([`GroupConfig::with_crash_grace`]); zero: none.
    crash_grace: Duration,
    /// How long the store keeps this member's slot record after a renewal: the lease TTL plus
    /// the crash grace.
    slot_ttl: Duration,
    /// How long the members of the last view have to claim their slots again after an outage
    /// of the store ([`GroupConfig::with_outage_grace`]); zero: no grace.
    outage_grace: Duration,
    /// How long a new member stands by for a leaving member's slot
    /// ([`GroupConfig::with_standby`]); `None`: it claims at once.
    standby: Option<Duration>,
    /// Read the table only when the store reports a change (see
    /// [`GroupConfig::with_change_checks`]).
    change_checks: bool,
    /// The store answers two directories' versions in one call
    /// ([`Capabilities::native_renew_and_versions`](crate::Capabilities)): a member that reads
    /// both at a heartbeat asks for both versions first, and reads only what changed.
    one_call_versions: bool,
    /// The longest view written whole ([`GroupConfig::with_view_inline_max`]).
    view_inline_max: usize,
    /// What reading one change record costs, in bytes of a snapshot
    /// ([`GroupConfig::with_change_record_cost`]).
    change_record_cost: usize,
    /// From how many live members a join during a hand-off is left to the lowest slot
    /// ([`GroupConfig::with_coalesce_from`]).
    coalesce_from: usize,
    /// Subscribe to the store's change notifications ([`GroupConfig::with_notifications`]).
    notifications: bool,
}

/// The views a member holds ([`Engine::held_views`]).
pub(super) struct HeldViews {
    read: Option<ViewRecord>,
    states: Vec<Arc<ViewState>>,
}

impl HeldViews {
    /// The views, to resolve a header from.
    pub(super) fn views(&self) -> Vec<HeldView<'_>> {
        let states = self.states.iter().map(|v| HeldView {
            view: v.record(),
            digest: Some(v.digest),
        });
        let read = self.read.iter().map(|view| HeldView { view, digest: None });
        states.chain(read).collect()
    }
}

/// This process's claim on a slot: the slot and its record as stored.
#[derive(Clone)]
struct Claim {
    slot: u32,
    record: SlotRecord,
}

impl Claim {
    fn holder(&self) -> Holder {
        self.record.holder(self.slot)
    }
}

/// The acknowledgement this member last wrote: the record, its text as stored, and when
/// (monotonic).
#[derive(Clone)]
struct WrittenAck {
    record: AckRecord,
    text: String,
    at: Duration,
}

/// Everything about this process's claims.
#[derive(Default)]
struct Claims {
    /// The current claim, while it holds one.
    current: Option<Claim>,
    /// The slot to claim first: the last one held.
    preferred: Option<u32>,
    /// The nonces of every claim this process attempted (the newest 64): a record with one of
    /// them is this process's, not a twin's.
    own_nonces: Vec<u64>,
    /// Gave up renewing (drain timeout): waits for its lease to pass, then claims again.
    abandoned: bool,
    /// The acknowledgement this member last wrote.
    ack: Option<WrittenAck>,
    /// A claim taken back from a restart ([`Runner::resume`]) activates no view at or below this
    /// epoch: its previous incarnation granted under views up to it, and a fence must order the
    /// returning process's tokens after those. 0 for a fresh claim.
    floor: u64,
}

impl Claims {
    /// The most nonces [`Claims::own_nonces`] keeps.
    const NONCES: usize = 64;

    fn remember_nonce(&mut self, nonce: u64) {
        if self.own_nonces.len() >= Self::NONCES {
            self.own_nonces.remove(0);
        }
        self.own_nonces.push(nonce);
    }
}

/// The slot table as last read, with the store's version of the slot directory.
#[derive(Clone)]
struct SlotsSeen {
    version: String,
    table: Arc<SlotTable>,
}

/// What the member last read of the group's records, and at which versions.
#[derive(Default)]
struct TableCache {
    /// The slot table as last read: a heartbeat whose version is the same reads nothing and
    /// works from this copy. Its view is the one read at [`TableCache::view_version`].
    slots: Option<SlotsSeen>,
    /// The store's version of the view directory the table's view was read at.
    view_version: Option<String>,
    /// The copy of the table was replaced outside a heartbeat (see [`Runner::watch`]): the next
    /// heartbeat counts it as changed.
    unseen_change: bool,
    /// Full heartbeats so far: every [`slot_read_every`]th one reads the slot directory.
    beats: u64,
    /// When the last full heartbeat started (monotonic).
    last_beat: Option<Duration>,
    /// When a heartbeat last read both directories whole because the member had waited long
    /// (monotonic; see [`decide::Facts::rereads_whole`]).
    whole_read: Option<Duration>,
    /// The view calls for a look at the slot table (it went back, or another view took this
    /// member's epoch) and the member's copy may be stale: read it at the next beat.
    need_slots: bool,
    /// The published view in the last table read is newer than the newest settled mark: a
    /// heartbeat must look at the table again even when it did not change (to write a lost
    /// acknowledgement again, see [`Engine::reassert`]).
    unsettled: bool,
    /// The newest settled mark read (from the table or a poll).
    settled: Option<SettledRecord>,
    /// The highest epoch seen in any view, settled mark, slot record or acknowledgement.
    highest: u64,
}

/// The hand-off in progress: a view adopted as pending and not yet active. It ends when the
/// view is activated or every grant is revoked.
#[derive(Clone, Copy)]
struct Handoff {
    /// When the first view of this hand-off was adopted (monotonic): the hand-off's length.
    since: Duration,
    /// When the pending view was adopted (monotonic): unlike `since`, it restarts when a newer
    /// view replaces the pending one, so a burst of views (joins one after another) does not
    /// count as one long hand-off.
    adopted_at: Duration,
}

/// A slot whose lease TTL this member re-applied while waiting for its acknowledgement of an
/// epoch (see [`Engine::expire_stalled`]).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Nudge {
    slot: u32,
    nonce: u64,
    epoch: u64,
}

/// A hand-off waiting on slots that have not acknowledged its epoch: since when (monotonic).
#[derive(Clone, Copy)]
struct Stall {
    epoch: u64,
    since: Duration,
}

/// The member's part in settling views.
#[derive(Default)]
struct Settler {
    /// This member settles: its slot is the lowest live one (or it published the view) and the
    /// published view is not settled yet, so it polls the acknowledgements at an eighth of a
    /// heartbeat.
    settling: bool,
    /// The epoch of the view this member last published: it settles that view too (without
    /// waiting for the lowest slot to read the view at its next heartbeat).
    published: Option<u64>,
    /// When this member last published a view (monotonic): the lowest slot publishes for a
    /// burst of joins at most one view per [`decide::PUBLISH_GAP_DIVISOR`]th of a heartbeat.
    published_at: Option<Duration>,
    /// When this member last read the acknowledgements (monotonic).
    acks_read: Option<Duration>,
    /// The pending epoch whose hand-off [`Engine::expire_stalled`] times.
    stalled: Option<Stall>,
    /// The claims whose lease TTL this member re-applied, per epoch.
    nudged: Vec<Nudge>,
}

/// Live slots that disagree with the published view.
struct Discrepancy {
    /// The live holders of the listing.
    live: Vec<Holder>,
    /// Since when (monotonic).
    since: Duration,
    /// Whether the member polls at a quarter heartbeat meanwhile: the lowest slot (which
    /// publishes), and every member when a slot of the view is gone (the lowest may be the one
    /// gone). A new claim publishes the view with itself, so the others need not poll for it.
    fast: bool,
}

/// The store not answering the member's heartbeats, and the member riding through it.
#[derive(Default)]
struct Outage {
    /// Since when the heartbeats fail with store errors, while they do (monotonic).
    failing_since: Option<Duration>,
    /// The view the member worked towards when the store stopped answering: after the outage,
    /// its slots are the ones the member waits for, and a sticky assignment starts from it when
    /// the store came back without the published view.
    last_view: Option<Arc<ViewState>>,
    /// Until when a view that leaves out a slot of `last_view` (or of the published view)
    /// waits for it to be claimed again (monotonic; see [`GroupConfig::with_outage_grace`]).
    grace_until: Option<Duration>,
}

/// Where a member is in its life. With the views it holds (active, pending) it gives the
/// [`GroupPhase`] the member publishes: [`Engine::group_phase`] is the one place that maps it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Phase {
    /// Claiming or holding a claim: its views say whether it is joining, active, or in a
    /// hand-off.
    #[default]
    Member,
    /// Standing by for a leaving member's slot ([`GroupConfig::with_standby`]).
    StandingBy,
    /// Its lease lapsed or its slot was lost: all work stopped until it holds a claim again.
    Rejoining,
    /// It left the group.
    Stopped,
    /// It ended with an error.
    Failed,
}

/// The protocol state of one member: everything the runner knows and decides from, and no
/// store. Its methods are synchronous; the [`Runner`] around it makes the store calls they ask
/// for and tells it the answers.
pub(super) struct Engine {
    cfg: Settings,
    /// Where the member is in its life.
    phase: Phase,
    shared: Arc<Shared>,
    claims: Claims,
    cache: TableCache,
    handoff: Option<Handoff>,
    settler: Settler,
    discrepancy: Option<Discrepancy>,
    outage: Outage,
    /// The member fails for good ([`Runner::fail`]): its leave hands nothing to a standby.
    failing: bool,
    /// The member hears the store's change notifications ([`Runner::subscribe`]).
    listening: bool,
}

/// The background heartbeat of one member: the [`Engine`], the store it calls for it, and the
/// store's change notifications.
pub(super) struct Runner {
    store: DynStore,
    engine: Engine,
    /// The store's change notifications for the group's directories, when it has them and the
    /// member listens ([`GroupConfig::with_notifications`]).
    notices: Option<notices::Notices>,
}

impl std::ops::Deref for Runner {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.engine
    }
}

impl std::ops::DerefMut for Runner {
    fn deref_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }
}

impl Engine {
    /// The engine of `member` of the group `space` names, on a store of `caps`, before its
    /// first claim.
    pub(super) fn new(
        caps: &Capabilities,
        config: &GroupConfig,
        space: Keyspace,
        member: String,
        shared: Arc<Shared>,
    ) -> Engine {
        Engine {
            phase: Phase::default(),
            cfg: Settings {
                backend: caps.backend,
                native_notifications: caps.native_notifications,
                min_ttl: caps.min_ttl,
                metrics: GroupMetrics::new(space.group()),
                clock: config.clock.clone(),
                effective_ttl: caps.effective_ttl(config.ttl),
                one_call_versions: caps.native_renew_and_versions && config.one_call_versions,
                view_inline_max: config.view_inline_max,
                change_record_cost: config.change_record_cost,
                coalesce_from: config.coalesce_from,
                layout: GroupLayout::new(space),
                member,
                ttl: config.ttl,
                heartbeat: config.ttl / 3,
                assignor: config.assignor,
                declared: config.declared.clone(),
                max_slots: config.max_slots,
                drain_timeout: config.drain_timeout.unwrap_or(config.ttl),
                restart_window: config.restart_window(),
                outage_grace: config.outage_grace(),
                crash_grace: config.crash_grace,
                slot_ttl: config.ttl + config.crash_grace,
                standby: config.standby,
                change_checks: config.change_checks,
                notifications: config.notifications,
            },
            shared,
            claims: Claims::default(),
            cache: TableCache::default(),
            handoff: None,
            settler: Settler::default(),
            discrepancy: None,
            outage: Outage::default(),
            failing: false,
            listening: false,
        }
    }
}

impl Runner {
    /// A runner for `member` of the group `space` names, before its first claim.
    pub(super) fn new(
        store: DynStore,
        config: &GroupConfig,
        space: Keyspace,
        member: String,
        shared: Arc<Shared>,
    ) -> Runner {
        let engine = Engine::new(&store.capabilities(), config, space, member, shared);
        Runner {
            store,
            engine,
            notices: None,
        }
    }

    /// Subscribes to the store's change notifications for the group's directories, before the
    /// first claim so that nothing after it goes unheard (see [`notices`]).
    pub(in crate::recipes::group) async fn subscribe(&mut self) {
        if self.cfg.notifications && self.cfg.native_notifications {
            self.notices = notices::Notices::subscribe(
                &self.store,
                &self.cfg.layout,
                self.cfg.standby.is_some(),
            )
            .await;
        }
        self.engine.listening = self.notices.is_some();
    }

    /// The text stored at `key` when it parses to `record`, `None` when the key holds anything
    /// else or nothing: a compare-and-set against the exact stored text matches even a record
    /// written by hand with other spacing or digits, which a re-serialized one would not.
    async fn stored_text(&self, key: &str, record: &SlotRecord) -> Result<Option<String>> {
        let text = self.store.get(key).await?;
        Ok(text.filter(|t| SlotRecord::parse(t).as_ref() == Some(record)))
    }

    /// Reads the table: see [`SlotTable::read`]. A long view's header is resolved from the
    /// views this member holds when their changes lead to it.
    async fn list(&self) -> Result<SlotTable> {
        let held = self.held_views();
        SlotTable::read(
            &self.store,
            &self.cfg.layout,
            &held.views(),
            self.cfg.change_record_cost,
        )
        .await
    }

    /// Runs `round` ([`round`]): makes each store call the engine asks for and hands it the
    /// answer, until the round asks for nothing more.
    async fn run_round(&mut self, mut round: round::Round) {
        let mut answer = None;
        while let Some(call) = self.engine.advance(&mut round, answer.take()) {
            answer = Some(self.perform(call).await);
        }
    }

    /// Makes one store call an engine step asked for.
    async fn perform(&self, call: round::Call) -> round::Answer {
        use round::{Answer, Call};
        match call {
            Call::Cas {
                key,
                expected,
                new,
                ttl,
            } => Answer::Cas(
                self.store
                    .compare_and_set(&key, expected.as_deref(), &new, ttl)
                    .await,
            ),
            Call::Publish {
                expected,
                publication,
            } => Answer::Cas(
                self.write_publication(expected.as_deref(), &publication)
                    .await,
            ),
            Call::Get { key } => Answer::Get(self.store.get(&key).await),
            Call::List { dir } => Answer::List(self.store.list(&dir).await),
        }
    }
}

impl Engine {
    /// An [`Error::Rejected`] from this member's store: a condition no retry fixes.
    fn rejected(&self, message: String) -> Error {
        Error::Rejected {
            backend: self.cfg.backend,
            message,
            source: None,
        }
    }

    /// Whether this member's current claim has acknowledged `view`: in its slot record (a fresh
    /// claim has let go of everything up to the epoch it claimed at) or in its acknowledgement.
    fn has_acked(&self, view: &ViewState) -> bool {
        let Some(claim) = &self.claims.current else {
            return false;
        };
        view.acked_by(&claim.record)
            || self.claims.ack.as_ref().is_some_and(|a| {
                a.record.nonce == claim.record.nonce
                    && a.record.has_acked_digest(view.epoch(), view.digest)
            })
    }

    fn set_error(&self, e: Option<&Error>) {
        let msg = e.map(|e| e.to_string());
        self.shared.publish(|a| a.last_error = msg);
    }

    /// Forgets the version of the view directory held, so the next heartbeat reads it: after a
    /// write of this member's own there (a view, a settled mark), a store that rolls back to
    /// exactly the directory held must not leave it believing its write stuck.
    fn forget_seen(&mut self) {
        self.cache.view_version = None;
    }

    /// The lease deadline of a renewal sent at `sent`: a tenth short of the TTL, so it passes
    /// before the store expires the slot.
    fn deadline(&self, sent: Duration) -> Duration {
        sent + self.cfg.ttl - self.cfg.ttl / 10
    }

    /// The views this member holds: the published view it last read, the one it works towards,
    /// the active one, and the one it worked under before an outage. A long view's header is
    /// resolved from them by its changes ([`SlotTable::resolve`]).
    fn held_views(&self) -> HeldViews {
        // A copy of the view alone: the table is set in place when it is the only reference.
        let read = self.cache.slots.as_ref().and_then(|s| s.table.view.clone());
        let (pending, active) = {
            let st = self.shared.lock();
            (st.pending.clone(), st.active.clone())
        };
        HeldViews {
            read,
            states: [pending, active, self.outage.last_view.clone()]
                .into_iter()
                .flatten()
                .collect(),
        }
    }

    /// The view this member works towards: the pending one, else the active one.
    fn target(&self) -> Option<Arc<ViewState>> {
        self.shared.lock().target().cloned()
    }

    /// The view adopted and not yet active.
    fn pending(&self) -> Option<Arc<ViewState>> {
        self.shared.lock().pending.clone()
    }

    /// The phase the member publishes: its [`Phase`], and while it is a member, its views: a
    /// view adopted beside an active one is a hand-off; an active view that names its claim,
    /// active; anything else, joining.
    fn group_phase(&self) -> GroupPhase {
        match self.phase {
            Phase::StandingBy => GroupPhase::Standby,
            Phase::Rejoining => GroupPhase::Rejoining,
            Phase::Stopped => GroupPhase::Stopped,
            Phase::Failed => GroupPhase::Failed,
            Phase::Member => {
                let st = self.shared.lock();
                match (&st.active, &st.pending, st.holder) {
                    (Some(_), Some(_), _) => GroupPhase::Handoff,
                    (Some(active), None, Some(h)) if active.pair_of(h).is_some() => {
                        GroupPhase::Active
                    }
                    _ => GroupPhase::Joining,
                }
            }
        }
    }

    /// Moves the member to `phase`: the [`GroupPhase`] it now publishes.
    fn enter(&mut self, phase: Phase) -> GroupPhase {
        self.phase = phase;
        self.group_phase()
    }
}
