//! URL pieces every backend's `from_url` shares, so a store URL means the same thing whatever the
//! scheme: [`StoreUrl`] splits one into scheme, credentials, host list, path and options with one
//! set of rules, and the helpers below read query strings, percent-escapes, durations and flags.
//!
//! The rules, for every scheme:
//!
//! * The credentials end at the *last* `@` of the authority (which ends at the first `/` or `?`),
//!   and the user name at the first `:` of them; both are percent-decoded, and a `%` not followed
//!   by two hex digits is an error. So a `@` or `:` in a password may stand raw, but a `/`, `?`,
//!   `#` or `%` must be percent-encoded (`%2F`, `%3F`, `%23`, `%25`), as in any URL.
//! * A raw `#` starts a fragment, which no store URL has: it is an error wherever it stands, so a
//!   `#` in a password must be written `%23` (it was once cut off silently by some schemes and kept
//!   by others).
//! * The host list is comma-separated `host`, `host:port` or `[v6]:port` entries.
//!
//! Error messages built here name the option and, for our own options, the offending value; they
//! never echo a whole URL, nor any raw piece of its authority, so a password cannot leak.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};

/// The default operation deadline of every backend.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest deadline accepted. A coordination call that may block for longer than this is
/// almost certainly a unit mistake, and lease-based recipes would miss every renewal meanwhile.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// A store URL split into its parts by the rules of the [module documentation](self):
/// `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?options]`. What the parts
/// mean (the path, which options exist, whether credentials are needed) is the backend's to say.
///
/// ```
/// # use headcount_core::backend::url::StoreUrl;
/// let url = StoreUrl::parse("redis://u:p%23ss@a:7000,b/0?timeout=2s", "Redis URL", &["redis"], "redis://host")?;
/// assert_eq!(url.username.as_deref(), Some("u"));
/// assert_eq!(url.password.as_ref().map(|p| p.expose()), Some("p#ss"));
/// assert_eq!(url.endpoints(6379, "redis://host")?, [("a".to_owned(), 7000), ("b".to_owned(), 6379)]);
/// assert_eq!(url.path, "/0");
/// assert_eq!(url.query, [("timeout".to_owned(), "2s".to_owned())]);
/// // A raw `#` starts a fragment, and the message does not show the password.
/// let e = StoreUrl::parse("redis://u:p#ss@a", "Redis URL", &["redis"], "redis://host").unwrap_err();
/// assert!(e.to_string().contains("%23") && !e.to_string().contains("ss@"));
/// # Ok::<(), headcount_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreUrl {
    /// How the URL is named in error messages ("Redis URL").
    pub kind: &'static str,
    /// The scheme, in lower case: one of those [`StoreUrl::parse`] accepted.
    pub scheme: String,
    /// The user name, decoded: `None` without credentials, `Some("")` for `:password@`.
    pub username: Option<String>,
    /// The password, decoded: `None` without a `:` in the credentials.
    pub password: Option<Secret>,
    /// The hosts, decoded, each with its port if given. Empty when the authority names none; an
    /// entry is an empty host where the list has an empty entry (`a,,b`) or a port alone (`:1`).
    pub hosts: Vec<(String, Option<u16>)>,
    /// The path, as written (not decoded): empty, or starting with `/`.
    pub path: String,
    /// The options, decoded, in order; none given twice.
    pub query: Vec<(String, String)>,
}

