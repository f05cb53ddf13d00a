//! The Distributor: a deterministic matching of services to work units, kept in the
//! store, recomputed when a service stops answering its health checks.
//!
//! Everything goes through [`DynStore`], so it works on every backend. See `docs/distributor.md`
//! for the whole story; in short:
//!
//! # Keys
//!
//! Each namespace is a [`Keyspace`] (`hc:{namespace}:`), validated like a group name.
//!
//! | namespace | key | value |
//! |---|---|---|
//! | services (one or more) | `service:{name}` | where the service answers health checks: `http://host:port` (gRPC), or `heartbeat` |
//! | services | `heartbeat:{name}` | `alive`, with a TTL the service renews (heartbeat liveness only) |
//! | work units | `unit:{percent-encoded name}` | the unit's name as given (informational; the key is authoritative) |
//! | distribution | `table` | the whole table: `{"version":N,"services":{"a":["u1",...],...},"down":["c"]}` |
//! | distribution | `service:{name}` | one service's units: `{"version":N,"units":["u1","u,2"]}` |
//!
//! Unit names are JSON strings in the table, so commas (the article joins names with commas) and
//! any other character survive; in keys they are percent-encoded.
//!
//! # The matching
//!
//! [`match_work_units`]: the units on a ring with 50 points each, the healthy services sorted,
//! each service in turn takes its nearest remaining unit until none remain. The same table for the
//! same services and units whatever their order and whichever distributor computes it; unit counts
//! per service differ by at most one. Registered services that fail their health check stay in the
//! table with no units and are listed under `down`.
//!
//! # Versioned writes
//!
//! A poll reads the `table` record first, then the services and units, probes, computes, and
//! writes a changed table with one `compare_and_set` from the exact text it read to the new table
//! at `version + 1`. If any distributor wrote in between, the CAS fails and the poll starts over
//! from the newer table: a slow distributor cannot replace a newer table with one computed from
//! older information. Per-service records are then brought to the table's version, each with a
//! `get` + `compare_and_set` that never replaces a record of a higher version. Every poll repairs
//! records left behind (a distributor that died between the table and its records).
//!
//! **What a reader sees**: the `table` record is always one complete table, and its versions only
//! increase. A per-service record is always one service's complete list at the version it states,
//! and its version never decreases. During an update (between the table CAS and the last record,
//! normally milliseconds; until the next poll if the writer died), records of different services
//! be at different versions (older ones until a sync completes, not only the previous one): a unit that moved may be listed by its old owner and its
//! new one, or by neither. A service that must never overlap with another compares its record's
//! version with the `table` record's, or fences its work with the version
//! (a fencing token: see [`crate::fence`]).
//!
//! # Bad input
//!
//! No registered or no healthy service while there are units: the last table is kept (a
//! distributor that reaches nobody is more likely cut off than alone in the world) and a warning
//! logged. No units: every service gets an empty list. A service whose address does not parse, or
//! whose health server never answers, counts as down. A foreign value at the `table` key stops the
//! writes until a person repairs it. A store error skips the poll; the last table stays.

#[cfg(feature = "grpc")]
pub mod grpc;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::assign::match_work_units;
use crate::error::{Error, Result};
use crate::keys::{Keyspace, DEFAULT_PREFIX};
use crate::metrics as m;
use crate::store::MAX_VALUE_LEN;
use crate::DynStore;

/// The longest service name accepted, in bytes.
pub const MAX_SERVICE_NAME_LEN: usize = 256;

/// The longest work unit name accepted, in bytes.
pub const MAX_UNIT_NAME_LEN: usize = 1024;

/// The shortest poll interval accepted.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// The longest poll interval accepted (one day).
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// The shortest ping timeout accepted.
pub const MIN_PING_TIMEOUT: Duration = Duration::from_millis(1);

/// The longest ping timeout accepted (one hour).
pub const MAX_PING_TIMEOUT: Duration = Duration::from_secs(3600);

/// The value of a service record whose liveness is a heartbeat key.
pub const HEARTBEAT_ADDRESS: &str = "heartbeat";

/// The value a heartbeat key holds.
const HEARTBEAT_VALUE: &str = "alive";

/// How long the empty record of a service that left the registry is kept, so a late reader sees
/// it lost its units before the record expires.
pub const DEPARTED_RECORD_TTL: Duration = Duration::from_secs(24 * 3600);

/// Bytes percent-encoded in the key of a work unit: controls, `%`, and space (so a key read back
/// with a store's own client is unambiguous). Non-ASCII is always encoded.
const UNIT_KEY_SET: &AsciiSet = &CONTROLS.add(b'%').add(b' ');

