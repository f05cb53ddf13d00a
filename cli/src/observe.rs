//! Logs and metrics of the commands: `--log-format text|json` on stderr (no ANSI colours unless
//! stderr is a terminal), and `--metrics-addr` serving headcount's metrics for Prometheus.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use headcount::Error;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::{TcpListener, TcpStream};

use crate::http;

/// How log lines on stderr are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per event, with its spans.
    Json,
}

impl LogFormat {
    /// Parses `text` or `json`; anything else is a one-line configuration error.
    pub fn parse(text: Option<&str>) -> Result<LogFormat, String> {
        match text.map(str::trim) {
            None | Some("text") => Ok(LogFormat::Text),
            Some("json") => Ok(LogFormat::Json),
            Some(other) => Err(format!(
                "--log-format is `text` or `json`, not `{}`",
                other.escape_debug()
            )),
        }
    }
}

/// Installs the logger: `RUST_LOG` when set, else `default_filter`; events on stderr.
pub fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// The `--metrics-addr` option of the long-running commands.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics on this address (`127.0.0.1:9464`, `0.0.0.0:9464`; port 0 picks
    /// a free one, logged at start) at `/metrics`. See docs/observability.md.
    #[arg(long, env = "HEADCOUNT_METRICS_ADDR", value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
}

/// The log target of the "serving metrics" line, on by default so a user of port 0 learns the
/// port.
pub const METRICS_LOG_TARGET: &str = "headcount::metrics";

/// Whether this process follows a member's readiness (0: it does not), and its answer: 1 not
/// ready, 2 ready. `/ready` answers it.
static READY: AtomicU8 = AtomicU8::new(0);

/// Whether the member works (owns its share; a standby that waits does not), for `/working`:
/// 0 not followed, 1 not working, 2 working.
static WORKING: AtomicU8 = AtomicU8::new(0);

/// Sets what `/ready` and `/working` answer (see `lifecycle::Readiness`).
pub fn set_ready(ready: bool, working: bool) {
    READY.store(if ready { 2 } else { 1 }, Ordering::Relaxed);
    WORKING.store(if working { 2 } else { 1 }, Ordering::Relaxed);
}

/// Binds `addr`, installs the Prometheus recorder and serves `/metrics` in the background for
/// the rest of the process. Fails (before anything else happens) when the address cannot be
/// bound.
pub async fn serve_metrics(addr: &str) -> Result<SocketAddr, Error> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::config(format!("cannot serve metrics on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::config(format!("cannot serve metrics on {addr}: {e}")))?;
    let handle = PrometheusBuilder::new()
        // Buckets make every histogram a Prometheus histogram (aggregatable across members)
        // instead of a per-process summary. The same call docs/observability.md gives
        // applications.
        .set_buckets_for_metric(
            Matcher::Prefix(headcount::metrics::NAME_PREFIX.to_owned()),
            headcount::metrics::DURATION_BUCKETS,
        )
        .map_err(|e| Error::config(format!("cannot set up the metrics buckets: {e}")))?
        .install_recorder()
        .map_err(|e| Error::config(format!("cannot install the metrics recorder: {e}")))?;
    headcount::metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        // Histograms keep their samples until upkeep drains them into their buckets.
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(accept(listener, handle));
    tracing::info!(target: METRICS_LOG_TARGET, addr = %local, "serving Prometheus metrics at http://{local}/metrics");
    Ok(local)
}

async fn accept(listener: TcpListener, handle: PrometheusHandle) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let handle = handle.clone();
                tokio::spawn(async move {
                    // A client that stalls is dropped; nothing else depends on it.
                    let _ =
                        tokio::time::timeout(Duration::from_secs(10), answer(stream, handle)).await;
                });
            }
            Err(e) => {
                tracing::warn!(target: METRICS_LOG_TARGET, error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One HTTP/1.x exchange: `GET /metrics` (or `/`) gets the Prometheus text, `/ready` and
/// `/working` the member's state, `/group` and below the group page when `run` or `exec`
/// installed one ([`crate::page::installed`]); anything else 404 or 405.
async fn answer(mut stream: TcpStream, handle: PrometheusHandle) -> std::io::Result<()> {
    let Some(request) = http::read_request(&mut stream).await? else {
        return Ok(());
    };
    let method = request.method.as_str();
    let (status, body) = match (method, request.path.as_str()) {
        ("GET" | "HEAD", path) if path == "/group" || path.starts_with("/group/") => {
            let response = match crate::page::installed() {
                Some(page) => page.respond(&request).await,
                None => http::Response::text(
                    "404 Not Found",
                    "no group page here: /group is served by `run` and `exec` in group mode\n",
                ),
            };
            return http::write_response(&mut stream, method, &response).await;
        }
        ("GET" | "HEAD", "/metrics" | "/") => ("200 OK", handle.render()),
        ("GET" | "HEAD", "/ready") => match READY.load(Ordering::Relaxed) {
            2 if WORKING.load(Ordering::Relaxed) == 2 => ("200 OK", "ready\n".to_owned()),
            2 => ("200 OK", "ready (standing by)\n".to_owned()),
            1 => ("503 Service Unavailable", "not ready\n".to_owned()),
            _ => (
                "404 Not Found",
                "no readiness here: /ready is served by `run` and `exec` in group mode\n"
                    .to_owned(),
            ),
        },
        ("GET" | "HEAD", "/working") => match WORKING.load(Ordering::Relaxed) {
            2 => ("200 OK", "working\n".to_owned()),
            1 => (
                "503 Service Unavailable",
                "not working (joining, standing by, or in no view)\n".to_owned(),
            ),
            _ => (
                "404 Not Found",
                "no membership here: /working is served by `run` and `exec` in group mode\n"
                    .to_owned(),
            ),
        },
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "not found: try /metrics, /ready, /working or /group\n".to_owned(),
        ),
        _ => ("405 Method Not Allowed", "use GET\n".to_owned()),
    };
    let response = http::Response {
        status,
        content_type: "text/plain; version=0.0.4; charset=utf-8",
        body: http::Body::Text(body),
    };
    http::write_response(&mut stream, method, &response).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_formats_parse() {
        assert_eq!(LogFormat::parse(None), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse(Some("json")), Ok(LogFormat::Json));
        let e = LogFormat::parse(Some("xml")).unwrap_err();
        assert!(!e.contains('\n') && e.contains("xml"), "{e}");
    }
}
