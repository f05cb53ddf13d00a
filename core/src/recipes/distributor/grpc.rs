//! The standard gRPC health checking protocol (`grpc.health.v1.Health/Check`, via tonic and
//! tonic-health): the distributor's probe, and the server a service runs next to its work.
//! Behind the `grpc` cargo feature.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::pb::health_check_response::ServingStatus as PbStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use super::Health;
use crate::error::{with_sources, Error, Result};
use crate::task::{stop_requested, Background, OnDrop};

/// One health check of the whole server (service name `""`) at `address`, connection included,
/// cut at `timeout`: a server that accepts the connection and never answers counts as down once
/// `timeout` has passed. A fresh connection per check, so a check proves the service accepts
/// connections now.
pub async fn check(address: &str, timeout: Duration) -> Health {
    let endpoint = match tonic::transport::Endpoint::from_shared(address.to_owned()) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => return Health::Down(format!("address {address:?} does not parse: {e}")),
    };
    let call = async {
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("cannot connect: {}", with_sources(&e)))?;
        let mut client = HealthClient::new(channel);
        let answer = client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map_err(|s| format!("health check failed: {} {}", s.code(), s.message()))?;
        Ok::<_, String>(answer.into_inner().status)
    };
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(status)) if status == PbStatus::Serving as i32 => Health::Serving,
        Ok(Ok(status)) => Health::Down(format!(
            "answered {}",
            PbStatus::try_from(status).map_or("an unknown status", |s| s.as_str_name())
        )),
        Ok(Err(why)) => Health::Down(why),
        Err(_) => Health::Down(format!("no answer within {timeout:?}")),
    }
}

/// A running `grpc.health.v1.Health` server; see [`serve_health`]. Dropping it shuts the server
/// down.
#[derive(Debug)]
pub struct HealthServer {
    addr: SocketAddr,
    reporter: HealthReporter,
    task: Background,
}

impl HealthServer {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://{local_addr}`, for [`Liveness::grpc`](super::Liveness::grpc).
    pub fn address(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers SERVING (true) or NOT_SERVING (false) from now on; a NOT_SERVING service counts
    /// as down at the distributor's next poll.
    pub async fn set_serving(&self, serving: bool) {
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.reporter.set_service_status("", status).await;
    }

    /// Stops accepting connections and waits for the server to finish.
    pub async fn shutdown(self) -> Result<()> {
        self.task.stop().await
    }
}

/// Serves `grpc.health.v1.Health` (answering SERVING for the whole server, `""`) on `listener`
/// in a task, for a service that wants the distributor to see it alive. Bind the listener
/// yourself (`TcpListener::bind("0.0.0.0:50051")`) and register its address. Call it from
/// within a Tokio runtime: the server runs in a task spawned there.
pub fn serve_health(listener: TcpListener) -> Result<HealthServer> {
    let addr = listener
        .local_addr()
        .map_err(|e| Error::invalid(format!("the listener has no local address: {e}")))?;
    let (reporter, service) = tonic_health::server::health_reporter();
    let what = format!("the health server on {addr}");
    let failed = what.clone();
    let task = Background::spawn(what, OnDrop::Stop, |stop| async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stop_requested(stop))
            .await
            .map_err(|e| Error::stopped(failed, format!("it failed: {}", with_sources(&e))))
    });
    Ok(HealthServer {
        addr,
        reporter,
        task,
    })
}
