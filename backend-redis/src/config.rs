//! Parsing `redis://`, `rediss://`, `redis+cluster://`, `rediss+cluster://`, `redis+sentinel://`
//! and `rediss+sentinel://` URLs into a
//! [`RedisConfig`], over the URL rules every backend shares ([`StoreUrl`]). No error message here
//! contains the password, nor any raw piece of the URL's authority that could be part of a
//! mistyped one.

use std::time::Duration;

use headcount_core::backend::url::{parse_bool, parse_deadline, Secret, StoreUrl, DEFAULT_TIMEOUT};
use headcount_core::backend::Deadline;
use headcount_core::Result;
use redis::{ConnectionAddr, ConnectionInfo, ProtocolVersion, RedisConnectionInfo};

use crate::errors::BACKEND;

/// The port used when a URL names none.
pub const DEFAULT_PORT: u16 = 6379;

/// The port of a Sentinel when a `redis+sentinel://` URL names none.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// Single server or Cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Deployment {
    /// One server (or a primary behind a proxy): `redis://`, `rediss://`.
    Single,
    /// Redis Cluster, discovered from one or more seed nodes: `redis+cluster://`,
    /// `rediss+cluster://`.
    Cluster,
    /// A primary with replicas watched by Redis Sentinel: the store asks the Sentinels for the
    /// current primary of a master name, and again after any connection fault or `READONLY`
    /// answer: `redis+sentinel://`, `rediss+sentinel://`.
    Sentinel,
}

/// A parsed Redis store configuration. Its `Debug` never shows the password.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    deployment: Deployment,
    tls: bool,
    insecure: bool,
    endpoints: Vec<(String, u16)>,
    db: i64,
    master_name: Option<String>,
    username: Option<String>,
    password: Option<Secret>,
    /// The Sentinels' own credentials (`sentinel_username`, `sentinel_password`).
    sentinel_username: Option<String>,
    sentinel_password: Option<Secret>,
    timeout: Duration,
    /// Replicas every write must reach before it counts (`wait_replicas`), if any.
    wait_replicas: Option<u32>,
}

/// How this crate's URL is named in error messages.
const URL_KIND: &str = "Redis URL";

/// What a Redis URL looks like, for error messages.
const USAGE: &str = "redis://[user:password@]host:port/db, rediss://..., redis+cluster://host:port,host:port, rediss+cluster://..., redis+sentinel://host:26379,host:26379/master-name[/db] or rediss+sentinel://...";

impl RedisConfig {
    /// Parses a Redis URL; see the crate README for the forms and options.
    pub fn from_url(url: &str) -> Result<Self> {
        parse(url)
    }

    /// Single server or Cluster.
    pub fn deployment(&self) -> Deployment {
        self.deployment
    }

    /// Whether connections use TLS (`rediss`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The master name the Sentinels watch (`redis+sentinel://`), else `None`.
    pub fn master_name(&self) -> Option<&str> {
        self.master_name.as_deref()
    }

    /// The server (or the Cluster's seed nodes, or the Sentinels), as host and port.
    pub fn endpoints(&self) -> &[(String, u16)] {
        &self.endpoints
    }

    /// The database number (always 0 on Cluster).
    pub fn db(&self) -> i64 {
        self.db
    }

    /// The ACL user name, if any.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The deadline of every operation (`timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How many replicas every write must reach before the store reports it done
    /// (`wait_replicas=N`: Redis's `WAIT N` after each write), if any. Without it a write is
    /// done once the primary applied it, and a failover to a replica that had not received it
    /// yet loses it.
    pub fn wait_replicas(&self) -> Option<u32> {
        self.wait_replicas
    }

    /// The deadline of every operation, as the errors it turns into name it.
    pub(crate) fn deadline(&self) -> Deadline {
        Deadline::new(BACKEND, self.timeout)
    }

    /// The password, for scrubbing it from messages; never shown.
    pub(crate) fn password(&self) -> Option<&str> {
        self.password.as_ref().map(Secret::expose)
    }

    /// The ACL user the store logs in to the Sentinels as (`sentinel_username`), if any.
    pub fn sentinel_username(&self) -> Option<&str> {
        self.sentinel_username.as_deref()
    }

    /// The Sentinels' password (`sentinel_password`), for scrubbing it from messages; never
    /// shown.
    pub(crate) fn sentinel_password(&self) -> Option<&str> {
        self.sentinel_password.as_ref().map(Secret::expose)
    }

    /// The connection info for one Sentinel: TLS as for the servers, database 0, and the
    /// Sentinels' own credentials (`sentinel_username`, `sentinel_password`; none by default:
    /// the URL's user and password are the servers').
    pub(crate) fn sentinel_connection_info(&self, host: &str, port: u16) -> ConnectionInfo {
        let mut info = self.connection_info(host, port);
        info.redis = RedisConnectionInfo {
            protocol: ProtocolVersion::RESP2,
            username: self.sentinel_username.clone(),
            password: self.sentinel_password().map(str::to_owned),
            ..RedisConnectionInfo::default()
        };
        info
    }

