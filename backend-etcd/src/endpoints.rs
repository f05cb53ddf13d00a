//! The one endpoint of a several-member cluster that a store's calls go to, and moving off it
//! when it stops answering.
//!
//! The client balances calls over every endpoint it is given (power of two choices among the
//! connections that look ready). An endpoint cut off by the network still looks ready: its
//! connection was open when the cut began, and a request on it is simply never answered. So with
//! one member of three cut off, a share of every process's calls went to it and waited out the
//! whole call deadline, for as long as the cut lasted, although the two members that kept the
//! quorum answered (the partition tests: members on the majority's side lost their leases too).
//!
//! Like etcd's own Go client, which pins one endpoint and switches on failure, a store connected
//! from a URL sends every call to one endpoint ([`Endpoints::pinned`]) and moves to the next one
//! of its URL ([`Endpoints::move_off`]) when a call there could not connect, ran out of time, or
//! was given up by its caller after waiting long (a group member gives up a renewal at its lease
//! deadline, which may come before the store's own deadline). The move inserts the next
//! endpoint into the client's balancer before removing the stalled one, so calls never find it
//! empty; calls in flight on the stalled endpoint fail or time out as they would have anyway. A
//! lease's keep-alive stream opened on an endpoint left behind is dropped at its next use and
//! opened again on the endpoint in use ([`crate::leases`]), so a renewal does not wait on it.
//! A store over an application's own client leaves its endpoints alone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use tokio::time::Instant;

/// The endpoint in use and the others (see the module docs).
pub(crate) struct Endpoints {
    /// The client whose balancer holds the pinned endpoint; `None` over an application's
    /// client, whose endpoints are its own.
    client: Option<Client>,
    /// The URL's endpoints, in its order.
    urls: Vec<String>,
    /// The index in `urls` of the endpoint in use.
    pinned: AtomicUsize,
    /// Held while moving, so that the calls that saw one endpoint stall move off it once.
    moving: tokio::sync::Mutex<()>,
}

impl Endpoints {
    /// Endpoints `urls`, the one at `pinned` the only one in `client`'s balancer.
    pub(crate) fn pinned_to(client: Client, urls: Vec<String>, pinned: usize) -> Arc<Self> {
        Arc::new(Endpoints {
            client: Some(client),
            urls,
            pinned: AtomicUsize::new(pinned),
            moving: tokio::sync::Mutex::new(()),
        })
    }

    /// The endpoints of an application's client: never moved.
    pub(crate) fn unmanaged() -> Arc<Self> {
        Arc::new(Endpoints {
            client: None,
            urls: Vec::new(),
            pinned: AtomicUsize::new(0),
            moving: tokio::sync::Mutex::new(()),
        })
    }

    /// The index of the endpoint calls go to now.
    pub(crate) fn pinned(&self) -> usize {
        self.pinned.load(Ordering::Acquire)
    }

    /// Whether there is another endpoint to move to.
    fn can_move(&self) -> bool {
        self.client.is_some() && self.urls.len() > 1
    }

    /// A call sent while endpoint `seen` was pinned could not connect or stalled: calls go to
    /// the next endpoint of the URL from now on. Several calls that saw the same endpoint stall
    /// move off it once; a call that saw an endpoint already left moves nothing.
    pub(crate) async fn move_off(&self, seen: usize) {
        let Some(client) = self.client.as_ref().filter(|_| self.can_move()) else {
            return;
        };
        let _moving = self.moving.lock().await;
        if self.pinned() != seen {
            return;
        }
        let next = (seen + 1) % self.urls.len();
        // Inserted first, so the balancer always holds an endpoint. Either send fails only once
        // the client's balancer is gone, when no call can be made anyway.
        if client.add_endpoint(&self.urls[next]).await.is_err() {
            return;
        }
        let _ = client.remove_endpoint(&self.urls[seen]).await;
        self.pinned.store(next, Ordering::Release);
        tracing::info!(
            from = %self.urls[seen],
            to = %self.urls[next],
            "etcd: a call to this endpoint stalled or could not connect; calls go to the next one of the URL"
        );
    }

    /// Watches a call sent now: when it is dropped unfinished after waiting at least `stalled`,
    /// the endpoint it went to is left ([`Endpoints::move_off`]). [`CallWatch::finished`] marks
    /// an answer (or an error that says nothing about the endpoint).
    pub(crate) fn watch(self: &Arc<Self>, stalled: Duration) -> CallWatch {
        CallWatch {
            endpoints: self.clone(),
            seen: self.pinned(),
            sent: Instant::now(),
            stalled,
            finished: false,
        }
    }
}

/// A call in flight on the pinned endpoint ([`Endpoints::watch`]).
pub(crate) struct CallWatch {
    endpoints: Arc<Endpoints>,
    seen: usize,
    sent: Instant,
    stalled: Duration,
    finished: bool,
}

impl CallWatch {
    /// The call ended in a way that says nothing against its endpoint.
    pub(crate) fn finished(mut self) {
        self.finished = true;
    }

    /// The call ran out of time: its endpoint is left now.
    pub(crate) async fn timed_out(mut self) {
        self.finished = true;
        self.endpoints.move_off(self.seen).await;
    }
}

impl Drop for CallWatch {
    fn drop(&mut self) {
        if self.finished || !self.endpoints.can_move() || self.sent.elapsed() < self.stalled {
            return;
        }
        let (endpoints, seen) = (self.endpoints.clone(), self.seen);
        // Dropped by its caller (a deadline of the caller's own): the move is async, so it runs
        // in a task of its own. Outside a runtime (a store dropped at exit) there is nothing
        // left to move for.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { endpoints.move_off(seen).await });
        }
    }
}
