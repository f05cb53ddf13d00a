//! The check of a recorded history of ID calls, shared by the majority-IDs tests on real servers
//! (`conformance/tests/ids.rs`, `cli/tests/ids_serve.rs`), and the load that records it.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// One ID a client got (or a call that got none: `id` is `None`), as the client saw the call. A
/// call that took a block of IDs is one entry per ID, in the block's order, with the call's
/// times.
#[derive(Debug, Clone)]
pub struct IdCall {
    /// Which client made the call.
    pub client: usize,
    /// When the call was sent.
    pub start: Instant,
    /// When its answer arrived.
    pub end: Instant,
    /// The ID, or `None` for a call that failed.
    pub id: Option<i64>,
}

/// Panics unless every returned ID is unique, each client's IDs increase, and every ID is
/// greater than every ID whose call completed before its call started (linearizability of a
/// counter).
pub fn check_id_history(calls: &[IdCall]) {
    let ok: Vec<&IdCall> = calls.iter().filter(|c| c.id.is_some()).collect();
    let mut seen = HashSet::new();
    for c in &ok {
        assert!(seen.insert(c.id), "ID {:?} was returned twice", c.id);
    }
    let clients: HashSet<usize> = ok.iter().map(|c| c.client).collect();
    for client in clients {
        // A stable sort keeps a block's IDs in their order.
        let mut mine: Vec<&&IdCall> = ok.iter().filter(|c| c.client == client).collect();
        mine.sort_by_key(|c| c.start);
        for pair in mine.windows(2) {
            assert!(
                pair[0].id < pair[1].id,
                "client {client} got {:?} then {:?}",
                pair[0].id,
                pair[1].id
            );
        }
    }
    // Sorted by completion: the largest ID among the calls that completed before a start.
    let mut by_end = ok.clone();
    by_end.sort_by_key(|c| c.end);
    let mut prefix_max = Vec::with_capacity(by_end.len());
    let mut max = i64::MIN;
    for c in &by_end {
        max = max.max(c.id.unwrap_or(i64::MIN));
        prefix_max.push(max);
    }
    for c in &ok {
        let before = by_end.partition_point(|d| d.end < c.start);
        if before > 0 {
            let floor = prefix_max[before - 1];
            assert!(
                c.id.unwrap_or(i64::MIN) > floor,
                "linearizability: client {} got {:?}, but {floor} was returned before its call started",
                c.client,
                c.id
            );
        }
    }
}

/// Clients that take IDs until told to stop, each calling again as soon as it has an answer,
/// recording every call (a failed one as one entry with no ID) for [`check_id_history`].
pub struct IdLoad {
    calls: Arc<Mutex<Vec<IdCall>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl IdLoad {
    /// One task per caller; caller `i` is client `i`. A call answers its IDs in order, or
    /// `None` when it failed; after a failure the client pauses `after_failure` (none when zero).
    pub fn start<F, Fut>(callers: Vec<F>, after_failure: Duration) -> IdLoad
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Option<Vec<i64>>> + Send,
    {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for (client, mut call) in callers.into_iter().enumerate() {
            let (calls, stop) = (calls.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let start = Instant::now();
                    let got = call().await;
                    let end = Instant::now();
                    let failed = got.is_none();
                    let ids: Vec<Option<i64>> = match got {
                        Some(ids) => ids.into_iter().map(Some).collect(),
                        None => vec![None],
                    };
                    lock(&calls).extend(ids.into_iter().map(|id| IdCall {
                        client,
                        start,
                        end,
                        id,
                    }));
                    if failed && !after_failure.is_zero() {
                        tokio::time::sleep(after_failure).await;
                    }
                }
            }));
        }
        IdLoad { calls, stop, tasks }
    }

    /// Every call recorded so far.
    pub fn snapshot(&self) -> Vec<IdCall> {
        lock(&self.calls).clone()
    }

    /// Waits until `n` calls that started after `since` returned an ID; panics after `within`.
    pub async fn wait_ids(&self, since: Instant, n: usize, within: Duration, what: &str) {
        let what = format!("{what}: {n} IDs");
        crate::wait::eventually(&what, within, crate::wait::EVERY, || async {
            let got = self
                .snapshot()
                .iter()
                .filter(|c| c.start >= since && c.id.is_some())
                .count();
            if got >= n {
                Ok(())
            } else {
                Err(format!("only {got} of {n}"))
            }
        })
        .await;
    }

    /// Waits until at least `n` calls that started after `since` have ended, from `clients`
    /// distinct clients, and returns every such call; panics after `within`.
    pub async fn wait_calls(
        &self,
        since: Instant,
        n: usize,
        clients: usize,
        within: Duration,
        what: &str,
    ) -> Vec<IdCall> {
        let what = format!("{what}: {n} calls from {clients} clients");
        let every = Duration::from_millis(50);
        crate::wait::eventually(&what, within, every, || async {
            let after: Vec<IdCall> = self
                .snapshot()
                .into_iter()
                .filter(|c| c.start >= since)
                .collect();
            let from: HashSet<usize> = after.iter().map(|c| c.client).collect();
            if after.len() >= n && from.len() == clients {
                Ok(after)
            } else {
                Err(format!("{} calls from {} clients", after.len(), from.len()))
            }
        })
        .await
    }

    /// Stops the clients once their calls under way end, and returns every call recorded.
    pub async fn stop(self) -> Vec<IdCall> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            if let Err(e) = t.await {
                if e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        }
        let calls = lock(&self.calls).clone();
        calls
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
