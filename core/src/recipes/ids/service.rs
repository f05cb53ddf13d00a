//! The IDs server of the seed ("an IDs server that mediates clients, several of them for
//! redundancy"): majority IDs over gRPC, and its client. Behind the `grpc` cargo feature.
//!
//! One service, `headcount.ids.v1.Ids`, one method:
//!
//! ```proto
//! syntax = "proto3";
//! package headcount.ids.v1;
//! service Ids { rpc Next(NextRequest) returns (NextReply); }
//! // `count` IDs (1 to 2^20; 0 reads as 1) of generator `key`.
//! message NextRequest { string key = 1; uint64 count = 2; }
//! // The IDs `first ..= first + count - 1`.
//! message NextReply { int64 first = 1; uint64 count = 2; }
//! ```
//!
//! beside the standard health service (`grpc.health.v1.Health`, SERVING for `""` and for
//! `headcount.ids.v1.Ids`). A server puts one [`MediatedIds`] (group commit) per generator name
//! in front of its stores. Several servers over the same stores are safe at once: the majority
//! protocol orders IDs, not the servers, so a client may fail over from one to another
//! ([`IdsClient`]) and every ID it gets is still greater than every ID returned (by any server)
//! before its call started.
//!
//! Errors: an unknown generator name is `NOT_FOUND`, a bad count `INVALID_ARGUMENT`, no majority
//! within the deadline `UNAVAILABLE`, a store failing for good (a foreign value, a counter at
//! `i64::MAX`) `FAILED_PRECONDITION`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::codegen::{http, Body, BoxFuture, Context, Poll, Service, StdError};

use super::connections::{self, ConnectionInfo, Registry};
use super::{check_block, MediatedIds, RECIPE};
use crate::error::{with_sources, Error, Result};
use crate::task::{stop_requested, Background, OnDrop};

/// The gRPC service's full name.
pub const SERVICE_NAME: &str = "headcount.ids.v1.Ids";
const NEXT_PATH: &str = "/headcount.ids.v1.Ids/Next";

/// The messages of `headcount.ids.v1` (see the [module docs](self)).
pub mod proto {
    /// `count` IDs of generator `key`.
    #[derive(Clone, PartialEq, Eq, ::prost::Message)]
    pub struct NextRequest {
        /// The generator's name.
        #[prost(string, tag = "1")]
        pub key: ::prost::alloc::string::String,
        /// How many IDs (0 reads as 1).
        #[prost(uint64, tag = "2")]
        pub count: u64,
    }

    /// The IDs `first ..= first + count - 1`.
    #[derive(Clone, Copy, PartialEq, Eq, ::prost::Message)]
    pub struct NextReply {
        /// The first ID.
        #[prost(int64, tag = "1")]
        pub first: i64,
        /// How many.
        #[prost(uint64, tag = "2")]
        pub count: u64,
    }
}

/// The generators a server serves, by name.
#[derive(Debug, Clone)]
pub struct IdsService {
    generators: Arc<BTreeMap<String, MediatedIds>>,
}

impl IdsService {
    /// Serves `generators` (each under its [name](super::IdsConfig::name); a name twice is
    /// [`Error::InvalidArgument`]).
    pub fn new(generators: Vec<MediatedIds>) -> Result<Self> {
        let mut map = BTreeMap::new();
        for g in generators {
            let name = g.inner().config.name().to_owned();
            if map.insert(name.clone(), g).is_some() {
                return Err(Error::invalid(format!(
                    "the generator `{name}` is given twice"
                )));
            }
        }
        if map.is_empty() {
            return Err(Error::invalid("an IDs server needs at least one generator"));
        }
        Ok(IdsService {
            generators: Arc::new(map),
        })
    }

    /// The counters of generator `key`, if the server serves it.
    pub fn stats(&self, key: &str) -> Option<super::IdsStats> {
        self.generators.get(key).map(|g| g.inner().stats())
    }

    /// `count` IDs of generator `key`, as the server answers them.
    pub async fn next(&self, key: &str, count: u64) -> Result<RangeInclusive<i64>> {
        let Some(g) = self.generators.get(key) else {
            return Err(unknown_key(key, self.generators.keys()));
        };
        g.next_block(count.max(1)).await
    }