impl StoreUrl {
    /// Splits `url`, whose scheme must be one of `schemes` (lower case; matched ignoring case).
    /// `kind` names the URL in error messages ("Redis URL"), and `usage` is what they say was
    /// expected ("redis://host:port/db or ...").
    pub fn parse(url: &str, kind: &'static str, schemes: &[&str], usage: &str) -> Result<Self> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(invalid_url(kind, format!("expected {usage}")));
        };
        let scheme = scheme.to_ascii_lowercase();
        if !schemes.contains(&scheme.as_str()) {
            return Err(invalid_url(
                kind,
                format!("unknown scheme: expected {usage}"),
            ));
        }
        reject_fragment(rest, kind)?;
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, after) = rest.split_at(authority_end);
        let (userinfo, hostspec) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        let (path, query) = after.split_once('?').unwrap_or((after, ""));

        let (mut username, mut password) = (None, None);
        if let Some(userinfo) = userinfo {
            let (u, p) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            username = Some(decode(u, "user name")?);
            password = p.map(|p| decode(p, "password").map(Secret)).transpose()?;
        }

        let mut hosts = Vec::new();
        if !hostspec.is_empty() {
            for chunk in hostspec.split(',') {
                let (host, port) = split_host_port(chunk, kind)?;
                let port = port.map(|p| parse_port(p, kind)).transpose()?;
                hosts.push((decode(host, "host")?, port));
            }
        }

        let query = parse_query(query)?;
        reject_duplicates(&query)?;
        Ok(StoreUrl {
            kind,
            scheme,
            username,
            password,
            hosts,
            path: path.to_owned(),
            query,
        })
    }

    /// The hosts with `default_port` where none is given, for a scheme that needs at least one
    /// host and no empty ones: an error saying `example` was expected otherwise.
    pub fn endpoints(&self, default_port: u16, example: &str) -> Result<Vec<(String, u16)>> {
        if self.hosts.is_empty() || self.hosts.iter().any(|(host, _)| host.is_empty()) {
            return Err(self.invalid(format!("no host: expected {example}")));
        }
        Ok(self
            .hosts
            .iter()
            .map(|(host, port)| (host.clone(), port.unwrap_or(default_port)))
            .collect())
    }

    /// An [`Error::InvalidConfig`] about this URL: "invalid Redis URL: {message}".
    pub fn invalid(&self, message: impl fmt::Display) -> Error {
        invalid_url(self.kind, message)
    }

    /// The error for an option the backend does not know: see [`unknown_option`].
    pub fn unknown_option(&self, option: &str, known: &[&str]) -> Error {
        unknown_option(self.kind, option, known)
    }
}

/// Refuses a raw `#` in (a part of) a URL of `kind`: it would start a fragment, which no store
/// URL has. Where it was meant as part of a password or path, it is written `%23`.
pub fn reject_fragment(text: &str, kind: &str) -> Result<()> {
    if text.contains('#') {
        return Err(invalid_url(
            kind,
            "a fragment (`#...`) has no meaning in a store URL; percent-encode a `#` in a password or path as %23",
        ));
    }
    Ok(())
}

/// The error for an option of a URL of `kind` that the backend does not know, listing those it
/// does: "invalid Redis URL: unknown option `x`; the options are timeout and insecure".
pub fn unknown_option(kind: &str, option: &str, known: &[&str]) -> Error {
    let known = match known {
        [] => "none".to_owned(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    };
    invalid_url(
        kind,
        format!("unknown option `{option}`; the options are {known}"),
    )
}

/// An [`Error::InvalidConfig`] about a URL of `kind`: "invalid {kind}: {message}". The message
/// must not contain raw pieces of the URL's authority.
pub fn invalid_url(kind: &str, message: impl fmt::Display) -> Error {
    Error::config(format!("invalid {kind}: {message}"))
}

/// Parses a flag option: `true` or `1`, `false` or `0`.
pub fn parse_bool(option: &str, value: &str) -> Result<bool> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(Error::config(format!(
            "invalid value for option `{option}`: `{value}` (expected true or false)"
        ))),
    }
}

/// Percent-decodes `s` into UTF-8 text. `what` names the URL part for the error message, which
/// never contains `s` itself (it may be part of a password).
pub fn decode(s: &str, what: &str) -> Result<String> {
    let bytes = s.as_bytes();
    // A `%` not followed by two hex digits is malformed; percent_encoding would pass it through
    // silently, which hides typos.
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%' {
            let ok = bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit));
            if !ok {
                return Err(Error::config(format!(
                    "malformed percent-escape in the {what} of the URL"
                )));
            }
        }
    }
    percent_encoding::percent_decode(bytes)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| Error::config(format!("the {what} of the URL is not valid UTF-8")))
}

