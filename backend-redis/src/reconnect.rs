//! The connection a single-server or Cluster store's calls go through, replaced after a call
//! that did not finish in time.
//!
//! Both clients keep a connection after a request on it timed out (a timeout is no reason to
//! reconnect, in their view). After a network cut that is the wrong choice: the kernel holds
//! the unanswered request for retransmission with a backoff that doubles up to minutes, and
//! every later request on the connection waits behind it, so a member cut from the store for a
//! few seconds went on failing for seconds more after the cut healed (up to 3 s with a 1-s TTL
//! in the partition tests) instead of rejoining at its next heartbeat. Dropping the connection
//! once a call on it ran out of time costs one reconnection (on Cluster, the slot map is read
//! again) and makes the next call open fresh sockets, as the Sentinel connection does.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};

use redis::RedisResult;

/// Opens a connection.
pub(crate) type Open<C> =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = RedisResult<C>> + Send>> + Send + Sync>;

/// The connection in use and its generation.
#[derive(Clone)]
struct Current<C> {
    /// Bumped at every new connection, so a call cut short on an old one never drops a newer
    /// one.
    generation: u64,
    conn: C,
}

/// A connection that a call cut short replaces (see the module docs).
pub(crate) struct Reconnecting<C> {
    /// Opens the replacement; `None` for a connection the application handed over, which is
    /// kept whatever happens (there is nothing to open another from).
    open: Option<Open<C>>,
    /// The connection in use; `None` once a call cut short dropped it.
    current: Mutex<Option<Current<C>>>,
    /// Held while connecting, so concurrent calls open one connection; the last generation.
    connecting: tokio::sync::Mutex<u64>,
}

impl<C: Clone> Reconnecting<C> {
    /// Wraps an open connection; `open` opens its replacements.
    pub(crate) fn new(open: Option<Open<C>>, conn: C) -> Self {
        Reconnecting {
            open,
            current: Mutex::new(Some(Current {
                generation: 0,
                conn,
            })),
            connecting: tokio::sync::Mutex::new(0),
        }
    }

    /// Runs `call` on the connection in use (opening one first if a call cut short dropped
    /// it). When `call` is dropped before it finished (the store's deadline ran out) or ends
    /// in a timeout, the connection is dropped and the next call opens another.
    pub(crate) async fn run<T, F, Fut>(&self, call: F) -> RedisResult<T>
    where
        F: FnOnce(C) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let current = self.connection().await?;
        let mut watch = Unfinished {
            conn: self,
            generation: current.generation,
            done: false,
        };
        let result = call(current.conn).await;
        watch.done = true;
        if result.as_ref().is_err_and(redis::RedisError::is_timeout) {
            self.forget(current.generation);
        }
        result
    }

    async fn connection(&self) -> RedisResult<Current<C>> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let mut generation = self.connecting.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let Some(open) = &self.open else {
            // `forget` drops nothing without an opener: unreachable, but not a panic.
            return Err(redis::RedisError::from((
                redis::ErrorKind::ClientError,
                "the connection was dropped and there is nothing to open another from",
            )));
        };
        let conn = open().await?;
        *generation += 1;
        let fresh = Current {
            generation: *generation,
            conn,
        };
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(fresh.clone());
        Ok(fresh)
    }

    fn current(&self) -> Option<Current<C>> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Drops the connection of `generation` if it is still the one in use and another can be
    /// opened.
    fn forget(&self, generation: u64) {
        if self.open.is_none() {
            return;
        }
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|c| c.generation == generation) {
            *current = None;
        }
    }
}

/// Drops the connection when a call on it is dropped before it finished.
struct Unfinished<'a, C: Clone> {
    conn: &'a Reconnecting<C>,
    generation: u64,
    done: bool,
}

impl<C: Clone> Drop for Unfinished<'_, C> {
    fn drop(&mut self) {
        if !self.done {
            self.conn.forget(self.generation);
        }
    }
}
