//! TTLs through leases, shared between writes instead of granted per write.
//!
//! A key written at instant `t` with TTL `T` must not expire before `t + T` (the contract's
//! lower bound, safe for leases) and should be gone soon after. etcd leases have whole-second
//! TTLs and a server minimum, and the server revokes expired leases in a loop that runs every
//! 500 ms, so a key can outlive its lease by up to half a second.
//!
//! Let `S = max(ceil(T), server minimum)` whole seconds. For each `S` the cache keeps one
//! *shared* lease of TTL `S + 1`, granted in the background; with `sent` and `received` the
//! instants the grant request left and its answer came back, a write at `t` may use it when
//!
//! ```text
//! received + 250 ms <= t < sent + 1 s
//! ```
//!
//! * lower bound: the server granted it after `sent`, so it expires after
//!   `sent + S + 1 > t + S`;
//! * upper bound: it was granted before `received`, so it expires before
//!   `received + S + 1 <= t + S + 0.75 s`; with the revocation loop's lag the key is gone by
//!   `t + S + 1.25 s`.
//!
//! A write that finds no usable shared lease is given a fresh lease of TTL `S` of its own
//! (expiry between `t + S` and `t + S + rtt`), and makes sure a shared lease is on its way. While
//! writes keep coming, a successor is requested 600 ms into each shared lease's window, so under
//! load there is about one grant per TTL bucket per second, whatever the write rate.
//!
//! A key that is *renewed* (a group member's slot, renewed at every heartbeat) gets a lease of
//! its own instead, granted once ([`Owned`]): a renewal is a keep-alive of that lease, which
//! resets its TTL to `S` when the server receives it (after the renewal started, so the key
//! lives at least `T` from then) without writing the key. etcd serves a keep-alive on the leader
//! without a Raft round, so a steady member costs the cluster no write and no log sync. The
//! keep-alive stream of each such lease stays open between renewals ([`Leases::keep_alive`]): a
//! renewal is one request message and one answer on it, not a new RPC.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{LeaseClient, LeaseKeepAliveStream, LeaseKeeper};

use crate::endpoints::Endpoints;
use tokio::time::Instant;

/// From the grant's answer to the first write that may use a shared lease.
const SHARE_AFTER: Duration = Duration::from_millis(250);

/// From the grant's request to the last write that may use a shared lease.
const SHARE_UNTIL: Duration = Duration::from_secs(1);

/// When, into a shared lease's life, its successor is requested.
const RENEW_AT: Duration = Duration::from_millis(600);

#[derive(Debug, Clone, Copy)]
struct Shared {
    id: i64,
    sent: Instant,
    received: Instant,
}

impl Shared {
    fn usable(&self, now: Instant) -> bool {
        now >= self.received + SHARE_AFTER && now < self.sent + SHARE_UNTIL
    }
}

#[derive(Debug, Default)]
struct Bucket {
    /// The newest shared lease (its window may not have opened yet).
    newest: Option<Shared>,
    /// The one before it, still usable while the newest's window has not opened.
    previous: Option<Shared>,
    /// A grant of a shared lease is in flight.
    pending: bool,
}

/// The lease cache of one store.
#[derive(Clone)]
pub(crate) struct Leases {
    client: LeaseClient,
    /// The endpoint the client's calls go to (see [`Endpoints`]).
    endpoints: Arc<Endpoints>,
    min_ttl_secs: i64,
    buckets: Arc<Mutex<HashMap<i64, Bucket>>>,
    streams: Arc<Mutex<Streams>>,
}

/// The open keep-alive streams of owned leases, each with when it was last used and its lease's
/// TTL. A stream unused for longer than its lease's TTL is closed at the next sweep: its lease
/// has expired (its key was abandoned: a member that left letting its lease run out, or one
/// that stopped renewing), so the stream would never serve again.
#[derive(Default)]
struct Streams {
    open: HashMap<i64, (Stream, Instant, Duration)>,
    swept: Option<Instant>,
}

impl Streams {
    /// How often the idle streams are looked for.
    const SWEEP_EVERY: Duration = Duration::from_secs(10);

    /// The stream of lease `id` (of `secs` seconds), opened or not, marked used now.
    fn of(&mut self, id: i64, secs: i64, now: Instant) -> Stream {
        if self
            .swept
            .is_none_or(|t| now.duration_since(t) >= Self::SWEEP_EVERY)
        {
            self.swept = Some(now);
            self.open
                .retain(|_, (_, used, ttl)| now.duration_since(*used) <= *ttl);
        }
        if self.open.len() >= Owned::MAX && !self.open.contains_key(&id) {
            self.open.clear();
        }
        let ttl = Duration::from_secs(u64::try_from(secs).unwrap_or(1).max(1));
        let entry = self
            .open
            .entry(id)
            .or_insert_with(|| (Stream::default(), now, ttl));
        entry.1 = now;
        entry.2 = ttl;
        entry.0.clone()
    }
}

