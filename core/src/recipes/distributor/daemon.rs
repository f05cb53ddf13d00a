//! The daemon: [`Distributor`] polls, probes, recomputes and writes the table; [`RunningDistributor`] runs it in a task.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tracing::Instrument;

use super::config::Namespaces;
use super::{
    assignment_key, compute_table, contended, list_services, list_units, table_diff, table_key,
    DefaultProber, DistributionTable, DistributorConfig, Health, Liveness, Prober, Service,
    ServiceAssignment, TableDiff, CAS_ATTEMPTS,
};
use crate::clock::{timeout, Clock, Pace};
use crate::error::{Error, Result};
use crate::keys::Keyspace;
use crate::metrics as m;
use crate::task::{stop_requested, Background, OnDrop};
use crate::DynStore;

/// How long the empty record of a service that left the registry is kept, so a late reader sees
/// it lost its units before the record expires.
pub const DEPARTED_RECORD_TTL: Duration = Duration::from_secs(24 * 3600);

/// What one poll did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PollOutcome {
    /// The table in the store is already what this poll computed.
    Unchanged {
        /// Its version (0 when no table exists and none was needed).
        version: u64,
    },
    /// This poll wrote a new table.
    Written {
        /// The new version.
        version: u64,
        /// Units whose owner changed.
        moved: usize,
        /// Units that were not in the previous table.
        added: usize,
        /// Units of the previous table that are gone.
        removed: usize,
    },
    /// No registered service is healthy while there are units: the last table is kept.
    KeptNoHealthyService {
        /// The version kept (0: there is none).
        version: u64,
    },
}

/// Whether a service whose last `misses` pings failed in a row counts as down: at once when the
/// current table gives it no units (nothing moves), else once `down_after` pings in a row
/// failed, so one slow answer (a pause, a lost packet) does not move every unit it holds.
fn counts_as_down(misses: u32, down_after: u32, in_table: bool) -> bool {
    misses > 0 && (!in_table || misses >= down_after)
}

/// The daemon: polls, probes, recomputes and writes the table. Several may run at once on the
/// same namespaces.
pub struct Distributor {
    store: DynStore,
    services: Vec<Keyspace>,
    units: Keyspace,
    distribution: Keyspace,
    poll_interval: Duration,
    ping_timeout: Duration,
    prober: Arc<dyn Prober>,
    down_after: u32,
    /// Per service: whether the last poll counted it up, and how many pings in a row failed.
    health: Mutex<BTreeMap<String, (bool, u32)>>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for Distributor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Distributor")
            .field("services", &self.services)
            .field("units", &self.units)
            .field("distribution", &self.distribution)
            .field("poll_interval", &self.poll_interval)
            .field("ping_timeout", &self.ping_timeout)
            .finish_non_exhaustive()
    }
}

impl Distributor {
    /// Checks the configuration; nothing is read or written yet.
    pub fn new(store: DynStore, config: DistributorConfig) -> Result<Self> {
        let Namespaces {
            services,
            units,
            distribution,
        } = config.validate()?;
        let prober = config.prober.clone().unwrap_or_else(|| {
            Arc::new(
                DefaultProber::new(store.clone(), config.ping_timeout)
                    .with_clock(config.clock.clone()),
            )
        });
        Ok(Distributor {
            store,
            services,
            units,
            distribution,
            poll_interval: config.poll_interval,
            ping_timeout: config.ping_timeout,
            prober,
            down_after: config.down_after,
            health: Mutex::new(BTreeMap::new()),
            clock: config.clock,
        })
    }

    /// The key space of the table.
    pub fn distribution(&self) -> &Keyspace {
        &self.distribution
    }

    /// The poll interval.
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// Every registered service across the services namespaces, by name. A name registered in
    /// several namespaces is taken from the first one given, with a warning.
    pub async fn registered(&self) -> Result<Vec<Service>> {
        let mut by_name: BTreeMap<String, Service> = BTreeMap::new();
        for ns in &self.services {
            for s in list_services(&self.store, ns).await? {
                if let Some(first) = by_name.get(&s.name) {
                    tracing::warn!(
                        service = %s.name,
                        kept = first.namespace.group(),
                        ignored = ns.group(),
                        "service registered in two namespaces; keeping the first"
                    );
                    continue;
                }
                by_name.insert(s.name.clone(), s);
            }
        }
        Ok(by_name.into_values().collect())
    }

