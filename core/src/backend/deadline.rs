//! The deadline of a backend's operations, and the [`Error::Timeout`] it turns into when it
//! passes, so that every backend reports an elapsed deadline the same way, under its own name.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};

/// The deadline of every operation of one backend's store (its `timeout` option): runs work
/// within it and names the backend in the [`Error::Timeout`] an elapsed deadline becomes.
///
/// ```
/// # use std::time::Duration;
/// # use headcount_core::backend::Deadline;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let deadline = Deadline::new("example", Duration::from_millis(10));
/// let slow = tokio::time::sleep(Duration::from_secs(1));
/// let e = deadline.run("get", async { slow.await; Ok(()) }).await.unwrap_err();
/// assert_eq!(e.to_string(), "example operation `get` timed out after 10ms");
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    backend: &'static str,
    after: Duration,
}

impl Deadline {
    /// The deadline `after` of the backend named `backend` ([`Capabilities::backend`]).
    ///
    /// [`Capabilities::backend`]: crate::Capabilities::backend
    pub const fn new(backend: &'static str, after: Duration) -> Self {
        Deadline { backend, after }
    }

    /// How long an operation may take.
    pub fn after(&self) -> Duration {
        self.after
    }

    /// The error of operation `op` whose deadline passed, for a client that noticed it itself.
    pub fn timed_out(&self, op: &'static str) -> Error {
        Error::Timeout {
            backend: self.backend,
            op,
            after: self.after,
        }
    }

    /// Runs `work` for at most the deadline; past it, `work` is dropped and the answer is
    /// [`Deadline::timed_out`].
    pub async fn run<T>(
        &self,
        op: &'static str,
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        tokio::time::timeout(self.after, work)
            .await
            .unwrap_or_else(|_| Err(self.timed_out(op)))
    }

    /// Like [`Deadline::run`] for work that started at `started` (whose deadline is `started`
    /// plus [`Deadline::after`]), when the same instant bounds work elsewhere too.
    pub async fn run_from<T>(
        &self,
        op: &'static str,
        started: Instant,
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        tokio::time::timeout_at(started + self.after, work)
            .await
            .unwrap_or_else(|_| Err(self.timed_out(op)))
    }
}
