//! The matching table: [`DistributionTable`], [`read_table`], [`compute_table`] and
//! [`table_diff`] ([`TableDiff`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::table_key;
use crate::assign::match_work_units;
use crate::error::{Error, Result};
use crate::keys::Keyspace;
use crate::store::MAX_VALUE_LEN;
use crate::DynStore;

/// The matching table as stored in the `table` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DistributionTable {
    /// Starts at 1 and grows by one with every change.
    pub version: u64,
    /// Every registered service and its units, in the order it took them; down services have none.
    pub services: BTreeMap<String, Vec<String>>,
    /// The registered services that failed their health check.
    #[serde(default)]
    pub down: BTreeSet<String>,
}

impl DistributionTable {
    /// The units of `service` (empty when it has none or is not in the table).
    pub fn units_of(&self, service: &str) -> &[String] {
        self.services.get(service).map_or(&[], Vec::as_slice)
    }

    /// The owner of each unit.
    pub fn owners(&self) -> BTreeMap<&str, &str> {
        self.services
            .iter()
            .flat_map(|(s, units)| units.iter().map(move |u| (u.as_str(), s.as_str())))
            .collect()
    }

    pub(super) fn same_content(&self, other: &DistributionTable) -> bool {
        self.services == other.services && self.down == other.down
    }

    /// Parses the `table` record.
    pub fn parse(key: &str, text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|_| Error::foreign(key, "a distributor table", text))
    }

    pub(super) fn encode(&self) -> Result<String> {
        let text = serde_json::to_string(self)
            .map_err(|e| Error::invalid(format!("cannot encode the table: {e}")))?;
        if text.len() > MAX_VALUE_LEN {
            return Err(Error::invalid(format!(
                "the table is {} bytes long, more than a record holds ({MAX_VALUE_LEN}); use fewer or shorter work units",
                text.len()
            )));
        }
        Ok(text)
    }
}

/// The whole table, or `None` before the first one is written.
pub async fn read_table(
    store: &DynStore,
    distribution: &Keyspace,
) -> Result<Option<DistributionTable>> {
    let key = table_key(distribution);
    store
        .get(&key)
        .await?
        .map(|text| DistributionTable::parse(&key, &text))
        .transpose()
}

/// Computes the table for these healthy services and units; `down` are the registered services
/// that failed their check. Pure and deterministic; the version is left to the caller.
pub fn compute_table(
    healthy: &[String],
    down: &BTreeSet<String>,
    units: &[String],
    version: u64,
) -> Result<DistributionTable> {
    let matching = match_work_units(healthy, units)
        .map_err(|e| Error::invalid(format!("cannot match services to units: {e}")))?;
    let mut services: BTreeMap<String, Vec<String>> = healthy
        .iter()
        .zip(matching)
        .map(|(s, idx)| {
            (
                s.clone(),
                idx.into_iter().map(|i| units[i].clone()).collect(),
            )
        })
        .collect();
    for d in down {
        services.entry(d.clone()).or_default();
    }
    Ok(DistributionTable {
        version,
        services,
        down: down.clone(),
    })
}

/// How many units changed hands between two tables: see [`table_diff`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TableDiff {
    /// Units whose owner changed.
    pub moved: usize,
    /// Units that were not in the old table.
    pub added: usize,
    /// Units of the old table that are gone.
    pub removed: usize,
}

/// Counts the units moved, added and removed between two tables (every unit of `new` is added
/// when there is no `old`).
pub fn table_diff(old: Option<&DistributionTable>, new: &DistributionTable) -> TableDiff {
    let new_owners = new.owners();
    let Some(old) = old else {
        return TableDiff {
            moved: 0,
            added: new_owners.len(),
            removed: 0,
        };
    };
    let old_owners = old.owners();
    let mut moved = 0;
    let mut added = 0;
    for (unit, owner) in &new_owners {
        match old_owners.get(unit) {
            Some(prev) if prev != owner => moved += 1,
            Some(_) => {}
            None => added += 1,
        }
    }
    let removed = old_owners
        .keys()
        .filter(|u| !new_owners.contains_key(*u))
        .count();
    TableDiff {
        moved,
        added,
        removed,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::collections::BTreeSet;

    use super::{compute_table, table_diff, TableDiff};

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    #[test]
    fn the_table_does_not_depend_on_order() {
        let services = names("svc-", 3);
        let units = names("unit-", 30);
        let t1 = compute_table(&services, &BTreeSet::new(), &units, 1).unwrap();
        let mut rs = services.clone();
        rs.reverse();
        let mut ru = units.clone();
        ru.rotate_left(7);
        let t2 = compute_table(&rs, &BTreeSet::new(), &ru, 1).unwrap();
        assert_eq!(t1, t2);
        assert!(t1.services.values().all(|u| u.len() == 10));
    }

    #[test]
    fn diff_counts_moves_additions_and_removals() {
        let services = names("s", 3);
        let units = names("u", 30);
        let t1 = compute_table(&services, &BTreeSet::new(), &units, 1).unwrap();
        let down: BTreeSet<String> = [services[0].clone()].into();
        let t2 = compute_table(&services[1..], &down, &units, 2).unwrap();
        let TableDiff {
            moved,
            added,
            removed,
        } = table_diff(Some(&t1), &t2);
        assert!(moved >= t1.units_of(&services[0]).len());
        assert_eq!((added, removed), (0, 0));
        assert!(t2.units_of(&services[0]).is_empty());
        let t3 = compute_table(&services, &BTreeSet::new(), &units[..29], 3).unwrap();
        assert_eq!(table_diff(Some(&t1), &t3).removed, 1);
    }
}
