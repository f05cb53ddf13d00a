//! Parsing `redis://`, `rediss://`, `redis+cluster://` and `rediss+cluster://` URLs into a
//! [`RedisConfig`]. No error message here contains the password, nor any raw piece of the URL's
//! authority that could be part of a mistyped one.

use std::fmt;
use std::time::Duration;

use headcount_core::{Error, Result};
use redis::{ConnectionAddr, ConnectionInfo, ProtocolVersion, RedisConnectionInfo};

use headcount_core::backend::url::{
    decode, parse_deadline, parse_port, parse_query, reject_duplicates, split_host_port, Redacted,
    DEFAULT_TIMEOUT,
};

/// The port used when a URL names none.
pub const DEFAULT_PORT: u16 = 6379;

/// Single server or Cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// One server (or a primary behind a proxy): `redis://`, `rediss://`.
    Single,
    /// Redis Cluster, discovered from one or more seed nodes: `redis+cluster://`,
    /// `rediss+cluster://`.
    Cluster,
}

/// A parsed Redis store configuration. Its `Debug` never shows the password.
#[derive(Clone)]
pub struct RedisConfig {
    topology: Topology,
    tls: bool,
    insecure: bool,
    nodes: Vec<(String, u16)>,
    db: i64,
    username: Option<String>,
    password: Option<String>,
    timeout: Duration,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("topology", &self.topology)
            .field("tls", &self.tls)
            .field("insecure", &self.insecure)
            .field("nodes", &self.nodes)
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| Redacted))
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// How this crate's URL is named in error messages.
const URL_KIND: &str = "Redis URL";

fn bad(message: impl fmt::Display) -> Error {
    Error::config(format!("invalid Redis URL: {message}"))
}

impl RedisConfig {
    /// Parses a Redis URL; see the crate README for the forms and options.
    pub fn from_url(url: &str) -> Result<Self> {
        parse(url)
    }

    /// Single server or Cluster.
    pub fn topology(&self) -> Topology {
        self.topology
    }

    /// Whether connections use TLS (`rediss`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The server (or the Cluster's seed nodes), as host and port.
    pub fn nodes(&self) -> &[(String, u16)] {
        &self.nodes
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

    /// The password, for scrubbing it from messages; never shown.
    pub(crate) fn password(&self) -> Option<&str> {
        self.password.as_deref()
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
                password: self.password.clone(),
                protocol: ProtocolVersion::RESP2,
            },
        }
    }
}

