//! Parsing `sqlite:` URLs into a [`SqliteConfig`]: where the database lives and the store's
//! [`SqliteOptions`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use headcount_core::backend::url::{
    check_deadline, decode, parse_deadline, parse_duration, parse_query, reject_duplicates,
    reject_fragment, unknown_option, DEFAULT_TIMEOUT, MAX_TIMEOUT,
};
use headcount_core::backend::Deadline;
use headcount_core::{Error, Result};

use super::errors::BACKEND;

/// How this crate's URL is named in error messages.
const URL_KIND: &str = "SQLite URL";

/// SQLite's `synchronous` setting: how hard a commit waits for the disk.
///
/// The database always runs in WAL mode, where `Normal` (the default) never corrupts the file but
/// may lose the last commits on power loss or an OS crash (not on a process crash); `Full` syncs
/// every commit, which is what the majority-IDs recipe requires of a durable store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// No syncs at all: fastest, and a power loss may corrupt the database.
    Off,
    /// Sync at WAL checkpoints only (the default).
    #[default]
    Normal,
    /// Sync the WAL on every commit: durable.
    Full,
    /// Like `Full`, and also sync the directory after deleting journal files.
    Extra,
}

impl Synchronous {
    /// The value for `PRAGMA synchronous`.
    pub fn as_str(self) -> &'static str {
        match self {
            Synchronous::Off => "OFF",
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
            Synchronous::Extra => "EXTRA",
        }
    }

    /// Whether every commit reaches the disk before it is acknowledged.
    pub fn is_durable(self) -> bool {
        matches!(self, Synchronous::Full | Synchronous::Extra)
    }
}

impl FromStr for Synchronous {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "off" => Ok(Synchronous::Off),
            "normal" => Ok(Synchronous::Normal),
            "full" => Ok(Synchronous::Full),
            "extra" => Ok(Synchronous::Extra),
            _ => Err(Error::config(format!(
                "invalid value for option `synchronous`: `{s}` (expected off, normal, full or extra)"
            ))),
        }
    }
}

/// Options of a [`SqliteStore`](super::SqliteStore), also settable as URL query options.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteOptions {
    /// Deadline of every operation, including waiting for other connections' locks (`timeout`,
    /// default 5 s).
    pub timeout: Duration,
    /// How long SQLite itself retries when another connection holds the lock (`busy_timeout`);
    /// `None` means the same as `timeout`.
    pub busy_timeout: Option<Duration>,
    /// Durability of commits (`synchronous`, default `normal`).
    pub synchronous: Synchronous,
    /// Whether a missing database file is created (`mode=rwc`, the default) or is an error
    /// (`mode=rw`, for tools that only read and must not leave an empty database behind).
    pub create: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            timeout: DEFAULT_TIMEOUT,
            busy_timeout: None,
            synchronous: Synchronous::Normal,
            create: true,
        }
    }
}

impl SqliteOptions {
    /// The busy timeout actually applied.
    pub fn effective_busy_timeout(&self) -> Duration {
        self.busy_timeout.unwrap_or(self.timeout)
    }

    fn check(&self) -> Result<()> {
        check_deadline("timeout", self.timeout)?;
        if self.effective_busy_timeout() > MAX_TIMEOUT {
            return Err(Error::config(format!(
                "option `busy_timeout` is longer than the limit of {MAX_TIMEOUT:?}"
            )));
        }
        Ok(())
    }
}

/// Where the database lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    Memory,
    File(PathBuf),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Memory => f.write_str(":memory:"),
            Location::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A parsed SQLite store configuration: the database file (or memory) and the options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    location: Location,
    options: SqliteOptions,
}

impl SqliteConfig {
    /// Parses `sqlite://relative/path.db`, `sqlite:///absolute/path.db`, `sqlite:path.db`,
    /// `sqlite::memory:` or `sqlite://:memory:`, with the query options `timeout`,
    /// `busy_timeout`, `synchronous` and `mode` (see the crate README).
    pub fn from_url(url: &str) -> Result<Self> {
        let (location, options) = parse_url(url)?;
        Ok(SqliteConfig { location, options })
    }

    /// The database file at `path` (`":memory:"` for a private in-memory database) with
    /// `options`.
    pub fn new(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = path.as_ref();
        let location = if path == Path::new(":memory:") {
            Location::Memory
        } else {
            Location::File(path.to_path_buf())
        };
        options.check()?;
        Ok(SqliteConfig { location, options })
    }

    /// The database file, or `None` for an in-memory database.
    pub fn path(&self) -> Option<&Path> {
        match &self.location {
            Location::Memory => None,
            Location::File(p) => Some(p),
        }
    }

    /// The options this store was opened with.
    pub fn options(&self) -> &SqliteOptions {
        &self.options
    }

    /// The deadline of every operation (`timeout`).
    pub fn timeout(&self) -> Duration {
        self.options.timeout
    }

    /// The deadline of every operation, as the errors it turns into name it.
    pub(crate) fn deadline(&self) -> Deadline {
        Deadline::new(BACKEND, self.options.timeout)
    }

    /// Where the database lives.
    pub(crate) fn location(&self) -> &Location {
        &self.location
    }
}

/// Parses `sqlite://relative/path.db`, `sqlite:///absolute/path.db`, `sqlite:path.db`,
/// `sqlite::memory:` and `sqlite://:memory:`, each with optional query options.
fn parse_url(url: &str) -> Result<(Location, SqliteOptions)> {
    let rest = match url.split_once(':') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("sqlite") => rest,
        _ => {
            return Err(Error::config(
                "not a SQLite URL: expected sqlite://path/to/file.db or sqlite::memory:",
            ))
        }
    };
    // A raw `#` starts a fragment here as in every store URL: a `#` in a file name is `%23`.
    reject_fragment(rest, URL_KIND)?;
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let path = location.strip_prefix("//").unwrap_or(location);
    let location = if path == ":memory:" {
        Location::Memory
    } else if path.starts_with(":memory") {
        // `sqlite::memory:x` would otherwise be a file named `:memory:x`.
        return Err(Error::config(
            "SQLite URL names `:memory…` but is not `sqlite::memory:`: an in-memory database is exactly `sqlite::memory:` (options after `?`)",
        ));
    } else {
        let path = decode(path, "path")?;
        if path.is_empty() {
            return Err(Error::config(
                "SQLite URL has no file path: expected sqlite://relative/path.db, sqlite:///absolute/path.db or sqlite::memory:",
            ));
        }
        if path.contains('\0') {
            return Err(Error::config("SQLite path contains a NUL character"));
        }
        Location::File(PathBuf::from(path))
    };

    let pairs = parse_query(query)?;
    reject_duplicates(&pairs)?;
    let mut options = SqliteOptions::default();
    for (key, value) in &pairs {
        match key.as_str() {
            "timeout" => options.timeout = parse_deadline(key, value)?,
            // Zero is meaningful here: fail at once instead of waiting for a lock.
            "busy_timeout" => options.busy_timeout = Some(parse_duration(key, value)?),
            "synchronous" => options.synchronous = value.parse()?,
            "mode" => {
                options.create = match value.as_str() {
                    "rwc" => true,
                    "rw" => false,
                    _ => {
                        return Err(Error::config(format!(
                            "invalid value for option `mode`: `{value}` (expected rwc, the default, or rw: do not create the file)"
                        )))
                    }
                }
            }
            _ => {
                return Err(unknown_option(
                    URL_KIND,
                    key,
                    &["timeout", "busy_timeout", "synchronous", "mode"],
                ))
            }
        }
    }
    options.check()?;
    Ok((location, options))
}
