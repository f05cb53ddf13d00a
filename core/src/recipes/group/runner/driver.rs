//! The loop: sleeps until the wake [`Facts::wake`] chooses, then makes the call it names, until
//! the member is told to stop or meets an error no retry fixes.

use tokio::sync::watch;
use tracing::Instrument as _;

use super::decide::{Between, Facts};
use super::Runner;
use crate::error::{ErrorKind, Result};

impl Runner {
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
            // Biased: a fixed order of readiness checks keeps a simulation run reproducible.
            let drained_wake = tokio::select! {
                biased;
                _ = stop.changed() => break,
                _ = self.cfg.clock.sleep_until(wake.at) => false,
                _ = self.shared.released.notified(), if self.handoff.is_some() => true,
            };
            if *stop.borrow() {
                break;
            }
            if drained_wake {
                // A grant was dropped during a hand-off: acknowledge now if that was the last.
                self.progress(None).await;
                continue;
            }
            let full = self.cfg.clock.monotonic() >= next;
            if full {
                next = self.cfg.clock.monotonic() + self.cfg.heartbeat;
            }
            let span = tracing::debug_span!(
                "group.heartbeat",
                group = self.cfg.keys.group(),
                slot = self.claims.current.as_ref().map(|c| c.slot),
                full
            );
            let call = if full { Between::Beat } else { wake.between };
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