    /// The redis crate's connection info for one node.
    pub(crate) fn connection_info(&self, host: &str, port: u16) -> ConnectionInfo {
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: self.insecure,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        };
        ConnectionInfo {
            addr,
            redis: RedisConnectionInfo {
                db: self.db,
                username: self.username.clone(),
                password: self.password().map(str::to_owned),
                protocol: ProtocolVersion::RESP2,
            },
        }
    }
}

fn parse(url: &str) -> Result<RedisConfig> {
    let url = StoreUrl::parse(
        url,
        URL_KIND,
        &[
            "redis",
            "rediss",
            "redis+cluster",
            "rediss+cluster",
            "redis+sentinel",
            "rediss+sentinel",
        ],
        USAGE,
    )?;
    let (deployment, tls) = match url.scheme.as_str() {
        "redis" => (Deployment::Single, false),
        "rediss" => (Deployment::Single, true),
        "redis+cluster" => (Deployment::Cluster, false),
        "rediss+cluster" => (Deployment::Cluster, true),
        "redis+sentinel" => (Deployment::Sentinel, false),
        _ => (Deployment::Sentinel, true),
    };

    // `:password@` logs in as the default user.
    let username = url.username.clone().filter(|u| !u.is_empty());
    if username.is_some() && url.password.is_none() {
        return Err(url.invalid(
            "a user name without a password: Redis ACL users log in with both (redis://user:password@host)",
        ));
    }

    let endpoints = if deployment == Deployment::Sentinel {
        url.endpoints(
            DEFAULT_SENTINEL_PORT,
            "redis+sentinel://host:26379,host:26379/master-name",
        )?
    } else {
        url.endpoints(
            DEFAULT_PORT,
            "redis://host:6379 (or a comma list of host:port for Cluster)",
        )?
    };
    if deployment == Deployment::Single && endpoints.len() > 1 {
        return Err(url.invalid(format!(
            "{} hosts for a single server: use redis+cluster:// for Redis Cluster",
            endpoints.len()
        )));
    }

    // Sentinel: `/master-name[/db]`.
    let mut path = url.path.as_str();
    let mut master_name = None;
    if deployment == Deployment::Sentinel {
        let rest = path.strip_prefix('/').unwrap_or(path);
        let (name, db) = match rest.split_once('/') {
            Some((name, db)) => (name, Some(db)),
            None => (rest, None),
        };
        if name.is_empty() {
            return Err(url.invalid(
                "no master name: redis+sentinel://host:26379,host:26379/master-name[/db]",
            ));
        }
        master_name = Some(name.to_owned());
        path = match db {
            Some(db) if !db.is_empty() => &url.path[url.path.len() - db.len() - 1..],
            _ => "",
        };
    }
    let db = match path.strip_prefix('/') {
        None | Some("") => 0,
        Some(text) => match text.parse::<i64>() {
            Ok(n) if n >= 0 && text.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(url.invalid("the path must be a database number such as /0")),
        },
    };
    if deployment == Deployment::Cluster && db != 0 {
        return Err(url.invalid("Redis Cluster has only database 0"));
    }

    let mut timeout = DEFAULT_TIMEOUT;
    let mut insecure = false;
    let mut sentinel_username = None;
    let mut sentinel_password = None;
    let mut wait_replicas = None;
    for (key, value) in &url.query {
        let sentinel_only = || {
            url.invalid(format!(
                "option `{key}` only applies to redis+sentinel:// (and rediss+sentinel://) URLs"
            ))
        };
        match key.as_str() {
            "sentinel_username" if deployment != Deployment::Sentinel => {
                return Err(sentinel_only())
            }
            "sentinel_password" if deployment != Deployment::Sentinel => {
                return Err(sentinel_only())
            }
            "sentinel_username" => {
                sentinel_username = Some(value.clone()).filter(|u| !u.is_empty())
            }
            "sentinel_password" => sentinel_password = Some(Secret::new(value.clone())),
            "timeout" => timeout = parse_deadline(key, value)?,
            "wait_replicas" if deployment == Deployment::Cluster => {
                return Err(url.invalid(
                    "option `wait_replicas` applies to redis:// and redis+sentinel:// URLs, not \
                     to Redis Cluster",
                ))
            }
            "wait_replicas" => {
                wait_replicas = Some(value.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(
                    || {
                        url.invalid(format!(
                            "option `wait_replicas`: {value:?} is not a number of replicas \
                                 (1 or more)"
                        ))
                    },
                )?)
            }
            "insecure" => {
                insecure = parse_bool(key, value)?;
                if !tls {
                    return Err(url.invalid(
                        "option `insecure` only applies to rediss:// (and rediss+...) URLs",
                    ));
                }
            }
            k => {
                return Err(url.unknown_option(
                    k,
                    &[
                        "timeout",
                        "wait_replicas",
                        "insecure",
                        "sentinel_username",
                        "sentinel_password",
                    ],
                ))
            }
        }
    }
    if sentinel_username.is_some() && sentinel_password.is_none() {
        return Err(url.invalid(
            "option `sentinel_username` without `sentinel_password`: Redis ACL users log in with both",
        ));
    }

    Ok(RedisConfig {
        deployment,
        tls,
        insecure,
        endpoints,
        db,
        master_name,
        username,
        password: url.password,
        sentinel_username,
        sentinel_password,
        timeout,
        wait_replicas,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use headcount_core::backend::url::assert_config_error;

    use super::*;

    fn ok(url: &str) -> RedisConfig {
        RedisConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn err(url: &str) -> String {
        assert_config_error(
            url,
            RedisConfig::from_url(url),
            &["s3cr3t", "p@ss", "hunter2"],
        )
    }

    #[test]
    fn single_server_urls() {
        let c = ok("redis://alice:s3cr3t%40x@cache.example.com:6380/3?timeout=500ms");
        assert_eq!(c.deployment(), Deployment::Single);
        assert!(!c.tls());
        assert_eq!(c.endpoints(), &[("cache.example.com".to_owned(), 6380)]);
        assert_eq!(c.db(), 3);
        assert_eq!(c.username(), Some("alice"));
        assert_eq!(c.password(), Some("s3cr3t@x"));
        assert_eq!(c.timeout(), Duration::from_millis(500));
        let debug = format!("{c:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("***"), "{debug}");

        let c = ok("redis://127.0.0.1");
        assert_eq!(c.endpoints(), &[("127.0.0.1".to_owned(), 6379)]);
        assert_eq!(c.db(), 0);
        assert_eq!(c.timeout(), DEFAULT_TIMEOUT);
        assert_eq!(c.password(), None);

        // The default user with a password (requirepass), as redis-cli writes it.
        let c = ok("REDIS://:hunter2@[::1]:7000/");
        assert_eq!(c.username(), None);
        assert_eq!(c.password(), Some("hunter2"));
        assert_eq!(c.endpoints(), &[("::1".to_owned(), 7000)]);

        // `%23` is a `#` in a password, `@` and `:` may stand raw there.
        let c = ok("redis://u:s3c%23r@:t@h");
        assert_eq!(c.password(), Some("s3c#r@:t"));
        assert_eq!(c.endpoints(), &[("h".to_owned(), 6379)]);

        let c = ok("rediss://h?insecure=true");
        assert!(c.tls());
        match c.connection_info("h", 6379).addr {
            ConnectionAddr::TcpTls { insecure, .. } => assert!(insecure),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cluster_urls() {
        let c = ok("redis+cluster://u:s3cr3t@a:7000,b:7001,c?timeout=2s");
        assert_eq!(c.deployment(), Deployment::Cluster);
        assert_eq!(
            c.endpoints(),
            &[
                ("a".to_owned(), 7000),
                ("b".to_owned(), 7001),
                ("c".to_owned(), 6379)
            ]
        );
        assert_eq!(c.timeout(), Duration::from_secs(2));
        let c = ok("rediss+cluster://a:7000/0");
        assert!(c.tls());
        assert_eq!(c.deployment(), Deployment::Cluster);
    }

    #[test]
    fn sentinel_urls() {
        let c = ok("redis+sentinel://:s3cr3t@a:26380,b,c:26381/mymaster/2?timeout=2s");
        assert_eq!(c.deployment(), Deployment::Sentinel);
        assert!(!c.tls());
        assert_eq!(c.master_name(), Some("mymaster"));
        assert_eq!(c.db(), 2);
        assert_eq!(
            c.endpoints(),
            &[
                ("a".to_owned(), 26380),
                ("b".to_owned(), 26379),
                ("c".to_owned(), 26381)
            ]
        );
        assert_eq!(c.password(), Some("s3cr3t"));
        let c = ok("rediss+sentinel://h/m?insecure=true");
        assert!(c.tls());
        assert_eq!((c.master_name(), c.db()), (Some("m"), 0));
        assert_eq!(ok("redis+sentinel://h/m/").db(), 0);
        assert_eq!(ok("redis://h").master_name(), None);
    }

    #[test]
    fn sentinel_credentials() {
        // None by default: the URL's user and password are the servers'.
        let c = ok("redis+sentinel://u:s3cr3t@h/m");
        let info = c.sentinel_connection_info("h", 26379);
        assert_eq!((info.redis.username, info.redis.password), (None, None));
        assert_eq!(info.redis.db, 0);

        // The Sentinels' default user with a password (`requirepass` in sentinel.conf), and an
        // ACL user; percent-escapes decoded; the servers' credentials untouched.
        let c = ok("redis+sentinel://u:s3cr3t@h/m?sentinel_password=p%40ss");
        let info = c.sentinel_connection_info("h", 26379);
        assert_eq!(info.redis.username, None);
        assert_eq!(info.redis.password.as_deref(), Some("p@ss"));
        assert_eq!(c.password(), Some("s3cr3t"));
        let server = c.connection_info("h", 6379);
        assert_eq!(server.redis.password.as_deref(), Some("s3cr3t"));

        let c = ok("rediss+sentinel://h/m/1?sentinel_username=watcher&sentinel_password=hunter2");
        assert_eq!(c.sentinel_username(), Some("watcher"));
        let info = c.sentinel_connection_info("h", 26379);
        assert_eq!(info.redis.username.as_deref(), Some("watcher"));
        assert_eq!(info.redis.password.as_deref(), Some("hunter2"));
        assert!(matches!(info.addr, ConnectionAddr::TcpTls { .. }));
        // Neither password shows in Debug.
        let debug = format!("{c:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert_eq!(c.password(), None);
    }

    #[test]
    fn wait_replicas() {
        assert_eq!(ok("redis://h:6379").wait_replicas(), None);
        assert_eq!(
            ok("redis://h:6379?wait_replicas=1").wait_replicas(),
            Some(1)
        );
        assert_eq!(
            ok("redis+sentinel://h:26379/mymaster?wait_replicas=2&timeout=2s").wait_replicas(),
            Some(2)
        );
        for bad in ["0", "-1", "x", ""] {
            let e = err(&format!("redis://h:6379?wait_replicas={bad}"));
            assert!(e.contains("wait_replicas"), "{e}");
        }
        let e = err("redis+cluster://h:7000?wait_replicas=1");
        assert!(e.contains("not to Redis Cluster"), "{e}");
    }

    #[test]
    fn bad_urls() {
        for (url, needle) in [
            ("redis://u:s3cr3t@h/db?bogus=1", "database number"),
            ("redis://u:s3cr3t@h?bogus=1", "unknown option `bogus`"),
            ("redis://u:s3cr3t@h:99999", "bad port"),
            ("redis://u:s3cr3t@h:0", "bad port"),
            ("redis://u:hunter2/x@h", "bad port"),
            ("redis://u:s3cr3t@", "no host"),
            ("redis://u:s3cr3t@a:1,b:2", "redis+cluster://"),
            ("redis+cluster://u:s3cr3t@a:1,,b:2", "no host"),
            ("redis+cluster://u:s3cr3t@a:1/2", "only database 0"),
            ("redis://u:s3cr3t@h/-1", "database number"),
            ("redis://u:s3cr3t@h?timeout=abc", "`timeout`"),
            ("redis://u:s3cr3t@h?timeout=0s", "`timeout`"),
            ("redis://u:s3cr3t@h?insecure=yes", "`insecure`"),
            ("rediss://u:s3cr3t@h?insecure=maybe", "`insecure`"),
            ("redis://u:s3cr3t@h?insecure=true", "rediss://"),
            ("redis://u:s3cr3t@h?timeout=1s&timeout=2s", "more than once"),
            ("redis://u@h", "without a password"),
            ("redis+sentinel://u:s3cr3t@h", "no master name"),
            ("redis+sentinel://u:s3cr3t@h/", "no master name"),
            ("redis+sentinel://u:s3cr3t@h/m/x", "database number"),
            ("redis+sentinel://u:s3cr3t@h/m?insecure=true", "rediss://"),
            (
                "redis://u:s3cr3t@h?sentinel_password=hunter2",
                "redis+sentinel://",
            ),
            ("redis+cluster://h?sentinel_username=u", "redis+sentinel://"),
            (
                "redis+sentinel://h/m?sentinel_username=watcher",
                "without `sentinel_password`",
            ),
            (
                "redis+sentinel://h/m?sentinel_password=p@ss&sentinel_password=x",
                "more than once",
            ),
            ("redis://u:s3cr3t@[::1", "IPv6"),
            ("redis://u:s3cr3t%zz@h", "percent-escape"),
            ("redis://u:s3cr3t@h#frag", "fragment"),
            // A raw `#` starts a fragment, wherever it stands: `%23` in a password.
            ("redis://u:s3cr#3t@h", "%23"),
            ("redis://:s3cr#3t@h", "%23"),
            ("http://u:s3cr3t@h", "scheme"),
            ("redis:u:s3cr3t@h", "expected redis://"),
        ] {
            let message = err(url);
            assert!(message.contains(needle), "{url}: {message}");
        }
    }
}
