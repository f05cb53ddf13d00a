//! What a case is: its context, its result, its entry in the one list of cases.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use headcount::{Capabilities, DynStore};

/// The result of a case: `Ok(())` when the store behaved as the contract says.
pub type CaseResult = Result<(), Failure>;

/// Why a case failed: a message naming the values involved.
///
/// Cases return failures instead of panicking because `headcount conformance` runs them against a
/// user's store and reports each one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    message: String,
}

impl Failure {
    /// A failure with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// Turns any error into a [`Failure`] that says what the case was doing.
pub trait ResultExt<T> {
    /// Maps the error to a failure "`what`: `error`".
    fn during(self, what: impl fmt::Display) -> Result<T, Failure>;
}

impl<T, E: fmt::Display> ResultExt<T> for Result<T, E> {
    fn during(self, what: impl fmt::Display) -> Result<T, Failure> {
        self.map_err(|e| Failure::new(format!("{what}: {e}")))
    }
}

/// Control over the process of a server that the harness started for one case alone: what the
/// fault cases use to kill, restart, pause and resume it.
#[async_trait]
pub trait ServerControl: Send + Sync + fmt::Debug {
    /// The per-operation deadline the case's store was configured with: the fault cases expect
    /// every call to end within it (plus a small slack).
    fn op_timeout(&self) -> Duration;

    /// Kills the server with SIGKILL (every process of it) and waits until it is gone.
    async fn kill(&self) -> io::Result<()>;

    /// Starts the server again on the same port and data, and waits until it accepts connections.
    async fn start(&self) -> io::Result<()>;

    /// Stops every process of the server with SIGSTOP, so existing connections stall too.
    async fn pause(&self) -> io::Result<()>;

    /// Continues every process of the server with SIGCONT.
    async fn resume(&self) -> io::Result<()>;

    /// Cuts the network between the store and the server (the harness's TCP proxy): drops
    /// every open connection and blackholes new ones. The server keeps running. The default
    /// says the control has no proxy.
    async fn cut(&self) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this server control has no proxy to cut the connection with",
        ))
    }

    /// Lets traffic pass again after [`ServerControl::cut`].
    async fn heal(&self) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this server control has no proxy to cut the connection with",
        ))
    }

    /// Lets the next request reach the server and drops the connection that carries its
    /// answer (the harness's TCP proxy), so a write is applied and its reply lost. The default
    /// says the control has no proxy.
    async fn drop_next_reply(&self) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this server control has no proxy to drop a reply with",
        ))
    }

    /// Passes every answer again after [`ServerControl::drop_next_reply`]; says whether an
    /// answer was dropped since.
    async fn pass_replies(&self) -> io::Result<bool> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this server control has no proxy to drop a reply with",
        ))
    }
}

/// Everything a case gets: the store, its own key prefix, and server control for fault cases.
pub struct Ctx {
    /// The store under test.
    pub store: DynStore,
    /// The prefix every key this case writes starts with: `hct:{<random hex>}:`, unique per case
    /// run, so cases can run in parallel on one store.
    pub prefix: String,
    /// Control over the server process, present only when the harness started a server for this
    /// case alone.
    pub control: Option<Arc<dyn ServerControl>>,
    keys: Mutex<BTreeSet<String>>,
}

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("store", &self.store)
            .field("prefix", &self.prefix)
            .field("control", &self.control)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    /// A context over `store` with a fresh random prefix.
    pub fn new(store: DynStore, control: Option<Arc<dyn ServerControl>>) -> Self {
        let prefix = format!("hct:{{{:016x}}}:", rand::random::<u64>());
        Ctx {
            store,
            prefix,
            control,
            keys: Mutex::new(BTreeSet::new()),
        }
    }

    /// The key `prefix + name`, remembered so [`Ctx::cleanup`] deletes it.
    pub fn key(&self, name: &str) -> String {
        let key = format!("{}{name}", self.prefix);
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone());
        key
    }

    /// The store's capabilities.
    pub fn caps(&self) -> Capabilities {
        self.store.capabilities()
    }

    /// How late after its TTL a key may still be visible, or how early before it a key may
    /// vanish, measured on our side: 250 ms plus the backend's TTL granularity.
    pub fn tolerance(&self) -> Duration {
        Duration::from_millis(250) + self.caps().ttl_granularity
    }

    /// Deletes every key this case wrote: those made with [`Ctx::key`] and whatever is listed under
    /// the prefix. Runs after the case whatever its outcome; errors only say that something may
    /// be left behind (it expires or is harmless: the prefix is random).
    pub async fn cleanup(&self) -> CaseResult {
        let mut keys: BTreeSet<String> = self
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut first_error = None;
        match self.store.list(&self.prefix).await {
            Ok(listed) => keys.extend(listed.into_iter().map(|(k, _)| k)),
            Err(e) => first_error = Some(format!("listing {:?}: {e}", self.prefix)),
        }
        for key in &keys {
            if let Err(e) = self.store.delete(key).await {
                first_error.get_or_insert_with(|| format!("deleting {key:?}: {e}"));
            }
        }
        match first_error {
            None => Ok(()),
            Some(e) => Err(Failure::new(format!("cleanup: {e}"))),
        }
    }
}

/// What a case needs beyond a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Needs {
    /// Only a store.
    Store,
    /// Control of the server's processes ([`ServerControl`]) on a server dedicated to the case,
    /// so killing or pausing it disturbs no other case. Only the test harness provides it.
    ServerControl,
    /// Control of one member of a replicated cluster dedicated to the case (the etcd cluster):
    /// [`ServerControl`]'s kill, start, pause and resume act on that member alone. Only the test
    /// harness provides it, and only for cluster backends that survive losing a member.
    ClusterMember,
}

/// A case's entry point: a plain function returning the case's boxed future.
pub type CaseFn = for<'a> fn(&'a Ctx) -> BoxFuture<'a, CaseResult>;

/// One conformance case.
#[derive(Clone, Copy)]
pub struct Case {
    /// Its name, also the name of its test: `incr_50x100_exact`.
    pub name: &'static str,
    /// What it proves, in one line.
    pub about: &'static str,
    /// What it needs beyond a store.
    pub needs: Needs,
    /// Runs it.
    pub run: CaseFn,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("needs", &self.needs)
            .finish_non_exhaustive()
    }
}

impl Case {
    /// The case called `name`.
    pub fn find(name: &str) -> Option<&'static Case> {
        CASES.iter().find(|c| c.name == name)
    }
}

macro_rules! case_table {
    ([$({ $name:ident, $needs:ident, $about:literal },)*]) => {
        /// Every conformance case, in the order `run_suite` runs them.
        pub static CASES: &[Case] = &[
            $(Case {
                name: stringify!($name),
                about: $about,
                needs: Needs::$needs,
                run: runners::$name,
            },)*
        ];

        mod runners {
            use super::*;
            $(
                pub(super) fn $name(ctx: &Ctx) -> BoxFuture<'_, CaseResult> {
                    Box::pin(crate::cases::$name(ctx))
                }
            )*
        }
    };
}

crate::for_each_case!(case_table!);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_names_are_unique_and_found() {
        let names: BTreeSet<_> = CASES.iter().map(|c| c.name).collect();
        assert_eq!(names.len(), CASES.len());
        assert!(Case::find("incr_50x100_exact").is_some());
        assert!(Case::find("nope").is_none());
    }
}
