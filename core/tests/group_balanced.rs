//! The assignors for a declared key set in a group on the in-memory store, the sticky one
//! (the default of `with_keys`) and the stateless balanced one: shares within one of each
//! other, a declared set that differs is refused, a leave keeps the shares balanced, and with
//! the sticky assignor a join and a leave move exactly the keys they must.
// Tests fail by panicking.
#![allow(clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use headcount_core::assign::{AssignorKind, KeySet};
use headcount_core::memory::MemoryStore;
use headcount_core::recipes::group::{Group, GroupConfig, Member};
use headcount_core::{DynStore, ErrorKind};

const TTL: Duration = Duration::from_millis(300);

/// Waits (5 s at most) until every member is active in one view with `n` live slots and every
/// partition has exactly one owner; returns each member's count of `keys`.
async fn converged_shares(members: &[&Member], n: u32, keys: &[String]) -> Vec<usize> {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let views: Vec<_> = members.iter().map(|m| m.assignment()).collect();
            let same = views
                .iter()
                .all(|a| a.replicas == n && a.index.is_some() && a.epoch == views[0].epoch);
            if same {
                let counts: Vec<usize> = members
                    .iter()
                    .map(|m| keys.iter().filter(|k| m.would_grant(k).is_some()).count())
                    .collect();
                if counts.iter().sum::<usize>() == keys.len() {
                    return counts;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the group converges within 5 s")
}

/// 256 partitions under the sticky assignor, or under the stateless balanced one.
fn partitions(sticky: bool) -> GroupConfig {
    let config = GroupConfig::new("g", TTL).with_partitions(256);
    if sticky {
        config
    } else {
        let id = KeySet::partitions(256).expect("keys").id();
        config.with_assignor(AssignorKind::Balanced(id))
    }
}

#[tokio::test]
async fn three_members_own_85_or_86_of_256_partitions() {
    three_members_own_85_or_86(true).await;
    three_members_own_85_or_86(false).await;
}

async fn three_members_own_85_or_86(sticky: bool) {
    let store: DynStore = Arc::new(MemoryStore::new());
    let config = || partitions(sticky);
    let a = Group::join(store.clone(), config()).await.expect("a joins");
    let b = Group::join(store.clone(), config()).await.expect("b joins");
    let c = Group::join(store.clone(), config()).await.expect("c joins");
    let keys: Vec<String> = (0..256).map(|i| i.to_string()).collect();
    let counts = converged_shares(&[&a, &b, &c], 3, &keys).await;
    assert!(counts.iter().all(|&c| c == 85 || c == 86), "{counts:?}");
    // No partition has two owners.
    for k in &keys {
        let owners = [&a, &b, &c]
            .iter()
            .filter(|m| m.would_grant(k).is_some())
            .count();
        assert_eq!(owners, 1, "{k}");
    }
    // A key outside the set still has exactly one owner (jumpback's).
    let outside = [&a, &b, &c]
        .iter()
        .filter(|m| m.would_grant("not-a-partition").is_some())
        .count();
    assert_eq!(outside, 1);
    // A grant works as with the hashing assignors.
    let owner = [&a, &b, &c]
        .into_iter()
        .find(|m| m.would_grant("42").is_some())
        .expect("an owner");
    let grant = owner.owns("42").expect("granted");
    assert!(grant.is_valid());
    drop(grant);

    // c leaves: a and b split the 256 as 128 each.
    c.leave().await.expect("c leaves");
    let counts = converged_shares(&[&a, &b], 2, &keys).await;
    assert_eq!(counts, [128, 128]);
    a.leave().await.expect("leave a");
    b.leave().await.expect("leave b");
}

#[tokio::test]
async fn a_member_declaring_another_set_is_refused() {
    let store: DynStore = Arc::new(MemoryStore::new());
    let a = Group::join(
        store.clone(),
        GroupConfig::new("g", TTL).with_partitions(256),
    )
    .await
    .expect("a joins");
    tokio::time::timeout(Duration::from_secs(5), a.active(0))
        .await
        .expect("in time")
        .expect("active");
    // A rolling upgrade that adds partitions, another naming of the keys, a hashing assignor.
    for other in [
        GroupConfig::new("g", TTL).with_partitions(257),
        GroupConfig::new("g", TTL)
            .with_keys(KeySet::new((0..256).map(|i| format!("p{i:03}"))).expect("keys")),
        GroupConfig::new("g", TTL),
    ] {
        let err = Group::join(store.clone(), other)
            .await
            .expect_err("another set is refused");
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.to_string().contains("sticky:256:"), "{err}");
    }
    // The stateless balanced assignor over the same set maps keys differently: refused too.
    let err = Group::join(store.clone(), partitions(false))
        .await
        .expect_err("balanced is refused");
    assert!(err.to_string().contains("balanced:256:"), "{err}");
    // The same set, declared by name in another order, joins.
    let same = KeySet::new((0..256).rev().map(|i| i.to_string())).expect("keys");
    let b = Group::join(store.clone(), GroupConfig::new("g", TTL).with_keys(same))
        .await
        .expect("the same set joins");
    b.leave().await.expect("leave b");
    a.leave().await.expect("leave a");
}

#[test]
fn bad_declarations_are_configuration_errors() {
    let empty = GroupConfig::new("g", TTL).with_partitions(0);
    assert_eq!(
        empty.validate().expect_err("empty").kind(),
        ErrorKind::Config
    );
    let too_many = GroupConfig::new("g", TTL).with_partitions(u32::MAX);
    assert_eq!(
        too_many.validate().expect_err("too many").kind(),
        ErrorKind::Config
    );
    let replaced = GroupConfig::new("g", TTL)
        .with_partitions(8)
        .with_assignor(AssignorKind::JumpBackFailover);
    assert_eq!(
        replaced.validate().expect_err("replaced").kind(),
        ErrorKind::Config
    );
    // An id with no keys behind it cannot be built.
    let foreign: AssignorKind = "balanced:8:0123456789abcdef".parse().expect("parses");
    let err = GroupConfig::new("g", TTL)
        .with_assignor(foreign)
        .validate()
        .expect_err("no keys");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    // By count alone, partitions need no keys.
    let by_name: AssignorKind = "balanced:8".parse().expect("parses");
    GroupConfig::new("g", TTL)
        .with_assignor(by_name)
        .validate()
        .expect("partitions rebuild from their count");
}

/// Which member owns each of `keys`, by member index, once the members agree.
fn owners(members: &[&Member], keys: &[String]) -> Vec<usize> {
    keys.iter()
        .map(|k| {
            members
                .iter()
                .position(|m| m.would_grant(k).is_some())
                .expect("an owner")
        })
        .collect()
}

#[tokio::test]
async fn with_the_sticky_assignor_a_join_and_a_leave_move_exactly_what_they_must() {
    let store: DynStore = Arc::new(MemoryStore::new());
    let keys: Vec<String> = (0..256).map(|i| i.to_string()).collect();
    let a = Group::join(store.clone(), partitions(true))
        .await
        .expect("a");
    let b = Group::join(store.clone(), partitions(true))
        .await
        .expect("b");
    let c = Group::join(store.clone(), partitions(true))
        .await
        .expect("c");
    converged_shares(&[&a, &b, &c], 3, &keys).await;
    let three = owners(&[&a, &b, &c], &keys);
    // d joins: it takes 64, each of 21 or 22 from the others, and nothing else moves.
    let d = Group::join(store.clone(), partitions(true))
        .await
        .expect("d");
    let counts = converged_shares(&[&a, &b, &c, &d], 4, &keys).await;
    assert_eq!(counts, [64, 64, 64, 64]);
    let four = owners(&[&a, &b, &c, &d], &keys);
    let moved = three.iter().zip(&four).filter(|(x, y)| x != y).count();
    assert_eq!(moved, 64, "a join moves the newcomer's share");
    assert!(three.iter().zip(&four).all(|(x, y)| x == y || *y == 3));
    // b leaves: its 64 keys move, and only they.
    b.leave().await.expect("b leaves");
    let counts = converged_shares(&[&a, &c, &d], 3, &keys).await;
    assert!(counts.iter().all(|&n| n == 85 || n == 86), "{counts:?}");
    let after = owners(&[&a, &c, &d], &keys);
    let stayed = |before: usize, now: usize| match before {
        0 => now == 0,
        2 => now == 1,
        3 => now == 2,
        _ => true,
    };
    let moved = four
        .iter()
        .zip(&after)
        .filter(|&(&x, &y)| !stayed(x, y))
        .count();
    assert_eq!(moved, 0, "only the leaver's keys moved");
    for m in [a, c, d] {
        m.leave().await.expect("leave");
    }
}

/// Joins and waits (5 s at most) until the member is active.
async fn join_active(store: &DynStore, config: GroupConfig) -> Member {
    let m = Group::join(store.clone(), config).await.expect("joins");
    tokio::time::timeout(Duration::from_secs(5), m.active(0))
        .await
        .expect("in time")
        .expect("active");
    m
}

/// One member active alone in group `g` under the default assignor; its epoch, and the view's
/// key and text.
async fn alone(store: &DynStore) -> (Member, u64, &'static str, String) {
    let a = join_active(store, GroupConfig::new("g", TTL)).await;
    let key = "hc:{g}:view:current";
    let text = store.get(key).await.expect("get").expect("a view");
    let epoch = a.assignment().epoch;
    (a, epoch, key, text)
}

/// Writes `next` over the view `text`, then waits three heartbeats and checks the member kept
/// `epoch` and says `why`.
async fn kept_its_view(
    store: &DynStore,
    a: &Member,
    epoch: u64,
    text: &str,
    next: &str,
    why: &str,
) {
    let key = "hc:{g}:view:current";
    assert_ne!(next, text);
    assert!(store
        .compare_and_set(key, Some(text), next, None)
        .await
        .expect("cas"));
    tokio::time::sleep(TTL).await;
    let now = a.assignment();
    assert_eq!(now.epoch, epoch, "{now:?}");
    assert!(
        now.last_error.as_deref().is_some_and(|e| e.contains(why)),
        "{now:?}"
    );
}

/// A view published with another assignor (written here by hand; in life, a member of another
/// configuration that joined while the view was missing) is neither adopted nor acknowledged:
/// computing its owners with this member's assignor would grant keys another member holds under
/// the same epoch. The member keeps its view and says why.
#[tokio::test]
async fn a_view_of_another_assignor_is_not_adopted() {
    let store: DynStore = Arc::new(MemoryStore::new());
    let (a, epoch, _, text) = alone(&store).await;
    let other = text
        .replace(" assignor=jumpback ", " assignor=modulo ")
        .replace(&format!("epoch={epoch} "), &format!("epoch={} ", epoch + 1));
    kept_its_view(&store, &a, epoch, &text, &other, "`modulo` assignor").await;
    assert!(
        a.owns("some-key").is_some(),
        "it keeps working under its view"
    );
    a.leave().await.expect("leave");
}

/// A view a later version of headcount wrote (an assignor or a field this version does not know)
/// is neither replaced nor adopted while a holder it names is live, and a member does not join
/// the group then: replacing it would undo the newer members' changes, and reading it without
/// the unknown part would compute other owners under the same epoch.
#[tokio::test]
async fn a_view_of_a_later_version_is_left_alone() {
    let store: DynStore = Arc::new(MemoryStore::new());
    let (a, epoch, key, text) = alone(&store).await;
    let later = format!(
        "{} shards=4",
        text.replace(&format!("epoch={epoch} "), &format!("epoch={} ", epoch + 1))
    );
    kept_its_view(&store, &a, epoch, &text, &later, "later version").await;
    assert_eq!(
        store.get(key).await.expect("get").as_deref(),
        Some(later.as_str()),
        "the later version's view was replaced"
    );
    let err = Group::join(store.clone(), GroupConfig::new("g", TTL))
        .await
        .expect_err("a member of this version does not join");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("later version"), "{err}");
    // Once no holder it names is live, it is replaced like a garbled view: a member joins.
    a.leave().await.expect("leave");
    let b = join_active(&store, GroupConfig::new("g", TTL)).await;
    assert!(b.assignment().epoch > epoch + 1);
    b.leave().await.expect("leave");
}
