//! One service's units: the [`ServiceAssignment`] record, [`read_assignment`] and
//! [`watch_assignment`].

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{assignment_key, check_service_name, read_table};
use crate::clock::{Clock, Pace, SystemClock};
use crate::error::{Error, Result};
use crate::keys::Keyspace;
use crate::notify::Notifications;
use crate::task::{Background, OnDrop};
use crate::DynStore;

/// One service's units, as stored in its record under the distribution namespace.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ServiceAssignment {
    /// The table version these units belong to (0: no record yet).
    pub version: u64,
    /// The units, in the order the service took them.
    pub units: Vec<String>,
}

impl ServiceAssignment {
    /// Parses a per-service record.
    pub fn parse(key: &str, text: &str) -> Result<Self> {
        serde_json::from_str(text)
            .map_err(|_| Error::foreign(key, "a distributor assignment record", text))
    }

    pub(super) fn encode(&self) -> Result<String> {
        serde_json::to_string(self)
            .map_err(|e| Error::invalid(format!("cannot encode an assignment: {e}")))
    }
}

/// The units of `service` with one `get`: `None` when it has no record (never matched, or its
/// empty record expired after it left).
pub async fn read_assignment(
    store: &DynStore,
    distribution: &Keyspace,
    service: &str,
) -> Result<Option<ServiceAssignment>> {
    check_service_name(service)?;
    let key = assignment_key(distribution, service);
    store
        .get(&key)
        .await?
        .map(|text| ServiceAssignment::parse(&key, &text))
        .transpose()
}

/// A service's view of its units, polled from its record; see [`watch_assignment`].
#[derive(Debug)]
pub struct ServiceAssignmentWatch {
    rx: watch::Receiver<ServiceAssignment>,
    task: Background,
}

impl ServiceAssignmentWatch {
    /// The units as last read (version 0 and no units before the first record is seen).
    pub fn current(&self) -> ServiceAssignment {
        self.rx.borrow().clone()
    }

    /// Waits until the units or their version change, and returns the new assignment.
    pub async fn changed(&mut self) -> Result<ServiceAssignment> {
        self.rx
            .changed()
            .await
            .map_err(|_| Error::stopped(self.task.what(), "its polling task ended"))?;
        Ok(self.rx.borrow_and_update().clone())
    }

    /// The underlying receiver, for `tokio::select!` or a `WatchStream`.
    pub fn receiver(&self) -> watch::Receiver<ServiceAssignment> {
        self.rx.clone()
    }
}

/// Watches the units of `service`: reads its record every `every` and reports each change, so a
/// change reaches the service at most `every` (plus one store round trip) after a distributor
/// writes it. On a store that notifies changes ([`Store::subscribe`](crate::Store::subscribe):
/// Redis, PostgreSQL, etcd, and SQLite within one process) it also reads the record as soon as
/// a record of the distribution namespace changes, so a new table usually reaches the service
/// within a round trip; the reads every `every` go on, so a lost notification costs only the
/// wait for the next one. Reads a notification causes are at least `every / 16` (at most
/// 100 ms) apart. A read that fails or finds a foreign value is logged and keeps the last units; an
/// older version than the last seen is ignored. A record that disappears (it expired after the
/// service left) reads as no units at the last version. Call it from within a Tokio runtime: it
/// spawns the polling task there.
pub fn watch_assignment(
    store: DynStore,
    distribution: Keyspace,
    service: String,
    every: Duration,
) -> Result<ServiceAssignmentWatch> {
    watch_assignment_with_clock(
        store,
        distribution,
        service,
        every,
        Arc::new(SystemClock::new()),
    )
}