/// The open keep-alive stream of one owned lease, if any: taken out while a keep-alive is on it,
/// so a keep-alive cancelled halfway (a deadline) drops the stream rather than leaving its answer
/// for the next one to read.
/// A lease's keep-alive stream, when open, with the endpoint it was opened on
/// ([`Endpoints::pinned`]).
type Stream = Arc<tokio::sync::Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream, usize)>>>;

impl Leases {
    /// Asks the server for a 1-second lease to learn its minimum TTL (etcd raises shorter ones
    /// to `ceil(1.5 * election timeout)`, 2 s by default), then revokes it.
    pub(crate) async fn measure(
        mut client: LeaseClient,
        _timeout: Duration,
        endpoints: Arc<Endpoints>,
    ) -> Result<Leases, etcd_client::Error> {
        let probe = client.grant(1, None).await?;
        let min_ttl_secs = probe.ttl().max(1);
        // Best effort: it expires by itself anyway.
        let _ = client.revoke(probe.id()).await;
        Ok(Leases {
            client,
            endpoints,
            min_ttl_secs,
            buckets: Arc::default(),
            streams: Arc::default(),
        })
    }

    /// The shortest TTL the server grants.
    pub(crate) fn min_ttl(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.min_ttl_secs).unwrap_or(1))
    }

    /// Whole seconds for `ttl`: rounded up, raised to the server minimum.
    fn bucket(&self, ttl: Duration) -> i64 {
        let secs = i64::try_from(ttl.as_nanos().div_ceil(1_000_000_000)).unwrap_or(i64::MAX);
        secs.max(self.min_ttl_secs)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Bucket>> {
        self.buckets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A lease for a write made now with `ttl`: a usable shared one, else a fresh one.
    pub(crate) async fn lease_for(&self, ttl: Duration) -> Result<i64, etcd_client::Error> {
        let s = self.bucket(ttl);
        let now = Instant::now();
        let (usable, start_grant) = {
            let mut buckets = self.lock();
            let bucket = buckets.entry(s).or_default();
            let usable = [bucket.newest, bucket.previous]
                .into_iter()
                .flatten()
                .find(|l| l.usable(now));
            // Request a successor when there is no shared lease to come: none at all, or the
            // newest is past its renewal point.
            let successor_needed = match bucket.newest {
                None => true,
                Some(l) => now >= l.sent + RENEW_AT,
            };
            let start = successor_needed && !bucket.pending;
            if start {
                bucket.pending = true;
            }
            (usable, start)
        };
        if start_grant {
            self.spawn_shared_grant(s);
        }
        match usable {
            Some(l) => Ok(l.id),
            None => self.grant(s).await,
        }
    }

    /// The whole seconds lease `id` has left, rounded down, as the server counts them; `None`
    /// when the server no longer has it (expired or revoked).
    pub(crate) async fn time_to_live(&self, id: i64) -> Result<Option<i64>, etcd_client::Error> {
        let mut client = self.client.clone();
        let resp = client.time_to_live(id, None).await?;
        Ok((resp.ttl() >= 0).then_some(resp.ttl()))
    }

    /// A fresh lease of `ttl` (rounded up to whole seconds), not shared.
    pub(crate) async fn grant_fresh(&self, ttl: Duration) -> Result<i64, etcd_client::Error> {
        self.grant(self.bucket(ttl)).await
    }

    /// The whole seconds of the lease a key written now with `ttl` gets.
    pub(crate) fn secs(&self, ttl: Duration) -> i64 {
        self.bucket(ttl)
    }

    /// Resets the TTL of lease `id` (granted for `secs` seconds) to the one it was granted with.
    /// Returns whether the server
    /// still had it (false: it expired or was revoked, and its keys are gone).
    ///
    /// The lease's keep-alive stream stays open between calls: a call sends one request on it and
    /// reads its answer. The first call, and a call after the stream broke, opens one (which
    /// sends the first request and reads its answer).
    pub(crate) async fn keep_alive(&self, id: i64, secs: i64) -> Result<bool, etcd_client::Error> {
        let slot = self
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .of(id, secs, Instant::now());
        let mut held = slot.lock().await;
        // A stream opened on an endpoint the store has moved off is dropped: it would wait on
        // the endpoint that stalled.
        let pinned = self.endpoints.pinned();
        if let Some((mut keeper, mut stream, _)) = held.take().filter(|h| h.2 == pinned) {
            let answer = match keeper.keep_alive().await {
                Ok(()) => stream.message().await,
                Err(e) => Err(e),
            };
            match answer {
                Ok(Some(resp)) if resp.ttl() > 0 => {
                    *held = Some((keeper, stream, pinned));
                    return Ok(true);
                }
                Ok(Some(_)) => {
                    drop(held);
                    self.close(id);
                    return Ok(false);
                }
                // The stream broke (a reconnect, a leader change): open another below.
                Ok(None) | Err(_) => {}
            }
        }
        let before = self.endpoints.pinned();
        let opened = crate::connection::retry_unsent(&self.endpoints, || {
            let mut client = self.client.clone();
            // Opening the stream sends the first keep-alive and waits for its answer; the
            // client fails the opening when the answer's TTL says the lease is gone.
            async move { client.keep_alive(id).await }
        })
        .await;
        match opened {
            Ok((keeper, stream)) => {
                // Moved while it opened: which endpoint it is on is not known, so the next call
                // opens another.
                let on = Some(before)
                    .filter(|&b| b == self.endpoints.pinned())
                    .unwrap_or(usize::MAX);
                *held = Some((keeper, stream, on));
                Ok(true)
            }
            Err(etcd_client::Error::LeaseKeepAliveError(e)) if e.contains("not found") => {
                drop(held);
                self.close(id);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Closes the keep-alive stream of lease `id` (its key is gone or no longer on it).
    pub(crate) fn close(&self, id: i64) {
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .open
            .remove(&id);
    }

    /// Forgets the shared leases of `ttl`'s bucket (one turned out to be gone).
    pub(crate) fn forget(&self, ttl: Duration) {
        let s = self.bucket(ttl);
        if let Some(bucket) = self.lock().get_mut(&s) {
            bucket.newest = None;
            bucket.previous = None;
        }
    }

    async fn grant(&self, secs: i64) -> Result<i64, etcd_client::Error> {
        let resp = crate::connection::retry_unsent(&self.endpoints, || {
            let mut client = self.client.clone();
            async move { client.grant(secs, None).await }
        })
        .await?;
        Ok(resp.id())
    }

    fn spawn_shared_grant(&self, s: i64) {
        let me = self.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            if let Some(b) = self.lock().get_mut(&s) {
                b.pending = false;
            }
            return;
        };
        runtime.spawn(async move {
            let sent = Instant::now();
            let granted = crate::connection::retry_unsent(&me.endpoints, || {
                let mut client = me.client.clone();
                async move { client.grant(s + 1, None).await }
            })
            .await;
            let received = Instant::now();
            let mut buckets = me.lock();
            let bucket = buckets.entry(s).or_default();
            bucket.pending = false;
            match granted {
                Ok(resp) => {
                    bucket.previous = bucket.newest.take();
                    bucket.newest = Some(Shared {
                        id: resp.id(),
                        sent,
                        received,
                    });
                }
                Err(e) => tracing::debug!(error = %e, "granting a shared etcd lease failed"),
            }
        });
    }
}

/// The leases of keys this store renews, one per key, granted once (by the first renewal that
/// finds none) and kept alive by every later renewal.
#[derive(Default)]
pub(crate) struct Owned {
    keys: Mutex<HashMap<String, (i64, i64)>>,
}

impl Owned {
    /// The most keys remembered: beyond it, the map is cleared (a renewal then grants again).
    pub(crate) const MAX: usize = 1 << 16;

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (i64, i64)>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lease owned by `key`, if it has one of `secs` seconds.
    pub(crate) fn get(&self, key: &str, secs: i64) -> Option<i64> {
        self.lock()
            .get(key)
            .and_then(|&(id, s)| (s == secs).then_some(id))
    }

    /// Records that `key` is on lease `id` of `secs` seconds; returns the lease it had before.
    pub(crate) fn set(&self, key: &str, id: i64, secs: i64) -> Option<i64> {
        let mut keys = self.lock();
        if keys.len() >= Self::MAX && !keys.contains_key(key) {
            keys.clear();
        }
        keys.insert(key.to_owned(), (id, secs))
            .map(|(old, _)| old)
            .filter(|&old| old != id)
    }

    /// Forgets `key`'s lease (its key is gone or no longer ours); returns it.
    pub(crate) fn forget(&self, key: &str) -> Option<i64> {
        self.lock().remove(key).map(|(id, _)| id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_of_expired_leases_are_closed() {
        let t0 = Instant::now();
        let mut streams = Streams::default();
        streams.of(1, 2, t0);
        streams.of(2, 60, t0);
        // Lease 1 renewed at 9 s, lease 2 not since 0 s: at the sweep (10 s after the first)
        // neither has been idle past its TTL.
        streams.of(1, 2, t0 + Duration::from_secs(9));
        streams.of(3, 2, t0 + Duration::from_secs(10));
        assert_eq!(streams.open.len(), 3);
        // At 21 s lease 1 (last used at 9 s, 2 s TTL) has expired and goes; lease 2 stays.
        streams.of(3, 2, t0 + Duration::from_secs(21));
        let mut left: Vec<i64> = streams.open.keys().copied().collect();
        left.sort_unstable();
        assert_eq!(left, [2, 3]);
    }

    #[test]
    fn share_window() {
        let sent = Instant::now();
        let l = Shared {
            id: 1,
            sent,
            received: sent + Duration::from_millis(10),
        };
        assert!(!l.usable(sent));
        assert!(!l.usable(sent + Duration::from_millis(200)));
        assert!(l.usable(sent + Duration::from_millis(260)));
        assert!(l.usable(sent + Duration::from_millis(999)));
        assert!(!l.usable(sent + Duration::from_secs(1)));
    }
}
