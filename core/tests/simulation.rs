//! The seeded, deterministic simulation of the group recipe.
//!
//! Each seed runs a group on a store model for a few virtual seconds, on a single-threaded
//! Tokio runtime with paused time (the runtime jumps to the next timer whenever every task
//! waits, so a run takes milliseconds and one seed always takes the same steps). A seeded
//! schedule joins members, restarts them with the same member id (half of them crashing, half
//! leaving for a restart with static membership and coming back within the restart window, too
//! late, or as two twins at once), replaces them (a third of the joins stand by, and most of
//! those are followed by a member leaving within the wait, whose slot the standby then inherits;
//! the others join when the wait ends), makes them leave gracefully, crashes them, pauses them
//! past their lease, starts twins, rolls the store back, and injects faults into every store call
//! (delays that reorder replies, failures before the store, writes applied with their reply
//! lost) and into the store's change notifications, which every store sends (the models as
//! their backends do) and members listen to: on a fifth of the seeds notices are delivered
//! perfectly, on a fifth there are none (members only poll), and on the others they pass
//! through a lossy channel that drops some (up to half), delays some (up to half, by up to
//! 400 ms, which reorders them across directories), duplicates some (up to a fifth), and now
//! and then sends one for nothing (`NoticeRates`). Notices are held while a member is paused. Workers hold grants for random keys for random times: about half of them select on
//! the revocation hook (`Grant::revoked`) beside their work and drop the grant as soon as it
//! fires, the others ignore it, a few of them past the drain timeout (the member then gives its
//! lease up). Workers also hold grants for their whole share (the `(index, replicas)` pair that
//! `headcount exec` splits work by). The assignor depends on the seed: the default, the modulo
//! assignor (which moves keys between members that stay, so a key can move away from a member
//! and back within two views), MementoHash, on one seed in eight the sticky assignor over the
//! simulation's keys declared as partitions (its assignment stored in the view, and moving keys
//! between members that stay when balance needs it), and on one in sixteen the stateless
//! balanced assignor over them (which also moves keys between members that stay). On half the
//! seeds, every other process writes every view as a small header and a snapshot
//! ([`ViewHeader`](headcount_core::recipes::group::ViewHeader)), so members resolve headers by
//! their deltas and from snapshots, and views go from whole to header and back. On those seeds
//! a change record costs nothing to read (`GroupConfig::with_change_record_cost(0)`), so a member
//! that missed more changes than a header carries walks the records back to a view it holds
//! (the test `members_walk_the_change_records` checks that some do). On half the seeds, a join
//! that comes while the published view is still handed off is left to the lowest slot's next
//! view (`GroupConfig::with_coalesce_from(0)`; a real group does so from 64 members).
//!
//! Checked every 10 ms of virtual time:
//! * no two members hold, or could take, a valid grant for one key at the same instant;
//! * no two members hold valid share grants whose pairs cover one item (item `k` belongs to
//!   `(i, n)` when `k mod n = i`) at the same instant;
//! * a member's active epoch never goes back;
//! * a worker listening to the revocation hook is woken by it: it never holds a grant for a
//!   tick after the grant stopped being valid, and no other member can take or hold a key while
//!   such a worker still holds it (the hook fires before the hand-off waits on the grant);
//! * on the etcd model, no client answers a directory's version for other contents than it
//!   answered it for before where its revision watch saw the store go back in between.
//!
//! Checked at the end, after the faults stop: every live member is active under one view, and
//! every key has exactly one owner, within TTL + two heartbeats + the hand-off. The notification
//! channel stays as it was (lossy, or off): convergence must not depend on a notice.
//!
//! The store is the in-memory one, the Redis model, the etcd model or the SQL model
//! (`simulation/models.rs`): a quarter of the seeds run on each. On half the Redis seeds the
//! model loses index entries, its whole index, or all its metadata now and then during the
//! faulty phase (a lost index hides keys until they are touched again, which voids the guarantee
//! like a rollback does: see below). On the etcd model a rollback is a snapshot restore that
//! hands the lost revisions out again (on a quarter of its seeds, one with `--bump-revision`);
//! a version that comes back for other contents where a client's revision watch could have seen
//! the restore fails the seed, and one it could not see (the restored store overtook the
//! client's highest revision before the client's next response: the documented limit) voids the
//! guarantee like a rollback.
//!
//! `HEADCOUNT_SIM_SEEDS=N` runs N seeds (default 2000), `HEADCOUNT_SIM_SEED=S` replays one seed
//! with its event log; a failure prints the command that replays it. A replay with
//! `RUST_LOG=headcount_core=debug` prints the members' own log lines among the events.
//!
//! `HEADCOUNT_SIM_DIGESTS=FILE` appends one line per passed seed, `seed hash`, hashing the
//! seed's events, the faults each process drew and where each member ended: a change that must
//! not change behaviour (a refactoring) is checked by comparing the sorted files of two builds.
//! Nonces and back-offs draw from the simulation's seeded clock ([`Clock::random`]), so a seed
//! hashes the same at every run, except some seeds with lossy notifications (marked `lossy` in
//! the file), whose forwarded notices do not always come in the same order: compare those only
//! where their hashes agree over two runs of the build before the change.
//!
//! [`Clock::random`]: headcount_core::clock::Clock::random

mod common;
#[path = "simulation/models.rs"]
mod models;

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use headcount_core::assign::AssignorKind;
use headcount_core::decorated::{Decorated, Hooks};
use headcount_core::fence::FencingToken;
use headcount_core::recipes::group::{Grant, Group, GroupConfig, GroupPhase, Member};
use headcount_core::sim::{FaultRates, Faults, FaultyStore, NoticeRates, SimClock};
use headcount_core::{Clock, DynStore, Op};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use headcount_sim::ModelFaults;
use models::{ModelKind, Models, SimSnapshot, SimStore};

const TTL: Duration = Duration::from_millis(900);
const TICK: Duration = Duration::from_millis(10);
const KEYS: usize = 24;
const MAX_LIVE: usize = 6;

#[derive(Debug, Clone, Copy)]
struct Plan {
    /// Virtual time of the faulty phase.
    run: Duration,
    /// Chance per tick of a schedule event.
    event: f64,
    rates: FaultRates,
    rollbacks: bool,
}

