//! Joining: [`Group::join`], and the [`Member`] handle with its heartbeat task.

use std::fmt;
use std::sync::Arc;

use tokio::sync::{broadcast, watch};

use super::config::GroupConfig;
use super::grants::{Grant, Scope, Shared};
use super::runner::Runner;
use super::view::{Assignment, Change, GroupPhase};
use crate::assign::hash_bytes;
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::task::{Background, OnDrop};
use crate::DynStore;

/// Joins groups.
#[derive(Debug, Clone, Copy)]
pub struct Group;

impl Group {
    /// Claims a slot in the group (its previous one when `config` names a member id whose slot
    /// is still free) and starts heartbeating in the background. Returns once the slot is
    /// claimed; the first view becomes active shortly after (watch [`Member::watch`]). With
    /// [`GroupConfig::with_standby`] it returns once the member stands by (phase
    /// [`GroupPhase::Standby`]) and claims in the background, when a leaving member hands it its
    /// slot or the wait ends; an error of that claim ends the member with phase `failed`.
    ///
    /// How long it blocks: a round trip or a few when the member id holds no live slot. When a
    /// previous process with the same member id still holds one (it crashed a moment ago), up to
    /// that slot's lease TTL while its record expires, plus its crash grace if it had one; with
    /// a crash grace of its own ([`GroupConfig::with_crash_grace`]) it takes that slot over at
    /// once instead and then waits one lease TTL (the longer of both processes' TTLs), in case
    /// the previous process is frozen rather than dead and still grants until its deadline.
    ///
    /// Errors: [`Error::InvalidArgument`] for a bad group, prefix, member id, TTL (also one below
    /// the store's shortest lease) or slot limit; [`Error::Rejected`] when another live process
    /// holds a slot with the same member id (past its lease and grace), another process of the
    /// id took the slot over while this one waited, the group is full, or the store may evict
    /// keys before they expire (see [`GroupConfig::with_eviction_allowed`]); the store's own
    /// error when it cannot be reached.
    pub async fn join(store: DynStore, config: GroupConfig) -> Result<Member> {
        let space = config.check()?;
        let caps = store.capabilities();
        if config.ttl < caps.min_ttl {
            return Err(Error::invalid(format!(
                "lease TTL {:?} is shorter than the {} store's shortest lease of {:?}",
                config.ttl, caps.backend, caps.min_ttl
            )));
        }
        check_eviction(&store, &config).await?;
        let window = config.restart_window();
        if window < caps.min_ttl {
            return Err(Error::invalid(format!(
                "restart window {window:?} is shorter than the {} store's shortest lease of {:?}",
                caps.backend, caps.min_ttl
            )));
        }
        let explicit = config.member.is_some();
        let member = config
            .member
            .clone()
            .unwrap_or_else(|| format!("{:016x}", rand::random::<u64>()));
        let shared = Arc::new(Shared::new(config.clock.clone(), member.clone()));
        let mut runner = Runner::new(store, &config, space, member.clone(), shared.clone());
        // Every handle dropped without leave(): the heartbeat is cancelled and the slot expires
        // after the TTL.
        let what = format!("group member {member}");
        runner.subscribe().await;
        let task = if config.standby.is_some() {
            let record = runner.begin_standby().await?;
            Background::spawn(what, OnDrop::Abort, |stop| runner.run_standby(record, stop))
        } else {
            runner.first_claim().await?;
            Background::spawn(what, OnDrop::Abort, |stop| runner.run(stop))
        };
        Ok(Member {
            shared,
            member,
            explicit,
            task: Arc::new(task),
            declared: config.declared.clone(),
        })
    }
}

/// Refuses a store that may evict keys before they expire (see
/// [`GroupConfig::with_eviction_allowed`]), or warns when told to allow it. A store that cannot
/// answer is joined: the check is advice, the join's own calls say whether the store works.
async fn check_eviction(store: &DynStore, config: &GroupConfig) -> Result<()> {
    // Bounded like a heartbeat: a store that does not answer is not one to wait on here.
    let asked = tokio::time::timeout(config.ttl, store.durability()).await;
    let why = match asked {
        Ok(Ok(d)) => d.evicts,
        Err(_) => None,
        Ok(Err(e)) => {
            tracing::debug!(group = %config.group, error = %e, "cannot ask the store whether it evicts keys");
            None
        }
    };
    let Some(why) = why else { return Ok(()) };
    let backend = store.capabilities().backend;
    if config.eviction_allowed {
        tracing::warn!(group = %config.group, backend, "the store may evict keys before they expire ({why}): an evicted lease lets two members hold one key until the next renewal");
        return Ok(());
    }
    Err(Error::Rejected {
        backend,
        message: format!(
            "the store may evict keys before they expire: {why}; a group needs a store that keeps its leases until they expire (set maxmemory-policy noeviction, or allow it explicitly: GroupConfig::with_eviction_allowed, --allow-eviction)"
        ),
        source: None,
    })
}

