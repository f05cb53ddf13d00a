//! Connecting to an etcd cluster (credentials, TLS), measuring its minimum lease TTL, and sending
//! a request again while it certainly never left.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, KvClient, TlsOptions, WatchClient};
use headcount_core::{Error, Result};

use crate::config::EtcdConfig;
use crate::endpoints::Endpoints;
use crate::errors::{self, BACKEND};
use crate::leases::Leases;
use crate::probe;

/// The placeholder URL of a store over an application's client: only its default options are
/// used.
pub(crate) const CLIENT_DEFAULTS: &str = "etcd://localhost";

/// A connection: the clients of the key-value and watch services, the lease cache, and the
/// endpoint in use.
pub(crate) type Connected = (KvClient, WatchClient, Leases, Arc<Endpoints>);

/// Connects to the cluster `config` names, authenticates, and measures the server's minimum
/// lease TTL, within the deadline. When that fails retryably, each plain-text endpoint is asked
/// whether it speaks HTTP/2 at all: one that answers as no HTTP/2 server does (a Redis, an
/// HTTP/1 service behind a wrong port) makes the failure [`Error::Rejected`], since retrying
/// will not help.
pub(crate) async fn open(config: &EtcdConfig) -> Result<Connected> {
    match connect(config).await {
        Err(e) if e.is_retryable() && !config.tls() => {
            match probe::not_http2(config.endpoints(), config.timeout()).await {
                Some(found) => Err(Error::Rejected {
                    backend: BACKEND,
                    message: format!(
                        "{found} to HTTP/2's opening, which etcd's gRPC API runs on: is this the \
                     port of an etcd server? (connecting: {e})"
                    ),
                    source: None,
                }),
                None => Err(e),
            }
        }
        other => other,
    }
}

async fn connect(config: &EtcdConfig) -> Result<Connected> {
    let timeout = config.timeout();
    let mut options = ConnectOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(timeout)
        .with_keep_alive(Duration::from_secs(5), timeout);
    if let (Some(user), Some(password)) = (config.username(), config.password()) {
        // Auth tokens expire (etcd's `--auth-token-ttl`, or a JWT's `ttl`): the client logs
        // in again with these credentials when the server says the token is invalid, and
        // sends the request again.
        options = options
            .with_user(user, password)
            .with_auto_token_refresh(true);
    }
    if config.tls() {
        let mut tls = TlsOptions::new().with_webpki_roots();
        if let Some(path) = config.ca_cert() {
            let pem = tokio::fs::read(path).await.map_err(|e| {
                Error::config(format!(
                    "cannot read the etcd CA certificate {}: {e}",
                    path.display()
                ))
            })?;
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
        }
        if let Some(domain) = config.domain() {
            tls = tls.domain_name(domain);
        }
        options = options.with_tls(tls);
    }
    let deadline = config.deadline();
    let password = config.password().map(str::to_owned);
    let classify = |e| errors::classify(e, "connect", deadline, password.as_deref());
    // One endpoint at a time ([`Endpoints`]): the first of the URL that answers within the
    // deadline, each tried in turn while the failure may be that endpoint's alone.
    let urls = config.endpoint_urls();
    let first = first_endpoint(urls.len());
    let mut failed = None;
    for tried in 0..urls.len() {
        let index = (first + tried) % urls.len();
        let url = &urls[index];
        let options = options.clone();
        let work = async {
            let client = Client::connect([url.as_str()], Some(options))
                .await
                .map_err(classify)?;
            let endpoints = Endpoints::pinned_to(client.clone(), urls.clone(), index);
            let leases = Leases::measure(client.lease_client(), timeout, endpoints.clone())
                .await
                .map_err(classify)?;
            Ok::<_, Error>((client.kv_client(), client.watch_client(), leases, endpoints))
        };
        match deadline.run("connect", work).await {
            Ok(connected) => return Ok(connected),
            Err(e) if e.is_retryable() && tried + 1 < urls.len() => {
                tracing::debug!(endpoint = %url, error = %e, "etcd: connecting to this endpoint failed; trying the next one of the URL");
                failed = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(failed.unwrap_or_else(|| Error::config("an etcd URL names no endpoint")))
}

/// Which of `n` endpoints a process tries first: one at random, so that the processes of a
/// deployment spread over the cluster's members as the client's balancer spread them before.
fn first_endpoint(n: usize) -> usize {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mixed = u64::from(nanos ^ std::process::id().rotate_left(16));
    // Below `n`, which is a usize.
    (mixed % n.max(1) as u64) as usize
}

/// Measures the minimum lease TTL of the server behind an application's client, within the
/// deadline of `config`.
pub(crate) async fn measure(client: &Client, config: &EtcdConfig) -> Result<Leases> {
    let deadline = config.deadline();
    let measure = async {
        Leases::measure(
            client.lease_client(),
            deadline.after(),
            Endpoints::unmanaged(),
        )
        .await
        .map_err(|e| errors::classify(e, "connect", deadline, None))
    };
    deadline.run("connect", measure).await
}

/// Runs `call`, again while the failure says the request never left (the endpoint in use
/// refused the connection: the next call goes to the next endpoint of the URL, see
/// [`Endpoints::move_off`]). The caller's deadline bounds the loop.
pub(crate) async fn retry_unsent<T, F, Fut>(
    endpoints: &Endpoints,
    mut call: F,
) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let mut attempt: u64 = 0;
    loop {
        let seen = endpoints.pinned();
        match call().await {
            Err(e) if errors::never_sent(&e) && attempt < 50 => {
                endpoints.move_off(seen).await;
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(2 * attempt.min(10))).await;
            }
            other => return other,
        }
    }
}
