//! The Distributor on real stores, with real gRPC health servers on
//! loopback: a balanced table, failover within `poll_interval + ping_timeout`, a service that
//! comes back, two distributors at once, units added and removed, a silent health server, and bad
//! input. One test per scenario per backend; each uses its own random namespaces.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use headcount::recipes::distributor::{
    self as recipe, grpc::serve_health, grpc::HealthServer, DistributionTable, Distributor,
    DistributorConfig, Liveness, PollOutcome, Registration,
};
use headcount::{DynStore, ErrorKind, Keyspace};
use headcount_conformance::wait;
use headcount_harness::ServerKind;

const POLL: Duration = Duration::from_millis(200);
/// Generous: every probe opens a fresh connection, and 30 of these tests run at once with their
/// servers on a small machine; a slower probe would count a live service as down and flap the
/// table.
const PING_TIMEOUT: Duration = Duration::from_secs(1);
/// Store round trips, CAS and scheduling on a loaded 2-core machine, on top of the bound.
const SLACK: Duration = Duration::from_secs(2);

/// The shared store of `backend`, or None (with a SKIP line) when its server is not installed and
/// the backend is not required.
async fn store(backend: ServerKind) -> Option<DynStore> {
    let url = backend
        .shared_or_skip(&format!("{}::distributor", backend.name()))
        .await?;
    Some(headcount::connect(&url).await.unwrap())
}

/// Fresh namespaces for one test: (services, units, distribution).
struct Ns {
    services: Keyspace,
    units: Keyspace,
    dist: Keyspace,
}

impl Ns {
    fn new() -> Self {
        let tag = format!("{:012x}", rand::random::<u64>() >> 16);
        Ns {
            services: Keyspace::new(&format!("svc-{tag}")).unwrap(),
            units: Keyspace::new(&format!("wu-{tag}")).unwrap(),
            dist: Keyspace::new(&format!("dist-{tag}")).unwrap(),
        }
    }

    fn config(&self) -> DistributorConfig {
        DistributorConfig::new(
            [self.services.group()],
            self.units.group(),
            self.dist.group(),
        )
        .with_poll_interval(POLL)
        .with_ping_timeout(PING_TIMEOUT)
    }
}

/// A listener on `addr` (port 0: any) that can be bound again right after a close.
fn listener(addr: SocketAddr) -> tokio::net::TcpListener {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr).unwrap();
    socket.listen(128).unwrap()
}

async fn start_service(store: &DynStore, ns: &Ns, name: &str) -> HealthServer {
    let server = serve_health(listener("127.0.0.1:0".parse().unwrap())).unwrap();
    let liveness = Liveness::grpc(&server.address()).unwrap();
    recipe::register(store, &ns.services, name, &liveness)
        .await
        .unwrap();
    server
}

async fn add_units(store: &DynStore, ns: &Ns, names: &[String]) {
    for u in names {
        recipe::add_unit(store, &ns.units, u).await.unwrap();
    }
}

/// Polls the table until `done` holds or `deadline` passes; returns it and the time taken.
async fn wait_for(
    store: &DynStore,
    ns: &Ns,
    deadline: Duration,
    what: &str,
    done: impl Fn(&DistributionTable) -> bool,
) -> (DistributionTable, Duration) {
    let start = Instant::now();
    let table = wait::eventually(what, deadline, wait::EVERY, || async {
        match recipe::read_table(store, &ns.dist).await.unwrap() {
            Some(t) if done(&t) => Ok(t),
            last => Err(last),
        }
    })
    .await;
    (table, start.elapsed())
}

fn counts(t: &DistributionTable) -> Vec<usize> {
    t.services.values().map(Vec::len).collect()
}

/// Every unit listed exactly once across the table's services, and every per-service record at
/// the table's version with the table's units. Retried until the records catch up.
async fn records_match(store: &DynStore, ns: &Ns, table: &DistributionTable, units: usize) {
    let all: Vec<&String> = table.services.values().flatten().collect();
    let unique: BTreeSet<&String> = all.iter().copied().collect();
    assert_eq!(all.len(), units, "{table:?}");
    assert_eq!(unique.len(), units, "{table:?}");
    let what = format!("every per-service record matches the table {table:?}");
    wait::eventually(&what, SLACK, wait::EVERY, || async {
        for (service, want) in &table.services {
            let got = recipe::read_assignment(store, &ns.dist, service)
                .await
                .unwrap();
            let ok = got
                .as_ref()
                .is_some_and(|a| a.version >= table.version && &a.units == want);
            if !ok {
                return Err(format!("record of {service}: {got:?}"));
            }
        }
        Ok(())
    })
    .await;
}

