//! Fencing: a sink that remembers the newest token it has seen per resource and rejects writes
//! carrying an older one, so a member that lost its grant without knowing it (paused past its
//! lease, cut off from the store) cannot overwrite the work of the member that took over.
//!
//! Every [`Grant`](crate::recipes::group::Grant) carries a [`FencingToken`] ([`Grant::token`]):
//! for a key, the first epoch of the member's unbroken ownership of it (it stays the same across
//! view changes that leave the key where it is, and a key that moved gets a newer token than
//! every earlier owner's); for the member's whole share, the epoch of the view it was taken
//! under. A token equal to the newest is admitted (the same owner writes several times); an
//! older one is refused.
//!
//! [`Grant::token`]: crate::recipes::group::Grant::token
//!
//! Three fences keep that rule, each where the sink's data lives, and all implement [`Fence`]:
//! [`MemoryFence`] in this process, `PgFence` in a PostgreSQL table (`headcount::postgres`, a
//! check in the same statement as the write) and `RedisFence` in Redis keys
//! (`headcount::redis`, a set-if-greater script). Code written over [`Fence`] runs on any of
//! them, and its unit tests on the in-memory one.
//!
//! A sink whose new owner reads what is left to do before writing should **advance** the fence
//! first ([`MemoryFence::admit`] with its token, writing nothing): from then on the old owner's
//! writes are refused, and every write of the old owner that was admitted before is visible to
//! the read.
//!
//! ```
//! use headcount_core::fence::{FencingToken, MemoryFence};
//! let fence = MemoryFence::new();
//! let (old, new) = (FencingToken::new(7), FencingToken::new(8));
//! assert!(fence.admit("orders/42", old));  // the owner since epoch 7 writes
//! assert!(fence.admit("orders/42", new));  // the key moved: the new owner's token is 8
//! assert!(!fence.admit("orders/42", old)); // the old owner wakes up: refused
//! assert_eq!(fence.current("orders/42"), Some(new));
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// A fencing token: the number a grant carries and a fence compares. Newer owners carry greater
/// tokens; tokens of one resource are compared, never added. Its text and JSON form is the bare
/// number (`42`), as the fences store it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct FencingToken(u64);

impl FencingToken {
    /// The token `n` (a view epoch, or a token read back from a sink).
    pub const fn new(n: u64) -> Self {
        FencingToken(n)
    }

