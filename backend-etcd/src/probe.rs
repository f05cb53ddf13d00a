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

use headcount_core::backend::probe::{first_bytes, quote_reply, PROBE_TIMEOUT};

/// The client connection preface, then an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// The length of a frame header: 3 bytes of length, the type, the flags, 4 of stream id.
const FRAME_HEADER: usize = 9;

/// The type of a SETTINGS frame.
const SETTINGS: u8 = 0x04;

/// The first of `endpoints` (host, port) that answers HTTP/2's preface as no HTTP/2 server
/// would, with what it answered: `127.0.0.1:6379 answered "-ERR unknown command ..."`. `None`
/// when every endpoint is silent, closes the connection, is unreachable, or speaks HTTP/2. Each
/// endpoint gets at most `within` (and [`PROBE_TIMEOUT`]) to answer.
pub(crate) async fn not_http2(endpoints: &[(String, u16)], within: Duration) -> Option<String> {
    let within = within.min(PROBE_TIMEOUT);
    for (host, port) in endpoints {
        let reply = first_bytes(host, *port, PREFACE, FRAME_HEADER, within).await;
        if let Some(reply) = reply {
            if !may_be_http2(&reply) {
                return Some(format!("{host}:{port} answered {}", quote_reply(&reply)));
            }
        }
    }
    None
}

/// Whether `reply` to the preface may come from an HTTP/2 server: the header of a SETTINGS
/// frame on stream 0, or too few bytes to tell.
fn may_be_http2(reply: &[u8]) -> bool {
    match reply.get(..FRAME_HEADER) {
        Some(header) => header[3] == SETTINGS && header[5..9].iter().all(|&b| b & 0x7f == 0),
        None => reply.len() < 4 || reply[3] == SETTINGS,
    }
}

#[cfg(test)]
mod tests {
    use super::may_be_http2;

    #[test]
    fn only_a_settings_frame_is_http2() {
        assert!(may_be_http2(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"));
        assert!(may_be_http2(
            b"\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64"
        ));
        // Too short to tell.
        assert!(may_be_http2(b"\x00\x00"));
        for other in [
            &b"-ERR unknown command 'PRI', with args beginning with: "[..],
            b"HTTP/1.1 400 Bad Request\r\n\r\n",
            // A frame, but not SETTINGS, or not on stream 0.
            b"\x00\x00\x08\x07\x00\x00\x00\x00\x00",
            b"\x00\x00\x00\x04\x00\x00\x00\x00\x01",
        ] {
            assert!(!may_be_http2(other), "{other:?}");
        }
    }
}