fn unit_names(n: usize) -> Vec<String> {
    // Commas, spaces and non-ASCII in the names: the table must keep them whole.
    (0..n)
        .map(|i| format!("site-{i}.example,path {i} ü"))
        .collect()
}

async fn failover_and_return(backend: ServerKind) {
    let Some(store) = store(backend).await else {
        return;
    };
    let ns = Ns::new();
    let names = ["parser-a", "parser-b", "parser-c"];
    let mut servers = Vec::new();
    for n in names {
        servers.push(Some(start_service(&store, &ns, n).await));
    }
    let units = unit_names(30);
    add_units(&store, &ns, &units).await;
    let mut watch = recipe::watch_assignment(
        store.clone(),
        ns.dist.clone(),
        "parser-a".into(),
        Duration::from_millis(50),
    )
    .unwrap();
    let running = Distributor::new(store.clone(), ns.config())
        .unwrap()
        .spawn();

    let bound = POLL + PING_TIMEOUT + SLACK;
    let (first, _) = wait_for(&store, &ns, bound, "balanced table", |t| {
        t.down.is_empty() && counts(t) == [10, 10, 10]
    })
    .await;
    records_match(&store, &ns, &first, 30).await;
    // The service side sees its units.
    let seen = loop {
        let a = watch.changed().await.unwrap();
        if a.version >= first.version {
            break a;
        }
    };
    assert_eq!(seen.units, first.units_of("parser-a"));

    // Stop parser-b: its units go to the others within poll_interval + ping_timeout (+ slack).
    let addr = servers[1].as_ref().unwrap().local_addr();
    servers[1].take().unwrap().shutdown().await.unwrap();
    let (second, took) = wait_for(&store, &ns, bound, "failover", |t| {
        t.down.contains("parser-b") && t.units_of("parser-b").is_empty()
    })
    .await;
    println!(
        "{}: failover seen after {took:?} (poll {POLL:?} + timeout {PING_TIMEOUT:?})",
        backend.name()
    );
    assert_eq!(counts(&second), [15, 0, 15]);
    assert!(second.version > first.version);
    records_match(&store, &ns, &second, 30).await;
    for u in first.units_of("parser-b") {
        assert!(second
            .owners()
            .get(u.as_str())
            .is_some_and(|o| *o != "parser-b"));
    }

    // Start it again on the same address: it gets its units back, the same table as before.
    servers[1] = Some(serve_health(listener(addr)).unwrap());
    assert_eq!(
        recipe::register(
            &store,
            &ns.services,
            "parser-b",
            &Liveness::grpc(&addr.to_string()).unwrap()
        )
        .await
        .unwrap(),
        Registration::Unchanged
    );
    let (third, _) = wait_for(&store, &ns, bound, "return", |t| t.down.is_empty()).await;
    assert_eq!(third.services, first.services);
    records_match(&store, &ns, &third, 30).await;

    // NOT_SERVING counts as down, SERVING again as up.
    servers[2].as_ref().unwrap().set_serving(false).await;
    wait_for(&store, &ns, bound, "not serving", |t| {
        t.down.contains("parser-c") && counts(t) == [15, 15, 0]
    })
    .await;
    servers[2].as_ref().unwrap().set_serving(true).await;
    let (fifth, _) = wait_for(&store, &ns, bound, "serving again", |t| t.down.is_empty()).await;
    assert_eq!(fifth.services, first.services);

    running.stop().await;
    for s in servers.into_iter().flatten() {
        s.shutdown().await.unwrap();
    }
}

