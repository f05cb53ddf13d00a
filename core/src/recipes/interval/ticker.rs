//! The background task: ticks, the sealed count, the transition and its acknowledgements.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tracing::Instrument;

use super::health::health_value;
use super::layout::{IntervalLayout, KEY_INTERVALS};
use super::ownership::{Active, Shared};
use super::time::{interval_start, wall};
use super::{interval_number, IntervalPhase, IntervalStatus, Pair};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::store::parse_counter;
use crate::DynStore;

/// A count of peers' capacities read at `key`: a decimal integer of at least 1.
fn parse_count(key: &str, text: &str) -> Result<u64> {
    match parse_counter(key, text).map(u64::try_from) {
        Ok(Ok(count)) if count >= 1 => Ok(count),
        Ok(_) => Err(Error::foreign(key, "a count of at least 1", text)),
        Err(e) => Err(e),
    }
}

/// The slots a peer drew in one interval.
#[derive(Debug, Clone, Copy)]
pub(super) struct Draw {
    epoch: u64,
    first: u64,
    /// The counter's value after the increment: the last slot drawn.
    last: u64,
    /// The reply came too late to be sure the increment landed before the interval's count was
    /// sealed: the draw gives no pair, and its acknowledgement is owed only if the seal counts it.
    late: bool,
}

impl Draw {
    /// Whether the sealed count of the draw's interval includes this draw. Increments are
    /// atomic, so a draw is either wholly below the sealed value or wholly above it.
    fn counted_in(&self, sealed: u64) -> bool {
        self.last <= sealed
    }
}

/// A new pair waiting for the drain and the acknowledgements.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    pair: Pair,
    since: Duration,
}

pub(super) struct Ticker {
    pub(super) store: DynStore,
    pub(super) layout: IntervalLayout,
    pub(super) interval: Duration,
    pub(super) skew: Duration,
    pub(super) capacity: u64,
    pub(super) member: String,
    pub(super) transition: bool,
    pub(super) heartbeat: bool,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) shared: Arc<Shared>,
    pub(super) status: watch::Sender<IntervalStatus>,
    pub(super) draw: Option<Draw>,
    pub(super) pending: Option<Pending>,
    /// Intervals whose transition this peer still has to acknowledge.
    pub(super) owed: BTreeSet<u64>,
    pub(super) last_tick: Option<u64>,
    pub(super) health_written: Option<String>,
}

impl Ticker {
    fn ttl(&self) -> Duration {
        self.interval * KEY_INTERVALS
    }

    fn poll_period(&self) -> Duration {
        (self.interval / 20).max(Duration::from_millis(1))
    }

    /// The wall time of the tick of interval `n`: its start plus the skew.
    fn tick_time(&self, n: u64) -> Duration {
        interval_start(n, self.interval) + self.skew
    }

    /// How long a pair of interval `n` stays valid on this peer's clock: a quarter interval past
    /// the tick that should replace it.
    fn valid_until(&self, n: u64) -> Duration {
        self.tick_time(n.saturating_add(1)) + self.interval / 4
    }

    fn publish(&self, f: impl FnOnce(&mut IntervalStatus)) {
        self.status.send_if_modified(|s| {
            let before = s.clone();
            f(s);
            *s != before
        });
    }

    fn set_error(&self, e: &Error) {
        let message = e.to_string();
        tracing::warn!(member = %self.member, error = %message, "interval tick failed");
        self.publish(|s| {
            s.last_error = Some(message);
            if s.phase != IntervalPhase::Stopped {
                s.phase = IntervalPhase::Faulted;
            }
        });
    }

    fn set_idle(&self, until: Option<Duration>) {
        *self
            .shared
            .idle_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = until;
    }

    pub(super) async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<()> {
        loop {
            let next = self.last_tick.map_or(1, |n| n.saturating_add(1));
            let now_wall = wall(self.clock.as_ref());
            let until_tick = self.tick_time(next).saturating_sub(now_wall);
            let mut nap = until_tick.min(self.interval / 4);
            if self.pending.is_some() || !self.owed.is_empty() {
                nap = nap.min(self.poll_period());
            }
            let deadline = self.clock.monotonic() + nap.max(Duration::from_nanos(1));
            self.set_idle(Some(deadline));
            tokio::select! {
                _ = self.clock.sleep_until(deadline) => {}
                _ = stop.changed() => break,
            }
            self.set_idle(None);
            if *stop.borrow() {
                break;
            }
            let now_wall = wall(self.clock.as_ref());
            if now_wall >= self.tick_time(next) {
                let n = interval_number(now_wall, self.interval);
                let span = tracing::debug_span!(
                    "interval.tick",
                    group = self.layout.space.group(),
                    interval = n
                );
                let ticked = self.tick(n).instrument(span).await;
                let result = if ticked.is_ok() { "ok" } else { "error" };
                ::metrics::counter!(crate::metrics::INTERVAL_TICKS, "result" => result)
                    .increment(1);
                if let Err(e) = ticked {
                    self.set_error(&e);
                }
            } else {
                self.progress().await;
            }
        }
        self.set_idle(None);
        self.leave().await
    }

