//! A TCP proxy the harness puts between a fault case's store and its server, to cut the
//! connection without touching the server: [`Proxy::cut`] drops every open connection and
//! blackholes new ones (accepted, never answered, like a network partition), [`Proxy::heal`]
//! lets traffic pass again (connections held during the cut then reach the server, as TCP
//! retransmission would after a partition heals). [`Proxy::drop_next_reply`] lets the next
//! request reach the server and drops the connection when the server's answer comes, instead
//! of passing it on: the write is applied and its reply lost. It also counts the bytes it
//! carries each way ([`Proxy::bytes`]), which the benches use to measure what a backend sends.
//!
//! For the partition tests it also listens on any local address ([`Proxy::start_at`]) and
//! shapes what it carries: [`Proxy::set_delay`] holds every chunk for a delay with jitter
//! (order kept, as TCP keeps it), [`Proxy::blackhole`] silently discards one direction while
//! the connections stay open.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Whether traffic passes, and the generation of connections that may live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    passing: bool,
    generation: u64,
}

/// The upstream port of a [`Proxy`], settable after it started (a Redis Cluster node must know
/// its proxy's port before the proxy can know the node's), and its IPv4 address (`127.0.0.1`
/// unless [`Proxy::start_at`] names another).
#[derive(Debug, Clone)]
pub struct Upstream(Arc<AtomicU16>, Arc<AtomicU32>);

impl Default for Upstream {
    fn default() -> Self {
        Upstream(
            Arc::default(),
            Arc::new(AtomicU32::new(Ipv4Addr::LOCALHOST.into())),
        )
    }
}

impl Upstream {
    /// Sets the port connections are forwarded to.
    pub fn set(&self, port: u16) {
        self.0.store(port, Ordering::SeqCst);
    }

    fn addr(&self) -> SocketAddr {
        let ip = Ipv4Addr::from(self.1.load(Ordering::SeqCst));
        SocketAddr::from((ip, self.0.load(Ordering::SeqCst)))
    }
}

/// Which way of a connection: what the client sends, or what the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to server.
    ToServer,
    /// Server to client.
    FromServer,
}

/// A loopback TCP proxy to one upstream port. Stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    upstream: Upstream,
    state: watch::Sender<State>,
    accept: JoinHandle<()>,
    shared: Arc<Shared>,
}

/// What every connection of a proxy shares: the bytes carried each way, and whether to drop the
/// next answer from the server (a flag several proxies may share, so that one answer is dropped
/// among all of them).
#[derive(Debug, Default)]
struct Shared {
    to_server: AtomicU64,
    from_server: AtomicU64,
    drop_reply: Arc<AtomicBool>,
    /// Every chunk is held this long, plus or minus up to the jitter (milliseconds).
    delay_ms: AtomicU64,
    jitter_ms: AtomicU64,
    /// Discard what goes this way: to the server, from the server.
    blackhole: [AtomicBool; 2],
}

