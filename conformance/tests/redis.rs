//! Every conformance case against one Redis server: `HEADCOUNT_TEST_REDIS_URL`, or a
//! `redis-server` the harness starts (one shared, plus one per fault case).
#![cfg(feature = "redis")]

headcount_harness::conformance_tests!(redis, headcount_harness::ServerKind::Redis);

/// A call the deadline cut short on a connection whose packets stopped (a network cut) must not
/// hold up the calls after the cut healed: the store opens a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_after_a_healed_stall_answers() -> Result<(), String> {
    use headcount_harness::{KvStore, Proxy, ServerKind};

    let label = "redis::a_call_after_a_healed_stall_answers";
    let started = tokio::task::spawn_blocking(|| KvStore::redis(None))
        .await
        .map_err(|e| e.to_string())?;
    let Some(kv) = headcount_harness::available(ServerKind::Redis, label, started)? else {
        return Ok(());
    };
    let port = kv.servers[0].port;
    let proxy = Proxy::start(port)
        .await
        .map_err(|e| format!("proxy: {e}"))?;
    let store = headcount::connect(&format!("redis://127.0.0.1:{}?timeout=500ms", proxy.port()))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    headcount_harness::check_call_after_healed_stall(&store, &[proxy]).await
}
