//! Change notifications: [`Store::subscribe`] hands out [`Notifications`], hints that something
//! directly under a directory changed, so a caller that polls a directory (a group member's
//! heartbeat) can look again at once instead of at its next poll.
//!
//! # Hints, never facts
//!
//! A notification is a hint to re-read, nothing more. Notifications may be **lost** (Redis
//! pub/sub and PostgreSQL `NOTIFY` are fire-and-forget; a subscriber that was disconnected
//! misses what happened meanwhile), **delayed**, **duplicated**, **coalesced** (several changes
//! before the subscriber looks are one notification), **reordered** across directories, and
//! **spurious** (a renewal, a write deeper under the directory or a reconnect may send one).
//! No correctness may depend on one: a caller keeps polling at its usual pace, and a
//! notification only makes its next look earlier. What a notification says is never read as
//! data: the caller reads the store.
//!
//! Expiries are not notified in general (a lease that runs out is seen by the next poll that
//! looks; the Redis backend notifies one when a write or a heartbeat's sweep finds it, etcd
//! when the lease is revoked).
//!
//! A subscription to a server becomes active a round trip or so after [`Store::subscribe`]
//! returns (it is opened in the background); a change before that is not notified. Once it is
//! active, its subscribers get a [`Notice::MayHaveMissed`], so a caller that re-reads on every
//! notice has seen everything from then on (up to the faults above).
//!
//! # Backends
//!
//! | backend | how | scope |
//! |---|---|---|
//! | Redis, Redis Cluster | the scripts that set a directory's version `PUBLISH` on its channel; one pub/sub connection per handle | every process; not behind Sentinel nor over an application's `ConnectionManager` (silent there) |
//! | PostgreSQL | row triggers `pg_notify` the directory; one connection per handle holds `LISTEN` | every process; silent over an application's pool, behind a pooler, or when the role cannot create the triggers |
//! | etcd | one watch stream per handle, one prefix watch per directory | every process |
//! | SQLite | a committed write wakes the subscribers of every handle on the same file | **this process only** |
//! | in-memory | a write wakes the subscribers of the store and its clones | this process (the data lives there) |
//!
//! What a write costs the server: Redis, one `PUBLISH` inside the script per directory a write
//! changes (none for a renewal that changes nothing); PostgreSQL, one trigger call and one
//! `pg_notify` per row a write changes (a renewal's `UPDATE` runs no trigger function: the
//! trigger's `WHEN` clause says no); etcd, none beyond delivering the event to the watch;
//! SQLite and in-memory, none (a post in this process).
//!
//! # Cost
//!
//! One subscription connection (or stream) per store handle, whatever the number of
//! directories subscribed and of [`Notifications`] handed out: every `subscribe` on one store
//! shares it, and it is opened on the first `subscribe`, not before. Clone the store handle
//! (`Arc<dyn Store>`) rather than connecting again, so a process holds one.
//!
//! # Faults
//!
//! When the subscription's connection is lost, the store reconnects with a backoff,
//! subscribes again, and sends [`Notice::MayHaveMissed`] to every subscriber (changes made
//! while it was away were not notified). When the server refuses to notify (Redis pub/sub
//! refused by an ACL, a PostgreSQL role that may not `LISTEN`), the store says once why (a
//! `tracing` warning and the `headcount_notifications_unavailable_total` counter) and its
//! notifications stop firing: callers keep polling. Nothing spins: retries back off up to
//! [`RETRY_MAX`].
//!
//! A store without native notifications ([`Capabilities::native_notifications`] false) hands
//! out [`Notifications::never`]: it never fires and never fails.
//!
//! ```
//! use headcount_core::notify::Notice;
//! use headcount_core::{MemoryStore, Store};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> headcount_core::Result<()> {
//! let store = MemoryStore::new();
//! let mut hints = store.subscribe("hc:{g}:slot:").await?;
//! store.compare_and_set("hc:{g}:slot:0", None, "m1", None).await?;
//! // Re-read the directory now: the notification says only that it may have changed.
//! assert_eq!(hints.recv().await, Notice::Changed);
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::{watch, Notify};

#[cfg(doc)]
use crate::store::{Capabilities, Store};

/// The longest wait between two attempts to (re)open a subscription.
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// The first wait before reopening a lost subscription; doubled at each failure up to
/// [`RETRY_MAX`].
pub const RETRY_MIN: Duration = Duration::from_millis(50);

/// What a [`Notifications`] says: re-read the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Notice {
    /// Something directly under the directory changed (or may have: see the [module
    /// docs](self)).
    Changed,
    /// Notifications may have been lost (the subscription reconnected, or it cannot be
    /// delivered any more): anything may have changed.
    MayHaveMissed,
}