/// [`watch_assignment`], pacing the reads on `clock` (tests drive a
/// [`ManualClock`](crate::ManualClock)).
pub fn watch_assignment_with_clock(
    store: DynStore,
    distribution: Keyspace,
    service: String,
    every: Duration,
    clock: Arc<dyn Clock>,
) -> Result<ServiceAssignmentWatch> {
    check_service_name(&service)?;
    if every.is_zero() {
        return Err(Error::invalid("the watch interval is zero"));
    }
    let (tx, rx) = watch::channel(ServiceAssignment::default());
    let what = format!("the assignment watch of service {service}");
    let task = Background::spawn(what, OnDrop::Abort, |_| async move {
        // A read at once, then one every `every`, and one soon after each notification.
        let mut pace = Pace::new(every);
        let dir = distribution.key("service:");
        let mut notices = match store.subscribe(&dir).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(service = %service, error = %e, "could not subscribe to the distribution namespace's notifications: polling only");
                Notifications::never(&dir)
            }
        };
        let gap = (every / 16).min(Duration::from_millis(100));
        let mut noticed: Option<Duration> = None;
        loop {
            tokio::select! {
                biased;
                () = pace.tick(clock.as_ref()) => {}
                _ = notices.recv() => {
                    // A burst of notifications (a table rewriting every service's record) is
                    // answered by one read.
                    if let Some(at) = noticed {
                        clock.sleep_until(at + gap).await;
                    }
                    let _ = notices.try_recv();
                    noticed = Some(clock.monotonic());
                }
            }
            let read = read_assignment(&store, &distribution, &service).await;
            let last = tx.borrow().clone();
            let next = match read {
                Ok(Some(a)) if a.version >= last.version => a,
                // Records never go back in version, except when the namespace was wiped and a
                // new line of tables began at 1: follow it once the table says so too.
                Ok(Some(a)) => match read_table(&store, &distribution).await {
                    Ok(Some(t)) if t.version < last.version && a.version <= t.version => a,
                    _ => continue,
                },
                Ok(None) => ServiceAssignment {
                    version: last.version,
                    units: Vec::new(),
                },
                Err(e) => {
                    tracing::warn!(service = %service, error = %e, "reading the assignment failed");
                    continue;
                }
            };
            if next != last && tx.send(next).is_err() {
                return Ok(());
            }
        }
    });
    Ok(ServiceAssignmentWatch { rx, task })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;
    use std::time::Duration;

    use super::{assignment_key, watch_assignment, ServiceAssignment};
    use crate::keys::Keyspace;
    use crate::recipes::distributor::{table_key, DistributionTable};
    use crate::DynStore;

    #[tokio::test]
    async fn a_watch_follows_a_new_line_of_tables_after_a_wipe() {
        let memory = crate::memory::MemoryStore::new();
        let store: DynStore = Arc::new(memory.clone());
        let ns = Keyspace::with_prefix("hc", "dist").unwrap();
        let put = |version: u64, units: &[&str]| {
            let store = store.clone();
            let ns = ns.clone();
            let units: Vec<String> = units.iter().map(|u| (*u).to_owned()).collect();
            async move {
                let a = ServiceAssignment {
                    version,
                    units: units.clone(),
                };
                let t = DistributionTable {
                    version,
                    services: BTreeMap::from([("s".to_owned(), units)]),
                    down: BTreeSet::new(),
                };
                store
                    .compare_and_set(&assignment_key(&ns, "s"), None, &a.encode().unwrap(), None)
                    .await
                    .unwrap();
                store
                    .compare_and_set(&table_key(&ns), None, &t.encode().unwrap(), None)
                    .await
                    .unwrap();
            }
        };
        put(7, &["a", "b"]).await;
        let watch = watch_assignment(
            store.clone(),
            ns.clone(),
            "s".into(),
            Duration::from_millis(5),
        )
        .unwrap();
        let seen = |version: u64| {
            let mut rx = watch.rx.clone();
            async move {
                tokio::time::timeout(
                    Duration::from_secs(5),
                    rx.wait_for(|a| a.version == version),
                )
                .await
                .is_ok()
            }
        };
        assert!(seen(7).await);
        // The namespace is wiped; a distributor starts a new line of tables at 1.
        memory.clear();
        put(1, &["c"]).await;
        assert!(seen(1).await, "the watch stayed on {:?}", watch.current());
        assert_eq!(watch.current().units, ["c"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_reads_a_new_record_when_notified_not_at_its_next_poll() {
        let store: DynStore = Arc::new(crate::memory::MemoryStore::new());
        let ns = Keyspace::with_prefix("hc", "dist").unwrap();
        let every = Duration::from_secs(3600);
        let clock: Arc<dyn crate::Clock> = Arc::new(crate::sim::SimClock::new(
            std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        ));
        let watch =
            super::watch_assignment_with_clock(store.clone(), ns.clone(), "s".into(), every, clock)
                .unwrap();
        // The first read, at once, finds nothing; let the task subscribe.
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = tokio::time::Instant::now();
        let a = ServiceAssignment {
            version: 3,
            units: vec!["u1".into()],
        };
        store
            .compare_and_set(&assignment_key(&ns, "s"), None, &a.encode().unwrap(), None)
            .await
            .unwrap();
        let mut rx = watch.receiver();
        rx.wait_for(|x| x.version == 3).await.unwrap();
        // Well before the next poll, an hour away.
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        // A second change within the gap is read at the gap's end, not an hour later.
        let b = ServiceAssignment {
            version: 4,
            units: vec!["u2".into()],
        };
        store
            .compare_and_set(
                &assignment_key(&ns, "s"),
                Some(&a.encode().unwrap()),
                &b.encode().unwrap(),
                None,
            )
            .await
            .unwrap();
        rx.wait_for(|x| x.version == 4).await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
}
