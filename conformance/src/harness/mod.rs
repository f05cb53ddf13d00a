//! The server harness: where each backend's tests find a store.
//!
//! For each backend, in order:
//!
//! 1. `HEADCOUNT_TEST_<BACKEND>_URL` (`HEADCOUNT_TEST_POSTGRES_URL`, `HEADCOUNT_TEST_SQLITE_URL`)
//!    when set: the tests use that store, and the fault cases (which must kill the server) are
//!    skipped.
//! 2. Else the server binary (PostgreSQL's `initdb` and `postgres`, from PATH or
//!    `/usr/lib/postgresql/*/bin`, or only from `HEADCOUNT_TEST_POSTGRES_BIN_DIR` when set),
//!    started on a free loopback port in a temp dir, as the `postgres` user when the tests run as
//!    root. One shared server per backend per test process, started on first use; each fault case
//!    gets a server of its own. SQLite needs no server: a file in a temp dir.
//! 3. Else, with the `containers` feature and a reachable Docker engine, a container
//!    (testcontainers).
//! 4. Else the test prints `SKIP <backend>::<case>: <what to install>` to stderr and passes,
//!    unless `HEADCOUNT_REQUIRE_BACKENDS` is `all` or a comma list naming the backend: then it
//!    fails with that message.
//!
//! Servers the harness starts die with the test process: they are spawned from one long-lived
//! thread with `PR_SET_PDEATHSIG`, and an exit hook stops them and removes their directories.

mod postgres;
mod process;
mod sqlite;

#[cfg(feature = "containers")]
mod containers;

use std::io::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::{Case, Ctx, Needs, ServerControl};

pub use postgres::{find_bin_dir as find_postgres_bin_dir, PgControl, PgServer};
pub use process::cleanup;

/// The per-operation deadline (the URL's `timeout` option) of the store a fault case gets: the
/// cases expect each call to fail within it once the server is killed or paused.
pub const FAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);

/// A case still running after this long fails.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(180);

/// The environment variable naming which backends must be available: `all`, or a comma list
/// such as `postgres,sqlite`.
pub const REQUIRE_VAR: &str = "HEADCOUNT_REQUIRE_BACKENDS";

/// A backend the harness can provide a store for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// Embedded SQLite: a file in a temp dir.
    Sqlite,
    /// PostgreSQL: a server started from its binaries.
    Postgres,
}

/// Why the harness cannot give a case the store it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// The backend is not available here (no binary, no URL, no Docker): the message says what
    /// to install. A skip, or a failure when the backend is required.
    Missing(String),
    /// The backend is here but could not be started. Always a failure.
    Failed(String),
    /// This case cannot run on this setup (a fault case against a store the harness did not
    /// start). Always a skip.
    NotApplicable(String),
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::Missing(m) | Unavailable::Failed(m) | Unavailable::NotApplicable(m) => {
                f.write_str(m)
            }
        }
    }
}

/// A store for one case alone, with control over its server.
#[derive(Debug)]
pub struct Dedicated {
    /// The store URL.
    pub url: String,
    /// Control over the server's processes.
    pub control: Arc<dyn ServerControl>,
}

impl Backend {
    /// The backend's name, as in test names and `HEADCOUNT_REQUIRE_BACKENDS`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }

    /// The variable that points the tests at an existing store: `HEADCOUNT_TEST_<BACKEND>_URL`.
    pub fn url_var(self) -> String {
        format!("HEADCOUNT_TEST_{}_URL", self.name().to_ascii_uppercase())
    }

    /// Whether `HEADCOUNT_REQUIRE_BACKENDS` requires this backend.
    pub fn required(self) -> bool {
        std::env::var(REQUIRE_VAR).is_ok_and(|v| {
            v.split(',')
                .map(str::trim)
                .any(|b| b.eq_ignore_ascii_case("all") || b.eq_ignore_ascii_case(self.name()))
        })
    }

    fn compiled(self) -> Result<(), Unavailable> {
        let on = match self {
            Backend::Sqlite => cfg!(feature = "sqlite"),
            Backend::Postgres => cfg!(feature = "postgres"),
        };
        if on {
            Ok(())
        } else {
            Err(Unavailable::Missing(format!(
                "headcount-conformance was built without its `{}` feature",
                self.name()
            )))
        }
    }

    /// The URL of this process's shared store for the backend, starting its server on first use.
    pub async fn shared(self) -> Result<String, Unavailable> {
        self.compiled()?;
        if let Ok(url) = std::env::var(self.url_var()) {
            return Ok(url);
        }
        match self {
            Backend::Sqlite => sqlite::shared_url(),
            Backend::Postgres => {
                static SHARED: OnceLock<Result<String, Unavailable>> = OnceLock::new();
                // Starting blocks (initdb, polling for readiness): keep it off the runtime's
                // workers. Concurrent callers wait in `get_or_init` for the one start.
                tokio::task::spawn_blocking(|| SHARED.get_or_init(shared_postgres).clone())
                    .await
                    .map_err(|e| Unavailable::Failed(format!("starting PostgreSQL: {e}")))?
            }
        }
    }

