//! What `status --watch` and the group page remember between two reads of a group: the view
//! changes they saw (the store keeps only the newest view), how long each took to settle, and
//! the owners of the grid's keys under the newest view.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

use headcount::recipes::group::GroupStatus;

/// The most view changes kept.
const KEPT: usize = 100;

/// One view change as seen by an [`Observer`].
#[derive(Debug, Clone)]
pub struct Seen {
    /// The view's epoch.
    pub epoch: u64,
    /// When this observer first read it.
    pub at: SystemTime,
    /// How many slots it names.
    pub slots: usize,
    /// The member ids of the claims it names that the previous view seen did not.
    pub joined: Vec<String>,
    /// The member ids of the claims the previous view seen named and it does not.
    pub left: Vec<String>,
    /// How many of the grid's keys changed owner from the previous view seen, when both were
    /// mapped over the same keys.
    pub moved: Option<u64>,
    /// How many keys the grid maps.
    pub keys: Option<usize>,
    /// Milliseconds from `at` to the first read that found the view settled; 0 when it was
    /// settled at the first read.
    pub settled_after_ms: Option<u64>,
    /// Whether this is the view the observer found when it started (its `joined` lists every
    /// member then, and `moved` is unknown).
    pub first: bool,
}

/// The previous reads of one group, for `status --watch` and the group page.
#[derive(Debug, Default)]
pub struct Observer {
    seen: VecDeque<Seen>,
    /// The claims of the newest view seen, with their member ids.
    holders: BTreeMap<(u32, u64), String>,
    /// The owners of the grid's keys under the newest view seen.
    owners: Option<(u64, Arc<Vec<Option<u32>>>)>,
}

impl Observer {
    /// Takes in a read of the group made at `now`; `sample` is the number of sample keys the
    /// grid maps when the group declares no keys. Returns whether the published view changed.
    pub fn observe(&mut self, s: &GroupStatus, now: SystemTime, sample: u64) -> bool {
        let Some(view) = &s.table.view else {
            return false;
        };
        let changed = self.seen.back().is_none_or(|last| last.epoch != view.epoch);
        if changed {
            let holders: BTreeMap<(u32, u64), String> = view
                .holders
                .iter()
                .map(|h| {
                    let member = s
                        .table
                        .slots
                        .get(&h.slot)
                        .filter(|r| r.nonce == h.nonce)
                        .map_or_else(|| format!("slot {}", h.slot), |r| r.member.clone());
                    ((h.slot, h.nonce), member)
                })
                .collect();
            let names = |m: &BTreeMap<(u32, u64), String>, other: &BTreeMap<(u32, u64), String>| {
                m.iter()
                    .filter(|(k, _)| !other.contains_key(k))
                    .map(|(_, name)| name.clone())
                    .collect::<BTreeSet<String>>()
                    .into_iter()
                    .collect::<Vec<String>>()
            };
            let owners = s.owners(sample).map(Arc::new);
            let moved = match (&self.owners, &owners) {
                (Some((_, old)), Some(new)) if old.len() == new.len() => {
                    Some(old.iter().zip(new.iter()).filter(|(a, b)| a != b).count() as u64)
                }
                _ => None,
            };
            let first = self.seen.is_empty();
            self.seen.push_back(Seen {
                epoch: view.epoch,
                at: now,
                slots: view.holders.len(),
                joined: names(&holders, &self.holders),
                left: names(&self.holders, &holders),
                moved: if first { None } else { moved },
                keys: owners.as_ref().map(|o| o.len()),
                settled_after_ms: None,
                first,
            });
            if self.seen.len() > KEPT {
                self.seen.pop_front();
            }
            self.holders = holders;
            self.owners = owners.map(|o| (view.epoch, o));
        }
        if let Some(last) = self.seen.back_mut() {
            if s.view_settled && last.settled_after_ms.is_none() {
                let after = now.duration_since(last.at).unwrap_or_default();
                last.settled_after_ms = Some(u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
            }
        }
        changed
    }

    /// The view changes seen, oldest first.
    pub fn seen(&self) -> impl Iterator<Item = &Seen> {
        self.seen.iter()
    }

    /// When the view of `epoch` was first read, if it was.
    pub fn first_seen(&self, epoch: u64) -> Option<SystemTime> {
        self.seen
            .iter()
            .rev()
            .find(|c| c.epoch == epoch)
            .map(|c| c.at)
    }

    /// The epoch and the owners of the grid's keys under the newest view seen.
    pub fn owners(&self) -> Option<(u64, Arc<Vec<Option<u32>>>)> {
        self.owners.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use headcount::assign::AssignorKind;
    use headcount::recipes::group::{SettledRecord, SlotRecord, SlotTable, ViewRecord};

    use super::*;

    /// A read of a group whose view of `epoch` names `members` (slot, id), settled or not.
    fn read(epoch: u64, members: &[(u32, &str)], settled: bool) -> GroupStatus {
        let mut table = SlotTable::default();
        for &(slot, id) in members {
            let record = SlotRecord {
                member: id.to_owned(),
                nonce: 100 + u64::from(slot),
                since_ms: 1,
                ttl_ms: 1000,
                acked: 0,
                view: 0,
                parked: None,
                grace: None,
            };
            table.slots.insert(slot, record);
        }
        let view = ViewRecord {
            epoch,
            holders: table.live(),
            assignor: Some(AssignorKind::JumpBackFailover),
            owners: None,
        };
        table.settled = settled.then(|| SettledRecord {
            epoch,
            view: view.digest(),
        });
        table.view = Some(view);
        GroupStatus::of_table(table, AssignorKind::JumpBackFailover)
    }

    #[test]
    fn the_timeline_records_joins_leaves_moves_and_settling() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let ms = |n| t0 + Duration::from_millis(n);
        let mut o = Observer::default();
        assert!(o.observe(&read(2, &[(0, "a"), (1, "b")], true), ms(0), 1000));
        assert!(!o.observe(&read(2, &[(0, "a"), (1, "b")], true), ms(250), 1000));
        assert!(o.observe(
            &read(3, &[(0, "a"), (1, "b"), (2, "c")], false),
            ms(500),
            1000
        ));
        assert!(!o.observe(
            &read(3, &[(0, "a"), (1, "b"), (2, "c")], true),
            ms(1250),
            1000
        ));
        assert!(o.observe(&read(4, &[(1, "b"), (2, "c")], false), ms(1500), 1000));
        let seen: Vec<&Seen> = o.seen().collect();
        assert_eq!(seen.len(), 3);
        assert!(seen[0].first && seen[0].joined == ["a", "b"] && seen[0].moved.is_none());
        assert_eq!(seen[0].settled_after_ms, Some(0));
        assert_eq!(
            (seen[1].joined.clone(), seen[1].left.clone()),
            (vec!["c".to_owned()], vec![])
        );
        assert_eq!(seen[1].settled_after_ms, Some(750));
        // A third slot takes about a third of the keys from the other two.
        let moved = seen[1].moved.expect("keys mapped in both views");
        assert!(
            (250..420).contains(&moved),
            "{moved} of 1000 moved to a third member"
        );
        assert_eq!(seen[2].left, ["a"]);
        assert_eq!(seen[2].settled_after_ms, None);
        assert_eq!(o.first_seen(3), Some(ms(500)));
        assert_eq!(o.owners().map(|(e, k)| (e, k.len())), Some((4, 1000)));
    }
}
