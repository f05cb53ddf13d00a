//! Change notifications over an etcd watch (see the crate README, "Change notifications").
//!
//! One store handle keeps one watch stream (a gRPC stream on the client's connection), opened by
//! the first [`Store::subscribe`](headcount_core::Store::subscribe), with one prefix watch per
//! subscribed directory (etcd multiplexes any number of watches on a stream). An event on a key
//! directly under a directory notifies its subscribers; a put that keeps the key's value (a key
//! moved to a lease of its own, the first renewal after a claim) does not. A lost stream is
//! opened again with a backoff; a watch etcd cancels because it fell behind a compaction is
//! created again. Either way the directory's subscribers hear that they may have missed
//! changes.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchClient, WatchOptions, WatchResponse};
use headcount_core::notify::{keep_listening, HubListener, SessionEnd, WarnOnce};

use crate::errors::BACKEND;

fn options() -> WatchOptions {
    WatchOptions::new().with_prefix().with_prev_key()
}

/// The listener task of one store handle: see the module docs.
pub(crate) async fn listen(
    client: WatchClient,
    timeout: Duration,
    hub: HubListener,
    warn: Arc<WarnOnce>,
) {
    keep_listening(BACKEND, hub, warn, |mut hub| {
        let client = client.clone();
        async move { session(client, timeout, &mut hub).await }
    })
    .await;
}

fn ended_by(e: etcd_client::Error) -> SessionEnd {
    let text = e.to_string();
    if text.contains("permission denied") || text.contains("PermissionDenied") {
        SessionEnd::Refused(format!("etcd refuses the watch: {text}"))
    } else {
        SessionEnd::Lost(text)
    }
}

/// One watch stream: see the module docs. Says whether a watch was created on it.
async fn session(
    mut client: WatchClient,
    timeout: Duration,
    hub: &mut HubListener,
) -> (SessionEnd, bool) {
    let mut dirs = hub.directories();
    while dirs.is_empty() {
        if !hub.directories_changed().await {
            return (SessionEnd::Closed, false);
        }
        dirs = hub.directories();
    }
    let first = dirs[0].clone();
    let stream =
        match tokio::time::timeout(timeout, client.watch(first.clone(), Some(options()))).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return (ended_by(e), false),
            Err(_) => {
                return (
                    SessionEnd::Lost("opening the watch stream timed out".into()),
                    false,
                )
            }
        };
    let (mut sender, mut responses) = stream.split();
    // Watches are created in the order they are asked for, and answered in that order.
    let mut pending: VecDeque<String> = VecDeque::from([first]);
    for dir in &dirs[1..] {
        if let Err(e) = sender.watch(dir.clone(), Some(options())).await {
            return (ended_by(e), false);
        }
        pending.push_back(dir.clone());
    }
    let mut requested: BTreeSet<String> = dirs.into_iter().collect();
    let mut by_id: HashMap<i64, String> = HashMap::new();
    let mut up = false;
    loop {
        tokio::select! {
            msg = responses.message() => match msg {
                Ok(Some(resp)) => {
                    if let Some(ended) = answer(resp, hub, &mut pending, &mut by_id, &requested, &mut up) {
                        return (ended, up);
                    }
                    // A watch etcd cancelled behind a compaction is asked for again.
                    let lost: Vec<String> = requested
                        .iter()
                        .filter(|d| !pending.contains(d) && !by_id.values().any(|v| v == *d))
                        .cloned()
                        .collect();
                    for dir in lost {
                        if let Err(e) = sender.watch(dir.clone(), Some(options())).await {
                            return (ended_by(e), up);
                        }
                        pending.push_back(dir);
                    }
                }
                Ok(None) => return (SessionEnd::Lost("the watch stream ended".into()), up),
                Err(e) => return (ended_by(e), up),
            },
            alive = hub.directories_changed() => {
                if !alive {
                    return (SessionEnd::Closed, up);
                }
                let wanted: BTreeSet<String> = hub.directories().into_iter().collect();
                for dir in wanted.difference(&requested) {
                    if let Err(e) = sender.watch(dir.clone(), Some(options())).await {
                        return (ended_by(e), up);
                    }
                    pending.push_back(dir.clone());
                }
                let gone: Vec<i64> = by_id
                    .iter()
                    .filter(|(_, d)| !wanted.contains(*d))
                    .map(|(id, _)| *id)
                    .collect();
                for id in gone {
                    by_id.remove(&id);
                    if let Err(e) = sender.cancel(id).await {
                        return (ended_by(e), up);
                    }
                }
                requested = wanted;
            }
        }
    }
}

/// Handles one response of the stream. `Some` ends the stream.
fn answer(
    resp: WatchResponse,
    hub: &HubListener,
    pending: &mut VecDeque<String>,
    by_id: &mut HashMap<i64, String>,
    requested: &BTreeSet<String>,
    up: &mut bool,
) -> Option<SessionEnd> {
    let id = resp.watch_id();
    if resp.created() {
        if let Some(dir) = pending.pop_front() {
            // Watching now: what happened before was not seen.
            hub.notify_missed_dir(&dir);
            by_id.insert(id, dir);
            *up = true;
        }
    }
    if resp.canceled() {
        let dir = by_id.remove(&id);
        if resp.compact_revision() > 0 {
            // Fell behind a compaction: events are lost. The caller watches it again.
            if let Some(dir) = &dir {
                hub.notify_missed_dir(dir);
            }
        } else if dir.as_ref().is_some_and(|d| requested.contains(d)) {
            // Not our cancel: etcd refused the watch (permission denied, most likely).
            return Some(SessionEnd::Refused(format!(
                "etcd cancelled the watch of {:?}: {}",
                dir.unwrap_or_default(),
                resp.cancel_reason()
            )));
        }
        return None;
    }
    // A watch of ours no longer (cancelled meanwhile): nothing to deliver, the stream goes on.
    let dir = by_id.get(&id)?;
    let changed = resp.events().iter().any(|ev| {
        let Some(kv) = ev.kv() else { return false };
        let direct = kv
            .key()
            .strip_prefix(dir.as_bytes())
            .is_some_and(|rest| !rest.contains(&b':'));
        // A put of the value the key held (moved to another lease) changes no listing.
        let same = ev.event_type() == EventType::Put
            && ev.prev_kv().is_some_and(|prev| prev.value() == kv.value());
        direct && !same
    });
    if changed {
        hub.notify(dir);
    }
    None
}
