//! Majority IDs: monotonically increasing IDs (fencing tokens) agreed by a majority of `N`
//! independent stores, any mix of backends, failing closed without a majority
//! (antirez, "Generating unique, monotonically increasing IDs with Redis").
//!
//! # The algorithm
//!
//! One counter key per generator name, `hc:{ids}:id:{name}` (under the
//! [`Keyspace`](crate::Keyspace) of the group `ids`; the prefix is configurable), holding the
//! highest ID proposed to that store, with no TTL. To draw an ID, [`MajorityIds::next`]:
//!
//! 1. sends `get` to all `N` stores at once and waits for the first majority `M = N / 2 + 1` of
//!    answers (an absent key reads as 0);
//! 2. proposes `P = max + 1`;
//!    (the first attempt of a call skips the read when the generator already saw a number, and
//!    proposes one above the largest it saw: with no rival since, that wins in one round trip;
//!    when it loses, the next attempt reads. Safety never rests on the read: see below);
//! 3. sends `set_max(key, P)` to all `N` stores at once and returns `P` as soon as `M` of them
//!    answered `true` (they held less than `P` and now hold `P`);
//! 4. otherwise (too few answers, or proposals lost to larger ones) sleeps a random time in
//!    `[0, min(backoff_max, backoff_base * 2^attempt))` and starts again at 1, until the
//!    deadline, when it fails with [`Error::Unavailable`] saying how many stores answered.
//!
//! Holes in the sequence are allowed (a proposal that lost burns its number); repeats and
//! regressions are not.
//!
//! # Why it is safe
//!
//! *Only `set_max == true` counts.* A store answers `true` to `set_max(P)` only when it held less
//! than `P` and now holds `P`, atomically. So of all the clients proposing the same `P`, at most
//! one hears `true` from any one store: after the first write the store holds `P`, and every
//! later `set_max(P)` there sees `P >= P` and answers `false`. The sets of stores that said `true`
//! to two clients for the same `P` are disjoint, and two disjoint sets cannot both be majorities:
//! **no two calls ever return the same ID**. (A store that already held exactly `P`, written by a
//! rival, answers `false`; counting it would let both rivals return `P`.)
//!
//! *Every ID is greater than every ID returned before its request started.* When a call returned
//! `Q`, a majority held `Q` or more, and stored numbers never decrease (`set_max` never moves
//! backwards, the key has no TTL, and the stores are durable). A call that starts later returns
//! `P` only if a majority answered `true`, that is held less than `P` just before; that majority
//! shares at least one store with the first, which held `Q` or more and less than `P`: `P > Q`.
//!
//! Neither argument uses what the read returned: the read only makes a winning proposal likely.
//! That is why the first attempt may propose from the generator's own hint instead.
//!
//! # Blocks, and group commit
//!
//! [`MajorityIds::next_block`] takes `k` consecutive IDs in one round, and [`MediatedIds`] uses
//! it to serve every caller waiting when a round starts (group commit). `set_max` cannot grant a
//! block: a store that answers `true` to `set_max(P + k - 1)` held less than `P + k - 1`, not
//! less than `P`, so a rival's block or ID inside the range may already be out (the simulation
//! finds such a repeat at its first seed when blocks are built that way). A block round is a
//! compare-and-set instead: for each store it counts, the text the store holds (as this
//! generator last read or wrote it, or read now when that fails), and `base` the largest of
//! those values; it sets each store from its own text to `base + k`, and the block
//! `base + 1 ..= base + k` is the call's once a majority answered `true`.
//!
//! *No overlap.* Each store that answered `true` held at most `base` and now holds `base + k`.
//! Of two blocks (or a block and a single ID) granted by two majorities, a store in both took
//! both writes, one after the other: the second saw the first's value, which is then at most
//! the second's base (a compare-and-set) or below its proposal (`set_max`), so the two ranges
//! are disjoint.
//!
//! *Every ID of a block is greater than every ID returned before the call started*: that ID's
//! majority holds it or more, and shares a store with the block's majority, which held at most
//! `base` before the block's write: the earlier ID is at most `base`, below the whole block.
//!
//! *Group commit is linearizable*: the `k` calls served by one round were all waiting when it
//! started and are all answered after it ended, so they overlap one another and any order among
//! them is allowed, and each of their IDs is greater than every ID returned before the round
//! started, which includes every call that completed before any of them started.
//!
//! Both arguments need the stores to keep what they acknowledged: a store that forgets (restarted
//! without persistence) can let a later majority read a smaller number, and hand out an ID again.
//! Hence the durability check below.
//!
//! # Majority
//!
//! `M = N / 2 + 1` for every `N`: 1 of 1, 2 of 2, 2 of 3, 3 of 4, 3 of 5, 4 of 6. With an even
//! `N` a majority is more than half, so `N = 4` tolerates one unreachable store, like `N = 3`,
//! and `N = 2` tolerates none; odd `N` are the sensible choices.
//!
//! # Durability
//!
//! [`MajorityIds::new`] asks every store [`Store::durability`](crate::Store::durability) (Redis `appendonly yes` with
//! `appendfsync always`, PostgreSQL `fsync` and `synchronous_commit`, SQLite `synchronous=FULL`,
//! etcd always) and, under [`DurabilityPolicy::Require`] (the default), refuses the set with
//! [`Error::InvalidConfig`] when one answers "not durable". A store that cannot be reached at
//! construction is probed again before its first use, and excluded until it answers durable.
//! [`DurabilityPolicy::AllowNonDurable`] uses such stores anyway and logs a warning for each:
//! a crash of one of them can then repeat an ID.
//!
//! # Bad input and faults
//!
//! * An empty store list is [`Error::InvalidArgument`]; so is one store handle passed twice
//!   (the same `Arc`). Two different handles to the same server cannot be told apart here: the
//!   `headcount ids next` command rejects duplicate URLs, a library caller should not pass
//!   them. They cannot break uniqueness (a server answers `true` at most once for a value,
//!   whichever handle asks), but the fault tolerance is not what N suggests: the server behind
//!   two of three handles is a single point of failure.
//! * A store that fails (unreachable, timed out) counts as not answering for that attempt.
//! * A store that holds something other than a decimal integer at the key answers
//!   [`Error::ForeignValue`]: it is logged and counted as not answering, so the other stores keep
//!   serving; when so many stores fail permanently (foreign values, refusals) that no majority
//!   remains, the call fails at once with that error instead of waiting for the deadline.
//! * A counter at `i64::MAX` cannot grow: [`Error::Rejected`].
//!
//! # A store far ahead
//!
//! A store restored from the wrong backup, or edited by hand, can hold a number far above the
//! others (`9223372036854775800`). Proposing one above it would hand out that number, every store
//! of the majority would take it, and the generator would be spent for good, repaired store or
//! not. So when the answers of a read spread over more than [`MAX_JUMP`] (2^40), the read goes on
//! until it can bound what a majority holds: the `M`-th largest of the `N` numbers, taking the
//! stores not heard from as holding more. No ID above that bound was ever returned (it would be
//! held by a majority, and two majorities share a store), so every store more than `MAX_JUMP`
//! above it is left out of the proposal (a warning names each), as long as a majority of answers
//! remains; when every store answered and none is that far above the bound, the spread is a store
//! far *behind*, and the numbers are used as always. When it cannot tell (too few stores answer),
//! the attempt fails and the call fails closed at its deadline. Leaving stores out costs no
//! safety: safety never rests on the read. A store left out is never remembered as holding its
//! number, so a later block round that skips its read cannot propose from it either. A
//! legitimate spread that large would take 2^20 lost proposals stacked on one minority of
//! stores, or a store that lagged while more than 2^40 IDs were handed out.
//!
//! A store left out refuses every proposal until it is repaired, so the set tolerates one failure
//! fewer meanwhile. To repair it, stop the generators, read the counter on **every** other store
//! (all of them must answer), and set the damaged store's counter to the largest of those values
//! (for Redis, `SET hc:{ids}:id:NAME <value>`; for SQL, an `UPDATE` of that key's row). Never
//! delete it, and never set it from some of the others only: an ID may have been granted by a
//! majority that includes the damaged store and a store that is down now, and a value below it
//! would let that ID be handed out again.