/// Splits a query string into decoded `(key, value)` pairs, in order. Empty segments (`a=1&&b=2`)
/// are skipped; a segment without `=` is an error. `+` is a literal plus, as in libpq URIs.
pub fn parse_query(query: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for (n, segment) in query.split('&').enumerate() {
        if segment.is_empty() {
            continue;
        }
        let Some((key, value)) = segment.split_once('=') else {
            // The segment itself is not echoed: it could be a mistyped password.
            return Err(Error::config(format!(
                "malformed URL query: parameter #{} is not of the form key=value",
                n + 1
            )));
        };
        let key = decode(key, "query")?;
        if key.is_empty() {
            return Err(Error::config(format!(
                "malformed URL query: parameter #{} has an empty name",
                n + 1
            )));
        }
        pairs.push((key, decode(value, "query")?));
    }
    Ok(pairs)
}

/// Rejects an option given twice: silently taking the first or the last hides mistakes.
pub fn reject_duplicates(pairs: &[(String, String)]) -> Result<()> {
    for (i, (key, _)) in pairs.iter().enumerate() {
        if pairs[..i].iter().any(|(k, _)| k == key) {
            return Err(Error::config(format!(
                "option `{key}` is given more than once"
            )));
        }
    }
    Ok(())
}

/// Parses a duration the way every part of headcount does (URL options and the CLI's flags):
/// [`humantime`] syntax, such as `500ms`, `5s`, `2m`, `1h 30m` or `1s 500ms`. A unit is required:
/// a bare `5` is refused rather than guessed (seconds? milliseconds?). The error says what is
/// wrong without repeating the text, so callers decide whether the value may be shown.
pub fn parse_humantime(text: &str) -> std::result::Result<Duration, String> {
    if text.is_empty() {
        return Err("an empty duration (expected one like 500ms, 5s or 2m)".to_owned());
    }
    if text.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(format!(
            "a duration needs a unit: `{text}s` or `{text}ms`, for example"
        ));
    }
    if text.trim() != text {
        return Err("a duration with leading or trailing spaces".to_owned());
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("not a duration ({e}); expected one like 500ms, 5s, 2m or 1h 30m"))
}

/// Parses a duration option with [`parse_humantime`].
pub fn parse_duration(option: &str, value: &str) -> Result<Duration> {
    parse_humantime(value).map_err(|why| {
        Error::config(format!(
            "invalid value for option `{option}`: `{value}`: {why}"
        ))
    })
}

/// Parses a deadline option and checks it is positive and at most [`MAX_TIMEOUT`].
pub fn parse_deadline(option: &str, value: &str) -> Result<Duration> {
    let d = parse_duration(option, value)?;
    check_deadline(option, d)?;
    Ok(d)
}

/// Checks a deadline: positive and at most [`MAX_TIMEOUT`].
pub fn check_deadline(option: &str, d: Duration) -> Result<()> {
    if d.is_zero() {
        return Err(Error::config(format!(
            "option `{option}` must be positive; a zero deadline would fail every operation"
        )));
    }
    if d > MAX_TIMEOUT {
        return Err(Error::config(format!(
            "option `{option}` of {d:?} is longer than the limit of {MAX_TIMEOUT:?}"
        )));
    }
    Ok(())
}

/// Splits one `host`, `host:port` or `[v6]:port` of a URL's authority. `url_kind` names the URL
/// in the message ("PostgreSQL URL"). Messages never echo the text: a password with an unencoded
/// `/` or `@` ends up here.
pub fn split_host_port<'a>(chunk: &'a str, url_kind: &str) -> Result<(&'a str, Option<&'a str>)> {
    if let Some(rest) = chunk.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err(Error::config(format!(
                "invalid {url_kind}: unterminated `[` in an IPv6 host"
            )));
        };
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err(Error::config(format!(
                    "invalid {url_kind}: unexpected text after an IPv6 host"
                ))),
            },
        };
    }
    Ok(match chunk.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (chunk, None),
    })
}

/// Parses a port, 1 to 65535, digits only. Not echoed either (see [`split_host_port`]): a
/// mistyped password with special characters is the usual cause.
pub fn parse_port(text: &str, url_kind: &str) -> Result<u16> {
    match text.parse::<u16>() {
        Ok(p) if p > 0 && text.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(Error::config(format!(
            "invalid {url_kind}: bad port: expected a number from 1 to 65535 (percent-encode special characters in the user name and password)"
        ))),
    }
}