/// How a service shows it is alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// It serves `grpc.health.v1.Health/Check` at this address (`http://host:port`).
    Grpc(String),
    /// It renews `heartbeat:{name}` in its services namespace before the key's TTL runs out.
    Heartbeat,
}

impl Liveness {
    /// A gRPC address, checked and normalised: `host:port` becomes `http://host:port`; the scheme
    /// must be `http` (TLS health checks are not supported yet) and a port is required.
    pub fn grpc(address: &str) -> Result<Self> {
        Ok(Liveness::Grpc(parse_grpc_address(address)?))
    }

    /// The text stored in the service record.
    pub fn as_record(&self) -> &str {
        match self {
            Liveness::Grpc(a) => a,
            Liveness::Heartbeat => HEARTBEAT_ADDRESS,
        }
    }

    /// Parses a service record's value.
    pub fn from_record(text: &str) -> Result<Self> {
        if text == HEARTBEAT_ADDRESS {
            Ok(Liveness::Heartbeat)
        } else {
            Liveness::grpc(text)
        }
    }
}

/// Checks and normalises a gRPC health address.
fn parse_grpc_address(address: &str) -> Result<String> {
    let a = address.trim();
    let full = if a.contains("://") {
        a.to_owned()
    } else {
        format!("http://{a}")
    };
    let bad = |why: &str| {
        Error::invalid(format!(
            "service address {:?} {why}; expected http://host:port or host:port",
            address.escape_debug().to_string()
        ))
    };
    let (scheme, rest) = full.split_once("://").ok_or_else(|| bad("has no scheme"))?;
    if scheme == "https" {
        return Err(bad(
            "asks for TLS, which the health prober does not speak yet (register the plaintext health port)",
        ));
    }
    if scheme != "http" {
        return Err(bad("has a scheme other than http"));
    }
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
        return Err(bad("is not host:port"));
    }
    let (host, port) = authority
        .rsplit_once(':')
        .ok_or_else(|| bad("has no port"))?;
    if host.is_empty() || host.chars().any(|c| c.is_control()) {
        return Err(bad("has no host"));
    }
    if host.starts_with('[') != host.ends_with(']') {
        return Err(bad("has an unbalanced IPv6 bracket"));
    }
    // What the prober's URI parser accepts as a host: a name, an IPv4 address, or a bracketed
    // IPv6 one. A list (`a:1,b:2`) would be stored and then fail on every ping.
    let plain = host.trim_start_matches('[').trim_end_matches(']');
    let ok = if host.starts_with('[') {
        plain
            .chars()
            .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
    } else {
        plain
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
    };
    if !ok {
        return Err(bad(
            "has characters a host name cannot have (one address only)",
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(bad("has no valid port")),
    }
    Ok(format!("{scheme}://{authority}"))
}

/// The key space of a distributor namespace, or an [`Error::InvalidConfig`] naming `what`
/// (`services namespace`...) and the rule: 1 to 128 characters from `A-Z a-z 0-9 _ - .`,
/// starting with a letter or a digit.
pub fn namespace(prefix: &str, what: &str, ns: &str) -> Result<Keyspace> {
    Keyspace::with_prefix(prefix, ns).map_err(|e| {
        let detail = match e {
            Error::InvalidArgument { message } => message.replace("group name", "namespace"),
            other => other.to_string(),
        };
        Error::config(format!("{what}: {detail}"))
    })
}

/// Checks a service name as [`register`] does, so a caller can validate before writing.
pub fn check_service_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid("service name is empty"));
    }
    if name.len() > MAX_SERVICE_NAME_LEN {
        return Err(Error::invalid(format!(
            "service name is {} bytes long, more than the limit of {MAX_SERVICE_NAME_LEN}",
            name.len()
        )));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(Error::invalid(format!(
            "service name {:?} contains a control character",
            name.escape_debug().to_string()
        )));
    }
    Ok(())
}

/// Checks a work unit name as [`add_unit`] does, so a caller can validate a batch before
/// writing any of it.
pub fn check_unit_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid("work unit name is empty"));
    }
    if name.len() > MAX_UNIT_NAME_LEN {
        return Err(Error::invalid(format!(
            "work unit name is {} bytes long, more than the limit of {MAX_UNIT_NAME_LEN}",
            name.len()
        )));
    }
    // A newline or another control character is a quoting mistake far more often than a name,
    // and it breaks every line-based tool that lists units.
    if name.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "work unit name {:?} contains a control character",
            name.escape_debug().to_string()
        )));
    }
    Ok(())
}

/// The key of a service's record in its services namespace: `hc:{ns}:service:{name}`.
pub fn service_key(services: &Keyspace, name: &str) -> String {
    services.key(format_args!("service:{name}"))
}

