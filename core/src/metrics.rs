//! Metrics through the [`metrics`] facade: headcount records, the application picks the exporter
//! (the `headcount` CLI serves them for Prometheus with `--metrics-addr`). Without an installed
//! recorder every call here is a no-op costing a few nanoseconds.
//!
//! The names below are the whole set, each documented in `docs/observability.md` with its type,
//! labels and meaning. Labels never hold a password, a URL or a stored value: only the backend
//! name, the operation name, an [`ErrorKind`] name, the group name and fixed words.
//!
//! Call [`describe`] once after installing a recorder so exporters that print help text (such as
//! Prometheus') have it.
//!
//! **The `metrics` version.** headcount records through the `metrics` crate version 0.24. The
//! recorder your application installs must be built on the same version (for Prometheus,
//! `metrics-exporter-prometheus` 0.18, which the `headcount` command uses, is): a recorder built
//! on another `metrics` version (0.23, 0.25) is installed in that version's own global slot, so
//! headcount records nothing into it, and nothing says so. `cargo tree -i metrics` shows one
//! version with headcount and your exporter under it; when it says the name is ambiguous, your
//! build has two versions of `metrics`.
//!
//! **Histograms.** Every histogram headcount records is a duration in seconds. Exporters that
//! need bucket bounds (Prometheus') export a histogram without them as a summary, which cannot be
//! aggregated across members; give them [`DURATION_BUCKETS`] for the names starting with
//! [`NAME_PREFIX`]:
//!
//! ```ignore
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//!
//! let handle = PrometheusBuilder::new()
//!     .set_buckets_for_metric(
//!         Matcher::Prefix(headcount::metrics::NAME_PREFIX.to_string()),
//!         headcount::metrics::DURATION_BUCKETS,
//!     )?
//!     .install_recorder()?;
//! headcount::metrics::describe();
//! ```
//!
//! The store metrics are recorded by [`Instrumented`](crate::instrumented::Instrumented), which
//! `headcount::connect` wraps around every store. The group metrics are recorded through
//! [`GroupMetrics`]; the fences, the majority IDs and the distributor record their own.

use std::time::Duration;

use crate::error::{Error, ErrorKind};
use crate::Op;

/// The start of every metric name headcount records, for an exporter's per-name settings (for
/// example `metrics_exporter_prometheus::Matcher::Prefix`).
pub const NAME_PREFIX: &str = "headcount_";

/// The bucket bounds, in seconds, for every histogram headcount records (all of them are
/// durations, from a local SQLite call to a hand-off that waits out a lease): 0.5 ms to 30 s.
/// The `headcount` command's Prometheus endpoint uses them; see the module docs for installing
/// them in your application's exporter.
pub const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Histogram (seconds) of every store operation, labels `backend`, `operation`.
pub const STORE_OPERATION_DURATION: &str = "headcount_store_operation_duration_seconds";
/// Counter of store operations that returned an error, labels `backend`, `operation`, `kind`.
pub const STORE_OPERATION_ERRORS: &str = "headcount_store_operation_errors_total";

/// Histogram (seconds) of a group member's heartbeat round trip (renewal and listing), label
/// `group`.
pub const GROUP_HEARTBEAT_DURATION: &str = "headcount_group_heartbeat_duration_seconds";
/// Counter of heartbeats that failed (store error, or the slot was no longer ours), labels
/// `group`, `kind`.
pub const GROUP_HEARTBEAT_FAILURES: &str = "headcount_group_heartbeat_failures_total";
/// Counter of calls a group member made early because the store notified a change, label
/// `group` (see [`GroupConfig::with_notifications`](crate::recipes::group::GroupConfig::with_notifications)).
pub const GROUP_NOTICE_CALLS: &str = "headcount_group_notice_calls_total";
/// Counter of views this member activated, label `group`.
pub const GROUP_VIEW_CHANGES: &str = "headcount_group_view_changes_total";
/// Gauge of the epoch of the member's active view (the token of its share grants; a key grant's
/// token is this or older), label `group`.
pub const GROUP_EPOCH: &str = "headcount_group_epoch";
/// Gauge of the live members (slots) in the member's active view, label `group`.
pub const GROUP_MEMBERS_LIVE: &str = "headcount_group_members_live";
/// Histogram (seconds) from adopting a new view to activating it (drain, acknowledge, wait for
/// the others' acknowledgements), label `group`.
pub const GROUP_HANDOFF_DURATION: &str = "headcount_group_handoff_duration_seconds";
/// Counter of revocations: times the member stopped granting keys it held (a view moved them
/// away, its lease lapsed or was lost), labels `group`, `reason`.
pub const GROUP_GRANTS_REVOKED: &str = "headcount_group_grants_revoked_total";
/// Counter of drains a member cut short while grants were still in flight, labels `group` and
/// `reason` (`timeout`: the drain timeout passed; `lost`: the slot was no longer the member's;
/// `lapsed`: the store did not answer the renewals until the lease ran out).
pub const GROUP_DRAINS_CUT: &str = "headcount_group_drains_cut_total";
/// Gauge of the declared keys (partitions) the member owns under its active view, label `group`;
/// recorded only by members of a group with a declared key set
/// ([`GroupConfig::with_keys`](crate::recipes::group::GroupConfig::with_keys),
/// `with_partitions`, `run --partitions`).
pub const GROUP_KEYS_OWNED: &str = "headcount_group_keys_owned";