    async fn answer(
        &self,
        request: proto::NextRequest,
    ) -> std::result::Result<proto::NextReply, tonic::Status> {
        if !self.generators.contains_key(&request.key) {
            let Error::InvalidArgument { message } =
                unknown_key(&request.key, self.generators.keys())
            else {
                return Err(tonic::Status::not_found(request.key));
            };
            return Err(tonic::Status::not_found(message));
        }
        match self.next(&request.key, request.count).await {
            Ok(ids) => Ok(proto::NextReply {
                first: *ids.start(),
                count: u64::try_from(ids.end() - ids.start() + 1).unwrap_or(0),
            }),
            Err(e) => Err(status_of(&e)),
        }
    }
}

fn unknown_key<'a>(key: &str, known: impl Iterator<Item = &'a String>) -> Error {
    let known: Vec<&str> = known.map(String::as_str).collect();
    Error::InvalidArgument {
        message: format!(
            "no ID generator `{key}` on this server (it serves: {})",
            known.join(", ")
        ),
    }
}

/// The gRPC status a failed call answers with.
fn status_of(e: &Error) -> tonic::Status {
    let text = e.to_string();
    match e {
        Error::InvalidArgument { message } => tonic::Status::invalid_argument(message.as_str()),
        e if e.is_retryable() => tonic::Status::unavailable(text),
        _ => tonic::Status::failed_precondition(text),
    }
}

/// `headcount.ids.v1.Ids` as a tower service, for [`tonic::transport::Server`].
#[derive(Debug, Clone)]
pub struct IdsServer {
    service: IdsService,
}

impl IdsServer {
    /// The gRPC service of `service`.
    pub fn new(service: IdsService) -> Self {
        IdsServer { service }
    }
}

/// The unary method `Next`, as tonic's server side calls it.
struct NextMethod(IdsService);

impl tonic::server::UnaryService<proto::NextRequest> for NextMethod {
    type Response = proto::NextReply;
    type Future = BoxFuture<tonic::Response<proto::NextReply>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<proto::NextRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            service
                .answer(request.into_inner())
                .await
                .map(tonic::Response::new)
        })
    }
}

impl<B> Service<http::Request<B>> for IdsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != NEXT_PATH {
            return Box::pin(async {
                Ok(tonic::Status::unimplemented("headcount.ids.v1.Ids has only Next").into_http())
            });
        }
        let method = NextMethod(self.service.clone());
        // A connection waiting for its answer is not idle, however long the round takes.
        let busy = request
            .extensions()
            .get::<ConnectionInfo>()
            .map(ConnectionInfo::busy);
        Box::pin(async move {
            let _busy = busy;
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(method, request).await)
        })
    }
}

impl tonic::server::NamedService for IdsServer {
    const NAME: &'static str = SERVICE_NAME;
}

/// A running IDs server; see [`serve`]. Dropping it shuts the server down.
#[derive(Debug)]
pub struct RunningIdsServer {
    addr: SocketAddr,
    task: Background,
    registry: Arc<Registry>,
}

impl RunningIdsServer {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connections open now (see [`ServeOptions`]).
    pub fn open_connections(&self) -> usize {
        self.registry.len()
    }

    /// Stops accepting calls, lets the calls under way finish, and waits for the server.
    pub async fn shutdown(self) -> Result<()> {
        self.task.stop().await
    }

    /// Waits until the server ends (it only does after [`RunningIdsServer::shutdown`], or
    /// when it fails: then [`Error::Stopped`] says why).
    pub async fn wait(&self) -> Result<()> {
        self.task.wait().await
    }
}