/// A member of a group: ask it which keys it owns; it heartbeats in the background until
/// [`Member::leave`]. Clones are handles to the same member (one heartbeat, one slot): the
/// heartbeat stops when one of them leaves, or when the last one is dropped.
#[derive(Clone)]
pub struct Member {
    pub(super) shared: Arc<Shared>,
    pub(super) member: String,
    /// The member id was configured ([`GroupConfig::with_member`]), not drawn at random: only
    /// then can a restarted process come back as this member.
    pub(super) explicit: bool,
    pub(super) task: Arc<Background>,
    /// The group's declared keys ([`GroupConfig::with_keys`]), for [`Member::owned`].
    pub(super) declared: Option<Arc<crate::assign::KeySet>>,
}

impl fmt::Debug for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Member")
            .field("member", &self.member)
            .field("assignment", &*self.shared.assignment.borrow())
            .finish()
    }
}

impl Member {
    /// The member id.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// A grant for `key` when it is this member's now (see the [module docs](super) for when a
    /// key is), `None` otherwise. Hold the grant while working on the key.
    pub fn owns(&self, key: impl AsRef<[u8]>) -> Option<Grant> {
        self.shared.grant(Scope::Key(hash_bytes(key.as_ref())))
    }

    /// The token [`Member::owns`] would grant `key` under right now, without taking a grant
    /// (nothing is in flight afterwards): for monitoring and for tests that check who owns what.
    pub fn would_grant(&self, key: impl AsRef<[u8]>) -> Option<FencingToken> {
        let now = self.shared.clock.monotonic();
        let scope = Scope::Key(hash_bytes(key.as_ref()));
        self.shared
            .lock()
            .grantable(scope, now)
            .map(|g| FencingToken::new(g.token))
    }

    /// The declared keys ([`GroupConfig::with_keys`], `with_partitions`) this member owns now,
    /// by name, in no particular order: those [`Member::owns`] would grant at this instant
    /// (none while its lease lapsed or it leaves, and none of a hand-off's lost keys). A
    /// snapshot for a dashboard, a log line or a rebalance listener; ask [`Member::owns`]
    /// before each piece of work. Empty in a group without declared keys. Names that are not
    /// UTF-8 are given lossily.
    pub fn owned(&self) -> Vec<String> {
        let Some(keys) = &self.declared else {
            return Vec::new();
        };
        let now = self.shared.clock.monotonic();
        let st = self.shared.lock();
        keys.keys()
            .filter(|&(h, _)| st.grantable(Scope::Key(h), now).is_some())
            .map(|(_, name)| String::from_utf8_lossy(name).into_owned())
            .collect()
    }

    /// [`Member::owns`] for a key that is already a hash (see [`crate::assign::hash_u64`]).
    pub fn owns_hash(&self, hash: u64) -> Option<Grant> {
        self.shared.grant(Scope::Key(hash))
    }

    /// A grant for the member's whole share, valid while its `(index, replicas)` pair stays the
    /// same: for programs that split work by the pair themselves (`headcount exec`).
    pub fn share(&self) -> Option<Grant> {
        self.shared.grant(Scope::Share)
    }

    /// The current assignment. A member whose lease deadline passed while its heartbeat task
    /// could not run (a paused process) reports `Rejoining` at once, before that task catches
    /// up and publishes it.
    pub fn assignment(&self) -> Assignment {
        let mut a = self.shared.assignment.borrow().clone();
        let now = self.shared.clock.monotonic();
        let lapsed = self.shared.lock().deadline.is_some_and(|d| now >= d);
        if lapsed && matches!(a.phase, GroupPhase::Active | GroupPhase::Handoff) {
            a.phase = GroupPhase::Rejoining;
            a.index = None;
        }
        a
    }

    /// A watch of the assignment.
    pub fn watch(&self) -> watch::Receiver<Assignment> {
        self.shared.assignment.subscribe()
    }

    /// A stream of activated view changes (a lagging receiver skips the oldest): which keys the
    /// member gained ([`Change::gained`]) once it may grant them.
    pub fn changes(&self) -> broadcast::Receiver<Change> {
        self.shared.changes.subscribe()
    }

    /// A stream of hand-offs as they start (a lagging receiver skips the oldest): each
    /// [`Change`] goes from the active view to the view just adopted, and [`Change::lost`] names
    /// the keys this member is about to lose. It is sent before the member acknowledges the
    /// view, but the member does not wait for it to be read: what holds the hand-off is the
    /// grants still held on those keys (up to the drain timeout), so hold a key's grant until its
    /// work is finished or checkpointed. The keys are no longer granted from that moment.
    ///
    /// A leave and a lapsed or lost lease are sent too, with every key the member owned as
    /// lost ([`Change::cause`] says which): a leave waits for the grants (up to the drain
    /// timeout), a lapse waits for nobody, so stop that work at once. Kafka's
    /// `onPartitionsRevoked` (and `onPartitionsLost` for a lapse); [`Member::changes`] is its
    /// `onPartitionsAssigned`. Per grant, [`Grant::revoked`] says the same.
    pub fn revocations(&self) -> broadcast::Receiver<Change> {
        self.shared.revocations.subscribe()
    }

