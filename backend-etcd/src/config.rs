//! Parsing `etcd://` and `etcds://` URLs into an [`EtcdConfig`], over the URL rules every backend
//! shares ([`StoreUrl`]). No error message here contains the password, nor any raw piece of the
//! URL's authority that could be part of a mistyped one.

use std::path::PathBuf;
use std::time::Duration;

use headcount_core::backend::url::{parse_bool, parse_deadline, Secret, StoreUrl, DEFAULT_TIMEOUT};
use headcount_core::backend::Deadline;
use headcount_core::Result;

use crate::errors::BACKEND;

/// The port used when a URL names none.
pub const DEFAULT_PORT: u16 = 2379;

/// A parsed etcd store configuration. Its `Debug` never shows the password.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    endpoints: Vec<(String, u16)>,
    tls: bool,
    ca_cert: Option<PathBuf>,
    domain: Option<String>,
    username: Option<String>,
    password: Option<Secret>,
    timeout: Duration,
}

/// How this crate's URL is named in error messages.
const URL_KIND: &str = "etcd URL";

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
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The deadline of every operation (`timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The deadline of every operation, as the errors it turns into name it.
    pub(crate) fn deadline(&self) -> Deadline {
        Deadline::new(BACKEND, self.timeout)
    }

    /// The password, for authentication and scrubbing; never shown.
    pub(crate) fn password(&self) -> Option<&str> {
        self.password.as_ref().map(Secret::expose)
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
    let url = StoreUrl::parse(
        url,
        URL_KIND,
        &["etcd", "etcds"],
        "etcd://[user:password@]host:2379[,host:2379...] or etcds://...",
    )?;
    let scheme_tls = url.scheme == "etcds";

    // etcd logs in with both or neither.
    match (&url.username, &url.password) {
        (Some(_), None) => {
            return Err(
                url.invalid("a user name without a password: expected etcd://user:password@host")
            )
        }
        (Some(u), Some(_)) if u.is_empty() => {
            return Err(
                url.invalid("a password without a user name: expected etcd://user:password@host")
            )
        }
        _ => {}
    }

    let endpoints = url.endpoints(
        DEFAULT_PORT,
        "etcd://host:2379 (or a comma list of host:port)",
    )?;

    if !url.path.is_empty() && url.path != "/" {
        return Err(
            url.invalid("etcd URLs have no path (keys are named by headcount's own prefix)")
        );
    }

    let mut tls = scheme_tls;
    let mut timeout = DEFAULT_TIMEOUT;
    let mut ca_cert = None;
    let mut domain = None;
    for (key, value) in &url.query {
        match key.as_str() {
            "timeout" => timeout = parse_deadline(key, value)?,
            "tls" => {
                tls = parse_bool(key, value)?;
                if scheme_tls && !tls {
                    return Err(url.invalid("etcds:// always uses TLS; drop `tls=false`"));
                }
            }
            "cacert" => {
                if value.is_empty() {
                    return Err(url.invalid("option `cacert` is empty"));
                }
                ca_cert = Some(PathBuf::from(value));
            }
            "domain" => {
                if value.is_empty() {
                    return Err(url.invalid("option `domain` is empty"));
                }
                domain = Some(value.clone());
            }
            k => return Err(url.unknown_option(k, &["timeout", "tls", "cacert", "domain"])),
        }
    }
    if !tls && (ca_cert.is_some() || domain.is_some()) {
        return Err(url.invalid("options `cacert` and `domain` need TLS: use etcds:// or tls=true"));
    }

    Ok(EtcdConfig {
        endpoints,
        tls,
        ca_cert,
        domain,
        username: url.username,
        password: url.password,
        timeout,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use headcount_core::backend::url::assert_config_error;

    use super::*;

    fn ok(url: &str) -> EtcdConfig {
        EtcdConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn err(url: &str) -> String {
        assert_config_error(url, EtcdConfig::from_url(url), &["s3cr3t", "hunter2"])
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
        assert_eq!(c.username(), Some("root"));
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

        // `%23` is a `#` in a password, `@` and `:` may stand raw there.
        let c = ok("etcd://u:s3c%23r@:t@h");
        assert_eq!(c.password(), Some("s3c#r@:t"));
        assert_eq!(c.endpoints(), &[("h".to_owned(), 2379)]);

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
            // A raw `#` starts a fragment, wherever it stands: `%23` in a password.
            ("etcd://u:s3cr#3t@h", "%23"),
            ("etcd://u:s3cr3t@h/#x", "fragment"),
            ("http://u:s3cr3t@h", "scheme"),
            ("etcd:u:s3cr3t@h", "expected etcd://"),
        ] {
            let message = err(url);
            assert!(message.contains(needle), "{url}: {message}");
        }
    }
}
