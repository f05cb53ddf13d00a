//! The assignor report: balance, movement and lookup time for each assignor at several group
//! sizes, as the table in `docs/assignors.md`.
//!
//! `cargo bench -p headcount-core --bench assign_report` prints it (with `-- --keys N` for
//! another key count); a CLI can call [`report`] and [`markdown`] the same way. The movement
//! figures are exact counts over the key sample, so they are the same on every run and machine;
//! only the lookup times depend on the machine.

use std::hint::black_box;
use std::time::Instant;

use std::sync::Arc;

use super::{hash_u64, AssignError, Assignor, AssignorKind, KeySet, Sticky, Topology};

/// The group sizes of the report: 3, 10, 100 and 1000 members.
pub const MEMBERS: [u32; 4] = [3, 10, 100, 1000];

/// The report's key count: one million.
pub const KEYS: usize = 1_000_000;

/// One assignor at one group size.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportRow {
    /// The assignor.
    pub assignor: AssignorKind,
    /// Live members (slots `0..members`).
    pub members: u32,
    /// Keys in the sample: `hash_u64(0..keys)`.
    pub keys: usize,
    /// The most loaded member's keys over the average.
    pub max_over_avg: f64,
    /// Fraction of keys that change owner when member `members` joins.
    pub join_moved: f64,
    /// The least a join can move: `1 / (members + 1)`.
    pub join_optimum: f64,
    /// Fraction of keys that move on the join but not to the newcomer: 0 when minimal.
    pub join_excess: f64,
    /// Fraction of keys that change owner when the middle member (`members / 2`) dies.
    pub death_moved: f64,
    /// The least a death can move: `1 / members`.
    pub death_optimum: f64,
    /// Fraction of keys that move on the death but were not the dead member's: 0 when minimal.
    pub death_excess: f64,
    /// Of the dead member's keys, the share of the survivor that takes the most, over the fair
    /// share `1 / (members - 1)`; `None` with a single member. Only meaningful when
    /// [`heir_fair_keys`](Self::heir_fair_keys) is large: with a few keys per heir it mostly
    /// measures the sample.
    pub heir_max_over_fair: Option<f64>,
    /// The dead member's keys per survivor: the fair share in keys.
    pub heir_fair_keys: f64,
    /// Mean time per lookup over the sample, in nanoseconds, in whatever build runs the report.
    pub lookup_ns: f64,
}

/// Measures `assignor` with `members` members over `keys` keys.
pub fn measure(
    assignor: AssignorKind,
    members: u32,
    keys: usize,
) -> Result<ReportRow, AssignError> {
    let sample: Vec<u64> = (0..keys as u64).map(hash_u64).collect();
    let base = Topology::new(members)?;
    let mut joined = base.clone();
    let newcomer = joined.push_slot()?;
    let dying = members / 2;
    let mut died = base.clone();
    died.set_dead(dying)?;

    let before = assignor.build(&base)?;
    let start = Instant::now();
    let owners: Vec<u32> = sample.iter().map(|&k| before.owner(black_box(k))).collect();
    let lookup_ns = start.elapsed().as_nanos() as f64 / keys.max(1) as f64;

    let mut load = vec![0usize; members as usize];
    for &o in &owners {
        load[o as usize] += 1;
    }
    let avg = keys as f64 / f64::from(members.max(1));
    let max_over_avg = load.iter().copied().max().unwrap_or(0) as f64 / avg;

    let after_join = assignor.build(&joined)?;
    let (mut join_moved, mut join_excess) = (0usize, 0usize);
    for (&k, &o) in sample.iter().zip(&owners) {
        let n = after_join.owner(k);
        if n != o {
            join_moved += 1;
            if n != newcomer {
                join_excess += 1;
            }
        }
    }

    let (mut death_moved, mut death_excess) = (0usize, 0usize);
    let mut heirs = vec![0usize; members as usize];
    if died.live_count() > 0 {
        let after_death = assignor.build(&died)?;
        for (&k, &o) in sample.iter().zip(&owners) {
            let n = after_death.owner(k);
            if n != o {
                death_moved += 1;
                if o != dying {
                    death_excess += 1;
                }
            }
            if o == dying {
                heirs[n as usize] += 1;
            }
        }
    }
    let inherited: usize = heirs.iter().sum();
    let heir_fair_keys = if members > 1 {
        inherited as f64 / f64::from(members - 1)
    } else {
        0.0
    };
    let heir_max_over_fair = (members > 1 && inherited > 0)
        .then(|| heirs.iter().copied().max().unwrap_or(0) as f64 / heir_fair_keys);

    let frac = |n: usize| n as f64 / keys.max(1) as f64;
    Ok(ReportRow {
        assignor,
        members,
        keys,
        max_over_avg,
        join_moved: frac(join_moved),
        join_optimum: 1.0 / f64::from(members + 1),
        join_excess: frac(join_excess),
        death_moved: frac(death_moved),
        death_optimum: 1.0 / f64::from(members.max(1)),
        death_excess: frac(death_excess),
        heir_max_over_fair,
        heir_fair_keys,
        lookup_ns,
    })
}