    /// One tick of interval `n`. Errors only when the round trip itself failed or the counter is
    /// foreign; the caller reports them.
    pub(super) async fn tick(&mut self, n: u64) -> Result<()> {
        let joining = self.last_tick.is_none();
        self.last_tick = Some(n);
        self.publish(|s| s.last_tick = Some(n));
        let previous = self.draw.take().filter(|d| d.epoch + 1 == n);
        // Where this tick ends without reading the sealed count of `n - 1`: a draw whose reply
        // came in time is in that count (see `late` below), so it owes `n`'s acknowledgement; a
        // late one may not be, and an acknowledgement from a peer the count leaves out would let
        // the others activate before a counted peer let go.
        let owes_unsealed = previous.is_some_and(|d| !d.late);
        let start = interval_start(n, self.interval);
        if wall(self.clock.as_ref()) >= start + self.interval / 2 {
            // Too late to draw in `n`: the reply could not arrive before the count of `n` is
            // sealed. No draw for `n` (the next tick draws); like a failed tick, the active pair
            // stays until it expires and `n`'s acknowledgement is owed.
            if owes_unsealed {
                self.owed.insert(n);
            }
            let message = format!(
                "the tick of interval {n} ran in the second half of the interval; skipped drawing in it"
            );
            return self.skip(n, joining, message).await;
        }
        let by = i64::try_from(self.capacity).unwrap_or(1);
        let result = self
            .store
            .incr_and_get(
                &self.layout.counter(n),
                by,
                Some(self.ttl()),
                &self.layout.seal(n.saturating_sub(1)),
            )
            .await;
        let (value, sealed) = match result {
            Ok(r) => r,
            Err(e) => {
                // Whether the increment applied is unknown: no draw for `n`. The active pair
                // stays until it expires on its own; the acknowledgement of `n` is owed once it
                // is given up.
                if owes_unsealed {
                    self.owed.insert(n);
                }
                self.pending = None;
                return Err(e);
            }
        };
        let counter = self.layout.counter(n);
        let first = value.saturating_sub(by).saturating_add(1);
        if first < 1 {
            return Err(Error::foreign(
                &counter,
                "a counter that only ever grows from 0",
                &value.to_string(),
            ));
        }
        // The count of `n` is sealed by the first peer that ticks `n + 1`, at the earliest at the
        // start of `n + 1` on its clock, so no earlier than `start + 3I/4` on ours (clocks within
        // a quarter interval). A reply before that proves the increment is in the seal; a later
        // one (a stalled connection, a paused process) proves nothing: the draw gives no pair,
        // and this tick adopts none either, since the others' next transition may not wait for
        // us.
        let late = wall(self.clock.as_ref()) >= start + self.interval * 3 / 4;
        self.draw = Some(Draw {
            epoch: n,
            first: u64::try_from(first).unwrap_or(0),
            last: u64::try_from(value).unwrap_or(0),
            late,
        });
        if late {
            if owes_unsealed {
                self.owed.insert(n);
            }
            let message = format!(
                "the store answered the tick of interval {n} after three quarters of the \
                 interval; took no pair from it"
            );
            return self.skip(n, joining, message).await;
        }

        // The pair needs our draw of n - 1 and that interval's sealed count.
        let pair = match previous {
            None => Ok(None),
            Some(prev) => match self.sealed_count(n - 1, sealed).await {
                Ok(count) => {
                    if prev.counted_in(count) {
                        self.owed.insert(n);
                    }
                    if prev.late || !prev.counted_in(count) {
                        // Drawn after the count was sealed: no slot this interval.
                        Ok(None)
                    } else {
                        Ok(Some(Pair {
                            epoch: n,
                            index: prev.first,
                            replicas: count,
                            capacity: self.capacity,
                        }))
                    }
                }
                Err(e) => {
                    if owes_unsealed {
                        self.owed.insert(n);
                    }
                    Err(e)
                }
            },
        };
        self.pending = None;
        let outcome = match pair {
            Ok(Some(pair)) => {
                self.adopt(pair).await;
                Ok(())
            }
            Ok(None) => {
                self.deactivate();
                self.publish(|s| {
                    s.phase = IntervalPhase::Warming;
                    s.last_error = None;
                });
                Ok(())
            }
            Err(e) => {
                // Not confirmed: stop owning, keep the last pair in the status.
                self.deactivate();
                Err(e)
            }
        };
        self.progress().await;
        if self.heartbeat {
            let pair = self.shared.current().or(self.pending.map(|p| p.pair));
            if let Err(e) = self.write_health(n, pair).await {
                tracing::warn!(member = %self.member, error = %e, "health heartbeat failed");
            }
        }
        outcome
    }