impl Plan {
    fn for_seed(rng: &mut StdRng) -> Plan {
        let faulty = rng.random_bool(0.8);
        Plan {
            run: Duration::from_millis(rng.random_range(4_000..10_000)),
            event: rng.random_range(0.01..0.06),
            rates: if faulty {
                FaultRates {
                    fail_before: rng.random_range(0.0..0.05),
                    fail_after: rng.random_range(0.0..0.05),
                    delay: rng.random_range(0.0..0.4),
                    max_delay: Duration::from_millis(rng.random_range(1..250)),
                }
            } else {
                FaultRates::NONE
            },
            rollbacks: rng.random_bool(0.3),
        }
    }
}

/// How a seed's members get the store's change notifications: perfectly on a fifth of the
/// seeds, not at all on a fifth, through a lossy channel on the others. Drawn from a generator
/// of its own, so that a seed's plan and schedule are those of before.
fn notices_for_seed(seed: u64) -> NoticeRates {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x7071_ce55);
    match rng.random_range(0..5) {
        0 => NoticeRates::NONE,
        1 => NoticeRates::OFF,
        _ => NoticeRates {
            enabled: true,
            drop: rng.random_range(0.0..0.5),
            delay: rng.random_range(0.0..0.5),
            duplicate: rng.random_range(0.0..0.2),
            spurious: rng.random_range(0.0..0.05),
            max_delay: Duration::from_millis(rng.random_range(1..400)),
        },
    }
}

/// What the seed's log says of the notification channel.
fn describe_notices(n: &NoticeRates) -> String {
    if !n.enabled {
        "off".into()
    } else if *n == NoticeRates::NONE {
        "perfect".into()
    } else {
        format!(
            "lossy (drop {:.2}, delay {:.2} up to {:?}, duplicate {:.2}, spurious {:.3})",
            n.drop, n.delay, n.max_delay, n.duplicate, n.spurious
        )
    }
}

/// How a simulated worker treats the revocation hook of the key grant it holds
/// ([`Grant::revoked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Worker {
    /// Works until its time is up, which is within the drain timeout.
    Ignores,
    /// Works past the drain timeout, as a hook that never returns would: the member gives its
    /// lease up rather than acknowledge.
    Overruns,
    /// A consumer selecting on `revoked()` beside its work: it drops the grant as soon as the
    /// hook fires, or when its (longer) time is up.
    Cooperates,
}

/// A key grant a worker holds.
struct Held {
    key: usize,
    /// When the worker took it.
    taken: Duration,
    /// Taken while the guarantees held ([`Sim::strict`]), and held through no store fault that
    /// voids them since: only then are its writes checked against the fence. A grant taken
    /// while the store's lost writes were not yet detected may carry a token that the views
    /// minted since fence off (a re-minted epoch, a view that missed its holder's slot), and
    /// its member cannot tell: it stays valid, and the fence refuses it, as it should.
    strict: bool,
    until: Duration,
    grant: Holding,
}

enum Holding {
    /// Held by the simulation, dropped when its time is up.
    Plain(Arc<Grant>),
    /// Held by a task of its own (a [`Worker::Cooperates`]), which drops it; the simulation
    /// looks at it only while the task still holds it.
    Task {
        grant: Weak<Grant>,
        task: JoinHandle<()>,
        /// When a check first saw the grant invalid while the task still held it.
        invalid_since: Option<Duration>,
    },
}

impl Held {
    /// The grant, while it is held.
    fn grant(&self) -> Option<Arc<Grant>> {
        match &self.grant {
            Holding::Plain(g) => Some(g.clone()),
            Holding::Task { grant, .. } => grant.upgrade(),
        }
    }

    fn cooperates(&self) -> bool {
        matches!(self.grant, Holding::Task { .. })
    }

    /// Whether the worker still holds it at `now`.
    fn held_at(&self, now: Duration) -> bool {
        match &self.grant {
            Holding::Plain(_) => self.until > now,
            Holding::Task { grant, .. } => grant.strong_count() > 0,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // A crash takes the worker's task with it.
        if let Holding::Task { task, .. } = &self.grant {
            task.abort();
        }
    }
}

struct Proc {
    label: String,
    id: String,
    faults: Arc<Faults>,
    joining: Option<JoinHandle<headcount_core::Result<Member>>>,
    member: Option<Member>,
    held: Vec<Held>,
    /// Share grants held: the grant, the `(index, replicas)` pair it was taken for, until when.
    shares: Vec<(Grant, (u32, u32), Duration)>,
    resume_at: Option<Duration>,
    last_epoch: u64,
    leaving: bool,
}

/// A process holding a share grant: its number, the `(index, replicas)` pair, the token.
type ShareOwner = (usize, (u32, u32), u64);

struct Sim {
    seed: u64,
    rng: StdRng,
    /// Draws for the share grants, apart from `rng` so that a seed's schedule of events and key
    /// grants is the one it had before share grants were simulated.
    share_rng: StdRng,
    /// Draws for how workers treat the revocation hook, apart from `rng` for the same reason.
    hook_rng: StdRng,
    assignor: Option<AssignorKind>,
    clock: SimClock,
    store: SimStore,
    procs: Vec<Proc>,
    next_member: usize,
    snapshots: Vec<(Duration, SimSnapshot)>,
    log: Vec<String>,
    verbose: bool,
    /// When the store last rolled back. A store that loses acknowledged writes voids the lease
    /// guarantee until the members' leases written before it ran out: a lost renewal lets the
    /// slot expire before its holder's deadline, and a lost view lets another member mint its
    /// epoch again for other holders. Ownership is not checked for two TTLs after a rollback;
    /// the members must then have detected it (a renewal refused, a re-minted epoch replaced
    /// by a view above it). A Redis index that lost names is such a store too: a listing misses
    /// a live slot until its holder's next renewal puts it back (at most a heartbeat), and a
    /// member may publish and activate a view without it meanwhile. A key grant held through
    /// such a fault, or taken in the two TTLs after it, is never checked against the fence
    /// ([`Held::strict`]).
    rolled_back: Option<Duration>,
    /// For each key, the newest fencing token a fence in front of its sink has seen: at every
    /// check each valid key grant held "writes" through it. A valid grant must never be
    /// refused (its token older than the newest), or the fence would stop work the group
    /// still assigns to that member; a grant of another member that wrote in between would
    /// also be caught here, as a token order that does not follow ownership. Beside the token:
    /// who wrote it, and whether that write was checked strictly (two TTLs past a rollback):
    /// two holders that both write one token then are a fault a fence cannot see (a re-minted
    /// epoch some member detected must not keep serving as a token).
    fences: Vec<(u64, String, bool)>,
    /// The restart window every member is configured with: one or two TTLs, by seed.
    window: Duration,
    /// Processes to start later with a member id that left for a restart: when, and the id.
    restarts: Vec<(Duration, String)>,
    /// Draws for replacements (a member joining as a standby, and a member leaving for it),
    /// apart from `rng` so that a seed's other events are drawn as before.
    replace_rng: StdRng,
    /// When a member leaves because a standby joined to replace it.
    leaves: Vec<Duration>,
    /// Draws for what is not planned (store outages, crash-restarts within a crash grace, the
    /// grace and drain timeout of a seed), apart from `rng` so that a seed's other events are
    /// drawn as before.
    ride_rng: StdRng,
    /// Every member's crash grace on this seed (zero: none).
    crash_grace: Duration,
    /// Every member's drain timeout on this seed (`None`: the default, one TTL).
    drain_timeout: Option<Duration>,
    /// The store is down for every process until then.
    down_until: Option<Duration>,
    /// How every process gets the store's change notifications.
    notices: NoticeRates,
}

impl Sim {
    fn now(&self) -> Duration {
        self.clock.monotonic()
    }