/// Every assignor at each of `members`, over `keys` keys.
pub fn report(members: &[u32], keys: usize) -> Result<Vec<ReportRow>, AssignError> {
    let mut rows = Vec::new();
    for &n in members {
        for kind in AssignorKind::ALL {
            rows.push(measure(kind, n, keys)?);
        }
    }
    Ok(rows)
}

/// The rows as a Markdown table.
pub fn markdown(rows: &[ReportRow]) -> String {
    let mut out = String::from(
        "| assignor | n | max/avg | join: moved | ÷ 1/(n+1) | not to newcomer | death: moved | ÷ 1/n | not the dead one's | top heir ÷ fair (fair, in keys) | ns/lookup |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let heir = r.heir_max_over_fair.map_or_else(
            || "–".to_owned(),
            |h| {
                let digits = if r.heir_fair_keys < 100.0 { 1 } else { 0 };
                format!("{h:.2} (fair {:.*})", digits, r.heir_fair_keys)
            },
        );
        out.push_str(&format!(
            "| {} | {} | {:.4} | {:.4}% | {:.3} | {:.4}% | {:.4}% | {:.3} | {:.4}% | {} | {:.1} |\n",
            r.assignor,
            r.members,
            r.max_over_avg,
            100.0 * r.join_moved,
            r.join_moved / r.join_optimum,
            100.0 * r.join_excess,
            100.0 * r.death_moved,
            r.death_moved / r.death_optimum,
            100.0 * r.death_excess,
            heir,
            r.lookup_ns,
        ));
    }
    out
}

/// The declared key counts of the report on assignors for a declared set: 256 and 4096 partitions.
pub const DECLARED_KEYS: [u32; 2] = [256, 4096];

/// The group sizes of the report on assignors for a declared set: 3, 10 and 20 members.
pub const DECLARED_MEMBERS: [u32; 3] = [3, 10, 20];

/// One assignor over a declared set of partitions at one group size: what
/// [`declared`] measures.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredRow {
    /// The assignor: [`AssignorKind::Sticky`] or [`AssignorKind::Balanced`] over the set, or a
    /// hashing one over the same keys.
    pub assignor: AssignorKind,
    /// Live members (slots `0..members`).
    pub members: u32,
    /// The partitions: [`KeySet::partitions`]`(keys)`.
    pub keys: u32,
    /// The most keys a member owns.
    pub largest: usize,
    /// The fewest keys a member owns.
    pub smallest: usize,
    /// `keys / members`.
    pub fair: f64,
    /// Keys that change owner when slot `members` joins.
    pub join_moved: usize,
    /// Of those, the keys that do not go to the newcomer.
    pub join_not_to_newcomer: usize,
    /// The least a join can move while keeping shares within ±1: `⌊keys / (members + 1)⌋`.
    pub join_minimum: usize,
    /// Keys that change owner when a member leaves (or crashes), summed over each member
    /// leaving in turn.
    pub leave_moved_total: usize,
    /// The least those leaves can move: the leavers' own keys, summed the same way.
    pub leave_minimum_total: usize,
    /// The most keys any one leave moves beyond the leaver's own.
    pub leave_worst_excess: usize,
}

