//! URL pieces every backend's `from_url` shares: query strings, percent-decoding and durations,
//! so `?timeout=5s` means the same thing whatever the scheme.
//!
//! Error messages built here name the option and, for our own options, the offending value; they
//! never echo a whole URL, so a password elsewhere in it cannot leak.

use std::time::Duration;

use crate::error::{Error, Result};

/// The default operation deadline of every backend.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest deadline accepted. A coordination call that may block for longer than this is
/// almost certainly a unit mistake, and lease-based recipes would miss every renewal meanwhile.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

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

/// Stands in for a secret in a `Debug` implementation: prints `"***"`.
///
/// ```
/// # use headcount_core::backend::url::Redacted;
/// let password = Some("hunter2");
/// assert_eq!(format!("{:?}", password.map(|_| Redacted)), "Some(\"***\")");
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Redacted;

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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

    use super::*;

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
