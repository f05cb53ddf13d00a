//! Server faults: killed, paused. These need [`ServerControl`] over a server dedicated to the case.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use headcount::{DynStore, ErrorKind};
use tokio::time::Instant;

use super::{put, POLL_INTERVAL};
use crate::{ensure, ensure_eq, CaseResult, Ctx, Failure, ResultExt, ServerControl};

/// How much later than the configured timeout a failing call may return.
pub const FAULT_SLACK: Duration = Duration::from_secs(1);

/// How long the store may take to work again once the server is back.
pub const RECOVERY_DEADLINE: Duration = Duration::from_secs(30);

fn control(ctx: &Ctx) -> Result<Arc<dyn ServerControl>, Failure> {
    ctx.control.clone().ok_or_else(|| {
        Failure::new("this case needs control of the server (ServerControl), and has none")
    })
}

/// What a call made during a fault must fail with.
#[derive(Clone, Copy)]
enum Expect {
    /// Any retryable error ([`headcount::Error::is_retryable`]).
    Retryable,
    /// [`ErrorKind::Timeout`] exactly.
    Timeout,
}

/// Makes one call during a fault (`fault` says which, e.g. "with the server killed") and checks
/// that it fails, with an error of the `expect`ed class, within `timeout` plus [`FAULT_SLACK`].
async fn fails_fast<T: std::fmt::Debug>(
    op: &str,
    fault: &str,
    call: impl std::future::Future<Output = headcount::Result<T>>,
    timeout: Duration,
    expect: Expect,
) -> CaseResult {
    let started = Instant::now();
    let result = call.await;
    let took = started.elapsed();
    match result {
        Ok(v) => return Err(Failure::new(format!("{op} returned {v:?} {fault}"))),
        Err(e) => match expect {
            Expect::Retryable => ensure!(
                e.is_retryable(),
                "{op} {fault}: a permanent error ({:?}): {e}",
                e.kind()
            ),
            Expect::Timeout => ensure!(
                e.kind() == ErrorKind::Timeout,
                "{op} {fault}: expected ErrorKind::Timeout, got {:?}: {e}",
                e.kind()
            ),
        },
    }
    ensure!(
        took <= timeout + FAULT_SLACK,
        "{op} {fault} took {took:?}, more than the timeout {timeout:?} + {FAULT_SLACK:?}"
    );
    Ok(())
}

/// One call made while the server went away.
#[derive(Debug)]
struct Call {
    started: Instant,
    took: Duration,
    error: Option<(ErrorKind, bool, String)>,
}

/// Calls `get` in a loop until `stop`, recording every call.
fn spawn_caller(
    store: DynStore,
    key: String,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Call>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let result = store.get(&key).await;
            let call = Call {
                started,
                took: started.elapsed(),
                error: result
                    .err()
                    .map(|e| (e.kind(), e.is_retryable(), e.to_string())),
            };
            let failed = call.error.is_some();
            log.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(call);
            if failed {
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
    })
}

