//! Connecting to an etcd cluster (credentials, TLS), measuring its minimum lease TTL, and sending
//! a request again while it certainly never left.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, KvClient, TlsOptions, WatchClient};
use headcount_core::{Error, Result};

use crate::config::EtcdConfig;
use crate::errors::{self, BACKEND};
use crate::leases::Leases;
use crate::probe;

/// The placeholder URL of a store over an application's client: only its default options are
/// used.
pub(crate) const CLIENT_DEFAULTS: &str = "etcd://localhost";

/// Connects to the cluster `config` names, authenticates, and measures the server's minimum
/// lease TTL, within the deadline. When that fails retryably, each plain-text endpoint is asked
/// whether it speaks HTTP/2 at all: one that answers as no HTTP/2 server does (a Redis, an
/// HTTP/1 service behind a wrong port) makes the failure [`Error::Rejected`], since retrying
/// will not help.
pub(crate) async fn open(config: &EtcdConfig) -> Result<(KvClient, WatchClient, Leases)> {
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

async fn connect(config: &EtcdConfig) -> Result<(KvClient, WatchClient, Leases)> {
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
    let work = async {
        let client = Client::connect(config.endpoint_urls(), Some(options))
            .await
            .map_err(classify)?;
        let leases = Leases::measure(client.lease_client(), timeout)
            .await
            .map_err(classify)?;
        Ok::<_, Error>((client.kv_client(), client.watch_client(), leases))
    };
    deadline.run("connect", work).await
}

/// Measures the minimum lease TTL of the server behind an application's client, within the
/// deadline of `config`.
pub(crate) async fn measure(client: &Client, config: &EtcdConfig) -> Result<Leases> {
    let deadline = config.deadline();
    let measure = async {
        Leases::measure(client.lease_client(), deadline.after())
            .await
            .map_err(|e| errors::classify(e, "connect", deadline, None))
    };
    deadline.run("connect", measure).await
}

/// Runs `call`, again while the failure says the request never left (an endpoint of a
/// several-member cluster refused the connection: the balancer picks another one next). The
/// caller's deadline bounds the loop.
pub(crate) async fn retry_unsent<T, F, Fut>(mut call: F) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let mut attempt: u64 = 0;
    loop {
        match call().await {
            Err(e) if errors::never_sent(&e) && attempt < 50 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(2 * attempt.min(10))).await;
            }
            other => return other,
        }
    }
}