fn parse(url: &str) -> Result<RedisConfig> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        bad("expected redis://[user:password@]host:port/db, rediss://..., redis+cluster://host:port,host:port or rediss+cluster://...")
    })?;
    let (topology, tls) = match scheme.to_ascii_lowercase().as_str() {
        "redis" => (Topology::Single, false),
        "rediss" => (Topology::Single, true),
        "redis+cluster" => (Topology::Cluster, false),
        "rediss+cluster" => (Topology::Cluster, true),
        _ => {
            return Err(bad(
                "expected the scheme redis, rediss, redis+cluster or rediss+cluster",
            ))
        }
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(authority_end);
    if after.contains('#') {
        return Err(bad("a fragment (`#...`) has no meaning in a store URL"));
    }
    let (userinfo, hostspec) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    };
    let (path, query) = after.split_once('?').unwrap_or((after, ""));

    let mut username = None;
    let mut password = None;
    if let Some(userinfo) = userinfo {
        let (u, p) = match userinfo.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (userinfo, None),
        };
        let u = decode(u, "user name")?;
        if !u.is_empty() {
            username = Some(u);
        }
        password = p.map(|p| decode(p, "password")).transpose()?;
        if username.is_some() && password.is_none() {
            return Err(bad(
                "a user name without a password: Redis ACL users log in with both (redis://user:password@host)",
            ));
        }
    }

    let mut nodes = Vec::new();
    for chunk in hostspec.split(',') {
        if chunk.is_empty() {
            return Err(bad(
                "no host: expected redis://host:6379 (or a comma list of host:port for Cluster)",
            ));
        }
        let (host, port) = split_host_port(chunk, URL_KIND)?;
        let host = decode(host, "host")?;
        if host.is_empty() {
            return Err(bad("a host is empty"));
        }
        let port = match port {
            Some(p) => parse_port(p, URL_KIND)?,
            None => DEFAULT_PORT,
        };
        nodes.push((host, port));
    }
    if topology == Topology::Single && nodes.len() > 1 {
        return Err(bad(format!(
            "{} hosts for a single server: use redis+cluster:// for Redis Cluster",
            nodes.len()
        )));
    }

    let db = match path.strip_prefix('/') {
        None | Some("") => 0,
        Some(text) => match text.parse::<i64>() {
            Ok(n) if n >= 0 && text.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(bad("the path must be a database number such as /0")),
        },
    };
    if topology == Topology::Cluster && db != 0 {
        return Err(bad("Redis Cluster has only database 0"));
    }

    let pairs = parse_query(query)?;
    reject_duplicates(&pairs)?;
    let mut timeout = DEFAULT_TIMEOUT;
    let mut insecure = false;
    for (key, value) in pairs {
        match key.as_str() {
            "timeout" => timeout = parse_deadline(&key, &value)?,
            "insecure" => {
                insecure = match value.as_str() {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    _ => {
                        return Err(bad(format!(
                        "invalid value for option `insecure`: `{value}` (expected true or false)"
                    )))
                    }
                };
                if !tls {
                    return Err(bad("option `insecure` only applies to rediss:// URLs"));
                }
            }
            k => {
                return Err(bad(format!(
                    "unknown option `{k}`; the options are timeout and insecure"
                )))
            }
        }
    }

    Ok(RedisConfig {
        topology,
        tls,
        insecure,
        nodes,
        db,
        username,
        password,
        timeout,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn ok(url: &str) -> RedisConfig {
        match RedisConfig::from_url(url) {
            Ok(c) => c,
            Err(e) => panic!("{url}: {e}"),
        }
    }

    fn err(url: &str) -> String {
        match RedisConfig::from_url(url) {
            Ok(c) => panic!("{url}: unexpectedly parsed as {c:?}"),
            Err(e) => {
                assert_eq!(e.kind(), headcount_core::ErrorKind::Config, "{url}: {e}");
                let shown = format!("{e} {e:?}");
                for piece in ["s3cr3t", "p@ss", "hunter2"] {
                    assert!(!shown.contains(piece), "{url}: password leaked in {shown}");
                }
                e.to_string()
            }
        }
    }

    #[test]
    fn single_server_urls() {
        let c = ok("redis://alice:s3cr3t%40x@cache.example.com:6380/3?timeout=500ms");
        assert_eq!(c.topology(), Topology::Single);
        assert!(!c.tls());
        assert_eq!(c.nodes(), &[("cache.example.com".to_owned(), 6380)]);
        assert_eq!(c.db(), 3);
        assert_eq!(c.username(), Some("alice"));
        assert_eq!(c.password(), Some("s3cr3t@x"));
        assert_eq!(c.timeout(), Duration::from_millis(500));
        let debug = format!("{c:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("***"), "{debug}");

        let c = ok("redis://127.0.0.1");
        assert_eq!(c.nodes(), &[("127.0.0.1".to_owned(), 6379)]);
        assert_eq!(c.db(), 0);
        assert_eq!(c.timeout(), DEFAULT_TIMEOUT);
        assert_eq!(c.password(), None);

        // The default user with a password (requirepass), as redis-cli writes it.
        let c = ok("REDIS://:hunter2@[::1]:7000/");
        assert_eq!(c.username(), None);
        assert_eq!(c.password(), Some("hunter2"));
        assert_eq!(c.nodes(), &[("::1".to_owned(), 7000)]);

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
        assert_eq!(c.topology(), Topology::Cluster);
        assert_eq!(
            c.nodes(),
            &[
                ("a".to_owned(), 7000),
                ("b".to_owned(), 7001),
                ("c".to_owned(), 6379)
            ]
        );
        assert_eq!(c.timeout(), Duration::from_secs(2));
        let c = ok("rediss+cluster://a:7000/0");
        assert!(c.tls());
        assert_eq!(c.topology(), Topology::Cluster);
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
            ("redis://u:s3cr3t@[::1", "IPv6"),
            ("redis://u:s3cr3t%zz@h", "percent-escape"),
            ("redis://u:s3cr3t@h#frag", "fragment"),
            ("http://u:s3cr3t@h", "scheme"),
            ("redis:u:s3cr3t@h", "expected redis://"),
        ] {
            let message = err(url);
            assert!(message.contains(needle), "{url}: {message}");
        }
    }
}