/// A subscriber's mailbox: at most one pending notice (later ones coalesce into it, a
/// [`Notice::MayHaveMissed`] wins over a [`Notice::Changed`]), so a storm of changes costs a
/// slow subscriber no memory.
#[derive(Debug, Default)]
struct Mailbox {
    pending: Mutex<Option<Notice>>,
    wake: Notify,
}

impl Mailbox {
    fn post(&self, notice: Notice) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        *pending = match (*pending, notice) {
            (Some(Notice::MayHaveMissed), _) => Some(Notice::MayHaveMissed),
            (_, n) => Some(n),
        };
        drop(pending);
        self.wake.notify_one();
    }

    fn take(&self) -> Option<Notice> {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Hints that something directly under one directory changed: the answer of
/// [`Store::subscribe`]. See the [module docs](self) for what a hint promises (little) and
/// costs. Dropping it unsubscribes.
#[derive(Debug)]
pub struct Notifications {
    dir: String,
    mailbox: Option<Arc<Mailbox>>,
    hub: Option<Arc<HubShared>>,
}

impl Notifications {
    /// Notifications that never fire: a store without native notifications hands these out,
    /// and its callers keep polling.
    pub fn never(dir: &str) -> Self {
        Notifications {
            dir: dir.to_owned(),
            mailbox: None,
            hub: None,
        }
    }

    /// The directory subscribed to.
    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// Whether these may ever fire (false for [`Notifications::never`]).
    pub fn is_native(&self) -> bool {
        self.mailbox.is_some()
    }

    /// Waits for the next notice. Never returns for notifications that never fire: use it in a
    /// `select!` beside the caller's poll timer. Cancel-safe.
    pub async fn recv(&mut self) -> Notice {
        let Some(mailbox) = &self.mailbox else {
            return std::future::pending().await;
        };
        loop {
            let woken = mailbox.wake.notified();
            if let Some(notice) = mailbox.take() {
                return notice;
            }
            woken.await;
        }
    }

    /// The pending notice, if any, without waiting.
    pub fn try_recv(&mut self) -> Option<Notice> {
        self.mailbox.as_ref().and_then(|m| m.take())
    }
}

impl Drop for Notifications {
    fn drop(&mut self) {
        if let (Some(hub), Some(mailbox)) = (&self.hub, &self.mailbox) {
            hub.remove(&self.dir, mailbox);
        }
    }
}

/// The subscribers of one store handle, by directory; shared with every [`Notifications`]
/// (to unsubscribe when dropped) and with the backend's listener task (weakly).
#[derive(Debug)]
struct HubShared {
    subscribers: Mutex<BTreeMap<String, Vec<Weak<Mailbox>>>>,
    /// Bumped whenever the set of directories changes, so a listener subscribes or
    /// unsubscribes on the server.
    directories: watch::Sender<u64>,
}

impl HubShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<Weak<Mailbox>>>> {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn remove(&self, dir: &str, mailbox: &Arc<Mailbox>) {
        let mut subs = self.lock();
        let emptied = subs.get_mut(dir).is_some_and(|list| {
            list.retain(|w| w.upgrade().is_some_and(|m| !Arc::ptr_eq(&m, mailbox)));
            list.is_empty()
        });
        if emptied {
            subs.remove(dir);
            drop(subs);
            self.directories.send_modify(|g| *g += 1);
        }
    }
}

/// For implementors of a store: the subscribers of one store handle, by directory, and the
/// delivery of notices to them. A backend keeps one (clones share it), hands out
/// [`NotifyHub::subscribe`]'s answers from [`Store::subscribe`], and calls
/// [`NotifyHub::notify`] when it learns that a directory changed (from its server, or, for an
/// in-process store, from its own writes). A backend with a server connection runs one
/// listener task per hub, which reads [`NotifyHub::directories`] and waits on
/// [`HubListener::directories_changed`] to follow what is subscribed.
#[derive(Debug, Clone)]
pub struct NotifyHub {
    shared: Arc<HubShared>,
    /// The backend's listener task, if it started one ([`NotifyHub::subscribe_listened`]).
    listener: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl Default for NotifyHub {
    fn default() -> Self {
        Self::new()
    }
}

impl NotifyHub {
    /// A hub with no subscriber.
    pub fn new() -> Self {
        NotifyHub {
            shared: Arc::new(HubShared {
                subscribers: Mutex::new(BTreeMap::new()),
                directories: watch::Sender::new(0),
            }),
            listener: Arc::default(),
        }
    }

    /// [`NotifyHub::subscribe`], and starts the backend's listener task with `start` (given
    /// the hub's [`listener`](NotifyHub::listener)) unless one is running: one per hub, so one
    /// subscription connection per store handle. A task that ended (its runtime shut down) is
    /// started again.
    pub fn subscribe_listened<F, Fut>(&self, dir: &str, start: F) -> Notifications
    where
        F: FnOnce(HubListener) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let notifications = self.subscribe(dir);
        let mut task = self.listener.lock().unwrap_or_else(PoisonError::into_inner);
        if task.as_ref().is_none_or(|t| t.is_finished()) {
            *task = Some(tokio::spawn(start(self.listener())));
        }
        notifications
    }

    /// A new subscriber of `dir` (already checked by [`Store::subscribe`]).
    pub fn subscribe(&self, dir: &str) -> Notifications {
        let mailbox = Arc::new(Mailbox::default());
        let fresh = {
            let mut subs = self.shared.lock();
            let list = subs.entry(dir.to_owned()).or_default();
            list.retain(|w| w.strong_count() > 0);
            list.push(Arc::downgrade(&mailbox));
            list.len() == 1
        };
        if fresh {
            self.shared.directories.send_modify(|g| *g += 1);
        }
        Notifications {
            dir: dir.to_owned(),
            mailbox: Some(mailbox),
            hub: Some(self.shared.clone()),
        }
    }

    /// Tells every subscriber of `dir` that it changed. Cheap when nobody subscribed.
    pub fn notify(&self, dir: &str) {
        post(&self.shared, Some(dir), Notice::Changed);
    }

    /// Tells every subscriber of the directory of `key` (its text up to its last `:`) that it
    /// changed.
    pub fn notify_key(&self, key: &str) {
        if let Some(i) = key.rfind(':') {
            self.notify(&key[..=i]);
        }
    }

    /// Tells every subscriber that notifications may have been lost.
    pub fn notify_missed(&self) {
        post(&self.shared, None, Notice::MayHaveMissed);
    }

    /// The directories that have a subscriber, sorted.
    pub fn directories(&self) -> Vec<String> {
        directories(&self.shared)
    }

    /// A handle for the backend's listener task that does not keep the hub alive: once the
    /// store and every [`Notifications`] are dropped, [`HubListener::directories_changed`]
    /// answers false and the task ends.
    pub fn listener(&self) -> HubListener {
        HubListener {
            shared: Arc::downgrade(&self.shared),
            changes: self.shared.directories.subscribe(),
        }
    }
}

fn directories(shared: &HubShared) -> Vec<String> {
    let subs = shared.lock();
    let mut dirs: Vec<String> = subs
        .iter()
        .filter(|(_, list)| list.iter().any(|w| w.strong_count() > 0))
        .map(|(d, _)| d.clone())
        .collect();
    dirs.sort();
    dirs
}

fn post(shared: &HubShared, dir: Option<&str>, notice: Notice) {
    let targets: Vec<Arc<Mailbox>> = {
        let subs = shared.lock();
        match dir {
            Some(dir) => subs
                .get(dir)
                .map(|l| l.iter().filter_map(Weak::upgrade).collect())
                .unwrap_or_default(),
            None => subs
                .values()
                .flat_map(|l| l.iter().filter_map(Weak::upgrade))
                .collect(),
        }
    };
    for mailbox in targets {
        mailbox.post(notice);
    }
}

/// The listener task's view of a [`NotifyHub`] (see [`NotifyHub::listener`]).
#[derive(Debug, Clone)]
pub struct HubListener {
    shared: Weak<HubShared>,
    changes: watch::Receiver<u64>,
}

impl HubListener {
    /// Waits until the set of subscribed directories changes. False when the hub is gone (the
    /// store and all its notifications were dropped): the listener should end.
    pub async fn directories_changed(&mut self) -> bool {
        self.changes.changed().await.is_ok()
    }

    /// The directories that have a subscriber, sorted (empty when the hub is gone); marks the
    /// current set as seen.
    pub fn directories(&mut self) -> Vec<String> {
        self.changes.borrow_and_update();
        self.shared
            .upgrade()
            .map(|s| directories(&s))
            .unwrap_or_default()
    }

    /// Whether the hub is gone.
    pub fn is_closed(&self) -> bool {
        self.shared.strong_count() == 0
    }

    /// See [`NotifyHub::notify`].
    pub fn notify(&self, dir: &str) {
        if let Some(s) = self.shared.upgrade() {
            post(&s, Some(dir), Notice::Changed);
        }
    }

    /// Tells the subscribers of `dir` that notifications may have been lost: what a listener
    /// sends once the server confirmed a new directory's subscription (a change made between
    /// [`Store::subscribe`] and then was not notified).
    pub fn notify_missed_dir(&self, dir: &str) {
        if let Some(s) = self.shared.upgrade() {
            post(&s, Some(dir), Notice::MayHaveMissed);
        }
    }

    /// See [`NotifyHub::notify_missed`].
    pub fn notify_missed(&self) {
        if let Some(s) = self.shared.upgrade() {
            post(&s, None, Notice::MayHaveMissed);
        }
    }
}

/// How one connection of a backend's listener ended ([`keep_listening`]).
#[derive(Debug)]
pub enum SessionEnd {
    /// The hub is gone (the store and all its notifications were dropped): stop.
    Closed,
    /// The connection failed: open another after a backoff.
    Lost(String),
    /// The server refuses to notify this user: say so once, retry every [`RETRY_MAX`].
    Refused(String),
}

/// A backend's listener task: runs `session` (one connection: subscribe, deliver, follow the
/// directories, until it ends; its second answer says whether it was subscribed) again and
/// again until the hub is gone, waiting between two by a [`Backoff`] (reset after a connection
/// that was up), or [`RETRY_MAX`] after a refusal, which is said once through `warn`.
pub async fn keep_listening<F, Fut>(
    backend: &'static str,
    hub: HubListener,
    warn: Arc<WarnOnce>,
    mut session: F,
) where
    F: FnMut(HubListener) -> Fut,
    Fut: std::future::Future<Output = (SessionEnd, bool)>,
{
    let mut backoff = Backoff::default();
    loop {
        if hub.is_closed() {
            return;
        }
        let (ended, was_up) = session(hub.clone()).await;
        let wait = match ended {
            SessionEnd::Closed => return,
            SessionEnd::Lost(why) => {
                tracing::debug!(backend, "notification connection lost: {why}");
                if was_up {
                    backoff.reset();
                }
                backoff.next_delay()
            }
            SessionEnd::Refused(why) => {
                warn.warn(backend, &why);
                RETRY_MAX
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// A retry delay that doubles from [`RETRY_MIN`] to [`RETRY_MAX`], for a listener that
/// reconnects; [`Backoff::reset`] after a subscription stayed up.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: RETRY_MIN }
    }
}

impl Backoff {
    /// The wait before the next attempt (doubling the one after).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(RETRY_MAX);
        d
    }

    /// Back to [`RETRY_MIN`].
    pub fn reset(&mut self) {
        self.next = RETRY_MIN;
    }
}

/// Says once per store handle why its notifications are off (a `tracing` warning and the
/// [`NOTIFICATIONS_UNAVAILABLE`](crate::metrics::NOTIFICATIONS_UNAVAILABLE) counter), for a
/// listener that gives up or keeps failing.
#[derive(Debug, Default)]
pub struct WarnOnce {
    said: std::sync::atomic::AtomicBool,
}

impl WarnOnce {
    /// Logs `why` for `backend` the first time only.
    pub fn warn(&self, backend: &'static str, why: &str) {
        if !self.said.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                backend,
                "change notifications are off, members keep polling: {why}"
            );
            metrics::counter!(crate::metrics::NOTIFICATIONS_UNAVAILABLE, "backend" => backend)
                .increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Notice, Notifications, NotifyHub};

    #[tokio::test]
    async fn notices_go_to_the_directory_subscribed_and_coalesce() {
        let hub = NotifyHub::new();
        let mut a = hub.subscribe("hc:{a}:");
        let mut a2 = hub.subscribe("hc:{a}:");
        let mut b = hub.subscribe("hc:{b}:");
        assert_eq!(hub.directories(), vec!["hc:{a}:", "hc:{b}:"]);
        hub.notify_key("hc:{a}:x");
        hub.notify("hc:{a}:");
        assert_eq!(a.recv().await, Notice::Changed);
        assert_eq!(a.try_recv(), None);
        assert_eq!(a2.try_recv(), Some(Notice::Changed));
        assert_eq!(b.try_recv(), None);
        hub.notify_missed();
        hub.notify("hc:{b}:");
        assert_eq!(b.try_recv(), Some(Notice::MayHaveMissed));
        drop(b);
        assert_eq!(hub.directories(), vec!["hc:{a}:"]);
    }

    #[tokio::test]
    async fn the_listener_ends_with_the_hub() {
        let hub = NotifyHub::new();
        let mut listener = hub.listener();
        let n = hub.subscribe("d:");
        assert!(listener.directories_changed().await);
        assert_eq!(listener.directories(), vec!["d:"]);
        drop(hub);
        drop(n);
        while listener.directories_changed().await {}
        assert!(listener.is_closed());
        let never = Notifications::never("d:");
        assert!(!never.is_native());
    }
}