    /// Probes every service concurrently, each cut at the ping timeout.
    pub async fn probe(&self, services: &[Service]) -> Vec<Health> {
        let checks = services.iter().map(|s| async move {
            let probe = match &s.liveness {
                Ok(Liveness::Grpc(_)) => "grpc",
                Ok(Liveness::Heartbeat) => "heartbeat",
                Err(_) => "invalid",
            };
            let clock = self.clock.as_ref();
            let start = clock.monotonic();
            let health = timeout(clock, self.ping_timeout, self.prober.check(s))
                .await
                .unwrap_or_else(|| {
                    Health::Down(format!("no answer within {:?}", self.ping_timeout))
                });
            ::metrics::histogram!(m::DISTRIBUTOR_PING_DURATION, "probe" => probe)
                .record(clock.monotonic().saturating_sub(start));
            let result = if health.is_serving() {
                "serving"
            } else {
                "down"
            };
            ::metrics::counter!(m::DISTRIBUTOR_PINGS, "probe" => probe, "result" => result)
                .increment(1);
            health
        });
        futures::future::join_all(checks).await
    }

    /// One poll: read the table, the services and the units, probe, recompute, and write the
    /// table and the per-service records when anything changed. Starts over (a few times) when
    /// another distributor wrote meanwhile.
    pub async fn poll(&self) -> Result<PollOutcome> {
        let span = tracing::debug_span!("distributor.poll", namespace = %self.distribution.key(""));
        self.poll_once().instrument(span).await
    }

    async fn poll_once(&self) -> Result<PollOutcome> {
        let key = table_key(&self.distribution);
        for _ in 0..CAS_ATTEMPTS {
            let current_text = self.store.get(&key).await?;
            let current = current_text
                .as_deref()
                .map(|t| DistributionTable::parse(&key, t))
                .transpose()?;
            let registered = self.registered().await?;
            let units = list_units(&self.store, &self.units).await?;
            let health = self.probe(&registered).await;
            let up = self.judge(&registered, &health, current.as_ref());
            let mut healthy = Vec::new();
            let mut down = BTreeSet::new();
            for (s, up) in registered.iter().zip(up) {
                if up {
                    healthy.push(s.name.clone());
                } else {
                    down.insert(s.name.clone());
                }
            }
            let version = current.as_ref().map_or(0, |t| t.version);
            if healthy.is_empty() && !units.is_empty() {
                tracing::warn!(
                    registered = registered.len(),
                    units = units.len(),
                    version,
                    "no healthy service: keeping the last table"
                );
                return Ok(PollOutcome::KeptNoHealthyService { version });
            }
            // Records may be ahead of the table when someone deleted or reset the `table` key:
            // start above them, or their monotonic writes would ignore the new table for good.
            let records = self.records().await?;
            let floor = records
                .iter()
                .filter_map(|(s, t)| ServiceAssignment::parse(s, t).ok())
                .map(|a| a.version)
                .max()
                .unwrap_or(0);
            let next_version = version.max(floor).checked_add(1).ok_or_else(|| {
                Error::foreign(&key, "a table version below u64::MAX", "u64::MAX")
            })?;
            let next = compute_table(&healthy, &down, &units, next_version)?;
            if let Some(cur) = &current {
                if cur.same_content(&next) {
                    self.sync_records(cur, None, records).await?;
                    return Ok(PollOutcome::Unchanged { version });
                }
            } else if registered.is_empty() {
                return Ok(PollOutcome::Unchanged { version: 0 });
            }
            let text = next.encode()?;
            if self
                .store
                .compare_and_set(&key, current_text.as_deref(), &text, None)
                .await?
            {
                ::metrics::counter!(m::DISTRIBUTOR_TABLE_WRITES, "result" => "written")
                    .increment(1);
                let TableDiff {
                    moved,
                    added,
                    removed,
                } = table_diff(current.as_ref(), &next);
                tracing::info!(
                    version = next.version,
                    services = healthy.len(),
                    down = down.len(),
                    units = units.len(),
                    moved,
                    added,
                    removed,
                    "table changed"
                );
                self.sync_records(&next, current.as_ref(), records).await?;
                return Ok(PollOutcome::Written {
                    version: next.version,
                    moved,
                    added,
                    removed,
                });
            }
            ::metrics::counter!(m::DISTRIBUTOR_TABLE_WRITES, "result" => "conflict").increment(1);
            tracing::debug!("another distributor wrote the table meanwhile; polling again");
        }
        Err(contended(&key))
    }