/// Counter of writes a fence refused because their token was older than the newest it saw,
/// label `fence` (`memory`, `postgres`, `redis`).
pub const FENCE_REJECTIONS: &str = "headcount_fence_rejections_total";

/// Counter of majority-ID rounds (read a majority, propose to all), label `result` (`id`,
/// `retry`, `failed`).
pub const IDS_ROUNDS: &str = "headcount_ids_rounds_total";
/// Counter of majority-ID rounds lost and tried again after a backoff.
pub const IDS_RETRIES: &str = "headcount_ids_retries_total";
/// Counter of IDs returned by majority-ID generators.
pub const IDS_GENERATED: &str = "headcount_ids_generated_total";
/// Counter of majority-ID calls that returned no ID, label `kind`.
pub const IDS_FAILURES: &str = "headcount_ids_failures_total";

/// Counter of distributor health checks, labels `probe` (`grpc`, `heartbeat`, `invalid`) and
/// `result` (`serving`, `down`).
pub const DISTRIBUTOR_PINGS: &str = "headcount_distributor_pings_total";
/// Histogram (seconds) of distributor health checks, label `probe`.
pub const DISTRIBUTOR_PING_DURATION: &str = "headcount_distributor_ping_duration_seconds";
/// Counter of distributor table writes, label `result` (`written`, `conflict`).
pub const DISTRIBUTOR_TABLE_WRITES: &str = "headcount_distributor_table_writes_total";

/// Counter of interval-indexer ticks, label `result` (`ok`, `error`).
pub const INTERVAL_TICKS: &str = "headcount_interval_ticks_total";

/// Counter of store handles whose change notifications are off (the server refused them, or
/// the backend cannot deliver them here), label `backend`: counted once per handle, when it
/// first finds out. See [`crate::notify`].
pub const NOTIFICATIONS_UNAVAILABLE: &str = "headcount_notifications_unavailable_total";

/// Every metric name, for tests and exporters.
pub const ALL: &[&str] = &[
    STORE_OPERATION_DURATION,
    STORE_OPERATION_ERRORS,
    GROUP_HEARTBEAT_DURATION,
    GROUP_HEARTBEAT_FAILURES,
    GROUP_NOTICE_CALLS,
    GROUP_VIEW_CHANGES,
    GROUP_EPOCH,
    GROUP_MEMBERS_LIVE,
    GROUP_HANDOFF_DURATION,
    GROUP_GRANTS_REVOKED,
    GROUP_DRAINS_CUT,
    GROUP_KEYS_OWNED,
    FENCE_REJECTIONS,
    IDS_ROUNDS,
    IDS_RETRIES,
    IDS_GENERATED,
    IDS_FAILURES,
    DISTRIBUTOR_PINGS,
    DISTRIBUTOR_PING_DURATION,
    DISTRIBUTOR_TABLE_WRITES,
    INTERVAL_TICKS,
    NOTIFICATIONS_UNAVAILABLE,
];

