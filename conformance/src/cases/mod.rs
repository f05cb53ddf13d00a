//! The conformance cases: plain `async fn name(ctx: &Ctx) -> CaseResult` over `&dyn Store`.
//!
//! Every case writes only keys under [`Ctx::prefix`] (through [`Ctx::key`]), so any number of
//! cases run in parallel on one store. The list of cases, with what each proves, is
//! [`crate::CASES`].
//!
//! Time: cases that need a key to expire poll with a deadline instead of sleeping a fixed time;
//! the only plain waits are the polling interval and "until this instant has passed" when a case
//! must show that a key outlives an old expiry.

mod cas;
mod counters;
mod durability;
mod faults;
mod group;
pub mod interval;
mod keys;
mod listing;
mod membership;
mod notify;
mod set_max;
mod ttl;

pub use cas::*;
pub use counters::*;
pub use durability::*;
pub use faults::*;
pub use group::*;
pub use interval::{
    incr_and_get_fused, interval_article_timeline, interval_bad_input_rejected,
    interval_foreign_previous_count_reported, interval_outage_keeps_then_expires_pair,
    interval_scale_exactly_once, interval_skewed_peers_converge, interval_weighted_capacity,
};
pub use keys::*;
pub use listing::*;
pub use membership::*;
pub use notify::*;
pub use set_max::*;
pub use ttl::*;

use std::time::Duration;

use tokio::time::Instant;

use crate::{ensure, CaseResult, Ctx, Failure, ResultExt};

/// The TTL cases use for keys they wait to see expire: short, so the suite is quick, and long
/// enough that a read can complete within it on a loaded machine.
pub const SHORT_TTL: Duration = Duration::from_millis(300);

/// How often a case polls while waiting for a key to expire.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// What [`expect_expiry`] saw.
#[derive(Debug, Clone, Copy)]
pub struct Expiry {
    /// Reads that completed before `sent + ttl` (and so had to see the key).
    pub reads_within_ttl: usize,
    /// From the write's completion to the start of the first read that found the key gone.
    pub gone_after: Duration,
}

/// Writes `value` at the absent `key` with CAS and returns when the write was sent and completed.
pub async fn put(
    ctx: &Ctx,
    key: &str,
    value: &str,
    ttl: Option<Duration>,
) -> Result<(Instant, Instant), Failure> {
    let sent = Instant::now();
    let wrote = ctx
        .store
        .compare_and_set(key, None, value, ttl)
        .await
        .during(format!(
            "compare_and_set({key:?}, None, {value:?}, {ttl:?})"
        ))?;
    let done = Instant::now();
    ensure!(
        wrote,
        "compare_and_set({key:?}, None, {value:?}) on a fresh key returned false"
    );
    Ok((sent, done))
}

/// Polls `key` until it is gone, checking the TTL on the store's clock:
///
/// * every read that *completes* before `sent + effective_ttl` must see `value`;
/// * every read *sent* after `done + effective_ttl + tolerance` must see nothing;
/// * once gone, the key stays gone.
///
/// `sent` and `done` bound the write that set the TTL, so the store's own instant of writing lies
/// between them whatever the latency.
pub async fn expect_expiry(
    ctx: &Ctx,
    key: &str,
    value: &str,
    sent: Instant,
    done: Instant,
    ttl: Duration,
) -> Result<Expiry, Failure> {
    let ttl = ctx.caps().effective_ttl(ttl);
    let tolerance = ctx.tolerance();
    let mut reads_within_ttl = 0;
    loop {
        let read_sent = Instant::now();
        let got = ctx.store.get(key).await.during(format!("get({key:?})"))?;
        let read_done = Instant::now();
        match got {
            Some(v) => {
                ensure!(
                    v == value,
                    "get({key:?}) returned {v:?} while waiting for {value:?} to expire"
                );
                ensure!(
                    read_sent <= done + ttl + tolerance,
                    "{key:?} was still there for a read sent {:?} after the write completed: \
                     TTL {ttl:?} (effective), tolerance {tolerance:?}",
                    read_sent - done
                );
                if read_done < sent + ttl {
                    reads_within_ttl += 1;
                }
            }
            None => {
                ensure!(
                    read_done >= sent + ttl,
                    "{key:?} was gone for a read that completed {:?} after the write was sent: \
                     it expired at least {:?} before its TTL of {ttl:?} (effective). A key must \
                     never expire early; a backend that truncates timestamps to its granularity \
                     must round the expiry up",
                    read_done - sent,
                    (sent + ttl) - read_done
                );
                let again = ctx.store.get(key).await.during(format!("get({key:?})"))?;
                ensure!(
                    again.is_none(),
                    "{key:?} came back as {again:?} after it had expired"
                );
                return Ok(Expiry {
                    reads_within_ttl,
                    gone_after: read_sent.saturating_duration_since(done),
                });
            }
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Sleeps until `instant` has passed: used only to show that a key outlives an old expiry. A
/// plain sleep, with no condition; to poll a condition with a deadline, see [`crate::wait`].
pub async fn sleep_past(instant: Instant) {
    tokio::time::sleep_until(instant).await;
}

/// Checks that a result is an error of `kind`, naming the call.
pub fn expect_kind<T: std::fmt::Debug>(
    call: &str,
    result: headcount::Result<T>,
    kind: headcount::ErrorKind,
) -> CaseResult {
    match result {
        Err(e) if e.kind() == kind => Ok(()),
        Err(e) => Err(Failure::new(format!(
            "{call}: expected an error of kind {kind:?}, got {:?}: {e}",
            e.kind()
        ))),
        Ok(v) => Err(Failure::new(format!(
            "{call}: expected an error of kind {kind:?}, got Ok({v:?})"
        ))),
    }
}

/// Runs `task(i)` for `i in 0..n` as `n` concurrent tokio tasks (spawned, so they run on every
/// worker thread) that start together, and collects their results in order.
pub async fn concurrently<T, F, Fut>(n: usize, task: F) -> Result<Vec<T>, Failure>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, Failure>> + Send + 'static,
{
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let barrier = barrier.clone();
        let fut = task(i);
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            fut.await
        }));
    }
    let mut out = Vec::with_capacity(n);
    let mut first_error = None;
    for (i, h) in handles.into_iter().enumerate() {
        match h.await {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(Failure::new(format!("task {i} died: {e}")));
            }
        }
    }
    match first_error {
        None => Ok(out),
        Some(e) => Err(e),
    }
}
