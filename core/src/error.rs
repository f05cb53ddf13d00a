//! The one error type that crosses the [`Store`](crate::Store) boundary.
//!
//! Backend errors never leak through the trait: each backend maps its client's errors onto these
//! variants, keeping the original as an opaque `source` for logs. What a caller usually needs is
//! [`Error::is_retryable`]: a retryable fault (the store is unreachable, an operation timed out) may
//! succeed if tried again; a permanent one (bad configuration, a foreign value at one of our keys,
//! an unsupported operation) will fail the same way every time.

use std::time::Duration;

/// A boxed error kept as the cause of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with headcount's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong talking to a coordination store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A store URL or option is malformed or names something we do not support. Permanent.
    #[error("invalid configuration: {message}")]
    InvalidConfig {
        /// What is wrong, never including a password.
        message: String,
    },

    /// The URL names a backend whose cargo feature is not compiled in. Permanent.
    #[error("the `{scheme}` scheme needs headcount's `{feature}` cargo feature, which is not enabled in this build")]
    FeatureDisabled {
        /// The URL scheme that was asked for.
        scheme: String,
        /// The cargo feature that would enable it.
        feature: &'static str,
    },

    /// An argument is out of range: a zero TTL, an empty key, a bad group name. Nothing was written.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// What is wrong with it.
        message: String,
    },

    /// One of our keys holds a value we did not write (for example "abc" where a counter is
    /// expected). Nothing was written. Permanent until someone repairs the key.
    #[error("foreign value at key `{key}`: expected {expected}, found {found:?}")]
    ForeignValue {
        /// The key that holds it.
        key: String,
        /// What we expected there.
        expected: &'static str,
        /// The start of what we found (at most 64 characters).
        found: String,
    },

    /// The backend cannot do what was asked. Permanent.
    #[error("{backend} does not support {what}")]
    Unsupported {
        /// Which backend.
        backend: &'static str,
        /// What it cannot do.
        what: String,
    },

    /// The store cannot be reached right now (connection refused or lost, server shutting down,
    /// too many clients). Retryable.
    #[error("{backend} is unavailable: {message}")]
    Unavailable {
        /// Which backend (`redis`, `postgres`, ...); `majority ids` for a call that majority IDs spread
        /// over several stores.
        backend: &'static str,
        /// What happened, never including a password.
        message: String,
        /// The client's own error.
        #[source]
        source: Option<BoxError>,
    },

    /// An operation did not finish within its deadline. It may or may not have taken effect.
    /// Retryable.
    #[error("{backend} operation `{op}` timed out after {after:?}")]
    Timeout {
        /// Which backend, as for [`Error::Unavailable`].
        backend: &'static str,
        /// Which operation.
        op: &'static str,
        /// The deadline that passed.
        after: Duration,
    },

    /// The store refused us for good: authentication failed, permission denied, a schema we
    /// cannot use. Permanent.
    #[error("{backend} rejected the request: {message}")]
    Rejected {
        /// Which backend, as for [`Error::Unavailable`].
        backend: &'static str,
        /// What the server said, never including a password.
        message: String,
        /// The client's own error.
        #[source]
        source: Option<BoxError>,
    },

    /// The data changed under the operation faster than it could finish: it lost many
    /// compare-and-set races on one key in a row, or a key it had just read or relied on expired
    /// or was deleted by another client before it could use it. Nothing inconsistent was written.
    /// Retryable.
    #[error("contention at key `{key}`: {message}")]
    Contended {
        /// The key that kept changing or vanished.
        key: String,
        /// What happened.
        message: String,
    },

    /// A recipe handle cannot do what was asked because its background work has ended: the
    /// group member left or failed, the interval peer stopped, a watch or a server task ended
    /// (or panicked). Permanent for this handle; start a new one.
    #[error("{what} has stopped: {reason}")]
    Stopped {
        /// Which handle: `group member api-1`, `the assignment watch of orders`.
        what: String,
        /// Why, when known: the error that ended it, or how its task ended.
        reason: String,
    },
}