/// The heartbeat key of a service: `hc:{ns}:heartbeat:{name}`.
pub fn heartbeat_key(services: &Keyspace, name: &str) -> String {
    services.key(format_args!("heartbeat:{name}"))
}

/// The key of a work unit: `hc:{ns}:unit:{percent-encoded name}`.
pub fn unit_key(units: &Keyspace, name: &str) -> String {
    units.key(format_args!(
        "unit:{}",
        utf8_percent_encode(name, UNIT_KEY_SET)
    ))
}

/// The key of the whole table: `hc:{ns}:table`.
pub fn table_key(distribution: &Keyspace) -> String {
    distribution.key("table")
}

/// The key of one service's units in the distribution namespace: `hc:{ns}:service:{name}`.
pub fn assignment_key(distribution: &Keyspace, service: &str) -> String {
    distribution.key(format_args!("service:{service}"))
}

/// What [`register`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// The service was not registered; now it is.
    New,
    /// It was already registered with the same liveness: nothing was written.
    Unchanged,
    /// It was registered with another address (a restart on a new port); the record now holds the
    /// new one.
    AddressChanged {
        /// The address it replaced.
        previous: String,
    },
}

/// Registers `name` in the services namespace `services`, idempotently: registering again with
/// the same liveness writes nothing. Registering with a different address replaces it, since the
/// name is the service's identity and the address only where it answers now (a restarted
/// service on a new port must not stay stuck on the old one). Registrations never expire; see
/// [`deregister`].
pub async fn register(
    store: &DynStore,
    services: &Keyspace,
    name: &str,
    liveness: &Liveness,
) -> Result<Registration> {
    check_service_name(name)?;
    let value = match liveness {
        Liveness::Grpc(a) => parse_grpc_address(a)?,
        Liveness::Heartbeat => HEARTBEAT_ADDRESS.to_owned(),
    };
    let key = service_key(services, name);
    for _ in 0..CAS_ATTEMPTS {
        match store.get(&key).await? {
            None => {
                if store.compare_and_set(&key, None, &value, None).await? {
                    return Ok(Registration::New);
                }
            }
            Some(current) if current == value => return Ok(Registration::Unchanged),
            Some(current) => {
                if store
                    .compare_and_set(&key, Some(&current), &value, None)
                    .await?
                {
                    return Ok(Registration::AddressChanged { previous: current });
                }
            }
        }
    }
    Err(contended(store, &key))
}

/// Removes `name` from the services namespace. The next poll of a distributor drops it from the
/// table and leaves it an empty record for [`DEPARTED_RECORD_TTL`]. Returns whether it was
/// registered.
pub async fn deregister(store: &DynStore, services: &Keyspace, name: &str) -> Result<bool> {
    check_service_name(name)?;
    store.delete(&service_key(services, name)).await
}

/// Renews the heartbeat of `name` (heartbeat liveness): the key lives `ttl` from now. Call it
/// more often than `ttl` (every `ttl / 3` is the usual choice), or use [`spawn_heartbeat`].
pub async fn beat(store: &DynStore, services: &Keyspace, name: &str, ttl: Duration) -> Result<()> {
    check_service_name(name)?;
    let key = heartbeat_key(services, name);
    for _ in 0..CAS_ATTEMPTS {
        let current = store.get(&key).await?;
        if store
            .compare_and_set(&key, current.as_deref(), HEARTBEAT_VALUE, Some(ttl))
            .await?
        {
            return Ok(());
        }
    }
    Err(contended(store, &key))
}

/// A task renewing a heartbeat every `ttl / 3` until stopped or dropped.
#[derive(Debug)]
pub struct HeartbeatHandle {
    task: JoinHandle<()>,
}

impl HeartbeatHandle {
    /// Stops renewing; the key expires within its TTL.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for HeartbeatHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Beats once (so an error such as a bad name or an unreachable store is returned), then renews
/// the heartbeat of `name` every `ttl / 3` in a task, logging failures, until the handle is
/// stopped or dropped.
pub async fn spawn_heartbeat(
    store: DynStore,
    services: Keyspace,
    name: String,
    ttl: Duration,
) -> Result<HeartbeatHandle> {
    beat(&store, &services, &name, ttl).await?;
    let period = (ttl / 3).max(Duration::from_millis(1));
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Err(e) = beat(&store, &services, &name, ttl).await {
                tracing::warn!(service = %name, error = %e, "heartbeat failed");
            }
        }
    });
    Ok(HeartbeatHandle { task })
}

