//! Small helpers of the commands: durations on the command line, timestamps in JSON, signals,
//! and the group options `run` and `exec` share.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use headcount::assign::AssignorKind;
use headcount::recipes::group::GroupConfig;
use headcount::Error;

/// The lease TTL of group mode when `--ttl` is not given: renewed every 2 s, a crashed member's
/// share moves after at most 6 s plus one heartbeat.
pub const DEFAULT_GROUP_TTL: Duration = Duration::from_secs(6);

/// Parses an assignor name for clap: jump, rendezvous, memento, ring or modulo.
pub fn parse_assignor(text: &str) -> Result<AssignorKind, String> {
    text.parse::<AssignorKind>().map_err(|_| {
        let names: Vec<&str> = AssignorKind::ALL.iter().map(|k| k.name()).collect();
        format!("`{text}` is not an assignor (use {})", names.join(", "))
    })
}

/// The group configuration of `run --mode group` and `exec`.
pub fn group_config(
    group: &str,
    ttl: Option<Duration>,
    member: Option<&str>,
    assignor: Option<AssignorKind>,
) -> GroupConfig {
    let mut config = GroupConfig::new(group, ttl.unwrap_or(DEFAULT_GROUP_TTL));
    if let Some(member) = member {
        config = config.with_member(member);
    }
    if let Some(assignor) = assignor {
        config = config.with_assignor(assignor);
    }
    config
}

/// SIGINT and SIGTERM, listened for from creation on: a signal that arrives before the first
/// `recv` is not lost (and does not kill the process with the default action).
#[derive(Debug)]
pub struct Shutdown {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Shutdown {
    /// Installs the handlers (inside the runtime).
    pub fn new() -> Result<Shutdown, Error> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind: SignalKind, name: &str| {
                signal(kind).map_err(|e| Error::config(format!("cannot listen for {name}: {e}")))
            };
            Ok(Shutdown {
                term: listen(SignalKind::terminate(), "SIGTERM")?,
                int: listen(SignalKind::interrupt(), "SIGINT")?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Shutdown {})
        }
    }

    /// Resolves at the next SIGINT or SIGTERM.
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => {}
                _ = self.int.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Parses `500ms`, `5s`, `1.5s`, `2m`, `1h` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (try 500ms, 5s, 2m)"))?;
    let scale = match unit {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "`{text}` has an unknown unit `{unit}` (use ms, s, m or h)"
            ))
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("`{text}` is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `t` as RFC 3339 UTC with milliseconds: `2026-11-21T13:05:07.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(i64::try_from(days).unwrap_or(0));
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Howard Hinnant's days-to-civil conversion.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (
        y,
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }
}
