//! The distributor's key spaces and keys: [`namespace`], and the key of each record.

use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

use crate::error::{Error, Result};
use crate::keys::Keyspace;

/// Bytes percent-encoded in the key of a work unit: controls, `%`, and space (so a key read back
/// with a store's own client is unambiguous). Non-ASCII is always encoded.
const UNIT_KEY_SET: &AsciiSet = &CONTROLS.add(b'%').add(b' ');

/// The key space of a distributor namespace, or an [`Error::InvalidConfig`] naming `what`
/// (`services namespace`...) and the rule: 1 to 128 characters from `A-Z a-z 0-9 _ - .`,
/// starting with a letter or a digit.
pub fn namespace(prefix: &str, what: &str, ns: &str) -> Result<Keyspace> {
    Keyspace::with_prefix(prefix, ns).map_err(|e| {
        let detail = match e {
            Error::InvalidArgument { message } => message.replace("group name", "namespace"),
            other => other.to_string(),
        };
        Error::config(format!("{what}: {detail}"))
    })
}

/// The key of a service's record in its services namespace: `hc:{ns}:service:{name}`.
pub fn service_key(services: &Keyspace, name: &str) -> String {
    services.key(format_args!("service:{name}"))
}

/// The heartbeat key of a service: `hc:{ns}:heartbeat:{name}`.
pub fn heartbeat_key(services: &Keyspace, name: &str) -> String {
    services.key(format_args!("heartbeat:{name}"))
}

/// The key of a work unit: `hc:{ns}:unit:{percent-encoded name}`.
pub fn unit_key(units: &Keyspace, name: &str) -> String {
    units.key(format_args!(
        "unit:{}",
        utf8_percent_encode(name, UNIT_KEY_SET)
    ))
}

/// The key of the whole table: `hc:{ns}:table`.
pub fn table_key(distribution: &Keyspace) -> String {
    distribution.key("table")
}

/// The key of one service's units in the distribution namespace: `hc:{ns}:service:{name}`.
pub fn assignment_key(distribution: &Keyspace, service: &str) -> String {
    distribution.key(format_args!("service:{service}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::unit_key;
    use crate::keys::Keyspace;

    #[test]
    fn only_canonical_unit_keys_count() {
        let ks = Keyspace::new("units").unwrap();
        assert_eq!(unit_key(&ks, "a,b"), format!("{}a,b", ks.key("unit:")));
        assert_ne!(unit_key(&ks, "a,b"), format!("{}a%2Cb", ks.key("unit:")));
    }
}
