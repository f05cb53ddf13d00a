//! The service side of the registry: [`register`], [`deregister`], the heartbeat ([`beat`], [`spawn_heartbeat`]) and [`list_services`].

use std::sync::Arc;
use std::time::Duration;

use super::liveness::parse_grpc_address;
use super::{contended, heartbeat_key, service_key, Liveness, CAS_ATTEMPTS, HEARTBEAT_ADDRESS};
use crate::clock::{Clock, Pace, SystemClock};
use crate::error::{Error, Result};
use crate::keys::Keyspace;
use crate::task::{Background, OnDrop};
use crate::DynStore;

/// The longest service name accepted, in bytes.
pub const MAX_SERVICE_NAME_LEN: usize = 256;

/// The value a heartbeat key holds.
const HEARTBEAT_VALUE: &str = "alive";

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
    Err(contended(&key))
}

/// Removes `name` from the services namespace. The next poll of a distributor drops it from the
/// table and leaves it an empty record for [`DEPARTED_RECORD_TTL`](super::DEPARTED_RECORD_TTL).
/// Returns whether it was registered.
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
    Err(contended(&key))
}

/// A task renewing a heartbeat every `ttl / 3` until stopped or dropped.
#[derive(Debug)]
pub struct HeartbeatHandle {
    task: Background,
}

impl HeartbeatHandle {
    /// Stops renewing at once (as dropping the handle does); the key expires within its TTL.
    pub fn stop(self) {
        drop(self.task);
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
    spawn_heartbeat_with_clock(store, services, name, ttl, Arc::new(SystemClock::new())).await
}

/// [`spawn_heartbeat`], pacing the renewals on `clock` (tests drive a
/// [`ManualClock`](crate::ManualClock)).
pub async fn spawn_heartbeat_with_clock(
    store: DynStore,
    services: Keyspace,
    name: String,
    ttl: Duration,
    clock: Arc<dyn Clock>,
) -> Result<HeartbeatHandle> {
    beat(&store, &services, &name, ttl).await?;
    let period = (ttl / 3).max(Duration::from_millis(1));
    let what = format!("the heartbeat of service {name}");
    let task = Background::spawn(what, OnDrop::Abort, |_| async move {
        // The first beat was above.
        let mut pace = Pace::after_now(clock.as_ref(), period);
        loop {
            pace.tick(clock.as_ref()).await;
            if let Err(e) = beat(&store, &services, &name, ttl).await {
                tracing::warn!(service = %name, error = %e, "heartbeat failed");
            }
        }
    });
    Ok(HeartbeatHandle { task })
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