async fn two_distributors_and_unit_changes(backend: ServerKind) {
    let Some(store) = store(backend).await else {
        return;
    };
    let ns = Ns::new();
    let mut servers = Vec::new();
    for n in ["w1", "w2", "w3"] {
        servers.push(start_service(&store, &ns, n).await);
    }
    let units = unit_names(30);
    add_units(&store, &ns, &units).await;
    let d1 = Distributor::new(store.clone(), ns.config())
        .unwrap()
        .spawn();
    let d2 = Distributor::new(store.clone(), ns.config())
        .unwrap()
        .spawn();
    let bound = POLL + PING_TIMEOUT + SLACK;
    let (t, _) = wait_for(&store, &ns, bound, "balanced", |t| {
        counts(t) == [10, 10, 10]
    })
    .await;
    records_match(&store, &ns, &t, 30).await;

    // Add 3 units and remove 6: the table follows, still balanced.
    let extra: Vec<String> = (0..3).map(|i| format!("extra,{i}")).collect();
    add_units(&store, &ns, &extra).await;
    for u in &units[..6] {
        assert!(recipe::remove_unit(&store, &ns.units, u).await.unwrap());
    }
    let (t2, _) = wait_for(&store, &ns, bound, "units changed", |t| {
        t.owners().len() == 27 && t.owners().contains_key("extra,2")
    })
    .await;
    assert_eq!(counts(&t2), [9, 9, 9]);
    for u in &units[..6] {
        assert!(!t2.owners().contains_key(u.as_str()));
    }
    // Both distributors keep agreeing: the table settles and stays. (An observation window of a
    // few polls in which nothing may change, not a wait for something to happen.)
    tokio::time::sleep(POLL * 3).await;
    let settled = recipe::read_table(&store, &ns.dist).await.unwrap().unwrap();
    assert_eq!(
        settled.services, t2.services,
        "the table changed after settling: {t2:?} then {settled:?}"
    );
    records_match(&store, &ns, &settled, 27).await;
    // A third instance polling once finds nothing to change.
    let d3 = Distributor::new(store.clone(), ns.config()).unwrap();
    assert_eq!(
        d3.poll().await.unwrap(),
        PollOutcome::Unchanged {
            version: settled.version
        }
    );
    d1.stop().await;
    d2.stop().await;
    for s in servers {
        s.shutdown().await.unwrap();
    }
}

async fn silent_server_times_out(backend: ServerKind) {
    let Some(store) = store(backend).await else {
        return;
    };
    let ns = Ns::new();
    let good = start_service(&store, &ns, "good").await;
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            held.push(conn);
        }
    });
    recipe::register(
        &store,
        &ns.services,
        "silent",
        &Liveness::grpc(&silent_addr.to_string()).unwrap(),
    )
    .await
    .unwrap();
    add_units(&store, &ns, &unit_names(4)).await;
    let d = Distributor::new(store.clone(), ns.config()).unwrap();
    // The probe itself: the silent service is down for want of an answer, after the timeout.
    let registered = d.registered().await.unwrap();
    let start = Instant::now();
    let health = d.probe(&registered).await;
    let took = start.elapsed();
    assert!(took >= PING_TIMEOUT - Duration::from_millis(20), "{took:?}");
    assert!(took < PING_TIMEOUT + SLACK, "probe took {took:?}");
    let silent_health = &health[registered.iter().position(|s| s.name == "silent").unwrap()];
    match silent_health {
        recipe::Health::Down(why) => assert!(
            why.contains("within") || why.contains("timeout") || why.contains("Timeout"),
            "{why}"
        ),
        other => panic!("silent server: {other:?}"),
    }
    let start = Instant::now();
    let outcome = d.poll().await.unwrap();
    let took = start.elapsed();
    assert!(
        matches!(outcome, PollOutcome::Written { .. }),
        "{outcome:?}"
    );
    assert!(took < PING_TIMEOUT + SLACK, "poll took {took:?}");
    let t = recipe::read_table(&store, &ns.dist).await.unwrap().unwrap();
    assert!(t.down.contains("silent"), "{t:?}");
    assert_eq!(t.units_of("good").len(), 4);
    holder.abort();
    good.shutdown().await.unwrap();
}

