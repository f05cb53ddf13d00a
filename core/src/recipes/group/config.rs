//! The group's configuration: [`GroupConfig`].

use std::sync::Arc;
use std::time::Duration;

use super::{
    COALESCE_FROM, DEFAULT_MAX_SLOTS, MAX_LEASE_TTL, MAX_RESTART_WINDOW, MAX_STANDBY, MIN_LEASE_TTL,
};
use crate::assign::{AssignorKind, KeySet};
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::keys::{Keyspace, DEFAULT_PREFIX};
use crate::store::MAX_VALUE_LEN;

/// How to join a group.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    pub(super) group: String,
    pub(super) prefix: String,
    pub(super) ttl: Duration,
    pub(super) member: Option<String>,
    pub(super) assignor: AssignorKind,
    /// The balanced assignor's declared keys ([`GroupConfig::with_keys`]).
    pub(super) declared: Option<Arc<KeySet>>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) max_slots: u32,
    pub(super) drain_timeout: Option<Duration>,
    pub(super) restart_window: Option<Duration>,
    pub(super) outage_grace: Option<Duration>,
    pub(super) crash_grace: Duration,
    pub(super) standby: Option<Duration>,
    pub(super) change_checks: bool,
    pub(super) one_call_versions: bool,
    pub(super) view_inline_max: usize,
    pub(super) change_record_cost: usize,
    pub(super) coalesce_from: usize,
    pub(super) notifications: bool,
    pub(super) eviction_allowed: bool,
}

impl GroupConfig {
    /// A configuration for `group` with lease `ttl` (renewed every `ttl / 3`), a random member
    /// id, the system clock and the assignor [`JumpBackFailover`](crate::assign::JumpBackFailover)
    /// (JumpBackHash with RavenDB's failover, named `jumpback`): as minimal and balanced as jump
    /// consistent hash with the same failover ([`AssignorKind::JumpFailover`], `jump`, the default
    /// before it) and several times faster, but a different assignment. Every member of a group
    /// must use the same assignor, so a group with members that default to `jump` must set it
    /// with [`with_assignor`](Self::with_assignor) on the others.
    pub fn new(group: impl Into<String>, ttl: Duration) -> Self {
        GroupConfig {
            group: group.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            ttl,
            member: None,
            assignor: AssignorKind::JumpBackFailover,
            declared: None,
            clock: Arc::new(SystemClock::new()),
            max_slots: DEFAULT_MAX_SLOTS,
            drain_timeout: None,
            restart_window: None,
            outage_grace: None,
            crash_grace: Duration::ZERO,
            standby: None,
            change_checks: true,
            one_call_versions: true,
            view_inline_max: super::header::INLINE_MAX,
            change_record_cost: super::header::RECORD_COST,
            coalesce_from: COALESCE_FROM,
            notifications: true,
            eviction_allowed: false,
        }
    }

    /// Uses another key prefix than `hc`.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The member's stable id (1 to 64 characters of `A-Z a-z 0-9 _ - .`): a restarted member
    /// with the same id gets its slot back if it is still free, and a member that left with
    /// [`Member::leave_for_restart`](super::Member::leave_for_restart) gets its
    /// slot back, with no key moved, when it returns within the restart window. In Kubernetes,
    /// the pod's name (`HEADCOUNT_MEMBER` from `metadata.name`) in a StatefulSet.
    pub fn with_member(mut self, member: impl Into<String>) -> Self {
        self.member = Some(member.into());
        self
    }

    /// The assignor mapping keys to live slots; every member of a group must use the same one.
    pub fn with_assignor(mut self, assignor: AssignorKind) -> Self {
        self.assignor = assignor;
        self
    }

