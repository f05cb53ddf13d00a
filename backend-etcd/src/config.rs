//! Parsing `etcd://` and `etcds://` URLs into an [`EtcdConfig`]. No error message here contains
//! the password, nor any raw piece of the URL's authority that could be part of a mistyped one.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use headcount_core::{Error, Result};

use headcount_core::backend::url::{
    decode, parse_deadline, parse_port, parse_query, reject_duplicates, split_host_port, Redacted,
    DEFAULT_TIMEOUT,
};

/// The port used when a URL names none.
pub const DEFAULT_PORT: u16 = 2379;

/// A parsed etcd store configuration. Its `Debug` never shows the password.
#[derive(Clone)]
pub struct EtcdConfig {
    endpoints: Vec<(String, u16)>,
    tls: bool,
    ca_cert: Option<PathBuf>,
    domain: Option<String>,
    user: Option<String>,
    password: Option<String>,
    timeout: Duration,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls)
            .field("cacert", &self.ca_cert)
            .field("domain", &self.domain)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| Redacted))
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// How this crate's URL is named in error messages.
const URL_KIND: &str = "etcd URL";

fn bad(message: impl fmt::Display) -> Error {
    Error::config(format!("invalid etcd URL: {message}"))
}

impl EtcdConfig {
    /// Parses `etcd://[user:password@]host:port[,host:port...][?options]` or `etcds://...`
    /// (TLS); see the crate README for the options.
    pub fn from_url(url: &str) -> Result<Self> {
        parse(url)
    }

    /// The endpoints, as host and port.
    pub fn endpoints(&self) -> &[(String, u16)] {
        &self.endpoints
    }

    /// Whether connections use TLS.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The PEM file of trusted roots (`cacert`), if any.
    pub fn ca_cert(&self) -> Option<&std::path::Path> {
        self.ca_cert.as_deref()
    }

    /// The etcd user name, if any.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The deadline of every operation (`timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The password, for authentication and scrubbing; never shown.
    pub(crate) fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The name the server certificate must carry (`domain`), default the first host.
    pub(crate) fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// The endpoint URLs for the client: `http://host:port` or `https://host:port`.
    pub(crate) fn endpoint_urls(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|(h, p)| {
                if h.contains(':') {
                    format!("{scheme}://[{h}]:{p}")
                } else {
                    format!("{scheme}://{h}:{p}")
                }
            })
            .collect()
    }
}

