//! The group under test and what it costs the store: members in this process over one store
//! that counts its calls by method, and the conditions the experiments wait for.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use headcount::recipes::group::{Assignment, Group, GroupConfig, GroupPhase, Member};
use headcount::{Capabilities, DynStore, Op};
use headcount_conformance::{Decorated, Hooks};
use tokio::sync::watch;

/// The key prefix of every group the bench makes.
pub(crate) const PREFIX: &str = "hcb";

/// Counts the calls made through a [`Decorated`] store, by method; the store delegates each to
/// the inner store (so a backend's native `renew_and_list` is used when it has one).
#[derive(Debug, Default)]
pub(crate) struct Counting {
    calls: [AtomicU64; Op::ALL.len()],
    /// Calls that failed or took longer than [`SLOW`], by method.
    slow: [AtomicU64; Op::ALL.len()],
    /// Reads (`get`, `list`, and the listings of `renew_and_list_if_changed`) by the kind of
    /// key or directory read: what a member reads a view change with, and who reads the table.
    reads: [[AtomicU64; KEY_KINDS.len()]; READ_OPS.len()],
}

/// The calls counted by the kind of key they read ([`Counting::reads_snapshot`]), and the word
/// their counts are named after: a `get` by the key's kind alone (`view`), the others after it
/// (`list slot`, `renewal view`).
const READ_OPS: [(Op, &str); 3] = [
    (Op::Get, ""),
    (Op::List, "list "),
    (Op::RenewAndListIfChanged, "renewal "),
];

/// The names of the reads' counts, by [`READ_OPS`] and then by [`KEY_KINDS`].
fn read_names() -> &'static [Vec<&'static str>] {
    static NAMES: OnceLock<Vec<Vec<&'static str>>> = OnceLock::new();
    NAMES.get_or_init(|| {
        READ_OPS
            .iter()
            .map(|(_, word)| {
                KEY_KINDS
                    .iter()
                    .map(|k| &*Box::leak(format!("{word}{k}").into_boxed_str()))
                    .collect()
            })
            .collect()
    })
}

/// The kinds of key or directory a read is counted under ([`Counting::reads_snapshot`]): the
/// part of the group's key after its name (`view`, `change`, `base`, `ack`, `slot`, ...); the last one
/// counts the rest.
const KEY_KINDS: [&str; 8] = [
    "view", "change", "base", "ack", "slot", "member", "standby", "other",
];

/// A call slower than this is counted apart (a congested store or client).
pub(crate) const SLOW: Duration = Duration::from_millis(500);

