//! Health checks: [`Health`], the [`Prober`] trait and the [`DefaultProber`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

#[cfg(feature = "grpc")]
use super::grpc;
use super::{heartbeat_key, Liveness, Service};
use crate::clock::{timeout, Clock, SystemClock};
use crate::DynStore;

/// The answer of a health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// It answered SERVING (or its heartbeat is live).
    Serving,
    /// It did not: why (timeout, refused, NOT_SERVING, no heartbeat, bad address).
    Down(String),
}

impl Health {
    /// Whether it is [`Health::Serving`].
    pub fn is_serving(&self) -> bool {
        matches!(self, Health::Serving)
    }
}

/// Checks whether a service is alive. The distributor calls it for every registered service
/// every poll, concurrently, and counts anything slower than the ping timeout as down.
#[async_trait]
pub trait Prober: Send + Sync + fmt::Debug {
    /// The health of `service` now.
    async fn check(&self, service: &Service) -> Health;
}

/// The default prober: gRPC health checks (with the `grpc` feature; without it a gRPC service
/// counts as down and says why) and heartbeat keys, each bounded by the ping timeout.
#[derive(Debug, Clone)]
pub struct DefaultProber {
    store: DynStore,
    timeout: Duration,
    clock: Arc<dyn Clock>,
}

impl DefaultProber {
    /// A prober reading heartbeats from `store`, giving each check `timeout`.
    pub fn new(store: DynStore, timeout: Duration) -> Self {
        DefaultProber {
            store,
            timeout,
            clock: Arc::new(SystemClock::new()),
        }
    }

    /// Times the heartbeat reads on `clock` instead of the system's (a gRPC check's network
    /// timeout stays on the system clock).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}

#[async_trait]
impl Prober for DefaultProber {
    async fn check(&self, service: &Service) -> Health {
        match &service.liveness {
            Err(why) => Health::Down(why.clone()),
            Ok(Liveness::Heartbeat) => {
                let key = heartbeat_key(&service.namespace, &service.name);
                match timeout(self.clock.as_ref(), self.timeout, self.store.get(&key)).await {
                    Some(Ok(Some(_))) => Health::Serving,
                    Some(Ok(None)) => Health::Down("no live heartbeat".into()),
                    Some(Err(e)) => Health::Down(format!("reading its heartbeat: {e}")),
                    None => Health::Down(format!(
                        "reading its heartbeat took longer than {:?}",
                        self.timeout
                    )),
                }
            }
            #[cfg(feature = "grpc")]
            Ok(Liveness::Grpc(address)) => grpc::check(address, self.timeout).await,
            #[cfg(not(feature = "grpc"))]
            Ok(Liveness::Grpc(_)) => Health::Down(
                "gRPC health checks need headcount's `grpc` cargo feature, which is not enabled"
                    .into(),
            ),
        }
    }
}
