//! Every conformance case against a Redis Cluster: `HEADCOUNT_TEST_REDIS_CLUSTER_URL`, or three
//! `redis-server` primaries the harness joins with `redis-cli --cluster create`.
#![cfg(feature = "redis")]

headcount_harness::conformance_tests!(redis_cluster, headcount_harness::ServerKind::RedisCluster);

/// A call the deadline cut short on a connection whose packets stopped (a network cut: the
/// kernel holds the request for retransmission, and later requests on the connection queue
/// behind it) must not hold up the calls after the cut healed: the store opens fresh
/// connections. Before, the cluster client kept the connection, and a member cut from its node
/// for a few seconds went on failing for seconds after the heal (the partition tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_after_a_healed_cut_does_not_queue_behind_the_cut_one() -> Result<(), String> {
    use std::time::{Duration, Instant};

    use headcount_harness::{KvStore, Proxy, ServerKind};

    let label = "redis_cluster::a_call_after_a_healed_cut_does_not_queue_behind_the_cut_one";
    let mut proxies = Vec::new();
    for _ in 0..3 {
        proxies.push(Proxy::unbound().await.map_err(|e| format!("proxy: {e}"))?);
    }
    let announce: Vec<_> = proxies.iter().map(|p| (p.port(), p.upstream())).collect();
    let timeout = Duration::from_millis(500);
    let started =
        tokio::task::spawn_blocking(move || KvStore::redis_cluster(Some(timeout), Some(announce)))
            .await
            .map_err(|e| e.to_string())?;
    let Some(kv) = headcount_harness::available(ServerKind::RedisCluster, label, started)? else {
        return Ok(());
    };
    let store = headcount::connect(&kv.url())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    store
        .get("hc-stall-probe")
        .await
        .map_err(|e| format!("before the cut: {e}"))?;
    // The cut: every byte held far longer than the call's deadline, in order, as TCP holds
    // what it must retransmit.
    for p in &proxies {
        p.set_delay(Duration::from_secs(60), Duration::ZERO);
    }
    if store.get("hc-stall-probe").await.is_ok() {
        return Err("a call answered through a cut".into());
    }
    for p in &proxies {
        p.set_delay(Duration::ZERO, Duration::ZERO);
    }
    let healed = Instant::now();
    store.get("hc-stall-probe").await.map_err(|e| {
        format!(
            "the first call after the heal failed after {:?}: {e}",
            healed.elapsed()
        )
    })?;
    Ok(())
}