    /// Declares the group's keys and assigns them with the [sticky](crate::assign::Sticky)
    /// assignor: every live member owns `⌊keys / members⌋` or `⌈keys / members⌉` of them, and a
    /// join, leave or crash moves the fewest keys that balance allows (a join exactly the
    /// newcomer's share, a leave exactly the leaver's keys). A key outside the set still has an
    /// owner, by `jumpback`. Every member of the group must declare the same set: the view
    /// records its [id](KeySet::id), and a member with another set is refused at
    /// [`Group::join`](super::Group::join) with [`ErrorKind::Config`](crate::ErrorKind::Config).
    ///
    /// Replaces the assignor, unless it is already one for a declared set: to keep the
    /// stateless [balanced](crate::assign::Balanced) assignor (a function of the live members
    /// alone, which moves more keys), call
    /// `with_assignor(AssignorKind::Balanced(keys.id()))` after this.
    ///
    /// ```
    /// use std::time::Duration;
    /// use headcount_core::assign::{AssignorKind, KeySet};
    /// use headcount_core::recipes::group::GroupConfig;
    ///
    /// let keys = KeySet::new((0..256).map(|i| format!("p{i:03}")))?;
    /// let config = GroupConfig::new("consumers", Duration::from_secs(6)).with_keys(keys.clone());
    /// config.validate()?;
    /// // The stateless balanced assignor instead, for comparison:
    /// let id = keys.id();
    /// let stateless = GroupConfig::new("consumers", Duration::from_secs(6))
    ///     .with_keys(keys)
    ///     .with_assignor(AssignorKind::Balanced(id));
    /// stateless.validate()?;
    /// # Ok::<(), headcount_core::Error>(())
    /// ```
    pub fn with_keys(mut self, keys: KeySet) -> Self {
        self.assignor = match self.assignor {
            AssignorKind::Balanced(_) => AssignorKind::Balanced(keys.id()),
            _ => AssignorKind::Sticky(keys.id()),
        };
        self.declared = Some(Arc::new(keys));
        self
    }

    /// [`with_keys`](Self::with_keys) for `count` partitions named `"0"`, `"1"`, ...,
    /// `"count - 1"` ([`KeySet::partitions`]), the names `headcount status` samples. A count
    /// of 0 or above [`MAX_DECLARED_KEYS`](crate::assign::MAX_DECLARED_KEYS) is refused by
    /// [`validate`](Self::validate).
    pub fn with_partitions(self, count: u32) -> Self {
        match KeySet::partitions(count) {
            Ok(keys) => self.with_keys(keys),
            // Too many: leave an id that `check` refuses with the reason.
            Err(_) => {
                let mut this = self;
                let id = crate::assign::KeySetId { count, digest: 0 };
                this.assignor = match this.assignor {
                    AssignorKind::Balanced(_) => AssignorKind::Balanced(id),
                    _ => AssignorKind::Sticky(id),
                };
                this.declared = None;
                this
            }
        }
    }

    /// Injects a clock (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The highest slot number plus one that this member may claim (default
    /// [`DEFAULT_MAX_SLOTS`]).
    pub fn with_max_slots(mut self, max: u32) -> Self {
        self.max_slots = max;
        self
    }