    /// The number, for a sink that stores it.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for FencingToken {
    fn from(n: u64) -> Self {
        FencingToken(n)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A fence: per resource, the newest [`FencingToken`] admitted; a token at least that is
/// admitted (and recorded), an older one refused. `C` is the connection the fence's calls go
/// through: the caller's PostgreSQL client for `PgFence`, its Redis connection for
/// `RedisFence`, nothing (`()`) for [`MemoryFence`].
///
/// ```
/// use headcount_core::fence::{Fence, FencingToken, MemoryFence};
///
/// /// A sink written once over any fence: writes `line` when `token` is still the newest.
/// async fn append<F: Fence<C>, C: Send>(
///     fence: &F,
///     conn: &mut C,
///     resource: &str,
///     token: FencingToken,
/// ) -> headcount_core::Result<bool> {
///     fence.admit(conn, resource, token).await
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> headcount_core::Result<()> {
/// let fence = MemoryFence::new();
/// assert!(append(&fence, &mut (), "r", FencingToken::new(2)).await?);
/// assert!(!append(&fence, &mut (), "r", FencingToken::new(1)).await?);
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait Fence<C: ?Sized + Send = ()>: Send + Sync {
    /// Admits `token` for `resource` when it is at least the newest admitted (and records it);
    /// returns whether it did. A refusal is counted in
    /// [`FENCE_REJECTIONS`](crate::metrics::FENCE_REJECTIONS).
    async fn admit(&self, conn: &mut C, resource: &str, token: FencingToken) -> Result<bool>;

    /// The newest token admitted for `resource`, or `None` when none was.
    async fn current(&self, conn: &mut C, resource: &str) -> Result<Option<FencingToken>>;
}

/// An in-process fence: the newest token seen per resource.
#[derive(Debug, Default)]
pub struct MemoryFence {
    newest: Mutex<HashMap<String, FencingToken>>,
}

impl MemoryFence {
    /// An empty fence.
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits `token` for `resource` when it is at least the newest seen (and records it);
    /// returns false, recording nothing, when it is older (and counts the refusal in
    /// [`FENCE_REJECTIONS`](crate::metrics::FENCE_REJECTIONS), `fence="memory"`).
    pub fn admit(&self, resource: &str, token: FencingToken) -> bool {
        self.admit_with(resource, token, || ()).is_some()
    }

    /// Runs `write` only when `token` is admitted for `resource`, holding the fence's lock, so no
    /// older token can slip in between the check and the write. Returns the write's result when
    /// it ran. The token is recorded when admitted, whatever the write returns: a write that
    /// failed still fences off older tokens.
    pub fn admit_with<T>(
        &self,
        resource: &str,
        token: FencingToken,
        write: impl FnOnce() -> T,
    ) -> Option<T> {
        let mut map = self.newest.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get_mut(resource) {
            Some(newest) if *newest > token => {
                crate::metrics::record_fence_rejection("memory");
                None
            }
            Some(newest) => {
                *newest = token;
                Some(write())
            }
            None => {
                map.insert(resource.to_owned(), token);
                Some(write())
            }
        }
    }

    /// The newest token admitted for `resource`, or `None` when none was (as
    /// `PgFence::current` answers from PostgreSQL).
    pub fn current(&self, resource: &str) -> Option<FencingToken> {
        self.newest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(resource)
            .copied()
    }
}

#[async_trait]
impl Fence for MemoryFence {
    async fn admit(&self, _: &mut (), resource: &str, token: FencingToken) -> Result<bool> {
        Ok(MemoryFence::admit(self, resource, token))
    }

    async fn current(&self, _: &mut (), resource: &str) -> Result<Option<FencingToken>> {
        Ok(MemoryFence::current(self, resource))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::{Fence, FencingToken, MemoryFence};

    const fn t(n: u64) -> FencingToken {
        FencingToken::new(n)
    }

    #[test]
    fn older_tokens_are_refused_and_write_nothing() {
        let fence = MemoryFence::new();
        let mut log = Vec::new();
        assert_eq!(fence.admit_with("r", t(3), || log.push(3)), Some(()));
        assert_eq!(fence.admit_with("r", t(3), || log.push(33)), Some(()));
        assert_eq!(fence.admit_with("r", t(2), || log.push(2)), None);
        assert_eq!(fence.admit_with("s", t(1), || log.push(1)), Some(()));
        assert_eq!(log, [3, 33, 1]);
        assert_eq!(fence.current("r"), Some(t(3)));
        assert_eq!(fence.current("t"), None);
    }

    #[tokio::test]
    async fn the_trait_keeps_the_same_rule() {
        let fence = MemoryFence::new();
        let dyn_fence: &dyn Fence = &fence;
        assert!(dyn_fence.admit(&mut (), "r", t(5)).await.unwrap());
        assert!(!dyn_fence.admit(&mut (), "r", t(4)).await.unwrap());
        assert!(dyn_fence.admit(&mut (), "r", t(5)).await.unwrap());
        assert_eq!(dyn_fence.current(&mut (), "r").await.unwrap(), Some(t(5)));
        assert_eq!(dyn_fence.current(&mut (), "s").await.unwrap(), None);
    }

    #[test]
    fn tokens_order_print_and_convert_as_their_numbers() {
        assert!(t(2) > t(1));
        assert_eq!(t(42).to_string(), "42");
        assert_eq!(u64::from(t(9)), 9);
        assert_eq!(FencingToken::from(9), t(9));
        assert_eq!(serde_json::to_string(&t(7)).unwrap(), "7");
        assert_eq!(serde_json::from_str::<FencingToken>("7").unwrap(), t(7));
    }
}
