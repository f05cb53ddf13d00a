//! A round: what a member does with a table it read (or, woken by a dropped grant, with its
//! pending view), as steps of the [`Engine`] that ask for store calls instead of making them.
//!
//! A round runs these steps in order, each one a handler below:
//!
//! | step | handler | store calls it asks for |
//! |---|---|---|
//! | publish the next view when the table calls for one | [`Engine::views`], [`Engine::view_written`] | a compare-and-set of the view |
//! | adopt the newest view as pending | [`Engine::adopt_newest`] | none |
//! | acknowledge the pending view once drained, activate it once the others did | [`Engine::progress`], [`Engine::activate_if_ready`] | the acknowledgement's compare-and-set (and a read when it was refused) |
//! | settle the view (lowest slot or publisher): read the acknowledgements, write the settled mark | [`Engine::settle`], [`Engine::acks_read`], [`Engine::mark_written`] | a listing, a compare-and-set |
//! | re-apply a lease TTL to slots that stall the hand-off | [`Engine::nudge_next`], [`Engine::nudge_read`], [`Engine::nudge_written`] | a read and a compare-and-set per slot |
//! | write a lost acknowledgement again | [`Engine::reassert`] | the acknowledgement's compare-and-set |
//!
//! The [`Runner`](super::Runner) drives a round: it asks [`Engine::advance`] for the next
//! [`Call`], makes it, and hands the [`Answer`] back, until the round asks for nothing more.
//! Each handler is tested alone in `round/tests.rs`: given a state and a table, the call it
//! asks for and the state it leaves.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::super::records::{
    parse_acks, AckRecord, Holder, SettledRecord, SlotRecord, ViewRecord, MAX_EPOCH,
};
use super::super::table::Table;
use super::super::view::ViewState;
use super::super::{MAX_LEASE_TTL, MIN_LEASE_TTL};
use super::decide::{
    awaits_returning, drain_timed_out, publishes, settled_at_or_past, unsettled, view_is_stale,
    view_needs_slots, view_slot_gone,
};
use super::views::newer_version;
use super::{Claim, Discrepancy, Engine, Nudge, Stall, WrittenAck, ACK_TTLS, NUDGES_PER_BEAT};
use crate::error::{Error, Result};

/// A store call a step asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Call {
    /// `compare_and_set(key, expected, new, ttl)`.
    Cas {
        key: String,
        expected: Option<String>,
        new: String,
        ttl: Option<Duration>,
    },
    /// `get(key)`.
    Get { key: String },
    /// `list(dir)`.
    List { dir: String },
}

/// The store's answer to a [`Call`].
#[derive(Debug)]
pub(super) enum Answer {
    Cas(Result<bool>),
    Get(Result<Option<String>>),
    List(Result<Vec<(String, String)>>),
}

/// What becomes of a round after a step.
enum Then {
    /// Go on with the next step.
    Next,
    /// Make this call; the step waits for its answer.
    Call(Call, Box<Wait>),
    /// The round ends here (a check that stops the whole round).
    Stop,
}

/// A step waiting for the answer to its call, with what it needs to go on.
enum Wait {
    /// The compare-and-set of the next view.
    View {
        next: ViewRecord,
        discrepancy: Discrepancy,
    },
    /// An acknowledgement being written.
    Ack(AckWrite),
    /// The listing of the acknowledgements, to settle `target`.
    Acks { target: Arc<ViewState>, own: u32 },
    /// The compare-and-set of the settled mark.
    Mark(SettledRecord),
    /// The read of a stalled slot's record, before its TTL is re-applied.
    NudgeRead(Nudging),
    /// The compare-and-set that re-applies the TTL.
    NudgeWrite(Nudging),
}

/// A step of a round.
enum Step {
    /// Publish the next view when the table calls for one.
    Views,
    /// Adopt the newest view, and note whether the published view is settled.
    Adopt,
    /// Acknowledge and activate the pending view.
    Progress,
    /// Activate the pending view once acknowledged (after [`Step::Progress`] wrote the
    /// acknowledgement).
    Activate(Ready),
    /// Settle the published view.
    Settle,
    /// Write a lost acknowledgement again.
    Reassert,
    /// Poll until a view this member just published is settled.
    MarkSettling,
    /// Waiting for the answer to a call.
    Waiting(Box<Wait>),
}