/// Registers the unit and help text of every metric with the installed recorder. Call it once,
/// after installing the recorder; without one it does nothing.
pub fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_histogram!(
        STORE_OPERATION_DURATION,
        Unit::Seconds,
        "Time of each store operation, by backend and operation."
    );
    describe_counter!(
        STORE_OPERATION_ERRORS,
        "Store operations that returned an error, by backend, operation and error kind."
    );
    describe_histogram!(
        GROUP_HEARTBEAT_DURATION,
        Unit::Seconds,
        "Round trip of a group member's heartbeat (renew the slot, read the table)."
    );
    describe_counter!(
        GROUP_HEARTBEAT_FAILURES,
        "Group heartbeats that failed, by error kind (`lost` when the slot was no longer ours)."
    );
    describe_counter!(
        GROUP_NOTICE_CALLS,
        "Calls a group member made before its timer because the store notified a change."
    );
    describe_counter!(GROUP_VIEW_CHANGES, "Views a group member activated.");
    describe_gauge!(
        GROUP_EPOCH,
        "Epoch of the member's active view: the token of its share grants (a key grant's token is this or older)."
    );
    describe_gauge!(
        GROUP_MEMBERS_LIVE,
        "Live members in the member's active view."
    );
    describe_histogram!(
        GROUP_HANDOFF_DURATION,
        Unit::Seconds,
        "Time from adopting a view to activating it (drain, acknowledge, wait for the others)."
    );
    describe_counter!(
        GROUP_GRANTS_REVOKED,
        "Times a member stopped granting keys it held, by reason."
    );
    describe_counter!(
        GROUP_DRAINS_CUT,
        "Drains a group member cut short with grants still in flight, by reason."
    );
    describe_gauge!(
        GROUP_KEYS_OWNED,
        "Declared keys (partitions) the member owns under its active view."
    );
    describe_counter!(
        FENCE_REJECTIONS,
        "Writes refused by a fence because their token was older than the newest seen."
    );
    describe_counter!(IDS_ROUNDS, "Majority-ID rounds, by result.");
    describe_counter!(
        IDS_RETRIES,
        "Majority-ID rounds lost and retried after a backoff."
    );
    describe_counter!(IDS_GENERATED, "IDs returned by majority-ID generators.");
    describe_counter!(
        IDS_FAILURES,
        "Majority-ID calls that returned no ID, by error kind."
    );
    describe_counter!(
        DISTRIBUTOR_PINGS,
        "Distributor health checks, by probe and result."
    );
    describe_histogram!(
        DISTRIBUTOR_PING_DURATION,
        Unit::Seconds,
        "Time of each distributor health check, by probe."
    );
    describe_counter!(
        DISTRIBUTOR_TABLE_WRITES,
        "Distributor table writes, by result."
    );
    describe_counter!(INTERVAL_TICKS, "Interval-indexer ticks, by result.");
    describe_counter!(
        NOTIFICATIONS_UNAVAILABLE,
        "Store handles whose change notifications are off (members keep polling), by backend."
    );
}

/// The label value of an error: its [`ErrorKind`] name.
pub fn error_label(e: &Error) -> &'static str {
    e.kind().as_str()
}

/// Records one store operation: its duration, and the error's kind when it failed. The
/// `operation` label is the operation's [name](Op::name).
pub fn record_store_operation(
    backend: &'static str,
    operation: Op,
    took: Duration,
    error: Option<ErrorKind>,
) {
    let operation = operation.name();
    ::metrics::histogram!(STORE_OPERATION_DURATION, "backend" => backend, "operation" => operation)
        .record(took);
    if let Some(kind) = error {
        ::metrics::counter!(
            STORE_OPERATION_ERRORS,
            "backend" => backend,
            "operation" => operation,
            "kind" => kind.as_str()
        )
        .increment(1);
    }
}

/// Records a fence's refusal of an older token; `fence` is `memory`, `postgres` or `redis`.
pub fn record_fence_rejection(fence: &'static str) {
    ::metrics::counter!(FENCE_REJECTIONS, "fence" => fence).increment(1);
}

/// The metrics of one group member, labelled with its group name. Cheap to create (it holds
/// the name); each method records through the installed recorder at the time of the call.
#[derive(Debug, Clone)]
pub struct GroupMetrics {
    group: String,
}

