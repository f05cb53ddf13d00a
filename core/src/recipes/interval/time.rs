//! Wall time and interval numbers.

use std::time::{Duration, UNIX_EPOCH};

use crate::clock::Clock;

/// Wall-clock time since the Unix epoch (zero before it).
pub(super) fn wall(clock: &dyn Clock) -> Duration {
    clock
        .now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// The interval number of wall time `t`: `⌈t / I⌉`, a boundary belonging to the interval it
/// starts.
pub fn interval_number(t: Duration, interval: Duration) -> u64 {
    let i = interval.as_nanos().max(1);
    u64::try_from(t.as_nanos() / i + 1).unwrap_or(u64::MAX)
}

/// The wall time at which interval `n` starts: `(n - 1) * I`.
pub(super) fn interval_start(n: u64, interval: Duration) -> Duration {
    let nanos = u128::from(n.saturating_sub(1)) * interval.as_nanos();
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{interval_number, interval_start};

    #[test]
    fn interval_numbers_follow_the_article() {
        let i = Duration::from_secs(30);
        assert_eq!(interval_number(Duration::from_secs(1), i), 1);
        assert_eq!(interval_number(Duration::from_secs(29), i), 1);
        // A boundary opens the next interval.
        assert_eq!(interval_number(Duration::from_secs(30), i), 2);
        assert_eq!(interval_number(Duration::from_secs(61), i), 3);
        assert_eq!(interval_start(3, i), Duration::from_secs(60));
    }
}