/// What [`Engine::activate_if_ready`] needs of the pending view.
#[derive(Clone)]
struct Ready {
    pending: Arc<ViewState>,
    same_assignment: bool,
    claim: Claim,
}

/// An acknowledgement being written: two tries, against what this member last wrote, then
/// against what the store holds.
struct AckWrite {
    slot: u32,
    ack: AckRecord,
    text: String,
    /// When the write started (monotonic).
    sent: Duration,
    expected: Option<String>,
    tries: u8,
    /// What follows a written acknowledgement: activating the pending view, or nothing.
    then: Option<Ready>,
}

/// Stalled slots having their lease TTL re-applied, one after another.
struct Nudging {
    epoch: u64,
    queue: VecDeque<(u32, SlotRecord)>,
}

/// One round: the table it works on and the steps left.
pub(super) struct Round {
    /// The table read; `None` for a round woken by a dropped grant, which only progresses.
    table: Option<Arc<Table>>,
    /// The table changed by this member's own claim or leave.
    own_change: bool,
    /// The slots were read after the view, in this heartbeat.
    fresh: bool,
    /// The newest view, to adopt.
    newest: Option<ViewRecord>,
    steps: VecDeque<Step>,
}

impl Round {
    /// The round of a table read: publish, adopt, progress, settle (on a fresh table),
    /// re-acknowledge, and poll for the settled mark of a view just published.
    pub(super) fn of_table(table: Arc<Table>, own_change: bool, fresh: bool) -> Round {
        let mut steps = VecDeque::from([Step::Views, Step::Adopt, Step::Progress]);
        if fresh {
            steps.push_back(Step::Settle);
        }
        steps.extend([Step::Reassert, Step::MarkSettling]);
        Round {
            table: Some(table),
            own_change,
            fresh,
            newest: None,
            steps,
        }
    }

    /// The round of a dropped grant, or of a settled mark read: acknowledge the pending view
    /// if that was the last grant in the way, and activate it if it is settled.
    pub(super) fn progress() -> Round {
        Round {
            table: None,
            own_change: false,
            fresh: false,
            newest: None,
            steps: VecDeque::from([Step::Progress]),
        }
    }

    /// The table, when it was read after its view in this round: only then do other slots'
    /// records count as acknowledgements.
    fn fresh_table(&self) -> Option<&Table> {
        self.table.as_deref().filter(|_| self.fresh)
    }
}

impl Engine {
    /// Runs `round` on until it asks for a store call (returned) or ends (`None`). `answer` is
    /// the answer to the call it last asked for.
    pub(super) fn advance(
        &mut self,
        round: &mut Round,
        mut answer: Option<Answer>,
    ) -> Option<Call> {
        while let Some(step) = round.steps.pop_front() {
            let then = match step {
                Step::Views => self.views(round),
                Step::Adopt => {
                    self.adopt_newest(round);
                    Then::Next
                }
                Step::Progress => self.progress(round),
                Step::Activate(ready) => {
                    self.activate_if_ready(round, ready);
                    Then::Next
                }
                Step::Settle => self.settle(round),
                Step::Reassert => self.reassert(round),
                Step::MarkSettling => {
                    self.mark_settling(round);
                    Then::Next
                }
                Step::Waiting(wait) => {
                    let Some(a) = answer.take() else {
                        // Unreachable: a waiting step is only ever resumed with its answer.
                        round.steps.push_front(Step::Waiting(wait));
                        return None;
                    };
                    self.answered(round, *wait, a)
                }
            };
            match then {
                Then::Next => {}
                Then::Call(call, wait) => {
                    round.steps.push_front(Step::Waiting(wait));
                    return Some(call);
                }
                Then::Stop => {
                    round.steps.clear();
                    return None;
                }
            }
        }
        None
    }