/// The most connections an IDs server keeps open by default (see [`ServeOptions`]).
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// How long a connection may sit idle by default before the server closes it (see
/// [`ServeOptions`]).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How an IDs server treats its connections.
///
/// * **Idle timeout**: a connection with no call in flight that sends and receives nothing for
///   this long is closed ([`IdsClient`] connects again at its next call).
/// * **Connection cap**: when a connection arrives with this many open, the one idle longest
///   (no call in flight) is closed to make room, or the newcomer when every connection has a
///   call in flight. Keep it well below the process's file descriptor limit (`ulimit -n`): the
///   stores' connections need descriptors too.
///
/// When `accept` fails for want of file descriptors anyway, the server closes its idlest
/// connection, logs a warning (at most one every 10 s) and waits before the next attempt
/// (5 ms doubling to 1 s), instead of retrying at once and spinning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    max_connections: usize,
    idle_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

impl ServeOptions {
    /// The most connections open at once (at least 1; default [`DEFAULT_MAX_CONNECTIONS`]).
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max;
        self
    }

    /// How long a connection may sit idle (above zero; default [`DEFAULT_IDLE_TIMEOUT`]). Calls
    /// in flight do not count as idleness, whatever their deadline.
    pub fn with_idle_timeout(mut self, idle: Duration) -> Self {
        self.idle_timeout = idle;
        self
    }

    /// The connection cap.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// The idle timeout.
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }

    fn check(&self) -> Result<()> {
        if self.max_connections == 0 {
            return Err(Error::invalid(
                "an IDs server needs a connection cap of at least 1",
            ));
        }
        if self.idle_timeout.is_zero() {
            return Err(Error::invalid(
                "an IDs server needs an idle timeout above zero",
            ));
        }
        Ok(())
    }
}

/// Serves `service` and the standard health service on `listener`, in a task (call it within a
/// Tokio runtime), with the default [`ServeOptions`].
pub async fn serve(listener: TcpListener, service: IdsService) -> Result<RunningIdsServer> {
    serve_with(listener, service, ServeOptions::default()).await
}

/// [`serve`] with a connection cap and idle timeout of one's own.
pub async fn serve_with(
    listener: TcpListener,
    service: IdsService,
    options: ServeOptions,
) -> Result<RunningIdsServer> {
    options.check()?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::invalid(format!("the listener has no local address: {e}")))?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status(SERVICE_NAME, tonic_health::ServingStatus::Serving)
        .await;
    let what = format!("the IDs server on {addr}");
    let failed = what.clone();
    let registry = Registry::new(options.max_connections, options.idle_timeout);
    let incoming = connections::incoming(listener, registry.clone());
    let closing = registry.clone();
    let task = Background::spawn(what, OnDrop::Stop, |stop| async move {
        tonic::transport::Server::builder()
            .add_service(health)
            .add_service(IdsServer::new(service))
            .serve_with_incoming_shutdown(incoming, async move {
                stop_requested(stop).await;
                // The shutdown waits for each connection to finish its calls; one that never
                // spoke would keep it waiting until its idle timeout.
                closing.close_silent();
                // Keep answering health checks as NOT_SERVING while the calls under way end.
                reporter
                    .set_service_status(SERVICE_NAME, tonic_health::ServingStatus::NotServing)
                    .await;
            })
            .await
            .map_err(|e| Error::stopped(failed, format!("it failed: {}", with_sources(&e))))
    });
    Ok(RunningIdsServer {
        addr,
        task,
        registry,
    })
}

/// A client of one or more IDs servers over the same stores: calls go to the server that
/// answered last, and move on to the next one when it cannot be reached, answers `UNAVAILABLE`
/// or does not answer within its share of the deadline (what is left, divided among the servers
/// not tried yet), until one answers or the deadline passes.
#[derive(Debug)]
pub struct IdsClient {
    servers: Vec<(String, tonic::transport::Channel)>,
    current: AtomicUsize,
    deadline: Duration,
}

