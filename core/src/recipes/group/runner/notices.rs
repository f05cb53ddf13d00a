//! The store's change notifications ([`Store::subscribe`](crate::Store::subscribe)) for the
//! group's directories: a notice makes the member look now, with the call its state calls for
//! ([`Facts::on_notices`](super::decide::Facts::on_notices)), instead of at its next timer.
//!
//! A notice is only ever a reason to look early. The member reads the store as it would at a
//! heartbeat and decides from what it read; a lost, late, duplicated or spurious notice changes
//! when it looks, never what it concludes, and the heartbeat's timers go on as without
//! notifications, so a notice that never comes costs what polling costs.

use std::time::Duration;

use tokio::sync::watch;

use super::super::layout::GroupLayout;
use super::decide::{charge, notice_due, Seen};
use super::Runner;
use crate::notify::Notifications;
use crate::DynStore;

/// How many notice-driven calls a member may make at once after a quiet spell; beyond that,
/// one per eighth of a heartbeat ([`notice_period`](super::decide::notice_period)), so a storm of
/// changes that lead nowhere (hundreds a second) costs each member no more calls than a
/// hand-off's own polling. A call that moved a change along is not charged
/// ([`refund`](super::decide::refund)).
pub(super) const NOTICE_BURST: u32 = 8;

/// Notice-driven calls are at least a heartbeat over this apart (8 ms at the default TTL):
/// notices that come meanwhile (every member acknowledging a view within milliseconds) are
/// answered by one call.
pub(super) const NOTICE_GAP_DIVISOR: u32 = 256;

/// Notices of the acknowledgements alone are answered at least a heartbeat over this apart (31 ms
/// at the default TTL), outside the budget of the others: see
/// [`acks_due`](super::decide::acks_due).
pub(super) const ACK_GAP_DIVISOR: u32 = 64;

/// The member's subscriptions, one per directory it may look at early.
pub(super) struct Notices {
    /// The view directory: a published view or a settled mark.
    views: Notifications,
    /// The acknowledgements: for the member that settles.
    acks: Notifications,
    /// The slot records: a claim, a leave, a park.
    slots: Notifications,
    /// The standby records: a standby's own record marked by a leaving member.
    standbys: Option<Notifications>,
    /// The directories of the notices heard and not yet answered.
    pub(super) held: Seen,
    /// The budget of notice-driven calls: its theoretical arrival time (see
    /// [`charge`](super::decide::charge)).
    pub(super) tat: Option<Duration>,
    /// When the last notice-driven call was made (monotonic).
    pub(super) last: Option<Duration>,
    /// When the last call for notices of the acknowledgements alone was made (monotonic).
    pub(super) last_acks: Option<Duration>,
}

impl Notices {
    /// Subscribes to the group's directories on `store`; `standby` adds the standby directory.
    /// A store without native notifications hands out ones that never fire, so the member
    /// polls exactly as without. `None` when subscribing failed (said in a warning).
    pub(super) async fn subscribe(
        store: &DynStore,
        layout: &GroupLayout,
        standby: bool,
    ) -> Option<Notices> {
        let all = async {
            let views = store.subscribe(&layout.views).await?;
            let acks = store.subscribe(&layout.acks).await?;
            let slots = store.subscribe(&layout.slots).await?;
            let standbys = if standby {
                Some(store.subscribe(&layout.standbys).await?)
            } else {
                None
            };
            Ok::<_, crate::Error>(Notices {
                views,
                acks,
                slots,
                standbys,
                held: Seen::NONE,
                tat: None,
                last: None,
                last_acks: None,
            })
        };
        match all.await {
            Ok(n) if n.views.is_native() => Some(n),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(group = layout.group(), error = %e, "could not subscribe to the group's change notifications: polling at the heartbeat's pace");
                None
            }
        }
    }

    /// Waits for the next notice of a directory in `among`; the others stay pending (and
    /// coalesced), so a member is not woken for changes it would not act on. Cancel-safe, and
    /// biased in a fixed order so a simulation run is reproducible.
    pub(super) async fn next_among(&mut self, among: Seen) -> Seen {
        let views = recv_if(Some(&mut self.views), among.has(Seen::VIEWS));
        let acks = recv_if(Some(&mut self.acks), among.has(Seen::ACKS));
        let slots = recv_if(Some(&mut self.slots), among.has(Seen::SLOTS));
        let standbys = recv_if(self.standbys.as_mut(), among.has(Seen::STANDBYS));
        tokio::select! {
            biased;
            () = views => Seen::VIEWS,
            () = acks => Seen::ACKS,
            () = slots => Seen::SLOTS,
            () = standbys => Seen::STANDBYS,
        }
    }

    /// The directories with a notice pending, without waiting (and taking them).
    pub(super) fn pending(&mut self) -> Seen {
        let mut seen = Seen::NONE;
        if self.views.try_recv().is_some() {
            seen = seen | Seen::VIEWS;
        }
        if self.acks.try_recv().is_some() {
            seen = seen | Seen::ACKS;
        }
        if self.slots.try_recv().is_some() {
            seen = seen | Seen::SLOTS;
        }
        if self
            .standbys
            .as_mut()
            .is_some_and(|n| n.try_recv().is_some())
        {
            seen = seen | Seen::STANDBYS;
        }
        seen
    }

    /// Stops hearing of the standby directory (the member no longer stands by).
    pub(super) fn drop_standbys(&mut self) {
        self.standbys = None;
    }
}

/// The next notice of `notifications` when `listened` (and there are some), else never.
async fn recv_if(notifications: Option<&mut Notifications>, listened: bool) {
    match notifications {
        Some(n) if listened => {
            n.recv().await;
        }
        _ => std::future::pending().await,
    }
}

/// How a wait of [`Runner::wait_or_notice`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waited {
    /// The time passed, or a notice of a directory waited on came.
    Woken,
    /// `stop` changed.
    Stopped,
}

impl Runner {
    /// Sleeps `d`, or less when a notice of a directory in `among` comes first (answered within
    /// the same budget as the heartbeat loop's, [`notice_due`], so a storm of them does not make
    /// the caller spin): the polls outside the heartbeat loop (a standby's renewals, an heir
    /// waiting for its slot) look early this way.
    pub(super) async fn wait_or_notice(
        &mut self,
        d: Duration,
        among: Seen,
        stop: &mut watch::Receiver<bool>,
    ) -> Waited {
        let clock = self.cfg.clock.clone();
        let heartbeat = self.cfg.heartbeat;
        let until = clock.monotonic() + d;
        let noticed = async {
            match &mut self.notices {
                Some(n) => {
                    n.next_among(among).await;
                    clock
                        .sleep_until(notice_due(n.tat, n.last, heartbeat))
                        .await;
                    let now = clock.monotonic();
                    n.tat = Some(charge(n.tat, now, heartbeat));
                    n.last = Some(now);
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = stop.changed() => Waited::Stopped,
            () = clock.sleep_until(until) => Waited::Woken,
            () = noticed => Waited::Woken,
        }
    }
}
