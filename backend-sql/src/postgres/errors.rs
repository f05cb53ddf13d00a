//! Mapping tokio-postgres and pool errors onto headcount's [`Error`]: faults that may pass
//! (the server is down, restarting, overloaded, or the connection broke) are retryable
//! [`Error::Unavailable`]; refusals that will repeat (authentication, permissions, an unknown
//! database, a table of another shape) are [`Error::Rejected`].

use headcount_core::backend::url::scrub;
use headcount_core::Error;
use tokio_postgres::error::SqlState;

pub(crate) const BACKEND: &str = "postgres";

/// SQLSTATEs raised by a `::bigint` cast of a stored value: not a number, or out of range.
pub(crate) fn is_bad_counter(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::INVALID_TEXT_REPRESENTATION || *c == SqlState::NUMERIC_VALUE_OUT_OF_RANGE
    )
}

/// Whether the error is 22003, numeric value out of range.
pub(crate) fn is_out_of_range(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::NUMERIC_VALUE_OUT_OF_RANGE)
}

/// The table is gone (someone dropped it, or the server was re-initialised).
pub(crate) fn is_undefined_table(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNDEFINED_TABLE)
}

/// Whether the connection that produced `e` must not be used again: it is closed, broke at the
/// I/O or protocol level, or the server said it is going away. A plain SQL error leaves the
/// connection fine (its implicit transaction ended with the statement).
pub(crate) fn breaks_connection(e: &tokio_postgres::Error) -> bool {
    match e.as_db_error() {
        None => true,
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || code.starts_with("57P")
        }
    }
}

fn retryable_sqlstate(code: &str) -> bool {
    // 08 connection exception, 40 transaction rollback (serialization failure, deadlock),
    // 53 insufficient resources (too many connections, disk full), 57 operator intervention
    // (shutdown, crash recovery, cancel), 58 system error (I/O), 25006 read-only transaction
    // (a standby after a failover); 57P04 (database dropped) will not pass.
    (code.starts_with("08")
        || code.starts_with("40")
        || code.starts_with("53")
        || code.starts_with("57")
        || code.starts_with("58")
        || code == "25006")
        && code != "57P04"
}

/// What to do about an error that only a connection pooler gives, or `None`. PgBouncer refuses
/// a startup parameter it does not know (the URL's `options`) with 08P01, a class that is
/// otherwise retryable, and would be refused again on every attempt.
fn pooler_hint(code: &str, message: &str) -> Option<&'static str> {
    (code == "08P01" && message.starts_with("unsupported startup parameter")).then_some(
        "; a connection pooler (PgBouncer) refuses startup parameters it does not know: \
         remove that option from the URL (instead of `options`, set the settings on the role \
         or database: ALTER ROLE ... SET), or list it in the pooler's \
         ignore_startup_parameters",
    )
}

/// Maps a client error. `password` is scrubbed from the message as a last line of defence: no
/// message we know of contains it.
pub(crate) fn classify(e: tokio_postgres::Error, password: Option<&str>) -> Error {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code().to_owned();
        let mut message = format!("{} (SQLSTATE {code})", db.message());
        if let Some(hint) = db.hint() {
            message.push_str(&format!("; hint: {hint}"));
        }
        if let Some(hint) = pooler_hint(&code, db.message()) {
            message.push_str(hint);
            return Error::rejected(BACKEND, scrub(message, password), e);
        }
        let message = scrub(message, password);
        return if retryable_sqlstate(&code) {
            Error::unavailable(BACKEND, message, e)
        } else {
            Error::rejected(BACKEND, message, e)
        };
    }

    let mut message = e.to_string();
    let mut cause = std::error::Error::source(&e);
    let mut tls_refused = false;
    while let Some(c) = cause {
        message.push_str(": ");
        message.push_str(&c.to_string());
        if c.downcast_ref::<rustls::Error>().is_some() {
            tls_refused = true;
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
            {
                tls_refused = true;
            }
        }
        cause = c.source();
    }
    let message = scrub(message, password);
    let top = e.to_string();
    if top.starts_with("invalid configuration") || top.starts_with("invalid connection string") {
        return Error::config(message);
    }
    // A certificate we do not trust, a server without TLS under sslmode=require, or a password
    // the server wanted and we lack: trying again will not help.
    if top.starts_with("authentication error")
        || tls_refused
        || message.contains("server does not support TLS")
    {
        return Error::rejected(BACKEND, message, e);
    }
    Error::unavailable(BACKEND, message, e)
}

/// Maps a pool checkout error.
pub(crate) fn classify_pool(e: deadpool_postgres::PoolError, password: Option<&str>) -> Error {
    match e {
        deadpool_postgres::PoolError::Backend(e) => classify(e, password),
        other => {
            let message = scrub(format!("connection pool: {other}"), password);
            Error::unavailable(BACKEND, message, other)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn sqlstate_classes() {
        for code in [
            "08006", "08001", "57P01", "57P02", "57P03", "53300", "40001", "40P01", "25006",
            "58030",
        ] {
            assert!(retryable_sqlstate(code), "{code}");
        }
        for code in [
            "28P01", "28000", "42501", "3D000", "42P01", "22P02", "57P04",
        ] {
            assert!(!retryable_sqlstate(code), "{code}");
        }
    }

    #[test]
    fn a_refused_startup_parameter_names_the_pooler() {
        let hint = pooler_hint("08P01", "unsupported startup parameter: options").unwrap();
        assert!(hint.contains("PgBouncer") && hint.contains("ignore_startup_parameters"));
        assert_eq!(pooler_hint("08P01", "server conn crashed?"), None);
        assert_eq!(
            pooler_hint("08006", "unsupported startup parameter: x"),
            None
        );
    }

    #[test]
    fn scrubbing() {
        assert_eq!(
            scrub("auth failed for hunter2".into(), Some("hunter2")),
            "auth failed for ***"
        );
        assert_eq!(scrub("a b".into(), Some("a")), "a b");
        assert_eq!(scrub("x".into(), None), "x");
    }
}
