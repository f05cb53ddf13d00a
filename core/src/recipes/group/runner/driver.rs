//! The loop: sleeps until the wake [`Facts::wake`] chooses, then makes the call it names, until
//! the member is told to stop or meets an error no retry fixes.

use tokio::sync::watch;
use tracing::Instrument as _;

use super::decide::{notice_at, Between, Facts, Seen};
use super::notices::{Notices, NOTICE_CALLS_PER_BEAT};
use super::Runner;
use crate::error::{ErrorKind, Result};

/// What woke the loop.
#[derive(Clone, Copy)]
enum Woke {
    /// The wake [`Facts::wake`] chose.
    Timer,
    /// A grant was dropped during a hand-off.
    Drained,
    /// A change notification for these directories.
    Notice(Seen),
}

/// What a notice leads to.
enum Noticed {
    /// `stop` changed while waiting out the gap between notices.
    Stop,
    /// No call: the member's state does not care about the directories named, or its budget
    /// of notice-driven calls for this heartbeat is spent.
    Nothing,
    /// This call, now.
    Call(Between),
}

/// The next notice, for a member that listens (the branch is disabled otherwise).
async fn next_notice(notices: &mut Option<Notices>) -> Seen {
    match notices {
        Some(n) => n.next().await,
        None => std::future::pending().await,
    }
}

impl Runner {
    /// Answers a notice of the directories in `seen`: waits out the gap since the last notice
    /// (gathering the notices that come meanwhile), then picks the call the member's state
    /// calls for ([`Facts::on_notices`]), within the budget of notice-driven calls per
    /// heartbeat ([`notice_at`]).
    async fn on_notice(&mut self, seen: Seen, stop: &mut watch::Receiver<bool>) -> Noticed {
        let now = self.cfg.clock.monotonic();
        let Some(n) = &self.notices else {
            return Noticed::Nothing;
        };
        let Some(at) = notice_at(n.spent, n.last, now, self.cfg.heartbeat) else {
            return Noticed::Nothing;
        };
        if at > now {
            tokio::select! {
                biased;
                _ = stop.changed() => return Noticed::Stop,
                _ = self.cfg.clock.sleep_until(at) => {}
            }
        }
        let Some(n) = &mut self.notices else {
            return Noticed::Nothing;
        };
        let seen = seen | n.pending();
        n.last = Some(self.cfg.clock.monotonic());
        match self.facts().on_notices(seen) {
            Some(call) => {
                if let Some(n) = &mut self.notices {
                    n.spent += 1;
                }
                self.cfg.metrics.notice_call();
                Noticed::Call(call)
            }
            None => Noticed::Nothing,
        }
    }

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
            heartbeat: self.cfg.heartbeat,
            now: self.cfg.clock.monotonic(),
        }
    }

    /// Heartbeats until `stop` changes, then leaves the group. Returns the error that ended it
    /// early ([`ErrorKind::Rejected`]: another live process uses the member id, say).
    pub(in crate::recipes::group) async fn run(
        mut self,
        mut stop: watch::Receiver<bool>,
    ) -> Result<()> {
        // However this task ends, a caller waiting on the assignment (`Member::active`) hears
        // of it: a panic (a store or hook that panicked) or an abort publishes `Failed`.
        let _ended = super::leaving::Ended(self.shared.clone());
        let mut next = self.cfg.clock.monotonic() + self.cfg.heartbeat;
        loop {
            let wake = self.facts().wake(next);
            let listening = self
                .notices
                .as_ref()
                .is_some_and(|n| n.spent < NOTICE_CALLS_PER_BEAT);
            // Biased: a fixed order of readiness checks keeps a simulation run reproducible.
            let woke = tokio::select! {
                biased;
                _ = stop.changed() => break,
                _ = self.cfg.clock.sleep_until(wake.at) => Woke::Timer,
                _ = self.shared.released.notified(), if self.handoff.is_some() => Woke::Drained,
                seen = next_notice(&mut self.notices), if listening => Woke::Notice(seen),
            };
            if *stop.borrow() {
                break;
            }
            let call = match woke {
                Woke::Drained => {
                    // A grant was dropped during a hand-off: acknowledge now if that was the
                    // last.
                    self.progress(None).await;
                    continue;
                }
                Woke::Notice(seen) => match self.on_notice(seen, &mut stop).await {
                    Noticed::Stop => break,
                    Noticed::Nothing => continue,
                    Noticed::Call(call) => call,
                },
                Woke::Timer => {
                    let full = self.cfg.clock.monotonic() >= next;
                    if full {
                        next = self.cfg.clock.monotonic() + self.cfg.heartbeat;
                        if let Some(n) = &mut self.notices {
                            n.spent = 0;
                        }
                        Between::Beat
                    } else {
                        wake.between
                    }
                }
            };
            let span = tracing::debug_span!(
                "group.heartbeat",
                group = self.cfg.keys.group(),
                slot = self.claims.current.as_ref().map(|c| c.slot),
                full = matches!(woke, Woke::Timer) && call == Between::Beat,
                notice = matches!(woke, Woke::Notice(_))
            );
            let result = match call {
                Between::Beat => self.beat().instrument(span).await,
                Between::PollSettled => self.poll_settled().instrument(span).await,
                Between::Watch => self.watch().instrument(span).await,
            };
            if let Err(e) = result {
                if e.kind() == ErrorKind::Rejected {
                    self.fail(&e).await;
                    return Err(e);
                }
            }
        }
        self.leave().await
    }
}
