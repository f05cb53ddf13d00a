//! Asking a server what it speaks, after connecting to it failed in a way that looks passing.
//!
//! A store URL whose port belongs to another kind of server (a Redis where PostgreSQL was meant,
//! an HTTP service where etcd was) often fails like a slow or restarting store: a timeout, a
//! connection closed. Those are retryable, so a supervisor would retry a wrong port forever. A
//! backend can then send the server something its own protocol answers in a known way and
//! another protocol answers differently, and make the failure permanent when the answer is one
//! its server never gives. [`first_bytes`] is the exchange; the judgment is the backend's.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The longest a probe waits for an answer: a server that speaks answers a probe at once. A
/// backend gives it no more than its own operation deadline either, so that a failure to
/// connect still ends within about twice the deadline.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Connects to `host:port`, sends `message`, and returns what the server answered: up to
/// `enough` bytes (or more if they came at once), or what came before it closed the connection
/// or `within` passed. `None` when it could not connect or send, or nothing came.
pub async fn first_bytes(
    host: &str,
    port: u16,
    message: &[u8],
    enough: usize,
    within: Duration,
) -> Option<Vec<u8>> {
    let mut reply = Vec::new();
    let exchange = async {
        let mut stream = TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(message).await.ok()?;
        let mut buf = [0u8; 256];
        while reply.len() < enough.max(1) {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => reply.extend_from_slice(&buf[..n]),
            }
        }
        Some(())
    };
    let _ = tokio::time::timeout(within, exchange).await;
    (!reply.is_empty()).then_some(reply)
}

/// The first line of `reply`, at most 48 characters, quoted, for an error line:
/// `"-ERR unknown command 'PRI', with args beginning ..."`.
pub fn quote_reply(reply: &[u8]) -> String {
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

    /// A server on a free port that answers each connection with `reply` (in two writes) once
    /// it got bytes, or says nothing for an empty `reply`, and closes when `close`.
    async fn answering(reply: &'static [u8], close: bool) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    let _ = stream.read(&mut buf).await;
                    let (a, b) = reply.split_at(reply.len() / 2);
                    let _ = stream.write_all(a).await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let _ = stream.write_all(b).await;
                    if !close {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn the_first_bytes_of_the_answer_or_none() {
        let within = Duration::from_millis(300);
        let port = answering(b"-ERR unknown command\r\n", false).await;
        let reply = first_bytes("127.0.0.1", port, b"x\r\n", 9, within).await;
        assert!(reply
            .as_deref()
            .is_some_and(|r| r.starts_with(b"-ERR unkn")));
        // Fewer bytes than asked for: what came before the close, or before the time ran out.
        let port = answering(b"N", true).await;
        assert_eq!(
            first_bytes("127.0.0.1", port, b"x", 9, within).await,
            Some(b"N".to_vec())
        );
        let port = answering(b"abc", false).await;
        assert_eq!(
            first_bytes("127.0.0.1", port, b"x", 9, within).await,
            Some(b"abc".to_vec())
        );
        // Silence, a close without a word, a refused connection.
        let port = answering(b"", false).await;
        assert_eq!(first_bytes("127.0.0.1", port, b"x", 9, within).await, None);
        let port = answering(b"", true).await;
        assert_eq!(first_bytes("127.0.0.1", port, b"x", 9, within).await, None);
        assert_eq!(first_bytes("127.0.0.1", 1, b"x", 9, within).await, None);
    }

    #[test]
    fn replies_are_quoted_on_one_short_line() {
        assert_eq!(
            quote_reply(b"HTTP/1.1 400 Bad Request\r\nx"),
            "\"HTTP/1.1 400 Bad Request\""
        );
        let long = quote_reply(&[b'a'; 100]);
        assert!(long.ends_with("...\"") && long.len() < 60, "{long}");
        assert_eq!(quote_reply(b"\x00\x01"), "\"\\0\\u{1}\"");
    }
}
