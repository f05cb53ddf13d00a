//! How a service shows it is alive: [`Liveness`], and the check of a gRPC health address.

use crate::error::{Error, Result};

/// The value of a service record whose liveness is a heartbeat key.
pub const HEARTBEAT_ADDRESS: &str = "heartbeat";

/// How a service shows it is alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// It serves `grpc.health.v1.Health/Check` at this address (`http://host:port`).
    Grpc(String),
    /// It renews `heartbeat:{name}` in its services namespace before the key's TTL runs out.
    Heartbeat,
}

impl Liveness {
    /// A gRPC address, checked and normalised: `host:port` becomes `http://host:port`; the scheme
    /// must be `http` (TLS health checks are not supported yet) and a port is required.
    pub fn grpc(address: &str) -> Result<Self> {
        Ok(Liveness::Grpc(parse_grpc_address(address)?))
    }

    /// The text stored in the service record.
    pub fn as_record(&self) -> &str {
        match self {
            Liveness::Grpc(a) => a,
            Liveness::Heartbeat => HEARTBEAT_ADDRESS,
        }
    }

    /// Parses a service record's value.
    pub fn from_record(text: &str) -> Result<Self> {
        if text == HEARTBEAT_ADDRESS {
            Ok(Liveness::Heartbeat)
        } else {
            Liveness::grpc(text)
        }
    }
}

/// Checks and normalises a gRPC health address.
pub(super) fn parse_grpc_address(address: &str) -> Result<String> {
    let a = address.trim();
    let full = if a.contains("://") {
        a.to_owned()
    } else {
        format!("http://{a}")
    };
    let bad = |why: &str| {
        Error::invalid(format!(
            "service address {:?} {why}; expected http://host:port or host:port",
            address.escape_debug().to_string()
        ))
    };
    let (scheme, rest) = full.split_once("://").ok_or_else(|| bad("has no scheme"))?;
    if scheme == "https" {
        return Err(bad(
            "asks for TLS, which the health prober does not speak yet (register the plaintext health port)",
        ));
    }
    if scheme != "http" {
        return Err(bad("has a scheme other than http"));
    }
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
        return Err(bad("is not host:port"));
    }
    let (host, port) = authority
        .rsplit_once(':')
        .ok_or_else(|| bad("has no port"))?;
    if host.is_empty() || host.chars().any(|c| c.is_control()) {
        return Err(bad("has no host"));
    }
    if host.starts_with('[') != host.ends_with(']') {
        return Err(bad("has an unbalanced IPv6 bracket"));
    }
    // What the prober's URI parser accepts as a host: a name, an IPv4 address, or a bracketed
    // IPv6 one. A list (`a:1,b:2`) would be stored and then fail on every ping.
    let plain = host.trim_start_matches('[').trim_end_matches(']');
    let ok = if host.starts_with('[') {
        plain
            .chars()
            .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
    } else {
        plain
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
    };
    if !ok {
        return Err(bad(
            "has characters a host name cannot have (one address only)",
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(bad("has no valid port")),
    }
    Ok(format!("{scheme}://{authority}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::Liveness;

    #[test]
    fn addresses_parse_or_say_why() {
        assert_eq!(
            Liveness::grpc("127.0.0.1:5000").unwrap(),
            Liveness::Grpc("http://127.0.0.1:5000".into())
        );
        assert!(Liveness::grpc("https://svc.local:443/")
            .unwrap_err()
            .to_string()
            .contains("TLS"));
        assert!(Liveness::grpc("[::1]:80").is_ok());
        for bad in [
            "",
            "nohost",
            "host:",
            "host:0",
            "host:99999",
            ":80",
            "ftp://h:1",
            "http://h:1/path",
            "http://u@h:1",
            "[::1:80",
        ] {
            assert!(Liveness::grpc(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            Liveness::from_record("heartbeat").unwrap(),
            Liveness::Heartbeat
        );
    }
}
