//! Change notifications over Redis pub/sub (see the crate README, "Change notifications").
//!
//! The scripts publish: `bump` in `index.lua`, which sets a directory's version whenever a key
//! of it is created, changed, deleted or found expired or repaired, also `PUBLISH`es an empty
//! message on the directory's channel, [`channel`], once per script and directory. A renewal
//! that changes nothing bumps no version and publishes nothing.
//!
//! One store handle keeps one pub/sub connection (its clones share it), opened by the first
//! [`Store::subscribe`](headcount_core::Store::subscribe) and subscribed to the channel of every
//! directory someone subscribed to; a listener task follows the set of directories, delivers
//! each message to the directory's subscribers, and reconnects with a backoff when the
//! connection is lost, then tells every subscriber that it may have missed changes.
//!
//! Plain `PUBLISH`, not Redis 7's sharded `SPUBLISH`: on a Cluster a `PUBLISH` reaches the
//! subscribers of every node, so one connection to any node hears every group's directories,
//! and the server may be older than 7. The price is that the Cluster bus carries each message
//! to every node; the messages are rare (a membership change, not a heartbeat) and empty. The
//! channel carries the directory's hash tag, so moving to `SPUBLISH` (one connection per shard)
//! needs no new names.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use headcount_core::notify::{keep_listening, HubListener, SessionEnd, WarnOnce};
use redis::{ConnectionInfo, Value};

use crate::errors::BACKEND;

/// What precedes a directory in the name of its channel.
pub(crate) const CHANNEL_PREFIX: &str = "headcount:changed:";

/// How often an idle subscription connection is checked with a `PING`, so a connection that
/// died without a word (a proxy that dropped it, a paused server) is replaced.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// The channel the scripts publish a change of directory `dir` on.
pub(crate) fn channel(dir: &str) -> String {
    format!("{CHANNEL_PREFIX}{dir}")
}

/// Where the listener connects: the nodes it may use (one at a time, the next after a failure)
/// and the per-call timeout.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) nodes: Vec<ConnectionInfo>,
    pub(crate) timeout: Duration,
}

/// The listener task of one store handle: see the module docs. Each connection goes to the
/// next node of the target after a failure (one node on a single server).
pub(crate) async fn listen(target: Target, hub: HubListener, warn: Arc<WarnOnce>) {
    let mut attempt = 0usize;
    keep_listening(BACKEND, hub, warn, |mut hub| {
        let node = target
            .nodes
            .get(attempt % target.nodes.len().max(1))
            .cloned();
        attempt += 1;
        let target = target.clone();
        async move {
            match node {
                Some(info) => session(info, &target, &mut hub).await,
                None => (SessionEnd::Closed, false),
            }
        }
    })
    .await;
}

/// One connection: subscribe every directory, then deliver messages and follow the set of
/// directories until the connection fails or the hub is gone. Says whether the subscription
/// was up.
async fn session(
    info: ConnectionInfo,
    target: &Target,
    hub: &mut HubListener,
) -> (SessionEnd, bool) {
    let opened = async {
        let client = redis::Client::open(info)?;
        client.get_async_pubsub().await
    };
    let pubsub = match tokio::time::timeout(target.timeout, opened).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return (SessionEnd::Lost(e.to_string()), false),
        Err(_) => return (SessionEnd::Lost("connecting timed out".into()), false),
    };
    let (mut sink, mut stream) = pubsub.split();
    let mut subscribed: BTreeSet<String> = BTreeSet::new();
    let mut up = false;
    let mut keepalive = tokio::time::interval(KEEPALIVE);
    keepalive.tick().await;
    loop {
        // Follow the set of directories: subscribe the new ones (whose subscribers then hear
        // they may have missed what happened before), unsubscribe the gone ones.
        let wanted: BTreeSet<String> = hub.directories().into_iter().collect();
        let fresh: Vec<String> = wanted.difference(&subscribed).cloned().collect();
        let gone: Vec<String> = subscribed.difference(&wanted).cloned().collect();
        if !fresh.is_empty() {
            let channels: Vec<String> = fresh.iter().map(|d| channel(d)).collect();
            match tokio::time::timeout(target.timeout, sink.subscribe(&channels)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.code() == Some("NOPERM") => {
                    return (
                        SessionEnd::Refused(format!(
                            "the server refuses SUBSCRIBE to this user (an ACL without \
                             channel permissions: grant them with ACL SETUSER <user> \
                             '&{CHANNEL_PREFIX}*'): {e}"
                        )),
                        up,
                    )
                }
                Ok(Err(e)) => return (SessionEnd::Lost(e.to_string()), up),
                Err(_) => return (SessionEnd::Lost("SUBSCRIBE timed out".into()), up),
            }
            // The client answers Ok to a SUBSCRIBE the server refused (its error reply is
            // taken as an answer). A PING tells: in subscribe mode (some channel subscribed)
            // its reply is `pong` in an array, else the bare message.
            if subscribed.is_empty() {
                match tokio::time::timeout(target.timeout, sink.ping_message::<Value>("hc")).await {
                    Ok(Ok(Value::Array(_) | Value::Push { .. })) => {}
                    Ok(Ok(_)) => {
                        return (
                            SessionEnd::Refused(format!(
                                "the server did not subscribe this user to `{CHANNEL_PREFIX}*` \
                                 (an ACL without channel permissions: grant them with ACL \
                                 SETUSER <user> '&{CHANNEL_PREFIX}*')"
                            )),
                            up,
                        )
                    }
                    Ok(Err(e)) => return (SessionEnd::Lost(format!("PING: {e}")), up),
                    Err(_) => return (SessionEnd::Lost("PING timed out".into()), up),
                }
            }
            up = true;
            for dir in fresh {
                hub.notify_missed_dir(&dir);
                subscribed.insert(dir);
            }
        }
        if !gone.is_empty() {
            let channels: Vec<String> = gone.iter().map(|d| channel(d)).collect();
            match tokio::time::timeout(target.timeout, sink.unsubscribe(&channels)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return (SessionEnd::Lost(e.to_string()), up),
                Err(_) => return (SessionEnd::Lost("UNSUBSCRIBE timed out".into()), up),
            }
            for dir in gone {
                subscribed.remove(&dir);
            }
        }
        tokio::select! {
            msg = stream.next() => match msg {
                Some(msg) => {
                    if let Some(dir) = msg.get_channel_name().strip_prefix(CHANNEL_PREFIX) {
                        hub.notify(dir);
                    }
                }
                None => return (SessionEnd::Lost("the server closed the connection".into()), up),
            },
            alive = hub.directories_changed() => {
                if !alive {
                    return (SessionEnd::Closed, up);
                }
            }
            _ = keepalive.tick() => {
                match tokio::time::timeout(target.timeout, sink.ping::<Value>()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return (SessionEnd::Lost(format!("PING: {e}")), up),
                    Err(_) => return (SessionEnd::Lost("PING timed out".into()), up),
                }
            }
        }
    }
}