impl IdsClient {
    /// A client of `servers` (`host:port` or `http://host:port`; at least one), each call
    /// given `deadline` in all. Connections are made on first use.
    pub fn new(servers: &[String], deadline: Duration) -> Result<Self> {
        if servers.is_empty() {
            return Err(Error::invalid("an IDs client needs at least one server"));
        }
        if deadline.is_zero() {
            return Err(Error::invalid("an IDs client needs a deadline above zero"));
        }
        let mut out = Vec::new();
        for s in servers {
            let s = s.trim();
            let uri = if s.contains("://") {
                s.to_owned()
            } else {
                format!("http://{s}")
            };
            let endpoint = tonic::transport::Endpoint::from_shared(uri.clone())
                .map_err(|e| Error::invalid(format!("`{s}` is not a server address: {e}")))?;
            let has_port = endpoint.uri().port_u16().is_some();
            if endpoint.uri().host().is_none_or(str::is_empty) || !has_port {
                return Err(Error::invalid(format!(
                    "`{s}` is not a server address: give host:port"
                )));
            }
            let channel = endpoint
                .connect_timeout(deadline)
                .tcp_nodelay(true)
                .connect_lazy();
            out.push((s.to_owned(), channel));
        }
        Ok(IdsClient {
            servers: out,
            current: AtomicUsize::new(0),
            deadline,
        })
    }

    /// One ID of generator `key`.
    pub async fn next(&self, key: &str) -> Result<i64> {
        self.next_block(key, 1).await.map(|ids| *ids.start())
    }