    fn note(&mut self, what: String) {
        let line = format!("{:>8.3}s {what}", self.now().as_secs_f64());
        if self.verbose {
            eprintln!("{line}");
        }
        self.log.push(line);
    }

    fn start(&mut self, id: String, rates: FaultRates) {
        self.start_with(id, rates, None);
    }

    /// Starts a process with member id `id`, as a standby for up to `standby` when given.
    fn start_with(&mut self, id: String, rates: FaultRates, standby: Option<Duration>) {
        let label = format!("p{}", self.procs.len());
        let faults = Faults::new(
            self.seed
                .wrapping_mul(31)
                .wrapping_add(self.procs.len() as u64),
        );
        faults.set_rates(rates);
        faults.set_notice_rates(self.notices);
        let clock: Arc<dyn Clock> = Arc::new(self.clock.clone());
        let inner: DynStore = Arc::new(Decorated::with(self.store.store(), ChangeReads));
        let store: DynStore = Arc::new(FaultyStore::new(inner, faults.clone(), clock.clone()));
        // Half the processes read the table only when the store reports a change, the others
        // at every heartbeat, so both heartbeats run against each other (chosen without a draw,
        // so the seeds' schedules are those of before).
        let change_checks = (self.seed ^ self.procs.len() as u64).is_multiple_of(2);
        let mut config = GroupConfig::new("sim", TTL)
            .with_member(id.clone())
            .with_clock(clock)
            .with_change_checks(change_checks)
            .with_restart_window(self.window);
        // On half the seeds, every other process writes every view as a header and a snapshot
        // (the members of a seed's group are small, so their views are otherwise written
        // whole): members then resolve headers by their deltas and from snapshots, and views
        // go from whole to header and back.
        if (self.seed / 2).is_multiple_of(2) && (self.procs.len() as u64).is_multiple_of(2) {
            config = config.with_view_inline_max(0);
        }
        // On those seeds, a member that missed more changes than a header carries walks the
        // change records back to a view it holds (a real group's views are large enough for a
        // walk to pay; these are not, so a record is made to cost nothing): walks, records
        // expired or missing, and snapshots meet every interleaving.
        if (self.seed / 2).is_multiple_of(2) {
            config = config.with_change_record_cost(0);
        }
        // On half the seeds (a quarter of them with the headers above), a join that comes while
        // the published view is handed off is left to the lowest slot's next view whatever the
        // group's size (a real group does so from 64 members; these are smaller).
        if (self.seed / 4).is_multiple_of(2) {
            config = config.with_coalesce_from(0);
        }
        match self.assignor {
            Some(AssignorKind::Sticky(_)) => config = config.with_partitions(KEYS as u32),
            Some(AssignorKind::Balanced(id)) => {
                config = config
                    .with_partitions(KEYS as u32)
                    .with_assignor(AssignorKind::Balanced(id))
            }
            Some(assignor) => config = config.with_assignor(assignor),
            None => {}
        }
        if let Some(wait) = standby {
            config = config.with_standby(wait);
        }
        if !self.crash_grace.is_zero() {
            config = config.with_crash_grace(self.crash_grace);
        }
        if let Some(timeout) = self.drain_timeout {
            config = config.with_drain_timeout(timeout);
        }
        if self.down_until.is_some() {
            faults.set_down(true);
        }
        let joining = tokio::spawn(Group::join(store, config));
        match standby {
            Some(wait) => self.note(format!("{label} ({id}) joins as a standby for {wait:?}")),
            None => self.note(format!("{label} ({id}) joins")),
        }
        self.procs.push(Proc {
            label,
            id,
            faults,
            joining: Some(joining),
            member: None,
            held: Vec::new(),
            shares: Vec::new(),
            resume_at: None,
            last_epoch: 0,
            leaving: false,
        });
    }

    fn alive(&self) -> Vec<usize> {
        (0..self.procs.len())
            .filter(|&i| {
                let p = &self.procs[i];
                !p.leaving && (p.member.is_some() || p.joining.is_some())
            })
            .collect()
    }

    async fn finish_joins(&mut self) {
        for i in 0..self.procs.len() {
            let done = self.procs[i]
                .joining
                .as_ref()
                .is_some_and(JoinHandle::is_finished);
            if !done {
                continue;
            }
            let Some(handle) = self.procs[i].joining.take() else {
                continue;
            };
            let label = self.procs[i].label.clone();
            match handle.await {
                Ok(Ok(m)) => {
                    self.procs[i].member = Some(m);
                    self.note(format!("{label} claimed a slot"));
                }
                Ok(Err(e)) => self.note(format!("{label} join failed: {e}")),
                Err(e) => self.note(format!("{label} join task died: {e}")),
            }
        }
    }

    /// Process `i` leaves gracefully (handing its slot to a standby if there is one), or, with
    /// `restart` (the rest of its event line), leaves for a restart. Returns whether it had a
    /// member handle to leave with.
    fn leave(&mut self, i: usize, restart: Option<String>) -> bool {
        let Some(m) = self.procs[i].member.take() else {
            return false;
        };
        // A leave revokes every grant: cooperating workers see it themselves.
        self.procs[i].held.retain(Held::cooperates);
        self.procs[i].shares.clear();
        let label = self.procs[i].label.clone();
        match &restart {
            Some(rest) => self.note(format!("{label} leaves for a restart{rest}")),
            None => self.note(format!("{label} leaves")),
        }
        // The handle kept by the checker until the leave is done is the clone.
        let leaving = m.clone();
        self.procs[i].member = Some(m);
        self.procs[i].leaving = true;
        tokio::spawn(async move {
            let _ = match restart {
                Some(_) => leaving.leave_for_restart().await,
                None => leaving.leave().await,
            };
        });
        self.procs[i].faults.resume();
        true
    }

