use std::sync::Arc;

use super::{decode_owners, encode_owners, Sticky};
use crate::assign::{AssignError, Assignor, Balanced, KeySet, Topology};

fn live(slots: &[u32]) -> Topology {
    Topology::from_live_slots(slots.iter().copied()).unwrap()
}

fn moved(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

fn within_one(s: &Sticky) {
    let shares: Vec<usize> = s.shares().into_iter().map(|(_, c)| c).collect();
    let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
    assert!(hi - lo <= 1, "{shares:?}");
    assert_eq!(shares.iter().sum::<usize>(), s.keys().len());
}

/// A small deterministic generator, so the chains below are the same on every run.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

#[test]
fn the_first_assignment_is_the_balanced_one() {
    let keys = Arc::new(KeySet::partitions(256).unwrap());
    let t = live(&[0, 2, 5]);
    let s = Sticky::new(&t, keys.clone()).unwrap();
    let b = Balanced::new(&t, keys.clone()).unwrap();
    for &h in keys.hashes() {
        assert_eq!(s.owner(h), b.owner(h));
    }
}

#[test]
fn a_join_moves_exactly_the_newcomers_share_and_a_leave_exactly_the_leavers_keys() {
    for m in [256u32, 4096] {
        let keys = Arc::new(KeySet::partitions(m).unwrap());
        for n in [3u32, 10, 20] {
            let all: Vec<u32> = (0..n).collect();
            let before = Sticky::new(&live(&all), keys.clone()).unwrap();
            let mut joined: Vec<u32> = all.clone();
            joined.push(n);
            let after = Sticky::next(&live(&joined), keys.clone(), before.owners()).unwrap();
            within_one(&after);
            let share = after.shares().iter().find(|(s, _)| *s == n).unwrap().1;
            assert_eq!(
                moved(before.owners(), after.owners()),
                share,
                "join {m}/{n}"
            );
            // Every key that moved went to the newcomer.
            for (o, a) in before.owners().iter().zip(after.owners()) {
                assert!(o == a || *a == n);
            }
            for leaver in 0..n {
                let rest: Vec<u32> = all.iter().copied().filter(|&s| s != leaver).collect();
                let after = Sticky::next(&live(&rest), keys.clone(), before.owners()).unwrap();
                within_one(&after);
                let held = before.owners().iter().filter(|&&o| o == leaver).count();
                assert_eq!(
                    moved(before.owners(), after.owners()),
                    held,
                    "leave of {leaver}, {m}/{n}"
                );
            }
        }
    }
}

#[test]
fn the_same_live_slots_move_nothing() {
    let keys = Arc::new(KeySet::partitions(1000).unwrap());
    let t = live(&[1, 3, 4, 8, 9, 12, 13]);
    let s = Sticky::new(&t, keys.clone()).unwrap();
    let again = Sticky::next(&t, keys.clone(), s.owners()).unwrap();
    assert_eq!(s.owners(), again.owners());
}

/// The fewest keys any balanced assignment of `m` keys over `live` differs from `previous` by,
/// found by trying every assignment.
fn brute_force_minimum(m: usize, live: &[u32], previous: &[u32]) -> usize {
    let n = live.len();
    let mut best = usize::MAX;
    let total = (n as u64).pow(m as u32);
    for code in 0..total {
        let mut c = code;
        let mut shares = vec![0usize; n];
        let mut diff = 0;
        for p in previous.iter().take(m) {
            let r = (c % n as u64) as usize;
            c /= n as u64;
            shares[r] += 1;
            diff += usize::from(live[r] != *p);
        }
        let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
        if hi - lo <= 1 {
            best = best.min(diff);
        }
    }
    best
}

#[test]
fn every_change_moves_the_fewest_keys_balance_allows() {
    // Arbitrary changes (several slots at once, joins and deaths together) from arbitrary
    // balanced assignments, against the minimum found by trying every assignment.
    let mut rng = Lcg(7);
    for m in 1..=7u32 {
        let keys = Arc::new(KeySet::partitions(m).unwrap());
        for _ in 0..60 {
            let before_live: Vec<u32> = (0..5).filter(|_| rng.next(2) == 0).collect();
            let after_live: Vec<u32> = (0..5).filter(|_| rng.next(2) == 0).collect();
            if before_live.is_empty() || after_live.is_empty() {
                continue;
            }
            let before = Sticky::new(&live(&before_live), keys.clone()).unwrap();
            let after = Sticky::next(&live(&after_live), keys.clone(), before.owners()).unwrap();
            within_one(&after);
            let min = brute_force_minimum(m as usize, &after_live, before.owners());
            assert_eq!(
                moved(before.owners(), after.owners()),
                min,
                "{m} keys, {before_live:?} -> {after_live:?}"
            );
        }
    }
}

#[test]
fn a_long_chain_of_changes_stays_balanced_and_minimal_per_step() {
    let keys = Arc::new(KeySet::partitions(600).unwrap());
    let mut rng = Lcg(11);
    let mut slots: Vec<u32> = (0..8).collect();
    let mut s = Sticky::new(&live(&slots), keys.clone()).unwrap();
    for step in 0..200 {
        let before = s.clone();
        let before_slots = slots.clone();
        if slots.len() > 1 && rng.next(2) == 0 {
            slots.remove(rng.next(slots.len() as u64) as usize);
        } else {
            let free: Vec<u32> = (0..200).filter(|x| !slots.contains(x)).collect();
            slots.push(free[rng.next(free.len() as u64) as usize]);
            slots.sort_unstable();
        }
        s = Sticky::next(&live(&slots), keys.clone(), before.owners()).unwrap();
        within_one(&s);
        let m: usize = 600;
        let n = slots.len();
        let gone = before
            .owners()
            .iter()
            .filter(|o| !slots.contains(o))
            .count();
        // One slot changed: a death moves its keys, a join the newcomer's share.
        let expected = if n < before_slots.len() {
            gone
        } else {
            let newcomer = *slots.iter().find(|x| !before_slots.contains(x)).unwrap();
            s.owners().iter().filter(|&&o| o == newcomer).count()
        };
        assert_eq!(moved(before.owners(), s.owners()), expected, "step {step}");
        assert!(expected <= m.div_ceil(n.min(before_slots.len())));
    }
}

#[test]
fn the_next_assignment_depends_only_on_its_inputs() {
    let names: Vec<String> = (0..300).map(|i| format!("tenant-{i}")).collect();
    let forward = Arc::new(KeySet::new(&names).unwrap());
    let backward = Arc::new(KeySet::new(names.iter().rev()).unwrap());
    let a0 = Sticky::new(&live(&[0, 1, 2, 3]), forward.clone()).unwrap();
    let a = Sticky::next(&live(&[0, 2, 3, 4, 5]), forward, a0.owners()).unwrap();
    let b = Sticky::next(&live(&[0, 2, 3, 4, 5]), backward, a0.owners()).unwrap();
    assert_eq!(a.owners(), b.owners());
}

#[test]
fn a_previous_assignment_of_another_set_starts_afresh() {
    let keys = Arc::new(KeySet::partitions(50).unwrap());
    let t = live(&[0, 1, 2]);
    let fresh = Sticky::new(&t, keys.clone()).unwrap();
    let other = Sticky::next(&t, keys.clone(), &[0, 1]).unwrap();
    assert_eq!(fresh.owners(), other.owners());
    // Every previous owner gone: the same.
    let gone = Sticky::next(&t, keys.clone(), &[9; 50]).unwrap();
    assert_eq!(fresh.owners(), gone.owners());
}

#[test]
fn stored_assignments_are_checked() {
    let keys = Arc::new(KeySet::partitions(4).unwrap());
    let t = live(&[0, 1]);
    assert!(Sticky::from_owners(&t, keys.clone(), vec![0, 1, 0, 1]).is_ok());
    for bad in [vec![0, 1, 0], vec![0, 1, 0, 2], vec![0, 0, 0, 1]] {
        assert!(
            matches!(
                Sticky::from_owners(&t, keys.clone(), bad.clone()),
                Err(AssignError::StoredAssignmentInvalid { .. })
            ),
            "{bad:?}"
        );
    }
    assert_eq!(
        Sticky::from_owners(&Topology::from_live(2, []).unwrap(), keys, vec![]).unwrap_err(),
        AssignError::NoLiveSlot
    );
}

#[test]
fn owners_round_trip_through_their_text() {
    let mut rng = Lcg(3);
    for n in [1usize, 2, 3, 4, 5, 17, 64, 65, 300] {
        let slots: Vec<u32> = (0..n as u32).map(|i| i * 3 + 1).collect();
        for count in [0usize, 1, 2, 3, 7, 8, 9, 100, 257] {
            let owners: Vec<u32> = (0..count)
                .map(|_| slots[rng.next(n as u64) as usize])
                .collect();
            let text = encode_owners(&owners, &slots).unwrap();
            assert!(text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
            assert_eq!(decode_owners(&text, count, &slots), Some(owners.clone()));
            if count > 0 {
                assert_eq!(decode_owners(&text, count + 8, &slots), None);
                assert_eq!(decode_owners(&format!("{text}A"), count, &slots), None);
                assert_eq!(decode_owners(&format!("{text}="), count, &slots), None);
            }
        }
    }
    // Not a live slot.
    assert_eq!(encode_owners(&[5], &[1, 2]), None);
    // Three slots take two bits: rank 3 is past them.
    assert_eq!(decode_owners("Dw", 1, &[1, 2, 3]), None);
    // Padding bits set.
    assert_eq!(decode_owners("AB", 1, &[1, 2]), None);
    // Not the alphabet.
    assert_eq!(decode_owners("A+", 1, &[1, 2]), None);
    // 256 keys over 20 slots: five bits each, 214 characters.
    let keys = Arc::new(KeySet::partitions(256).unwrap());
    let slots: Vec<u32> = (0..20).collect();
    let s = Sticky::new(&live(&slots), keys).unwrap();
    assert_eq!(encode_owners(s.owners(), &slots).unwrap().len(), 214);
}
