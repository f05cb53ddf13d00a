//! [`Decorated`]: a store that forwards every call to an inner store and runs [`Hooks`] around
//! it: latency recording and call counting (the conformance suite and benchmarks), a pause (the
//! demo), injected faults (the test kit's `sim::FaultyStore`), metrics and tracing spans
//! ([`Instrumented`](crate::instrumented::Instrumented)).

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tracing::Instrument;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::notify::Notifications;
use crate::op::for_each_op;
use crate::store::{Capabilities, Durability, RenewedListing};
use crate::{DynStore, Op};

/// What a [`Decorated`] store does around every call it forwards. `op` is the method called:
/// any [`Op`] (`capabilities`, which is not one, is forwarded without hooks).
#[async_trait]
pub trait Hooks: Send + Sync + Debug + 'static {
    /// Runs before the call goes to the inner store (a pause can wait here). An error returned
    /// here is the call's answer, and the inner store is not called.
    async fn before(&self, _op: Op) -> Result<()> {
        Ok(())
    }

    /// Runs after the inner store answered (successfully or not), `took` after `before`. An
    /// error returned here replaces the answer (a reply lost after the store applied the call).
    async fn after(&self, _op: Op, _took: Duration) -> Result<()> {
        Ok(())
    }

    /// The span the whole call (hooks included) runs in. `key` is the call's key, or its
    /// prefix for [`Op::List`], [`Op::RenewAndList`] and [`Op::RenewAndListIfChanged`], its
    /// first directory for [`Op::RenewAndVersions`] (empty for [`Op::Durability`]): a span
    /// should record only a part of it that names no stored value. By default, no span.
    fn span(&self, _op: Op, _key: &str) -> tracing::Span {
        tracing::Span::none()
    }

    /// Sees the inner store's answer, before [`Hooks::after`]: `error` is its error, if it
    /// failed. Cannot change the answer.
    fn outcome(&self, _op: Op, _took: Duration, _error: Option<&Error>) {}

    /// Subscribes to `dir` on `inner` ([`Store::subscribe`](crate::Store::subscribe)): no store
    /// call, so no [`Hooks::before`] nor [`Hooks::after`] runs around it. By default, the inner
    /// store's notifications as they are; a fault layer can hand out others that it feeds from
    /// them (the test kit's `sim::FaultyStore` drops, delays and duplicates notices).
    async fn subscribe(&self, inner: &DynStore, dir: &str) -> Result<Notifications> {
        inner.subscribe(dir).await
    }
}

/// A store that forwards every call to `inner`, each of the provided methods (`set_max`,
/// `incr_and_get`, `renew_and_list`, `renew_and_list_if_changed`, `renew_and_versions`,
/// `compare_and_delete`, `durability`, `subscribe`) to the inner store's
/// own, so a backend's native override is what runs, with its [`Hooks`] around each.
#[derive(Debug, Clone)]
pub struct Decorated<H> {
    inner: DynStore,
    hooks: H,
}

impl<H: Hooks> Decorated<H> {
    /// Wraps `inner`.
    pub fn with(inner: DynStore, hooks: H) -> Self {
        Decorated { inner, hooks }
    }

    /// The hooks.
    pub fn hooks(&self) -> &H {
        &self.hooks
    }

    async fn call<T>(&self, op: Op, key: &str, call: impl Future<Output = Result<T>>) -> Result<T> {
        let span = self.hooks.span(op, key);
        async move {
            self.hooks.before(op).await?;
            let start = Instant::now();
            let out = call.await;
            let took = start.elapsed();
            self.hooks.outcome(op, took, out.as_ref().err());
            self.hooks.after(op, took).await?;
            out
        }
        .instrument(span)
        .await
    }
}

/// Every operation through [`Decorated::call`], expanded from the one list of operations
/// ([`for_each_op`]).
macro_rules! decorated_backend {
    ([$({ $name:ident, $op:ident, ($($arg:ident: $ty:ty),*) -> $answer:ty,
          scope: $scope:expr, check: { $($check:tt)* } },)*]) => {
        #[async_trait]
        impl<H: Hooks> Backend for Decorated<H> {
            fn capabilities(&self) -> Capabilities {
                self.inner.capabilities()
            }

            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$answer> {
                    let scope: &str = $scope;
                    self.call(Op::$op, scope, self.inner.$name($($arg),*)).await
                }
            )*

            /// Through [`Hooks::subscribe`] only (a subscription is no store call): by default
            /// the inner store's own notifications.
            async fn subscribe(&self, dir: &str) -> Result<Notifications> {
                self.hooks.subscribe(&self.inner, dir).await
            }
        }
    };
}

for_each_op!(decorated_backend);