    /// Hands `answer` to the step that waited for it.
    fn answered(&mut self, round: &mut Round, wait: Wait, answer: Answer) -> Then {
        match (wait, answer) {
            (Wait::View { next, discrepancy }, Answer::Cas(r)) => {
                self.view_written(round, next, discrepancy, r);
                Then::Next
            }
            (Wait::Ack(write), Answer::Cas(r)) => self.ack_written(round, write, r),
            (Wait::Ack(write), Answer::Get(r)) => self.ack_read(write, r),
            (Wait::Acks { target, own }, Answer::List(r)) => self.acks_read(round, &target, own, r),
            (Wait::Mark(mark), Answer::Cas(r)) => self.mark_written(round, mark, r),
            (Wait::NudgeRead(n), Answer::Get(r)) => self.nudge_read(round, n, r),
            (Wait::NudgeWrite(n), Answer::Cas(r)) => self.nudge_written(round, n, r),
            // Unreachable: the driver answers each call with its own kind.
            _ => Then::Stop,
        }
    }

    /// Decides whether the table calls for a new view and whether this member publishes it
    /// now; asks for the view's compare-and-set if so. Notes the newest view for
    /// [`Engine::adopt_newest`]. `fresh` (the slots were read after the view, in this
    /// heartbeat) is required to compare the slots with the view, publish or settle: a copy
    /// from an earlier heartbeat may lack claims the view already names.
    fn views(&mut self, round: &mut Round) -> Then {
        let Some(table) = round.table.clone() else {
            return Then::Next;
        };
        if let Err(e) = self.check_view_assignor(&table) {
            // Other live members work under a view of another assignor: publishing over it
            // would have them publish over ours in turn, for ever. The heartbeat ends this
            // member with the reason.
            self.set_error(Some(&e));
            return Then::Stop;
        }
        let fresh = round.fresh;
        let live = table.live();
        let my_slot = self.claims.current.as_ref().map(|c| c.slot);
        round.newest = table.view.clone();
        // The floor counts the acknowledgements too: a member that never saw the view (it was
        // lost or overwritten) still must not publish an epoch some member already acted on.
        let floor = self.cache.highest.max(table.highest_epoch());
        // A claim taken back from a restart or a crash activates no view at or below the epochs
        // its previous process granted under (`Claims::floor`): a view there, even one naming
        // this claim (a store that went back re-minted it), is replaced by one above it, or the
        // member would wait for ever.
        let wanted = if self.claims.floor > 0 {
            floor.max(self.claims.floor + 1)
        } else {
            floor
        };
        let twin_epoch = self.note_twins(&table);
        // A view a later version wrote is neither replaced nor adopted while a holder it names
        // is live (see `ViewRecord::newer_version`): this member keeps its own and says why.
        let newer = table.newer_view_in_use();
        if let Some(epoch) = newer {
            self.set_error(Some(&newer_version(epoch)));
        }
        let stale =
            newer.is_none() && view_is_stale(table.view.as_ref(), &live, wanted, twin_epoch);
        self.cache.highest = floor;
        // A view that went back, is missing or took this member's epoch needs a view above it,
        // which only a member that read the slots publishes: read them at the next beat.
        self.cache.need_slots =
            !fresh && newer.is_none() && view_needs_slots(table.view.as_ref(), wanted, twin_epoch);
        let now = self.cfg.clock.monotonic();
        if self.outage.grace_until.is_some_and(|u| now >= u) {
            self.outage.grace_until = None;
            self.outage.last_view = None;
        }
        if !fresh {
            // Adopt the published view as it is; what the slots call for is decided by the
            // members that read them.
            return Then::Next;
        }
        if !stale {
            self.discrepancy = None;
            return Then::Next;
        }
        let lowest = table.working().next() == my_slot && my_slot.is_some();
        // Back from an outage of the store: the members of the last view claim their slots
        // again before anyone publishes a view without them. Not a view that must be replaced
        // whatever the slots (one below an epoch some member acted on, or an epoch minted
        // twice): that repair waits for nobody.
        let repair = twin_epoch || table.view.as_ref().is_some_and(|v| v.epoch < wanted);
        let returning = !repair
            && awaits_returning(
                self.outage.grace_until,
                now,
                self.outage.last_view.as_ref().map(|v| v.record()),
                table.view.as_ref(),
                &live,
            );
        let since = match &self.discrepancy {
            Some(d) if d.live == live => d.since,
            _ => now,
        };
        // A slot of the view is gone (a crash, a lapse): every member watches closely, in
        // case the lowest slot is the one gone. New claims alone publish their own view.
        let fast = lowest || view_slot_gone(&table);
        let lasted = now.saturating_sub(since);
        let discrepancy = Discrepancy {
            live: live.clone(),
            since,
            fast,
        };
        match self.next_view(&table, self.cache.highest, live) {
            // Unreachable: the configuration check makes sure the keys are at hand.
            None if self.cache.highest < MAX_EPOCH => {
                let e = Error::config(format!(
                    "the `{}` assignor could not compute an assignment: its declared keys are not at hand",
                    self.cfg.assignor
                ));
                self.set_error(Some(&e));
                self.discrepancy = Some(discrepancy);
                Then::Next
            }
            None => {
                let e = Error::foreign(
                    &self.cfg.keys.view,
                    "an epoch below the largest one (a view or acknowledgement holds it: stop every member and delete the group's keys to start again)",
                    &self.cache.highest.to_string(),
                );
                self.set_error(Some(&e));
                self.discrepancy = Some(discrepancy);
                Then::Next
            }
            Some(next)
                if !returning
                    && publishes(round.own_change, lowest, lasted, self.cfg.heartbeat) =>
            {
                // A compare-and-set against the text read, so of the members that try exactly
                // one wins and the epoch is minted by the store.
                let call = Call::Cas {
                    key: self.cfg.keys.view.clone(),
                    expected: table.view_text.clone(),
                    new: next.to_string(),
                    ttl: None,
                };
                Then::Call(call, Box::new(Wait::View { next, discrepancy }))
            }
            Some(_) => {
                self.discrepancy = Some(discrepancy);
                Then::Next
            }
        }
    }

