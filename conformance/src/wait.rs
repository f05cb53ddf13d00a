//! Waiting on real servers and processes: poll a condition until it holds or a deadline passes,
//! never sleep a fixed time and hope. One loop for every test and case of the workspace, sync
//! and async, so each failure says the same things: what was awaited, for how long, and what was
//! seen last.
//!
//! * [`until`] / [`until_blocking`] return the failure message, for cases (which return a
//!   [`Failure`](crate::Failure)) and for tests that must clean up before they fail;
//! * [`eventually`] / [`eventually_blocking`] panic with it, for tests.
//!
//! A probe answers anything [`Awaited`]: `bool`, `Option<T>` (ready when `Some`), or
//! `Result<T, E>` (ready when `Ok`; the last `Err` is quoted in the message).
//!
//! Not to be confused with [`cases::sleep_past`](crate::cases::sleep_past), which waits for an
//! instant to pass (a key must outlive an old expiry), with no condition to poll.

use std::fmt::Debug;
use std::future::Future;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// The polling interval most waits use: short next to the deadlines, long enough not to load a
/// server.
pub const EVERY: Duration = Duration::from_millis(20);

/// What a probe answers: whether the awaited condition holds, with the value it yields, or what
/// was seen instead.
pub trait Awaited {
    /// What the wait returns once the condition holds.
    type Value;
    /// `Ok(value)` when the condition holds, else `Err(what was seen)` (empty: nothing to say).
    fn ready(self) -> Result<Self::Value, String>;
}

impl Awaited for bool {
    type Value = ();
    fn ready(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err(String::new())
        }
    }
}

impl<T> Awaited for Option<T> {
    type Value = T;
    fn ready(self) -> Result<T, String> {
        self.ok_or_else(String::new)
    }
}

impl<T, E: Debug> Awaited for Result<T, E> {
    type Value = T;
    fn ready(self) -> Result<T, String> {
        self.map_err(|e| format!("{e:?}"))
    }
}

/// The message of a wait that ran out of time.
fn timed_out(what: &str, within: Duration, last: &str) -> String {
    if last.is_empty() {
        format!("{what}: not within {within:?}")
    } else {
        format!("{what}: not within {within:?}; last seen: {last}")
    }
}

/// Calls `probe` every `every` until its answer is ready, and returns the value; after `within`
/// (counted from the call) returns the message "`what`: not within `within`; last seen: …".
/// The probe always runs at least once, and once more at the deadline.
pub async fn until<A, F, Fut>(
    what: &str,
    within: Duration,
    every: Duration,
    mut probe: F,
) -> Result<A::Value, String>
where
    A: Awaited,
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
{
    let end = Instant::now() + within;
    loop {
        let last = match probe().await.ready() {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        if Instant::now() >= end {
            return Err(timed_out(what, within, &last));
        }
        tokio::time::sleep(every).await;
    }
}

/// [`until`], panicking with its message.
#[allow(clippy::panic)] // For tests, which fail by panicking.
pub async fn eventually<A, F, Fut>(
    what: &str,
    within: Duration,
    every: Duration,
    probe: F,
) -> A::Value
where
    A: Awaited,
    F: FnMut() -> Fut,
    Fut: Future<Output = A>,
{
    match until(what, within, every, probe).await {
        Ok(value) => value,
        Err(message) => panic!("{message}"),
    }
}

/// [`until`] for a thread that may block: sleeps the thread between probes.
pub fn until_blocking<A: Awaited>(
    what: &str,
    within: Duration,
    every: Duration,
    mut probe: impl FnMut() -> A,
) -> Result<A::Value, String> {
    let end = Instant::now() + within;
    loop {
        let last = match probe().ready() {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        if Instant::now() >= end {
            return Err(timed_out(what, within, &last));
        }
        std::thread::sleep(every);
    }
}

/// [`until_blocking`], panicking with its message.
#[track_caller]
#[allow(clippy::panic)] // For tests, which fail by panicking.
pub fn eventually_blocking<A: Awaited>(
    what: &str,
    within: Duration,
    every: Duration,
    probe: impl FnMut() -> A,
) -> A::Value {
    match until_blocking(what, within, every, probe) {
        Ok(value) => value,
        Err(message) => panic!("{message}"),
    }
}

/// Waits for `child` to exit and returns its status; after `within`, kills it (so a failed test
/// leaves no process behind) and panics naming `what` and its pid.
#[track_caller]
#[allow(clippy::panic)] // For tests, which fail by panicking.
pub fn exit_within(child: &mut Child, what: &str, within: Duration) -> ExitStatus {
    let pid = child.id();
    let exited = until_blocking(
        &format!("{what} (pid {pid}) exited"),
        within,
        EVERY,
        || match child.try_wait() {
            Ok(Some(status)) => Ok(status),
            Ok(None) => Err("still running".to_owned()),
            Err(e) => Err(format!("try_wait: {e}")),
        },
    );
    match exited {
        Ok(status) => status,
        Err(message) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{message}")
        }
    }
}
