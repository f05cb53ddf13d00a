//! A [`Store`] decorator that records how long each primitive call takes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use headcount::{Capabilities, DynStore, Result, Store};

/// Wraps a store and records the latency of every primitive call (successful or not), by
/// primitive name: `incr`, `get`, `expire`, `compare_and_set`, `delete`, `list`, `set_max`,
/// `incr_and_get`.
///
/// `set_max` and `incr_and_get` are forwarded to the inner store's own methods, so a native
/// one-round-trip override is measured as such.
#[derive(Debug, Clone)]
pub struct Timed {
    inner: DynStore,
    samples: Arc<Mutex<BTreeMap<&'static str, Vec<Duration>>>>,
}

impl Timed {
    /// Wraps `inner`.
    pub fn new(inner: DynStore) -> Self {
        Timed {
            inner,
            samples: Arc::default(),
        }
    }

    /// The durations recorded so far, by primitive.
    pub fn samples(&self) -> BTreeMap<&'static str, Vec<Duration>> {
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn record(&self, primitive: &'static str, took: Duration) {
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(primitive)
            .or_default()
            .push(took);
    }

    async fn time<T>(
        &self,
        primitive: &'static str,
        call: impl std::future::Future<Output = T>,
    ) -> T {
        let start = Instant::now();
        let out = call.await;
        self.record(primitive, start.elapsed());
        out
    }
}

#[async_trait]
impl Store for Timed {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn incr(&self, key: &str, ttl: Option<Duration>) -> Result<i64> {
        self.time("incr", self.inner.incr(key, ttl)).await
    }

    async fn get(&self, key: &str) -> Result<Option<String>> {
        self.time("get", self.inner.get(key)).await
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool> {
        self.time("expire", self.inner.expire(key, ttl)).await
    }

    async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        ttl: Option<Duration>,
    ) -> Result<bool> {
        self.time(
            "compare_and_set",
            self.inner.compare_and_set(key, expected, new, ttl),
        )
        .await
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        self.time("delete", self.inner.delete(key)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        self.time("list", self.inner.list(prefix)).await
    }

    async fn set_max(&self, key: &str, value: i64, ttl: Option<Duration>) -> Result<bool> {
        self.time("set_max", self.inner.set_max(key, value, ttl))
            .await
    }

    async fn incr_and_get(
        &self,
        incr_key: &str,
        by: i64,
        ttl: Option<Duration>,
        get_key: &str,
    ) -> Result<(i64, Option<String>)> {
        self.time(
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
        self.time(
            "renew_and_list",
            self.inner.renew_and_list(key, holder, ttl, prefix),
        )
        .await
    }

    async fn durability(&self) -> Result<headcount::Durability> {
        self.inner.durability().await
    }
}
