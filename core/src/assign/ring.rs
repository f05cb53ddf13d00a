//! The distributor's consistent-hash ring (the article "Distributor"), as an assignor and as its greedy
//! matching of services to work units.

use super::{combine_hash, hash_bytes, hash_u64, AssignError, Assignor, AssignorKind, Topology};

/// Points each unit of weight puts on the ring: the distributor's "weight of 50".
pub const POINTS_PER_WEIGHT: u32 = 50;

/// The most points a [`Ring`] holds (16 Mi points, 192 MiB): a limit on the weights, not on the
/// slots, since [`MAX_SLOTS`](crate::assign::MAX_SLOTS) slots of weight 1 need 50 Mi.
pub const MAX_RING_POINTS: u64 = 1 << 24;

/// Where point `replica` of a member whose identity hashes to `id` sits on the ring.
#[inline]
fn point(id: u64, replica: u32) -> u64 {
    combine_hash(id, u64::from(replica))
}

/// A consistent-hash ring (Karger et al., 1997) with [`POINTS_PER_WEIGHT`] points per live slot
/// and unit of weight: a key belongs to the slot of the first point at or after the key, going
/// round.
///
/// Slot `s` puts its points at `combine_hash(hash_u64(s), r)` for `r` in `0..50 * weight`, so
/// every member builds the same ring. When a slot dies or joins, only the keys between its points
/// and their predecessors move, and only to or from it. But a dead slot's keys go to the slots
/// whose points follow its 50, not to all survivors, and 50 points leave the loads uneven (the
/// report in the docs measures by how much): the price of the ring's simplicity, measured and not
/// hidden. Lookup is a binary search over the points: `O(log(50 n))`, allocation-free.
#[derive(Debug, Clone)]
pub struct Ring {
    topology: Topology,
    positions: Vec<u64>,
    owners: Vec<u32>,
}

impl Assignor for Ring {
    fn build(topology: &Topology) -> Result<Self, AssignError> {
        topology.require_live()?;
        let points: u64 = topology
            .live_slots()
            .map(|s| u64::from(topology.weight(s).unwrap_or(1)) * u64::from(POINTS_PER_WEIGHT))
            .sum();
        if points > MAX_RING_POINTS {
            return Err(AssignError::RingTooLarge {
                points,
                max: MAX_RING_POINTS,
            });
        }
        let mut ring: Vec<(u64, u32)> = Vec::with_capacity(points as usize);
        for slot in topology.live_slots() {
            let id = hash_u64(u64::from(slot));
            let replicas = topology.weight(slot).unwrap_or(1) * POINTS_PER_WEIGHT;
            ring.extend((0..replicas).map(|r| (point(id, r), slot)));
        }
        // Ties (two points at the same place) go to the lower slot, the same on every member.
        ring.sort_unstable();
        let (positions, owners) = ring.into_iter().unzip();
        Ok(Ring {
            topology: topology.clone(),
            positions,
            owners,
        })
    }

    fn kind(&self) -> AssignorKind {
        AssignorKind::Ring
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }

    #[inline]
    fn owner(&self, key: u64) -> u32 {
        let i = self.positions.partition_point(|&p| p < key);
        // Past the last point: round to the first. The ring is non-empty (build checked).
        let i = if i == self.positions.len() { 0 } else { i };
        self.owners[i]
    }
}

/// The distributor's matching (the article "Distributor"): which work units each service takes.
///
/// As the article describes it: the work units go on a hash ring with [`POINTS_PER_WEIGHT`]
/// points each; the services are sorted, so the order they registered in does not matter; each
/// service in turn takes the work unit of the first point at or after its own hash and that unit
/// leaves the ring, so no unit is matched twice. The article does not say what happens when there
/// are more units than services; here the sorted services take turns until every unit is taken,
/// so each gets `⌊units/services⌋` or one more.
///
/// Returns, for each service in the order given, the indices into `work_units` of its units in
/// the order it took them. Deterministic: the same two sets give the same matching on every
/// machine. Names are hashed with [`hash_bytes`](crate::assign::hash_bytes). Fails on a repeated
/// name, and when there are units but no service; no units gives every service an empty list.
///
/// ```
/// use headcount_core::assign::match_work_units;
/// let matching = match_work_units(&["service1", "service2", "service3"], &["w1", "w2", "w3", "w4", "w5", "w6"])?;
/// assert!(matching.iter().all(|units| units.len() == 2));
/// # Ok::<(), headcount_core::assign::AssignError>(())
/// ```
pub fn match_work_units<S, U>(
    services: &[S],
    work_units: &[U],
) -> Result<Vec<Vec<usize>>, AssignError>
where
    S: AsRef<[u8]>,
    U: AsRef<[u8]>,
{
    check_unique("service", services)?;
    check_unique("work unit", work_units)?;
    let mut matching = vec![Vec::new(); services.len()];
    if work_units.is_empty() {
        return Ok(matching);
    }
    if services.is_empty() {
        return Err(AssignError::NoServices {
            units: work_units.len(),
        });
    }
    let points = work_units.len() as u64 * u64::from(POINTS_PER_WEIGHT);
    if points > MAX_RING_POINTS {
        return Err(AssignError::RingTooLarge {
            points,
            max: MAX_RING_POINTS,
        });
    }

    // (position, unit) sorted; ties broken by the unit's name so the order never depends on
    // the input order.
    let mut ring: Vec<(u64, usize)> = Vec::with_capacity(points as usize);
    for (unit, name) in work_units.iter().enumerate() {
        let id = hash_bytes(name.as_ref());
        ring.extend((0..POINTS_PER_WEIGHT).map(|r| (point(id, r), unit)));
    }
    ring.sort_unstable_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| work_units[a.1].as_ref().cmp(work_units[b.1].as_ref()))
    });
    let positions: Vec<u64> = ring.iter().map(|p| p.0).collect();
    let mut points_of: Vec<Vec<usize>> = vec![Vec::new(); work_units.len()];
    for (i, &(_, unit)) in ring.iter().enumerate() {
        points_of[unit].push(i);
    }
    let mut alive = NextAlive::new(ring.len());

    let mut order: Vec<usize> = (0..services.len()).collect();
    order.sort_by(|&a, &b| services[a].as_ref().cmp(services[b].as_ref()));
    let starts: Vec<usize> = services
        .iter()
        .map(|s| {
            let h = hash_bytes(s.as_ref());
            positions.partition_point(|&p| p < h)
        })
        .collect();

    let mut left = work_units.len();
    'rounds: loop {
        for &service in &order {
            if left == 0 {
                break 'rounds;
            }
            let Some(i) = alive.find(starts[service]) else {
                break 'rounds;
            };
            let unit = ring[i].1;
            matching[service].push(unit);
            for &p in &points_of[unit] {
                alive.remove(p);
            }
            left -= 1;
        }
    }
    Ok(matching)
}