/// A secret, such as a password: kept to be handed to a client, never shown. Its `Debug` prints
/// `"***"`, so a configuration holding one can derive `Debug`.
///
/// ```
/// # use headcount_core::backend::url::Secret;
/// let password = Secret::new("hunter2");
/// assert_eq!(format!("{:?}", Some(&password)), "Some(\"***\")");
/// assert_eq!(password.expose(), "hunter2");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `text`.
    pub fn new(text: impl Into<String>) -> Self {
        Secret(text.into())
    }

    /// The secret itself, to hand to a client or to [`scrub`] from messages.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&Redacted, f)
    }
}

/// For a backend's tests of its URL parser: the message of the configuration error `parsed` must
/// be, having checked that neither the error nor its `Debug` shows any of `secrets`. Panics
/// otherwise, naming `url`.
///
/// ```
/// # use headcount_core::backend::url::{assert_config_error, StoreUrl};
/// let url = "kv://u:s3cr3t@h:0";
/// let message = assert_config_error(url, StoreUrl::parse(url, "KV URL", &["kv"], "kv://h"), &["s3cr3t"]);
/// assert!(message.contains("bad port"));
/// ```
#[track_caller]
#[allow(clippy::panic)]
pub fn assert_config_error<T: fmt::Debug>(
    url: &str,
    parsed: Result<T>,
    secrets: &[&str],
) -> String {
    match parsed {
        Ok(c) => panic!("{url}: unexpectedly parsed as {c:?}"),
        Err(e) => {
            assert_eq!(e.kind(), crate::ErrorKind::Config, "{url}: {e}");
            let shown = format!("{e} {e:?}");
            for secret in secrets {
                assert!(!shown.contains(secret), "{url}: password leaked in {shown}");
            }
            e.to_string()
        }
    }
}