impl Shared {
    /// When a chunk read now may go on: after the delay and a jitter drawn for it, never before
    /// the chunk read before it.
    fn release(&self, last: &mut Instant) -> Instant {
        let delay = self.delay_ms.load(Ordering::Relaxed);
        let jitter = self.jitter_ms.load(Ordering::Relaxed);
        if delay == 0 && jitter == 0 {
            return *last;
        }
        let lo = delay.saturating_sub(jitter);
        let ms = lo + rand::random::<u64>() % (delay + jitter - lo + 1);
        *last = (*last).max(Instant::now() + std::time::Duration::from_millis(ms));
        *last
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> io::Result<Proxy> {
        Proxy::start_sharing(upstream, Arc::default()).await
    }

    /// [`Proxy::start`] with the flag of [`Proxy::drop_next_reply`] shared with other proxies.
    pub async fn start_sharing(upstream: u16, drop_reply: Arc<AtomicBool>) -> io::Result<Proxy> {
        let proxy = Proxy::unbound_sharing(drop_reply).await?;
        proxy.upstream.set(upstream);
        Ok(proxy)
    }

    /// Listens on a free port of `listen` (a local address) and forwards to `upstream`.
    pub async fn start_at(listen: Ipv4Addr, upstream: std::net::SocketAddrV4) -> io::Result<Proxy> {
        let proxy = Proxy::listen(listen.into(), Arc::default()).await?;
        proxy
            .upstream
            .1
            .store((*upstream.ip()).into(), Ordering::SeqCst);
        proxy.upstream.set(upstream.port());
        Ok(proxy)
    }

    /// Listens on a free loopback port; connections are forwarded once [`Proxy::upstream`] is
    /// set (before that they are closed).
    pub async fn unbound() -> io::Result<Proxy> {
        Proxy::unbound_sharing(Arc::default()).await
    }

    /// [`Proxy::unbound`] with the flag of [`Proxy::drop_next_reply`] shared with other proxies.
    pub async fn unbound_sharing(drop_reply: Arc<AtomicBool>) -> io::Result<Proxy> {
        Proxy::listen(Ipv4Addr::LOCALHOST.into(), drop_reply).await
    }

    async fn listen(at: IpAddr, drop_reply: Arc<AtomicBool>) -> io::Result<Proxy> {
        let listener = TcpListener::bind((at, 0)).await?;
        let port = listener.local_addr()?.port();
        let (state, rx) = watch::channel(State {
            passing: true,
            generation: 0,
        });
        let upstream = Upstream::default();
        let target = upstream.clone();
        let shared = Arc::new(Shared {
            drop_reply,
            ..Shared::default()
        });
        let counted = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, target.clone(), rx.clone(), counted.clone()));
            }
        });
        Ok(Proxy {
            port,
            upstream,
            state,
            accept,
            shared,
        })
    }

    /// The slot holding the upstream port.
    pub fn upstream(&self) -> Upstream {
        self.upstream.clone()
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The bytes carried so far: to the server, from the server.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.shared.to_server.load(Ordering::Relaxed),
            self.shared.from_server.load(Ordering::Relaxed),
        )
    }

    /// Drops the connection that carries the server's next answer, instead of passing the
    /// answer on (once, among all the proxies sharing the flag): the request it answers was
    /// applied, and the client never learns it.
    pub fn drop_next_reply(&self) {
        self.shared.drop_reply.store(true, Ordering::SeqCst);
    }

    /// Passes every answer again (undoes a [`Proxy::drop_next_reply`] that dropped nothing).
    /// Returns whether the flag was still set: no answer was dropped since it was set.
    pub fn pass_replies(&self) -> bool {
        self.shared.drop_reply.swap(false, Ordering::SeqCst)
    }

    /// Holds every chunk, both ways, for `delay` plus or minus up to `jitter` (each chunk draws
    /// its own), never overtaking the chunk before it; zero for both passes at once again.
    pub fn set_delay(&self, delay: std::time::Duration, jitter: std::time::Duration) {
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.shared.delay_ms.store(ms(delay), Ordering::Relaxed);
        self.shared.jitter_ms.store(ms(jitter), Ordering::Relaxed);
    }

    /// Silently discards what goes one way (`on`), or passes it again; connections stay open,
    /// as when a network loses the packets of one direction only.
    pub fn blackhole(&self, way: Direction, on: bool) {
        self.shared.blackhole[way as usize].store(on, Ordering::SeqCst);
    }

    /// Drops every open connection and holds new ones without answering.
    pub fn cut(&self) {
        self.state.send_modify(|s| {
            s.passing = false;
            s.generation += 1;
        });
    }

    /// Lets traffic pass again.
    pub fn heal(&self) {
        self.state.send_modify(|s| s.passing = true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Ends every connection task too.
        self.state.send_modify(|s| s.generation += 1);
    }
}

