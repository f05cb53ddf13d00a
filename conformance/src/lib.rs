#![doc = include_str!("../README.md")]

mod case;
pub mod cases;
pub mod id_history;
mod suite;
mod timed;
pub mod wait;

pub use case::{Case, CaseFn, CaseResult, Ctx, Failure, Needs, ResultExt, ServerControl, CASES};
pub use suite::{percentile, run_suite, CaseReport, Outcome, PrimitiveStats, Report, SuiteOptions};
pub use timed::{timed, Decorated, Hooks, Latencies, Timed};

/// Returns early from a case with a [`Failure`] when `cond` is false.
///
/// ```
/// # use headcount_conformance::{ensure, CaseResult};
/// fn check(n: i64) -> CaseResult {
///     ensure!(n > 0, "expected a positive number, got {n}");
///     Ok(())
/// }
/// assert!(check(1).is_ok());
/// assert!(check(0).unwrap_err().to_string().contains("got 0"));
/// ```
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return ::core::result::Result::Err($crate::Failure::new(::std::format!($($fmt)+)));
        }
    };
}

/// Returns early from a case with a [`Failure`] naming both values when they differ.
///
/// ```
/// # use headcount_conformance::{ensure_eq, CaseResult};
/// fn check(got: Option<&str>) -> CaseResult {
///     ensure_eq!(got, Some("1"), "get after the first incr");
///     Ok(())
/// }
/// let msg = check(Some("2")).unwrap_err().to_string();
/// assert!(msg.contains("get after the first incr") && msg.contains("\"2\""), "{msg}");
/// ```
#[macro_export]
macro_rules! ensure_eq {
    ($got:expr, $want:expr, $($fmt:tt)+) => {
        match (&$got, &$want) {
            (got, want) => {
                if *got != *want {
                    return ::core::result::Result::Err($crate::Failure::new(::std::format!(
                        "{}: got {:?}, expected {:?}",
                        ::std::format!($($fmt)+),
                        got,
                        want
                    )));
                }
            }
        }
    };
}

