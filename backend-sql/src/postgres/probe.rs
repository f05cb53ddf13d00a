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

use headcount_core::backend::probe::{first_bytes, quote_reply, PROBE_TIMEOUT};
use tokio_postgres::config::Host;

/// What the probe sends: one line, which PostgreSQL takes for a startup packet of about 1.7 GB.
const PROBE: &[u8] = b"headcount-probe\r\n";

/// The first TCP host of `pg` that answers the probe as no PostgreSQL server would, with what it
/// answered: `127.0.0.1:6379 answered "-ERR unknown command ..."`. `None` when every host is
/// silent, closes the connection, is unreachable, or answers with an error message. Each host
/// gets at most `within` (and [`PROBE_TIMEOUT`]) to answer.
pub(crate) async fn not_postgres(pg: &tokio_postgres::Config, within: Duration) -> Option<String> {
    let within = within.min(PROBE_TIMEOUT);
    let ports = pg.get_ports();
    for (i, host) in pg.get_hosts().iter().enumerate() {
        let Host::Tcp(name) = host else { continue };
        let port = ports
            .get(i)
            .or(ports.first())
            .copied()
            .unwrap_or(super::DEFAULT_PORT);
        if let Some(reply) = first_bytes(name, port, PROBE, 1, within).await {
            if !may_be_postgres(&reply) {
                return Some(format!("{name}:{port} answered {}", quote_reply(&reply)));
            }
        }
    }
    None
}

/// Whether `reply` (at least one byte) to the probe may come from a PostgreSQL server or
/// pooler: an `ErrorResponse`.
fn may_be_postgres(reply: &[u8]) -> bool {
    reply.first() == Some(&b'E')
}

#[cfg(test)]
mod tests {
    use super::may_be_postgres;

    #[test]
    fn only_an_error_response_may_be_postgres() {
        assert!(may_be_postgres(b"E\0\0\0\x20SFATAL"));
        for other in [
            &b"-ERR unknown command 'headcount-probe'"[..],
            b"HTTP/1.1 400 Bad Request",
            b"<!DOCTYPE HTML>",
            b"+OK",
        ] {
            assert!(!may_be_postgres(other), "{other:?}");
        }
    }
}
