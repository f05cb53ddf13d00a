//! Telling a connection to the PostgreSQL server itself from one to a pooler (PgBouncer and the
//! like), which decides whether the store may prepare named statements on it.
//!
//! A named prepared statement lives in one server session. Behind a pooler in transaction mode,
//! each transaction may run on another server connection: the execution of a statement prepared
//! earlier then finds no such statement (SQLSTATE 26000), or, worse, finds another client's
//! statement of the same name (tokio-postgres numbers them `s0`, `s1`, ... in every process) and
//! runs it with our parameters when their number and types fit. So a connection may prepare named
//! statements only when it is known to be one session of the server; everywhere else the store
//! sends each statement as the unnamed statement, with its parameter types, in one round trip
//! (`query_typed`), which costs the server a parse and a plan per call.
//!
//! The test: when a connection opens, the server announces its process id and a secret key
//! (`BackendKeyData`), for cancel requests. A connection to the server itself (also through a TCP
//! proxy or a port forward) runs in that very process: `SELECT pg_backend_pid()` answers the
//! announced id. A pooler announces a key of its own, since a cancel request comes to it and it
//! must find the server connection that runs the client's query at that moment; PgBouncer's is
//! random, in every pool mode. tokio-postgres keeps the announced key to itself, but its
//! [`CancelToken`](tokio_postgres::CancelToken) writes it into a cancel request: written into
//! memory instead of a socket, the request gives the key back.

use std::future::{ready, Ready};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, TlsConnect, TlsStream};
use tokio_postgres::{Client, SimpleQueryMessage};

/// The code of a `CancelRequest` (PostgreSQL protocol 3), after its length.
const CANCEL_REQUEST_CODE: i32 = 80_877_102;

/// The key the handshake of `client`'s connection announced (`BackendKeyData`): the server's
/// process id and the secret key. `None` if the cancel request it would send cannot be read back.
pub(crate) async fn announced_key(client: &Client) -> Option<(i32, i32)> {
    let mut sink = CancelSink::default();
    client
        .cancel_token()
        .cancel_query_raw(&mut sink, Plain)
        .await
        .ok()?;
    cancel_key(&sink.written)
}

/// Whether the connection of `client`, whose handshake announced the process id `announced`,
/// runs in that server process: true for a connection to the server itself, false through a
/// pooler.
pub(crate) async fn reaches_the_announced_process(
    client: &Client,
    announced: i32,
) -> Result<bool, tokio_postgres::Error> {
    // The simple protocol: no statement, named or not, is left behind.
    let messages = client.simple_query("SELECT pg_backend_pid()").await?;
    let backend = messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(0)?.parse::<i32>().ok(),
        _ => None,
    });
    Ok(backend == Some(announced))
}

/// The process id and secret key of the `CancelRequest` that ends `written` (an `SSLRequest` may
/// come first).
fn cancel_key(written: &[u8]) -> Option<(i32, i32)> {
    let start = written.len().checked_sub(16)?;
    let request = written.get(start..)?;
    let int = |at: usize| {
        request
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(i32::from_be_bytes)
    };
    (int(0)? == 16 && int(4)? == CANCEL_REQUEST_CODE).then_some((int(8)?, int(12)?))
}

/// Where a [`CancelToken`](tokio_postgres::CancelToken) writes its cancel request instead of a
/// server: it keeps what is written, and answers an `SSLRequest` with `S` so that the request
/// follows, in plain text ([`Plain`]), whatever the connection's `sslmode`.
#[derive(Default)]
struct CancelSink {
    written: Vec<u8>,
    answered: bool,
}

impl AsyncRead for CancelSink {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.answered && buf.remaining() > 0 {
            buf.put_slice(b"S");
            self.answered = true;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for CancelSink {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.written.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A "TLS" connector that leaves the stream as it is, for [`CancelSink`].
struct Plain;

impl<S: AsyncRead + AsyncWrite + Unpin> TlsConnect<S> for Plain {
    type Stream = PlainStream<S>;
    type Error = io::Error;
    type Future = Ready<io::Result<PlainStream<S>>>;

    fn connect(self, stream: S) -> Self::Future {
        ready(Ok(PlainStream(stream)))
    }
}

/// The stream of [`Plain`]: the stream itself.
struct PlainStream<S>(S);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PlainStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PlainStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PlainStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(pid: i32, key: i32) -> Vec<u8> {
        [16, CANCEL_REQUEST_CODE, pid, key]
            .iter()
            .flat_map(|i| i.to_be_bytes())
            .collect()
    }

    #[test]
    fn the_key_is_read_back_from_the_cancel_request() {
        assert_eq!(cancel_key(&request(4242, -7)), Some((4242, -7)));
        // After an SSLRequest (length 8, code 80877103).
        let mut written: Vec<u8> = [8, 80_877_103]
            .iter()
            .flat_map(|i: &i32| i.to_be_bytes())
            .collect();
        written.extend(request(1, 2));
        assert_eq!(cancel_key(&written), Some((1, 2)));
        assert_eq!(cancel_key(&request(1, 2)[1..]), None);
        let mut other = request(1, 2);
        other[7] ^= 1;
        assert_eq!(cancel_key(&other), None);
        assert_eq!(cancel_key(b""), None);
    }
}
