//! The interval indexer: every peer learns its `(index, replicas)` once per interval from one
//! shared counter per interval, exactly as in the "Distributed Peer Indexing" articles, plus the
//! safe index transition they leave out.
//!
//! # The algorithm ("Distributed Peer Indexing", Gurtovoi)
//!
//! With `I` the interval, each peer ticks once per interval, at the interval's start plus its own
//! constant skew `s` (drawn once in `[0, 7I/16)`, or fixed below `I/2` by
//! [`IntervalConfig::with_skew`]):
//!
//! 1. `n = ⌈now / I⌉` on the peer's (injected) clock, an instant exactly on a boundary counting as
//!    the start of the interval it opens (so `n = ⌊now / I⌋ + 1`);
//! 2. in **one round trip** ([`Store::incr_and_get`](crate::Store::incr_and_get)): add the peer's capacity `w` (1 unless
//!    weighted) to the counter of interval `n` and read the **sealed** count of interval `n - 1`
//!    (below; the first peer to tick `n` seals it, in two or three more round trips);
//! 3. the increment's result is the peer's draw for interval `n`: it holds the slots
//!    `result - w + 1 ..= result`;
//! 4. if the peer also drew in interval `n - 1`, the pair for interval `n` is its first slot of
//!    `n - 1` as **index** and the sealed count of `n - 1` as **replicas**: both describe the
//!    same interval, which is over, so every peer that ticked in `n - 1` holds a distinct index
//!    in `1..=replicas`. That is the "Distributed Peer Indexing" article's
//!    "emit (index, replicas) once both are known".
//!
//! # The sealed count
//!
//! The articles read the counter of `n - 1` directly. An increment that lands late (sent in
//! time, then held up by a stalled connection or a paused process) can then land *between* two
//! peers' reads: one pairs with `replicas = c`, another with `c + 1`, under the same epoch, and
//! both take some of the same tasks. Here the first peer that needs the count of `n - 1` copies
//! the counter into `interval:seal:{n-1}` with a create-if-absent compare-and-set and everyone
//! uses the seal. A draw that landed after the seal was taken is above it, so it owns nothing
//! that interval (the `index > replicas` rule) and its peer owes no acknowledgement for it.
//!
//! A peer also takes nothing from a tick whose reply arrives three quarters of an interval or
//! more after the interval's start on its clock: the seal of `n` is taken no earlier than the
//! start of `n + 1` on another peer's clock, so only a reply before that proves the increment is
//! in the seal. Such a draw counts for an acknowledgement only once the seal shows it does.
//!
//! A peer increments the counter of `n` only in the first half of interval `n` on its own clock:
//! its skewed tick always is, but a join or a tick that wakes late (a paused process, a slow
//! store) may not be, and an increment after another peer read the count (at its tick of `n + 1`)
//! would give two peers pairs of the same epoch from different counts. Such a tick skips `n`
//! without drawing (a late tick keeps its pair until it expires and reports it, like a failed
//! one) and the peer draws at its next tick. So the first pair arrives at the second tick that
//! draws: between half an interval and two intervals after the join.
//!
//! Counter keys expire after three intervals. The longer "Distributed Peer Indexing" article's
//! table instead pairs the index drawn in `n` with the count of `n - 1` (so C, in its first
//! interval, "emits (1,2)" and B "emits (3,2)"): that mixes two memberships, contradicts the
//! first article's caveat that the first result takes an interval, and is not what this module
//! does; the conformance suite tests the table as the
//! algorithm above produces it.
//!
//! # Keys
//!
//! Under the group's [`Keyspace`](crate::Keyspace) (`hc:{group}:`):
//!
//! | key | value | TTL |
//! |---|---|---|
//! | `interval:{n}` | the counter of interval `n` (sum of the capacities of the peers that ticked) | 3 intervals |
//! | `interval:seal:{n}` | the count of interval `n` as the pairs of interval `n + 1` use it | 3 intervals |
//! | `interval:transition:{n}` | acknowledgements of the move to interval `n`'s pairs (sum of capacities) | 3 intervals |
//! | `interval:health:{member}` | `tick=… index=… replicas=… capacity=…` of one live peer | 2 intervals |
//!
//! The article keys health by index (`{name}:health:{index}`); indices are re-drawn every
//! interval, so two peers would overwrite each other's record, and the member id is stable.
//!
//! # Task ownership
//!
//! [`Pair::owns`]: task `t` belongs to slot `t mod replicas + 1` (1-based), and a peer owns the
//! slots `index ..= index + capacity - 1`. With capacity 1 this is the article's
//! `t % replicas == index - 1`, written against the pair's own `replicas` (the sketch reads an
//! undefined `totalReplicas`) and its 1-based index (the sketch compares a 1-based index with a
//! 0-based residue only after subtracting one; its `index > replicas` guard is kept): a peer whose
//! index is above `replicas` owns nothing that interval.
//!
//! # Weighted partitioning
//!
//! A peer with capacity `w` adds `w` to the interval's counter instead of 1 (an `INCRBY`), so it
//! draws `w` consecutive slots and `replicas` is the total capacity of the interval: a peer of
//! capacity 2 owns twice the share of one of capacity 1, in the same single round trip.
//!
//! # The safe index transition
//!
//! Every peer that drew in interval `n - 1` owes an acknowledgement for interval `n`: it adds its
//! capacity to `interval:transition:{n}` once it holds no pair that could conflict with interval
//! `n`'s pairs. At its tick of `n`:
//!
//! * if its new pair owns exactly what its active pair owned, it keeps working and acknowledges
//!   at once;
//! * otherwise it stops taking new tasks ([`Ownership::begin`] and [`Ownership::should_process`]
//!   say no), waits for its in-flight tasks ([`TaskGuard`]s) to finish, acknowledges, and takes
//!   tasks under the new pair only once the acknowledgements reach `replicas` (every peer of
//!   interval `n - 1`, which are exactly the peers that may still hold an older pair, has let go).
//!   There is no timeout in the normal case: a peer that does not acknowledge (a task running past
//!   the interval, a pause) stalls the peers whose pairs changed until it does, a crashed one until
//!   the counters no longer count it (up to two intervals). Only a peer whose next tick has not
//!   run one interval after it adopted the pair (its own work held up: a stalled acknowledgement
//!   send, a pause, its wall clock falling behind its monotonic clock) takes the pending pair
//!   without every acknowledgement; that pair expires a quarter interval after the due time of
//!   the tick that should have replaced it.
//!
//! A peer leaving with [`IntervalPeer::leave`] drains and acknowledges the transitions it owes
//! before it goes, so the others need not wait for the counters to stop counting it.
//!
//! An acknowledgement is an increment, so it is sent at most once: the peer forgets it owes it
//! before sending, and a failed send (which may have applied) is not retried. A lost one only
//! makes the peers waiting for it wait for the next interval; a retried one could count a
//! capacity twice and let them activate before a peer still holding an old pair let go.
//!
//! **Guarantee**: at any instant, no two peers hold active pairs that own the same task, provided
//! (a) every peer either acknowledges or is dead (crashed, stopped), (b) the clocks of the peers
//! are within a quarter interval of each other, and (c) no peer is paused (GC, SIGSTOP,
//! VM migration) between [`Ownership::begin`] returning a guard and its task finishing for
//! longer than the rest of the interval. An active pair also expires on the peer's own clock a quarter
//! interval after the tick that should have replaced it, so a peer cut off from the store stops
//! on its own; the others take its tasks once the counters no longer count it.
//!
//! **Limits**: a peer paused longer than that (or whose clock is off by more) can still finish a
//! task the others consider theirs: nothing can tell a paused peer from a dead one. Make
//! the sink reject stale work with the epoch ([`TaskGuard::epoch`]) as a fencing token when that
//! matters. Tasks owned by a crashed peer are not taken by anyone until the counters no longer
//! include it (up to two intervals); a peer that stops taking tasks during a transition leaves
//! them for later, so a queue re-offering untaken tasks loses nothing.

mod config;
mod health;
mod layout;
mod ownership;
mod pair;
mod peer;
mod status;
mod ticker;
mod time;

pub(crate) use config::check_member;
pub use config::{IntervalConfig, MAX_CAPACITY, MAX_INTERVAL, MAX_MEMBER_LEN, MIN_INTERVAL};
pub use health::{live_peers, PeerHealth};
pub use layout::KEY_INTERVALS;
pub use ownership::{Ownership, TaskGuard};
pub use pair::Pair;
pub use peer::{IntervalIndexer, IntervalPeer};
pub use status::{IntervalPhase, IntervalStatus};
pub use time::interval_number;