/// Stands in for a secret in a `Debug` implementation: prints `"***"`.
///
/// ```
/// # use headcount_core::backend::url::Redacted;
/// let password = Some("hunter2");
/// assert_eq!(format!("{:?}", password.map(|_| Redacted)), "Some(\"***\")");
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// Replaces `password` with `***` in a message a server or client library produced, a safeguard
/// for messages that echo what they were given. Passwords shorter than 3 characters are left
/// alone: replacing them would mangle ordinary words while protecting little.
pub fn scrub(message: String, password: Option<&str>) -> String {
    match password {
        Some(p) if p.len() >= 3 && message.contains(p) => message.replace(p, "***"),
        _ => message,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::time::Duration;

    use super::{
        assert_config_error, parse_bool, parse_deadline, parse_duration, parse_query,
        reject_duplicates, Secret, StoreUrl,
    };
    use crate::error::Result;

    #[test]
    fn durations() {
        let ok = |v: &str| parse_duration("timeout", v).ok();
        assert_eq!(ok("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(ok("5s"), Some(Duration::from_secs(5)));
        assert_eq!(ok("2m"), Some(Duration::from_secs(120)));
        assert_eq!(ok("1s 500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(ok("1h"), Some(Duration::from_secs(3600)));
        for bad in [
            "",
            "abc",
            "5x",
            "5",
            "0",
            "-1s",
            "s",
            " 5s",
            "99999999999999999999h",
        ] {
            let e = parse_duration("timeout", bad).unwrap_err().to_string();
            assert!(e.contains("`timeout`"), "{bad:?}: {e}");
        }
        assert!(parse_deadline("timeout", "0s").is_err());
        assert!(parse_deadline("timeout", "2h").is_err());
        assert!(parse_deadline("timeout", "1ms").is_ok());
    }

    fn parse(url: &str) -> Result<StoreUrl> {
        StoreUrl::parse(url, "test URL", &["kv", "kvs"], "kv://host")
    }

    #[test]
    fn authorities() {
        let u = parse("KV://al%40ice:p@ss:w%2Frd%23%25@h1:1,[::1]:2,h3/path%20x?a=1").unwrap();
        assert_eq!(u.scheme, "kv");
        assert_eq!(u.username.as_deref(), Some("al@ice"));
        // The credentials end at the last `@`; the user name at the first `:`.
        assert_eq!(u.password.as_ref().map(Secret::expose), Some("p@ss:w/rd#%"));
        assert_eq!(
            u.hosts,
            vec![
                ("h1".to_owned(), Some(1)),
                ("::1".to_owned(), Some(2)),
                ("h3".to_owned(), None)
            ]
        );
        assert_eq!(u.path, "/path%20x");
        assert_eq!(u.query, vec![("a".to_owned(), "1".to_owned())]);
        assert!(!format!("{u:?}").contains("p@ss"));
        assert_eq!(
            u.endpoints(9, "kv://host").unwrap()[2],
            ("h3".to_owned(), 9)
        );

        let u = parse("kvs://:s3cr3t@h").unwrap();
        assert_eq!(u.username.as_deref(), Some(""));
        assert_eq!(u.password.as_ref().map(Secret::expose), Some("s3cr3t"));
        let u = parse("kv://u@h").unwrap();
        assert_eq!((u.username.as_deref(), u.password), (Some("u"), None));
        let u = parse("kv://h").unwrap();
        assert_eq!((u.username, u.password), (None, None));
        let u = parse("kv://u@/db").unwrap();
        assert!(u.hosts.is_empty());
        assert!(u.endpoints(9, "kv://host").is_err());
        let u = parse("kv://a,,b").unwrap();
        assert_eq!(u.hosts[1], (String::new(), None));
        assert!(u.endpoints(9, "kv://host").is_err());
    }

    #[test]
    fn bad_authorities_never_show_the_password() {
        for (url, needle) in [
            ("kv://u:s3cr3t#x@h", "%23"),
            ("kv://u:s3cr3t@h/db#s3cr3t", "fragment"),
            ("kv://u:s3cr3t@h?a=1#x", "fragment"),
            ("kv://u:s3cr3t/x@h", "bad port"),
            ("kv://u:s3cr3t?x@h", "bad port"),
            ("kv://u:s3cr3t%zz@h", "percent-escape"),
            ("kv://u:s3cr3t%ff@h", "UTF-8"),
            ("kv://u:s3cr3t@[::1", "IPv6"),
            ("kv://u:s3cr3t@h:0", "bad port"),
            ("kv://u:s3cr3t@h?a=1&a=2", "more than once"),
            ("http://u:s3cr3t@h", "unknown scheme: expected kv://host"),
            ("kv:u:s3cr3t@h", "expected kv://host"),
        ] {
            let message = assert_config_error(url, parse(url), &["s3cr3t"]);
            assert!(message.contains(needle), "{url}: {message}");
        }
    }

    #[test]
    fn flags_and_option_lists() {
        assert!(parse_bool("tls", "true").unwrap());
        assert!(!parse_bool("tls", "0").unwrap());
        assert!(parse_bool("tls", "yes")
            .unwrap_err()
            .to_string()
            .contains("`tls`"));
        let u = parse("kv://h").unwrap();
        let e = u.unknown_option("x", &["a", "b", "c"]).to_string();
        assert!(
            e.ends_with("invalid test URL: unknown option `x`; the options are a, b and c"),
            "{e}"
        );
    }

    #[test]
    fn queries() {
        let q = parse_query("a=1&&b=x%20y&c=&d=a+b").unwrap();
        assert_eq!(
            q,
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "x y".into()),
                ("c".into(), "".into()),
                ("d".into(), "a+b".into()),
            ]
        );
        assert!(parse_query("secret").is_err());
        assert!(!parse_query("secret")
            .unwrap_err()
            .to_string()
            .contains("secret"));
        assert!(parse_query("=1").is_err());
        assert!(parse_query("a=%zz").is_err());
        assert!(parse_query("a=%").is_err());
        assert!(parse_query("a=%ff").is_err());
        assert!(reject_duplicates(&parse_query("a=1&a=2").unwrap()).is_err());
    }
}