    /// `count` consecutive IDs (1 to 2^20) of generator `key`.
    pub async fn next_block(&self, key: &str, count: u64) -> Result<RangeInclusive<i64>> {
        check_block(count)?;
        let deadline = tokio::time::Instant::now() + self.deadline;
        let start = self.current.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for step in 0..self.servers.len() {
            let i = (start + step) % self.servers.len();
            let (name, channel) = &self.servers[i];
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            // An equal share of what is left for each server not tried yet, so a server that
            // hangs (stopped, black-holed) leaves time for the next.
            let tries_left = u32::try_from(self.servers.len() - step).unwrap_or(u32::MAX);
            let left = left / tries_left.max(1);
            let call = async {
                let mut grpc = tonic::client::Grpc::new(channel.clone());
                grpc.ready().await.map_err(|e| {
                    tonic::Status::unavailable(format!("cannot connect: {}", with_sources(&e)))
                })?;
                let mut request = tonic::Request::new(proto::NextRequest {
                    key: key.to_owned(),
                    count,
                });
                request.set_timeout(left);
                let path = http::uri::PathAndQuery::from_static(NEXT_PATH);
                grpc.unary::<_, proto::NextReply, _>(
                    request,
                    path,
                    tonic_prost::ProstCodec::default(),
                )
                .await
            };
            let answer = match tokio::time::timeout(left, call).await {
                Ok(answer) => answer,
                Err(_) => Err(tonic::Status::deadline_exceeded("no answer in time")),
            };
            match answer {
                Ok(reply) => {
                    self.current.store(i, Ordering::Relaxed);
                    let reply = reply.into_inner();
                    if reply.count != count {
                        return Err(Error::Rejected {
                            backend: RECIPE,
                            message: format!(
                                "server {name} answered {} IDs for {count}",
                                reply.count
                            ),
                            source: None,
                        });
                    }
                    let last = i64::try_from(count)
                        .ok()
                        .and_then(|c| reply.first.checked_add(c - 1))
                        .ok_or_else(|| Error::Rejected {
                            backend: RECIPE,
                            message: format!("server {name} answered a block past i64::MAX"),
                            source: None,
                        })?;
                    return Ok(reply.first..=last);
                }
                Err(status) => match status.code() {
                    tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Unknown
                    | tonic::Code::Cancelled
                    | tonic::Code::Unimplemented => {
                        tracing::debug!(server = %name, status = %status.message(), "IDs server failed; trying the next");
                        failures.push(format!("{name}: {}", status.message()));
                        // Later calls start at the next server, not at this one.
                        let _ = self.current.compare_exchange(
                            i,
                            (i + 1) % self.servers.len(),
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                    }
                    tonic::Code::NotFound | tonic::Code::InvalidArgument => {
                        return Err(Error::InvalidArgument {
                            message: format!("{name}: {}", status.message()),
                        })
                    }
                    _ => {
                        return Err(Error::Rejected {
                            backend: RECIPE,
                            message: format!("{name}: {}", status.message()),
                            source: None,
                        })
                    }
                },
            }
        }
        Err(Error::Unavailable {
            backend: RECIPE,
            message: format!(
                "no IDs server answered within {:?} ({})",
                self.deadline,
                if failures.is_empty() {
                    "none tried".to_owned()
                } else {
                    failures.join("; ")
                }
            ),
            source: None,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Instant;

    use tokio::io::AsyncReadExt as _;

    use super::*;
    use crate::memory::MemoryStore;
    use crate::recipes::ids::{DurabilityPolicy, IdsConfig, MajorityIds};
    use crate::sim::{Faults, FaultyStore};
    use crate::{DynStore, SystemClock};

    const IDLE: Duration = Duration::from_millis(400);

    /// Generator `default` over three in-memory stores whose calls `faults` can hold.
    async fn service(faults: &Arc<Faults>) -> IdsService {
        let stores: Vec<DynStore> = (0..3)
            .map(|_| {
                Arc::new(FaultyStore::new(
                    Arc::new(MemoryStore::new()),
                    faults.clone(),
                    Arc::new(SystemClock::new()),
                )) as DynStore
            })
            .collect();
        let config = IdsConfig::new("default")
            .with_durability(DurabilityPolicy::AllowNonDurable)
            .with_deadline(Duration::from_secs(10));
        let ids = MajorityIds::new(stores, config).await.unwrap();
        IdsService::new(vec![MediatedIds::new(ids)]).unwrap()
    }

    /// A server of [`service`] with a cap of four connections and a short idle timeout.
    async fn server(faults: &Arc<Faults>) -> RunningIdsServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let options = ServeOptions::default()
            .with_max_connections(4)
            .with_idle_timeout(IDLE);
        serve_with(listener, service(faults).await, options)
            .await
            .unwrap()
    }

    /// Reads until the server closes the connection (end of file, or a reset); panics after 5 s.
    async fn closed_by_the_server(stream: &mut tokio::net::TcpStream) {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
        read.await
            .expect("the server never closed a silent connection");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silent_connections_are_closed_and_a_real_client_still_gets_in() {
        let faults = Faults::new(1);
        let server = server(&faults).await;
        let addr = server.local_addr();
        let mut silent = Vec::new();
        for _ in 0..20 {
            silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let client = IdsClient::new(&[addr.to_string()], Duration::from_secs(5)).unwrap();
        let first = client
            .next("default")
            .await
            .expect("an ID past 20 silent connections");
        for stream in &mut silent {
            closed_by_the_server(stream).await;
        }
        // The client's own connection, idle past the timeout, was closed too: its channel
        // connects again.
        tokio::time::sleep(IDLE * 2).await;
        let second = client.next("default").await.expect("an ID after idling");
        assert!(second > first);
        // Thirty more that say nothing: at most the cap stays open.
        let mut more = Vec::new();
        for _ in 0..30 {
            more.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            server.open_connections() <= 5,
            "{} open",
            server.open_connections()
        );
        server.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_in_flight_is_not_idleness() {
        let faults = Faults::new(1);
        let server = server(&faults).await;
        let client = Arc::new(
            IdsClient::new(&[server.local_addr().to_string()], Duration::from_secs(10)).unwrap(),
        );
        client.next("default").await.unwrap();
        // The stores hold every call for three idle timeouts: the connection stays open.
        faults.pause();
        let call = tokio::spawn({
            let client = client.clone();
            async move { client.next("default").await }
        });
        let held = Instant::now();
        tokio::time::sleep(IDLE * 3).await;
        faults.resume();
        let id = call
            .await
            .unwrap()
            .expect("a call held past the idle timeout");
        assert!(id >= 2 && held.elapsed() >= IDLE * 3);
        server.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn options_are_checked() {
        let service = service(&Faults::new(1)).await;
        for options in [
            ServeOptions::default().with_max_connections(0),
            ServeOptions::default().with_idle_timeout(Duration::ZERO),
        ] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let e = serve_with(listener, service.clone(), options).await;
            assert!(matches!(e, Err(Error::InvalidArgument { .. })), "{e:?}");
        }
    }
}