fn parse(url: &str) -> Result<EtcdConfig> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        bad("expected etcd://[user:password@]host:2379[,host:2379...] or etcds://...")
    })?;
    let mut tls = match scheme.to_ascii_lowercase().as_str() {
        "etcd" => false,
        "etcds" => true,
        _ => return Err(bad("expected the scheme etcd or etcds")),
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

    let mut user = None;
    let mut password = None;
    if let Some(userinfo) = userinfo {
        let Some((u, p)) = userinfo.split_once(':') else {
            return Err(bad(
                "a user name without a password: expected etcd://user:password@host",
            ));
        };
        let u = decode(u, "user name")?;
        if u.is_empty() {
            return Err(bad(
                "a password without a user name: expected etcd://user:password@host",
            ));
        }
        user = Some(u);
        password = Some(decode(p, "password")?);
    }

    let mut endpoints = Vec::new();
    for chunk in hostspec.split(',') {
        if chunk.is_empty() {
            return Err(bad(
                "no host: expected etcd://host:2379 (or a comma list of host:port)",
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
        endpoints.push((host, port));
    }

    if !path.is_empty() && path != "/" {
        return Err(bad(
            "etcd URLs have no path (keys are named by headcount's own prefix)",
        ));
    }

    let pairs = parse_query(query)?;
    reject_duplicates(&pairs)?;
    let mut timeout = DEFAULT_TIMEOUT;
    let mut ca_cert = None;
    let mut domain = None;
    for (key, value) in pairs {
        match key.as_str() {
            "timeout" => timeout = parse_deadline(&key, &value)?,
            "tls" => {
                tls = match value.as_str() {
                    "true" | "1" => true,
                    "false" | "0" if scheme.eq_ignore_ascii_case("etcd") => false,
                    "false" | "0" => return Err(bad("etcds:// always uses TLS; drop `tls=false`")),
                    _ => {
                        return Err(bad(format!(
                            "invalid value for option `tls`: `{value}` (expected true or false)"
                        )))
                    }
                }
            }
            "cacert" => {
                if value.is_empty() {
                    return Err(bad("option `cacert` is empty"));
                }
                ca_cert = Some(PathBuf::from(value));
            }
            "domain" => {
                if value.is_empty() {
                    return Err(bad("option `domain` is empty"));
                }
                domain = Some(value);
            }
            k => {
                return Err(bad(format!(
                    "unknown option `{k}`; the options are timeout, tls, cacert and domain"
                )))
            }
        }
    }
    if !tls && (ca_cert.is_some() || domain.is_some()) {
        return Err(bad(
            "options `cacert` and `domain` need TLS: use etcds:// or tls=true",
        ));
    }

    Ok(EtcdConfig {
        endpoints,
        tls,
        ca_cert,
        domain,
        user,
        password,
        timeout,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn ok(url: &str) -> EtcdConfig {
        match EtcdConfig::from_url(url) {
            Ok(c) => c,
            Err(e) => panic!("{url}: {e}"),
        }
    }

    fn err(url: &str) -> String {
        match EtcdConfig::from_url(url) {
            Ok(c) => panic!("{url}: unexpectedly parsed as {c:?}"),
            Err(e) => {
                assert_eq!(e.kind(), headcount_core::ErrorKind::Config, "{url}: {e}");
                let shown = format!("{e} {e:?}");
                for piece in ["s3cr3t", "hunter2"] {
                    assert!(!shown.contains(piece), "{url}: password leaked in {shown}");
                }
                e.to_string()
            }
        }
    }

    #[test]
    fn good_urls() {
        let c = ok("etcd://root:s3cr3t%2F@h1:2379,h2:22379,[::1]?timeout=750ms");
        assert_eq!(
            c.endpoints(),
            &[
                ("h1".to_owned(), 2379),
                ("h2".to_owned(), 22379),
                ("::1".to_owned(), 2379)
            ]
        );
        assert_eq!(c.user(), Some("root"));
        assert_eq!(c.password(), Some("s3cr3t/"));
        assert_eq!(c.timeout(), Duration::from_millis(750));
        assert!(!c.tls());
        assert_eq!(
            c.endpoint_urls(),
            vec!["http://h1:2379", "http://h2:22379", "http://[::1]:2379"]
        );
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("s3cr3t") && debug.contains("***"),
            "{debug}"
        );

        let c = ok("etcds://h?cacert=/etc/ca.pem&domain=etcd.local");
        assert!(c.tls());
        assert_eq!(c.ca_cert(), Some(std::path::Path::new("/etc/ca.pem")));
        assert_eq!(c.domain(), Some("etcd.local"));
        assert_eq!(c.endpoint_urls(), vec!["https://h:2379"]);
        assert!(ok("etcd://h/?tls=true").tls());
        assert_eq!(ok("ETCD://h").timeout(), DEFAULT_TIMEOUT);
    }

    #[test]
    fn bad_urls() {
        for (url, needle) in [
            ("etcd://u:s3cr3t@h?bogus=1", "unknown option `bogus`"),
            ("etcd://u:s3cr3t@h:99999", "bad port"),
            ("etcd://u:hunter2/x@h", "bad port"),
            ("etcd://u:s3cr3t@", "no host"),
            ("etcd://u:s3cr3t@a,,b", "no host"),
            ("etcd://u:s3cr3t@h/prefix", "no path"),
            ("etcd://u@h", "without a password"),
            ("etcd://:s3cr3t@h", "without a user name"),
            ("etcd://u:s3cr3t@h?timeout=soon", "`timeout`"),
            ("etcd://u:s3cr3t@h?tls=maybe", "`tls`"),
            ("etcds://u:s3cr3t@h?tls=false", "always uses TLS"),
            ("etcd://u:s3cr3t@h?cacert=/ca.pem", "need TLS"),
            ("etcd://u:s3cr3t@h?cacert=", "`cacert`"),
            ("etcd://u:s3cr3t@h?timeout=1s&timeout=1s", "more than once"),
            ("etcd://u:s3cr3t%zz@h", "percent-escape"),
            ("http://u:s3cr3t@h", "scheme"),
            ("etcd:u:s3cr3t@h", "expected etcd://"),
        ] {
            let message = err(url);
            assert!(message.contains(needle), "{url}: {message}");
        }
    }
}
