//! Headers and deltas: what a member reads of a view change, and that applying it gives the
//! view the publisher wrote, digest for digest.

use std::sync::Arc;

use super::{
    walk_pays, Publication, Snapshot, ViewDelta, ViewHeader, CARRIED_BYTES, CHANGES_WALKED,
    DELTAS_BYTES, DELTAS_MAX, INLINE_MAX, RECORD_COST,
};
use crate::assign::{AssignorKind, KeySet, Sticky, Topology};
use crate::memory::MemoryStore;
use crate::recipes::group::layout::GroupLayout;
use crate::recipes::group::records::{Holder, ViewRecord};
use crate::recipes::group::table::{HeldView, SlotTable};
use crate::{DynStore, Store as _};

fn holders(slots: &[u32], nonce: u64) -> Vec<Holder> {
    slots
        .iter()
        .map(|&slot| Holder {
            slot,
            nonce: nonce + u64::from(slot),
        })
        .collect()
}

/// A view of `slots` under the jumpback assignor.
fn plain(epoch: u64, slots: &[u32]) -> ViewRecord {
    ViewRecord {
        epoch,
        holders: holders(slots, 100),
        assignor: Some(AssignorKind::JumpBackFailover),
        owners: None,
    }
}

/// A sticky view of `slots` over `keys`, following `before` when given.
fn sticky(
    epoch: u64,
    slots: &[u32],
    keys: &Arc<KeySet>,
    before: Option<&ViewRecord>,
) -> ViewRecord {
    let topology = Topology::from_live_slots(slots.iter().copied()).unwrap();
    let owners = match before.and_then(|b| b.owners.clone()) {
        Some(prev) => Sticky::next(&topology, keys.clone(), &prev).unwrap(),
        None => Sticky::new(&topology, keys.clone()).unwrap(),
    };
    ViewRecord {
        epoch,
        holders: holders(slots, 100),
        assignor: Some(AssignorKind::Sticky(keys.id())),
        owners: Some(owners.shared_owners()),
    }
}

#[test]
fn a_delta_turns_one_view_into_the_next() {
    let a = plain(1, &[0, 1, 2, 5]);
    // A join (3), a leave (1), a take-back (5 under a new claim).
    let mut b = plain(2, &[0, 2, 3, 5]);
    b.holders[3].nonce = 999;
    let d = ViewDelta::between(&a, &b).unwrap();
    assert_eq!(d.from, a.digest());
    assert_eq!(d.dropped, vec![1]);
    assert_eq!(
        d.added,
        vec![
            Holder {
                slot: 3,
                nonce: 103
            },
            Holder {
                slot: 5,
                nonce: 999
            }
        ]
    );
    assert!(d.moved.is_empty());
    let applied = d.apply(&a).unwrap();
    assert_eq!(applied.holders, b.holders);
    assert_eq!(applied.digest(), b.digest());
    // A delta does not fit a view that lacks a slot it drops.
    assert_eq!(d.apply(&plain(1, &[0, 2])), None);
}

#[test]
fn a_sticky_delta_carries_only_the_keys_that_moved() {
    let keys = Arc::new(KeySet::partitions(4096).unwrap());
    let slots: Vec<u32> = (0..30).collect();
    let a = sticky(1, &slots, &keys, None);
    let mut more = slots.clone();
    more.push(30);
    let b = sticky(2, &more, &keys, Some(&a));
    let d = ViewDelta::between(&a, &b).unwrap();
    // The minimum: the newcomer's share, 4096 / 31 rounded either way.
    assert!((132..=133).contains(&d.moved.len()), "{}", d.moved.len());
    assert!(d.moved.iter().all(|&(_, s)| s == 30));
    let applied = d.apply(&a).unwrap();
    assert_eq!(applied.owners, b.owners);
    assert_eq!(applied.digest(), b.digest());
    // A view with owners and one without cannot be bridged by a delta.
    assert_eq!(ViewDelta::between(&plain(1, &[0]), &b), None);
}