impl GroupMetrics {
    /// The metrics of a member of `group`.
    pub fn new(group: impl Into<String>) -> Self {
        GroupMetrics {
            group: group.into(),
        }
    }

    /// A heartbeat round trip that took `took`: `error` is the store's error, if it failed.
    /// Call once per renewal, success or not.
    pub fn heartbeat(&self, took: Duration, error: Option<&Error>) {
        ::metrics::histogram!(GROUP_HEARTBEAT_DURATION, "group" => self.group.clone()).record(took);
        if let Some(e) = error {
            self.heartbeat_failed(error_label(e));
        }
    }

    /// A heartbeat that failed without a store error: `kind` names why (`lost`: the slot was
    /// no longer ours).
    pub fn heartbeat_failed(&self, kind: &'static str) {
        ::metrics::counter!(GROUP_HEARTBEAT_FAILURES, "group" => self.group.clone(), "kind" => kind)
            .increment(1);
    }

    /// A call made early because the store notified a change.
    pub fn notice_call(&self) {
        ::metrics::counter!(GROUP_NOTICE_CALLS, "group" => self.group.clone()).increment(1);
    }

    /// A view became active: counts the change and sets the epoch and live-member gauges.
    pub fn view_changed(&self, epoch: u64, live: usize) {
        ::metrics::counter!(GROUP_VIEW_CHANGES, "group" => self.group.clone()).increment(1);
        // Gauges are f64: exact up to 2^53, far beyond any epoch a group reaches.
        ::metrics::gauge!(GROUP_EPOCH, "group" => self.group.clone()).set(epoch as f64);
        self.members_live(live);
    }

    /// Sets the live-member gauge (on a view change, and to 0 when the member leaves).
    pub fn members_live(&self, live: usize) {
        ::metrics::gauge!(GROUP_MEMBERS_LIVE, "group" => self.group.clone()).set(live as f64);
    }

    /// A hand-off that took `took`, from adopting a view to activating it.
    pub fn handoff(&self, took: Duration) {
        ::metrics::histogram!(GROUP_HANDOFF_DURATION, "group" => self.group.clone()).record(took);
    }

    /// Sets the gauge of declared keys owned (on a view change, and to 0 when the member leaves).
    pub fn keys_owned(&self, owned: usize) {
        ::metrics::gauge!(GROUP_KEYS_OWNED, "group" => self.group.clone()).set(owned as f64);
    }

    /// The member stopped granting keys it held; `reason` is a fixed word: `moved` (a new view
    /// moved keys away), `lapsed` (the lease deadline passed), `lost` (the slot was no longer
    /// ours), `left`.
    pub fn grants_revoked(&self, reason: &'static str) {
        ::metrics::counter!(GROUP_GRANTS_REVOKED, "group" => self.group.clone(), "reason" => reason)
            .increment(1);
    }

    /// A drain ended with grants still in flight; `reason` is a fixed word: `timeout`, `lost`,
    /// `lapsed`.
    pub fn drain_cut(&self, reason: &'static str) {
        ::metrics::counter!(GROUP_DRAINS_CUT, "group" => self.group.clone(), "reason" => reason)
            .increment(1);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{
        describe, record_fence_rejection, record_store_operation, GroupMetrics, ALL,
        DURATION_BUCKETS, NAME_PREFIX,
    };
    use crate::error::{Error, ErrorKind};
    use crate::Op;

    #[test]
    fn names_are_unique_prometheus_names() {
        let mut seen = std::collections::HashSet::new();
        for name in ALL {
            assert!(seen.insert(*name), "{name} twice");
            assert!(name.starts_with(NAME_PREFIX), "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{name}"
            );
        }
    }

    #[test]
    fn duration_buckets_increase() {
        assert!(!DURATION_BUCKETS.is_empty());
        assert!(DURATION_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn recording_without_a_recorder_is_harmless() {
        let m = GroupMetrics::new("g");
        m.heartbeat(Duration::from_millis(1), Some(&Error::invalid("x")));
        m.view_changed(3, 2);
        m.handoff(Duration::from_millis(5));
        m.grants_revoked("moved");
        record_store_operation("memory", Op::Get, Duration::ZERO, Some(ErrorKind::Timeout));
        record_fence_rejection("memory");
        describe();
    }
}
