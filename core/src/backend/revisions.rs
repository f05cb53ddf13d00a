//! [`RevisionWatch`]: for a backend whose directory versions are built from a store-wide
//! revision that only grows (etcd's), noticing that the store went back in time, and
//! [`revision_version`], the version text such a backend answers.
//!
//! A directory's version of count and newest revision is a proof of "unchanged" only while
//! revisions never repeat. A store restored from a snapshot without moving its revision on (etcd:
//! `etcdutl snapshot restore` without `--bump-revision`) hands out the lost revisions again, to
//! other writes, and a version can then come back for other contents. Every response of such a
//! store carries its current revision, which a linearizable store never answers below one it
//! answered before a request was sent. A client that sees it lower has seen the store go back:
//! it starts a new *generation*, part of every version it answers from then on, so no version it
//! answered before can be answered again and every caller reads the directories anew.

use std::sync::{Mutex, PoisonError};

/// What a client has seen of its store's revision: the highest one, and how many times a
/// response showed the store gone back (the generation its versions carry). Shared by the
/// callers of one store handle; they all hold versions it answered.
#[derive(Debug, Default)]
pub struct RevisionWatch {
    state: Mutex<Sent>,
}

/// The state of a [`RevisionWatch`] when a request was sent: the highest revision seen and the
/// generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sent {
    floor: i64,
    generation: u64,
}

impl RevisionWatch {
    /// A watch that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Before a request: what its response's revision is compared with.
    pub fn send(&self) -> Sent {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// After the response to the request `sent` was for, whose header carried `revision`:
    /// returns the generation to put in versions answered from it. A revision below the highest
    /// one seen before the request left means the store went back in time (responses to
    /// concurrent requests may arrive in any order, so only what was seen before the request
    /// counts): a new generation starts, once per going back, from that revision.
    pub fn receive(&self, sent: Sent, revision: i64) -> u64 {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if revision < sent.floor && state.generation == sent.generation {
            state.generation += 1;
            state.floor = revision;
        } else {
            state.floor = state.floor.max(revision);
        }
        state.generation
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.send().generation
    }
}

/// A directory's version from its count of keys and their newest revision, on the cluster
/// `cluster`, in the client's `generation` ([`RevisionWatch`]). Revisions only grow within one
/// generation, so a later state with the same count and newest revision holds the same keys at
/// the same revisions: the same keys and values.
pub fn revision_version(cluster: u64, generation: u64, count: i64, newest: i64) -> String {
    format!("{cluster:x}.{generation}.{count}.{newest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revision_below_the_highest_seen_starts_a_generation() {
        let w = RevisionWatch::new();
        assert_eq!(w.receive(w.send(), 10), 0);
        assert_eq!(w.receive(w.send(), 12), 0);
        // Nothing written in between: the same revision again is no going back.
        assert_eq!(w.receive(w.send(), 12), 0);
        // Restored from a snapshot at revision 7.
        assert_eq!(w.receive(w.send(), 7), 1);
        // The new history goes on from there.
        assert_eq!(w.receive(w.send(), 8), 1);
        assert_eq!(w.receive(w.send(), 13), 1);
        assert_eq!(w.receive(w.send(), 9), 2);
    }

    #[test]
    fn responses_out_of_order_are_no_going_back() {
        let w = RevisionWatch::new();
        w.receive(w.send(), 5);
        let first = w.send();
        let second = w.send();
        // The later request's answer comes first, with a newer revision.
        assert_eq!(w.receive(second, 9), 0);
        assert_eq!(w.receive(first, 6), 0);
        assert_eq!(w.generation(), 0);
    }

    #[test]
    fn one_going_back_seen_by_concurrent_requests_is_one_generation() {
        let w = RevisionWatch::new();
        w.receive(w.send(), 20);
        let a = w.send();
        let b = w.send();
        assert_eq!(w.receive(a, 3), 1);
        assert_eq!(w.receive(b, 4), 1);
        assert_eq!(w.receive(w.send(), 5), 1);
    }

    #[test]
    fn versions_differ_by_generation() {
        assert_ne!(revision_version(1, 0, 2, 7), revision_version(1, 1, 2, 7));
        assert_eq!(revision_version(0xab, 3, 2, 7), "ab.3.2.7");
    }
}
