//! A demo peer in either mode, its worker, and the fenced sink the workers write into.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use headcount::assign::{hash_u64, AssignorKind, Topology};
use headcount::fence::{FencingToken, MemoryFence};
use headcount::recipes::group::{Group, GroupConfig, GroupPhase, Member};
use headcount::recipes::interval::{IntervalConfig, IntervalIndexer, IntervalPeer};
use headcount::{DynStore, Error};

use super::pause::{Gate, PausableStore};

/// The assignor of the demo's group members, named so that [`converged`] maps the sample with
/// the same one. Jump with failover, which the demo's recorded movement figures were measured
/// with (it was the group default then).
const DEMO_ASSIGNOR: AssignorKind = AssignorKind::JumpFailover;

/// The queue of offered ids and what the sink accepted.
#[derive(Default)]
pub struct Book {
    pub pending: BTreeSet<u64>,
    pub counts: BTreeMap<u64, u32>,
    pub offered: u64,
    pub fenced_rejections: u64,
}

/// The book and the in-process fence in front of it.
#[derive(Default)]
pub struct Sink {
    book: Mutex<Book>,
    fence: MemoryFence,
}

impl Sink {
    pub fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Advances the fence for `id` with `token` (writing nothing), then reads whether `id` is
    /// still to do: every write admitted under an older token is visible by then.
    fn claim(&self, id: u64, token: FencingToken) -> bool {
        self.fence.admit(&id.to_string(), token) && self.book().pending.contains(&id)
    }

    /// Accepts `id` when the fence admits `token`; counts a fenced rejection otherwise.
    fn write(&self, id: u64, token: FencingToken) {
        let written = self.fence.admit_with(&id.to_string(), token, || {
            let mut b = self.book();
            *b.counts.entry(id).or_default() += 1;
            b.pending.remove(&id);
        });
        if written.is_none() {
            self.book().fenced_rejections += 1;
        }
    }
}

/// Something held while working on a task: a group grant or an interval task guard.
type Held = Box<dyn Send>;

/// Which recipe the peers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Group,
    Interval,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Group => "group",
            Mode::Interval => "interval",
        }
    }
}

enum Inner {
    Group(Arc<Member>),
    Interval(Box<IntervalPeer>),
}

/// One peer: its membership, its worker, and its pause gate.
pub struct Peer {
    pub name: String,
    inner: Inner,
    worker: tokio::task::JoinHandle<()>,
    pub gate: Arc<Gate>,
}

/// How a peer is made.
pub struct Recipe {
    pub mode: Mode,
    pub group: String,
    pub interval: Duration,
    pub ttl: Duration,
    pub transition: bool,
    pub every: Duration,
    pub work: Duration,
}

impl Recipe {
    pub async fn join(
        &self,
        store: &DynStore,
        name: &str,
        sink: &Arc<Sink>,
    ) -> Result<Peer, Error> {
        let gate = Gate::new();
        let store = PausableStore::wrap(store.clone(), gate.clone());
        let (inner, take): (Inner, Taker) = match self.mode {
            Mode::Group => {
                let config = GroupConfig::new(self.group.clone(), self.ttl)
                    .with_member(name)
                    .with_assignor(DEMO_ASSIGNOR);
                let member = Arc::new(Group::join(store, config).await?);
                let m = member.clone();
                let take: Taker = Arc::new(move |id| {
                    m.owns_hash(hash_u64(id))
                        .map(|g| (g.token(), Box::new(g) as Held))
                });
                (Inner::Group(member), take)
            }
            Mode::Interval => {
                let config = IntervalConfig::new(self.group.clone(), self.interval)
                    .with_transition(self.transition)
                    .with_member(name);
                let peer = IntervalIndexer::join(store, config).await?;
                let own = peer.ownership();
                // The interval's epoch fences a task as a view's epoch fences a key.
                let take: Taker = Arc::new(move |id| {
                    own.begin(id)
                        .map(|t| (FencingToken::new(t.epoch()), Box::new(t) as Held))
                });
                (Inner::Interval(Box::new(peer)), take)
            }
        };
        let worker = spawn_worker(take, sink.clone(), gate.clone(), self.every, self.work);
        Ok(Peer {
            name: name.to_owned(),
            inner,
            worker,
            gate,
        })
    }
}

