//! Parsing `postgres://` URLs into a [`PostgresConfig`].
//!
//! The URL is split the way libpq splits it (credentials, comma-separated hosts with ports,
//! database, query options); our own options are taken out and the rest is handed to
//! `tokio_postgres::Config`. No error message here contains the password, nor any raw piece of
//! the URL's authority that could be part of a mistyped one.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use headcount_core::{Error, Result};

use headcount_core::backend::url::{
    decode, invalid_url, parse_deadline, parse_port, Redacted, StoreUrl, DEFAULT_TIMEOUT,
};
use headcount_core::backend::Deadline;

use super::errors::BACKEND;

/// The default table name.
pub const DEFAULT_TABLE: &str = "headcount_kv";

/// The port used when a URL names none.
pub const DEFAULT_PORT: u16 = 5432;

/// The default number of pooled connections per store for calls (garbage collection keeps one
/// more).
pub const DEFAULT_POOL_SIZE: usize = 16;

const MAX_POOL_SIZE: usize = 1000;

/// Longest table name accepted: PostgreSQL truncates identifiers at 63 bytes, and the index name
/// derived from the table name must fit too.
const MAX_TABLE_LEN: usize = 48;

/// Options that tokio-postgres understands and we pass through untouched.
const PASSTHROUGH: &[&str] = &[
    "application_name",
    "options",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
    "hostaddr",
    "sslnegotiation",
];

/// Whether and how to use TLS, with libpq's meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// TLS when the server offers it (certificate not verified), else plain TCP. libpq's default,
    /// and ours.
    #[default]
    Prefer,
    /// TLS or fail; the certificate is not verified, so this stops eavesdroppers but not an
    /// active man in the middle. With `sslrootcert`, it verifies like `VerifyCa` (as libpq does).
    Require,
    /// TLS with a certificate chain that leads to a trusted root (`sslrootcert`, else the bundled
    /// Mozilla roots); the host name is not checked.
    VerifyCa,
    /// Like `VerifyCa`, and the certificate must name the host we connect to.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self> {
        match value {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            // libpq's `allow` (plain first, TLS if refused) only matters for servers that demand
            // TLS, where `prefer` does the same job.
            _ => Err(Error::config(format!(
                "invalid value for option `sslmode`: `{value}` (expected disable, prefer, require, verify-ca or verify-full)"
            ))),
        }
    }

    /// The name used in URLs.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// How the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verification {
    /// Encrypt only.
    None,
    /// The chain must lead to a trusted root.
    Chain,
    /// The chain, and the certificate must name the host.
    Full,
}

/// Where trusted roots come from for verifying modes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Roots {
    /// The Mozilla roots bundled by `webpki-roots` (also `sslrootcert=system`).
    Bundled,
    /// A PEM file.
    File(PathBuf),
}

/// A parsed PostgreSQL store configuration. Its `Debug` never shows the password.
#[derive(Clone)]
pub struct PostgresConfig {
    pub(crate) pg: tokio_postgres::Config,
    timeout: Duration,
    pool_size: usize,
    table: String,
    ssl_mode: SslMode,
    ssl_root_cert: Option<PathBuf>,
    /// `pool_mode=session`: a pooler in front runs in session mode, where `LISTEN` holds.
    session_pooler: bool,
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<String> = self
            .pg
            .get_hosts()
            .iter()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        f.debug_struct("PostgresConfig")
            .field("user", &self.pg.get_user())
            .field("password", &self.pg.get_password().map(|_| Redacted))
            .field("hosts", &hosts)
            .field("ports", &self.pg.get_ports())
            .field("dbname", &self.pg.get_dbname())
            .field("table", &self.table)
            .field("timeout", &self.timeout)
            .field("pool_size", &self.pool_size)
            .field("sslmode", &self.ssl_mode)
            .field("sslrootcert", &self.ssl_root_cert)
            .field("session_pooler", &self.session_pooler)
            .field("application_name", &self.pg.get_application_name())
            .finish()
    }
}

impl PostgresConfig {
    /// Parses `postgres://user:password@host:port/database?option=value&...` (or
    /// `postgresql://`). See the crate README for the options.
    pub fn from_url(url: &str) -> Result<Self> {
        parse(url)
    }

    /// Whether the URL says a pooler in front of the server runs in session mode
    /// (`pool_mode=session`): each client connection keeps one server connection, so `LISTEN`
    /// holds there and change notifications stay on.
    pub fn session_pooler(&self) -> bool {
        self.session_pooler
    }

