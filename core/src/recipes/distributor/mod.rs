//! The Distributor: a deterministic matching of services to work units, kept in the
//! store, recomputed when a service stops answering its health checks.
//!
//! Everything goes through [`DynStore`](crate::DynStore), so it works on every backend. See
//! `docs/distributor.md` for the whole story; in short:
//!
//! # Keys
//!
//! Each namespace is a [`Keyspace`](crate::Keyspace) (`hc:{namespace}:`), validated like a group
//! name.
//!
//! | namespace | key | value |
//! |---|---|---|
//! | services (one or more) | `service:{name}` | where the service answers health checks: `http://host:port` (gRPC), or `heartbeat` |
//! | services | `heartbeat:{name}` | `alive`, with a TTL the service renews (heartbeat liveness only) |
//! | work units | `unit:{percent-encoded name}` | the unit's name as given (informational; the key is authoritative) |
//! | distribution | `table` | the whole table: `{"version":N,"services":{"a":["u1",...],...},"down":["c"]}` |
//! | distribution | `service:{name}` | one service's units: `{"version":N,"units":["u1","u,2"]}` |
//!
//! Unit names are JSON strings in the table, so commas (the article joins names with commas) and
//! any other character survive; in keys they are percent-encoded.
//!
//! # The matching
//!
//! [`match_work_units`](crate::assign::match_work_units): the units on a ring with 50 points each,
//! the healthy services sorted, each service in turn takes its nearest remaining unit until none
//! remain. The same table for the same services and units whatever their order and whichever
//! distributor computes it; unit counts per service differ by at most one. Registered services that
//! fail their health check stay in the table with no units and are listed under `down`.
//!
//! # Versioned writes
//!
//! A poll reads the `table` record first, then the services and units, probes, computes, and
//! writes a changed table with one `compare_and_set` from the exact text it read to the new table
//! at `version + 1`. If any distributor wrote in between, the CAS fails and the poll starts over
//! from the newer table: a slow distributor cannot replace a newer table with one computed from
//! older information. Per-service records are then brought to the table's version, each with a
//! `get` + `compare_and_set` that never replaces a record of a higher version. Every poll repairs
//! records left behind (a distributor that died between the table and its records).
//!
//! **What a reader sees**: the `table` record is always one complete table, and its versions only
//! increase. A per-service record is always one service's complete list at the version it states,
//! and its version never decreases. During an update (between the table CAS and the last record,
//! normally milliseconds; until the next poll if the writer died), records of different services
//! may be at different versions (any older one until a sync completes, not only the previous
//! one): a unit that moved may be listed by its old owner and its new one, or by neither. A
//! service that must never overlap with another compares its record's version with the `table`
//! record's, or fences its work with the version (a fencing token: see [`crate::fence`]).
//!
//! # Bad input
//!
//! No registered or no healthy service while there are units: the last table is kept (a
//! distributor that reaches nobody is more likely cut off than alone in the world) and a warning
//! logged. No units: every service gets an empty list. A service whose address does not parse, or
//! whose health server never answers, counts as down. A foreign value at the `table` key stops the
//! writes until a person repairs it. A store error skips the poll; the last table stays.

#[cfg(feature = "grpc")]
pub mod grpc;

mod assignment;
mod config;
mod daemon;
mod keys;
mod liveness;
mod probes;
mod service;
mod table;
mod units;

use crate::error::Error;

pub use assignment::{
    read_assignment, watch_assignment, watch_assignment_with_clock, ServiceAssignment,
    ServiceAssignmentWatch,
};
pub use config::{
    DistributorConfig, DEFAULT_DOWN_AFTER, MAX_DOWN_AFTER, MAX_PING_TIMEOUT, MAX_POLL_INTERVAL,
    MIN_PING_TIMEOUT, MIN_POLL_INTERVAL,
};
pub use daemon::{Distributor, PollOutcome, RunningDistributor, DEPARTED_RECORD_TTL};
pub use keys::{assignment_key, heartbeat_key, namespace, service_key, table_key, unit_key};
pub use liveness::{Liveness, HEARTBEAT_ADDRESS};
pub use probes::{DefaultProber, Health, Prober};
pub use service::{
    beat, check_service_name, deregister, list_services, register, spawn_heartbeat,
    spawn_heartbeat_with_clock, HeartbeatHandle, Registration, Service, MAX_SERVICE_NAME_LEN,
};
pub use table::{compute_table, read_table, table_diff, DistributionTable, TableDiff};
pub use units::{add_unit, check_unit_name, list_units, remove_unit, MAX_UNIT_NAME_LEN};

const CAS_ATTEMPTS: usize = 100;

fn contended(key: &str) -> Error {
    Error::contended(
        key,
        format!("lost {CAS_ATTEMPTS} compare-and-set races in a row"),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use percent_encoding::percent_decode_str;

    use super::{unit_key, ServiceAssignment};
    use crate::error::Error;
    use crate::keys::Keyspace;

    #[test]
    fn unit_names_with_commas_and_anything_round_trip() {
        let ks = Keyspace::new("units").unwrap();
        for name in [
            "a,b",
            "with space",
            "100%",
            "ü:{x}",
            "tab\there",
            "line\nbreak",
        ] {
            let key = unit_key(&ks, name);
            crate::store::check_key(&key).unwrap();
            let encoded = &key[ks.key("unit:").len()..];
            assert_eq!(percent_decode_str(encoded).decode_utf8().unwrap(), name);
        }
        let a = ServiceAssignment {
            version: 3,
            units: vec!["a,b".into(), "c\"d".into(), "ü".into()],
        };
        let text = a.encode().unwrap();
        assert_eq!(ServiceAssignment::parse("k", &text).unwrap(), a);
        assert!(matches!(
            ServiceAssignment::parse("k", "a,b"),
            Err(Error::ForeignValue { .. })
        ));
    }
}
