//! The configuration of a generator: [`IdsConfig`], its defaults, and the [`DurabilityPolicy`].

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::keys::{validate_group, DEFAULT_PREFIX};

/// Default for [`IdsConfig::with_deadline`].
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// Default first backoff bound of [`IdsConfig::with_backoff`].
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(1);

/// Default largest backoff of [`IdsConfig::with_backoff`].
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// What to do with a store that is not known to be durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DurabilityPolicy {
    /// Refuse it: [`MajorityIds::new`](super::MajorityIds::new) fails, a store probed later is
    /// excluded. The default.
    #[default]
    Require,
    /// Use it and log a warning: a crash of such a store can make a later ID repeat an earlier
    /// one.
    AllowNonDurable,
}

/// The configuration of a [`MajorityIds`](super::MajorityIds) generator.
#[derive(Debug, Clone)]
pub struct IdsConfig {
    pub(super) name: String,
    pub(super) prefix: String,
    pub(super) deadline: Duration,
    pub(super) backoff_base: Duration,
    pub(super) backoff_max: Duration,
    pub(super) durability: DurabilityPolicy,
    pub(super) clock: Arc<dyn Clock>,
}

impl IdsConfig {
    /// The generator `name` (the alphabet of a group name: `A-Z a-z 0-9 _ - .`), with the
    /// defaults: prefix `hc`, deadline 5 s, backoff from 1 ms up to 100 ms, durability required.
    pub fn new(name: impl Into<String>) -> Self {
        IdsConfig {
            name: name.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            deadline: DEFAULT_DEADLINE,
            backoff_base: DEFAULT_BACKOFF_BASE,
            backoff_max: DEFAULT_BACKOFF_MAX,
            durability: DurabilityPolicy::Require,
            clock: Arc::new(SystemClock::new()),
        }
    }

    /// The clock that times deadlines and backoff pauses instead of the system's (tests drive a
    /// [`ManualClock`](crate::ManualClock)).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The key prefix instead of `hc`.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long [`MajorityIds::next`](super::MajorityIds::next) (and the durability probe of
    /// [`MajorityIds::new`](super::MajorityIds::new)) may take before it gives up.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The randomized exponential backoff between attempts: attempt `k` (from 0) sleeps a
    /// uniform random time below `min(max, base * 2^k)`.
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// What to do with stores that are not durable.
    pub fn with_durability(mut self, policy: DurabilityPolicy) -> Self {
        self.durability = policy;
        self
    }

    /// The generator name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The deadline of one call.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    pub(super) fn check(&self) -> Result<()> {
        validate_group(&self.name).map_err(|e| match e {
            Error::InvalidArgument { message } => {
                Error::invalid(message.replacen("group name", "ID generator name", 1))
            }
            other => other,
        })?;
        if self.deadline.is_zero() {
            return Err(Error::invalid("the deadline of majority IDs is zero"));
        }
        if self.backoff_base.is_zero() || self.backoff_max < self.backoff_base {
            return Err(Error::invalid(format!(
                "backoff base {:?} must be positive and at most the maximum {:?}",
                self.backoff_base, self.backoff_max
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::IdsConfig;
    use crate::error::Error;

    #[test]
    fn configs_are_checked() {
        assert!(IdsConfig::new("orders").check().is_ok());
        for bad in [
            IdsConfig::new("a:b"),
            IdsConfig::new(""),
            IdsConfig::new("x").with_deadline(Duration::ZERO),
            IdsConfig::new("x").with_backoff(Duration::ZERO, Duration::from_millis(1)),
            IdsConfig::new("x").with_backoff(Duration::from_millis(2), Duration::from_millis(1)),
        ] {
            assert!(
                matches!(bad.check(), Err(Error::InvalidArgument { .. })),
                "{bad:?}"
            );
        }
        let named = IdsConfig::new("a b").check().unwrap_err().to_string();
        assert!(named.contains("ID generator name"), "{named}");
    }
}