    /// Whether each service counts as up in this poll, from its health and the pings it failed
    /// in a row before (see [`counts_as_down`]), logging each change once.
    fn judge(
        &self,
        services: &[Service],
        health: &[Health],
        current: Option<&DistributionTable>,
    ) -> Vec<bool> {
        let mut last = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen = BTreeMap::new();
        let mut verdicts = Vec::with_capacity(services.len());
        for (s, h) in services.iter().zip(health) {
            let before = last.get(&s.name).copied();
            let misses = match h {
                Health::Serving => 0,
                Health::Down(_) => before.map_or(0, |(_, m)| m).saturating_add(1),
            };
            let in_table = current
                .is_some_and(|t| t.services.contains_key(&s.name) && !t.down.contains(&s.name));
            let up = !counts_as_down(misses, self.down_after, in_table);
            match (before.map(|(up, _)| up), up, h) {
                (Some(true) | None, false, Health::Down(why)) => {
                    tracing::warn!(service = %s.name, reason = %why, misses, "service is down")
                }
                (_, true, Health::Down(why)) => tracing::info!(
                    service = %s.name,
                    reason = %why,
                    misses,
                    down_after = self.down_after,
                    "ping failed; the service keeps its units until it fails down_after in a row"
                ),
                (Some(false), true, Health::Serving) => {
                    tracing::info!(service = %s.name, "service answers again")
                }
                (None, true, Health::Serving) => {
                    tracing::info!(service = %s.name, "service is up")
                }
                _ => {}
            }
            seen.insert(s.name.clone(), (up, misses));
            verdicts.push(up);
        }
        for gone in last.keys().filter(|n| !seen.contains_key(*n)) {
            tracing::info!(service = %gone, "service deregistered");
        }
        *last = seen;
        verdicts
    }

    /// Every per-service record under the distribution namespace, by service name.
    async fn records(&self) -> Result<BTreeMap<String, String>> {
        let prefix = self.distribution.key("service:");
        Ok(self
            .store
            .list(&prefix)
            .await?
            .into_iter()
            .map(|(k, v)| (k[prefix.len()..].to_owned(), v))
            .collect())
    }

    /// Brings every per-service record to `table`'s version: services that lose units first,
    /// then the others, then empty records (with a TTL) for services of `previous` that left.
    /// `existing` are the records as listed earlier in the poll: a record written since only
    /// makes one compare-and-set fail and be retried.
    async fn sync_records(
        &self,
        table: &DistributionTable,
        previous: Option<&DistributionTable>,
        existing: BTreeMap<String, String>,
    ) -> Result<()> {
        let loses = |s: &str, units: &[String]| {
            existing
                .get(s)
                .and_then(|t| ServiceAssignment::parse(s, t).ok())
                .is_some_and(|a| a.units.iter().any(|u| !units.contains(u)))
        };
        let mut order: Vec<(&String, &Vec<String>)> = table.services.iter().collect();
        order.sort_by_key(|(s, units)| !loses(s, units));
        for (service, units) in order {
            let want = ServiceAssignment {
                version: table.version,
                units: units.clone(),
            };
            self.write_record(service, &want, existing.get(service.as_str()), None)
                .await?;
        }
        let mut departed: BTreeSet<&String> = existing
            .keys()
            .filter(|s| !table.services.contains_key(*s))
            .collect();
        if let Some(prev) = previous {
            departed.extend(
                prev.services
                    .keys()
                    .filter(|s| !table.services.contains_key(*s)),
            );
        }
        for service in departed {
            let empty = ServiceAssignment {
                version: table.version,
                units: Vec::new(),
            };
            self.write_record(
                service,
                &empty,
                existing.get(service.as_str()),
                Some(DEPARTED_RECORD_TTL),
            )
            .await?;
        }
        Ok(())
    }

