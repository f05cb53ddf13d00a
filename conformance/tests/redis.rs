//! Every conformance case against one Redis server: `HEADCOUNT_TEST_REDIS_URL`, or a
//! `redis-server` the harness starts (one shared, plus one per fault case).
#![cfg(feature = "redis")]

headcount_harness::conformance_tests!(redis, headcount_harness::ServerKind::Redis);

/// A call the deadline cut short on a connection whose packets stopped (a network cut: the
/// kernel holds the request for retransmission, and later requests on the connection queue
/// behind it) must not hold up the calls after the cut healed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_after_a_healed_cut_does_not_queue_behind_the_cut_one() -> Result<(), String> {
    use std::time::{Duration, Instant};

    use headcount_harness::{KvStore, Proxy, ServerKind};

    let label = "redis::a_call_after_a_healed_cut_does_not_queue_behind_the_cut_one";
    let started = tokio::task::spawn_blocking(|| KvStore::redis(None))
        .await
        .map_err(|e| e.to_string())?;
    let Some(kv) = headcount_harness::available(ServerKind::Redis, label, started)? else {
        return Ok(());
    };
    let url = kv.url();
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .ok_or_else(|| format!("no port in {url}"))?;
    let proxy = Proxy::start(port)
        .await
        .map_err(|e| format!("proxy: {e}"))?;
    let store = headcount::connect(&format!("redis://127.0.0.1:{}?timeout=500ms", proxy.port()))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    store
        .get("hc-stall-probe")
        .await
        .map_err(|e| format!("before the cut: {e}"))?;
    // The cut: every byte held far longer than the call's deadline, in order, as TCP holds
    // what it must retransmit.
    proxy.set_delay(Duration::from_secs(60), Duration::ZERO);
    if store.get("hc-stall-probe").await.is_ok() {
        return Err("a call answered through a cut".into());
    }
    proxy.set_delay(Duration::ZERO, Duration::ZERO);
    let healed = Instant::now();
    store.get("hc-stall-probe").await.map_err(|e| {
        format!(
            "the first call after the heal failed after {:?}: {e}",
            healed.elapsed()
        )
    })?;
    Ok(())
}
