//! Mapping redis crate errors onto headcount's [`Error`]: faults that may pass (connection
//! refused or lost, a Cluster resharding or failing over, a server loading its data or busy with a
//! script) are the retryable [`Error::Unavailable`] or [`Error::Timeout`]; refusals that will
//! repeat (authentication, ACL permissions, a server that does not speak RESP, a write sent to a
//! read-only replica) are
//! [`Error::Rejected`].

use headcount_core::backend::url::scrub;
use headcount_core::backend::Deadline;
use headcount_core::Error;
use redis::{ErrorKind, RedisError};

pub(crate) const BACKEND: &str = "redis";

/// Maps a client error met while running `op`. `password` is scrubbed from the message as a
/// last line of defence: no message we know of contains it.
pub(crate) fn classify(
    e: RedisError,
    op: &'static str,
    deadline: Deadline,
    password: Option<&str>,
) -> Error {
    if e.is_timeout() {
        return deadline.timed_out(op);
    }
    let message = scrub(e.to_string(), password);
    let code = e.code().unwrap_or_default().to_owned();
    match e.kind() {
        ErrorKind::AuthenticationFailed => Error::rejected(
            BACKEND,
            format!("authentication failed (wrong user name or password?): {message}"),
            e,
        ),
        ErrorKind::ParseError => Error::rejected(
            BACKEND,
            format!(
                "the server's reply is not RESP, the Redis protocol: is this the port of a Redis server? ({message})"
            ),
            e,
        ),
        ErrorKind::InvalidClientConfig => Error::config(message),
        // Every Sentinel that answered watches no master of the URL's name: a typo, or a
        // Sentinel set up for other masters. Asking again gives the same answer.
        ErrorKind::MasterNameNotFoundBySentinel => Error::rejected(BACKEND, message, e),
        // A replica refuses writes for as long as the URL names it (after a failover the old
        // primary stays a replica): retrying cannot help, pointing the URL at the primary does.
        ErrorKind::ReadOnly => Error::rejected(
            BACKEND,
            format!("the server is a read-only replica: point the URL at its primary ({message})"),
            e,
        ),
        ErrorKind::IoError
        | ErrorKind::BusyLoadingError
        | ErrorKind::TryAgain
        | ErrorKind::ClusterDown
        | ErrorKind::MasterDown
        | ErrorKind::Moved
        | ErrorKind::Ask
        | ErrorKind::ClusterConnectionNotFound => Error::unavailable(BACKEND, message, e),
        _ if matches!(
            code.as_str(),
            "NOAUTH" | "WRONGPASS" | "NOPERM" | "NOSCRIPT"
        ) =>
        {
            Error::rejected(BACKEND, message, e)
        }
        // Out of memory, a script running too long, too many clients: may pass.
        _ if matches!(code.as_str(), "OOM" | "BUSY" | "MISCONF" | "ERR max")
            || message.contains("max number of clients") =>
        {
            Error::unavailable(BACKEND, message, e)
        }
        _ if e.is_connection_dropped() || e.is_connection_refusal() => {
            Error::unavailable(BACKEND, message, e)
        }
        // A Cluster slot migrating under a script: a key it touches is on the other node now
        // (a key it could not declare, or one the client's retries of TRYAGAIN gave up on).
        // Once the slot has moved the call goes through.
        _ if message.contains("non local key") || code == "TRYAGAIN" || code == "ASK" => {
            Error::unavailable(BACKEND, message, e)
        }
        _ => Error::rejected(BACKEND, message, e),
    }
}

/// Whether the error is Redis's WRONGTYPE (the key holds a list, a hash, ...).
pub(crate) fn is_wrong_type(e: &RedisError) -> bool {
    e.code() == Some("WRONGTYPE")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn classes() {
        let t = Deadline::new(BACKEND, std::time::Duration::from_secs(1));
        let io = |kind| RedisError::from(std::io::Error::new(kind, "x"));
        assert!(classify(io(std::io::ErrorKind::ConnectionRefused), "get", t, None).is_retryable());
        assert!(matches!(
            classify(io(std::io::ErrorKind::TimedOut), "get", t, None),
            Error::Timeout { op: "get", .. }
        ));
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "invalid password"));
        assert!(matches!(
            classify(auth, "connect", t, None),
            Error::Rejected { .. }
        ));
        let parse = RedisError::from((ErrorKind::ParseError, "invalid response"));
        let e = classify(parse, "connect", t, None);
        assert!(!e.is_retryable() && e.to_string().contains("RESP"), "{e}");
        let loading = RedisError::from((ErrorKind::BusyLoadingError, "loading"));
        assert!(classify(loading, "get", t, None).is_retryable());
        let migrating = RedisError::from((
            ErrorKind::ResponseError,
            "An error was signalled by the server",
            "Script attempted to access a non local key in a cluster node script: 72403c7e, on @user_script:444.".to_owned(),
        ));
        assert!(classify(migrating, "renew_and_versions", t, None).is_retryable());
        let replica = RedisError::from((ErrorKind::ReadOnly, "You can't write against a replica"));
        let e = classify(replica, "incr", t, None);
        assert!(
            !e.is_retryable() && e.to_string().contains("replica"),
            "{e}"
        );
    }

    #[test]
    fn scrubbing() {
        assert_eq!(
            scrub("bad hunter2".into(), Some("hunter2")),
            "bad ***".to_owned()
        );
        assert_eq!(scrub("a b".into(), Some("a")), "a b");
    }
}