/// Adds a work unit (idempotent). Any name of 1 to [`MAX_UNIT_NAME_LEN`] bytes without NUL:
/// commas, spaces, `:` and any Unicode are fine. Returns whether it was new.
pub async fn add_unit(store: &DynStore, units: &Keyspace, name: &str) -> Result<bool> {
    check_unit_name(name)?;
    let key = unit_key(units, name);
    if store.compare_and_set(&key, None, name, None).await? {
        return Ok(true);
    }
    Ok(false)
}

/// Removes a work unit. Returns whether it was there.
pub async fn remove_unit(store: &DynStore, units: &Keyspace, name: &str) -> Result<bool> {
    check_unit_name(name)?;
    store.delete(&unit_key(units, name)).await
}

/// Every work unit under `units`, sorted by key. A key whose encoded name does not decode to a
/// valid name is skipped with a warning (someone else wrote it).
pub async fn list_units(store: &DynStore, units: &Keyspace) -> Result<Vec<String>> {
    let prefix = units.key("unit:");
    let mut names = Vec::new();
    for (key, _) in store.list(&prefix).await? {
        let encoded = &key[prefix.len()..];
        match percent_decode_str(encoded).decode_utf8() {
            // Only the canonical key of a name counts: `unit:a%2Cb` written by hand beside
            // `unit:a,b` would otherwise give the matching the same name twice, and it refuses
            // duplicates, which would stop every redistribution.
            Ok(name) if check_unit_name(&name).is_ok() && unit_key(units, &name) == key => {
                names.push(name.into_owned())
            }
            _ => {
                tracing::warn!(key = %key.escape_debug(), "skipping a work unit key that does not decode to a name whose key it is")
            }
        }
    }
    Ok(names)
}

/// A registered service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// Its name, unique across the services namespaces of a distributor.
    pub name: String,
    /// The services namespace it registered in.
    pub namespace: Keyspace,
    /// How it shows it is alive, or why its record does not parse.
    pub liveness: std::result::Result<Liveness, String>,
}

/// Every service registered under `services`, sorted by name.
pub async fn list_services(store: &DynStore, services: &Keyspace) -> Result<Vec<Service>> {
    let prefix = services.key("service:");
    Ok(store
        .list(&prefix)
        .await?
        .into_iter()
        .map(|(key, value)| Service {
            name: key[prefix.len()..].to_owned(),
            namespace: services.clone(),
            liveness: Liveness::from_record(&value).map_err(|e| e.to_string()),
        })
        .collect())
}

/// The answer of a health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// It answered SERVING (or its heartbeat is live).
    Serving,
    /// It did not: why (timeout, refused, NOT_SERVING, no heartbeat, bad address).
    Down(String),
}

impl Health {
    /// Whether it is [`Health::Serving`].
    pub fn is_serving(&self) -> bool {
        matches!(self, Health::Serving)
    }
}

/// Checks whether a service is alive. The distributor calls it for every registered service
/// every poll, concurrently, and counts anything slower than the ping timeout as down.
#[async_trait]
pub trait Prober: Send + Sync + fmt::Debug {
    /// The health of `service` now.
    async fn check(&self, service: &Service) -> Health;
}

/// The default prober: gRPC health checks (with the `grpc` feature; without it a gRPC service
/// counts as down and says why) and heartbeat keys, each bounded by the ping timeout.
#[derive(Debug, Clone)]
pub struct DefaultProber {
    store: DynStore,
    timeout: Duration,
}

impl DefaultProber {
    /// A prober reading heartbeats from `store`, giving each check `timeout`.
    pub fn new(store: DynStore, timeout: Duration) -> Self {
        DefaultProber { store, timeout }
    }
}

#[async_trait]
impl Prober for DefaultProber {
    async fn check(&self, service: &Service) -> Health {
        match &service.liveness {
            Err(why) => Health::Down(why.clone()),
            Ok(Liveness::Heartbeat) => {
                let key = heartbeat_key(&service.namespace, &service.name);
                match tokio::time::timeout(self.timeout, self.store.get(&key)).await {
                    Ok(Ok(Some(_))) => Health::Serving,
                    Ok(Ok(None)) => Health::Down("no live heartbeat".into()),
                    Ok(Err(e)) => Health::Down(format!("reading its heartbeat: {e}")),
                    Err(_) => Health::Down(format!(
                        "reading its heartbeat took longer than {:?}",
                        self.timeout
                    )),
                }
            }
            #[cfg(feature = "grpc")]
            Ok(Liveness::Grpc(address)) => grpc::check(address, self.timeout).await,
            #[cfg(not(feature = "grpc"))]
            Ok(Liveness::Grpc(_)) => Health::Down(
                "gRPC health checks need headcount's `grpc` cargo feature, which is not enabled"
                    .into(),
            ),
        }
    }
}