    /// A store on a server started for one case alone, with control over its processes; for the
    /// fault cases.
    pub async fn dedicated(self) -> Result<Dedicated, Unavailable> {
        self.compiled()?;
        if std::env::var_os(self.url_var()).is_some() {
            return Err(Unavailable::NotApplicable(format!(
                "{} points at a server the harness did not start, so it cannot kill or pause it",
                self.url_var()
            )));
        }
        match self {
            Backend::Sqlite => Err(Unavailable::NotApplicable(
                "sqlite is embedded: there is no server process to kill or pause".into(),
            )),
            Backend::Postgres => {
                #[cfg(feature = "containers")]
                if let Err(Unavailable::Missing(why)) = postgres::find_bin_dir() {
                    if containers::docker_reachable() {
                        return Err(Unavailable::NotApplicable(format!(
                            "fault cases need PostgreSQL's own binaries (the harness does not \
                             control containers): {why}"
                        )));
                    }
                }
                let server = tokio::task::spawn_blocking(|| {
                    postgres::PgServer::start_new(Some(FAULT_OP_TIMEOUT))
                })
                .await
                .map_err(|e| Unavailable::Failed(format!("starting PostgreSQL: {e}")))??;
                let server = Arc::new(server);
                Ok(Dedicated {
                    url: server.url(),
                    control: Arc::new(PgControl::new(server, FAULT_OP_TIMEOUT)),
                })
            }
        }
    }
}

fn shared_postgres() -> Result<String, Unavailable> {
    match postgres::PgServer::start_new(None) {
        Ok(server) => {
            let url = server.url();
            // Lives until the process exits; the exit hook stops it and removes its directory.
            static SERVER: OnceLock<PgServer> = OnceLock::new();
            let _ = SERVER.set(server);
            Ok(url)
        }
        #[cfg(feature = "containers")]
        Err(Unavailable::Missing(why)) => containers::start_postgres().map_err(|e| match e {
            Unavailable::Missing(docker) => Unavailable::Missing(format!("{why}; {docker}")),
            other => other,
        }),
        Err(e) => Err(e),
    }
}

fn say(line: &str) {
    // Straight to the process's stderr: libtest captures `eprintln!` of passing tests, and a
    // skip must be seen.
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Runs the case `case` against `backend` as one test: finds a store (see the module docs),
/// runs the case and its cleanup, and returns the failure message, if any, naming
/// `<backend>::<case>`. What [`conformance_tests!`](crate::conformance_tests) calls.
pub async fn run_test(backend: Backend, case: &str) -> Result<(), String> {
    let label = format!("{}::{case}", backend.name());
    let Some(case) = Case::find(case) else {
        return Err(format!("{label}: no such case"));
    };
    let target = match case.needs {
        Needs::ServerControl => backend.dedicated().await.map(|d| (d.url, Some(d.control))),
        _ => backend.shared().await.map(|url| (url, None)),
    };
    let (url, control) = match target {
        Ok(t) => t,
        Err(Unavailable::NotApplicable(why)) => {
            say(&format!("SKIP {label}: {why}"));
            return Ok(());
        }
        Err(Unavailable::Missing(why)) if !backend.required() => {
            say(&format!(
                "SKIP {label}: {why} (set {REQUIRE_VAR}=all to make this a failure)"
            ));
            return Ok(());
        }
        Err(Unavailable::Missing(why)) => {
            return Err(format!(
                "{label}: {} is required by {REQUIRE_VAR} but unavailable: {why}",
                backend.name()
            ))
        }
        Err(Unavailable::Failed(why)) => return Err(format!("{label}: {why}")),
    };
    let store = headcount::connect(&url).await.map_err(|e| {
        format!(
            "{label}: connecting to {}: {e}",
            headcount::redact_url(&url)
        )
    })?;
    let ctx = Ctx::new(store, control);
    let outcome = match tokio::time::timeout(CASE_TIMEOUT, (case.run)(&ctx)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(failure)) => Err(format!("{label} failed: {failure}")),
        Err(_) => Err(format!("{label} did not finish within {CASE_TIMEOUT:?}")),
    };
    let cleanup = tokio::time::timeout(CASE_TIMEOUT, ctx.cleanup()).await;
    // A dedicated server goes with the last handle to its control; stopping it blocks briefly.
    let _ = tokio::task::spawn_blocking(move || drop(ctx)).await;
    outcome?;
    match cleanup {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("{label} passed, but {e}")),
        Err(_) => Err(format!("{label} passed, but its cleanup did not finish")),
    }
}