async fn serve(
    client: TcpStream,
    upstream: Upstream,
    mut rx: watch::Receiver<State>,
    shared: Arc<Shared>,
) {
    // Blackhole: hold the connection until traffic passes (or the proxy goes).
    loop {
        if rx.borrow_and_update().passing {
            break;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
    let generation = rx.borrow().generation;
    let target = upstream.addr();
    if target.port() == 0 {
        return;
    }
    let Ok(server) = TcpStream::connect(target).await else {
        // The server is down: close, as a refused connection would.
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let dropped = Notify::new();
    let pumps = async {
        tokio::join!(
            pump(
                client_read,
                server_write,
                &shared,
                Direction::ToServer,
                None
            ),
            pump(
                server_read,
                client_write,
                &shared,
                Direction::FromServer,
                Some(&dropped)
            )
        )
    };
    tokio::select! {
        _ = pumps => {}
        // Both halves of both sockets go with this future: the connection closes.
        _ = dropped.notified() => {}
        _ = async {
            loop {
                if rx.changed().await.is_err() || rx.borrow().generation != generation {
                    return;
                }
            }
        } => {}
    }
}

/// Copies one direction of a connection until either side closes it, counting the bytes,
/// holding each chunk as [`Proxy::set_delay`] says and discarding it under
/// [`Proxy::blackhole`]. With `drop` (the server's answers), data read while the drop flag is
/// set is not passed on: the flag is cleared and the connection told to close.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
    way: Direction,
    drop: Option<&Notify>,
) {
    let count = match way {
        Direction::ToServer => &shared.to_server,
        Direction::FromServer => &shared.from_server,
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 32 * 1024];
        let mut last = Instant::now();
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(close) = drop {
                if shared.drop_reply.swap(false, Ordering::SeqCst) {
                    close.notify_one();
                    return;
                }
            }
            if shared.blackhole[way as usize].load(Ordering::SeqCst) {
                continue;
            }
            if tx
                .send((shared.release(&mut last), buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    };
    let write = async {
        while let Some((at, data)) = rx.recv().await {
            if at > Instant::now() {
                tokio::time::sleep_until(at).await;
            }
            if to.write_all(&data).await.is_err() {
                break;
            }
            count.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

/// A [`ServerControl`](headcount_conformance::ServerControl) that adds [`Proxy`]s to another: kill, start,
/// pause and resume go to the servers, cut and heal to the proxies.
#[derive(Debug)]
pub struct Proxied {
    inner: Arc<dyn headcount_conformance::ServerControl>,
    proxies: Vec<Proxy>,
}

impl Proxied {
    /// Puts a proxy in front of every `127.0.0.1:<port>` the URL names; returns the control and
    /// the URL rewritten to go through the proxies.
    pub async fn wrap(
        inner: Arc<dyn headcount_conformance::ServerControl>,
        url: &str,
    ) -> io::Result<(Proxied, String)> {
        const HOST: &str = "127.0.0.1:";
        let mut out = String::with_capacity(url.len());
        let mut rest = url;
        let mut proxies = Vec::new();
        let drop_reply = Arc::new(AtomicBool::new(false));
        while let Some(at) = rest.find(HOST) {
            let after = &rest[at + HOST.len()..];
            let end = after
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after.len());
            let upstream: u16 = after[..end]
                .parse()
                .map_err(|_| io::Error::other("a malformed port in the store URL"))?;
            let proxy = Proxy::start_sharing(upstream, drop_reply.clone()).await?;
            out.push_str(&rest[..at]);
            out.push_str(&format!("{HOST}{}", proxy.port()));
            proxies.push(proxy);
            rest = &after[end..];
        }
        out.push_str(rest);
        if proxies.is_empty() {
            return Err(io::Error::other(
                "the store URL names no 127.0.0.1 port to put a proxy in front of",
            ));
        }
        Ok((Proxied { inner, proxies }, out))
    }

    /// A control over `inner` with proxies already in place (their ports in the store's URL).
    pub fn with_proxies(
        inner: Arc<dyn headcount_conformance::ServerControl>,
        proxies: Vec<Proxy>,
    ) -> Self {
        Proxied { inner, proxies }
    }
}

#[async_trait::async_trait]
impl headcount_conformance::ServerControl for Proxied {
    fn op_timeout(&self) -> std::time::Duration {
        self.inner.op_timeout()
    }

    async fn kill(&self) -> io::Result<()> {
        self.inner.kill().await
    }

    async fn start(&self) -> io::Result<()> {
        self.inner.start().await
    }

    async fn pause(&self) -> io::Result<()> {
        self.inner.pause().await
    }

    async fn resume(&self) -> io::Result<()> {
        self.inner.resume().await
    }

    async fn cut(&self) -> io::Result<()> {
        self.proxies.iter().for_each(Proxy::cut);
        Ok(())
    }

    async fn heal(&self) -> io::Result<()> {
        self.proxies.iter().for_each(Proxy::heal);
        Ok(())
    }

    async fn drop_next_reply(&self) -> io::Result<()> {
        self.proxies.iter().for_each(Proxy::drop_next_reply);
        Ok(())
    }

    async fn pass_replies(&self) -> io::Result<bool> {
        // Every proxy is cleared (they may share one flag): an answer was dropped when none
        // was still waiting to drop one.
        let waiting = self
            .proxies
            .iter()
            .map(Proxy::pass_replies)
            .fold(false, |a, b| a | b);
        Ok(!waiting)
    }
}

/// Checks that a call after a healed stall answers: `store` reaches its servers through
/// `proxies` only, with a deadline well under a minute. Every byte is held for a minute (in
/// order, as TCP holds what it must retransmit after packets were lost), one call must fail,
/// then the hold ends and the next call must answer within the store's deadline: a store that
/// kept the stalled connection would queue it behind the unanswered request.
pub async fn check_call_after_healed_stall(
    store: &headcount::DynStore,
    proxies: &[Proxy],
) -> Result<(), String> {
    let key = "hc-stall-probe";
    store
        .get(key)
        .await
        .map_err(|e| format!("before the stall: {e}"))?;
    for p in proxies {
        p.set_delay(
            std::time::Duration::from_secs(60),
            std::time::Duration::ZERO,
        );
    }
    if store.get(key).await.is_ok() {
        return Err("a call answered through the stall".into());
    }
    for p in proxies {
        p.set_delay(std::time::Duration::ZERO, std::time::Duration::ZERO);
    }
    let healed = Instant::now();
    store.get(key).await.map_err(|e| {
        format!(
            "the first call after the stall healed failed after {:?}: {e}",
            healed.elapsed()
        )
    })?;
    Ok(())
}