impl DeclaredRow {
    /// Keys moved per leave, averaged over the members.
    pub fn leave_moved(&self) -> f64 {
        self.leave_moved_total as f64 / f64::from(self.members)
    }

    /// The leaver's share, averaged over the members: the least a leave moves.
    pub fn leave_minimum(&self) -> f64 {
        self.leave_minimum_total as f64 / f64::from(self.members)
    }
}

fn owners(a: &dyn Assignor, keys: &KeySet) -> Vec<u32> {
    keys.hashes().iter().map(|&h| a.owner(h)).collect()
}

/// Measures `kind` over `keys` partitions at `members` members, building
/// [`AssignorKind::Balanced`] and [`AssignorKind::Sticky`] with the set (the sticky assignor's
/// first assignment, then each change from it as a group computes it, with [`Sticky::next`]).
/// The join appends slot `members` to slots `0..members`; the leaves take each slot of
/// `0..members` away in turn.
pub fn measure_declared(
    kind: AssignorKind,
    members: u32,
    keys: u32,
) -> Result<DeclaredRow, AssignError> {
    let set = Arc::new(KeySet::partitions(keys)?);
    let kind = match kind {
        AssignorKind::Balanced(_) => AssignorKind::Balanced(set.id()),
        AssignorKind::Sticky(_) => AssignorKind::Sticky(set.id()),
        other => other,
    };
    let base = Topology::new(members)?;
    let before = owners(kind.build_with(&base, Some(&set))?.as_ref(), &set);
    // The owners after a change from `before`.
    let build = |t: &Topology| -> Result<Vec<u32>, AssignError> {
        match kind {
            AssignorKind::Sticky(_) => Ok(Sticky::next(t, set.clone(), &before)?.owners().to_vec()),
            _ => Ok(owners(kind.build_with(t, Some(&set))?.as_ref(), &set)),
        }
    };
    let mut load = vec![0usize; members as usize];
    for &o in &before {
        load[o as usize] += 1;
    }
    let mut joined = base.clone();
    let newcomer = joined.push_slot()?;
    let after = build(&joined)?;
    let moved: Vec<(u32, u32)> = before
        .iter()
        .zip(&after)
        .filter(|(o, n)| o != n)
        .map(|(&o, &n)| (o, n))
        .collect();
    let join_not_to_newcomer = moved.iter().filter(|&&(_, n)| n != newcomer).count();
    let (mut leave_moved_total, mut leave_minimum_total, mut leave_worst_excess) = (0, 0, 0);
    if members > 1 {
        for leaver in 0..members {
            let mut left = base.clone();
            left.set_dead(leaver)?;
            let after = build(&left)?;
            let moved = before.iter().zip(&after).filter(|(o, n)| o != n).count();
            let own = load[leaver as usize];
            leave_moved_total += moved;
            leave_minimum_total += own;
            leave_worst_excess = leave_worst_excess.max(moved - own);
        }
    }
    Ok(DeclaredRow {
        assignor: kind,
        members,
        keys,
        largest: load.iter().copied().max().unwrap_or(0),
        smallest: load.iter().copied().min().unwrap_or(0),
        fair: f64::from(keys) / f64::from(members.max(1)),
        join_moved: moved.len(),
        join_not_to_newcomer,
        join_minimum: (keys / (members + 1)) as usize,
        leave_moved_total,
        leave_minimum_total,
        leave_worst_excess,
    })
}