    /// The view's compare-and-set answered.
    fn view_written(
        &mut self,
        round: &mut Round,
        next: ViewRecord,
        discrepancy: Discrepancy,
        result: Result<bool>,
    ) {
        match result {
            Ok(true) => {
                tracing::info!(group = self.cfg.keys.group(), member = %self.cfg.member, epoch = next.epoch, live = next.holders.len(), "published a view");
                // As after settling: the next beat reads the table this write changed.
                self.forget_seen();
                self.settler.published = Some(next.epoch);
                self.cache.highest = next.epoch;
                round.newest = Some(next);
                self.discrepancy = None;
            }
            // Someone else changed the view since this listing (or the reply was lost): the
            // view in the listing is stale, so adopt nothing and list again at the next
            // (quarter-heartbeat) beat. Read it then whatever version the store answers: the
            // refusal proves the view changed, and a store whose version missed that change
            // would answer "unchanged" for ever.
            Ok(false) => {
                round.newest = None;
                self.forget_seen();
                self.discrepancy = Some(discrepancy);
            }
            Err(e) => {
                round.newest = None;
                self.forget_seen();
                self.set_error(Some(&e));
                self.discrepancy = Some(discrepancy);
            }
        }
    }

    /// Adopts the newest view as pending, and notes whether the published view is settled.
    fn adopt_newest(&mut self, round: &mut Round) {
        let Some(table) = round.table.clone() else {
            return;
        };
        if let Some(v) = round.newest.take() {
            self.adopt(v);
        }
        self.cache.settled = table.settled;
        self.cache.unsettled = unsettled(table.view.as_ref(), self.cache.settled);
    }