/// The matching table as stored in the `table` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table {
    /// Starts at 1 and grows by one with every change.
    pub version: u64,
    /// Every registered service and its units, in the order it took them; down services have none.
    pub services: BTreeMap<String, Vec<String>>,
    /// The registered services that failed their health check.
    #[serde(default)]
    pub down: BTreeSet<String>,
}

impl Table {
    /// The units of `service` (empty when it has none or is not in the table).
    pub fn units_of(&self, service: &str) -> &[String] {
        self.services.get(service).map_or(&[], Vec::as_slice)
    }

    /// The owner of each unit.
    pub fn owners(&self) -> BTreeMap<&str, &str> {
        self.services
            .iter()
            .flat_map(|(s, units)| units.iter().map(move |u| (u.as_str(), s.as_str())))
            .collect()
    }

    fn same_content(&self, other: &Table) -> bool {
        self.services == other.services && self.down == other.down
    }

    /// Parses the `table` record.
    pub fn parse(key: &str, text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|_| Error::foreign(key, "a distributor table", text))
    }

    fn encode(&self) -> Result<String> {
        let text = serde_json::to_string(self)
            .map_err(|e| Error::invalid(format!("cannot encode the table: {e}")))?;
        if text.len() > MAX_VALUE_LEN {
            return Err(Error::invalid(format!(
                "the table is {} bytes long, more than a record holds ({MAX_VALUE_LEN}); use fewer or shorter work units",
                text.len()
            )));
        }
        Ok(text)
    }
}

/// One service's units, as stored in its record under the distribution namespace.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Assignment {
    /// The table version these units belong to (0: no record yet).
    pub version: u64,
    /// The units, in the order the service took them.
    pub units: Vec<String>,
}

impl Assignment {
    /// Parses a per-service record.
    pub fn parse(key: &str, text: &str) -> Result<Self> {
        serde_json::from_str(text)
            .map_err(|_| Error::foreign(key, "a distributor assignment record", text))
    }

    fn encode(&self) -> Result<String> {
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
) -> Result<Option<Assignment>> {
    check_service_name(service)?;
    let key = assignment_key(distribution, service);
    store
        .get(&key)
        .await?
        .map(|text| Assignment::parse(&key, &text))
        .transpose()
}

/// The whole table, or `None` before the first one is written.
pub async fn read_table(store: &DynStore, distribution: &Keyspace) -> Result<Option<Table>> {
    let key = table_key(distribution);
    store
        .get(&key)
        .await?
        .map(|text| Table::parse(&key, &text))
        .transpose()
}

/// A service's view of its units, polled from its record; see [`watch_assignment`].
#[derive(Debug)]
pub struct AssignmentWatch {
    rx: watch::Receiver<Assignment>,
    task: JoinHandle<()>,
}

impl AssignmentWatch {
    /// The units as last read (version 0 and no units before the first record is seen).
    pub fn current(&self) -> Assignment {
        self.rx.borrow().clone()
    }

    /// Waits until the units or their version change, and returns the new assignment.
    pub async fn changed(&mut self) -> Result<Assignment> {
        self.rx
            .changed()
            .await
            .map_err(|_| Error::invalid("the assignment watch stopped"))?;
        Ok(self.rx.borrow_and_update().clone())
    }

    /// The underlying receiver, for `tokio::select!` or a `WatchStream`.
    pub fn receiver(&self) -> watch::Receiver<Assignment> {
        self.rx.clone()
    }
}

impl Drop for AssignmentWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches the units of `service`: reads its record every `every` and reports each change, so a
/// change reaches the service at most `every` (plus one store round trip) after a distributor
/// writes it. A read that fails or finds a foreign value is logged and keeps the last units; an
/// older version than the last seen is ignored. A record that disappears (it expired after the
/// service left) reads as no units at the last version. Call it from within a Tokio runtime: it
/// spawns the polling task there.
pub fn watch_assignment(
    store: DynStore,
    distribution: Keyspace,
    service: String,
    every: Duration,
) -> Result<AssignmentWatch> {
    check_service_name(&service)?;
    if every.is_zero() {
        return Err(Error::invalid("the watch interval is zero"));
    }
    let (tx, rx) = watch::channel(Assignment::default());
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
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
                Ok(None) => Assignment {
                    version: last.version,
                    units: Vec::new(),
                },
                Err(e) => {
                    tracing::warn!(service = %service, error = %e, "reading the assignment failed");
                    continue;
                }
            };
            if next != last && tx.send(next).is_err() {
                break;
            }
        }
    });
    Ok(AssignmentWatch { rx, task })
}

