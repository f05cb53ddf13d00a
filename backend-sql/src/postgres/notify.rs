//! Change notifications over `LISTEN`/`NOTIFY` (see the crate README, "Change notifications").
//!
//! Triggers on the table (`Statements::notify_schema`) `pg_notify` a key's directory on the
//! channel `<table>_changed` when a write creates, deletes or changes a live key; renewals run
//! no trigger function. One store handle keeps one connection of its own (outside the pool,
//! whose connections drop notifications) holding `LISTEN` on that channel; a listener task
//! delivers each notification to the subscribers of its directory, and reconnects with a
//! backoff when the connection is lost, then tells every subscriber that it may have missed
//! changes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use headcount_core::notify::{keep_listening, HubListener, SessionEnd, WarnOnce};
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use super::config::PostgresConfig;
use super::errors::BACKEND;
use super::tls;

/// How often an idle listening connection is checked with an empty query, so one that died
/// without a word (a proxy dropped it, the server is paused) is replaced.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// The listener task of one store handle: see the module docs.
pub(crate) async fn listen(
    config: PostgresConfig,
    channel: String,
    hub: HubListener,
    warn: Arc<WarnOnce>,
) {
    keep_listening(BACKEND, hub, warn, |mut hub| {
        let (config, channel) = (config.clone(), channel.clone());
        async move { session(&config, &channel, &mut hub).await }
    })
    .await;
}

async fn session(
    config: &PostgresConfig,
    channel: &str,
    hub: &mut HubListener,
) -> (SessionEnd, bool) {
    let timeout = config.timeout();
    let tls_config = config.clone();
    // Building the connector may read `sslrootcert` from disk: off the runtime's workers.
    let connector = match tokio::task::spawn_blocking(move || tls::connector(&tls_config)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return (
                SessionEnd::Refused(format!("cannot set up TLS: {e}")),
                false,
            )
        }
        Err(e) => return (SessionEnd::Lost(e.to_string()), false),
    };
    let (client, mut connection) =
        match tokio::time::timeout(timeout, config.pg.connect(connector)).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return (SessionEnd::Lost(e.to_string()), false),
            Err(_) => return (SessionEnd::Lost("connecting timed out".into()), false),
        };
    // The connection delivers notifications only to whoever polls it: a task of its own,
    // forwarding them (and its end) here.
    let (tx, mut rx) = mpsc::unbounded_channel::<Result<String, String>>();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.send(Ok(n.payload().to_owned())).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
                None => {
                    let _ = tx.send(Err("the server closed the connection".into()));
                    return;
                }
            }
        }
    });
    let ended = listening(&client, channel, timeout, &mut rx, hub).await;
    driver.abort();
    ended
}

async fn listening(
    client: &tokio_postgres::Client,
    channel: &str,
    timeout: Duration,
    rx: &mut mpsc::UnboundedReceiver<Result<String, String>>,
    hub: &mut HubListener,
) -> (SessionEnd, bool) {
    // `channel` is `<table>_changed`, and a table name is letters, digits and `_`.
    let listen = format!("LISTEN \"{channel}\"");
    match tokio::time::timeout(timeout, client.batch_execute(&listen)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.as_db_error().is_some() => {
            return (
                SessionEnd::Refused(format!("the server refuses `{listen}`: {e}")),
                false,
            )
        }
        Ok(Err(e)) => return (SessionEnd::Lost(e.to_string()), false),
        Err(_) => return (SessionEnd::Lost("LISTEN timed out".into()), false),
    }
    // Listening now: what happened before was not heard.
    let mut known: BTreeSet<String> = BTreeSet::new();
    let mut keepalive = tokio::time::interval(KEEPALIVE);
    keepalive.tick().await;
    loop {
        let wanted: BTreeSet<String> = hub.directories().into_iter().collect();
        for dir in wanted.difference(&known) {
            hub.notify_missed_dir(dir);
        }
        known = wanted;
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Ok(dir)) => hub.notify(&dir),
                Some(Err(why)) => return (SessionEnd::Lost(why), true),
                None => return (SessionEnd::Lost("the connection's task ended".into()), true),
            },
            alive = hub.directories_changed() => {
                if !alive {
                    return (SessionEnd::Closed, true);
                }
            }
            _ = keepalive.tick() => {
                match tokio::time::timeout(timeout, client.simple_query("")).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return (SessionEnd::Lost(e.to_string()), true),
                    Err(_) => return (SessionEnd::Lost("keepalive timed out".into()), true),
                }
            }
        }
    }
}