fn check_unique<T: AsRef<[u8]>>(what: &'static str, names: &[T]) -> Result<(), AssignError> {
    let mut sorted: Vec<&[u8]> = names.iter().map(|n| n.as_ref()).collect();
    sorted.sort_unstable();
    match sorted.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(AssignError::DuplicateName {
            what,
            name: String::from_utf8_lossy(w[0]).chars().take(64).collect(),
        }),
        None => Ok(()),
    }
}

/// "The first point still on the ring at or after index i, going round": a union-find over point
/// indices where a removed point links to its successor, so a whole matching costs about
/// `O(points)` instead of rescanning removed points.
struct NextAlive {
    next: Vec<usize>,
    len: usize,
    left: usize,
}

impl NextAlive {
    fn new(len: usize) -> Self {
        NextAlive {
            // next[i] == i: alive. next[len] is a sentinel that wraps to 0.
            next: (0..=len).collect(),
            len,
            left: len,
        }
    }

    fn root(&mut self, mut i: usize) -> usize {
        while self.next[i] != i {
            let parent = self.next[i];
            self.next[i] = self.next[parent];
            i = parent;
        }
        i
    }

    fn find(&mut self, from: usize) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        let r = self.root(from.min(self.len));
        if r < self.len {
            Some(r)
        } else {
            let r = self.root(0);
            (r < self.len).then_some(r)
        }
    }

    fn remove(&mut self, i: usize) {
        if self.next[i] == i {
            self.next[i] = i + 1;
            self.left -= 1;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::{match_work_units, Ring};
    use crate::assign::{AssignError, Assignor, Topology};

    #[test]
    fn matching_covers_every_unit_once_and_balances() {
        let services: Vec<String> = (0..7).map(|i| format!("parser-{i}")).collect();
        let units: Vec<String> = (0..100).map(|i| format!("site-{i}.example")).collect();
        let m = match_work_units(&services, &units).unwrap();
        let mut all: Vec<usize> = m.iter().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..100).collect::<Vec<_>>());
        for units in &m {
            assert!(units.len() == 14 || units.len() == 15, "{}", units.len());
        }
    }

    #[test]
    fn matching_ignores_input_order() {
        let services = ["b", "a", "c"];
        let units = ["u1", "u2", "u3", "u4", "u5"];
        let m1 = match_work_units(&services, &units).unwrap();
        let services2 = ["c", "a", "b"];
        let units2 = ["u5", "u4", "u3", "u2", "u1"];
        let m2 = match_work_units(&services2, &units2).unwrap();
        let names = |m: &[Vec<usize>], s: &[&str], u: &[&str]| {
            let mut v: Vec<(String, Vec<String>)> = m
                .iter()
                .enumerate()
                .map(|(i, us)| {
                    let mut names: Vec<String> = us.iter().map(|&j| u[j].to_owned()).collect();
                    names.sort();
                    (s[i].to_owned(), names)
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            names(&m1, &services, &units),
            names(&m2, &services2, &units2)
        );
    }

    #[test]
    fn matching_edge_cases() {
        let none: [&str; 0] = [];
        assert_eq!(
            match_work_units(&["a"], &none).unwrap(),
            vec![Vec::<usize>::new()]
        );
        assert_eq!(
            match_work_units(&none, &none).unwrap(),
            Vec::<Vec<usize>>::new()
        );
        assert_eq!(
            match_work_units(&none, &["u"]),
            Err(AssignError::NoServices { units: 1 })
        );
        assert!(matches!(
            match_work_units(&["a", "a"], &["u"]),
            Err(AssignError::DuplicateName {
                what: "service",
                ..
            })
        ));
        assert!(matches!(
            match_work_units(&["a"], &["u", "u"]),
            Err(AssignError::DuplicateName {
                what: "work unit",
                ..
            })
        ));
        // More services than units: some get nothing.
        let m = match_work_units(&["a", "b", "c"], &["u"]).unwrap();
        assert_eq!(m.iter().map(Vec::len).sum::<usize>(), 1);
    }

    #[test]
    fn heavy_weights_are_refused_not_allocated() {
        let mut t = Topology::new(2).unwrap();
        t.set_weight(0, u32::MAX).unwrap();
        assert!(matches!(
            Ring::build(&t),
            Err(AssignError::RingTooLarge { .. })
        ));
    }
}
