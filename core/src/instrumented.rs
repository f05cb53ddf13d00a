//! [`Instrumented`]: a [`Decorated`] store that records every operation's latency and errors
//! through the [`metrics`](crate::metrics) facade and runs it in a `tracing` span.
//!
//! `headcount::connect` wraps every store it opens with it; wrap a store built another way (a
//! backend's `connect_with`, `from_pool`, `from_client`) with [`instrument`].
//!
//! The span is `store` at `DEBUG` level with the fields `backend`, `op`, `key` (the key's scope:
//! up to the end of its `{…}` hash tag, such as `hc:{workers}`, never a value) and, on failure,
//! `error` (the [`ErrorKind`](crate::ErrorKind) name). No password, URL or stored value is ever
//! recorded.

use std::time::Duration;

use crate::decorated::{Decorated, Hooks};
use crate::error::Error;
use crate::metrics::record_store_operation;
use crate::{DynStore, Op};

/// The [`Hooks`] of an [`Instrumented`] store: the backend name its metrics and spans carry.
#[derive(Debug, Clone, Copy)]
pub struct Instrumentation {
    backend: &'static str,
}

impl Instrumentation {
    /// The backend name recorded as the `backend` label.
    pub fn backend(&self) -> &'static str {
        self.backend
    }
}

/// A store whose every operation is timed, counted and traced; see the [module docs](self).
pub type Instrumented = Decorated<Instrumentation>;

/// Wraps `store` so each operation records metrics and runs in a span. The backend label is
/// the store's [`Capabilities::backend`](crate::Capabilities::backend).
pub fn instrument(store: DynStore) -> DynStore {
    let backend = store.capabilities().backend;
    std::sync::Arc::new(Decorated::with(store, Instrumentation { backend }))
}

#[async_trait::async_trait]
impl Hooks for Instrumentation {
    fn span(&self, op: Op, key: &str) -> tracing::Span {
        tracing::debug_span!(
            "store",
            backend = self.backend,
            op = op.name(),
            key = key_scope(key),
            error = tracing::field::Empty
        )
    }

    fn outcome(&self, op: Op, took: Duration, error: Option<&Error>) {
        let kind = error.map(Error::kind);
        if let Some(kind) = kind {
            tracing::Span::current().record("error", kind.as_str());
        }
        record_store_operation(self.backend, op, took, kind);
    }
}

/// The part of a key a span may show: up to and including its `{…}` hash tag (`hc:{group}`),
/// else up to its second `:` (the prefix and the first name), else the whole key. headcount's
/// keys hold names (groups, services, counters), never values.
pub fn key_scope(key: &str) -> &str {
    if let (Some(open), Some(close)) = (key.find('{'), key.find('}')) {
        if open < close {
            return &key[..=close];
        }
    }
    match key.match_indices(':').nth(1) {
        Some((i, _)) => &key[..i],
        None => key,
    }
}

#[cfg(test)]
mod tests {
    use super::{instrument, key_scope};
    use crate::MemoryStore;

    #[test]
    fn key_scopes_stop_at_the_hash_tag() {
        assert_eq!(key_scope("hc:{workers}:slot:3"), "hc:{workers}");
        assert_eq!(key_scope("hc:ids:x:y"), "hc:ids");
        assert_eq!(key_scope("plain"), "plain");
        assert_eq!(key_scope(""), "");
        assert_eq!(key_scope("a}b{c:d:e"), "a}b{c:d");
    }

    #[tokio::test]
    async fn an_instrumented_store_answers_as_the_inner_one() {
        let store = instrument(std::sync::Arc::new(MemoryStore::new()));
        assert_eq!(store.capabilities().backend, "memory");
        assert_eq!(store.incr("hc:{t}:n", None).await.ok(), Some(1));
        assert_eq!(store.get("hc:{t}:n").await.ok(), Some(Some("1".into())));
        let err = store.incr("", None).await.unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
    }
}
