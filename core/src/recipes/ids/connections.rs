//! The IDs server's connections: how many may be open, how long one may sit idle, and an accept
//! loop that backs off, and says so, when the process runs out of file descriptors.
//!
//! Without them a client that opens connections and sends nothing (a port scanner, a broken
//! load balancer, an attacker) holds one file descriptor each for good; once the process is out
//! of them, `accept` fails at once, every time, and a server that retries at once spins a core
//! and serves nobody.
//!
//! * A connection with no call in flight that neither sends nor receives a byte for the idle
//!   timeout is closed (a client's channel reconnects at its next call).
//! * When a connection arrives while the cap is reached, the open connection idle longest
//!   (no call in flight) is closed to make room; when every connection has a call in flight,
//!   the newcomer is closed instead. So a flood of silent connections costs the server at most
//!   the cap, and a real client still gets in.
//! * `accept` failing for want of file descriptors (or memory) closes the idlest connection,
//!   logs a warning (at most one every [`LOG_EVERY`], with the count of those left unsaid) and
//!   waits before trying again, from [`Backoff::FIRST`] doubling to [`Backoff::MAX`].

use std::collections::BTreeMap;
use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// The most warnings of one kind the accept loop logs per this period.
pub(super) const LOG_EVERY: Duration = Duration::from_secs(10);

/// The open connections of one server, and its limits.
#[derive(Debug)]
pub(super) struct Registry {
    max: usize,
    idle: Duration,
    /// What `last_active` counts from.
    epoch: Instant,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    next_id: u64,
    by_id: BTreeMap<u64, Arc<ConnState>>,
}

/// What the server knows of one connection, shared by its I/O and its calls.
#[derive(Debug)]
struct ConnState {
    /// The registry's epoch, which `last_active` counts from.
    epoch: Instant,
    /// Calls under way: a connection with one is never idle.
    busy: AtomicUsize,
    /// Milliseconds from `epoch` to the last byte read or written, or the end of the last call.
    last_active: AtomicU64,
    /// Whether a byte ever arrived.
    spoke: AtomicBool,
    /// Closed by the server (idlest at the cap, or silent at shutdown): the next read fails.
    evicted: AtomicBool,
    /// The task reading the connection, woken to notice an eviction.
    reader: AtomicWaker,
}

impl Registry {
    /// A registry of at most `max` connections (at least 1), closing those idle for `idle`.
    pub(super) fn new(max: usize, idle: Duration) -> Arc<Registry> {
        Arc::new(Registry {
            max: max.max(1),
            idle,
            epoch: Instant::now(),
            open: Mutex::new(Open::default()),
        })
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `stream`, closing the idlest open connection when the cap is reached; `None`
    /// (the newcomer is to be closed) when every open connection has a call in flight.
    fn admit(self: &Arc<Self>, stream: TcpStream) -> Option<Conn> {
        let state = Arc::new(ConnState {
            epoch: self.epoch,
            busy: AtomicUsize::new(0),
            last_active: AtomicU64::new(0),
            spoke: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            reader: AtomicWaker::new(),
        });
        state.touch();
        let id = {
            let mut open = self.open();
            let live = open
                .by_id
                .values()
                .filter(|c| !c.evicted.load(Ordering::Relaxed))
                .count();
            if live >= self.max && !evict_idlest(&open) {
                return None;
            }
            let id = open.next_id;
            open.next_id += 1;
            open.by_id.insert(id, state.clone());
            id
        };
        Some(Conn {
            stream,
            state,
            registry: self.clone(),
            id,
            timer: Box::pin(tokio::time::sleep(self.idle)),
        })
    }

    /// Closes the open connection idle longest, if one has no call in flight.
    fn evict_idlest(&self) -> bool {
        evict_idlest(&self.open())
    }

    /// Closes every connection that never sent a byte: a graceful shutdown waits for the others
    /// to finish their calls, but would wait for these until their idle timeout.
    pub(super) fn close_silent(&self) {
        for c in self.open().by_id.values() {
            if !c.spoke.load(Ordering::Relaxed) {
                c.evict();
            }
        }
    }

    /// The connections open now (evicted ones until they are closed included).
    pub(super) fn len(&self) -> usize {
        self.open().by_id.len()
    }
}

fn evict_idlest(open: &Open) -> bool {
    let idlest = open
        .by_id
        .values()
        .filter(|c| !c.evicted.load(Ordering::Relaxed) && c.busy.load(Ordering::Relaxed) == 0)
        .min_by_key(|c| c.last_active.load(Ordering::Relaxed));
    match idlest {
        Some(c) => {
            c.evict();
            true
        }
        None => false,
    }
}

impl ConnState {
    /// Notes activity now.
    fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_active.store(ms, Ordering::Relaxed);
    }

