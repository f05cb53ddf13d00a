//! Small helpers of the commands: durations on the command line, timestamps in JSON, signals,
//! and the group options `run` and `exec` share.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use headcount::assign::AssignorKind;
use headcount::recipes::group::GroupConfig;
use headcount::Error;

/// The lease TTL of group mode when `--ttl` is not given: renewed every 2 s, a crashed member's
/// share moves after at most 6 s plus one heartbeat.
pub const DEFAULT_GROUP_TTL: Duration = headcount::recipes::DEFAULT_GROUP_TTL;

/// An assignor as a clap value: the names of core's [`AssignorKind`], listed in `--help` and
/// completed by the shell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssignorArg(pub AssignorKind);

/// Every assignor, the default (`jumpback`) first.
const ASSIGNORS: [AssignorArg; 7] = [
    AssignorArg(AssignorKind::JumpBackFailover),
    AssignorArg(AssignorKind::JumpFailover),
    AssignorArg(AssignorKind::JumpBackMemento),
    AssignorArg(AssignorKind::Memento),
    AssignorArg(AssignorKind::Rendezvous),
    AssignorArg(AssignorKind::Ring),
    AssignorArg(AssignorKind::Modulo),
];

impl clap::ValueEnum for AssignorArg {
    fn value_variants<'a>() -> &'a [Self] {
        &ASSIGNORS
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self.0 {
            AssignorKind::JumpBackFailover => "jump hash with failover, minimal movement (default)",
            AssignorKind::JumpFailover => "jump consistent hash with RavenDB's failover re-hash",
            AssignorKind::JumpBackMemento => "jumpback that stays minimal when any slot dies",
            AssignorKind::Memento => "MementoHash: minimal and balanced when any slot dies",
            AssignorKind::Rendezvous => "rendezvous (highest random weight) hashing",
            AssignorKind::Ring => "the distributor's consistent-hash ring, weight 50",
            AssignorKind::Modulo => "key modulo replicas, as in the articles (moves most keys)",
            _ => "",
        };
        Some(clap::builder::PossibleValue::new(self.0.name()).help(help))
    }
}

/// The group configuration of `run --mode group` and `exec`.
pub fn group_config(
    group: &str,
    ttl: Option<Duration>,
    member: Option<&str>,
    assignor: Option<AssignorArg>,
    partitions: Option<u32>,
) -> GroupConfig {
    let mut config = GroupConfig::new(group, ttl.unwrap_or(DEFAULT_GROUP_TTL));
    if let Some(member) = member {
        config = config.with_member(member);
    }
    if let Some(assignor) = assignor {
        config = config.with_assignor(assignor.0);
    }
    if let Some(count) = partitions {
        config = config.with_partitions(count);
    }
    config
}

/// The signals that stop a long-running command (`run`, `exec`, `status --watch`, `ids serve`,
/// the distributor), listened for from creation on: a signal that arrives before the first
/// `recv` is not lost (and does not kill the process with the default action).
///
/// SIGINT and SIGTERM, and SIGHUP and SIGQUIT too: a terminal that closes, a supervisor or GNU
/// `timeout` that forwards SIGHUP, or a Ctrl-\ must not kill a member on the spot (its command
/// SIGKILLed, its slot left for the others to wait out). SIGUSR1 and SIGUSR2, whose default
/// action is to terminate, are ignored from creation on (`exec` passes them on to its command,
/// see [`UserSignals`]).
#[derive(Debug)]
pub struct Shutdown {
    #[cfg(unix)]
    signals: [tokio::signal::unix::Signal; 4],
}

#[cfg(unix)]
const STOP_SIGNALS: [(i32, &str); 4] = [
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGINT, "SIGINT"),
    (libc::SIGHUP, "SIGHUP"),
    (libc::SIGQUIT, "SIGQUIT"),
];

/// Installs tokio's handler for `signal`: from then on the signal never takes its default
/// action in this process (tokio never removes its handler), whether or not it is received.
#[cfg(unix)]
fn listen(signal: i32, name: &str) -> Result<tokio::signal::unix::Signal, Error> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(signal))
        .map_err(|e| Error::config(format!("cannot listen for {name}: {e}")))
}