    /// Ends a tick of `n` that takes no pair: the active pair stays until it expires, a pending
    /// one is dropped, and the status says why (except on the joining tick).
    async fn skip(&mut self, n: u64, joining: bool, message: String) -> Result<()> {
        self.pending = None;
        if !joining {
            tracing::warn!(member = %self.member, "{message}");
            self.publish(|s| {
                s.last_error = Some(message);
                if s.phase != IntervalPhase::Stopped {
                    s.phase = if s.pair.is_some() {
                        IntervalPhase::Faulted
                    } else {
                        IntervalPhase::Warming
                    };
                }
            });
        }
        self.progress().await;
        if self.heartbeat {
            let pair = self.shared.current();
            if let Err(e) = self.write_health(n, pair).await {
                tracing::warn!(member = %self.member, error = %e, "health heartbeat failed");
            }
        }
        Ok(())
    }

    /// The count of interval `m`, sealed: the first peer to need it after `m` copies the counter
    /// into the seal key (create-if-absent), and every peer uses the seal, so an increment that
    /// lands late (after some peer read the counter) cannot give two peers pairs of one epoch
    /// from different counts. `read` is the seal as the tick's round trip read it.
    async fn sealed_count(&self, m: u64, read: Option<String>) -> Result<u64> {
        let seal = self.layout.seal(m);
        let text = match read {
            Some(text) => text,
            None => {
                let counter = self.layout.counter(m);
                let Some(text) = self.store.get(&counter).await? else {
                    return Err(Error::contended(
                        &counter,
                        format!(
                            "the counter of interval {m} vanished before interval {} read it \
                             (expired or deleted)",
                            m + 1
                        ),
                    ));
                };
                let count = parse_count(&counter, &text)?;
                if self
                    .store
                    .compare_and_set(&seal, None, &count.to_string(), Some(self.ttl()))
                    .await?
                {
                    return Ok(count);
                }
                self.store.get(&seal).await?.ok_or_else(|| {
                    Error::contended(
                        &seal,
                        format!("the sealed count of interval {m} vanished as it was read"),
                    )
                })?
            }
        };
        parse_count(&seal, &text)
    }

    fn deactivate(&self) {
        self.shared.set_active(None);
    }

    async fn adopt(&mut self, pair: Pair) {
        let valid_until = self.valid_until(pair.epoch);
        // Only a pair still valid on our clock counts: it was confirmed at the previous tick, so
        // it is interval n - 1's, disjoint from both n - 1's and n's other pairs. An expired one
        // goes through the full transition.
        let unchanged = self
            .shared
            .current()
            .is_some_and(|a| a.same_ownership(&pair));
        if unchanged || !self.transition {
            self.shared.set_active(Some(Active { pair, valid_until }));
            self.publish(|s| {
                s.pair = Some(pair);
                s.phase = IntervalPhase::Active;
                s.last_error = None;
            });
            return;
        }
        self.deactivate();
        self.pending = Some(Pending {
            pair,
            since: self.clock.monotonic(),
        });
        self.publish(|s| {
            s.pair = Some(pair);
            s.phase = IntervalPhase::Draining;
            s.last_error = None;
        });
    }

