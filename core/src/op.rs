//! [`Op`]: the store's primitives by name, written once for every place that names one (the
//! hooks of a [`Decorated`](crate::decorated::Decorated) store, metrics labels, span fields, the
//! backends' deadlines and errors, the benchmarks).

use std::fmt;

#[cfg(doc)]
use crate::Store;

/// A primitive of the [`Store`] trait: one variant per method that makes a store call (every
/// method but [`Store::capabilities`]). Its [name](Op::name) is the method's name, the value of
/// the `operation` metrics label and of the `op` span field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Op {
    /// [`Store::incr`].
    Incr,
    /// [`Store::get`].
    Get,
    /// [`Store::expire`].
    Expire,
    /// [`Store::compare_and_set`].
    CompareAndSet,
    /// [`Store::delete`].
    Delete,
    /// [`Store::compare_and_delete`].
    CompareAndDelete,
    /// [`Store::list`].
    List,
    /// [`Store::set_max`].
    SetMax,
    /// [`Store::incr_and_get`].
    IncrAndGet,
    /// [`Store::renew_and_list`].
    RenewAndList,
    /// [`Store::renew_and_list_if_changed`].
    RenewAndListIfChanged,
    /// [`Store::renew_and_versions`].
    RenewAndVersions,
    /// [`Store::durability`].
    Durability,
    /// [`Store::list_with_ttl`].
    ListWithTtl,
}

impl Op {
    /// Every primitive, in the order of the variants.
    pub const ALL: [Op; 14] = [
        Op::Incr,
        Op::Get,
        Op::Expire,
        Op::CompareAndSet,
        Op::Delete,
        Op::CompareAndDelete,
        Op::List,
        Op::SetMax,
        Op::IncrAndGet,
        Op::RenewAndList,
        Op::RenewAndListIfChanged,
        Op::RenewAndVersions,
        Op::Durability,
        Op::ListWithTtl,
    ];

    /// The method's name: `incr`, `get`, `compare_and_set`, …
    pub const fn name(self) -> &'static str {
        match self {
            Op::Incr => "incr",
            Op::Get => "get",
            Op::Expire => "expire",
            Op::CompareAndSet => "compare_and_set",
            Op::Delete => "delete",
            Op::CompareAndDelete => "compare_and_delete",
            Op::List => "list",
            Op::SetMax => "set_max",
            Op::IncrAndGet => "incr_and_get",
            Op::RenewAndList => "renew_and_list",
            Op::RenewAndListIfChanged => "renew_and_list_if_changed",
            Op::RenewAndVersions => "renew_and_versions",
            Op::Durability => "durability",
            Op::ListWithTtl => "list_with_ttl",
        }
    }
}

/// The store's operations as [`Store`] declares them, written once: calls the macro named first
/// with the list `[ { method, Op variant, (arguments) -> answer, scope: key, check: { ... } }, ... ]`,
/// where `scope` is the key a span names and `check` validates the arguments. The two places
/// that forward every operation are expanded from it: the checked [`Store`] of every
/// [`Backend`](crate::backend::Backend) (`backend/mod.rs`) and the [`Decorated`] store
/// (`decorated.rs`). `capabilities` and `subscribe`, which are not store calls, are written by
/// hand beside them.
///
/// [`Decorated`]: crate::decorated::Decorated
macro_rules! for_each_op {
    ($callback:ident) => {
        $callback! { [
            { incr, Incr, (key: &str, ttl: Option<Duration>) -> i64,
              scope: key, check: { check_key(key)?; check_opt_ttl(ttl)?; } },
            { get, Get, (key: &str) -> Option<String>,
              scope: key, check: { check_key(key)?; } },
            { expire, Expire, (key: &str, ttl: Duration) -> bool,
              scope: key, check: { check_key(key)?; check_ttl(ttl)?; } },
            { compare_and_set, CompareAndSet,
              (key: &str, expected: Option<&str>, new: &str, ttl: Option<Duration>) -> bool,
              scope: key, check: { check_cas(key, expected, new, ttl)?; } },
            { delete, Delete, (key: &str) -> bool,
              scope: key, check: { check_key(key)?; } },
            { list, List, (prefix: &str) -> Vec<(String, String)>,
              scope: prefix, check: { check_prefix(prefix)?; } },
            { set_max, SetMax, (key: &str, value: i64, ttl: Option<Duration>) -> bool,
              scope: key, check: { check_key(key)?; check_opt_ttl(ttl)?; } },
            { incr_and_get, IncrAndGet,
              (incr_key: &str, by: i64, ttl: Option<Duration>, get_key: &str)
                  -> (i64, Option<String>),
              scope: incr_key, check: { check_incr_and_get(incr_key, by, ttl, get_key)?; } },
            { renew_and_list, RenewAndList,
              (key: &str, holder: &str, ttl: Duration, prefix: &str)
                  -> (bool, Vec<(String, String)>),
              scope: prefix, check: { check_renew_and_list(key, holder, ttl, prefix)?; } },
            { renew_and_list_if_changed, RenewAndListIfChanged,
              (key: &str, holder: &str, ttl: Duration, dir: &str, since: Option<&str>)
                  -> RenewedListing,
              scope: dir, check: { check_renew_and_list_if_changed(key, holder, ttl, dir)?; } },
            { renew_and_versions, RenewAndVersions,
              (key: &str, holder: &str, ttl: Duration, dirs: &[(&str, Option<&str>)])
                  -> (bool, Vec<String>),
              scope: dirs.first().map_or("", |(dir, _)| *dir),
              check: { check_renew_and_versions(key, holder, ttl, dirs)?; } },
            { compare_and_delete, CompareAndDelete, (key: &str, expected: &str) -> bool,
              scope: key, check: { check_key(key)?; check_value(expected)?; } },
            { durability, Durability, () -> Durability,
              scope: "", check: {} },
            { list_with_ttl, ListWithTtl, (prefix: &str) -> Vec<(String, String, Option<Duration>)>,
              scope: prefix, check: { check_prefix(prefix)?; } },
        ] }
    };
}

pub(crate) use for_each_op;

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::Op;

    #[test]
    fn every_op_is_listed_once_under_its_own_name() {
        assert!(
            Op::ALL.windows(2).all(|w| w[0] < w[1]),
            "ALL in variant order"
        );
        let names: HashSet<&str> = Op::ALL.iter().map(|op| op.name()).collect();
        assert_eq!(names.len(), Op::ALL.len());
        for op in Op::ALL {
            assert_eq!(op.to_string(), op.name());
            assert!(
                op.name()
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{op}"
            );
        }
    }
}
