//! Telling "PostgreSQL is slow" from "this is not PostgreSQL" after connecting timed out.
//!
//! A `postgres://` URL pointed at another kind of server, a Redis or an HTTP service, times out:
//! the client's first message (an `SSLRequest`, or the startup message) starts with NUL bytes
//! and has no line end, and servers of line protocols wait for a line (Redis's parser does not
//! even see past the NUL). A timeout is retryable, so a supervisor would retry a wrong port
//! forever. After a timeout, [`not_postgres`] sends each host one line with a made-up word
//! instead. A PostgreSQL server reads its first four bytes as the length of a startup packet,
//! finds it absurd and closes the connection without a word (PgBouncer may send an
//! `ErrorResponse`, `E`), while a line protocol answers the line: Redis `-ERR unknown command`,
//! HTTP `HTTP/1.1 400`. Only an answer that PostgreSQL never gives makes the failure permanent;
//! silence, a closed or refused connection, or an error message leave it the timeout it was.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_postgres::config::Host;

/// What the probe sends: one line, which PostgreSQL takes for a startup packet of about 1.7 GB.
const PROBE: &[u8] = b"headcount-probe\r\n";

/// How long each host has to answer the probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The first TCP host of `pg` that answers the probe as no PostgreSQL server would, with what it
/// answered: `127.0.0.1:6379 answered "-ERR unknown command ..."`. `None` when every host is
/// silent, closes the connection, is unreachable, or answers with an error message.
pub(crate) async fn not_postgres(pg: &tokio_postgres::Config) -> Option<String> {
    let ports = pg.get_ports();
    for (i, host) in pg.get_hosts().iter().enumerate() {
        let Host::Tcp(name) = host else { continue };
        let port = ports
            .get(i)
            .or(ports.first())
            .copied()
            .unwrap_or(super::DEFAULT_PORT);
        if let Some(reply) = probe(name, port).await {
            if !speaks_postgres(&reply) {
                return Some(format!("{name}:{port} answered {}", shown(&reply)));
            }
        }
    }
    None
}

/// The first bytes `host:port` answers to the probe, if it answers within [`PROBE_TIMEOUT`].
async fn probe(host: &str, port: u16) -> Option<Vec<u8>> {
    let exchange = async {
        let mut stream = TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(PROBE).await.ok()?;
        let mut reply = vec![0; 64];
        let n = stream.read(&mut reply).await.ok()?;
        reply.truncate(n);
        (n > 0).then_some(reply)
    };
    tokio::time::timeout(PROBE_TIMEOUT, exchange)
        .await
        .ok()
        .flatten()
}

/// Whether `reply` can come from a PostgreSQL server or pooler: an `ErrorResponse`.
fn speaks_postgres(reply: &[u8]) -> bool {
    reply.first() == Some(&b'E')
}

/// The start of a reply, quoted, for an error line.
fn shown(reply: &[u8]) -> String {
    let text = String::from_utf8_lossy(reply);
    let line = text.lines().next().unwrap_or("");
    let mut shown: String = line.chars().take(48).collect();
    if shown.len() < line.len() {
        shown.push_str("...");
    }
    format!("{:?}", shown)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use tokio::net::TcpListener;

    use super::*;

    /// A server on a free port that answers every connection with `reply` once it got bytes
    /// (or says nothing, for an empty `reply`).
    async fn answering(reply: &'static [u8]) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    let _ = stream.read(&mut buf).await;
                    if !reply.is_empty() {
                        let _ = stream.write_all(reply).await;
                    }
                    tokio::time::sleep(Duration::from_secs(5)).await;
                });
            }
        });
        port
    }

    fn config(port: u16) -> tokio_postgres::Config {
        let mut pg = tokio_postgres::Config::new();
        pg.host("127.0.0.1").port(port);
        pg
    }

    #[tokio::test]
    async fn a_line_protocol_is_told_from_postgres() {
        let redis =
            answering(b"-ERR unknown command '\x00\x00', with args beginning with: \r\n").await;
        let found = not_postgres(&config(redis)).await;
        assert!(
            found
                .as_deref()
                .is_some_and(|f| f.contains("-ERR unknown command")),
            "{found:?}"
        );
        let http = answering(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        assert!(not_postgres(&config(http)).await.is_some());
        let pooler = answering(b"E\0\0\0\x20SFATAL").await;
        assert_eq!(not_postgres(&config(pooler)).await, None);
        // Silence stays a timeout.
        let silent = answering(b"").await;
        assert_eq!(not_postgres(&config(silent)).await, None);
    }
}