mod answers;
mod config;
#[cfg(feature = "grpc")]
mod connections;
mod majority;
mod mediated;
mod round;
#[cfg(feature = "grpc")]
pub mod service;

use crate::error::{Error, Result};

pub use config::{
    DurabilityPolicy, IdsConfig, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_MAX, DEFAULT_DEADLINE,
};
pub use majority::{IdsStats, MajorityIds};
pub use mediated::MediatedIds;
#[cfg(feature = "grpc")]
pub use service::{
    serve, serve_with, IdsClient, IdsServer, IdsService, RunningIdsServer, ServeOptions,
    DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
};

/// The name errors of this recipe give as their `backend`.
const RECIPE: &str = "majority ids";

/// The group under which every generator's key lives: `hc:{ids}:id:{name}`.
pub const IDS_GROUP: &str = "ids";

/// The most IDs one [`MajorityIds::next_block`] call takes.
pub const MAX_BLOCK: u64 = 1 << 20;

/// How far above a majority of the other stores one store's counter may stand before a read
/// takes it for damage (a bad restore) and leaves it out of proposals: 2^40, a million times
/// [`MAX_BLOCK`]. See "A store far ahead" in the module docs.
pub const MAX_JUMP: i64 = 1 << 40;

/// `count` as a block size, if it is one.
fn check_block(count: u64) -> Result<i64> {
    if count == 0 || count > MAX_BLOCK {
        return Err(Error::invalid(format!(
            "an ID block of {count}: take 1 to {MAX_BLOCK} IDs at once"
        )));
    }
    Ok(i64::try_from(count).unwrap_or(1))
}
