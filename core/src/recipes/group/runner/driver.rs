//! The loop: sleeps until the wake [`Facts::wake`] chooses (or a change notification held is
//! due), then makes the call it names, until the member is told to stop or meets an error no
//! retry fixes.

use tokio::sync::watch;
use tracing::Instrument as _;

use super::decide::{acks_due, charge, notice_due, refund, Between, Facts, Seen};
use super::notices::Notices;
use super::{Engine, Runner};
use crate::error::{ErrorKind, Result};

/// What woke the loop.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Woke {
    /// The wake [`Facts::wake`] chose.
    Timer,
    /// A grant was dropped during a hand-off.
    Drained,
    /// A change notification came: it is held until due.
    Heard(Seen),
    /// The notifications held are due.
    NoticeDue,
}

/// The next notice of a directory in `among`, for a member that listens (the branch is
/// disabled otherwise).
async fn next_notice(notices: &mut Option<Notices>, among: Seen) -> Seen {
    match notices {
        Some(n) => n.next_among(among).await,
        None => std::future::pending().await,
    }
}

impl Runner {
    /// When the notices held are due ([`notice_due`], or [`acks_due`] for acknowledgements
    /// alone), if any are held.
    fn notices_due(&self) -> Option<std::time::Duration> {
        let n = self.notices.as_ref()?;
        let heartbeat = self.cfg.heartbeat;
        match n.held {
            Seen::NONE => None,
            Seen::ACKS => Some(acks_due(n.last_acks, heartbeat)),
            _ => Some(notice_due(n.tat, n.last, heartbeat)),
        }
    }

    /// Answers the notices held (and any pending since): the call the member's state calls for
    /// ([`Facts::on_notices`]), charged to the budget of notice-driven calls when there is one.
    fn answer_notices(&mut self) -> Option<Between> {
        let now = self.cfg.clock.monotonic();
        let n = self.notices.as_mut()?;
        let seen = n.held | n.pending();
        n.held = Seen::NONE;
        let call = self.facts().on_notices(seen)?;
        let heartbeat = self.cfg.heartbeat;
        if let Some(n) = self.notices.as_mut() {
            if seen == Seen::ACKS {
                n.last_acks = Some(now);
            } else {
                n.tat = Some(charge(n.tat, now, heartbeat));
                n.last = Some(now);
            }
        }
        self.cfg.metrics.notice_call();
        Some(call)
    }

    /// Heartbeats until `stop` changes, then leaves the group. Returns the error that ended it
    /// early ([`ErrorKind::Rejected`]: another live process uses the member id, say).
    pub(in crate::recipes::group) async fn run(
        mut self,
        mut stop: watch::Receiver<bool>,
    ) -> Result<()> {
        // However this task ends, a caller waiting on the assignment (`Member::active`) hears
        // of it: a panic (a store or hook that panicked) or an abort publishes `Failed`.
        let _ended = super::leaving::EndGuard(self.shared.clone());
        let mut next = self.cfg.clock.monotonic() + self.cfg.heartbeat;
        loop {
            let wake = self.facts().wake(next);
            let due = self.notices_due();
            let at = due.map_or(wake.at, |d| d.min(wake.at));
            // A member holding notices waits until they are due; more coalesce meanwhile.
            let listening = self.notices.is_some() && due.is_none();
            let among = self.facts().listens();
            // Biased: a fixed order of readiness checks keeps a simulation run reproducible.
            let woke = tokio::select! {
                biased;
                _ = stop.changed() => break,
                _ = self.engine.cfg.clock.sleep_until(at) => {
                    if due.is_some_and(|d| d < wake.at) { Woke::NoticeDue } else { Woke::Timer }
                }
                _ = self.engine.shared.released.notified(), if self.engine.handoff.is_some() => Woke::Drained,
                seen = next_notice(&mut self.notices, among), if listening => Woke::Heard(seen),
            };
            if *stop.borrow() {
                break;
            }
            let call = match woke {
                Woke::Drained => {
                    // A grant was dropped during a hand-off: acknowledge now if that was the
                    // last.
                    self.run_round(super::round::Round::progress()).await;
                    continue;
                }
                Woke::Heard(seen) => {
                    if let Some(n) = &mut self.notices {
                        n.held = seen;
                    }
                    continue;
                }
                Woke::NoticeDue => match self.answer_notices() {
                    Some(call) => call,
                    None => continue,
                },
                Woke::Timer => {
                    if self.cfg.clock.monotonic() >= next {
                        next = self.cfg.clock.monotonic() + self.cfg.heartbeat;
                        Between::Beat
                    } else {
                        wake.between
                    }
                }
            };
            if woke == Woke::Timer && call == Between::Beat {
                // A heartbeat's reads cover whatever the notices held asked to look at.
                if let Some(n) = &mut self.notices {
                    n.held = Seen::NONE;
                }
            }
            let span = tracing::debug_span!(
                "group.heartbeat",
                group = self.cfg.layout.group(),
                slot = self.claims.current.as_ref().map(|c| c.slot),
                noticed = woke == Woke::NoticeDue
            );
            let before = (woke == Woke::NoticeDue).then(|| self.progress_mark());
            let result = match call {
                Between::Beat => self.beat().instrument(span).await,
                Between::PollSettled => self.poll_settled().instrument(span).await,
                Between::Watch => self.watch().instrument(span).await,
            };
            if before.is_some_and(|b| b != self.progress_mark()) {
                let heartbeat = self.cfg.heartbeat;
                if let Some(n) = &mut self.notices {
                    n.tat = refund(n.tat, heartbeat);
                }
            }
            if let Err(e) = result {
                if matches!(e.kind(), ErrorKind::Rejected | ErrorKind::Config) {
                    self.fail(&e).await;
                    return Err(e);
                }
            }
        }
        self.leave().await
    }
}

impl Engine {
    /// The state the scheduling decisions read, now.
    pub(super) fn facts(&self) -> Facts<'_> {
        let pending_acked = self.pending().is_some_and(|p| self.has_acked(&p));
        Facts {
            claim: self.claims.current.as_ref(),
            abandoned: self.claims.abandoned,
            cache: &self.cache,
            handoff: self.handoff.as_ref(),
            settler: &self.settler,
            discrepancy: self.discrepancy.as_ref(),
            pending_acked,
            change_checks: self.cfg.change_checks,
            listening: self.listening,
            failing: self.outage.failing_since.is_some(),
            heartbeat: self.cfg.heartbeat,
            now: self.cfg.clock.monotonic(),
        }
    }

    /// What a planned change moves along: the view the member works towards, the active
    /// epoch, and the newest settled mark read. A notice-driven call that changes it is refunded
    /// ([`refund`]).
    fn progress_mark(&self) -> impl PartialEq {
        let st = self.shared.lock();
        (
            st.target().map(|t| (t.epoch(), t.digest)),
            st.active.as_ref().map(|a| a.epoch()),
            self.cache.settled,
        )
    }
}
