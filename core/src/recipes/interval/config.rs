//! How a peer joins: [`IntervalConfig`], its limits, and the member id rule.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::keys::{Keyspace, DEFAULT_PREFIX};

/// The shortest interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

/// The longest interval accepted (one day); longer ones are almost certainly a unit mistake.
pub const MAX_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// The largest capacity a peer may declare.
pub const MAX_CAPACITY: u32 = 1000;

/// The longest member id accepted, in characters.
pub const MAX_MEMBER_LEN: usize = 64;

/// How a peer joins: the group, the interval, and the knobs tests and operators turn.
#[derive(Clone)]
#[non_exhaustive]
pub struct IntervalConfig {
    /// The group name (validated as a [`Keyspace`] group).
    pub group: String,
    /// The key prefix, `hc` by default.
    pub prefix: String,
    /// The interval: between [`MIN_INTERVAL`] and [`MAX_INTERVAL`].
    pub interval: Duration,
    /// The peer's constant skew after each interval start; `None` draws it once, uniformly in
    /// `[0, 7 * interval / 16)`: the article's extension draws below half the interval, and the
    /// last sixteenth is left so that a tick waking a little late still falls in the interval's
    /// first half, where it may draw (see the module docs). A fixed one must be below half the
    /// interval.
    pub skew: Option<Duration>,
    /// The declared capacity (1 to [`MAX_CAPACITY`]): how many slots the peer draws.
    pub capacity: u32,
    /// The member id in health records; random when `None`. 1 to [`MAX_MEMBER_LEN`] characters
    /// of `A-Z a-z 0-9 _ - .`.
    pub member: Option<String>,
    /// The clock; [`SystemClock`] by default.
    pub clock: Arc<dyn Clock>,
    /// Whether pair changes go through the safe transition (the default). Without it a peer
    /// adopts every new pair at once, as in the articles, and tasks are duplicated or missed
    /// while peers disagree; kept for measurements and demonstrations.
    pub transition: bool,
    /// Whether the peer writes its health record every tick (the default): one more write per
    /// tick besides the algorithm's single round trip.
    pub heartbeat: bool,
}

impl fmt::Debug for IntervalConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IntervalConfig")
            .field("group", &self.group)
            .field("prefix", &self.prefix)
            .field("interval", &self.interval)
            .field("skew", &self.skew)
            .field("capacity", &self.capacity)
            .field("member", &self.member)
            .field("transition", &self.transition)
            .field("heartbeat", &self.heartbeat)
            .finish_non_exhaustive()
    }
}

impl IntervalConfig {
    /// A configuration for `group` with `interval`, a random skew, capacity 1, a random member
    /// id, the system clock, the transition and the heartbeat.
    pub fn new(group: impl Into<String>, interval: Duration) -> Self {
        IntervalConfig {
            group: group.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            interval,
            skew: None,
            capacity: 1,
            member: None,
            clock: Arc::new(SystemClock::new()),
            transition: true,
            heartbeat: true,
        }
    }

    /// Sets the key prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Fixes the skew instead of drawing it.
    pub fn with_skew(mut self, skew: Duration) -> Self {
        self.skew = Some(skew);
        self
    }

    /// Sets the declared capacity.
    pub fn with_capacity(mut self, capacity: u32) -> Self {
        self.capacity = capacity;
        self
    }

    /// Sets the member id.
    pub fn with_member(mut self, member: impl Into<String>) -> Self {
        self.member = Some(member.into());
        self
    }

    /// Sets the clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Turns the safe transition on or off.
    pub fn with_transition(mut self, on: bool) -> Self {
        self.transition = on;
        self
    }

    /// Turns the health heartbeat on or off.
    pub fn with_heartbeat(mut self, on: bool) -> Self {
        self.heartbeat = on;
        self
    }

    /// Checks the configuration as [`IntervalIndexer::join`](super::IntervalIndexer::join)
    /// will, without a store: the group name and prefix, the interval, the skew, the capacity
    /// and the member id. A command line checks it before connecting, so a typo is a usage
    /// error even when the store is down.
    pub fn validate(&self) -> Result<()> {
        self.check().map(|_| ())
    }

    pub(super) fn check(&self) -> Result<Keyspace> {
        let keys = Keyspace::with_prefix(&self.prefix, &self.group)?;
        if self.interval < MIN_INTERVAL {
            return Err(Error::invalid(format!(
                "interval of {:?} is shorter than the minimum of {MIN_INTERVAL:?}",
                self.interval
            )));
        }
        if self.interval > MAX_INTERVAL {
            return Err(Error::invalid(format!(
                "interval of {:?} is longer than the limit of {MAX_INTERVAL:?}",
                self.interval
            )));
        }
        if let Some(skew) = self.skew {
            if skew >= self.interval / 2 {
                return Err(Error::invalid(format!(
                    "skew of {skew:?} is not below half the interval ({:?})",
                    self.interval / 2
                )));
            }
        }
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return Err(Error::invalid(format!(
                "capacity {} is outside 1..={MAX_CAPACITY}",
                self.capacity
            )));
        }
        if let Some(member) = &self.member {
            check_member(member)?;
        }
        Ok(keys)
    }
}

pub(crate) fn check_member(member: &str) -> Result<()> {
    let len = member.chars().count();
    if len == 0 || len > MAX_MEMBER_LEN {
        return Err(Error::invalid(format!(
            "member id is {len} characters long; it must have 1 to {MAX_MEMBER_LEN}"
        )));
    }
    if let Some(c) = member
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(Error::invalid(format!(
            "member id {:?} contains {c:?}; only ASCII letters, digits, '_', '-' and '.' are allowed",
            member.escape_debug().to_string()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::IntervalConfig;
    use crate::error::Error;

    #[test]
    fn bad_configs_are_rejected() {
        let ok = IntervalConfig::new("g", Duration::from_secs(5));
        assert!(ok.check().is_ok());
        for bad in [
            IntervalConfig::new("g", Duration::ZERO),
            IntervalConfig::new("g", Duration::from_micros(999)),
            IntervalConfig::new("g", Duration::from_secs(86_401)),
            IntervalConfig::new("a:b", Duration::from_secs(5)),
            IntervalConfig::new("g", Duration::from_secs(5)).with_capacity(0),
            IntervalConfig::new("g", Duration::from_secs(5)).with_skew(Duration::from_millis(2500)),
            IntervalConfig::new("g", Duration::from_secs(5)).with_member("a b"),
        ] {
            assert!(
                matches!(bad.check(), Err(Error::InvalidArgument { .. })),
                "{bad:?}"
            );
        }
    }
}
