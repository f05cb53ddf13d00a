//! Deciding ownership: the pair a peer takes tasks under, [`Ownership`] and [`TaskGuard`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use super::time::wall;
use super::{IntervalStatus, Pair};
use crate::clock::Clock;

/// The pair a peer takes tasks under, and until when on its own clock.
#[derive(Debug, Clone, Copy)]
pub(super) struct Active {
    pub(super) pair: Pair,
    pub(super) valid_until: Duration,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) clock: Arc<dyn Clock>,
    pub(super) active: Mutex<Option<Active>>,
    pub(super) in_flight: AtomicUsize,
    pub(super) idle_until: Mutex<Option<Duration>>,
}

impl Shared {
    pub(super) fn active(&self) -> std::sync::MutexGuard<'_, Option<Active>> {
        self.active.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn set_active(&self, active: Option<Active>) {
        *self.active() = active;
    }

    pub(super) fn current(&self) -> Option<Pair> {
        let now = wall(self.clock.as_ref());
        self.active()
            .filter(|a| now < a.valid_until)
            .map(|a| a.pair)
    }
}

/// Decides ownership for one peer; cheap to clone and share between tasks.
#[derive(Debug, Clone)]
pub struct Ownership {
    pub(super) shared: Arc<Shared>,
    pub(super) status: watch::Receiver<IntervalStatus>,
}

impl Ownership {
    /// The pair the peer takes tasks under right now: `None` while warming up, during a
    /// transition, after its pair expired unconfirmed, or once stopped.
    pub fn pair(&self) -> Option<Pair> {
        self.shared.current()
    }

    /// Whether this peer should process `task_id` now (see [`Pair::owns`]). False whenever
    /// [`pair`](Self::pair) is `None` and for a peer whose index is above `replicas`.
    pub fn should_process(&self, task_id: u64) -> bool {
        self.pair().is_some_and(|p| p.owns(task_id))
    }

    /// Like [`should_process`](Self::should_process), and registers the task as in flight until
    /// the returned guard is dropped: a transition waits for it before acknowledging.
    pub fn begin(&self, task_id: u64) -> Option<TaskGuard> {
        let now = wall(self.shared.clock.as_ref());
        let active = self.shared.active();
        let pair = active.filter(|a| now < a.valid_until)?.pair;
        if !pair.owns(task_id) {
            return None;
        }
        // Counted under the lock the transition takes to deactivate the pair, so it either sees
        // this task or we see no pair.
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        drop(active);
        Some(TaskGuard {
            shared: self.shared.clone(),
            task_id,
            epoch: pair.epoch,
        })
    }

    /// How many tasks are in flight (guards not yet dropped).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// A receiver of the peer's status, updated on every change.
    pub fn watch(&self) -> watch::Receiver<IntervalStatus> {
        self.status.clone()
    }

    /// The current status.
    pub fn status(&self) -> IntervalStatus {
        self.status.borrow().clone()
    }
}

/// A task taken with [`Ownership::begin`]; dropping it marks the task finished.
#[derive(Debug)]
pub struct TaskGuard {
    shared: Arc<Shared>,
    task_id: u64,
    epoch: u64,
}

impl TaskGuard {
    /// The task.
    pub fn task_id(&self) -> u64 {
        self.task_id
    }

    /// The epoch of the pair the task was taken under: a fencing token for the sink.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
