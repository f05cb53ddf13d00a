//! [`run_suite`]: every case against one store, with a report of outcomes and latencies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use headcount::DynStore;
use serde::{Serialize, Serializer};

use crate::{timed, Case, Ctx, Needs, ServerControl, CASES};

/// How [`run_suite`] runs.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    /// Run only the cases whose name contains this text.
    pub filter: Option<String>,
    /// How many cases run at once (at least 1). Cases use their own key prefixes, so they do not
    /// see each other's keys; fewer at once means steadier latency figures.
    pub concurrency: usize,
    /// A case still running after this long fails.
    pub case_timeout: Duration,
    /// Control over the store's server, for the fault cases (kill -9, SIGSTOP). Without it they
    /// are reported as skipped. With it they run last, one at a time, since they take the server
    /// away from everything else.
    pub control: Option<Arc<dyn ServerControl>>,
}

impl Default for SuiteOptions {
    fn default() -> Self {
        SuiteOptions {
            filter: None,
            concurrency: 4,
            case_timeout: Duration::from_secs(120),
            control: None,
        }
    }
}

/// How a case ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    /// The store did what the contract says.
    Passed,
    /// It did not; the message names the values involved.
    Failed(String),
    /// The case did not run; the reason says why.
    Skipped(String),
}

/// One case's result.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// The case's name.
    pub name: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it ran, cleanup included.
    #[serde(rename = "duration_ms", serialize_with = "millis")]
    pub duration: Duration,
}

/// Latency of one primitive over the whole run.
#[derive(Debug, Clone, Serialize)]
pub struct PrimitiveStats {
    /// The primitive's [name](headcount::Op::name): that of any [`Op`](headcount::Op) but
    /// `durability` (see [`Latencies`](crate::Latencies)).
    pub primitive: &'static str,
    /// How many calls were made.
    pub calls: u64,
    /// The median latency.
    #[serde(rename = "p50_ms", serialize_with = "millis")]
    pub p50: Duration,
    /// The 99th percentile latency.
    #[serde(rename = "p99_ms", serialize_with = "millis")]
    pub p99: Duration,
}

/// What [`run_suite`] found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The backend, from the store's capabilities.
    pub backend: &'static str,
    /// Every case that was selected, in the order of [`CASES`].
    pub cases: Vec<CaseReport>,
    /// Latency per primitive, over every call the cases made (including their cleanup).
    pub latency: Vec<PrimitiveStats>,
}

impl Report {
    /// True when no case failed (skipped cases do not fail a run).
    pub fn passed(&self) -> bool {
        !self
            .cases
            .iter()
            .any(|c| matches!(c.outcome, Outcome::Failed(_)))
    }
}

fn millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// Runs every case (or those matching [`SuiteOptions::filter`]) against `store`, through a
/// [`Timed`](crate::Timed) wrapper, and reports each case's outcome and each primitive's latency.
///
/// Each case writes under its own random prefix and deletes what it wrote afterwards, whatever
/// its outcome, so the suite can run against a store in use. Cases that need server control are
/// reported as skipped unless [`SuiteOptions::control`] is given.
pub async fn run_suite(store: DynStore, opts: SuiteOptions) -> Report {
    let backend = store.capabilities().backend;
    let timed = timed(store);
    let selected: Vec<&'static Case> = CASES
        .iter()
        .filter(|c| opts.filter.as_deref().is_none_or(|f| c.name.contains(f)))
        .collect();
    let (faults, plain): (Vec<&Case>, Vec<&Case>) =
        selected.iter().partition(|c| c.needs != Needs::Store);

    let shared: DynStore = Arc::new(timed.clone());
    let mut cases: Vec<CaseReport> = futures::stream::iter(plain)
        .map(|case| run_one(case, shared.clone(), None, opts.case_timeout))
        .buffered(opts.concurrency.max(1))
        .collect()
        .await;
    for case in faults {
        // A server control kills or pauses the whole server: the member-loss case needs one
        // member of a cluster instead, which only the test harness sets up.
        let control = opts
            .control
            .as_ref()
            .filter(|_| case.needs == Needs::ServerControl);
        let report = match control {
            Some(control) => {
                run_one(
                    case,
                    shared.clone(),
                    Some(control.clone()),
                    opts.case_timeout,
                )
                .await
            }
            None => CaseReport {
                name: case.name,
                outcome: Outcome::Skipped(match case.needs {
                    Needs::ClusterMember => "needs control of one member of a 3-member cluster; \
                         runs in headcount's own test harness, which starts a cluster for it"
                        .into(),
                    _ => "needs control of the server process (kill -9, SIGSTOP, a TCP proxy); \
                          runs in headcount's own test harness, which starts a server for it"
                        .into(),
                }),
                duration: Duration::ZERO,
            },
        };
        cases.push(report);
    }
    cases.sort_by_key(|r| CASES.iter().position(|c| c.name == r.name));

    let latency = timed
        .hooks()
        .samples()
        .into_iter()
        .map(|(primitive, samples)| stats(primitive, samples))
        .collect();
    Report {
        backend,
        cases,
        latency,
    }
}

/// Runs one case with a fresh [`Ctx`], then its cleanup, within `timeout`.
async fn run_one(
    case: &'static Case,
    store: DynStore,
    control: Option<Arc<dyn ServerControl>>,
    timeout: Duration,
) -> CaseReport {
    let started = Instant::now();
    let ctx = Ctx::new(store, control);
    let outcome = match tokio::time::timeout(timeout, (case.run)(&ctx)).await {
        Ok(Ok(())) => Outcome::Passed,
        Ok(Err(failure)) => Outcome::Failed(failure.to_string()),
        Err(_) => Outcome::Failed(format!("did not finish within {timeout:?}")),
    };
    let cleanup = tokio::time::timeout(timeout, ctx.cleanup()).await;
    let outcome = match (outcome, cleanup) {
        (Outcome::Passed, Ok(Err(e))) => Outcome::Failed(format!("passed, but {e}")),
        (Outcome::Passed, Err(_)) => Outcome::Failed(format!(
            "passed, but its cleanup did not finish within {timeout:?}"
        )),
        (outcome, _) => outcome,
    };
    CaseReport {
        name: case.name,
        outcome,
        duration: started.elapsed(),
    }
}

fn stats(primitive: &'static str, mut samples: Vec<Duration>) -> PrimitiveStats {
    samples.sort_unstable();
    PrimitiveStats {
        primitive,
        calls: samples.len() as u64,
        p50: percentile(&samples, 50),
        p99: percentile(&samples, 99),
    }
}

/// The nearest-rank percentile `p` (0..=100) of sorted samples; zero for none.
pub fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted.get(rank - 1).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let ms = |n: u64| Duration::from_millis(n);
        let samples: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&samples, 50), ms(50));
        assert_eq!(percentile(&samples, 99), ms(99));
        assert_eq!(percentile(&[ms(7)], 99), ms(7));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
        assert_eq!(percentile(&[ms(1), ms(2)], 50), ms(1));
    }
}