async fn bad_input(backend: ServerKind) {
    let Some(store) = store(backend).await else {
        return;
    };
    let ns = Ns::new();
    let d = Distributor::new(store.clone(), ns.config()).unwrap();
    // No services, no units: nothing to write.
    assert_eq!(
        d.poll().await.unwrap(),
        PollOutcome::Unchanged { version: 0 }
    );
    // Units but no service: no table rather than a table without owners.
    add_units(&store, &ns, &unit_names(5)).await;
    assert_eq!(
        d.poll().await.unwrap(),
        PollOutcome::KeptNoHealthyService { version: 0 }
    );
    assert!(recipe::read_table(&store, &ns.dist)
        .await
        .unwrap()
        .is_none());

    // Duplicate registrations are no-ops; a new address replaces the old one.
    let server = start_service(&store, &ns, "one").await;
    let live = Liveness::grpc(&server.address()).unwrap();
    assert_eq!(
        recipe::register(&store, &ns.services, "one", &live)
            .await
            .unwrap(),
        Registration::Unchanged
    );
    // Bad addresses are refused at registration...
    let err = Liveness::grpc("not an address").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    // ...and one written behind our back counts as down.
    store
        .compare_and_set(
            &recipe::service_key(&ns.services, "broken"),
            None,
            "http://nope",
            None,
        )
        .await
        .unwrap();
    let PollOutcome::Written { version, .. } = d.poll().await.unwrap() else {
        panic!("expected a first table");
    };
    let t = recipe::read_table(&store, &ns.dist).await.unwrap().unwrap();
    assert_eq!(t.version, version);
    assert!(t.down.contains("broken"));
    assert_eq!(t.units_of("one").len(), 5);
    // Comma in names round-trips through the per-service record.
    let a = recipe::read_assignment(&store, &ns.dist, "one")
        .await
        .unwrap()
        .unwrap();
    let mut got = a.units.clone();
    got.sort();
    let mut want = unit_names(5);
    want.sort();
    assert_eq!(got, want);

    // Every service down: the last good table stays. One failed ping moves nothing (the
    // default `down_after` is 2); the second finds no healthy service.
    server.shutdown().await.unwrap();
    assert_eq!(d.poll().await.unwrap(), PollOutcome::Unchanged { version });
    assert_eq!(
        d.poll().await.unwrap(),
        PollOutcome::KeptNoHealthyService { version }
    );
    let kept = recipe::read_table(&store, &ns.dist).await.unwrap().unwrap();
    assert_eq!(kept, t);

    // No units left: every service gets an empty list (a valid table).
    let again = start_service(&store, &ns, "one").await;
    for u in unit_names(5) {
        recipe::remove_unit(&store, &ns.units, &u).await.unwrap();
    }
    d.poll().await.unwrap();
    let empty = recipe::read_table(&store, &ns.dist).await.unwrap().unwrap();
    assert!(empty.services.values().all(Vec::is_empty), "{empty:?}");
    assert_eq!(
        recipe::read_assignment(&store, &ns.dist, "one")
            .await
            .unwrap()
            .unwrap()
            .units,
        Vec::<String>::new()
    );

    // A foreign value at the table key: a typed error, and it is not overwritten.
    let key = recipe::table_key(&ns.dist);
    store.delete(&key).await.unwrap();
    store
        .compare_and_set(&key, None, "a,b,c", None)
        .await
        .unwrap();
    assert_eq!(d.poll().await.unwrap_err().kind(), ErrorKind::ForeignValue);
    assert_eq!(store.get(&key).await.unwrap().as_deref(), Some("a,b,c"));
    // Repaired by deleting it: the next table starts above the records' versions, so the
    // records follow it instead of ignoring it as older.
    store.delete(&key).await.unwrap();
    let before = recipe::read_assignment(&store, &ns.dist, "one")
        .await
        .unwrap()
        .unwrap()
        .version;
    let PollOutcome::Written { version, .. } = d.poll().await.unwrap() else {
        panic!("expected a table after the repair");
    };
    assert!(version > before, "{version} after records at {before}");
    assert_eq!(
        recipe::read_assignment(&store, &ns.dist, "one")
            .await
            .unwrap()
            .unwrap()
            .version,
        version
    );
    again.shutdown().await.unwrap();
}

async fn heartbeat_liveness(backend: ServerKind) {
    let Some(store) = store(backend).await else {
        return;
    };
    let ns = Ns::new();
    let grpc = start_service(&store, &ns, "grpc").await;
    recipe::register(&store, &ns.services, "beats", &Liveness::Heartbeat)
        .await
        .unwrap();
    add_units(&store, &ns, &unit_names(6)).await;
    // etcd leases are whole seconds with a server minimum: 2 s works everywhere.
    let ttl = Duration::from_secs(2);
    let hb = recipe::spawn_heartbeat(store.clone(), ns.services.clone(), "beats".into(), ttl)
        .await
        .unwrap();
    let running = Distributor::new(store.clone(), ns.config())
        .unwrap()
        .spawn();
    let bound = POLL + PING_TIMEOUT + SLACK;
    wait_for(&store, &ns, bound, "heartbeat service included", |t| {
        counts(t) == [3, 3]
    })
    .await;
    hb.stop();
    wait_for(&store, &ns, ttl + bound, "heartbeat expired", |t| {
        t.down.contains("beats") && t.units_of("grpc").len() == 6
    })
    .await;
    running.stop().await;
    grpc.shutdown().await.unwrap();
}

// Which backends: the `distributor` row of the table in headcount_harness::scenario_tests.
headcount_harness::scenario_tests!(distributor, workers = 2: [
    failover_and_return,
    two_distributors_and_unit_changes,
    silent_server_times_out,
    bad_input,
    heartbeat_liveness,
]);