#[test]
fn headers_round_trip_and_reject_garbage() {
    let keys = Arc::new(KeySet::partitions(64).unwrap());
    let a = sticky(4, &[0, 1, 2], &keys, None);
    let b = sticky(5, &[0, 1, 2, 3], &keys, Some(&a));
    let h = ViewHeader {
        prev: Some(Snapshot {
            epoch: 4,
            view: a.digest(),
        }),
        ..ViewHeader::of(&b, Some(&a), None, DELTAS_BYTES)
    };
    let text = h.to_string();
    assert!(text.starts_with("v2 epoch=5 assignor=sticky:64:"), "{text}");
    assert_eq!(ViewHeader::parse(&text), Some(h.clone()));
    let first = ViewHeader::of(&plain(1, &[0]), None, None, DELTAS_BYTES);
    assert_eq!(first.prev, None);
    assert!(first.deltas.is_empty());
    assert_eq!(ViewHeader::parse(&first.to_string()), Some(first.clone()));
    // A header is not a whole view, nor the reverse.
    assert_eq!(ViewRecord::parse(&text), None);
    assert_eq!(ViewHeader::parse(&a.to_string()), None);
    let digest = format!("{:016x}", first.view);
    for bad in [
        String::new(),
        "v2".into(),
        format!("v1 epoch=1 view={digest} prev= deltas="),
        format!("v2 epoch=1 view={digest} prev= deltas= extra=1"),
        format!("v2 epoch=1 view={digest} deltas="),
        format!("v2 epoch=x view={digest} prev= deltas="),
        "v2 epoch=1 view=zz prev= deltas=".to_string(),
        format!("v2 epoch=1 view={digest} prev=7 deltas="),
        format!("v2 epoch=1 view={digest} prev= deltas=00/1@1/2"),
        // Not ascending: slots added, slots dropped, keys moved.
        format!("v2 epoch=1 view={digest} prev= deltas=0000000000000001/2@1,1@1//"),
        format!("v2 epoch=1 view={digest} prev= deltas=0000000000000001//2,2/"),
        format!("v2 epoch=1 view={digest} prev= deltas=0000000000000001///1:3.0"),
        format!("v2 epoch=1 view={digest} prev= deltas=0000000000000001///1:3+2:3"),
        format!("v2 epoch=1 view={digest} prev= deltas=0000000000000001///1:zz"),
        format!("v2 epoch=9223372036854775807 view={digest} prev= deltas="),
        format!("v2 epoch=1 assignor=nope view={digest} prev= deltas="),
    ] {
        assert_eq!(ViewHeader::parse(&bad), None, "{bad:?}");
    }
}

#[test]
fn a_member_follows_the_deltas_it_holds_the_start_of() {
    // Few keys, so that each change is small and the header carries three.
    let keys = Arc::new(KeySet::partitions(64).unwrap());
    let v1 = sticky(1, &[0, 1, 2], &keys, None);
    let v2 = sticky(2, &[0, 1, 2, 3], &keys, Some(&v1));
    let v3 = sticky(3, &[0, 2, 3], &keys, Some(&v2));
    let v4 = sticky(4, &[0, 2, 3, 4], &keys, Some(&v3));
    let h2 = ViewHeader::of(&v2, Some(&v1), None, DELTAS_BYTES);
    let h3 = ViewHeader::of(&v3, Some(&v2), Some(&h2), DELTAS_BYTES);
    let h4 = ViewHeader::of(&v4, Some(&v3), Some(&h3), DELTAS_BYTES);
    assert_eq!(h4.deltas.len(), 3);
    assert_eq!(h4.prev, Some(h3.snapshot()));
    for held in [&v1, &v2, &v3, &v4] {
        let got = h4.follow(held).unwrap();
        assert_eq!(got, v4, "from epoch {}", held.epoch);
    }
    // A view the deltas do not start from: read the snapshot.
    let other = sticky(1, &[0, 5], &keys, None);
    assert_eq!(h4.follow(&other), None);
    // A delta that was tampered with leads elsewhere: the digest refuses it.
    let mut bad = h4.clone();
    bad.deltas[0].moved[0].1 = 0;
    assert_eq!(bad.follow(&v3), None);
    // The snapshot is the whole view; another view's text is refused.
    assert_eq!(h4.from_snapshot(&v4.to_string()), Some(v4.clone()));
    assert_eq!(h4.from_snapshot(&v3.to_string()), None);
    assert_eq!(h4.from_snapshot("garbage"), None);
}

#[test]
fn a_header_keeps_the_newest_deltas_that_fit() {
    let mut views = vec![plain(1, &[0])];
    let mut header: Option<ViewHeader> = None;
    for e in 2..=10u32 {
        let slots: Vec<u32> = (0..e).collect();
        let next = plain(u64::from(e), &slots);
        header = Some(ViewHeader::of(
            &next,
            views.last(),
            header.as_ref(),
            DELTAS_BYTES,
        ));
        views.push(next);
    }
    let h = header.unwrap();
    assert_eq!(h.deltas.len(), DELTAS_MAX);
    assert_eq!(
        h.follow(&views[views.len() - 1 - DELTAS_MAX]),
        views.last().cloned()
    );
    assert_eq!(h.follow(&views[views.len() - 2 - DELTAS_MAX]), None);
    // A change past the byte limit is not carried at all: the snapshot is read.
    let many: Vec<u32> = (0..2000).collect();
    let big = plain(11, &many);
    let h = ViewHeader::of(&big, views.last(), Some(&h), 1024);
    assert!(h.deltas.is_empty());
    assert!(h.to_string().len() < DELTAS_BYTES);
}