    /// Acknowledges the pending epoch once drained (asking for the acknowledgement's write),
    /// then activates it once the others have (or right away when the live slots did not
    /// change, so nothing moves to this member). Gives the lease up when the grants did not
    /// drain within the drain timeout.
    fn progress(&mut self, round: &mut Round) -> Then {
        // An acknowledgement the store lost is written again by `reassert`.
        let (pending, drained, same_assignment) = {
            let st = self.shared.lock();
            let Some(p) = st.pending.clone() else {
                return Then::Next;
            };
            // Nothing moves to or from this member when the holders and owners stayed the same,
            // unless a view in between moved something away and back (then another member may
            // have started it: wait for everyone's acknowledgement).
            let same = match (&st.active, st.holder) {
                (Some(a), Some(h)) => {
                    st.skipped.is_empty() && a.same_assignment(&p) && p.pair_of(h).is_some()
                }
                // A claim taken back from a restart is no exception although nothing moves to
                // it: the view it published waits for the others' acknowledgements like any
                // other. A store that lost a first take-back (and its view) lets a second
                // process of the id publish that same epoch again for the same slots; a member
                // that saw the first refuses to acknowledge the second, so the two processes
                // never grant one key under one token.
                _ => false,
            };
            (p, st.drained(), same)
        };
        let epoch = pending.epoch();
        if !drained {
            let now = self.cfg.clock.monotonic();
            let since = self.handoff.map_or(now, |h| h.since);
            if drain_timed_out(since, now, self.cfg.drain_timeout) && !self.claims.abandoned {
                // Say which grants held it up: the application knows its keys by hash too
                // (`assign::hash_bytes`); the whole share is named as such.
                let (keys, share) = {
                    let st = self.shared.lock();
                    let holder = claim_holder(st.holder);
                    st.held(|h| pending.owned_by(h, holder))
                };
                tracing::warn!(group = self.cfg.keys.group(), member = %self.cfg.member, epoch, key_hashes = ?keys, share, "grants did not drain within the drain timeout: giving up the lease (the keys named by hash, and the whole share when `share` is true, were still held)");
                self.cfg.metrics.drain_cut("timeout");
                self.claims.abandoned = true;
            }
            return Then::Next;
        }
        let Some(claim) = self.claims.current.clone() else {
            return Then::Next;
        };
        if self.claims.abandoned {
            return Then::Next;
        }
        let ready = Ready {
            pending: pending.clone(),
            same_assignment,
            claim: claim.clone(),
        };
        if self.has_acked(&pending) {
            self.activate_if_ready(round, ready);
            return Then::Next;
        }
        let ack = AckRecord {
            nonce: claim.record.nonce,
            acked: epoch,
            view: pending.digest,
        };
        self.write_ack(claim.slot, ack, Some(ready))
    }

    /// Activates the pending view, acknowledged, once it is settled, every other live slot of a
    /// fresh table acknowledged it, or nothing moved.
    fn activate_if_ready(&mut self, round: &Round, ready: Ready) {
        let Ready {
            pending,
            same_assignment,
            claim,
        } = ready;
        let epoch = pending.epoch();
        // Settled: every slot live when the settling member read the acknowledgements had
        // acknowledged (a slot claimed since holds nothing from before). Members that
        // acknowledge in their slot records (a fresh claim) are read from the table directly.
        let settled = self
            .cache
            .settled
            .is_some_and(|m| m.settles(epoch, pending.digest));
        let others_acked = round.fresh_table().is_some_and(|t| {
            t.slots
                .iter()
                .all(|(&s, r)| s == claim.slot || pending.acked_by(r))
        });
        // A claim taken back from a restart activates no view its previous incarnation may have
        // granted under (a view naming its new nonce is always above them).
        if epoch <= self.claims.floor {
            return;
        }
        if same_assignment || settled || others_acked {
            self.activate(pending, claim.holder());
        }
    }

    /// Starts writing `ack` at the slot's acknowledgement key, replacing whatever is there
    /// (only this slot's holder writes it; an earlier claim's acknowledgement counts for
    /// nothing), then goes on with `then`.
    fn write_ack(&mut self, slot: u32, ack: AckRecord, then: Option<Ready>) -> Then {
        let expected = self
            .claims
            .ack
            .as_ref()
            .filter(|a| a.record.nonce == ack.nonce)
            .map(|a| a.text.clone());
        let write = AckWrite {
            slot,
            text: ack.to_string(),
            ack,
            sent: self.cfg.clock.monotonic(),
            expected,
            tries: 0,
            then,
        };
        self.try_ack(write)
    }

    /// One try of an acknowledgement's compare-and-set.
    fn try_ack(&self, write: AckWrite) -> Then {
        let call = Call::Cas {
            key: self.cfg.keys.ack(write.slot),
            expected: write.expected.clone(),
            new: write.text.clone(),
            ttl: Some((self.cfg.ttl * ACK_TTLS).min(MAX_LEASE_TTL)),
        };
        Then::Call(call, Box::new(Wait::Ack(write)))
    }