    /// When the connection stops being idle for too long, as of its last activity.
    fn idle_until(&self, idle: Duration) -> Instant {
        self.epoch + Duration::from_millis(self.last_active.load(Ordering::Relaxed)) + idle
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::Relaxed);
        self.reader.wake();
    }
}

/// What each request on a connection carries (tonic puts it in the request's extensions):
/// lets a call mark the connection busy while it runs.
#[derive(Debug, Clone)]
pub(super) struct ConnectionInfo {
    state: Arc<ConnState>,
}

impl ConnectionInfo {
    /// Marks the connection busy until the guard drops: a call under way is not idleness.
    pub(super) fn busy(&self) -> BusyGuard {
        self.state.busy.fetch_add(1, Ordering::Relaxed);
        BusyGuard {
            state: self.state.clone(),
        }
    }
}

/// See [`ConnectionInfo::busy`].
#[derive(Debug)]
pub(super) struct BusyGuard {
    state: Arc<ConnState>,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        // The idle time starts now, not at the request's last byte: the answer is still to be
        // written.
        self.state.touch();
        self.state.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One accepted connection: the TCP stream, timed out when idle, closed when evicted.
#[derive(Debug)]
pub(super) struct Conn {
    stream: TcpStream,
    state: Arc<ConnState>,
    registry: Arc<Registry>,
    id: u64,
    timer: Pin<Box<Sleep>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.registry.open().by_id.remove(&self.id);
    }
}

impl Conn {
    /// While the stream has nothing to read: whether the connection has been idle too long
    /// (re-arming the timer otherwise, so the task wakes when it may be).
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let idle = self.registry.idle;
            let due = if self.state.busy.load(Ordering::Relaxed) > 0 {
                Instant::now() + idle
            } else {
                self.state.idle_until(idle)
            };
            if due <= Instant::now() {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("closed after {idle:?} idle"),
                ));
            }
            self.timer.as_mut().reset(due);
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.state.reader.register(cx.waker());
        if this.state.evicted.load(Ordering::Relaxed) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for another connection",
            )));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.state.spoke.store(true, Ordering::Relaxed);
                    this.state.touch();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_idle(cx).map(Err),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.state.touch();
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.state.touch();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo {
            state: self.state.clone(),
        }
    }
}

/// The wait before the next `accept` after one failed: doubling from [`Backoff::FIRST`] up to
/// [`Backoff::MAX`], back to the start after a success.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The wait after a first failure.
    pub(super) const FIRST: Duration = Duration::from_millis(5);
    /// The longest wait.
    pub(super) const MAX: Duration = Duration::from_secs(1);

    /// The wait after one more failure.
    pub(super) fn next(&mut self) -> Duration {
        let wait = Self::FIRST
            .saturating_mul(1 << self.failures.min(16))
            .min(Self::MAX);
        self.failures = self.failures.saturating_add(1);
        wait
    }

    /// A success: the next failure waits [`Backoff::FIRST`] again.
    pub(super) fn reset(&mut self) {
        self.failures = 0;
    }
}

/// A warning said at most once per period; the occurrences in between are counted.
#[derive(Debug, Clone, Copy)]
pub(super) struct RateLimit {
    period: Duration,
    last: Option<Instant>,
    unsaid: u64,
}

impl RateLimit {
    /// At most once per `period`.
    pub(super) fn new(period: Duration) -> Self {
        RateLimit {
            period,
            last: None,
            unsaid: 0,
        }
    }

    /// One more occurrence at `now`: `Some(n)` when it is to be logged, `n` being how many
    /// occurrences since the last log line went unsaid; `None` when it is to be counted only.
    pub(super) fn occur(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.period => {
                self.unsaid += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.unsaid))
            }
        }
    }
}