/// The single list of cases. Calls the macro named first with the tokens that follow it and then
/// the list `[ { name, Needs::Variant, "what it proves" }, ... ]`, so everything derived from the
/// list (the [`CASES`] table, the tests of `headcount-harness`'s `conformance_tests!`) is
/// generated from this one place.
///
/// To add a case: write `pub async fn name(ctx: &Ctx) -> CaseResult` in a module of [`cases`],
/// re-export it from `cases`, and add a line here.
#[doc(hidden)]
#[macro_export]
macro_rules! for_each_case {
    ($($callback:ident)::+ ! $($args:tt)*) => {
        $($callback)::+ ! { $($args)* [
            { incr_from_absent, Store, "incr on an absent key returns 1, then 2; the value reads back as decimal text" },
            { incr_from_expired, Store, "incr on an expired key counts from 0 again" },
            { incr_ttl_set_on_create, Store, "incr sets the TTL only when it creates the key; later incrs (with None or a longer TTL) do not refresh it" },
            { incr_50x100_exact, Store, "50 concurrent tasks x 100 incr return exactly 1..=5000, no gap, no repeat" },
            { ttl_on_store_clock, Store, "a key is visible to every read that completes before write_sent + ttl and gone for every read sent after write_completed + ttl + tolerance" },
            { get_absent, Store, "get of a never-written key, and of a deleted one, is None" },
            { expire_absent, Store, "expire on an absent or expired key returns false and creates nothing" },
            { list_with_ttl_counts_down, Store, "list_with_ttl lists what list lists with each key's time left: within (0, ttl] for a key written or renewed with a TTL, None without; it goes down and a renewal sets it back up" },
            { expire_live_extends, Store, "expire on a live key returns true and replaces its TTL: it extends a short one and gives a persistent key one" },
            { cas_when_absent, Store, "CAS with expected None writes only when the key is absent" },
            { cas_when_equal, Store, "CAS with the current value writes" },
            { cas_when_different, Store, "CAS with another value, or with a value on an absent key, writes nothing" },
            { cas_absent_over_expired, Store, "CAS with expected None succeeds over an expired key; expected = the expired value fails" },
            { cas_32_concurrent_one_winner, Store, "of 32 concurrent CAS on the same expected value (and on an absent key) exactly one wins, and its value is stored" },
            { cas_ttl_none_persists, Store, "CAS with ttl None removes a previous expiry: the key outlives the old TTL" },
            { compare_and_delete_only_expected, Store, "compare_and_delete removes the key only when it holds the expected value, at once; a late one never removes the next value; an expired key is not deleted" },
            { compare_and_delete_32_concurrent_one_winner, Store, "of 32 concurrent compare_and_delete calls with the current value exactly one deletes" },
            { set_max_from_absent, Store, "set_max on an absent or expired key writes" },
            { set_max_smaller_equal_larger, Store, "set_max writes only a larger number, and applies its TTL when it writes" },
            { set_max_after_other_writes, Store, "set_max judges the value held now: it raises a key another write lowered, leaves one another write raised past it, and creates a deleted one; a raise with a TTL applies it" },
            { set_max_concurrent_monotonic, Store, "under concurrent set_max of random values the stored number never goes backwards and ends at the maximum proposed" },
            { list_live_under_prefix, Store, "list returns exactly the live keys under the prefix with their values, sorted bytewise; expired keys and keys outside are excluded" },
            { list_prefix_is_literal, Store, "list treats % _ \\ and other pattern characters in the prefix literally" },
            { list_follows_every_write, Store, "list sees the keys every write primitive wrote under the prefix (incr, compare_and_set, set_max, incr_and_get, expire, renew_and_list), after their first short TTL when a later write extended it; a deleted or expired key is not listed, nor a key under a sibling prefix" },
            { list_thousand_keys_exactly, Store, "list of a prefix holding 1,000 keys returns exactly them, and after deleting every tenth exactly the rest" },
            { delete_live_absent_expired, Store, "delete returns true for a live key (and removes it), false for an absent or expired one" },
            { foreign_value_typed_error, Store, "incr and set_max over a non-numeric value give ErrorKind::ForeignValue and leave the value unchanged" },
            { odd_keys_round_trip, Store, "keys with : { } spaces and unicode, of 1 KiB and of MAX_KEY_LEN (4 KiB, incompressible) work with every primitive and listing" },
            { bad_arguments_rejected, Store, "zero TTL, empty / control-character / oversized keys, oversized or NUL values and an empty prefix give ErrorKind::InvalidArgument and write nothing" },
            { incr_and_get_fused, Store, "incr_and_get adds to one counter and reads another: incr's semantics (from 0, TTL on create, ForeignValue leaves the value), the other key's value as stored, distinct values under 20 concurrent callers" },
            { renew_and_list_extends_ttl, Store, "renew_and_list by the holder resets the key's TTL to ttl from now and keeps its value (outlives the old TTL, expires on a new short one); an expired key is not renewed or recreated" },
            { renew_and_list_refuses_others, Store, "renew_and_list by another holder returns false and leaves value and expiry untouched; an absent key returns false and is not created" },
            { renew_and_list_lists_prefix, Store, "renew_and_list lists what list does (live keys under the prefix, sorted, with the renewed key); a key outside the prefix or in another hash slot is renewed and not listed; bad arguments are InvalidArgument and renew nothing" },
            { renew_if_changed_renews_and_lists, Store, "renew_and_list_if_changed renews like renew_and_list and, with no version given, lists exactly the keys directly under the directory (not deeper ones, not siblings); a directory without the final ':' is InvalidArgument" },
            { renewals_keep_a_key_alive, Store, "renewals with the same TTL (renew_and_list and renew_and_list_if_changed, with a compare_and_set of the same value between) keep a key alive past several TTLs, each extending it from its own send; once they stop, the key expires on the last one's TTL" },
            { renew_if_changed_follows_changes, Store, "renew_and_list_if_changed keeps its version (and sends no listing) across renewals and writes beside the directory (a compare_and_set with the same value or a write below it may change the version, with the same listing), and changes it, sending the listing, when a key directly under it is created, changed, deleted, compare-and-deleted, or expires with nobody writing" },
            { renew_and_versions_follow_changes, Store, "renew_and_versions renews like renew_and_list_if_changed and answers, per directory, the version that call answers: the same while nothing changes, a new one for the directory a write changed and only for it; another holder renews nothing; no directory, or one without the final ':', is InvalidArgument" },
            { renew_and_versions_renews_only_the_holder, Store, "renew_and_versions renews only a live key holding the holder (it outlives its original short TTL); a key held by another, a foreign value, an absent and an expired key are not renewed, keep their value and expiry, and are not created" },
            { renew_and_versions_each_directory, Store, "renew_and_versions over three directories, one empty: each version is the one renew_and_list_if_changed answers for its directory, and changes when a key directly under it is created, changed, deleted, compare-and-deleted or expires with nobody writing, while the others stay" },
            { notify_write_under_dir, Store, "subscribe: on a store that notifies, each write that changes a key directly under a watched directory (compare_and_set creating and changing, compare_and_delete, incr, set_max, delete) is notified within 1 s of completing (the latencies are printed); a store that does not notify hands out silent notifications" },
            { notify_other_dirs_not_delivered, Store, "subscribe: writes under the parent, a sibling named alike, another directory and another group's directory of the same name are not delivered to a directory's subscribers, while a write under it is" },
            { notify_lost_made_up_by_poll, Store, "subscribe: writes whose notifications are lost on purpose (one made while unsubscribed, one whose notice is thrown away) are made up for by the next poll: renew_and_list_if_changed answers a new version and lists both" },
            { notify_fallback_silent, Store, "subscribe: the provided fallback (a backend without its own) hands out notifications that never fire and never fail; a directory without the final ':' or empty is InvalidArgument on the fallback and on the store" },
            { durability_probe, Store, "durability() answers the same twice, its detail names the settings it read (appendonly/appendfsync, fsync/synchronous_commit, synchronous/journal_mode, etcd's WAL), and its verdict follows them; a shared Redis, PostgreSQL, SQLite or etcd store names the server behind it" },
            { interval_article_timeline, Store, "interval indexer: the longer 'Distributed Peer Indexing' article's timeline (A, B in interval 1, C in interval 3, 30 s): the article's increments, the 'Distributed Peer Indexing' article's pairs, heartbeats list the live peers" },
            { interval_skewed_peers_converge, Store, "interval indexer: 5 peers with clocks up to a quarter interval apart reach indices 1..=5 and replicas 5 within 2.5 intervals of the last join (a join late in an interval waits for the next one), and no task is ever owned by two peers at once" },
            { interval_scale_exactly_once, Store, "interval indexer: scaling 3 -> 5 -> 2 with 10,000 task ids per interval offered to every peer, the safe transition processes every id exactly once" },
            { interval_weighted_capacity, Store, "interval indexer: a peer of capacity 2 owns twice the tasks of a peer of capacity 1, and together they own each task once" },
            { interval_bad_input_rejected, Store, "interval indexer: bad intervals, groups and capacities are InvalidArgument at join, a foreign counter is ForeignValue" },
            { interval_outage_keeps_then_expires_pair, Store, "interval indexer: through a store outage a peer keeps its last pair and still processes its tasks, reports the fault, stops owning when the pair expires a quarter interval after the failed tick, and owns tasks again when the store is back" },
            { interval_foreign_previous_count_reported, Store, "interval indexer: a foreign value at the previous interval's counter during a tick is reported and emits no pair" },
            { group_join_leave_rejoin, Store, "group: three members get slots 0..=2 and pairs (1..=3, 3), every key has exactly one owner, a graceful leave moves the others to a newer epoch, and the same member id rejoins into its old slot" },
            { group_sticky_partitions, Store, "group: the sticky assignor over 4,096 declared partitions, its assignment stored in the view: three members own 1,365 or 1,366 each, a join moves exactly the newcomer's 1,024 and a leave exactly the leaver's partitions" },
            { group_planned_changes_notified, Store, "group: with the store's change notifications, at TTL 6 s a join, a graceful leave and a standby's hand-over each converge within half a heartbeat (1 s; the figures are printed); a store that does not notify is noted" },
            { group_crash_expires, Store, "group: a member that crashes (stops heartbeating) is replaced within TTL + one heartbeat (+5 s slack) under a newer epoch" },
            { group_handoff_no_double_grant, Store, "group: while members join, leave and crash, no two members hold a valid grant for the same key at the same time, and an epoch grants a key to one member" },
            { group_bad_config_rejected, Store, "group: bad TTLs, member ids, groups and slot limits are InvalidArgument at join" },
            { group_foreign_slot_left_alone, Store, "group: a foreign value in slot 0 is skipped and left alone; the members take slots 1 and 2, every key with one owner" },
            { group_garbled_view_replaced, Store, "group: a view that does not decode is replaced when members join, and they converge" },
            { group_overwritten_view_epoch_rises, Store, "group: a view overwritten by hand while members are active, then a join: the new epoch is above every epoch the members acted on, and a leave raises it again" },
            { group_twin_member_rejected, Store, "group: a second join with the member id of a live member is Rejected within about a TTL, and the live member stays active" },
            { group_overwritten_slot_reclaimed, Store, "group: a member whose slot is overwritten by hand claims again under a newer epoch, every key with one owner" },
            { server_killed_retryable_then_recovers, ServerControl, "with the server killed (SIGKILL) mid-run, calls fail with a retryable error within the timeout, and the same handle works again after a restart" },
            { server_paused_times_out_then_recovers, ServerControl, "with the server paused (SIGSTOP) longer than the timeout, a call fails with ErrorKind::Timeout within the deadline, and the same handle works again after SIGCONT" },
            { cluster_member_killed_keeps_serving, ClusterMember, "with one member of a 3-member cluster killed (SIGKILL), every operation keeps succeeding within the timeout, counters stay exact; operations still succeed after it is started again (whether it caught up is not checked)" },
            { lost_reply_applied_at_most_once, ServerControl, "a write whose reply is lost (the proxy passes the request and drops the connection when the answer comes) is applied at most once and answered truthfully or with a retryable error: incr is not counted twice, compare_and_set and compare_and_delete that wrote are not reported as not written" },
            { notify_resubscribes_after_restart, ServerControl, "subscribe: after the server is killed (SIGKILL, every connection dropped, the subscription's too) and started again, the subscribers hear MayHaveMissed within 20 s and later writes are notified again within 1 s each" },
            { connection_cut_retryable_then_recovers, ServerControl, "with the connection cut by a TCP proxy (open connections dropped, new ones blackholed) while the server runs, calls fail with a retryable error within the timeout, and the same handle works again when traffic passes" },
        ] }
    };
}