    /// The leaves of replaced members that are due (all of them with `all`): each a member
    /// picked at random among those with a member handle, while more than one is alive.
    fn leave_due(&mut self, all: bool) {
        let now = self.now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.leaves)
            .into_iter()
            .partition(|at| all || *at <= now);
        self.leaves = later;
        for _ in due {
            let alive: Vec<usize> = self
                .alive()
                .into_iter()
                .filter(|&i| self.procs[i].member.is_some())
                .collect();
            if alive.len() > 1 {
                let i = alive[self.replace_rng.random_range(0..alive.len())];
                self.leave(i, None);
            }
        }
    }

    fn crash(&mut self, i: usize) {
        let p = &mut self.procs[i];
        p.held.clear();
        p.shares.clear();
        p.member = None;
        if let Some(j) = p.joining.take() {
            j.abort();
        }
        p.faults.resume();
        let label = p.label.clone();
        self.note(format!("{label} crashes"));
    }

    fn event(&mut self, rates: FaultRates, rollbacks: bool) {
        let alive = self.alive();
        let pick = |rng: &mut StdRng, v: &[usize]| v[rng.random_range(0..v.len())];
        match self.rng.random_range(0..100) {
            0..25 if alive.len() < MAX_LIVE => {
                let id = format!("m{}", self.next_member);
                self.next_member += 1;
                // A third of the joins are replacements: the new member stands by, and most
                // of the time a member leaves for it within its wait (a rolling deploy with
                // surge); otherwise it joins when the wait ends (a scale-up).
                let standby = self.replace_rng.random_bool(0.35).then(|| {
                    Duration::from_millis(
                        self.replace_rng
                            .random_range(TTL.as_millis() as u64 / 2..2 * TTL.as_millis() as u64),
                    )
                });
                self.start_with(id, rates, standby);
                if let Some(wait) = standby {
                    if self.replace_rng.random_bool(0.8) {
                        let after = self
                            .replace_rng
                            .random_range(0..wait.as_millis() as u64 * 6 / 5);
                        let at = self.now() + Duration::from_millis(after);
                        self.leaves.push(at);
                    }
                }
            }
            25..40 if !alive.is_empty() => {
                let i = pick(&mut self.rng, &alive);
                let id = self.procs[i].id.clone();
                let parks = self.procs[i].member.is_some() && self.rng.random_bool(0.5);
                if !parks {
                    // A restart: the process dies and comes back with the same member id; with
                    // a crash grace, at once or up to a little past the grace and a lease later
                    // (a container restarted in place).
                    self.crash(i);
                    if self.crash_grace.is_zero() {
                        self.start(id, rates);
                    } else {
                        let longest = (TTL + self.crash_grace).as_millis() as u64 * 6 / 5;
                        let back = Duration::from_millis(self.ride_rng.random_range(0..longest));
                        self.note(format!("back in {back:?}"));
                        let at = self.now() + back;
                        self.restarts.push((at, id));
                    }
                    return;
                }
                // A restart with static membership: the process leaves for a restart (its
                // claim parked) and a new one with its id comes back within the window, after
                // it, or as two twins at once.
                let back = Duration::from_millis(
                    self.rng.random_range(0..2 * self.window.as_millis() as u64),
                );
                let twins = self.rng.random_bool(0.1);
                let rest = format!(", back in {back:?}{}", if twins { " as twins" } else { "" });
                if self.leave(i, Some(rest)) {
                    let at = self.now() + back;
                    self.restarts.push((at, id.clone()));
                    if twins {
                        self.restarts.push((at, id));
                    }
                }
            }
            40..52 if alive.len() > 1 => {
                let i = pick(&mut self.rng, &alive);
                self.leave(i, None);
            }
            52..62 if alive.len() > 1 => {
                let i = pick(&mut self.rng, &alive);
                self.crash(i);
            }
            62..78 if !alive.is_empty() => {
                // Paused past its lease (or nearly), as SIGSTOP or a long GC pause would.
                let i = pick(&mut self.rng, &alive);
                let d = Duration::from_millis(self.rng.random_range(300..2_500));
                let until = self.now() + d;
                let p = &mut self.procs[i];
                p.faults.pause();
                p.resume_at = Some(until);
                let label = p.label.clone();
                self.note(format!("{label} paused for {d:?}"));
            }
            78..84 if alive.len() > 2 => {
                // Every member paused at once past the TTL: a mass lapse and rejoin.
                let d = Duration::from_millis(self.rng.random_range(1_000..2_500));
                let until = self.now() + d;
                for i in alive {
                    self.procs[i].faults.pause();
                    self.procs[i].resume_at = Some(until);
                }
                self.note(format!("everyone paused for {d:?}"));
            }
            84..90 if !alive.is_empty() => {
                // A twin: a second live process with an existing member id.
                let i = pick(&mut self.rng, &alive);
                let id = self.procs[i].id.clone();
                self.note(format!("twin of {}", self.procs[i].label));
                self.start(id, rates);
            }
            // Not while the store is down: no member could see what the rollback lost, nor
            // outlive the outage to republish above it, and the fences would not be owed an
            // order (the documented limit, not what this seed is checking).
            90..100 if rollbacks && self.down_until.is_none() => self.roll_back(),
            _ => {}
        }
    }

    /// The store goes down for every process (calls fail before reaching it) for 200 ms to
    /// three and a half TTLs, with its data kept: a restart, a failover, a cut link.
    fn outage(&mut self) {
        if self.down_until.is_some() {
            return;
        }
        let d = Duration::from_millis(self.ride_rng.random_range(200..3_200));
        self.down_until = Some(self.now() + d);
        for p in &self.procs {
            p.faults.set_down(true);
        }
        self.note(format!("the store is down for {d:?}"));
    }

    /// Ends the outage when it is due (at once with `all`).
    fn outage_due(&mut self, all: bool) {
        if self.down_until.is_some_and(|t| all || t <= self.now()) {
            self.down_until = None;
            for p in &self.procs {
                p.faults.set_down(false);
            }
            self.note("the store is back".into());
        }
    }