    /// The acknowledgement's compare-and-set answered: written, or refused (then read what the
    /// store holds and try once more against it).
    fn ack_written(&mut self, round: &mut Round, write: AckWrite, result: Result<bool>) -> Then {
        match result {
            Ok(true) => {
                self.claims.ack = Some(WrittenAck {
                    record: write.ack,
                    text: write.text,
                    at: write.sent,
                });
                if let Some(ready) = write.then {
                    round.steps.push_front(Step::Activate(ready));
                }
                Then::Next
            }
            Ok(false) => {
                let key = self.cfg.keys.ack(write.slot);
                Then::Call(Call::Get { key }, Box::new(Wait::Ack(write)))
            }
            Err(e) => {
                self.set_error(Some(&e));
                Then::Next
            }
        }
    }

    /// What the store holds at the acknowledgement key, after a refused write: the second try
    /// expects it (an earlier claim's acknowledgement, or none when the store lost ours).
    fn ack_read(&mut self, mut write: AckWrite, result: Result<Option<String>>) -> Then {
        match result {
            Ok(now) => {
                write.expected = now;
                write.tries += 1;
                if write.tries < 2 {
                    self.try_ack(write)
                } else {
                    Then::Next
                }
            }
            Err(e) => {
                self.set_error(Some(&e));
                Then::Next
            }
        }
    }

    /// Settles the published view when this member's slot is the lowest live one, or it
    /// published the view (or, as a fallback for a lowest slot that does not, when its own
    /// hand-off is overdue: see `Facts::settle_overdue`): asks for the acknowledgements.
    fn settle(&mut self, round: &mut Round) -> Then {
        self.settler.settling = false;
        let Some(table) = round.table.clone() else {
            return Then::Next;
        };
        let Some(own) = self.claims.current.as_ref().map(|c| c.slot) else {
            return Then::Next;
        };
        if self.claims.abandoned {
            return Then::Next;
        }
        let Some(view) = &table.view else {
            return Then::Next;
        };
        let Some(target) = self.target().filter(|t| t.epoch() == view.epoch) else {
            return Then::Next;
        };
        let (epoch, digest) = (target.epoch(), target.digest);
        if settled_at_or_past(self.cache.settled, epoch, digest) {
            self.settler.stalled = None;
            return Then::Next;
        }
        // The same epoch for other holders or owners: a store that lost writes minted it twice,
        // and `views` replaces it.
        if !target.record().same_assignment(view) || !self.has_acked(&target) {
            return Then::Next;
        }
        let lowest = table.working().next() == Some(own);
        let publisher = self.settler.published == Some(epoch);
        self.settler.settling = lowest || publisher;
        let overdue = self.facts().settle_overdue();
        if !lowest && !publisher && !overdue {
            return Then::Next;
        }
        self.settler.acks_read = Some(self.cfg.clock.monotonic());
        let call = Call::List {
            dir: self.cfg.keys.acks.clone(),
        };
        Then::Call(call, Box::new(Wait::Acks { target, own }))
    }

    /// The acknowledgements read: once every live slot acknowledged the view, asks for the
    /// settled mark's compare-and-set; otherwise nudges the slots that stall it.
    fn acks_read(
        &mut self,
        round: &mut Round,
        target: &ViewState,
        own: u32,
        result: Result<Vec<(String, String)>>,
    ) -> Then {
        let Some(table) = round.table.clone() else {
            return Then::Next;
        };
        let acks = match result {
            Ok(listing) => parse_acks(&self.cfg.keys.acks, listing),
            Err(e) => {
                self.set_error(Some(&e));
                return Then::Next;
            }
        };
        let (epoch, digest) = (target.epoch(), target.digest);
        // An acknowledgement above the published view (the store lost the view it acknowledged)
        // raises the floor of the next epoch this member publishes.
        let acked = acks.values().map(|a| a.acked).max().unwrap_or(0);
        self.cache.highest = self.cache.highest.max(acked);
        // This member's own acknowledgement is what it did, whatever the store kept of it.
        let all = table
            .slots
            .keys()
            .all(|&s| s == own || table.slot_acked(s, &acks, epoch, digest));
        if !all {
            if self.settler.settling {
                return self.expire_stalled(&table, &acks, target, own);
            }
            return Then::Next;
        }
        let mark = SettledRecord {
            epoch,
            view: digest,
        };
        let call = Call::Cas {
            key: self.cfg.keys.settled.clone(),
            expected: table.settled_text.clone(),
            new: mark.to_string(),
            ttl: None,
        };
        Then::Call(call, Box::new(Wait::Mark(mark)))
    }