impl Shutdown {
    /// Installs the handlers (inside the runtime).
    pub fn new() -> Result<Shutdown, Error> {
        #[cfg(unix)]
        {
            // Handled by nobody unless `exec` listens: ignored.
            UserSignals::new()?;
            let [a, b, c, d] = STOP_SIGNALS;
            Ok(Shutdown {
                signals: [
                    listen(a.0, a.1)?,
                    listen(b.0, b.1)?,
                    listen(c.0, c.1)?,
                    listen(d.0, d.1)?,
                ],
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Shutdown {})
        }
    }

    /// Resolves at the next stop signal (see [`Shutdown`]).
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        {
            let [term, int, hup, quit] = &mut self.signals;
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
                _ = hup.recv() => "SIGHUP",
                _ = quit.recv() => "SIGQUIT",
            };
            tracing::info!(signal = name, "stopping");
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// SIGUSR1 and SIGUSR2, listened for: `exec` passes them on to its command's process group
/// (log rotation and the like are the command's business); every other command ignores them.
#[derive(Debug)]
pub struct UserSignals {
    #[cfg(unix)]
    usr1: tokio::signal::unix::Signal,
    #[cfg(unix)]
    usr2: tokio::signal::unix::Signal,
}

impl UserSignals {
    /// Installs the handlers (inside the runtime).
    pub fn new() -> Result<UserSignals, Error> {
        #[cfg(unix)]
        {
            Ok(UserSignals {
                usr1: listen(libc::SIGUSR1, "SIGUSR1")?,
                usr2: listen(libc::SIGUSR2, "SIGUSR2")?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(UserSignals {})
        }
    }

    /// The next SIGUSR1 or SIGUSR2 received, as its number.
    pub async fn recv(&mut self) -> i32 {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.usr1.recv() => libc::SIGUSR1,
                _ = self.usr2.recv() => libc::SIGUSR2,
            }
        }
        #[cfg(not(unix))]
        {
            std::future::pending().await
        }
    }
}

/// Parses a duration flag the way store URLs parse theirs: humantime (`500ms`, `5s`, `2m`,
/// `1h 30m`), with a unit required (`--ttl 1` is an error with a hint, not one second).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    headcount::backend::url::parse_humantime(text)
}

/// `url` made to refuse creating a store, for commands that only read: a SQLite file that does
/// not exist is an error instead of a fresh empty database (plus `-wal` and `-shm`) that reports
/// "no live members". Other backends never create anything by connecting.
pub fn read_only(url: &str) -> String {
    let is_sqlite = url
        .split_once(':')
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("sqlite"));
    if !is_sqlite || url.contains(":memory:") {
        return url.to_owned();
    }
    match url.split_once('?') {
        Some((_, query)) if query.split('&').any(|kv| kv.starts_with("mode=")) => url.to_owned(),
        Some(_) => format!("{url}&mode=rw"),
        None => format!("{url}?mode=rw"),
    }
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
        assert_eq!(parse_duration("1s 500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("3").is_err_and(|e| e.contains("unit")));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn every_assignor_is_a_value() {
        for kind in AssignorKind::ALL {
            assert!(ASSIGNORS.contains(&AssignorArg(kind)), "{kind}");
        }
        assert_eq!(ASSIGNORS.len(), AssignorKind::ALL.len());
    }

    #[test]
    fn read_only_urls() {
        assert_eq!(read_only("sqlite://a.db"), "sqlite://a.db?mode=rw");
        assert_eq!(
            read_only("sqlite://a.db?timeout=1s"),
            "sqlite://a.db?timeout=1s&mode=rw"
        );
        assert_eq!(
            read_only("sqlite://a.db?mode=rwc"),
            "sqlite://a.db?mode=rwc"
        );
        assert_eq!(read_only("sqlite::memory:"), "sqlite::memory:");
        assert_eq!(read_only("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }
}