/// The broad class of an [`Error`], for callers that branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::InvalidConfig`] or [`Error::FeatureDisabled`].
    Config,
    /// [`Error::InvalidArgument`].
    InvalidArgument,
    /// [`Error::ForeignValue`].
    ForeignValue,
    /// [`Error::Unsupported`].
    Unsupported,
    /// [`Error::Unavailable`].
    Unavailable,
    /// [`Error::Timeout`].
    Timeout,
    /// [`Error::Rejected`].
    Rejected,
    /// [`Error::Contended`].
    Contended,
    /// [`Error::Stopped`].
    Stopped,
}

impl ErrorKind {
    /// A short snake_case name, for metric labels and logs: `config`, `invalid_argument`,
    /// `foreign_value`, `unsupported`, `unavailable`, `timeout`, `rejected`, `contended`,
    /// `stopped`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Config => "config",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::ForeignValue => "foreign_value",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Rejected => "rejected",
            ErrorKind::Contended => "contended",
            ErrorKind::Stopped => "stopped",
        }
    }
}

impl Error {
    /// The broad class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidConfig { .. } | Error::FeatureDisabled { .. } => ErrorKind::Config,
            Error::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            Error::ForeignValue { .. } => ErrorKind::ForeignValue,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Rejected { .. } => ErrorKind::Rejected,
            Error::Contended { .. } => ErrorKind::Contended,
            Error::Stopped { .. } => ErrorKind::Stopped,
        }
    }

    /// Whether trying the same operation again may succeed: true for [`Error::Unavailable`],
    /// [`Error::Timeout`] and [`Error::Contended`], false for everything else.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::Contended
        )
    }

    /// Shorthand for [`Error::InvalidConfig`].
    pub fn config(message: impl Into<String>) -> Self {
        Error::InvalidConfig {
            message: message.into(),
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            message: message.into(),
        }
    }

    /// Builds [`Error::ForeignValue`], cutting `found` to 64 characters so a huge foreign value
    /// does not flood the logs.
    pub fn foreign(key: &str, expected: &'static str, found: &str) -> Self {
        let mut cut: String = found.chars().take(64).collect();
        if cut.len() < found.len() {
            cut.push('…');
        }
        Error::ForeignValue {
            key: key.to_owned(),
            expected,
            found: cut,
        }
    }

    /// Builds [`Error::Unavailable`] from a client error.
    pub fn unavailable(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Unavailable {
            backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Builds [`Error::Contended`].
    pub fn contended(key: &str, message: impl Into<String>) -> Self {
        Error::Contended {
            key: key.to_owned(),
            message: message.into(),
        }
    }

    /// Builds [`Error::Stopped`].
    pub fn stopped(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Stopped {
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// Builds [`Error::Rejected`] from a client error.
    pub fn rejected(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Rejected {
            backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

/// An error and its causes, `a: b: c`, for a message built from another library's error
/// (tonic's own message alone is often just "transport error").
#[cfg(feature = "grpc")]
pub(crate) fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Error;

    #[test]
    fn retryable_is_only_unavailable_timeout_and_contended() {
        let timeout = Error::Timeout {
            backend: "x",
            op: "get",
            after: Duration::from_secs(1),
        };
        assert!(timeout.is_retryable());
        assert!(Error::unavailable("x", "down", "refused").is_retryable());
        assert!(!Error::config("bad").is_retryable());
        assert!(!Error::invalid("bad").is_retryable());
        assert!(!Error::foreign("k", "an integer", "abc").is_retryable());
        assert!(!Error::rejected("x", "auth", "no").is_retryable());
        assert!(Error::contended("k", "lost 1000 races").is_retryable());
        assert!(!Error::stopped("group member a", "it left").is_retryable());
        assert_eq!(Error::stopped("w", "r").kind().as_str(), "stopped");
    }

    #[test]
    fn foreign_value_is_cut() {
        let long = "x".repeat(1000);
        match Error::foreign("k", "an integer", &long) {
            Error::ForeignValue { found, .. } => assert_eq!(found.chars().count(), 65),
            other => panic!("unexpected {other:?}"),
        }
    }
}
