//! Telling "etcd is down" from "this is not etcd" after connecting failed.
//!
//! An `etcd://` URL pointed at another kind of server (a Redis, an HTTP/1 service) fails in
//! ways that look passing: our HTTP/2 client reads the other protocol's reply as a frame of an
//! absurd size and drops the connection, and the call under way reports a protocol error or
//! just "connection closed", both retryable, so a supervisor would retry a wrong port forever.
//! After a retryable failure to connect, [`not_http2`] opens each plain-text endpoint once
//! more and sends HTTP/2's client preface: an HTTP/2 server (etcd's gRPC) answers with a
//! SETTINGS frame first, always. Only an answer that is not one makes the failure permanent;
//! silence, a closed or refused connection leave it as it was.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The client connection preface, then an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// The type of a SETTINGS frame, the fourth byte of its header.
const SETTINGS: u8 = 0x04;

/// How long each endpoint has to answer the probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The first of `endpoints` (host, port) that answers HTTP/2's preface as no HTTP/2 server
/// would, with what it answered: `127.0.0.1:6379 answered "-ERR unknown command ..."`. `None`
/// when every endpoint is silent, closes the connection, is unreachable, or speaks HTTP/2.
pub(crate) async fn not_http2(endpoints: &[(String, u16)]) -> Option<String> {
    for (host, port) in endpoints {
        if let Some(reply) = probe(host, *port).await {
            if reply.len() >= 4 && reply[3] != SETTINGS {
                return Some(format!("{host}:{port} answered {}", shown(&reply)));
            }
        }
    }
    None
}

/// The first bytes (up to a frame header's nine) `host:port` answers to the preface within
/// [`PROBE_TIMEOUT`].
async fn probe(host: &str, port: u16) -> Option<Vec<u8>> {
    let mut reply = Vec::new();
    let exchange = async {
        let mut stream = TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(PREFACE).await.ok()?;
        let mut buf = [0u8; 64];
        while reply.len() < 9 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => reply.extend_from_slice(&buf[..n]),
            }
        }
        Some(())
    };
    let _ = tokio::time::timeout(PROBE_TIMEOUT, exchange).await;
    (!reply.is_empty()).then_some(reply)
}

/// The start of a reply, quoted, for an error line.
fn shown(reply: &[u8]) -> String {
    let text = String::from_utf8_lossy(reply);
    let line = text.lines().next().unwrap_or("");
    let mut shown: String = line.chars().take(48).collect();
    if shown.len() < line.len() {
        shown.push_str("...");
    }
    format!("{shown:?}")
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

    fn at(port: u16) -> Vec<(String, u16)> {
        vec![("127.0.0.1".to_owned(), port)]
    }

    #[tokio::test]
    async fn other_protocols_are_told_from_http2() {
        let redis = answering(b"-ERR unknown command 'PRI', with args beginning with: \r\n").await;
        let found = not_http2(&at(redis)).await;
        assert!(
            found
                .as_deref()
                .is_some_and(|f| f.contains("-ERR unknown command")),
            "{found:?}"
        );
        let http1 = answering(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        assert!(not_http2(&at(http1)).await.is_some());
        // A SETTINGS frame (empty, then one setting) is HTTP/2.
        let h2 = answering(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00").await;
        assert_eq!(not_http2(&at(h2)).await, None);
        let h2 = answering(b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64").await;
        assert_eq!(not_http2(&at(h2)).await, None);
        // Silence, or a refused connection, stays as it was.
        let silent = answering(b"").await;
        assert_eq!(not_http2(&at(silent)).await, None);
        assert_eq!(not_http2(&at(1)).await, None);
    }
}
