//! An in-process stand-in for SIGSTOP: a [`Store`](headcount::Store) wrapper whose calls wait
//! while the peer is paused, and a gate its worker waits at, so a paused peer's lease passes on its clock while it
//! holds grants, and its late writes reach the sink when it resumes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use headcount::{DynStore, Op};
use headcount_conformance::{Decorated, Hooks};
use tokio::sync::watch;

/// Pauses one peer: its store calls and its worker.
#[derive(Debug)]
pub struct Gate {
    paused: watch::Sender<bool>,
    /// A pause asked for: the worker pauses the peer the next time it holds grants.
    requested: AtomicBool,
    /// Set by the worker when it froze while holding grants (the pause hit work in flight).
    froze_holding: AtomicBool,
}

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate {
            paused: watch::channel(false).0,
            requested: AtomicBool::new(false),
            froze_holding: AtomicBool::new(false),
        })
    }

    /// Asks for a pause that takes effect when the worker next holds grants (see
    /// [`Gate::pause_if_requested`]), so the pause always catches work in flight.
    pub fn request_pause(&self) {
        self.requested.store(true, Ordering::SeqCst);
    }

    /// Called by the worker while it holds grants: pauses the store and the worker if asked.
    pub fn pause_if_requested(&self) {
        if self.requested.swap(false, Ordering::SeqCst) {
            self.paused.send_replace(true);
        }
    }

    pub fn resume(&self) {
        self.requested.store(false, Ordering::SeqCst);
        self.paused.send_replace(false);
    }

    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Waits while paused; `holding` says the caller holds grants (recorded for the summary).
    pub async fn wait(&self, holding: bool) {
        let mut rx = self.paused.subscribe();
        if *rx.borrow_and_update() {
            if holding {
                self.froze_holding.store(true, Ordering::SeqCst);
            }
            // The sender lives as long as `self`, so this only ends on resume.
            let _ = rx.wait_for(|p| !*p).await;
        }
    }

    pub fn froze_holding(&self) -> bool {
        self.froze_holding.load(Ordering::SeqCst)
    }
}

/// The hooks of a paused peer's store: every call but the durability probe first waits at the
/// peer's [`Gate`].
#[derive(Debug)]
pub struct PausableStore {
    gate: Arc<Gate>,
}

impl PausableStore {
    pub fn wrap(inner: DynStore, gate: Arc<Gate>) -> DynStore {
        Arc::new(Decorated::with(inner, PausableStore { gate }))
    }
}

#[async_trait]
impl Hooks for PausableStore {
    async fn before(&self, op: Op) -> headcount::Result<()> {
        if op != Op::Durability {
            self.gate.wait(false).await;
        }
        Ok(())
    }
}
