//! The configuration of a [`Distributor`](super::Distributor): [`DistributorConfig`] and its
//! limits.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{namespace, Prober};
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::keys::{Keyspace, DEFAULT_PREFIX};

/// The shortest poll interval accepted.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// The longest poll interval accepted (one day).
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// Failed pings in a row before a service that holds units counts as down, by default.
pub const DEFAULT_DOWN_AFTER: u32 = 2;

/// The most failed pings in a row [`DistributorConfig::with_down_after`] accepts.
pub const MAX_DOWN_AFTER: u32 = 100;

/// The shortest ping timeout accepted.
pub const MIN_PING_TIMEOUT: Duration = Duration::from_millis(1);

/// The longest ping timeout accepted (one hour).
pub const MAX_PING_TIMEOUT: Duration = Duration::from_secs(3600);

/// The configuration of a [`Distributor`](super::Distributor).
#[derive(Clone)]
pub struct DistributorConfig {
    services_namespaces: Vec<String>,
    workunits_namespace: String,
    distribution_namespace: String,
    pub(super) poll_interval: Duration,
    pub(super) ping_timeout: Duration,
    pub(super) down_after: u32,
    prefix: String,
    pub(super) prober: Option<Arc<dyn Prober>>,
    pub(super) clock: Arc<dyn Clock>,
}

impl fmt::Debug for DistributorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributorConfig")
            .field("services_namespaces", &self.services_namespaces)
            .field("workunits_namespace", &self.workunits_namespace)
            .field("distribution_namespace", &self.distribution_namespace)
            .field("poll_interval", &self.poll_interval)
            .field("ping_timeout", &self.ping_timeout)
            .field("down_after", &self.down_after)
            .field("prefix", &self.prefix)
            .field("prober", &self.prober)
            .field("clock", &self.clock)
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
            down_after: DEFAULT_DOWN_AFTER,
            prefix: DEFAULT_PREFIX.to_owned(),
            prober: None,
            clock: Arc::new(SystemClock::new()),
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

    /// How many pings in a row a service that holds units must fail before it counts as down
    /// and its units move (default [`DEFAULT_DOWN_AFTER`], 1 to [`MAX_DOWN_AFTER`]). `1` is the
    /// article's distributor: one failed ping moves all of a service's units. A service that
    /// holds none (new, or already down) counts as down at its first failed ping either way.
    pub fn with_down_after(mut self, pings: u32) -> Self {
        self.down_after = pings;
        self
    }

    /// The key prefix (default `hc`).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Replaces the [`DefaultProber`](super::DefaultProber). Its checks are still cut at the ping timeout.
    pub fn with_prober(mut self, prober: Arc<dyn Prober>) -> Self {
        self.prober = Some(prober);
        self
    }

    /// The clock that paces the polls and times the health checks instead of the system's
    /// (tests drive a [`ManualClock`](crate::ManualClock)).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Checks every option, returning the key spaces.
    pub(super) fn validate(&self) -> Result<Namespaces> {
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
        if !(1..=MAX_DOWN_AFTER).contains(&self.down_after) {
            return Err(Error::config(format!(
                "down after {} failed pings is outside 1..={MAX_DOWN_AFTER}",
                self.down_after
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
        Ok(Namespaces {
            services,
            units,
            distribution,
        })
    }
}

/// The key spaces of a [`DistributorConfig`], checked.
#[derive(Debug, Clone)]
pub(super) struct Namespaces {
    /// Where services register: each namespace once, in the order given.
    pub(super) services: Vec<Keyspace>,
    /// Where the work units are.
    pub(super) units: Keyspace,
    /// Where the table and the per-service records are written.
    pub(super) distribution: Keyspace,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use super::DistributorConfig;

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
}