#[test]
fn long_views_are_written_as_a_header_and_a_snapshot() {
    // Short: whole, one compare-and-set.
    let small = plain(2, &[0, 1]);
    let p = Publication::of(&small, Some(&plain(1, &[0])), None, INLINE_MAX);
    assert!(p.is_whole());
    assert_eq!(p.current, small.to_string());
    // Long: a header naming the snapshot, and the snapshot is the whole view.
    let keys = Arc::new(KeySet::partitions(65_536).unwrap());
    let slots: Vec<u32> = (0..300).collect();
    let a = sticky(7, &slots, &keys, None);
    let pa = Publication::of(&a, None, None, INLINE_MAX);
    let (snap_a, whole) = pa.snapshot.clone().unwrap();
    assert_eq!(
        snap_a,
        Snapshot {
            epoch: 7,
            view: a.digest()
        }
    );
    assert_eq!(whole, a.to_string());
    assert!(pa.stale.is_empty());
    let ha = ViewHeader::parse(&pa.current).unwrap();
    // One join: what every member holding `a` reads is the header, a few KB against ~100 KB.
    let mut more = slots.clone();
    more.push(300);
    let b = sticky(8, &more, &keys, Some(&a));
    let pb = Publication::of(&b, Some(&a), Some(&ha), INLINE_MAX);
    let hb = ViewHeader::parse(&pb.current).unwrap();
    assert_eq!(hb.prev, Some(snap_a));
    assert!(
        pb.stale.is_empty(),
        "the replaced view's snapshot stays one view more"
    );
    assert!(
        pb.current.len() * 40 < b.to_string().len(),
        "{} against {}",
        pb.current.len(),
        b.to_string().len()
    );
    assert_eq!(hb.follow(&a), Some(b.clone()));
    // The view after: the snapshot of two views ago goes.
    let c = sticky(9, &slots, &keys, Some(&b));
    let pc = Publication::of(&c, Some(&b), Some(&hb), INLINE_MAX);
    assert_eq!(pc.stale, vec![snap_a]);
    // Back to a short view: both snapshots go.
    let hc = ViewHeader::parse(&pc.current).unwrap();
    let pd = Publication::of(&plain(10, &[0]), Some(&c), Some(&hc), INLINE_MAX);
    assert!(pd.snapshot.is_none());
    assert_eq!(pd.stale, vec![hb.snapshot(), hc.snapshot()]);
    // Every view written whole, the design before.
    assert!(Publication::of(&b, Some(&a), None, usize::MAX).is_whole());
}

/// A large change (a leave under the sticky assignor moves hundreds of keys) travels alone in
/// the header, so what every member reads of it is about the change; each change is also in
/// its change record, keyed by the digest of the view it leads to, so a member that missed the
/// ones before walks back to a view it holds.
#[test]
fn a_large_change_travels_alone_and_is_kept_in_its_record() {
    let keys = Arc::new(KeySet::partitions(65_536).unwrap());
    let slots: Vec<u32> = (0..100).collect();
    let v1 = sticky(1, &slots, &keys, None);
    let v2 = sticky(2, &slots[1..], &keys, Some(&v1));
    let v3 = sticky(3, &slots[2..], &keys, Some(&v2));
    let p1 = Publication::of(&v1, None, None, INLINE_MAX);
    let h1 = ViewHeader::parse(&p1.current).unwrap();
    assert_eq!(p1.change, None, "the first header has no change");
    let p2 = Publication::of(&v2, Some(&v1), Some(&h1), INLINE_MAX);
    let h2 = ViewHeader::parse(&p2.current).unwrap();
    let p3 = Publication::of(&v3, Some(&v2), Some(&h2), INLINE_MAX);
    let h3 = ViewHeader::parse(&p3.current).unwrap();
    assert!(h3.deltas[0].to_string().len() > CARRIED_BYTES);
    assert_eq!(h3.deltas.len(), 1, "the change before is not carried");
    assert!(p3.current.len() < h3.deltas[0].to_string().len() + 200);
    // Its record: the digest of the view it leads to, and the delta.
    assert_eq!(p3.change, Some((v3.digest(), h3.deltas[0].to_string())));
    let (_, text2) = p2.change.clone().unwrap();
    let older = ViewDelta::parse(&text2).unwrap();
    assert_eq!(older.from, v1.digest());
    // v1 is two changes back: the header alone does not reach it; through v2's record it does.
    assert_eq!(h3.follow(&v1), None);
    assert_eq!(
        h3.follow_through(std::slice::from_ref(&older), &v1, v1.digest()),
        Some(v3.clone())
    );
    // A record that leads elsewhere is refused by the digest.
    let mut bad = older.clone();
    bad.moved[0].1 = 99;
    assert_eq!(h3.follow_through(&[bad], &v1, v1.digest()), None);
}

