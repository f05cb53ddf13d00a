//! Every conformance case against a 3-member etcd cluster: `HEADCOUNT_TEST_ETCD_CLUSTER_URL`, or
//! three `etcd` members the harness starts, with every member as an endpoint.
#![cfg(feature = "etcd")]

headcount_harness::conformance_tests!(
    etcd_cluster,
    headcount_harness::ServerKind::EtcdCluster,
    cluster
);

/// One endpoint of three stalls (its bytes held, as a network cut holds them): the store moves
/// off it after the first call that ran out of time, and the calls after it answer from the
/// other two. Before, the client spread calls over all three and a share of them (16 of 40 in
/// one run) waited out the whole deadline for as long as the stall lasted. A call its caller
/// gives up after half the deadline moves the store off too (a group member gives up a
/// renewal at its lease deadline). Renewals, whose keep-alive streams stay open on the endpoint
/// they were opened on, move with the store too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_endpoint_is_left_after_one_call() -> Result<(), String> {
    use std::time::Duration;

    use headcount_harness::{KvStore, Proxy, ServerKind};

    let label = "etcd_cluster::a_stalled_endpoint_is_left_after_one_call";
    let started = tokio::task::spawn_blocking(|| KvStore::etcd(3, None))
        .await
        .map_err(|e| e.to_string())?;
    let Some(kv) = headcount_harness::available(ServerKind::EtcdCluster, label, started)? else {
        return Ok(());
    };
    let mut proxies = Vec::new();
    for server in &kv.servers {
        proxies.push(
            Proxy::start(server.port)
                .await
                .map_err(|e| format!("proxy: {e}"))?,
        );
    }
    let hosts: Vec<String> = proxies
        .iter()
        .map(|p| format!("127.0.0.1:{}", p.port()))
        .collect();
    let url = format!("etcd://{}?timeout=500ms", hosts.join(","));
    let store = headcount::connect(&url)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    // A key renewed like a member's slot: its lease's keep-alive stream stays open between
    // renewals, on the endpoint it was opened on.
    let (held, dir) = ("hc:{stall}:slot:0", "hc:{stall}:slot:");
    let ttl = Duration::from_secs(10);
    if !store
        .compare_and_set(held, None, "me", Some(ttl))
        .await
        .map_err(|e| format!("claim: {e}"))?
    {
        return Err("the renewed key exists already".into());
    }
    let probe = |i: usize| {
        let store = store.clone();
        async move {
            if i.is_multiple_of(2) {
                store.get("hc-stall-probe").await.map(|_| ())
            } else {
                match store.renew_and_list(held, "me", ttl, dir).await {
                    Ok((true, _)) => Ok(()),
                    Ok((false, _)) => {
                        Err(headcount::Error::config("the renewal found the key gone"))
                    }
                    Err(e) => Err(e),
                }
            }
        }
    };
    // Each endpoint in turn stalls (the store is on one of them, picked at random when it
    // connected, then on whichever it moved to): first with calls that run out of time, then
    // with calls their caller gives up.
    for given_up in [false, true] {
        for (stalled, proxy) in proxies.iter().enumerate() {
            for i in 0..2 {
                probe(i)
                    .await
                    .map_err(|e| format!("endpoint {stalled}, before the stall: {e}"))?;
            }
            proxy.set_delay(Duration::from_secs(60), Duration::ZERO);
            if given_up {
                // Given up after 300 ms of its 500-ms deadline; it answers when the store is
                // on another endpoint.
                let _ =
                    tokio::time::timeout(Duration::from_millis(300), store.get("hc-stall-probe"))
                        .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let mut failed = 0;
            // Reads and renewals in turn.
            for i in 0..20 {
                if probe(i).await.is_err() {
                    failed += 1;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let most = if given_up { 0 } else { 1 };
            if failed > most {
                return Err(format!(
                    "{failed} of 20 calls failed while endpoint {stalled} stalled (given up: {given_up}; at most {most}: the store should be on another endpoint)"
                ));
            }
            proxy.set_delay(Duration::ZERO, Duration::ZERO);
        }
    }
    Ok(())
}