    /// The deadline of every operation (`timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The deadline of every operation, as the errors it turns into name it.
    pub(crate) fn deadline(&self) -> Deadline {
        Deadline::new(BACKEND, self.timeout)
    }

    /// The most connections the store keeps open for calls (`pool_size`); garbage collection
    /// keeps one more of its own.
    pub fn pool_size(&self) -> usize {
        self.pool_size
    }

    /// The table that holds the keys (`table`).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The TLS mode (`sslmode`).
    pub fn ssl_mode(&self) -> SslMode {
        self.ssl_mode
    }

    /// The database user.
    pub fn username(&self) -> Option<&str> {
        self.pg.get_user()
    }

    /// The database name (defaults to the user name on the server side).
    pub fn dbname(&self) -> Option<&str> {
        self.pg.get_dbname()
    }

    /// The password, for scrubbing it from messages; never shown.
    pub(crate) fn password(&self) -> Option<String> {
        self.pg
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
    }

    /// How the server certificate is checked once TLS is up.
    pub(crate) fn verification(&self) -> Verification {
        match self.ssl_mode {
            SslMode::VerifyFull => Verification::Full,
            SslMode::VerifyCa => Verification::Chain,
            SslMode::Require if self.ssl_root_cert.is_some() => Verification::Chain,
            _ => Verification::None,
        }
    }

    /// The trusted roots for verifying modes.
    pub(crate) fn roots(&self) -> Roots {
        match &self.ssl_root_cert {
            Some(path) if path.as_os_str() != "system" => Roots::File(path.clone()),
            _ => Roots::Bundled,
        }
    }
}

/// How this crate's URL is named in error messages.
const URL_KIND: &str = "PostgreSQL URL";

/// A bad-URL error. Never given raw authority text.
fn bad(message: impl fmt::Display) -> Error {
    invalid_url(URL_KIND, message)
}

fn parse(url: &str) -> Result<PostgresConfig> {
    let url = StoreUrl::parse(
        url,
        URL_KIND,
        &["postgres", "postgresql"],
        "postgres://user:password@host:port/database or postgresql://...",
    )?;
    let mut user = url.username;
    let mut password = url.password.map(|p| p.expose().to_owned());
    let mut hosts = Vec::new();
    let mut ports = Vec::new();
    for (host, port) in url.hosts {
        hosts.push(host);
        ports.push(port.unwrap_or(DEFAULT_PORT));
    }
    let mut dbname = match url.path.strip_prefix('/') {
        Some(db) if !db.is_empty() => Some(decode(db, "database name")?),
        _ => None,
    };

    let mut timeout = DEFAULT_TIMEOUT;
    let mut pool_size = DEFAULT_POOL_SIZE;
    let mut table = DEFAULT_TABLE.to_owned();
    let mut ssl_mode = SslMode::default();
    let mut ssl_root_cert = None;
    let mut session_pooler = false;
    let mut passthrough = Vec::new();
    for (key, value) in url.query {
        match key.as_str() {
            "timeout" => timeout = parse_deadline(&key, &value)?,
            "pool_size" => pool_size = parse_pool_size(&value)?,
            "table" => table = parse_table(&value)?,
            "sslmode" => ssl_mode = SslMode::parse(&value)?,
            "pool_mode" => {
                session_pooler = match value.as_str() {
                    "session" => true,
                    "transaction" => false,
                    other => {
                        return Err(bad(format!(
                            "invalid value for option `pool_mode`: `{other}`; expected `session` (a pooler in session mode in front: notifications stay on) or `transaction` (the default)"
                        )))
                    }
                }
            }
            "sslrootcert" => {
                if value.is_empty() {
                    return Err(bad("option `sslrootcert` is empty"));
                }
                ssl_root_cert = Some(PathBuf::from(value));
            }
            // libpq lets these override the URL's own parts.
            "host" => {
                hosts = value
                    .split(',')
                    .map(str::to_owned)
                    .filter(|h| !h.is_empty())
                    .collect();
            }
            "port" => {
                ports = value
                    .split(',')
                    .map(|p| parse_port(p, URL_KIND))
                    .collect::<Result<Vec<_>>>()?;
            }
            "user" => user = Some(value),
            "password" => password = Some(value),
            "dbname" => dbname = Some(value),
            k if PASSTHROUGH.contains(&k) => passthrough.push((key, value)),
            k if k.starts_with("ssl") => {
                return Err(bad(format!(
                    "unsupported option `{k}` (TLS client certificates are not supported; the TLS options are sslmode and sslrootcert)"
                )))
            }
            k => {
                return Err(bad(format!(
                    "unknown option `{k}`; headcount's options are timeout, pool_size, table, pool_mode, sslmode and sslrootcert, and the connection options {}",
                    PASSTHROUGH.join(", ")
                )))
            }
        }
    }

    let mut pg = conninfo(&passthrough)?;
    if hosts.is_empty() && pg.get_hostaddrs().is_empty() {
        return Err(bad(
            "no host: expected postgres://user@host:5432/database (or ?host=/socket/directory)",
        ));
    }
    if ports.len() > 1 && ports.len() != hosts.len().max(pg.get_hostaddrs().len()) {
        return Err(bad(format!(
            "{} ports for {} hosts: give one port, or one per host",
            ports.len(),
            hosts.len()
        )));
    }
    match user {
        Some(u) if !u.is_empty() => {
            pg.user(u);
        }
        _ => {
            return Err(bad(
                "no user: expected postgres://user@host/database (or ?user=name)",
            ))
        }
    }
    if let Some(p) = password {
        pg.password(p);
    }
    if let Some(db) = dbname {
        pg.dbname(db);
    }
    for host in hosts {
        pg.host(host);
    }
    for port in ports {
        pg.port(port);
    }
    if pg.get_connect_timeout().is_none() {
        // An attempt to reach one host may not take longer than a whole operation may.
        pg.connect_timeout(timeout);
    }
    pg.ssl_mode(match ssl_mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            tokio_postgres::config::SslMode::Require
        }
    });

    Ok(PostgresConfig {
        pg,
        timeout,
        pool_size,
        table,
        ssl_mode,
        ssl_root_cert,
        session_pooler,
    })
}

