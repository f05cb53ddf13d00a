//! An in-process stand-in for SIGSTOP: a [`Store`] wrapper whose calls wait while the peer is
//! paused, and a gate its worker waits at, so a paused peer's lease passes on its clock while it
//! holds grants, and its late writes reach the sink when it resumes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use headcount::store::{Capabilities, Durability};
use headcount::{DynStore, Result, Store};
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

/// A store whose every call first waits at the peer's [`Gate`].
#[derive(Debug)]
pub struct PausableStore {
    inner: DynStore,
    gate: Arc<Gate>,
}

impl PausableStore {
    pub fn wrap(inner: DynStore, gate: Arc<Gate>) -> DynStore {
        Arc::new(PausableStore { inner, gate })
    }
}

#[async_trait]
impl Store for PausableStore {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        self.gate.wait(false).await;
        self.inner.incr(key, ttl).await
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        self.gate.wait(false).await;
        self.inner.get(key).await
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        self.gate.wait(false).await;
        self.inner.expire(key, ttl).await
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        self.gate.wait(false).await;
        self.inner.compare_and_set(key, expected, new, ttl).await
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        self.gate.wait(false).await;
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        self.gate.wait(false).await;
        self.inner.list(prefix).await
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        self.gate.wait(false).await;
        self.inner.set_max(key, value, ttl).await
    }

    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> Result<(i64, Option<String>)> {
        self.gate.wait(false).await;
        self.inner.incr_and_get(incr_key, by, ttl, get_key).await
    }

    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        self.gate.wait(false).await;
        self.inner.renew_and_list(key, holder, ttl, prefix).await
    }

    async fn durability(&self) -> Result<Durability> {
        self.inner.durability().await
    }
}