/// A walk through the records pays when it reads a few small records instead of a large
/// snapshot, and not when the member is further behind, or the view is short.
#[test]
fn a_walk_reads_a_few_records_instead_of_a_large_snapshot() {
    // 300 members over 65,536 keys (a snapshot of about 100 KB): up to the walk's limit.
    assert!(walk_pays(10, 100_000, 12, 1, RECORD_COST));
    assert!(walk_pays(
        10,
        100_000,
        11 + CHANGES_WALKED as u64,
        1,
        RECORD_COST
    ));
    assert!(!walk_pays(
        10,
        100_000,
        12 + CHANGES_WALKED as u64,
        1,
        RECORD_COST
    ));
    // Nothing missed beyond what the header carries: no walk.
    assert!(!walk_pays(10, 100_000, 11, 1, RECORD_COST));
    // A view of a few KB: one record costs about what the snapshot does.
    assert!(!walk_pays(10, 6_000, 12, 1, RECORD_COST));
    assert!(walk_pays(10, 30_000, 13, 1, RECORD_COST));
    assert!(!walk_pays(10, 30_000, 15, 1, RECORD_COST));
    // Records that cost nothing (the simulation's setting): any walk within the limit.
    assert!(walk_pays(10, 100, 12, 1, 0));
    assert!(!walk_pays(10, 100, 12 + CHANGES_WALKED as u64, 1, 0));
}

/// Writes `value` at `key` whatever it holds.
async fn put(store: &MemoryStore, key: &str, value: &str) {
    let current = store.get(key).await.unwrap();
    assert!(store
        .compare_and_set(key, current.as_deref(), value, None)
        .await
        .unwrap());
}

/// What a member that missed changes pays: the header and one small record per change it
/// missed, read from a store; no snapshot while the records lead to a view it holds, and the
/// snapshot once it is further behind than [`CHANGES_WALKED`] records (or a record is gone).
#[tokio::test]
async fn a_member_behind_walks_the_change_records_back_to_a_view_it_holds() {
    let store = Arc::new(MemoryStore::default());
    let dyn_store: DynStore = store.clone();
    let layout = GroupLayout::new(crate::keys::Keyspace::new("g").unwrap());
    let keys = Arc::new(KeySet::partitions(65_536).unwrap());
    let slots: Vec<u32> = (0..40).collect();
    let mut views = vec![sticky(1, &slots, &keys, None)];
    let mut header: Option<ViewHeader> = None;
    let write = |p: &Publication| {
        let store = store.clone();
        let (p, layout) = (p.clone(), layout.clone());
        async move {
            let (snap, text) = p.snapshot.clone().unwrap();
            put(&store, &layout.base(snap), &text).await;
            put(&store, &layout.view, &p.current).await;
            if let Some((view, text)) = &p.change {
                put(&store, &layout.change(*view), text).await;
            }
        }
    };
    // Every change drops one slot: each moves about a fortieth of the 65,536 keys.
    for e in 1..=(CHANGES_WALKED as u64 + 3) {
        let prev = views.last().unwrap();
        let next = if e == 1 {
            prev.clone()
        } else {
            sticky(e, &slots[(e as usize - 1)..], &keys, Some(prev))
        };
        let p = Publication::of(&next, (e > 1).then_some(prev), header.as_ref(), INLINE_MAX);
        write(&p).await;
        header = Some(ViewHeader::parse(&p.current).unwrap());
        if e > 1 {
            views.push(next);
        }
    }
    let newest = views.last().unwrap().clone();
    let snapshot_key = layout.base(header.as_ref().unwrap().snapshot());
    let snapshot = store.get(&snapshot_key).await.unwrap();
    // No snapshot: a member can resolve the view only through the header and the records.
    store.delete(&snapshot_key).await.unwrap();
    let read = |held: ViewRecord| {
        let (store, layout) = (dyn_store.clone(), layout.clone());
        async move {
            let held = [HeldView {
                view: &held,
                digest: None,
            }];
            SlotTable::read(&store, &layout, &held, RECORD_COST)
                .await
                .unwrap()
                .view
        }
    };
    for back in 1..=CHANGES_WALKED + 1 {
        let held = views[views.len() - 1 - back].clone();
        assert_eq!(
            read(held).await.as_ref(),
            Some(&newest),
            "{back} changes behind"
        );
    }
    // One change more than the walk reads: the snapshot, which is gone here.
    let far = views[views.len() - 1 - (CHANGES_WALKED + 2)].clone();
    assert_eq!(read(far.clone()).await, None);
    put(&store, &snapshot_key, snapshot.as_deref().unwrap()).await;
    assert_eq!(read(far).await.as_ref(), Some(&newest));
}