/// Whether a failed `accept` is the process (or the system) running out of descriptors or
/// memory: it fails again at once until something is closed.
fn out_of_resources(e: &io::Error) -> bool {
    // EMFILE, ENFILE and ENOMEM have these numbers on Linux and the BSDs; ENOBUFS differs.
    const ENOBUFS: i32 = if cfg!(target_os = "linux") { 105 } else { 55 };
    matches!(e.raw_os_error(), Some(code) if code == 24 || code == 23 || code == 12 || code == ENOBUFS)
}

/// Whether a failed `accept` concerns one connection only (it was reset before being accepted):
/// the next one may be taken at once.
fn one_connection_only(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// The accept loop's state.
struct Acceptor {
    listener: TcpListener,
    registry: Arc<Registry>,
    backoff: Backoff,
    out_of_fds: RateLimit,
    full: RateLimit,
    failed: RateLimit,
}

impl Acceptor {
    /// The next connection admitted. Never fails: failures are waited out here, so the
    /// server's own loop never spins on them.
    async fn next(&mut self) -> Conn {
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    self.backoff.reset();
                    // Replies are small and latency is what a caller waits on.
                    let _ = stream.set_nodelay(true);
                    match self.registry.admit(stream) {
                        Some(conn) => return conn,
                        None => {
                            if let Some(unsaid) = self.full.occur(Instant::now()) {
                                tracing::warn!(
                                    max = self.registry.max,
                                    unsaid,
                                    "IDs server: at its connection cap with a call in flight on \
                                     every connection; closed a new connection"
                                );
                            }
                        }
                    }
                }
                Err(e) if one_connection_only(&e) => {
                    tracing::debug!(error = %e, "IDs server: a connection failed before accept");
                }
                Err(e) => {
                    let wait = self.backoff.next();
                    let resources = out_of_resources(&e);
                    let freed = resources && self.registry.evict_idlest();
                    let limit = if resources {
                        &mut self.out_of_fds
                    } else {
                        &mut self.failed
                    };
                    if let Some(unsaid) = limit.occur(Instant::now()) {
                        tracing::warn!(
                            error = %e,
                            open = self.registry.open().by_id.len(),
                            closed_an_idle_one = freed,
                            retry_in = ?wait,
                            unsaid,
                            "IDs server: cannot accept a connection{}",
                            if resources {
                                " (out of file descriptors or memory: raise `ulimit -n`, or \
                                 lower the connection cap)"
                            } else {
                                ""
                            }
                        );
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// The connections `listener` accepts, as tonic's `serve_with_incoming` takes them: admitted
/// to `registry`, never an error.
pub(super) fn incoming(
    listener: TcpListener,
    registry: Arc<Registry>,
) -> impl Stream<Item = Result<Conn, io::Error>> + Send + 'static {
    let acceptor = Acceptor {
        listener,
        registry,
        backoff: Backoff::default(),
        out_of_fds: RateLimit::new(LOG_EVERY),
        full: RateLimit::new(LOG_EVERY),
        failed: RateLimit::new(LOG_EVERY),
    };
    futures::stream::unfold(acceptor, |mut acceptor| async move {
        let conn = acceptor.next().await;
        Some((Ok(conn), acceptor))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::default();
        let waits: Vec<u64> = (0..10).map(|_| b.next().as_millis() as u64).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        for _ in 0..100 {
            assert_eq!(b.next(), Backoff::MAX);
        }
        b.reset();
        assert_eq!(b.next(), Backoff::FIRST);
    }

    #[test]
    fn warnings_are_rate_limited_and_count_what_went_unsaid() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(Duration::from_secs(10));
        assert_eq!(limit.occur(t0), Some(0));
        for i in 1..=99 {
            assert_eq!(limit.occur(t0 + Duration::from_millis(i * 10)), None);
        }
        assert_eq!(limit.occur(t0 + Duration::from_secs(10)), Some(99));
        assert_eq!(limit.occur(t0 + Duration::from_secs(11)), None);
        assert_eq!(limit.occur(t0 + Duration::from_secs(25)), Some(1));
    }

    #[test]
    fn descriptor_exhaustion_is_told_from_a_connection_reset() {
        // EMFILE, ENFILE.
        for code in [24, 23] {
            let e = io::Error::from_raw_os_error(code);
            assert!(out_of_resources(&e), "{e}");
            assert!(!one_connection_only(&e), "{e}");
        }
        let aborted = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert!(one_connection_only(&aborted));
        assert!(!out_of_resources(&aborted));
    }
}
