//! Mapping etcd-client errors onto headcount's [`Error`]: faults that may pass (no leader, a
//! member down, a connection lost, the server overloaded) are the retryable
//! [`Error::Unavailable`] or [`Error::Timeout`]; refusals that will repeat (authentication,
//! permissions, a request the server refuses) are [`Error::Rejected`].

use etcd_client::Error as EtcdError;
use headcount_core::backend::url::scrub;
use headcount_core::backend::Deadline;
use headcount_core::Error;
use tonic::Code;

pub(crate) const BACKEND: &str = "etcd";

/// Whether the error says the lease we attached no longer exists.
pub(crate) fn is_lease_not_found(e: &EtcdError) -> bool {
    matches!(e, EtcdError::GRpcStatus(s) if s.message().contains("lease not found"))
}

/// Whether the request certainly never reached a server: the connection to the endpoint in use
/// was refused, or had closed before the request was handed to it (the endpoint went away
/// between two calls: HTTP/2's client gives such a request back unsent). Such a request may be
/// sent again, even a non-idempotent one.
pub(crate) fn never_sent(e: &EtcdError) -> bool {
    let EtcdError::GRpcStatus(status) = e else {
        return false;
    };
    if !matches!(status.code(), Code::Unavailable | Code::Cancelled) {
        return false;
    }
    let mut cause = std::error::Error::source(status);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            // hyper cancels a request still queued for a connection that closed, with this
            // cause, and hands it back: it was never written.
            if h.is_canceled()
                && std::error::Error::source(h)
                    .is_some_and(|s| s.to_string() == "connection closed")
            {
                return true;
            }
        }
        cause = c.source();
    }
    status.code() == Code::Unavailable && status.message() == "tcp connect error"
}

/// Maps a client error met while running `op`. `password` is scrubbed from the message.
pub(crate) fn classify(
    e: EtcdError,
    op: &'static str,
    deadline: Deadline,
    password: Option<&str>,
) -> Error {
    let message = scrub(describe(&e), password);
    match &e {
        EtcdError::GRpcStatus(status) => match status.code() {
            // tonic reports its own request deadline as Cancelled "Timeout expired".
            Code::DeadlineExceeded => deadline.timed_out(op),
            Code::Cancelled if message.contains("Timeout expired") => deadline.timed_out(op),
            Code::Unauthenticated | Code::PermissionDenied => Error::rejected(
                BACKEND,
                format!("{message} (check the user name, password and role)"),
                e,
            ),
            Code::Unavailable
            | Code::Unknown
            | Code::Cancelled
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Internal => Error::unavailable(BACKEND, message, e),
            _ => Error::rejected(BACKEND, message, e),
        },
        EtcdError::TransportError(_) | EtcdError::IoError(_) => {
            Error::unavailable(BACKEND, message, e)
        }
        EtcdError::InvalidUri(_) | EtcdError::InvalidArgs(_) | EtcdError::EndpointError(_) => {
            Error::config(message)
        }
        _ => Error::rejected(BACKEND, message, e),
    }
}

/// The error and its chain of causes, in one line.
fn describe(e: &EtcdError) -> String {
    let mut message = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = c.source();
    }
    message
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn classes() {
        let t = Deadline::new(BACKEND, std::time::Duration::from_secs(1));
        let status = |code, msg: &str| EtcdError::GRpcStatus(tonic::Status::new(code, msg));
        assert!(classify(status(Code::Unavailable, "no leader"), "get", t, None).is_retryable());
        assert!(matches!(
            classify(status(Code::DeadlineExceeded, "slow"), "get", t, None),
            Error::Timeout { op: "get", .. }
        ));
        assert!(matches!(
            classify(
                status(Code::InvalidArgument, "etcdserver: authentication failed"),
                "connect",
                t,
                None
            ),
            Error::Rejected { .. }
        ));
        assert!(matches!(
            classify(status(Code::Unauthenticated, "bad token"), "get", t, None),
            Error::Rejected { .. }
        ));
        assert!(is_lease_not_found(&status(
            Code::NotFound,
            "etcdserver: requested lease not found"
        )));
        assert_eq!(scrub("x hunter2".into(), Some("hunter2")), "x ***");
    }
}