    /// Restores the store as it was 20 to 400 ms ago (to the nearest snapshot): the last writes
    /// are lost, as on a failover to a replica that had not received them.
    fn roll_back(&mut self) {
        let back = Duration::from_millis(self.rng.random_range(20..400));
        let target = self.now().saturating_sub(back);
        if let Some((at, snap)) = self
            .snapshots
            .iter()
            .rev()
            .find(|(at, _)| *at <= target)
            .cloned()
        {
            self.store.restore(&snap);
            self.void_guarantees();
            // Every running member paused (or none running): no member can see what the store
            // lost, and the epochs it lost are minted again for other holders, below tokens a
            // fence may already have seen. That is the documented limit (`docs/group.md`,
            // *Tokens and views*): the fences' history is not owed an order against what comes
            // after (the only member that saw an epoch may be paused through the rollback, and
            // the next member mints a lower one).
            let running: Vec<usize> = self
                .alive()
                .into_iter()
                .filter(|&i| self.procs[i].member.is_some())
                .collect();
            // Their workers are frozen with them (as under SIGSTOP): a grant of a lost epoch
            // writing on after the rollback would be the same limit again.
            if running.iter().all(|&i| self.procs[i].resume_at.is_some()) {
                for fence in &mut self.fences {
                    *fence = (0, String::new(), false);
                }
                for &i in &running {
                    self.procs[i].held.clear();
                    self.procs[i].shares.clear();
                }
                self.note("no running member saw the rollback: the fences forget".into());
            }
            // A write made before the rollback may carry an epoch the rollback un-minted, which
            // a member that never saw it mints again for other holders: no member can tell, so
            // a fence that saw the first is not owed an order against the second (a grant under
            // a lost epoch writes, then the holder of the same epoch minted again writes after
            // it). Later writes are checked strictly again once two TTLs have passed.
            for (_, _, since_strict) in &mut self.fences {
                *since_strict = false;
            }
            self.note(format!("store rolled back to {:.3}s", at.as_secs_f64()));
        }
    }

    fn work(&mut self) {
        let now = self.now();
        for i in 0..self.procs.len() {
            self.procs[i].held.retain(|h| h.held_at(now));
            self.procs[i].shares.retain(|(_, _, until)| *until > now);
            if self.procs[i].resume_at.is_none() && self.share_rng.random_bool(0.1) {
                let hold = Duration::from_millis(self.share_rng.random_range(0..700));
                if let Some(m) = &self.procs[i].member {
                    // No await between the two reads: the pair is the one the grant is for.
                    let a = m.assignment();
                    if let (Some(g), Some(index)) = (m.share(), a.index) {
                        self.procs[i]
                            .shares
                            .push((g, (index, a.replicas), now + hold));
                    }
                }
            }
            if self.procs[i].resume_at.is_some() || self.rng.random_bool(0.9) {
                continue;
            }
            let key = self.rng.random_range(0..KEYS);
            let hold = Duration::from_millis(self.rng.random_range(0..700));
            let Some(g) = self.procs[i]
                .member
                .as_ref()
                .and_then(|m| m.owns(key.to_string()))
            else {
                continue;
            };
            let worker = match self.hook_rng.random_range(0..40) {
                0 => Worker::Overruns,
                1..20 => Worker::Ignores,
                _ => Worker::Cooperates,
            };
            let grant = Arc::new(g);
            let strict = self.strict();
            let held = match worker {
                Worker::Ignores => Held {
                    key,
                    taken: now,
                    strict,
                    until: now + hold,
                    grant: Holding::Plain(grant),
                },
                Worker::Overruns => Held {
                    key,
                    taken: now,
                    strict,
                    until: now + hold + TTL + self.hook_rng.random_range(TICK..TTL),
                    grant: Holding::Plain(grant),
                },
                Worker::Cooperates => {
                    // Long work, cut short by the hook.
                    let hold = self.hook_rng.random_range(TICK..TTL * 3);
                    let weak = Arc::downgrade(&grant);
                    let task = tokio::spawn(async move {
                        tokio::select! {
                            () = grant.revoked() => {}
                            () = tokio::time::sleep(hold) => {}
                        }
                        drop(grant);
                    });
                    Held {
                        key,
                        taken: now,
                        strict,
                        until: now + hold,
                        grant: Holding::Task {
                            grant: weak,
                            task,
                            invalid_since: None,
                        },
                    }
                }
            };
            self.procs[i].held.push(held);
        }
    }

