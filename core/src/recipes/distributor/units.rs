//! Work units: [`add_unit`], [`remove_unit`], [`list_units`] and the name rule.

use percent_encoding::percent_decode_str;

use super::unit_key;
use crate::error::{Error, Result};
use crate::keys::Keyspace;
use crate::DynStore;

/// The longest work unit name accepted, in bytes.
pub const MAX_UNIT_NAME_LEN: usize = 1024;

/// Checks a work unit name as [`add_unit`] does, so a caller can validate a batch before
/// writing any of it.
pub fn check_unit_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid("work unit name is empty"));
    }
    if name.len() > MAX_UNIT_NAME_LEN {
        return Err(Error::invalid(format!(
            "work unit name is {} bytes long, more than the limit of {MAX_UNIT_NAME_LEN}",
            name.len()
        )));
    }
    // A newline or another control character is a quoting mistake far more often than a name,
    // and it breaks every line-based tool that lists units.
    if name.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "work unit name {:?} contains a control character",
            name.escape_debug().to_string()
        )));
    }
    Ok(())
}

/// Adds a work unit (idempotent). Any name of 1 to [`MAX_UNIT_NAME_LEN`] bytes without NUL:
/// commas, spaces, `:` and any Unicode are fine. Returns whether it was new.
pub async fn add_unit(store: &DynStore, units: &Keyspace, name: &str) -> Result<bool> {
    check_unit_name(name)?;
    let key = unit_key(units, name);
    if store.compare_and_set(&key, None, name, None).await? {
        return Ok(true);
    }
    Ok(false)
}

/// Removes a work unit. Returns whether it was there.
pub async fn remove_unit(store: &DynStore, units: &Keyspace, name: &str) -> Result<bool> {
    check_unit_name(name)?;
    store.delete(&unit_key(units, name)).await
}

/// Every work unit under `units`, sorted by key. A key whose encoded name does not decode to a
/// valid name is skipped with a warning (someone else wrote it).
pub async fn list_units(store: &DynStore, units: &Keyspace) -> Result<Vec<String>> {
    let prefix = units.key("unit:");
    let mut names = Vec::new();
    for (key, _) in store.list(&prefix).await? {
        let encoded = &key[prefix.len()..];
        match percent_decode_str(encoded).decode_utf8() {
            // Only the canonical key of a name counts: `unit:a%2Cb` written by hand beside
            // `unit:a,b` would otherwise give the matching the same name twice, and it refuses
            // duplicates, which would stop every redistribution.
            Ok(name) if check_unit_name(&name).is_ok() && unit_key(units, &name) == key => {
                names.push(name.into_owned())
            }
            _ => {
                tracing::warn!(key = %key.escape_debug(), "skipping a work unit key that does not decode to a name whose key it is")
            }
        }
    }
    Ok(names)
}