    /// The settled mark's compare-and-set answered. Once written, the round progresses again
    /// (the pending view may now activate).
    fn mark_written(
        &mut self,
        round: &mut Round,
        mark: SettledRecord,
        result: Result<bool>,
    ) -> Then {
        match result {
            Ok(true) => {
                tracing::debug!(group = self.cfg.keys.group(), member = %self.cfg.member, epoch = mark.epoch, "every live slot acknowledged the view: settled it");
                // Read the table at the next beat even if its version is the one held: a
                // store that rolls back to exactly that table must not leave this member
                // believing its write stuck.
                self.forget_seen();
                self.cache.settled = Some(mark);
                self.settler.settling = false;
                self.settler.stalled = None;
                self.cache.unsettled = false;
                round.steps.push_front(Step::Progress);
            }
            // Changed since the listing: read the view directory again at the next beat,
            // whatever version the store answers (as after a lost view write).
            Ok(false) => self.forget_seen(),
            Err(e) => {
                self.forget_seen();
                self.set_error(Some(&e));
            }
        }
        Then::Next
    }

    /// A hand-off stalled for three TTLs on a slot that has not acknowledged: re-applies that
    /// slot's own lease TTL to it, once per claim and epoch, with a compare-and-set that keeps
    /// its exact stored text. A live holder renews within a third of its TTL anyway, so this
    /// changes nothing for it; a record that has no expiry (restored by a tool that drops TTLs,
    /// written by hand) expires after that TTL, and the group proceeds without it instead of
    /// waiting forever. Only a settling member (the lowest live slot, the view's publisher)
    /// does it, at most [`NUDGES_PER_BEAT`] slots per beat, so a large group in churn does not
    /// write O(n²).
    fn expire_stalled(
        &mut self,
        table: &Table,
        acks: &BTreeMap<u32, AckRecord>,
        pending: &ViewState,
        own: u32,
    ) -> Then {
        let (epoch, digest) = (pending.epoch(), pending.digest);
        let now = self.cfg.clock.monotonic();
        let since = match self.settler.stalled {
            Some(stall) if stall.epoch == epoch => stall.since,
            _ => {
                self.settler.stalled = Some(Stall { epoch, since: now });
                now
            }
        };
        if now.saturating_sub(since) < self.cfg.ttl * 3 {
            return Then::Next;
        }
        let queue: VecDeque<(u32, SlotRecord)> = table
            .slots
            .iter()
            .filter(|(&s, r)| {
                s != own
                    && !table.slot_acked(s, acks, epoch, digest)
                    && !self.settler.nudged.contains(&Nudge {
                        slot: s,
                        nonce: r.nonce,
                        epoch,
                    })
            })
            .take(NUDGES_PER_BEAT)
            .map(|(&s, r)| (s, r.clone()))
            .collect();
        self.nudge_next(table, Nudging { epoch, queue })
    }

    /// Reads the next stalled slot's record, or ends the nudges (bounding what is remembered).
    fn nudge_next(&mut self, table: &Table, nudging: Nudging) -> Then {
        match nudging.queue.front() {
            Some(&(s, _)) => {
                let key = self.cfg.keys.slot(s);
                Then::Call(Call::Get { key }, Box::new(Wait::NudgeRead(nudging)))
            }
            None => {
                // Bounded: only the claims of the current table, for the newest epochs.
                if self.settler.nudged.len() > 4 * table.slots.len() + 16 {
                    self.settler.nudged.retain(|n| n.epoch == nudging.epoch);
                }
                Then::Next
            }
        }
    }