/// The configuration of a [`Distributor`].
#[derive(Clone)]
pub struct DistributorConfig {
    services_namespaces: Vec<String>,
    workunits_namespace: String,
    distribution_namespace: String,
    poll_interval: Duration,
    ping_timeout: Duration,
    prefix: String,
    prober: Option<Arc<dyn Prober>>,
}

impl fmt::Debug for DistributorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributorConfig")
            .field("services_namespaces", &self.services_namespaces)
            .field("workunits_namespace", &self.workunits_namespace)
            .field("distribution_namespace", &self.distribution_namespace)
            .field("poll_interval", &self.poll_interval)
            .field("ping_timeout", &self.ping_timeout)
            .field("prefix", &self.prefix)
            .field("prober", &self.prober)
            .finish()
    }
}

impl DistributorConfig {
    /// A distributor reading services from `services_namespaces`, units from
    /// `workunits_namespace`, writing the table under `distribution_namespace`, polling every
    /// second with a one-second ping timeout.
    pub fn new(
        services_namespaces: impl IntoIterator<Item = impl Into<String>>,
        workunits_namespace: impl Into<String>,
        distribution_namespace: impl Into<String>,
    ) -> Self {
        DistributorConfig {
            services_namespaces: services_namespaces.into_iter().map(Into::into).collect(),
            workunits_namespace: workunits_namespace.into(),
            distribution_namespace: distribution_namespace.into(),
            poll_interval: Duration::from_secs(1),
            ping_timeout: Duration::from_secs(1),
            prefix: DEFAULT_PREFIX.to_owned(),
            prober: None,
        }
    }

    /// How often services are probed and the table recomputed.
    pub fn with_poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// How long a health check may take before the service counts as down.
    pub fn with_ping_timeout(mut self, timeout: Duration) -> Self {
        self.ping_timeout = timeout;
        self
    }

    /// The key prefix (default `hc`).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Replaces the [`DefaultProber`]. Its checks are still cut at the ping timeout.
    pub fn with_prober(mut self, prober: Arc<dyn Prober>) -> Self {
        self.prober = Some(prober);
        self
    }

    /// Checks every option, returning the key spaces.
    fn validate(&self) -> Result<(Vec<Keyspace>, Keyspace, Keyspace)> {
        if self.services_namespaces.is_empty() {
            return Err(Error::config("no services namespace given"));
        }
        let mut services = Vec::new();
        for ns in &self.services_namespaces {
            let ks = namespace(&self.prefix, "services namespace", ns)?;
            if !services.contains(&ks) {
                services.push(ks);
            }
        }
        let units = namespace(
            &self.prefix,
            "work units namespace",
            &self.workunits_namespace,
        )?;
        let distribution = namespace(
            &self.prefix,
            "distribution namespace",
            &self.distribution_namespace,
        )?;
        if services.contains(&distribution) {
            return Err(Error::config(format!(
                "the distribution namespace `{}` is also a services namespace: both keep records under `service:`, so the table would overwrite the registrations",
                self.distribution_namespace
            )));
        }
        if !(MIN_POLL_INTERVAL..=MAX_POLL_INTERVAL).contains(&self.poll_interval) {
            return Err(Error::config(format!(
                "poll interval {:?} is outside {MIN_POLL_INTERVAL:?}..={MAX_POLL_INTERVAL:?}",
                self.poll_interval
            )));
        }
        if !(MIN_PING_TIMEOUT..=MAX_PING_TIMEOUT).contains(&self.ping_timeout) {
            return Err(Error::config(format!(
                "ping timeout {:?} is outside {MIN_PING_TIMEOUT:?}..={MAX_PING_TIMEOUT:?}",
                self.ping_timeout
            )));
        }
        Ok((services, units, distribution))
    }
}

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

/// Computes the table for these healthy services and units; `down` are the registered services
/// that failed their check. Pure and deterministic; the version is left to the caller.
pub fn compute_table(
    healthy: &[String],
    down: &BTreeSet<String>,
    units: &[String],
    version: u64,
) -> Result<Table> {
    let matching = match_work_units(healthy, units)
        .map_err(|e| Error::invalid(format!("cannot match services to units: {e}")))?;
    let mut services: BTreeMap<String, Vec<String>> = healthy
        .iter()
        .zip(matching)
        .map(|(s, idx)| {
            (
                s.clone(),
                idx.into_iter().map(|i| units[i].clone()).collect(),
            )
        })
        .collect();
    for d in down {
        services.entry(d.clone()).or_default();
    }
    Ok(Table {
        version,
        services,
        down: down.clone(),
    })
}

