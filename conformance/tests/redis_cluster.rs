//! Every conformance case against a Redis Cluster: `HEADCOUNT_TEST_REDIS_CLUSTER_URL`, or three
//! `redis-server` primaries the harness joins with `redis-cli --cluster create`.
#![cfg(feature = "redis")]

headcount_harness::conformance_tests!(redis_cluster, headcount_harness::ServerKind::RedisCluster);

/// A call the deadline cut short on a connection whose packets stopped (a network cut) must not
/// hold up the calls after the cut healed: the store opens fresh connections. Before, the
/// cluster client kept the connection, and a member cut from its node for a few seconds went on
/// failing for seconds after the heal (the partition tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_after_a_healed_stall_answers() -> Result<(), String> {
    use std::time::Duration;

    use headcount_harness::{KvStore, Proxy, ServerKind};

    let label = "redis_cluster::a_call_after_a_healed_stall_answers";
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
    headcount_harness::check_call_after_healed_stall(&store, &proxies).await
}