/// [`AssignorKind::Sticky`], [`AssignorKind::Balanced`] and [`AssignorKind::JumpBackFailover`]
/// for each of `keys` partition counts at each of `members`.
pub fn declared(keys: &[u32], members: &[u32]) -> Result<Vec<DeclaredRow>, AssignError> {
    let mut rows = Vec::new();
    for &m in keys {
        for &n in members {
            let none = KeySet::partitions(0)?.id();
            for kind in [
                AssignorKind::Sticky(none),
                AssignorKind::Balanced(none),
                AssignorKind::JumpBackFailover,
            ] {
                rows.push(measure_declared(kind, n, m)?);
            }
        }
    }
    Ok(rows)
}

/// The rows of [`declared`] as a Markdown table.
pub fn declared_markdown(rows: &[DeclaredRow]) -> String {
    let mut out = String::from(
        "| keys | n | assignor | shares | largest ÷ fair | join: moved | minimum | ÷ minimum | not to newcomer | leave: moved (mean) | minimum (mean) | ÷ minimum | worst leave: extra keys |\n\
         |---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {}–{} | {:.3} | {} | {} | {:.3} | {} | {:.1} | {:.1} | {:.3} | {} |\n",
            r.keys,
            r.members,
            r.assignor.name(),
            r.smallest,
            r.largest,
            r.largest as f64 / r.fair,
            r.join_moved,
            r.join_minimum,
            r.join_moved as f64 / r.join_minimum.max(1) as f64,
            r.join_not_to_newcomer,
            r.leave_moved(),
            r.leave_minimum(),
            r.leave_moved() / r.leave_minimum().max(1.0),
            r.leave_worst_excess,
        ));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::{markdown, measure, report};
    use crate::assign::AssignorKind;

    #[test]
    fn a_small_report_runs_and_is_sane() {
        let rows = report(&[3, 10], 20_000).unwrap();
        assert_eq!(rows.len(), 2 * AssignorKind::ALL.len());
        for r in &rows {
            assert!(r.max_over_avg >= 1.0);
            if r.assignor != AssignorKind::Modulo {
                assert_eq!(r.join_excess, 0.0, "{r:?}");
                assert_eq!(r.death_excess, 0.0, "{r:?}");
            }
        }
        let table = markdown(&rows);
        assert_eq!(table.lines().count(), rows.len() + 2);
        assert!(table.contains("| memento | 10 |"));
        assert!(table.contains("| jumpback | 10 |"));
        assert!(table.contains("| jumpback-memento | 10 |"));
    }

    #[test]
    fn the_declared_report_is_balanced_for_balanced() {
        let rows = super::declared(&[256], &[3, 10]).unwrap();
        assert_eq!(rows.len(), 6);
        for r in &rows {
            assert!(r.leave_moved_total >= r.leave_minimum_total, "{r:?}");
            assert!(r.join_moved >= r.join_minimum || r.assignor.name() == "jumpback");
            if r.assignor.name() != "jumpback" {
                assert!(r.largest - r.smallest <= 1, "{r:?}");
            }
            if r.assignor.name() == "sticky" {
                // Exactly the minimum, every time.
                assert_eq!(r.join_moved, r.join_minimum, "{r:?}");
                assert_eq!(r.leave_moved_total, r.leave_minimum_total, "{r:?}");
            }
            if r.assignor.name() != "balanced" {
                assert_eq!(r.join_not_to_newcomer, 0, "{r:?}");
                assert_eq!(r.leave_moved_total, r.leave_minimum_total, "{r:?}");
            }
        }
        let table = super::declared_markdown(&rows);
        assert_eq!(table.lines().count(), rows.len() + 2);
        assert!(table.contains("| 256 | 3 | balanced | 85–86 |"), "{table}");
        assert!(table.contains("| 256 | 3 | sticky | 85–86 |"), "{table}");
    }

    #[test]
    fn a_single_member_report_has_no_heirs() {
        let r = measure(AssignorKind::Memento, 1, 100).unwrap();
        assert_eq!(r.heir_max_over_fair, None);
        assert_eq!(r.death_moved, 0.0);
    }
}