/// Polls until `op` succeeds on the same store handle, within [`RECOVERY_DEADLINE`].
async fn recovered(ctx: &Ctx, key: &str) -> Result<Option<String>, Failure> {
    let deadline = Instant::now() + RECOVERY_DEADLINE;
    loop {
        match ctx.store.get(key).await {
            Ok(v) => return Ok(v),
            Err(e) => {
                ensure!(
                    Instant::now() < deadline,
                    "the store did not work again within {RECOVERY_DEADLINE:?} after the server came back; last error: {e}"
                );
                ensure!(
                    e.is_retryable(),
                    "while the server came back: a permanent error: {e}"
                );
            }
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// With the server killed (SIGKILL) mid-run, calls in flight and new calls fail with a retryable
/// error within the configured timeout (plus [`FAULT_SLACK`]), and the same store handle works
/// again once the server is restarted.
pub async fn server_killed_retryable_then_recovers(ctx: &Ctx) -> CaseResult {
    let control = control(ctx)?;
    let result = killed(ctx, &*control).await;
    // Leave the server running whatever happened, for the cleanup and the next case.
    let restarted = control.start().await;
    result?;
    restarted.during("starting the server again")
}

async fn killed(ctx: &Ctx, control: &dyn ServerControl) -> CaseResult {
    let store = &ctx.store;
    let bound = control.op_timeout() + FAULT_SLACK;
    let k = ctx.key("n");
    ensure_eq!(
        store.incr(&k, None).await.during("incr before the kill")?,
        1,
        "first incr"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::new()));
    let callers: Vec<_> = (0..4)
        .map(|_| spawn_caller(store.clone(), k.clone(), stop.clone(), log.clone()))
        .collect();
    // Let the callers get going so the kill lands mid-run.
    let warm = Instant::now() + Duration::from_secs(10);
    while log.lock().unwrap_or_else(PoisonError::into_inner).len() < 20 && Instant::now() < warm {
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    control.kill().await.during("killing the server")?;
    let killed_at = Instant::now();

    let fault = "with the server killed";
    let timeout = control.op_timeout();
    fails_fast("get", fault, store.get(&k), timeout, Expect::Retryable).await?;
    fails_fast(
        "incr",
        fault,
        store.incr(&k, None),
        timeout,
        Expect::Retryable,
    )
    .await?;
    fails_fast(
        "compare_and_set",
        fault,
        store.compare_and_set(&k, Some("1"), "2", None),
        timeout,
        Expect::Retryable,
    )
    .await?;

    // Give the callers a few failing rounds, then stop them; each must end within the bound.
    while Instant::now() < killed_at + Duration::from_millis(500) {
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        match tokio::time::timeout(bound + Duration::from_secs(1), caller).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Failure::new(format!("a caller task died: {e}"))),
            Err(_) => {
                return Err(Failure::new(format!(
                    "a get in flight when the server was killed did not return within {bound:?}"
                )))
            }
        }
    }
    let calls = std::mem::take(&mut *log.lock().unwrap_or_else(PoisonError::into_inner));
    let mut after_kill = 0;
    for call in &calls {
        if let Some((kind, retryable, msg)) = &call.error {
            ensure!(
                *retryable,
                "a get while the server was killed failed with a permanent error ({kind:?}): {msg}"
            );
        } else {
            ensure!(
                call.started < killed_at,
                "a get sent {:?} after the server was killed succeeded",
                call.started - killed_at
            );
        }
        ensure!(
            call.took <= bound,
            "a get while the server was killed took {:?}, more than the timeout {:?} + {FAULT_SLACK:?}",
            call.took,
            control.op_timeout()
        );
        if call.started >= killed_at {
            after_kill += 1;
        }
    }
    ensure!(after_kill > 0, "no background call was made after the kill");

    control.start().await.during("starting the server again")?;
    let v = recovered(ctx, &k).await?;
    // Whether the increment survived the kill is the server's durability, not the contract:
    // the handle must simply work, and counting must go on from what is stored.
    let before: i64 = match v.as_deref() {
        None => 0,
        Some(text) => text
            .parse()
            .map_err(|_| Failure::new(format!("{k:?} holds {text:?} after the restart")))?,
    };
    ensure!(
        before <= 1,
        "{k:?} holds {before} after the restart, more than was written"
    );
    ensure_eq!(
        store
            .incr(&k, None)
            .await
            .during("incr after the restart")?,
        before + 1,
        "incr after the restart"
    );
    Ok(())
}

/// With the server paused (SIGSTOP on all its processes) longer than the timeout, a call fails
/// with [`ErrorKind::Timeout`] within the timeout (plus [`FAULT_SLACK`]), and the same handle works
/// again after SIGCONT.
pub async fn server_paused_times_out_then_recovers(ctx: &Ctx) -> CaseResult {
    let control = control(ctx)?;
    let result = paused(ctx, &*control).await;
    let resumed = control.resume().await;
    result?;
    resumed.during("resuming the server")
}

async fn paused(ctx: &Ctx, control: &dyn ServerControl) -> CaseResult {
    let store = &ctx.store;
    let timeout = control.op_timeout();
    let k = ctx.key("n");
    ensure_eq!(
        store.incr(&k, None).await.during("incr before the pause")?,
        1,
        "first incr"
    );

    control.pause().await.during("pausing the server")?;
    let fault = "with the server paused";
    fails_fast("get", fault, store.get(&k), timeout, Expect::Timeout).await?;
    // A second call may need a new connection, which stalls in its handshake instead.
    fails_fast(
        "a second get",
        fault,
        store.get(&k),
        timeout,
        Expect::Retryable,
    )
    .await?;

    control.resume().await.during("resuming the server")?;
    let v = recovered(ctx, &k).await?;
    ensure_eq!(v, Some("1".to_owned()), "get after the server resumed");
    ensure_eq!(
        store.incr(&k, None).await.during("incr after resume")?,
        2,
        "incr after resume"
    );
    Ok(())
}

/// With the connection cut by the harness's TCP proxy (every open connection dropped, new ones
/// blackholed) while the server keeps running, calls fail with a retryable error within the
/// timeout (plus [`FAULT_SLACK`]), and the same handle works again once traffic passes.
pub async fn connection_cut_retryable_then_recovers(ctx: &Ctx) -> CaseResult {
    let control = control(ctx)?;
    let result = cut(ctx, &*control).await;
    let healed = control.heal().await;
    result?;
    healed.during("letting traffic through the proxy again")
}

async fn cut(ctx: &Ctx, control: &dyn ServerControl) -> CaseResult {
    let store = &ctx.store;
    let timeout = control.op_timeout();
    let k = ctx.key("n");
    ensure_eq!(
        store.incr(&k, None).await.during("incr before the cut")?,
        1,
        "first incr"
    );
    control
        .cut()
        .await
        .during("cutting the connection at the proxy")?;
    // Only calls that change nothing: a request held by the blackhole may still reach the
    // server after the heal, as after a real partition.
    let fault = "with the connection cut";
    fails_fast("get", fault, store.get(&k), timeout, Expect::Retryable).await?;
    fails_fast(
        "compare_and_set",
        fault,
        store.compare_and_set(&k, Some("not the value"), "x", None),
        timeout,
        Expect::Retryable,
    )
    .await?;
    fails_fast(
        "list",
        fault,
        store.list(&ctx.prefix),
        timeout,
        Expect::Retryable,
    )
    .await?;
    fails_fast(
        "get again",
        fault,
        store.get(&k),
        timeout,
        Expect::Retryable,
    )
    .await?;
    control
        .heal()
        .await
        .during("letting traffic through the proxy again")?;
    let v = recovered(ctx, &k).await?;
    ensure_eq!(v, Some("1".to_owned()), "get after the heal");
    ensure_eq!(
        store.incr(&k, None).await.during("incr after the heal")?,
        2,
        "incr after the heal"
    );
    Ok(())
}

/// A write whose reply is lost (the proxy lets the request reach the server, then drops the
/// connection when the answer comes) is applied at most once, and the call either tells the
/// truth about it or fails with a retryable error: an increment is not counted twice, a
/// compare-and-set or compare-and-delete that wrote is not reported as "not written". A client
/// library that sends a request again on a new connection (the Redis Cluster client does) must
/// not apply it twice or answer from the second attempt as if the first had not happened.
///
/// Each operation runs once before (scripts loaded, statements prepared, what a client caches
/// known), so the answer dropped is the write's own; the case fails unless some attempt of each
/// operation lost the answer of a write the server applied.
pub async fn lost_reply_applied_at_most_once(ctx: &Ctx) -> CaseResult {
    let control = control(ctx)?;
    let result = lost_replies(ctx, &*control).await;
    let passed = control.pass_replies().await;
    result?;
    passed
        .map(drop)
        .during("passing the server's answers again")
}

/// Attempts at each operation with its answer dropped, until one lost the answer of a write the
/// server applied.
const LOST_REPLY_ATTEMPTS: usize = 5;

/// Runs `call` with the proxy told to drop the next answer from the server; says whether an
/// answer was dropped.
async fn reply_lost<T>(
    control: &dyn ServerControl,
    call: impl std::future::Future<Output = T>,
) -> Result<(T, bool), Failure> {
    control
        .drop_next_reply()
        .await
        .during("telling the proxy to drop the next answer")?;
    let got = call.await;
    let dropped = control
        .pass_replies()
        .await
        .during("passing the server's answers again")?;
    Ok((got, dropped))
}

async fn lost_replies(ctx: &Ctx, control: &dyn ServerControl) -> CaseResult {
    let store = &ctx.store;
    let n = ctx.key("n");
    ensure_eq!(
        store.incr(&n, None).await.during("the first incr")?,
        1,
        "the first incr"
    );
    let mut before = 1i64;
    let mut applied = false;
    for round in 1..=LOST_REPLY_ATTEMPTS {
        let (got, dropped) = reply_lost(control, store.incr(&n, None)).await?;
        let now: i64 = recovered(ctx, &n)
            .await?
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Failure::new(format!("round {round}: the counter is gone")))?;
        ensure!(
            now == before || now == before + 1,
            "round {round}: an incr whose reply was lost moved the counter from {before} to {now} \
             (answered {got:?}): applied more than once"
        );
        match got {
            Ok(v) => ensure_eq!(v, now, "round {round}: what incr answered"),
            Err(e) => ensure!(
                e.is_retryable(),
                "round {round}: incr with its reply lost failed permanently: {e}"
            ),
        }
        applied |= dropped && now == before + 1;
        before = now;
        if applied && round >= 3 {
            break;
        }
    }
    ensure!(
        applied,
        "no incr of {LOST_REPLY_ATTEMPTS} lost the answer of an increment the server applied: \
         the case proved nothing"
    );

    let (mut set_applied, mut deleted_applied) = (false, false);
    for attempt in 0..LOST_REPLY_ATTEMPTS {
        let k = ctx.key(&format!("cas{attempt}"));
        put(ctx, &k, "a", None).await?;
        // The same calls once on another key first, answered.
        let warm = ctx.key(&format!("warm{attempt}"));
        put(ctx, &warm, "a", None).await?;
        store
            .compare_and_set(&warm, Some("a"), "b", None)
            .await
            .during("a compare_and_set before")?;

        let (got, dropped) =
            reply_lost(control, store.compare_and_set(&k, Some("a"), "b", None)).await?;
        let now = recovered(ctx, &k).await?;
        match got {
            Ok(true) => ensure_eq!(
                now.as_deref(),
                Some("b"),
                "value after a compare_and_set that wrote"
            ),
            Ok(false) => ensure_eq!(
                now.as_deref(),
                Some("a"),
                "value after a compare_and_set (a -> b) with its reply lost answered false"
            ),
            Err(e) => {
                ensure!(
                    e.is_retryable(),
                    "compare_and_set with its reply lost failed permanently: {e}"
                );
                ensure!(
                    matches!(now.as_deref(), Some("a" | "b")),
                    "value after a failed compare_and_set: {now:?}"
                );
            }
        }
        set_applied |= dropped && now.as_deref() == Some("b");

        // After a lost answer the client may be on a new connection (statements not prepared).
        store
            .compare_and_delete(&warm, "b")
            .await
            .during("a compare_and_delete before")?;
        let current = now.unwrap_or_default();
        let (got, dropped) = reply_lost(control, store.compare_and_delete(&k, &current)).await?;
        let now = recovered(ctx, &k).await?;
        match got {
            Ok(true) => ensure_eq!(now, None, "value after a compare_and_delete that deleted"),
            Ok(false) => ensure_eq!(
                now.as_deref(),
                Some(current.as_str()),
                "value after a compare_and_delete with its reply lost answered false"
            ),
            Err(e) => ensure!(
                e.is_retryable(),
                "compare_and_delete with its reply lost failed permanently: {e}"
            ),
        }
        deleted_applied |= dropped && now.is_none();
        if set_applied && deleted_applied {
            break;
        }
    }
    ensure!(
        set_applied && deleted_applied,
        "in {LOST_REPLY_ATTEMPTS} attempts no answer of a compare_and_set ({set_applied}) or \
         compare_and_delete ({deleted_applied}) the server applied was lost: the case proved \
         nothing"
    );
    Ok(())
}