    /// Writes `want` to a service's record unless the record already holds it or a later
    /// version. `seen` is the value listed at the start of the sync.
    async fn write_record(
        &self,
        service: &str,
        want: &ServiceAssignment,
        seen: Option<&String>,
        ttl: Option<Duration>,
    ) -> Result<()> {
        let key = assignment_key(&self.distribution, service);
        let text = want.encode()?;
        let mut current = seen.cloned();
        for _ in 0..CAS_ATTEMPTS {
            if let Some(cur) = &current {
                match ServiceAssignment::parse(&key, cur) {
                    Ok(a) if a.version > want.version || a == *want => return Ok(()),
                    // A departed service's empty record keeps its first TTL.
                    Ok(a) if ttl.is_some() && a.units.is_empty() => return Ok(()),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "replacing a foreign assignment record"),
                }
            }
            if self
                .store
                .compare_and_set(&key, current.as_deref(), &text, ttl)
                .await?
            {
                return Ok(());
            }
            current = self.store.get(&key).await?;
        }
        Err(contended(&key))
    }

    /// Polls every poll interval until `stop` resolves. A failed poll is logged and retried at
    /// the next interval; the last table stays in the store meanwhile.
    pub async fn run(&self, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let clock = self.clock.as_ref();
        let mut pace = Pace::new(self.poll_interval);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                () = pace.tick(clock) => {}
            }
            tokio::select! {
                _ = &mut stop => return,
                outcome = self.poll() => match outcome {
                    Ok(o) => tracing::debug!(?o, "poll"),
                    Err(e) => tracing::warn!(error = %e, "poll failed; the last table stays"),
                },
            }
        }
    }

    /// Runs [`Distributor::run`] in a task (on the current Tokio runtime) until the handle is
    /// stopped or dropped.
    pub fn spawn(self) -> RunningDistributor {
        let task = Background::spawn("the distributor", OnDrop::Stop, |stop| async move {
            self.run(stop_requested(stop)).await;
            Ok(())
        });
        RunningDistributor { task }
    }
}

/// A distributor running in a task; see [`Distributor::spawn`]. Dropping it stops the task
/// after the current poll's store call.
#[derive(Debug)]
pub struct RunningDistributor {
    task: Background,
}

impl RunningDistributor {
    /// Stops after the current poll's store call and waits for the task.
    pub async fn stop(self) {
        let _ = self.task.stop().await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;

    use super::*;
    use crate::memory::MemoryStore;
    use crate::recipes::distributor::{
        add_unit, namespace, register, DistributorConfig, Health, Liveness, Prober, Service,
    };

    /// Answers `Down` for the services named in its set, `Serving` for the others.
    #[derive(Debug, Default)]
    struct Failing(Mutex<BTreeSet<String>>);

    #[async_trait]
    impl Prober for Failing {
        async fn check(&self, service: &Service) -> Health {
            if self.0.lock().unwrap().contains(&service.name) {
                Health::Down("no answer (this test)".into())
            } else {
                Health::Serving
            }
        }
    }

    #[test]
    fn a_service_with_units_is_down_only_after_its_misses_in_a_row() {
        assert!(!counts_as_down(0, 2, true));
        assert!(!counts_as_down(1, 2, true));
        assert!(counts_as_down(2, 2, true));
        assert!(counts_as_down(1, 1, true), "the article's distributor");
        assert!(counts_as_down(1, 2, false), "no units: nothing moves");
    }

    /// Two services, four units; `b` misses one ping, then two in a row, with `down_after`.
    async fn moves_after(down_after: u32) -> (usize, usize) {
        let store: DynStore = Arc::new(MemoryStore::new());
        let services = namespace("hc", "services", "svc").unwrap();
        let units = namespace("hc", "workunits", "work").unwrap();
        for u in ["u1", "u2", "u3", "u4"] {
            add_unit(&store, &units, u).await.unwrap();
        }
        for name in ["a", "b"] {
            register(&store, &services, name, &Liveness::Heartbeat)
                .await
                .unwrap();
        }
        let prober = Arc::new(Failing::default());
        let config = DistributorConfig::new(["svc"], "work", "dist")
            .with_prober(prober.clone())
            .with_down_after(down_after);
        let d = Distributor::new(store, config).unwrap();
        assert!(matches!(
            d.poll().await.unwrap(),
            PollOutcome::Written { .. }
        ));
        let moved = |o: PollOutcome| match o {
            PollOutcome::Written { moved, .. } => moved,
            _ => 0,
        };
        prober.0.lock().unwrap().insert("b".into());
        let first = moved(d.poll().await.unwrap());
        let second = moved(d.poll().await.unwrap());
        (first, second)
    }

    #[tokio::test]
    async fn one_missed_ping_moves_nothing_by_default() {
        assert_eq!(
            moves_after(2).await,
            (0, 2),
            "b's two units move at the second miss"
        );
        assert_eq!(
            moves_after(1).await,
            (2, 0),
            "the article: at the first miss"
        );
    }
}