#[async_trait]
impl Hooks for Counting {
    async fn before(&self, op: Op) -> headcount::Result<()> {
        self.calls[Counting::index(op)].fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn span(&self, op: Op, key: &str) -> tracing::Span {
        if let Some(row) = READ_OPS.iter().position(|(o, _)| *o == op) {
            let kind = key
                .split_once("}:")
                .map_or("", |(_, rest)| rest.split(':').next().unwrap_or(""));
            let i = KEY_KINDS
                .iter()
                .position(|k| *k == kind)
                .unwrap_or(KEY_KINDS.len() - 1);
            self.reads[row][i].fetch_add(1, Ordering::Relaxed);
        }
        tracing::Span::none()
    }

    fn outcome(&self, op: Op, took: Duration, error: Option<&headcount::Error>) {
        if error.is_some() || took > SLOW {
            self.slow[Counting::index(op)].fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Counting {
    pub(crate) fn new(inner: DynStore) -> Arc<Decorated<Counting>> {
        Arc::new(Decorated::with(inner, Counting::default()))
    }

    /// Where `op` is counted: its place in [`Op::ALL`].
    fn index(op: Op) -> usize {
        // An operation missing from Op::ALL is a bug in headcount: say which.
        let Some(i) = Op::ALL.iter().position(|o| *o == op) else {
            panic!("the group bench cannot count `{op}`: it is not in Op::ALL");
        };
        i
    }

    /// The reads so far by the kind of key or directory read (see [`READ_OPS`]), without the
    /// kinds not read.
    pub(crate) fn reads_snapshot(&self) -> BTreeMap<&'static str, u64> {
        read_names()
            .iter()
            .zip(&self.reads)
            .flat_map(|(names, row)| names.iter().zip(row))
            .map(|(k, c)| (*k, c.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    pub(crate) fn slow_snapshot(&self) -> BTreeMap<&'static str, u64> {
        Op::ALL
            .iter()
            .zip(&self.slow)
            .map(|(op, c)| (op.name(), c.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    pub(crate) fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        Op::ALL
            .iter()
            .zip(&self.calls)
            .map(|(op, c)| (op.name(), c.load(Ordering::Relaxed)))
            .collect()
    }
}

/// Calls per method between two snapshots, and the store round trips they make: a provided
/// (non-native) `renew_and_list` is two round trips.
pub(crate) fn delta(
    before: &BTreeMap<&'static str, u64>,
    after: &BTreeMap<&'static str, u64>,
) -> BTreeMap<&'static str, u64> {
    after
        .iter()
        .map(|(m, a)| (*m, a - before.get(m).copied().unwrap_or(0)))
        .filter(|(_, d)| *d > 0)
        .collect()
}

pub(crate) fn round_trips(calls: &BTreeMap<&'static str, u64>, caps: &Capabilities) -> u64 {
    Op::ALL
        .iter()
        .map(|op| {
            let n = calls.get(op.name()).copied().unwrap_or(0);
            match op {
                Op::RenewAndList | Op::RenewAndListIfChanged if !caps.native_renew_and_list => {
                    2 * n
                }
                Op::IncrAndGet if !caps.native_incr_and_get => 2 * n,
                _ => n,
            }
        })
        .sum()
}

/// A group name of its own, so that runs never meet.
/// The heartbeats to wait after `n` members converged before a steady-state window: until each
/// has looked at the slot table once since the joins (a member that does not watch it looks one
/// heartbeat in max(4, n/8), and its first look after a change reads the table: calls more).
pub(crate) fn first_looks(n: usize) -> u32 {
    (n as u32 / 8).max(4) + 1
}

pub(crate) fn group_name() -> String {
    format!("gb{:08x}", rand::random::<u32>())
}

/// The members of one group under test, with a watch of each one's assignment.
pub(crate) struct Fleet {
    pub(crate) store: DynStore,
    pub(crate) group: String,
    pub(crate) ttl: Duration,
    /// Members read the whole table at every heartbeat, without version checks.
    pub(crate) full_reads: bool,
    /// One `renew_and_list_if_changed` per directory instead of `renew_and_versions`.
    pub(crate) two_calls: bool,
    /// Members listen to the store's change notifications (the default); `false` polls only.
    pub(crate) notices: bool,
    /// The sticky assignor over this many partitions (`None`: the default assignor).
    pub(crate) partitions: Option<u32>,
    /// Every view written whole (the design before view headers).
    pub(crate) whole_views: bool,
    /// Every joiner publishes its own view at once, whatever the group's size (the
    /// design before [`GroupConfig::with_coalesce_from`]).
    pub(crate) own_views: bool,
    pub(crate) members: Vec<(Member, watch::Receiver<Assignment>)>,
}

impl Fleet {
    /// Makes every member leave, without waiting on each one in turn: the group is being torn
    /// down.
    pub(crate) async fn leave_all(&mut self) {
        let leaves: Vec<_> = self
            .members
            .drain(..)
            .map(|(m, _)| tokio::spawn(m.leave()))
            .collect();
        for l in leaves {
            let _ = l.await;
        }
    }

    pub(crate) fn config(&self, id: &str) -> GroupConfig {
        let config = GroupConfig::new(&self.group, self.ttl)
            .with_prefix(PREFIX)
            .with_member(id)
            .with_change_checks(!self.full_reads)
            .with_one_call_versions(!self.two_calls)
            .with_notifications(self.notices);
        let config = match self.partitions {
            Some(n) => config.with_partitions(n),
            None => config,
        };
        let config = if self.own_views {
            config.with_coalesce_from(usize::MAX)
        } else {
            config
        };
        if self.whole_views {
            config.with_view_inline_max(usize::MAX)
        } else {
            config
        }
    }

    pub(crate) async fn join(&mut self, id: &str) -> std::result::Result<(), String> {
        self.join_with(id, self.config(id)).await
    }

    pub(crate) async fn join_with(
        &mut self,
        id: &str,
        cfg: GroupConfig,
    ) -> std::result::Result<(), String> {
        let m = Group::join(self.store.clone(), cfg)
            .await
            .map_err(|e| format!("join of {id}: {e}"))?;
        let rx = m.watch();
        self.members.push((m, rx));
        Ok(())
    }

    /// Joins `ids`, `batch` at a time concurrently (each batch's joins race for slots as
    /// members started together do).
    pub(crate) async fn join_batches(
        &mut self,
        ids: &[String],
        batch: usize,
    ) -> std::result::Result<(), String> {
        for chunk in ids.chunks(batch.max(1)) {
            let joined = futures::future::try_join_all(chunk.iter().map(|id| {
                let (store, cfg) = (self.store.clone(), self.config(id));
                async move {
                    Group::join(store, cfg)
                        .await
                        .map_err(|e| format!("join of {id}: {e}"))
                }
            }))
            .await?;
            for m in joined {
                let rx = m.watch();
                self.members.push((m, rx));
            }
        }
        Ok(())
    }

    pub(crate) fn index_of_slot(&self, slot: u32) -> usize {
        self.members
            .iter()
            .position(|(_, rx)| rx.borrow().slot == Some(slot))
            .unwrap_or_else(|| panic!("no member holds slot {slot}"))
    }

    /// The common active epoch when every member is active on one epoch with `n` live slots.
    pub(crate) fn converged(&self, n: u32) -> Option<u64> {
        let first = self.members.first()?.1.borrow().epoch;
        self.members
            .iter()
            .all(|(_, rx)| {
                let a = rx.borrow();
                a.phase == GroupPhase::Active && a.epoch == first && a.replicas == n
            })
            .then_some(first)
    }

    /// Every member has adopted a view newer than `e0` (active, or pending in a hand-off).
    pub(crate) fn adopted(&self, e0: u64) -> bool {
        self.members.iter().all(|(_, rx)| {
            let a = rx.borrow();
            a.epoch > e0 || a.phase == GroupPhase::Handoff
        })
    }

    pub(crate) fn active_after(&self, e0: u64, n: u32) -> bool {
        self.converged(n).is_some_and(|e| e > e0)
    }

    pub(crate) fn dump(&self) -> String {
        self.members
            .iter()
            .map(|(_, rx)| {
                let a = rx.borrow();
                format!(
                    "{}:slot={:?},epoch={},replicas={},{}",
                    a.member,
                    a.slot,
                    a.epoch,
                    a.replicas,
                    a.phase.as_str()
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub(crate) async fn wait_converged(
        &self,
        n: u32,
        limit: Duration,
    ) -> std::result::Result<u64, String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(e) = self.converged(n) {
                return Ok(e);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no convergence on {n} live slots within {limit:?}: {}",
                    self.dump()
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// From `t0`, the times to every member adopting a view newer than `e0`, and to every member
    /// active on it with `n` live slots.
    pub(crate) async fn measure(
        &self,
        t0: Instant,
        e0: u64,
        n: u32,
        poll: Duration,
        limit: Duration,
    ) -> std::result::Result<(Duration, Duration), String> {
        let mut view = None;
        loop {
            let now = Instant::now();
            if view.is_none() && self.adopted(e0) {
                view = Some(now - t0);
            }
            if self.active_after(e0, n) {
                let active = now - t0;
                return Ok((view.unwrap_or(active), active));
            }
            if now - t0 >= limit {
                return Err(format!(
                    "no convergence within {limit:?} (epoch before {e0}, want {n} live): {}",
                    self.dump()
                ));
            }
            tokio::time::sleep(poll).await;
        }
    }
}