    /// Whether the member is ready now ([`Assignment::is_ready`]): active under a view that
    /// names it, with no hand-off of its own pending, and its lease alive on its own clock. For
    /// a readiness probe (`headcount run` and `exec` serve it as `--ready-file` and `/ready`).
    pub fn ready(&self) -> bool {
        self.assignment().is_ready()
    }

    /// Whether the member works now ([`Assignment::is_working`]): it owns its share, with its
    /// lease alive on its own clock. A standby is ready ([`Member::ready`]) but not working.
    pub fn working(&self) -> bool {
        self.assignment().is_working()
    }

    /// Waits until the member is ready ([`Member::ready`]) and returns its assignment; the
    /// errors of [`Member::active`]. A member that is ready may become unready again at the
    /// next view change: watch [`Member::watch`] with [`Assignment::is_ready`] to follow it.
    /// A standby is ready while it stands by (its assignment has no index then): to wait until
    /// the member works, use [`Member::active`].
    pub async fn wait_ready(&self) -> Result<Assignment> {
        self.wait_for(Assignment::is_ready).await
    }

    /// Waits until the member is active under a view of at least `epoch` (0: any view) that
    /// includes its slot.
    pub async fn active(&self, epoch: u64) -> Result<Assignment> {
        self.wait_for(|a| a.phase == GroupPhase::Active && a.epoch >= epoch && a.index.is_some())
            .await
    }

    /// Waits until the assignment satisfies `done`, or the member stops or fails.
    async fn wait_for(&self, done: impl Fn(&Assignment) -> bool) -> Result<Assignment> {
        let mut rx = self.watch();
        loop {
            {
                let a = rx.borrow_and_update();
                if done(&a) {
                    return Ok(a.clone());
                }
                if matches!(a.phase, GroupPhase::Stopped | GroupPhase::Failed) {
                    return Err(Error::stopped(
                        self.task.what(),
                        format!(
                            "it is {}: {}",
                            a.phase.as_str(),
                            a.last_error.as_deref().unwrap_or("it left the group")
                        ),
                    ));
                }
            }
            if rx.changed().await.is_err() {
                return Err(Error::stopped(self.task.what(), "its heartbeat task ended"));
            }
        }
    }

    /// Leaves gracefully: stops granting, waits (up to the drain timeout) for grants in flight,
    /// deletes the slot and publishes the view without it. Returns the error that ended the
    /// member early, if one did (another process with the same member id). Any handle may
    /// leave; a second call, from another handle, waits for the first and returns `Ok`.
    pub async fn leave(self) -> Result<()> {
        self.task.stop().await
    }

    /// Leaves for a restart (static membership): stops granting and waits (up to the drain
    /// timeout) for grants in flight like [`Member::leave`], but then *parks* its claim instead
    /// of deleting it: the slot stays reserved, under the same view, for the restart window
    /// ([`GroupConfig::with_restart_window`], default one lease TTL). A process that joins with
    /// the same member id within the window takes the slot back: the same slots under the next
    /// epoch (so that a fence orders its tokens after this process's), no key moves, and its keys
    /// pause for the restart plus about one heartbeat (the returning process is active once the
    /// others acknowledged that epoch). If none returns in time the parked claim expires
    /// and the others take its keys, as after a crash, one window after the leave.
    ///
    /// Use it when the process will come back under the same id (a StatefulSet pod, a
    /// systemd unit restarted in place); use [`Member::leave`] when it will not (a scale-down),
    /// so the others take its keys at once.
    ///
    /// Errors: [`Error::InvalidConfig`] for a member whose id was drawn at random (no later
    /// process can return as it): it then leaves as [`Member::leave`] does, so its keys move at
    /// once, and says how to fix it. Grants that did not drain within the drain timeout also
    /// end in a plain leave: the lease runs out instead of being parked, since the work may
    /// still be going on. Otherwise as [`Member::leave`].
    pub async fn leave_for_restart(self) -> Result<()> {
        if !self.explicit {
            self.task.stop().await?;
            return Err(Error::config(format!(
                "member `{}` has a random id, so no restarted process can come back as it: it left the group instead (give it a stable id: GroupConfig::with_member, --member, HEADCOUNT_MEMBER)",
                self.member
            )));
        }
        self.shared.lock().restart = true;
        self.task.stop().await
    }
}
