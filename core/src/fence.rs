//! Fencing: a sink that remembers the newest token it has seen per resource and rejects writes
//! carrying an older one, so a member that lost its grant without knowing it (paused past its
//! lease, cut off from the store) cannot overwrite the work of the member that took over.
//!
//! Every [`Grant`](crate::recipes::group::Grant) carries a token ([`Grant::token`]): for a key,
//! the first epoch of the member's unbroken ownership of it (it stays the same across view
//! changes that leave the key where it is, and a key that moved gets a newer token than every
//! earlier owner's); for the member's whole share, the epoch of the view it was taken under. A
//! token equal to the newest is admitted (the same owner writes several times); an older one is
//! refused.
//!
//! [`Grant::token`]: crate::recipes::group::Grant::token
//!
//! The same rule for shared sinks lives next to the backends: `headcount_sql`'s PostgreSQL fence
//! (a check in the same statement as the write) and `headcount_redis`'s set-if-greater script.
//!
//! A sink whose new owner reads what is left to do before writing should **advance** the fence
//! first ([`Fence::admit`] with its token, writing nothing): from then on the old owner's writes
//! are refused, and every write of the old owner that was admitted before is visible to the
//! read.
//!
//! ```
//! use headcount_core::fence::Fence;
//! let fence = Fence::new();
//! assert!(fence.admit("orders/42", 7));  // the owner since epoch 7 writes
//! assert!(fence.admit("orders/42", 8));  // the key moved: the new owner's token is 8
//! assert!(!fence.admit("orders/42", 7)); // the old owner wakes up: refused
//! assert_eq!(fence.current("orders/42"), Some(8));
//! ```

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// An in-process fence: the newest token seen per resource.
#[derive(Debug, Default)]
pub struct Fence {
    newest: Mutex<HashMap<String, u64>>,
}

impl Fence {
    /// An empty fence.
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits `token` for `resource` when it is at least the newest seen (and records it);
    /// returns false, recording nothing, when it is older (and counts the refusal in
    /// [`FENCE_REJECTIONS`](crate::metrics::FENCE_REJECTIONS), `fence="memory"`).
    pub fn admit(&self, resource: &str, token: u64) -> bool {
        self.admit_with(resource, token, || ()).is_some()
    }

    /// Runs `write` only when `token` is admitted for `resource`, holding the fence's lock, so no
    /// older token can slip in between the check and the write. Returns the write's result when
    /// it ran. The token is recorded when admitted, whatever the write returns: a write that
    /// failed still fences off older tokens.
    pub fn admit_with<T>(
        &self,
        resource: &str,
        token: u64,
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

    /// The highest token admitted for `resource`, or `None` when none was (as
    /// `PgFence::current` answers from PostgreSQL).
    pub fn current(&self, resource: &str) -> Option<u64> {
        self.newest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(resource)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::Fence;

    #[test]
    fn older_tokens_are_refused_and_write_nothing() {
        let fence = Fence::new();
        let mut log = Vec::new();
        assert_eq!(fence.admit_with("r", 3, || log.push(3)), Some(()));
        assert_eq!(fence.admit_with("r", 3, || log.push(33)), Some(()));
        assert_eq!(fence.admit_with("r", 2, || log.push(2)), None);
        assert_eq!(fence.admit_with("s", 1, || log.push(1)), Some(()));
        assert_eq!(log, [3, 33, 1]);
        assert_eq!(fence.current("r"), Some(3));
        assert_eq!(fence.current("t"), None);
    }
}
