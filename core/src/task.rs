//! [`Background`]: the one handle every recipe keeps on the task it spawns (a group member's
//! heartbeat, an interval peer's ticker, the distributor's loop, a service's heartbeat, an
//! assignment watch, the gRPC servers), so that stopping, waiting and a task that died mean the
//! same thing everywhere.

use std::fmt;
use std::future::Future;

use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle};

use crate::error::{Error, Result};

/// What dropping the last handle does to the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnDrop {
    /// Cancels it at once: a member that is dropped without leaving stops renewing, and its
    /// lease runs out.
    Abort,
    /// Asks it to stop and lets it finish on its own (a server closes its listener).
    Stop,
}

/// A spawned task that ends with a [`Result`], with a stop signal it watches.
pub(crate) struct Background {
    what: String,
    stop: watch::Sender<bool>,
    // A lock, so that any handle sharing this one may wait for the end, and a second waiter
    // waits for the first and then finds the task gone.
    task: tokio::sync::Mutex<Option<JoinHandle<Result<()>>>>,
    on_drop: OnDrop,
}

impl fmt::Debug for Background {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Background")
            .field("what", &self.what)
            .field("stopping", &*self.stop.borrow())
            .finish_non_exhaustive()
    }
}

impl Background {
    /// Spawns `run` (call within a Tokio runtime), handing it the stop signal: it should end soon
    /// after the value turns true or the sender is gone (see [`stop_requested`]). `what` names
    /// the handle in [`Error::Stopped`].
    pub(crate) fn spawn<F, Fut>(what: impl Into<String>, on_drop: OnDrop, run: F) -> Self
    where
        F: FnOnce(watch::Receiver<bool>) -> Fut,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(run(rx));
        Background {
            what: what.into(),
            stop,
            task: tokio::sync::Mutex::new(Some(task)),
            on_drop,
        }
    }

    /// The name given at spawn.
    pub(crate) fn what(&self) -> &str {
        &self.what
    }

    /// Asks the task to stop, without waiting.
    pub(crate) fn request_stop(&self) {
        self.stop.send_replace(true);
    }

    /// Asks the task to stop and waits for it: its own result, or [`Error::Stopped`] when it
    /// panicked or was cancelled. A second call (from a handle sharing this one) waits for the
    /// first and returns `Ok(())`.
    pub(crate) async fn stop(&self) -> Result<()> {
        self.request_stop();
        self.wait().await
    }

    /// Waits for the task to end on its own, as [`Background::stop`] does after asking.
    ///
    /// The handle is taken out before the wait, so a caller that gives up waiting (a timeout
    /// around `leave`) leaves the task running to its end instead of aborting it half way.
    pub(crate) async fn wait(&self) -> Result<()> {
        // Held until the task ended, so a second waiter waits for the first.
        let mut task = self.task.lock().await;
        let Some(handle) = task.take() else {
            return Ok(());
        };
        handle.await.unwrap_or_else(|e| Err(died(&self.what, &e)))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        match self.on_drop {
            OnDrop::Stop => self.request_stop(),
            OnDrop::Abort => {
                if let Some(task) = self.task.get_mut().take() {
                    task.abort();
                }
            }
        }
    }
}

/// Resolves once `stop` turns true or its sender is gone: the future a task selects on, or hands
/// to a server as its shutdown signal.
pub(crate) async fn stop_requested(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The [`Error::Stopped`] of a task that panicked or was cancelled.
fn died(what: &str, e: &JoinError) -> Error {
    let how = if e.is_panic() {
        "its task panicked"
    } else {
        "its task was cancelled"
    };
    Error::stopped(what, how)
}

#[cfg(test)]
mod tests {
    use super::{stop_requested, Background, OnDrop};
    use crate::error::{Error, Result};

    #[tokio::test]
    async fn stop_returns_the_task_result_once() {
        let bg = Background::spawn("test task", OnDrop::Abort, |stop| async move {
            stop_requested(stop).await;
            Err(Error::invalid("ended badly"))
        });
        assert!(matches!(
            bg.stop().await,
            Err(Error::InvalidArgument { .. })
        ));
        assert!(bg.stop().await.is_ok());
    }

    #[tokio::test]
    async fn a_panic_is_stopped_naming_the_handle() {
        let bg = Background::spawn("group member a", OnDrop::Abort, |_| async move {
            #[allow(clippy::panic)]
            {
                panic!("boom")
            }
        });
        match bg.wait().await {
            Err(Error::Stopped { what, reason }) => {
                assert_eq!(what, "group member a");
                assert!(reason.contains("panicked"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn dropping_asks_or_aborts() {
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let bg = Background::spawn("server", OnDrop::Stop, |stop| async move {
            stop_requested(stop).await;
            let _ = tx.send(());
            Ok(())
        });
        drop(bg);
        assert!((&mut rx).await.is_ok(), "a Stop task finishes on its own");

        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let bg = Background::spawn("watch", OnDrop::Abort, |_| async move {
            let _keep = tx;
            std::future::pending::<Result<()>>().await
        });
        drop(bg);
        assert!(rx.await.is_err(), "an aborted task drops what it held");
    }
}