fn parse_pool_size(value: &str) -> Result<usize> {
    match value.parse::<usize>() {
        Ok(n) if (1..=MAX_POOL_SIZE).contains(&n) => Ok(n),
        _ => Err(bad(format!(
            "invalid value for option `pool_size`: `{value}` (expected a number from 1 to {MAX_POOL_SIZE})"
        ))),
    }
}

/// A table name must be a plain SQL identifier. It is folded to lower case, as PostgreSQL folds
/// unquoted identifiers, and then always quoted, so reserved words such as `user` work too.
fn parse_table(value: &str) -> Result<String> {
    if is_plain_identifier(value, MAX_TABLE_LEN) {
        Ok(value.to_ascii_lowercase())
    } else {
        Err(bad(format!(
            "invalid value for option `table`: `{value}` (expected a plain SQL identifier: ASCII letters, digits and `_`, not starting with a digit, at most {MAX_TABLE_LEN} bytes)"
        )))
    }
}

/// Whether `value` is a plain SQL identifier of at most `max_len` bytes: ASCII letters, digits and
/// `_`, not starting with a digit. Such a name cannot carry SQL, quoted or not.
pub(crate) fn is_plain_identifier(value: &str, max_len: usize) -> bool {
    value.len() <= max_len
        && value.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Builds a tokio-postgres config from the pass-through options, in its key-value syntax with
/// every value quoted, so no value can be misread as another option.
fn conninfo(pairs: &[(String, String)]) -> Result<tokio_postgres::Config> {
    let mut text = String::new();
    for (key, value) in pairs {
        let quoted = value.replace('\\', "\\\\").replace('\'', "\\'");
        text.push_str(&format!("{key}='{quoted}' "));
    }
    text.parse::<tokio_postgres::Config>().map_err(|e| {
        // tokio-postgres names the option but not its value ("invalid value for option `port`").
        match std::error::Error::source(&e) {
            Some(cause) => bad(cause),
            None => bad(e),
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use headcount_core::backend::url::assert_config_error;

    use super::*;
    use tokio_postgres::config::Host;

    const SECRET: &str = "s3cr3t-p@ss";

    fn ok(url: &str) -> PostgresConfig {
        PostgresConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn err(url: &str) -> String {
        assert_config_error(
            url,
            PostgresConfig::from_url(url),
            &["s3cr3t", "p@ss", "hunter2"],
        )
    }

    #[test]
    fn full_url() {
        let c = ok(
            "postgres://alice:s3cr3t-p%40ss@db.example.com:6543/app?timeout=500ms&pool_size=4&table=My_Kv&sslmode=require&application_name=hc&connect_timeout=3",
        );
        assert_eq!(c.username(), Some("alice"));
        assert_eq!(c.pg.get_password(), Some(SECRET.as_bytes()));
        assert_eq!(c.pg.get_hosts(), &[Host::Tcp("db.example.com".into())]);
        assert_eq!(c.pg.get_ports(), &[6543]);
        assert_eq!(c.dbname(), Some("app"));
        assert_eq!(c.timeout(), Duration::from_millis(500));
        assert_eq!(c.pool_size(), 4);
        assert_eq!(c.table(), "my_kv");
        assert_eq!(c.ssl_mode(), SslMode::Require);
        assert_eq!(c.verification(), Verification::None);
        assert_eq!(c.pg.get_application_name(), Some("hc"));
        assert_eq!(c.pg.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(
            c.pg.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        let debug = format!("{c:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("***"), "{debug}");
        assert!(debug.contains("db.example.com"), "{debug}");
    }

    #[test]
    fn special_characters_in_the_password() {
        // `%23` is a `#`; `@` and `:` may stand raw (the credentials end at the last `@`).
        let c = ok("postgres://u:s3c%23r@:t@h/db");
        assert_eq!(c.pg.get_password(), Some("s3c#r@:t".as_bytes()));
        assert_eq!(c.pg.get_hosts(), &[Host::Tcp("h".into())]);
        assert!(!format!("{c:?}").contains("s3c"));
    }

    #[test]
    fn defaults() {
        let c = ok("postgresql://bob@localhost");
        assert_eq!(c.timeout(), Duration::from_secs(5));
        assert_eq!(c.pool_size(), 16);
        assert_eq!(c.table(), "headcount_kv");
        assert_eq!(c.ssl_mode(), SslMode::Prefer);
        assert_eq!(c.pg.get_ports(), &[5432]);
        assert_eq!(c.dbname(), None);
        assert_eq!(c.pg.get_password(), None);
        // connect_timeout follows the operation deadline unless given.
        assert_eq!(c.pg.get_connect_timeout(), Some(&Duration::from_secs(5)));
        assert!(!format!("{c:?}").contains("***"));
        let c = ok("POSTGRES://bob@localhost/db?timeout=2m");
        assert_eq!(c.timeout(), Duration::from_secs(120));
        assert_eq!(c.pg.get_connect_timeout(), Some(&Duration::from_secs(120)));
    }

    #[test]
    fn hosts_ports_and_sockets() {
        let c = ok("postgres://u@h1:5433,h2,[::1]:5435/db");
        assert_eq!(
            c.pg.get_hosts(),
            &[
                Host::Tcp("h1".into()),
                Host::Tcp("h2".into()),
                Host::Tcp("::1".into())
            ]
        );
        assert_eq!(c.pg.get_ports(), &[5433, 5432, 5435]);

        let c = ok("postgres://u@/db?host=/var/run/postgresql&port=5433");
        assert_eq!(
            c.pg.get_hosts(),
            &[Host::Unix("/var/run/postgresql".into())]
        );
        assert_eq!(c.pg.get_ports(), &[5433]);

        let c = ok("postgres://u@%2Ftmp%2Fsock/db");
        assert_eq!(c.pg.get_hosts(), &[Host::Unix("/tmp/sock".into())]);

        let c = ok("postgres://u@ignored/db?host=real&user=v&password=hunter2&dbname=d2");
        assert_eq!(c.pg.get_hosts(), &[Host::Tcp("real".into())]);
        assert_eq!(c.username(), Some("v"));
        assert_eq!(c.dbname(), Some("d2"));
        assert!(!format!("{c:?}").contains("hunter2"));

        let c = ok("postgres://u@/db?hostaddr=127.0.0.1");
        assert_eq!(c.pg.get_hostaddrs().len(), 1);
    }

    #[test]
    fn tls_modes() {
        for (mode, expected, verification) in [
            ("disable", SslMode::Disable, Verification::None),
            ("prefer", SslMode::Prefer, Verification::None),
            ("require", SslMode::Require, Verification::None),
            ("verify-ca", SslMode::VerifyCa, Verification::Chain),
            ("verify-full", SslMode::VerifyFull, Verification::Full),
        ] {
            let c = ok(&format!("postgres://u@h/db?sslmode={mode}"));
            assert_eq!(c.ssl_mode(), expected);
            assert_eq!(c.ssl_mode().as_str(), mode);
            assert_eq!(c.verification(), verification);
            assert_eq!(c.roots(), Roots::Bundled);
        }
        let c = ok("postgres://u@h/db?sslmode=require&sslrootcert=/etc/ca.pem");
        assert_eq!(c.verification(), Verification::Chain);
        assert_eq!(c.roots(), Roots::File("/etc/ca.pem".into()));
        let c = ok("postgres://u@h/db?sslmode=verify-full&sslrootcert=system");
        assert_eq!(c.roots(), Roots::Bundled);
    }

    #[test]
    fn bad_urls() {
        let cases = [
            ("postgres://u:s3cr3t@h/db?bogus=1", "unknown option `bogus`"),
            ("postgres://u:s3cr3t@h:99999/db", "bad port"),
            ("postgres://u:s3cr3t@h:0/db", "bad port"),
            ("postgres://u:s3cr3t@h:54x2/db", "bad port"),
            ("postgres://u:s3cr3t@h:/db", "bad port"),
            // An unencoded `/` in the password splits the authority early; the leftover must
            // not be echoed.
            ("postgres://u:hunter2/x@h/db", "bad port"),
            ("postgres://u:s3cr3t@/db", "no host"),
            ("postgres://u:s3cr3t@h/db?port=1,2", "2 ports for 1 hosts"),
            ("postgres://:s3cr3t@h/db", "no user"),
            ("postgres://h/db", "no user"),
            ("postgres://u:s3cr3t@h/db?timeout=abc", "`timeout`"),
            ("postgres://u:s3cr3t@h/db?timeout=0ms", "`timeout`"),
            ("postgres://u:s3cr3t@h/db?timeout=48h", "`timeout`"),
            ("postgres://u:s3cr3t@h/db?pool_size=0", "`pool_size`"),
            ("postgres://u:s3cr3t@h/db?pool_size=many", "`pool_size`"),
            ("postgres://u:s3cr3t@h/db?table=kv;drop", "`table`"),
            ("postgres://u:s3cr3t@h/db?table=1kv", "`table`"),
            ("postgres://u:s3cr3t@h/db?table=a.b", "`table`"),
            ("postgres://u:s3cr3t@h/db?table=", "`table`"),
            ("postgres://u:s3cr3t@h/db?sslmode=always", "`sslmode`"),
            ("postgres://u:s3cr3t@h/db?sslmode=allow", "`sslmode`"),
            ("postgres://u:s3cr3t@h/db?sslcert=/c.pem", "`sslcert`"),
            ("postgres://u:s3cr3t@h/db?sslrootcert=", "`sslrootcert`"),
            (
                "postgres://u:s3cr3t@h/db?connect_timeout=soon",
                "`connect_timeout`",
            ),
            (
                "postgres://u:s3cr3t@h/db?keepalives_idle=x",
                "`keepalives_idle`",
            ),
            (
                "postgres://u:s3cr3t@h/db?target_session_attrs=x",
                "`target_session_attrs`",
            ),
            ("postgres://u:s3cr3t@h/db?timeout", "key=value"),
            (
                "postgres://u:s3cr3t@h/db?timeout=1s&timeout=2s",
                "more than once",
            ),
            ("postgres://u:s3cr3t@[::1/db", "IPv6"),
            ("postgres://u:s3cr3t%zz@h/db", "percent-escape"),
            // A raw `#` starts a fragment, wherever it stands, here as for the other schemes:
            // a password holding one writes it `%23`.
            ("postgres://u:s3cr#3t@h/db", "%23"),
            ("postgres://u:s3cr3t@h/db#x", "fragment"),
            ("postgres://u:s3cr3t@h/db%", "percent-escape"),
            ("mysql://u:s3cr3t@h/db", "expected postgres://"),
            ("postgres:u:s3cr3t@h/db", "expected postgres://"),
        ];
        for (url, needle) in cases {
            let message = err(url);
            assert!(message.contains(needle), "{url}: {message}");
        }
    }

    #[test]
    fn passthrough_values_cannot_inject_options() {
        let c = ok("postgres://u@h/db?application_name=it%27s%20a%20test%20sslmode%3Ddisable");
        assert_eq!(
            c.pg.get_application_name(),
            Some("it's a test sslmode=disable")
        );
        assert_eq!(c.ssl_mode(), SslMode::Prefer);
        let c =
            ok("postgres://u@h/db?options=-c%20statement_timeout%3D1000&application_name=a%5Cb");
        assert_eq!(c.pg.get_options(), Some("-c statement_timeout=1000"));
        assert_eq!(c.pg.get_application_name(), Some("a\\b"));
    }
}
