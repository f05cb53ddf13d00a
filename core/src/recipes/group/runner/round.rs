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

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::super::header::Publication;
use super::super::records::{AckRecord, SettledRecord, SlotRecord, ViewRecord};
use super::super::table::SlotTable;
use super::super::view::ViewState;
use super::{Claim, Discrepancy, Engine};
use crate::error::Result;

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
    /// Publish a view written as a header and a snapshot (or written whole over one that was):
    /// the snapshot, then the compare-and-set of `view:current` against `expected`, then the
    /// snapshots no longer needed (see `Runner::write_publication`). Answered as a
    /// compare-and-set.
    Publish {
        expected: Option<String>,
        publication: Publication,
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
    table: Option<Arc<SlotTable>>,
    /// The table changed by this member's own claim or leave.
    own_change: bool,
    /// The claim lost a race for another slot since the table was read: another claim the
    /// table lacks is under way, so the change is not this member's alone.
    raced: bool,
    /// The slots were read after the view, in this heartbeat.
    fresh: bool,
    /// The newest view, to adopt.
    newest: Option<ViewRecord>,
    steps: VecDeque<Step>,
}

impl Round {
    /// The round of a table read: publish, adopt, progress, settle (on a fresh table),
    /// re-acknowledge, and poll for the settled mark of a view just published.
    pub(super) fn of_table(table: Arc<SlotTable>, own_change: bool, fresh: bool) -> Round {
        let mut steps = VecDeque::from([Step::Views, Step::Adopt, Step::Progress]);
        if fresh {
            steps.push_back(Step::Settle);
        }
        steps.extend([Step::Reassert, Step::MarkSettling]);
        Round {
            table: Some(table),
            own_change,
            raced: false,
            fresh,
            newest: None,
            steps,
        }
    }

    /// Marks this round's claim as one that lost a race for another slot since its table was
    /// read: the table lacks the winner's claim.
    pub(super) fn after_race(mut self, raced: bool) -> Round {
        self.raced = raced;
        self
    }

    /// The round of a dropped grant, or of a settled mark read: acknowledge the pending view
    /// if that was the last grant in the way, and activate it if it is settled.
    pub(super) fn progress() -> Round {
        Round {
            table: None,
            own_change: false,
            raced: false,
            fresh: false,
            newest: None,
            steps: VecDeque::from([Step::Progress]),
        }
    }

    /// The table, when it was read after its view in this round: only then do other slots'
    /// records count as acknowledgements.
    fn fresh_table(&self) -> Option<&SlotTable> {
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
}

mod acks;
mod settle;
mod views;

#[cfg(test)]
mod tests;
