//! Joining: [`IntervalIndexer::join`], and the [`IntervalPeer`] handle.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use super::health::list_health;
use super::layout::IntervalLayout;
use super::ownership::Shared;
use super::ticker::Ticker;
use super::time::wall;
use super::{
    interval_number, IntervalConfig, IntervalPhase, IntervalStatus, Ownership, Pair, PeerHealth,
    TaskGuard,
};
use crate::error::Result;
use crate::task::{Background, OnDrop};
use crate::DynStore;

/// Entry point of the recipe.
#[derive(Debug, Clone, Copy)]
pub struct IntervalIndexer;

impl IntervalIndexer {
    /// Validates `config`, ticks once at once (drawing the peer's index for the current
    /// interval if it is in that interval's first half on the peer's clock; otherwise the first
    /// draw waits for the next tick) and starts ticking in the background.
    ///
    /// Errors: [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a bad group, prefix,
    /// member id, interval, skew or capacity; [`Error::ForeignValue`](crate::Error::ForeignValue)
    /// when the current interval's counter holds something else; the store's own error when it
    /// cannot be reached.
    pub async fn join(store: DynStore, config: IntervalConfig) -> Result<IntervalPeer> {
        let space = config.check()?;
        let interval = config.interval;
        let skew = match config.skew {
            Some(s) => s,
            None => {
                let most = u64::try_from((interval * 7 / 16).as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(rand::random_range(0..most.max(1)))
            }
        };
        let member = match &config.member {
            Some(m) => m.clone(),
            None => format!("{:016x}", rand::random::<u64>()),
        };
        let clock = config.clock.clone();
        let shared = Arc::new(Shared {
            clock: clock.clone(),
            active: Mutex::new(None),
            in_flight: AtomicUsize::new(0),
            idle_until: Mutex::new(None),
        });
        let (status_tx, status_rx) = watch::channel(IntervalStatus {
            member: member.clone(),
            pair: None,
            phase: IntervalPhase::Warming,
            last_tick: None,
            last_error: None,
        });
        let mut ticker = Ticker {
            store: store.clone(),
            layout: IntervalLayout { space },
            interval,
            skew,
            capacity: u64::from(config.capacity),
            member: member.clone(),
            transition: config.transition,
            heartbeat: config.heartbeat,
            clock,
            shared: shared.clone(),
            status: status_tx,
            draw: None,
            pending: None,
            owed: BTreeSet::new(),
            last_tick: None,
            health_written: None,
        };
        let layout = ticker.layout.clone();
        let now = wall(ticker.clock.as_ref());
        ticker.tick(interval_number(now, interval)).await?;
        let what = format!("interval peer {member}");
        let task = Background::spawn(what, OnDrop::Abort, |stop| ticker.run(stop));
        Ok(IntervalPeer {
            ownership: Ownership {
                shared,
                status: status_rx,
            },
            member,
            skew,
            interval,
            store,
            layout,
            task,
        })
    }
}

/// One joined peer. Dropping it without [`leave`](IntervalPeer::leave) aborts its background task
/// as a crash would: nothing is acknowledged or deleted.
#[derive(Debug)]
pub struct IntervalPeer {
    ownership: Ownership,
    member: String,
    skew: Duration,
    interval: Duration,
    store: DynStore,
    layout: IntervalLayout,
    task: Background,
}

impl IntervalPeer {
    /// The member id.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// The constant skew after each interval start.
    pub fn skew(&self) -> Duration {
        self.skew
    }

    /// The interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// A cheap, cloneable handle deciding ownership, for the tasks that process work.
    pub fn ownership(&self) -> Ownership {
        self.ownership.clone()
    }

    /// See [`Ownership::pair`].
    pub fn pair(&self) -> Option<Pair> {
        self.ownership.pair()
    }

    /// See [`Ownership::should_process`].
    pub fn should_process(&self, task_id: u64) -> bool {
        self.ownership.should_process(task_id)
    }

    /// See [`Ownership::begin`].
    pub fn begin(&self, task_id: u64) -> Option<TaskGuard> {
        self.ownership.begin(task_id)
    }

    /// See [`Ownership::watch`].
    pub fn watch(&self) -> watch::Receiver<IntervalStatus> {
        self.ownership.watch()
    }

    /// See [`Ownership::status`].
    pub fn status(&self) -> IntervalStatus {
        self.ownership.status()
    }

    /// The monotonic instant (on the peer's clock) its background task sleeps until, or `None`
    /// while it is working. Tests driving a [`ManualClock`](crate::ManualClock) use it to know
    /// that a peer has done everything due at the current time: it is idle once this is later
    /// than the clock's monotonic time.
    pub fn idle_until(&self) -> Option<Duration> {
        *self
            .ownership
            .shared
            .idle_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The live peers of the group, from their health records (see [`live_peers`](super::live_peers)).
    pub async fn live_peers(&self) -> Result<Vec<PeerHealth>> {
        list_health(self.store.as_ref(), &self.layout.health_prefix()).await
    }

    /// Leaves gracefully: stops ticking and taking tasks, waits (up to one interval) for the
    /// in-flight tasks, acknowledges the transitions the others would wait for, and deletes the
    /// health record. Returns the first store error met on the way, if any.
    pub async fn leave(self) -> Result<()> {
        self.task.stop().await
    }
}