type Taker = Arc<dyn Fn(u64) -> Option<(FencingToken, Held)> + Send + Sync>;

/// Every `every`: takes the pending ids this peer owns, advancing the fence for each before
/// reading whether it is still to do, works on them for `work`, then writes them to the sink
/// WITHOUT re-checking its grants, so a peer paused past its lease really sends its late writes
/// and the fence has to refuse them.
fn spawn_worker(
    take: Taker,
    sink: Arc<Sink>,
    gate: Arc<Gate>,
    every: Duration,
    work: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            gate.wait(false).await;
            let ids: Vec<u64> = sink.book().pending.iter().copied().collect();
            let batch: Vec<_> = ids
                .into_iter()
                .filter_map(|id| take(id).map(|(token, held)| (id, token, held)))
                .filter(|(id, token, _)| sink.claim(*id, *token))
                .collect();
            if !batch.is_empty() {
                tokio::time::sleep(work).await;
                gate.pause_if_requested();
                gate.wait(true).await;
                for (id, token, held) in batch {
                    sink.write(id, token);
                    drop(held);
                }
            }
            tokio::time::sleep(every).await;
        }
    })
}

impl Peer {
    /// Leaves gracefully.
    pub async fn leave(self) -> Result<(), Error> {
        self.worker.abort();
        let _ = self.worker.await;
        match self.inner {
            Inner::Group(member) => match Arc::try_unwrap(member) {
                Ok(m) => m.leave().await,
                Err(_) => Err(Error::config("a demo worker still holds its member")),
            },
            Inner::Interval(peer) => peer.leave().await,
        }
    }

    /// Crashes: the worker and the heartbeat stop, nothing is acknowledged or deleted.
    pub async fn crash(self) {
        self.worker.abort();
        let _ = self.worker.await;
        drop(self.inner);
    }

    /// `(slot or index, replicas, phase)` for the progress line.
    pub fn describe(&self) -> String {
        if self.gate.is_paused() {
            return "paused".to_owned();
        }
        match &self.inner {
            Inner::Group(m) => {
                let a = m.assignment();
                let pair = a
                    .pair()
                    .map_or("-/-".to_owned(), |(i, n)| format!("{i}/{n}"));
                format!("{pair} e{} {}", a.epoch, a.phase.as_str())
            }
            Inner::Interval(p) => {
                let st = p.status();
                let pair = st
                    .pair
                    .map_or("-/-".to_owned(), |p| format!("{}/{}", p.index, p.replicas));
                format!("{pair} {}", st.phase.as_str())
            }
        }
    }
}

/// Whether `peers` (the live, unpaused ones) work under one assignment that reflects exactly
/// them; if so, the owner (an index into `peers`) of each id of `sample`.
pub fn converged(peers: &[&Peer], sample: u64) -> Option<Vec<usize>> {
    let first = peers.first()?;
    match &first.inner {
        Inner::Group(_) => {
            let mut slots = BTreeMap::new();
            let mut view = None;
            for (i, p) in peers.iter().enumerate() {
                let Inner::Group(m) = &p.inner else {
                    return None;
                };
                let a = m.assignment();
                if a.phase != GroupPhase::Active {
                    return None;
                }
                let key = (a.epoch, a.live.clone());
                if view.get_or_insert_with(|| key.clone()) != &key {
                    return None;
                }
                slots.insert(a.slot?, i);
            }
            let (_, live) = view?;
            if !live.iter().copied().eq(slots.keys().copied()) {
                return None;
            }
            let topology = Topology::from_live_slots(live).ok()?;
            let assignor = DEMO_ASSIGNOR.build(&topology).ok()?;
            (0..sample)
                .map(|id| slots.get(&assignor.owner(hash_u64(id))).copied())
                .collect()
        }
        Inner::Interval(_) => {
            let n = peers.len() as u64;
            let mut pairs = Vec::new();
            for p in peers {
                let Inner::Interval(peer) = &p.inner else {
                    return None;
                };
                let pair = peer.pair()?;
                if pair.replicas != n {
                    return None;
                }
                pairs.push(pair);
            }
            let indices: BTreeSet<u64> = pairs.iter().map(|p| p.index).collect();
            if indices != (1..=n).collect() {
                return None;
            }
            (0..sample)
                .map(|id| pairs.iter().position(|p| p.owns(id)))
                .collect()
        }
    }
}