/// With one member of a 3-member cluster killed (SIGKILL), every operation keeps succeeding
/// within the timeout (plus [`FAULT_SLACK`]) and counters stay exact; after the member is started
/// again operations still succeed (whether it caught up with the others is not checked).
pub async fn cluster_member_killed_keeps_serving(ctx: &Ctx) -> CaseResult {
    let control = control(ctx)?;
    let result = member_killed(ctx, &*control).await;
    let restarted = control.start().await;
    result?;
    restarted.during("starting the member again")
}

async fn member_killed(ctx: &Ctx, control: &dyn ServerControl) -> CaseResult {
    let store = &ctx.store;
    let bound = control.op_timeout() + FAULT_SLACK;
    let k = ctx.key("n");
    let c = ctx.key("c");
    ensure_eq!(
        store.incr(&k, None).await.during("incr before the kill")?,
        1,
        "first incr"
    );
    control.kill().await.during("killing one member")?;
    let mut expected = 1;
    let until = Instant::now() + Duration::from_secs(3);
    let mut round = 0;
    while Instant::now() < until || round < 5 {
        round += 1;
        let started = Instant::now();
        expected += 1;
        ensure_eq!(
            store
                .incr(&k, None)
                .await
                .during(format!("incr #{round} with a member killed"))?,
            expected,
            "incr #{round} with a member killed"
        );
        let value = round.to_string();
        let previous = (round > 1).then(|| (round - 1).to_string());
        ensure!(
            store
                .compare_and_set(&c, previous.as_deref(), &value, None)
                .await
                .during(format!("compare_and_set #{round} with a member killed"))?,
            "compare_and_set #{round} with a member killed did not write"
        );
        let listed = store
            .list(&ctx.prefix)
            .await
            .during(format!("list #{round} with a member killed"))?;
        ensure_eq!(listed.len(), 2, "keys listed in round {round}");
        let took = started.elapsed();
        ensure!(
            took <= bound * 3,
            "round {round} (incr, compare_and_set, list) with a member killed took {took:?}"
        );
    }
    control.start().await.during("starting the member again")?;
    expected += 1;
    ensure_eq!(
        store
            .incr(&k, None)
            .await
            .during("incr after the restart")?,
        expected,
        "incr after the member restarted"
    );
    Ok(())
}
