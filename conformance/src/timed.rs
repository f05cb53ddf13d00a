//! Store decorators: [`Decorated`] forwards every [`Store`] call to an inner store and runs
//! [`Hooks`] around it; [`Timed`] is the one that records how long each primitive call takes.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use headcount::{Capabilities, Durability, DynStore, Result, Store};

/// What a [`Decorated`] store does around every call it forwards. `op` is the method's name:
/// `incr`, `get`, `expire`, `compare_and_set`, `delete`, `list`, `set_max`, `incr_and_get`,
/// `renew_and_list`, `durability` (`capabilities` is forwarded without hooks).
#[async_trait]
pub trait Hooks: Send + Sync + Debug + 'static {
    /// Runs before the call goes to the inner store (a pause can wait here).
    async fn before(&self, _op: &'static str) {}

    /// Runs after the inner store answered (successfully or not), `took` after `before`.
    fn after(&self, _op: &'static str, _took: Duration) {}
}

/// A store that forwards every call to `inner`, each of the provided methods (`set_max`,
/// `incr_and_get`, `renew_and_list`, `durability`) to the inner store's own, so a backend's native
/// override is what runs, with its [`Hooks`] around each.
#[derive(Debug, Clone)]
pub struct Decorated<H> {
    inner: DynStore,
    hooks: H,
}

impl<H: Hooks> Decorated<H> {
    /// Wraps `inner`.
    pub fn with(inner: DynStore, hooks: H) -> Self {
        Decorated { inner, hooks }
    }

    /// The hooks.
    pub fn hooks(&self) -> &H {
        &self.hooks
    }

    async fn call<T>(&self, op: &'static str, call: impl Future<Output = T>) -> T {
        self.hooks.before(op).await;
        let start = Instant::now();
        let out = call.await;
        self.hooks.after(op, start.elapsed());
        out
    }
}

#[async_trait]
impl<H: Hooks> Store for Decorated<H> {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        self.call("incr", self.inner.incr(key, ttl)).await
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        self.call("get", self.inner.get(key)).await
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        self.call("expire", self.inner.expire(key, ttl)).await
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        self.call(
            "compare_and_set",
            self.inner.compare_and_set(key, expected, new, ttl),
        )
        .await
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        self.call("delete", self.inner.delete(key)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        self.call("list", self.inner.list(prefix)).await
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        self.call("set_max", self.inner.set_max(key, value, ttl))
            .await
    }

    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> Result<(i64, Option<String>)> {
        self.call(
            "incr_and_get",
            self.inner.incr_and_get(incr_key, by, ttl, get_key),
        )
        .await
    }

    async fn renew_and_list(
        &self,
        key: &str,
        holder: &str,
        ttl: Duration,
        prefix: &str,
    ) -> Result<(bool, Vec<(String, String)>)> {
        self.call(
            "renew_and_list",
            self.inner.renew_and_list(key, holder, ttl, prefix),
        )
        .await
    }

    async fn durability(&self) -> Result<Durability> {
        self.call("durability", self.inner.durability()).await
    }
}

/// The latencies of every primitive call (successful or not), by primitive name: `incr`, `get`,
/// `expire`, `compare_and_set`, `delete`, `list`, `set_max`, `incr_and_get`, `renew_and_list`.
/// The durability probe is not a primitive and is not recorded.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    samples: Arc<Mutex<BTreeMap<&'static str, Vec<Duration>>>>,
}

impl Hooks for Latencies {
    fn after(&self, op: &'static str, took: Duration) {
        if op == "durability" {
            return;
        }
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(op)
            .or_default()
            .push(took);
    }
}

/// Wraps a store and records the latency of every primitive call ([`Latencies`]).
pub type Timed = Decorated<Latencies>;

impl Timed {
    /// Wraps `inner`.
    pub fn new(inner: DynStore) -> Self {
        Decorated::with(inner, Latencies::default())
    }

    /// The durations recorded so far, by primitive.
    pub fn samples(&self) -> BTreeMap<&'static str, Vec<Duration>> {
        self.hooks
            .samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