    /// A stalled slot's record read: when it is still the claim listed (its exact text),
    /// re-applies its lease TTL.
    fn nudge_read(
        &mut self,
        round: &mut Round,
        mut nudging: Nudging,
        result: Result<Option<String>>,
    ) -> Then {
        let Some(table) = round.table.clone() else {
            return Then::Next;
        };
        let Some((s, r)) = nudging.queue.front().cloned() else {
            return Then::Next;
        };
        let nudge = Nudge {
            slot: s,
            nonce: r.nonce,
            epoch: nudging.epoch,
        };
        // The text stored when it parses to the record listed: a compare-and-set against the
        // exact stored text matches even a record written by hand with other spacing or digits,
        // which a re-serialized one would not.
        let text = match result {
            Ok(text) => text.filter(|t| SlotRecord::parse(t).as_ref() == Some(&r)),
            Err(e) => {
                self.set_error(Some(&e));
                return Then::Next;
            }
        };
        let Some(text) = text else {
            // Changed or gone since the listing: nothing to do for this claim.
            self.settler.nudged.push(nudge);
            nudging.queue.pop_front();
            return self.nudge_next(&table, nudging);
        };
        // The lease TTL alone, not the crash grace: a crashed member that stalls a hand-off for
        // three TTLs stops waiting on the grace.
        let ttl = Duration::from_millis(r.ttl_ms).clamp(MIN_LEASE_TTL, MAX_LEASE_TTL);
        let call = Call::Cas {
            key: self.cfg.keys.slot(s),
            expected: Some(text.clone()),
            new: text,
            ttl: Some(ttl),
        };
        Then::Call(call, Box::new(Wait::NudgeWrite(nudging)))
    }

    /// The compare-and-set re-applying a stalled slot's TTL answered; on to the next slot.
    fn nudge_written(
        &mut self,
        round: &mut Round,
        mut nudging: Nudging,
        result: Result<bool>,
    ) -> Then {
        let Some(table) = round.table.clone() else {
            return Then::Next;
        };
        let Some((s, r)) = nudging.queue.pop_front() else {
            return Then::Next;
        };
        match result {
            Ok(applied) => {
                self.settler.nudged.push(Nudge {
                    slot: s,
                    nonce: r.nonce,
                    epoch: nudging.epoch,
                });
                if applied {
                    tracing::warn!(group = self.cfg.keys.group(), member = %self.cfg.member, slot = s, epoch = nudging.epoch, "slot has not acknowledged for three TTLs: re-applied its lease TTL, so a record without expiry does not stall the group");
                }
                self.nudge_next(&table, nudging)
            }
            // Not recorded: tried again at the next beat.
            Err(e) => {
                self.set_error(Some(&e));
                Then::Next
            }
        }
    }

    /// Writes this member's acknowledgement again when the published view is one it
    /// acknowledged and has stayed unsettled for a heartbeat since the last write: the store
    /// may have lost it (a rollback, an expiry during a long hand-off, a late write of an earlier
    /// claim of the slot), and the others wait for it.
    fn reassert(&mut self, round: &mut Round) -> Then {
        let Some(table) = round.table.clone() else {
            return Then::Next;
        };
        let (Some(view), Some(claim)) = (&table.view, self.claims.current.clone()) else {
            return Then::Next;
        };
        let digest = view.digest();
        if self.claims.abandoned || settled_at_or_past(self.cache.settled, view.epoch, digest) {
            return Then::Next;
        }
        let Some(ack) = self.claims.ack.clone() else {
            return Then::Next;
        };
        let stale = self.cfg.clock.monotonic().saturating_sub(ack.at) >= self.cfg.heartbeat;
        if ack.record.nonce == claim.record.nonce
            && ack.record.has_acked_digest(view.epoch, digest)
            && stale
        {
            return self.write_ack(claim.slot, ack.record, None);
        }
        Then::Next
    }

    /// A view this member just published is not in this table yet: poll (reading the table,
    /// then the acknowledgements) until it is settled.
    fn mark_settling(&mut self, round: &Round) {
        let Some(table) = &round.table else {
            return;
        };
        if self
            .settler
            .published
            .is_some_and(|e| table.view.as_ref().is_none_or(|v| v.epoch < e))
        {
            self.settler.settling = true;
        }
    }
}

/// The member's holder, or one that owns nothing.
fn claim_holder(holder: Option<Holder>) -> Holder {
    holder.unwrap_or(Holder {
        slot: u32::MAX,
        nonce: 0,
    })
}

#[cfg(test)]
mod tests;
