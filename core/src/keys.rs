//! Key naming: every key headcount writes lives under `{prefix}:{{group}}:...`.
//!
//! The braces around the group are a Redis Cluster hash tag, so all keys of one group share a hash
//! slot and multi-key scripts work there. Group names and prefixes are validated so they cannot
//! break that layout: a group may not contain braces or `:`, and neither may hold control
//! characters.

use std::fmt;

use crate::error::{Error, Result};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "hc";

/// The longest group name accepted, in characters.
pub const MAX_GROUP_LEN: usize = 128;

/// The longest prefix accepted, in characters.
pub const MAX_PREFIX_LEN: usize = 64;

/// Checks a group name: 1 to [`MAX_GROUP_LEN`] characters from `A-Z a-z 0-9 _ - .`, starting
/// with a letter or digit.
pub fn validate_group(name: &str) -> Result<()> {
    validate_name("group name", name, MAX_GROUP_LEN)
}

/// Checks a key prefix: the same alphabet as a group name, 1 to [`MAX_PREFIX_LEN`] characters.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    validate_name("key prefix", prefix, MAX_PREFIX_LEN)
}

fn validate_name(what: &str, name: &str, max: usize) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid(format!("{what} is empty")));
    }
    let len = name.chars().count();
    if len > max {
        return Err(Error::invalid(format!(
            "{what} is {len} characters long, more than the limit of {max}"
        )));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(Error::invalid(format!(
            "{what} {:?} contains {c:?}; only ASCII letters, digits, '_', '-' and '.' are allowed",
            name.escape_debug().to_string()
        )));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(Error::invalid(format!(
            "{what} {name:?} must start with a letter or a digit"
        )));
    }
    Ok(())
}

/// The validated key space of one group: builds `{prefix}:{{group}}:{suffix}` keys.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Keyspace {
    group: String,
    base: String,
}

impl Keyspace {
    /// The key space of `group` under the default prefix `hc`.
    pub fn new(group: &str) -> Result<Self> {
        Self::with_prefix(DEFAULT_PREFIX, group)
    }

    /// The key space of `group` under `prefix`.
    pub fn with_prefix(prefix: &str, group: &str) -> Result<Self> {
        validate_prefix(prefix)?;
        validate_group(group)?;
        Ok(Keyspace {
            group: group.to_owned(),
            base: format!("{prefix}:{{{group}}}:"),
        })
    }

    /// The group name.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The common start of every key of this group, `hc:{group}:`, for [`Store::list`](crate::Store::list).
    pub fn prefix(&self) -> &str {
        &self.base
    }

    /// The key `hc:{group}:{suffix}`.
    pub fn key(&self, suffix: impl fmt::Display) -> String {
        format!("{}{suffix}", self.base)
    }

    /// The key of membership slot `i`: `hc:{group}:slot:{i}`.
    pub fn slot(&self, i: u32) -> String {
        self.key(format_args!("slot:{i}"))
    }
}

impl fmt::Debug for Keyspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Keyspace").field(&self.base).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{validate_group, Keyspace, MAX_GROUP_LEN};
    use crate::error::Error;

    #[test]
    fn builds_hash_tagged_keys() {
        let ks = Keyspace::new("orders-eu.1").unwrap();
        assert_eq!(ks.prefix(), "hc:{orders-eu.1}:");
        assert_eq!(ks.slot(3), "hc:{orders-eu.1}:slot:3");
        assert_eq!(ks.key("view"), "hc:{orders-eu.1}:view");
        let ks = Keyspace::with_prefix("app_x", "g").unwrap();
        assert_eq!(ks.key("n:7"), "app_x:{g}:n:7");
    }

    #[test]
    fn rejects_bad_group_names() {
        let long = "g".repeat(MAX_GROUP_LEN + 1);
        for bad in [
            "", "a:b", "a{b", "a}b", "a b", "a\nb", "a\u{7}", "grüße", "-lead", ".hidden", &long,
        ] {
            match Keyspace::new(bad) {
                Err(Error::InvalidArgument { message }) => {
                    assert!(message.contains("group name"), "{message}")
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        assert!(Keyspace::new(&"g".repeat(MAX_GROUP_LEN)).is_ok());
    }

    #[test]
    fn rejects_bad_prefixes() {
        for bad in ["", "a:b", "{x}", "p\t"] {
            assert!(Keyspace::with_prefix(bad, "g").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn control_characters_are_escaped_in_the_message() {
        let err = validate_group("a\u{1b}[31m").unwrap_err().to_string();
        assert!(!err.contains('\u{1b}'), "{err}");
    }
}