/// Counts `(moved, added, removed)` units between two tables.
pub fn table_diff(old: Option<&Table>, new: &Table) -> (usize, usize, usize) {
    let new_owners = new.owners();
    let Some(old) = old else {
        return (0, new_owners.len(), 0);
    };
    let old_owners = old.owners();
    let mut moved = 0;
    let mut added = 0;
    for (unit, owner) in &new_owners {
        match old_owners.get(unit) {
            Some(prev) if prev != owner => moved += 1,
            Some(_) => {}
            None => added += 1,
        }
    }
    let removed = old_owners
        .keys()
        .filter(|u| !new_owners.contains_key(*u))
        .count();
    (moved, added, removed)
}

const CAS_ATTEMPTS: usize = 100;

fn contended(store: &DynStore, key: &str) -> Error {
    Error::Unavailable {
        backend: store.capabilities().backend,
        message: format!("{key}: lost {CAS_ATTEMPTS} compare-and-set races in a row"),
        source: None,
    }
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
    health: Mutex<BTreeMap<String, bool>>,
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
        let (services, units, distribution) = config.validate()?;
        let prober = config
            .prober
            .clone()
            .unwrap_or_else(|| Arc::new(DefaultProber::new(store.clone(), config.ping_timeout)));
        Ok(Distributor {
            store,
            services,
            units,
            distribution,
            poll_interval: config.poll_interval,
            ping_timeout: config.ping_timeout,
            prober,
            health: Mutex::new(BTreeMap::new()),
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
            let start = std::time::Instant::now();
            let health = match tokio::time::timeout(self.ping_timeout, self.prober.check(s)).await {
                Ok(h) => h,
                Err(_) => Health::Down(format!("no answer within {:?}", self.ping_timeout)),
            };
            ::metrics::histogram!(m::DISTRIBUTOR_PING_DURATION, "probe" => probe)
                .record(start.elapsed());
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
                .map(|t| Table::parse(&key, t))
                .transpose()?;
            let registered = self.registered().await?;
            let units = list_units(&self.store, &self.units).await?;
            let health = self.probe(&registered).await;
            self.log_health(&registered, &health);
            let mut healthy = Vec::new();
            let mut down = BTreeSet::new();
            for (s, h) in registered.iter().zip(&health) {
                if h.is_serving() {
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
                .filter_map(|(s, t)| Assignment::parse(s, t).ok())
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
                let (moved, added, removed) = table_diff(current.as_ref(), &next);
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
        Err(contended(&self.store, &key))
    }

    fn log_health(&self, services: &[Service], health: &[Health]) {
        let mut last = self.health.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen = BTreeMap::new();
        for (s, h) in services.iter().zip(health) {
            let up = h.is_serving();
            match (last.get(&s.name), h) {
                (Some(true), Health::Down(why)) | (None, Health::Down(why)) => {
                    tracing::warn!(service = %s.name, reason = %why, "service is down")
                }
                (Some(false), Health::Serving) => {
                    tracing::info!(service = %s.name, "service answers again")
                }
                (None, Health::Serving) => tracing::info!(service = %s.name, "service is up"),
                _ => {}
            }
            seen.insert(s.name.clone(), up);
        }
        for gone in last.keys().filter(|n| !seen.contains_key(*n)) {
            tracing::info!(service = %gone, "service deregistered");
        }
        *last = seen;
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
        table: &Table,
        previous: Option<&Table>,
        existing: BTreeMap<String, String>,
    ) -> Result<()> {
        let loses = |s: &str, units: &[String]| {
            existing
                .get(s)
                .and_then(|t| Assignment::parse(s, t).ok())
                .is_some_and(|a| a.units.iter().any(|u| !units.contains(u)))
        };
        let mut order: Vec<(&String, &Vec<String>)> = table.services.iter().collect();
        order.sort_by_key(|(s, units)| !loses(s, units));
        for (service, units) in order {
            let want = Assignment {
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
            let empty = Assignment {
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
        want: &Assignment,
        seen: Option<&String>,
        ttl: Option<Duration>,
    ) -> Result<()> {
        let key = assignment_key(&self.distribution, service);
        let text = want.encode()?;
        let mut current = seen.cloned();
        for _ in 0..CAS_ATTEMPTS {
            if let Some(cur) = &current {
                match Assignment::parse(&key, cur) {
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
        Err(contended(&self.store, &key))
    }

    /// Polls every poll interval until `stop` resolves. A failed poll is logged and retried at
    /// the next interval; the last table stays in the store meanwhile.
    pub async fn run(&self, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut tick = tokio::time::interval(self.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tick.tick() => {}
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
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            self.run(async {
                let _ = rx.await;
            })
            .await;
        });
        RunningDistributor {
            stop: Some(tx),
            task,
        }
    }
}

/// A distributor running in a task; see [`Distributor::spawn`].
#[derive(Debug)]
pub struct RunningDistributor {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl RunningDistributor {
    /// Stops after the current poll's store call and waits for the task.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for RunningDistributor {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

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
                let a = Assignment {
                    version,
                    units: units.clone(),
                };
                let t = Table {
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

    #[test]
    fn addresses_parse_or_say_why() {
        assert_eq!(
            Liveness::grpc("127.0.0.1:5000").unwrap(),
            Liveness::Grpc("http://127.0.0.1:5000".into())
        );
        assert!(Liveness::grpc("https://svc.local:443/")
            .unwrap_err()
            .to_string()
            .contains("TLS"));
        assert!(Liveness::grpc("[::1]:80").is_ok());
        for bad in [
            "",
            "nohost",
            "host:",
            "host:0",
            "host:99999",
            ":80",
            "ftp://h:1",
            "http://h:1/path",
            "http://u@h:1",
            "[::1:80",
        ] {
            assert!(Liveness::grpc(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            Liveness::from_record("heartbeat").unwrap(),
            Liveness::Heartbeat
        );
    }

    #[test]
    fn unit_names_with_commas_and_anything_round_trip() {
        let ks = Keyspace::new("units").unwrap();
        for name in [
            "a,b",
            "with space",
            "100%",
            "ü:{x}",
            "tab\there",
            "line\nbreak",
        ] {
            let key = unit_key(&ks, name);
            crate::store::check_key(&key).unwrap();
            let encoded = &key[ks.key("unit:").len()..];
            assert_eq!(percent_decode_str(encoded).decode_utf8().unwrap(), name);
        }
        let a = Assignment {
            version: 3,
            units: vec!["a,b".into(), "c\"d".into(), "ü".into()],
        };
        let text = a.encode().unwrap();
        assert_eq!(Assignment::parse("k", &text).unwrap(), a);
        assert!(matches!(
            Assignment::parse("k", "a,b"),
            Err(Error::ForeignValue { .. })
        ));
    }

    #[test]
    fn the_table_does_not_depend_on_order() {
        let services = names("svc-", 3);
        let units = names("unit-", 30);
        let t1 = compute_table(&services, &BTreeSet::new(), &units, 1).unwrap();
        let mut rs = services.clone();
        rs.reverse();
        let mut ru = units.clone();
        ru.rotate_left(7);
        let t2 = compute_table(&rs, &BTreeSet::new(), &ru, 1).unwrap();
        assert_eq!(t1, t2);
        assert!(t1.services.values().all(|u| u.len() == 10));
    }

    #[test]
    fn diff_counts_moves_additions_and_removals() {
        let services = names("s", 3);
        let units = names("u", 30);
        let t1 = compute_table(&services, &BTreeSet::new(), &units, 1).unwrap();
        let down: BTreeSet<String> = [services[0].clone()].into();
        let t2 = compute_table(&services[1..], &down, &units, 2).unwrap();
        let (moved, added, removed) = table_diff(Some(&t1), &t2);
        assert!(moved >= t1.units_of(&services[0]).len());
        assert_eq!((added, removed), (0, 0));
        assert!(t2.units_of(&services[0]).is_empty());
        let t3 = compute_table(&services, &BTreeSet::new(), &units[..29], 3).unwrap();
        assert_eq!(table_diff(Some(&t1), &t3).2, 1);
    }

    #[test]
    fn bad_configs_are_rejected() {
        let ok = || DistributorConfig::new(["svc"], "units", "dist");
        assert!(ok().validate().is_ok());
        let empty: [&str; 0] = [];
        assert!(DistributorConfig::new(empty, "u", "d").validate().is_err());
        assert!(DistributorConfig::new([""], "u", "d").validate().is_err());
        assert!(DistributorConfig::new(["s"], "a:b", "d")
            .validate()
            .is_err());
        assert!(ok().with_poll_interval(Duration::ZERO).validate().is_err());
        assert!(ok().with_ping_timeout(Duration::ZERO).validate().is_err());
        assert!(ok()
            .with_poll_interval(Duration::from_secs(365 * 86400))
            .validate()
            .is_err());
        // The table's per-service records would overwrite the registrations.
        assert!(DistributorConfig::new(["a", "d"], "u", "d")
            .validate()
            .is_err());
    }

    #[test]
    fn only_canonical_unit_keys_count() {
        let ks = Keyspace::new("units").unwrap();
        assert_eq!(unit_key(&ks, "a,b"), format!("{}a,b", ks.key("unit:")));
        assert_ne!(unit_key(&ks, "a,b"), format!("{}a%2Cb", ks.key("unit:")));
    }
}