    /// How long in-flight grants of revoked keys may take to drain (default: the TTL). Set it
    /// above your longest checkpoint: a leave ([`Member::leave`](super::Member::leave),
    /// [`leave_for_restart`](super::Member::leave_for_restart)) waits that long for its grants
    /// to be dropped, renewing its lease meanwhile so the others wait too, and only then deletes
    /// its claim, parks it or hands it to a standby; in a view change the member gives its lease
    /// up after it, so the others proceed without it. A drain cut short (by this timeout, a lost
    /// slot or a store that stopped answering until the lease ran out) is logged at `warn` with
    /// the keys it cut and counted in `headcount_group_drains_cut_total`. It may be shorter or
    /// longer than the TTL; at most [`MAX_LEASE_TTL`].
    pub fn with_drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = Some(timeout);
        self
    }

    /// How long a member that left with
    /// [`Member::leave_for_restart`](super::Member::leave_for_restart) keeps its place in the
    /// view for the same member id to take back (default: the lease TTL; at most
    /// [`MAX_RESTART_WINDOW`]). Its keys have no owner meanwhile, so a window much longer than a
    /// restart only delays the group when the member does not come back: then its slot expires
    /// at the end of the window and the others take its keys, as after a crash.
    pub fn with_restart_window(mut self, window: Duration) -> Self {
        self.restart_window = Some(window);
        self
    }

    /// Joins as a *standby* first, for up to `wait`: the member stays out of the view and waits
    /// for a member that leaves gracefully ([`Member::leave`](super::Member::leave)) to hand it
    /// its slot. The keys of that slot then move once, straight from the leaving member to this
    /// one, in one view change, instead of moving to the others when this member joins and again
    /// when the other leaves. If no member leaves within `wait`, it joins as any member does.
    ///
    /// This is what a replacement with new member ids needs (a Kubernetes Deployment rolled out
    /// with `maxSurge`): each new pod stands by, is ready
    /// ([`Assignment::is_ready`](super::Assignment::is_ready) counts a standby as ready), the
    /// deploy tool stops an old pod, and that pod's keys move to the new one. The price is on a
    /// scale-up: a new member works only after `wait`. Choose `wait` a little longer than the
    /// deploy tool takes to stop an old instance once a new one is ready (a few seconds); at
    /// most [`MAX_STANDBY`].
    pub fn with_standby(mut self, wait: Duration) -> Self {
        self.standby = Some(wait);
        self
    }

    /// How long, after the store answers again, the members of the last view have to take
    /// their own slots back before any of them publishes a view without the others (default:
    /// the lease TTL; `Duration::ZERO` turns it off; at most [`MAX_RESTART_WINDOW`]).
    ///
    /// A store that is down (restarted, failed over, cut off) for longer than a lease lets every
    /// lease run out: each member stops granting at its deadline, as it must. When the store
    /// comes back, the first member to reach it would find the others' slots expired and take
    /// all their keys, then hand them back one by one as the others return. Instead, a member
    /// whose store did not answer for a heartbeat or more claims its own slot again and waits,
    /// up to this grace, for every slot of the view it worked under to be claimed again; then
    /// one view with the same slots is published and no key moves. A member that does not come
    /// back within the grace is left out, as after a crash. The grace delays nothing else: a
    /// crash seen by members whose store kept answering is handled as always.
    pub fn with_outage_grace(mut self, grace: Duration) -> Self {
        self.outage_grace = Some(grace);
        self
    }

    /// Gives this member a *crash grace* (static membership, as Kafka's `group.instance.id`
    /// with its session timeout): if its process dies, its slot and its keys wait this long
    /// beyond the lease for the same member id to come back, instead of moving to the others.
    /// Off by default (`Duration::ZERO`); needs an explicit member id
    /// ([`with_member`](Self::with_member)); at most [`MAX_RESTART_WINDOW`].
    ///
    /// This is what a container restarted in place needs (Kubernetes restarts a crashed or
    /// OOM-killed container under the same pod name within seconds): the process started again
    /// under the same id takes its slot over at [`Group::join`](super::Group::join), waits one
    /// lease TTL so the process it replaces has surely stopped granting (it may be frozen, not
    /// dead), and works on with the same keys: none moves. A process frozen for less than the
    /// grace (SIGSTOP, a long garbage collection) finds its slot still its own and goes on.
    ///
    /// The trade-off: a member that really died leaves its keys without an owner for the grace
    /// plus a lease (instead of a lease), and a view change meanwhile (a join or a leave) waits
    /// for it too, three lease TTLs at most. Choose a grace a little longer than a restart takes. A process that joins
    /// with the id of a live one replaces it: the older one stops granting at once and ends
    /// with [`ErrorKind::Rejected`](crate::ErrorKind::Rejected), so give each instance its own
    /// id. Every member of the group must run a version of headcount that knows the grace.
    pub fn with_crash_grace(mut self, grace: Duration) -> Self {
        self.crash_grace = grace;
        self
    }

    /// The outage grace (see [`GroupConfig::with_outage_grace`]).
    pub fn outage_grace(&self) -> Duration {
        self.outage_grace.unwrap_or(self.ttl)
    }

    /// The restart window (see [`GroupConfig::with_restart_window`]).
    pub fn restart_window(&self) -> Duration {
        self.restart_window.unwrap_or(self.ttl)
    }

    /// Joins even a store that may evict keys before they expire (a Redis with `maxmemory` and
    /// a `maxmemory-policy` other than `noeviction`; see
    /// [`Durability::evicts`](crate::Durability::evicts)). By default [`Group::join`] refuses it
    /// with [`ErrorKind::Rejected`](crate::ErrorKind::Rejected): an evicted slot record is a
    /// lease lost while its holder still works, so another member takes its keys and both
    /// hold them until the holder's next renewal. Allow it only for a store that is never near
    /// its memory limit; it logs a warning at every join.
    ///
    /// [`Group::join`]: super::Group::join
    pub fn with_eviction_allowed(mut self, allowed: bool) -> Self {
        self.eviction_allowed = allowed;
        self
    }

    /// Whether heartbeats ask the store if the view directory (and, for the members that watch
    /// it, the slot table) changed
    /// ([`Store::renew_and_list_if_changed`](crate::Store::renew_and_list_if_changed), the
    /// default) and read them only then, or read the view directory and the whole slot table
    /// at every heartbeat ([`Store::renew_and_list`](crate::Store::renew_and_list), `false`).
    /// The protocol is the same. On Redis a steady group costs the server a constant amount per
    /// heartbeat whatever its size (a quarter of the commands and an eighth of the script time
    /// of `false` at 300 members); on a backend without native change versions the store lists
    /// the small view directory and compares a digest. `false` is kept to measure the two side
    /// by side.
    pub fn with_change_checks(mut self, on: bool) -> Self {
        self.change_checks = on;
        self
    }

    /// Whether a heartbeat that reads both the view and the slot table asks the store for both
    /// versions in one call when it can
    /// ([`Store::renew_and_versions`](crate::Store::renew_and_versions), the default), or makes
    /// one [`Store::renew_and_list_if_changed`](crate::Store::renew_and_list_if_changed) call per
    /// directory (`false`, to measure the two side by side). The protocol is the same.
    pub fn with_one_call_versions(mut self, on: bool) -> Self {
        self.one_call_versions = on;
        self
    }

    /// The longest view written whole at `hc:{group}:view:current` (default 1,024 bytes). A
    /// longer one (hundreds of members, or the `sticky` assignor's owner for every declared key)
    /// is written as a small header there and a snapshot beside it
    /// ([`ViewHeader`](super::ViewHeader)): a member that holds the view before reads only the
    /// header and applies its changes, so a view change costs each member bytes in proportion to
    /// the change, not to the group. `usize::MAX` writes every view whole (the design before,
    /// kept to measure the two side by side); `0` writes every view as a header. Every member of
    /// a group must run a version that reads headers, whatever its setting.
    pub fn with_view_inline_max(mut self, bytes: usize) -> Self {
        self.view_inline_max = bytes;
        self
    }

    /// What reading one change record costs a member, in bytes of a snapshot read (default
    /// 8 KiB). A member that missed a few changes of a long view (more than its header carries)
    /// reads the record of each, one round trip apiece, back to a view it holds, instead of the
    /// view's whole snapshot, but only while the records cost less than the snapshot (and eight
    /// at most). Raise it where a round trip to the store costs more than reading 8 KiB (a
    /// store far away); `0` walks whenever eight records or fewer lead back (the simulation
    /// sets it, so that walks meet every interleaving).
    pub fn with_change_record_cost(mut self, bytes: usize) -> Self {
        self.change_record_cost = bytes;
        self
    }

    /// From how many live members on (default 64) a join that comes while the published view
    /// is still being handed off (not yet settled) is left to the lowest slot, which publishes
    /// one view for every join under way, at most four times a heartbeat. Below that size, and
    /// whenever the view is settled, a joiner publishes its own view at once (a graceful leave
    /// always does).
    ///
    /// Every view costs each member a read and an acknowledgement, so in a large group a burst
    /// of joins (a cold start, a scale-up) then makes a few views instead of one per join:
    /// without it, n members started one after the other cost the store about n² calls. A join
    /// waits for the lowest slot's next view (within a quarter of a heartbeat when the lowest
    /// hears of it by a notification, half a heartbeat when it polls), a heartbeat at most if
    /// the lowest slot is gone. `usize::MAX` publishes every join at once (the design before,
    /// kept to measure the two side by side); `0` leaves them to the lowest slot in every group
    /// (the simulation sets it, so that the rule meets every interleaving).
    pub fn with_coalesce_from(mut self, members: usize) -> Self {
        self.coalesce_from = members;
        self
    }

    /// Whether the member listens to the store's change notifications
    /// ([`Store::subscribe`](crate::Store::subscribe), the default) so that a planned change (a
    /// join, a graceful leave, a published view, an acknowledgement, a settled view) is seen
    /// within a round trip instead of at the next heartbeat, or only polls (`false`, the design
    /// before, kept to measure the two side by side). Notifications only make a member look
    /// earlier: it polls at the same pace either way, and nothing it concludes depends on one
    /// arriving. A crash is still seen when its lease runs out. A store without native
    /// notifications ([`Capabilities::native_notifications`](crate::Capabilities)) polls either
    /// way; see [`notify`](crate::notify) for what a subscription costs each backend.
    pub fn with_notifications(mut self, on: bool) -> Self {
        self.notifications = on;
        self
    }

    /// Replaces the lease TTL.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Checks the configuration as [`Group::join`](super::Group::join) will, without a store:
    /// the group name and prefix, the TTL, the member id, the slot limit, the drain timeout and
    /// the restart window
    /// ([`Error::InvalidArgument`] or [`Error::InvalidConfig`] naming the bad one). A command
    /// line checks it before connecting, so a typo is a usage error even when the store is
    /// down.
    pub fn validate(&self) -> Result<()> {
        self.check().map(|_| ())
    }

    pub(super) fn check(&self) -> Result<Keyspace> {
        let keys = Keyspace::with_prefix(&self.prefix, &self.group)?;
        if self.ttl < MIN_LEASE_TTL || self.ttl > MAX_LEASE_TTL {
            return Err(Error::invalid(format!(
                "lease TTL {:?} is outside {MIN_LEASE_TTL:?}..={MAX_LEASE_TTL:?}",
                self.ttl
            )));
        }
        if self.max_slots == 0 || self.max_slots > crate::assign::MAX_SLOTS {
            return Err(Error::invalid(format!(
                "max slots {} is outside 1..={}",
                self.max_slots,
                crate::assign::MAX_SLOTS
            )));
        }
        if let Some(d) = self.drain_timeout {
            if d.is_zero() || d > MAX_LEASE_TTL {
                return Err(Error::invalid(format!(
                    "drain timeout {d:?} is outside (0, {MAX_LEASE_TTL:?}]"
                )));
            }
        }
        if let Some(w) = self.restart_window {
            if w < MIN_LEASE_TTL || w > MAX_RESTART_WINDOW {
                return Err(Error::invalid(format!(
                    "restart window {w:?} is outside {MIN_LEASE_TTL:?}..={MAX_RESTART_WINDOW:?}: a member away longer than that is gone, and its keys must not wait for it"
                )));
            }
        }
        if let Some(g) = self.outage_grace {
            if g > MAX_RESTART_WINDOW {
                return Err(Error::invalid(format!(
                    "outage grace {g:?} is longer than {MAX_RESTART_WINDOW:?}: the keys of a member that does not come back have no owner for that long"
                )));
            }
        }
        if !self.crash_grace.is_zero() {
            if self.crash_grace > MAX_RESTART_WINDOW {
                return Err(Error::invalid(format!(
                    "crash grace {:?} is longer than {MAX_RESTART_WINDOW:?}: the keys of a member that died have no owner for that long",
                    self.crash_grace
                )));
            }
            if self.member.is_none() {
                return Err(Error::config(
                    "a crash grace needs an explicit member id (GroupConfig::with_member, `--member`, `HEADCOUNT_MEMBER`): only a process started again under the same id can come back to the slot that waits for it",
                ));
            }
        }
        if let Some(w) = self.standby {
            if w.is_zero() || w > MAX_STANDBY {
                return Err(Error::invalid(format!(
                    "standby wait {w:?} is outside (0, {MAX_STANDBY:?}]: a scale-up waits that long before the new member works"
                )));
            }
        }
        if let Some(member) = &self.member {
            crate::recipes::interval::check_member(member)?;
        }
        self.check_declared()?;
        self.check_view_fits()?;
        Ok(keys)
    }

    /// The view of a group of [`GroupConfig::with_max_slots`] members, with this assignor's
    /// owners, fits one store value ([`MAX_VALUE_LEN`]): a group never grows to a size whose view
    /// no member can publish.
    fn check_view_fits(&self) -> Result<()> {
        let owners = match self.assignor {
            AssignorKind::Sticky(id) => Some(id.count as usize),
            _ => None,
        };
        let longest = super::records::longest_view(self.max_slots, self.assignor, owners);
        if longest <= MAX_VALUE_LEN {
            return Ok(());
        }
        let largest = super::records::largest_group(self.assignor, owners);
        Err(Error::config(format!(
            "max slots {}: the view of a group that large is up to {longest} bytes, more than the {MAX_VALUE_LEN} bytes a store value holds; with the `{}` assignor{} the largest group is {largest} members (GroupConfig::with_max_slots)",
            self.max_slots,
            self.assignor,
            owners.map_or(String::new(), |n| format!(" and {n} declared keys")),
        )))
    }

    /// An assignor for a declared set has its keys, and declared keys have such an assignor.
    fn check_declared(&self) -> Result<()> {
        let kind = self.assignor;
        match (kind.declared(), &self.declared) {
            (Some(id), _) if id.count == 0 => Err(Error::config(format!(
                "the {} assignor needs at least one declared key",
                kind.name()
            ))),
            (Some(id), _) if id.count as usize > crate::assign::MAX_DECLARED_KEYS => {
                Err(Error::config(format!(
                    "{} declared keys are more than the limit of {}",
                    id.count,
                    crate::assign::MAX_DECLARED_KEYS
                )))
            }
            (Some(id), Some(keys)) if keys.id() == id => Ok(()),
            (Some(id), _) => match KeySet::partitions(id.count) {
                Ok(p) if p.id() == id => Ok(()),
                _ => Err(Error::config(format!(
                    "the {} assignor `{kind}` needs its keys: declare them with GroupConfig::with_keys",
                    kind.name()
                ))),
            },
            (None, Some(keys)) => Err(Error::config(format!(
                "{} keys are declared but the assignor is `{kind}`, which takes no declared set: declare keys with with_keys alone (the sticky assignor), or follow it with with_assignor(AssignorKind::Balanced(id))",
                keys.len()
            ))),
            (None, None) => Ok(()),
        }
    }
}