    /// Starts the processes whose restart is due (all of them with `all`).
    fn restart_due(&mut self, rates: FaultRates, all: bool) {
        let now = self.now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.restarts)
            .into_iter()
            .partition(|(at, _)| all || *at <= now);
        self.restarts = later;
        for (_, id) in due {
            self.start(id, rates);
        }
    }

    fn resume_due(&mut self) {
        let now = self.now();
        for i in 0..self.procs.len() {
            if self.procs[i].resume_at.is_some_and(|t| t <= now) {
                self.procs[i].resume_at = None;
                self.procs[i].faults.resume();
                let label = self.procs[i].label.clone();
                self.note(format!("{label} resumes"));
            }
        }
    }

    /// Who could take, or holds, a valid grant for each key right now.
    fn owners(&self) -> Vec<Vec<(usize, u64)>> {
        let mut owners = vec![Vec::new(); KEYS];
        for (i, p) in self.procs.iter().enumerate() {
            let Some(m) = &p.member else { continue };
            for (k, owners) in owners.iter_mut().enumerate() {
                let token = m
                    .would_grant(k.to_string())
                    .map(FencingToken::get)
                    .or_else(|| {
                        p.held
                            .iter()
                            .filter(|h| h.key == k)
                            .filter_map(Held::grant)
                            .find(|g| g.is_valid())
                            .map(|g| g.token().get())
                    });
                if let Some(t) = token {
                    owners.push((i, t));
                }
            }
        }
        owners
    }

    /// Who holds a valid share grant covering each item.
    fn share_owners(&self) -> Vec<Vec<ShareOwner>> {
        let mut owners = vec![Vec::new(); KEYS];
        for (i, p) in self.procs.iter().enumerate() {
            for (g, (index, replicas), _) in &p.shares {
                if !g.is_valid() || *replicas == 0 {
                    continue;
                }
                for (k, owners) in owners.iter_mut().enumerate() {
                    if k as u32 % replicas == *index {
                        owners.push((i, (*index, *replicas), g.token().get()));
                    }
                }
            }
        }
        owners
    }

    /// Whether the guarantees are checked now: not within two TTLs of a store fault that voids
    /// them (see [`Sim::rolled_back`]).
    fn strict(&self) -> bool {
        self.rolled_back.is_none_or(|t| self.now() > t + 2 * TTL)
    }

    /// A store fault that voids the guarantees (lost writes, a lost index): they are not checked
    /// for two TTLs, and never for the grants held now.
    fn void_guarantees(&mut self) {
        self.rolled_back = Some(self.now());
        for p in &mut self.procs {
            for h in &mut p.held {
                h.strict = false;
            }
        }
    }

    fn check_safety(&mut self) -> Result<(), String> {
        if let Some(hidden) = self.store.hidden_change() {
            return Err(format!("the store hid a change: {hidden}"));
        }
        let strict = self.strict();
        let now = self.now();
        for p in &self.procs {
            for h in &p.held {
                let Some(g) = h.grant().filter(|g| g.is_valid()) else {
                    continue;
                };
                let strict = strict && h.strict;
                let key = &h.key;
                let (newest, by, since_strict) = &mut self.fences[*key];
                if strict && g.token().get() < *newest {
                    return Err(format!(
                        "a fence refuses {}'s valid grant of key {key} (epoch {}, token {}, \
                         taken at {:.3}s): {by}'s grant with token {newest} wrote before it, at \
                         {:.3}s",
                        p.label,
                        g.epoch(),
                        g.token().get(),
                        h.taken.as_secs_f64(),
                        now.as_secs_f64()
                    ));
                }
                // Two holders writing with one token cannot be told apart by a fence: the older
                // one, a zombie, would still get through after the newer one wrote.
                if strict && *since_strict && g.token().get() == *newest && *by != p.label {
                    return Err(format!(
                        "{}'s valid grant of key {key} (epoch {}) has token {newest}, which \
                         {by}'s grant wrote with before: a fence cannot tell them apart, at {:.3}s",
                        p.label,
                        g.epoch(),
                        now.as_secs_f64()
                    ));
                }
                if g.token().get() >= *newest {
                    *newest = g.token().get();
                    by.clone_from(&p.label);
                    *since_strict = strict;
                }
            }
        }
        for (k, owners) in self.share_owners().iter().enumerate() {
            let distinct: std::collections::BTreeSet<usize> =
                owners.iter().map(|(i, _, _)| *i).collect();
            if strict && distinct.len() > 1 {
                let who: Vec<String> = owners
                    .iter()
                    .map(|(i, pair, t)| {
                        format!("{} share {pair:?} token {t}", self.procs[*i].label)
                    })
                    .collect();
                return Err(format!(
                    "two share owners of item {k} at {:.3}s: {}",
                    self.now().as_secs_f64(),
                    who.join("; ")
                ));
            }
        }
        let owners = self.owners();
        for (k, owners) in owners.iter().enumerate() {
            if strict && owners.len() > 1 {
                let who: Vec<String> = owners
                    .iter()
                    .map(|(i, t)| {
                        let p = &self.procs[*i];
                        let a = p.member.as_ref().map(Member::assignment);
                        format!(
                            "{} ({}) token {t} {:?}",
                            p.label,
                            p.id,
                            a.map(|a| (a.slot, a.phase, a.epoch, a.live))
                        )
                    })
                    .collect();
                return Err(format!(
                    "two owners of key {k} at {:.3}s: {}",
                    self.now().as_secs_f64(),
                    who.join("; ")
                ));
            }
        }
        self.check_hooks(&owners, strict)?;
        for i in 0..self.procs.len() {
            let Some(a) = self.procs[i].member.as_ref().map(Member::assignment) else {
                continue;
            };
            if a.phase == GroupPhase::Active {
                if a.epoch < self.procs[i].last_epoch {
                    return Err(format!(
                        "{} went back from epoch {} to {} at {:.3}s",
                        self.procs[i].label,
                        self.procs[i].last_epoch,
                        a.epoch,
                        self.now().as_secs_f64()
                    ));
                }
                self.procs[i].last_epoch = a.epoch;
            }
        }
        Ok(())
    }

    /// The revocation hook reaches the workers that listen to it: a cooperating worker drops
    /// its grant as soon as `revoked()` fires, so one still holding a grant that is no longer
    /// valid a tick after a check first saw it invalid was never woken; and, with `strict` (and
    /// a grant that is [`Held::strict`]), no other member can take or hold a key while a
    /// cooperating worker still holds it (the
    /// hook fires before the hand-off is acknowledged, and at the lease deadline, before the
    /// slot expires in the store).
    fn check_hooks(&mut self, owners: &[Vec<(usize, u64)>], strict: bool) -> Result<(), String> {
        let now = self.now();
        let labels: Vec<String> = self.procs.iter().map(|p| p.label.clone()).collect();
        for (i, label) in labels.iter().enumerate() {
            for h in &mut self.procs[i].held {
                let Some(g) = h.grant() else { continue };
                let Holding::Task { invalid_since, .. } = &mut h.grant else {
                    continue;
                };
                if g.is_valid() {
                    *invalid_since = None;
                } else {
                    let since = *invalid_since.get_or_insert(now);
                    if now >= since + TICK {
                        return Err(format!(
                            "{label}'s worker still holds its grant of key {} (epoch {}, token \
                             {}) at {:.3}s, though it has been invalid since {:.3}s: \
                             revoked() did not fire",
                            h.key,
                            g.epoch(),
                            g.token().get(),
                            now.as_secs_f64(),
                            since.as_secs_f64()
                        ));
                    }
                }
                if let Some((j, t)) = owners[h.key].iter().find(|(j, _)| *j != i) {
                    if strict && h.strict {
                        return Err(format!(
                            "{} owns key {} (token {t}) at {:.3}s while {label}'s worker still \
                             holds a grant of it (epoch {}, token {}, valid {}, lease lapsed \
                             {}): the hand-off did not wait for the revocation",
                            labels[*j],
                            h.key,
                            now.as_secs_f64(),
                            g.epoch(),
                            g.token().get(),
                            g.is_valid(),
                            g.lease_lapsed()
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Every live member active under one view, every key owned exactly once.
    fn converged(&self) -> Result<(), String> {
        let mut epochs = Vec::new();
        for p in &self.procs {
            if p.joining.is_some() {
                return Err(format!("{} is still joining", p.label));
            }
            let Some(m) = &p.member else { continue };
            let a = m.assignment();
            match a.phase {
                GroupPhase::Stopped | GroupPhase::Failed => continue,
                GroupPhase::Active if a.index.is_some() => epochs.push(a.epoch),
                phase => return Err(format!("{} is {phase:?} ({:?})", p.label, a.last_error)),
            }
        }
        epochs.dedup();
        if epochs.len() > 1 {
            return Err(format!(
                "members are active under different epochs {epochs:?}"
            ));
        }
        for (k, owners) in self.owners().iter().enumerate() {
            if !epochs.is_empty() && owners.len() != 1 {
                let members: Vec<String> = self
                    .procs
                    .iter()
                    .filter_map(|p| {
                        let a = p.member.as_ref()?.assignment();
                        Some(format!(
                            "{} slot {:?} {:?} epoch {} live {:?}",
                            p.label, a.slot, a.phase, a.epoch, a.live
                        ))
                    })
                    .collect();
                return Err(format!(
                    "key {k} has {} owners ({})",
                    owners.len(),
                    members.join("; ")
                ));
            }
        }
        Ok(())
    }
}

/// The id of the simulation's keys declared as partitions.
fn partitions_id() -> Result<headcount_core::assign::KeySetId, String> {
    Ok(headcount_core::assign::KeySet::partitions(KEYS as u32)
        .map_err(|e| e.to_string())?
        .id())
}

async fn run_seed(seed: u64, verbose: bool, models: Models) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let plan = Plan::for_seed(&mut rng);
    let clock = SimClock::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
        .with_seed(seed ^ 0x00c1_a1a5);
    let store = SimStore::new(&models, &clock, seed);
    // Chosen without a draw, so the seeds' schedules are those of before.
    let assignor = match seed % 4 {
        1 => Some(AssignorKind::Modulo),
        3 => Some(AssignorKind::Memento),
        _ if seed % 8 == 2 => Some(AssignorKind::Sticky(partitions_id()?)),
        _ if seed.is_multiple_of(16) => Some(AssignorKind::Balanced(partitions_id()?)),
        _ => None,
    };
    let mut sim = Sim {
        seed,
        rng,
        share_rng: StdRng::seed_from_u64(seed ^ 0x5eed_54a2e),
        hook_rng: StdRng::seed_from_u64(seed ^ 0x400c_5eed),
        assignor,
        clock,
        store,
        procs: Vec::new(),
        next_member: 0,
        snapshots: Vec::new(),
        log: Vec::new(),
        verbose,
        rolled_back: None,
        fences: vec![(0, String::new(), false); KEYS],
        // Chosen without a draw, so the seeds' schedules are those of before.
        window: if seed.is_multiple_of(3) { TTL } else { TTL * 2 },
        restarts: Vec::new(),
        replace_rng: StdRng::seed_from_u64(seed ^ 0x5eed_4e91ace),
        leaves: Vec::new(),
        notices: notices_for_seed(seed),
        ride_rng: StdRng::seed_from_u64(seed ^ 0x0071_de5e),
        crash_grace: Duration::ZERO,
        drain_timeout: None,
        down_until: None,
    };
    if sim.ride_rng.random_bool(0.35) {
        sim.crash_grace = Duration::from_millis(sim.ride_rng.random_range(300..2_000));
    }
    if sim.ride_rng.random_bool(0.3) {
        sim.drain_timeout = Some(TTL * sim.ride_rng.random_range(2..5));
    }
    sim.note(format!(
        "{plan:?} assignor {assignor:?} store {} notifications {} crash grace {:?} drain timeout {:?}",
        sim.store.describe(),
        describe_notices(&sim.notices),
        sim.crash_grace,
        sim.drain_timeout
    ));
    let first = sim.rng.random_range(1..=3);
    for _ in 0..first {
        let id = format!("m{}", sim.next_member);
        sim.next_member += 1;
        sim.start(id, plan.rates);
    }
    let fail = |sim: &Sim, why: String| {
        let tail: Vec<&String> = sim.log.iter().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().map(String::as_str).collect();
        Err(format!(
            "seed {seed} ({:?} store): {why}\nlast events:\n  {}\nreplay: {}HEADCOUNT_SIM_SEED={seed} cargo test -p headcount-core --test simulation -- --nocapture",
            sim.store.kind,
            tail.join("\n  "),
            models.replay_env(sim.store.kind)
        ))
    };
    while sim.now() < plan.run {
        tokio::time::sleep(TICK).await;
        sim.finish_joins().await;
        sim.resume_due();
        sim.restart_due(plan.rates, false);
        sim.leave_due(false);
        sim.outage_due(false);
        if sim.rng.random_bool(plan.event) {
            sim.event(plan.rates, plan.rollbacks);
        }
        if sim.ride_rng.random_bool(plan.event / 10.0) {
            sim.outage();
        }
        sim.work();
        if let Some(what) = sim
            .store
            .index_fault()
            .or_else(|| sim.store.unseen_restore())
        {
            sim.void_guarantees();
            sim.note(what);
        }
        if plan.rollbacks
            && sim
                .snapshots
                .last()
                .is_none_or(|(t, _)| sim.now() >= *t + TICK * 5)
        {
            let snap = sim.store.snapshot();
            let now = sim.now();
            sim.snapshots.push((now, snap));
            if sim.snapshots.len() > 64 {
                sim.snapshots.remove(0);
            }
        }
        if let Err(why) = sim.check_safety() {
            return fail(&sim, why);
        }
    }
    // A rollback as the last fault: nothing else changes afterwards that could hide a write
    // the members never make again (an acknowledgement the store lost).
    if plan.rollbacks && sim.rng.random_bool(0.5) {
        sim.roll_back();
    }
    // The faults stop: everyone resumes, and the group must converge.
    let notice_faults: u64 = sim.procs.iter().map(|p| p.faults.notice_faults()).sum();
    sim.note(format!(
        "faults stop ({notice_faults} notice faults injected so far)"
    ));
    sim.outage_due(true);
    for p in &mut sim.procs {
        p.faults.set_rates(FaultRates::NONE);
        p.faults.resume();
        p.resume_at = None;
        p.held.clear();
        p.shares.clear();
    }
    // Every process away for a restart comes back now, and every replaced member leaves.
    sim.restart_due(FaultRates::NONE, true);
    sim.leave_due(true);
    let quiet = sim.now();
    // A join may wait one TTL for a previous incarnation (and its crash grace, or a TTL after
    // taking its slot over); then TTL + two heartbeats + hand-off. A crashed member's slot
    // outlives its lease by the crash grace.
    let deadline = quiet + TTL * 5 + sim.crash_grace * 2;
    loop {
        tokio::time::sleep(TICK).await;
        sim.finish_joins().await;
        if let Err(why) = sim.check_safety() {
            return fail(&sim, why);
        }
        match sim.converged() {
            Ok(()) => break,
            Err(why) if sim.now() >= deadline => {
                return fail(
                    &sim,
                    format!(
                        "not converged {:?} after the faults stopped: {why}",
                        sim.now() - quiet
                    ),
                );
            }
            Err(_) => {}
        }
    }
    write_digest(&sim);
    Ok(())
}

/// With `HEADCOUNT_SIM_DIGESTS=FILE`, appends a line `seed hash` to FILE for each seed that
/// passed: a hash of its event log, of the faults each process drew (one draw per store call,
/// so a change in the calls a member makes shows there) and of where every member ended. Two
/// builds whose files are equal behaved the same on those seeds: how a refactoring that must
/// change no behaviour is checked.
fn write_digest(sim: &Sim) {
    use std::hash::{Hash, Hasher};
    use std::io::Write as _;
    let Ok(path) = std::env::var("HEADCOUNT_SIM_DIGESTS") else {
        return;
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    sim.log.hash(&mut h);
    for p in &sim.procs {
        p.faults.injected().hash(&mut h);
        p.faults.notice_faults().hash(&mut h);
        if let Some(m) = &p.member {
            let a = m.assignment();
            (a.slot, a.index, a.epoch, a.phase.as_str(), &a.live).hash(&mut h);
        }
    }
    sim.now().hash(&mut h);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        // One write per line: seeds finish on several threads at once.
        // Seeds with lossy notifications are marked: their notices are forwarded by a task of
        // their own, and a few of them do not replay exactly (see the module's docs).
        let lossy = sim.notices.enabled && sim.notices != NoticeRates::NONE;
        let line = format!(
            "{} {:016x}{}\n",
            sim.seed,
            h.finish(),
            if lossy { " lossy" } else { "" }
        );
        let _ = f.write_all(line.as_bytes());
    }
}

fn run_one(seed: u64, verbose: bool, models: Models) -> Result<(), String> {
    if verbose {
        // A second replay in one process finds it set already: nothing to do then.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(run_seed(seed, verbose, models))
}

/// Runs `seeds` on up to four threads; the report of each failed seed, in seed order.
fn run_seeds(seeds: &[u64], verbose: bool, models: Models) -> Vec<String> {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(4);
    let mut failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mine: Vec<u64> = seeds.iter().copied().skip(t).step_by(threads).collect();
                s.spawn(move || {
                    mine.into_iter()
                        .filter_map(|seed| run_one(seed, verbose, models).err())
                        .collect::<Vec<String>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|_| vec!["a simulation thread panicked".into()])
            })
            .collect()
    });
    failures.sort_by_key(|f| {
        f.strip_prefix("seed ")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
    });
    failures
}

thread_local! {
    /// Change records read on this thread ([`ChangeReads`]): a seed runs on one thread.
    static CHANGE_READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts the reads of change records (`hc:{group}:change:<digest>`), which a member makes only
/// when it walks back from a header to a view it holds.
#[derive(Debug, Clone, Copy)]
struct ChangeReads;

impl Hooks for ChangeReads {
    fn span(&self, op: Op, key: &str) -> tracing::Span {
        if op == Op::Get && key.contains(":change:") {
            CHANGE_READS.with(|n| n.set(n.get() + 1));
        }
        tracing::Span::none()
    }
}

/// The simulation walks change records: over the first 64 seeds (a quarter of which write
/// headers with records that cost nothing), members read some. If this fails, the seeds no
/// longer let a member fall behind far enough to walk, and the walk is proven by its unit tests
/// alone.
#[test]
fn members_walk_the_change_records() {
    let before = CHANGE_READS.with(std::cell::Cell::get);
    for seed in 0..64 {
        if let Err(report) = run_one(seed, false, Models::from_env()) {
            panic!("{report}");
        }
    }
    let read = CHANGE_READS.with(std::cell::Cell::get) - before;
    eprintln!("change records read over seeds 0..64: {read}");
    assert!(read > 0, "no member walked a change record in seeds 0..64");
}

#[test]
fn group_simulation() {
    let (seeds, replay) = common::seeds(2000);
    let failures = run_seeds(&seeds, replay, Models::from_env());
    if !failures.is_empty() {
        // One line per failed seed, then the whole report of the first.
        let lines: Vec<&str> = failures.iter().filter_map(|f| f.lines().next()).collect();
        panic!(
            "{} of {} seeds failed:\n  {}\nthe first:\n{}",
            failures.len(),
            seeds.len(),
            lines.join("\n  "),
            failures[0]
        );
    }
}

/// Whether some seed of `0..seeds` fails on `models` with a report containing `finding`.
fn some_seed_finds(models: Models, seeds: u64, finding: &str) {
    let seeds: Vec<u64> = (0..seeds).collect();
    let failures = run_seeds(&seeds, false, models);
    assert!(
        failures.iter().any(|f| f.contains(finding)),
        "no seed of 0..{} failed with `{finding}`: {failures:?}",
        seeds.len()
    );
}

/// The Redis model has teeth: with an index that does not heal itself, a lost index hides the
/// view and members for good, and some seed of the first 16 finds members that never become
/// active. If this fails, the model or the simulation no longer sees what the repair prevents.
#[test]
fn the_redis_model_finds_an_index_that_never_heals() {
    let models = Models {
        only: Some(ModelKind::Redis),
        repair: false,
        faults: ModelFaults::default(),
        etcd_watch: true,
    };
    some_seed_finds(models, 16, "not converged");
}

/// The etcd model has teeth: with clients that do not watch the revisions, a restore that hands
/// the lost revisions out again makes a version come back for other contents, and the
/// simulation sees it on some seed. If this fails, the model or the simulation no longer sees
/// what the watch prevents.
#[test]
fn the_etcd_model_finds_a_restore_that_reuses_revisions() {
    let models = Models {
        only: Some(ModelKind::Etcd),
        repair: true,
        faults: ModelFaults::default(),
        etcd_watch: false,
    };
    some_seed_finds(models, 64, "the store hid a change");
}
