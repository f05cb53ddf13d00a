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
}

impl Op {
    /// Every primitive, in the order of the variants.
    pub const ALL: [Op; 13] = [
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
        }
    }
}

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
