//! [`Timed`]: a [`Decorated`] store that records how long each primitive call takes. The
//! decorator itself ([`Decorated`], [`Hooks`]) lives in `headcount`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
pub use headcount::decorated::{Decorated, Hooks};
use headcount::{DynStore, Op, Result};

/// The latencies of every primitive call (successful or not), by primitive name
/// ([`Op::name`]), for every [`Op`] but [`Op::Durability`]: the durability probe is not a
/// primitive and is not recorded.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    samples: Arc<Mutex<BTreeMap<&'static str, Vec<Duration>>>>,
}

#[async_trait]
impl Hooks for Latencies {
    async fn after(&self, op: Op, took: Duration) -> Result<()> {
        if op != Op::Durability {
            self.samples
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(op.name())
                .or_default()
                .push(took);
        }
        Ok(())
    }
}

impl Latencies {
    /// The durations recorded so far, by primitive.
    pub fn samples(&self) -> BTreeMap<&'static str, Vec<Duration>> {
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Wraps a store and records the latency of every primitive call ([`Latencies`]).
pub type Timed = Decorated<Latencies>;

/// A [`Timed`] store over `inner`.
pub fn timed(inner: DynStore) -> Timed {
    Decorated::with(inner, Latencies::default())
}