    /// Sends the acknowledgements owed once drained, and activates a pending pair once every
    /// peer acknowledged (or, when this peer's next tick has not run one interval after it
    /// adopted the pair, then).
    async fn progress(&mut self) {
        if !self.owed.is_empty() {
            let active = self.shared.current();
            let idle = self.shared.in_flight.load(Ordering::SeqCst) == 0;
            let owed: Vec<u64> = self.owed.iter().copied().collect();
            for n in owed {
                // An active pair adopted at or after `n` owns what interval `n`'s pairs say, so
                // neither it nor its in-flight tasks conflict; anything older must be drained.
                let may = match active {
                    Some(a) => a.epoch >= n,
                    None => idle,
                };
                if !may {
                    continue;
                }
                // An acknowledgement is an increment: sent at most once, never retried, since a
                // failure may have applied it. A lost one only makes the others wait for the
                // next interval.
                self.owed.remove(&n);
                if let Err(e) = self.ack(n).await {
                    self.set_error(&e);
                    break;
                }
            }
        }
        let Some(pending) = self.pending else {
            return;
        };
        if self.owed.contains(&pending.pair.epoch) {
            return;
        }
        self.publish(|s| s.phase = IntervalPhase::Waiting);
        let timed_out = self.clock.monotonic().saturating_sub(pending.since) >= self.interval;
        let all_acked = if timed_out {
            false
        } else {
            match self.acks(pending.pair.epoch).await {
                Ok(acks) => acks >= pending.pair.replicas,
                Err(e) => {
                    self.set_error(&e);
                    false
                }
            }
        };
        if all_acked || timed_out {
            if timed_out {
                tracing::warn!(
                    member = %self.member,
                    epoch = pending.pair.epoch,
                    "not every peer acknowledged the transition within an interval; taking the new pair"
                );
            }
            let valid_until = self.valid_until(pending.pair.epoch);
            self.shared.set_active(Some(Active {
                pair: pending.pair,
                valid_until,
            }));
            self.pending = None;
            self.publish(|s| {
                s.pair = Some(pending.pair);
                s.phase = IntervalPhase::Active;
            });
        }
    }

    async fn ack(&self, n: u64) -> Result<()> {
        let by = i64::try_from(self.capacity).unwrap_or(1);
        self.store
            .incr_and_get(
                &self.layout.transition(n),
                by,
                Some(self.ttl()),
                &self.layout.counter(n),
            )
            .await
            .map(|_| ())
    }

    async fn acks(&self, n: u64) -> Result<u64> {
        let key = self.layout.transition(n);
        match self.store.get(&key).await? {
            None => Ok(0),
            Some(text) => {
                let v = parse_counter(&key, &text)?;
                Ok(u64::try_from(v).unwrap_or(0))
            }
        }
    }

    async fn write_health(&mut self, epoch: u64, pair: Option<Pair>) -> Result<()> {
        let key = self.layout.health(&self.member);
        let value = health_value(epoch, pair, self.capacity);
        let ttl = Some(self.interval * 2);
        let expected = self.health_written.clone();
        let mut wrote = self
            .store
            .compare_and_set(&key, expected.as_deref(), &value, ttl)
            .await?;
        if !wrote && expected.is_some() {
            wrote = self.store.compare_and_set(&key, None, &value, ttl).await?;
        }
        if !wrote {
            // Someone else's value at our key: take it over.
            if let Some(current) = self.store.get(&key).await? {
                wrote = self
                    .store
                    .compare_and_set(&key, Some(&current), &value, ttl)
                    .await?;
            }
        }
        self.health_written = wrote.then_some(value);
        Ok(())
    }

    async fn leave(mut self) -> Result<()> {
        self.deactivate();
        self.pending = None;
        // Wait for the in-flight tasks, at most one interval.
        let give_up = self.clock.monotonic() + self.interval;
        while self.shared.in_flight.load(Ordering::SeqCst) > 0 && self.clock.monotonic() < give_up {
            self.clock.sleep(self.poll_period()).await;
        }
        // A late draw may be missing from its interval's sealed count: acknowledging for it
        // could stand in for a counted peer, so the others wait for the counters to stop
        // counting this peer instead.
        if let Some(draw) = self.draw.filter(|d| !d.late) {
            self.owed.insert(draw.epoch.saturating_add(1));
        }
        let mut first_error = None;
        for n in std::mem::take(&mut self.owed) {
            if let Err(e) = self.ack(n).await {
                first_error.get_or_insert(e);
            }
        }
        if self.heartbeat {
            if let Err(e) = self.store.delete(&self.layout.health(&self.member)).await {
                first_error.get_or_insert(e);
            }
        }
        self.publish(|s| s.phase = IntervalPhase::Stopped);
        match first_error {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}
