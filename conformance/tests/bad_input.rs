//! Bad input against real servers: the Redis backend pointed at an etcd port, a wrong Redis
//! password, a Redis list where headcount expects a string; and, for every networked backend, a
//! port that refuses connections or a server that never answers. Each is a clear typed error
//! within the deadline: no panic, no hang, no password in it.
#![cfg(all(feature = "redis", feature = "etcd"))]
// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use headcount::ErrorKind;
use headcount_harness::{skip_unless_required, KvStore, ServerKind, Unavailable};

/// A dedicated store, or None (with a SKIP line) when the server is not installed.
fn start(backend: ServerKind, f: fn() -> Result<KvStore, Unavailable>) -> Option<KvStore> {
    skip_unless_required(backend, "bad_input", f())
}

/// Sends one inline command to a Redis server and returns the first reply line.
fn redis_raw(port: u16, command: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(format!("{command}\r\n").as_bytes()).unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_pointed_at_etcd_is_rejected_quickly() {
    let Some(etcd) = start(ServerKind::Etcd, || KvStore::etcd(1, None)) else {
        return;
    };
    let port = etcd.servers[0].port;
    let started = Instant::now();
    let err = headcount::connect(&format!("redis://127.0.0.1:{port}?timeout=3s"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Rejected, "{err}");
    assert!(err.to_string().contains("RESP"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_redis_password_is_rejected_and_a_list_is_a_foreign_value() {
    let Some(redis) = start(ServerKind::Redis, || KvStore::redis(None)) else {
        return;
    };
    let port = redis.servers[0].port;

    // A list at one of our keys: headcount wrote the key (so its listing knows it), then another
    // client replaced it with a Redis list.
    let url = format!("redis://127.0.0.1:{port}?timeout=3s");
    let store = headcount::connect(&url).await.unwrap();
    let k = "hc:{g}:list";
    assert!(store.compare_and_set(k, None, "x", None).await.unwrap());
    // A list at a key headcount never wrote is not in its index: the listing does not see it.
    assert!(redis_raw(port, "RPUSH hc:{g}:never-written a b").starts_with(':'));
    assert_eq!(
        store.list("hc:{g}:").await.unwrap(),
        vec![(k.to_owned(), "x".to_owned())]
    );
    assert!(redis_raw(port, "DEL hc:{g}:list").starts_with(":1"));
    assert!(redis_raw(port, "RPUSH hc:{g}:list a b").starts_with(':'));
    for (what, result) in [
        ("get", store.get(k).await.map(|_| ())),
        ("incr", store.incr(k, None).await.map(|_| ())),
        ("set_max", store.set_max(k, 5, None).await.map(|_| ())),
        (
            "compare_and_set",
            store
                .compare_and_set(k, Some("a"), "b", None)
                .await
                .map(|_| ()),
        ),
        ("list", store.list("hc:{g}:").await.map(|_| ())),
    ] {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ForeignValue, "{what}: {err}");
    }
    assert!(redis_raw(port, "TYPE hc:{g}:list").starts_with("+list"));

    // A wrong password, then none at all, once the server requires one.
    assert!(redis_raw(port, "CONFIG SET requirepass right-one").starts_with("+OK"));
    for url in [
        format!("redis://:hunter22@127.0.0.1:{port}?timeout=3s"),
        format!("redis://alice:hunter22@127.0.0.1:{port}?timeout=3s"),
        format!("redis://127.0.0.1:{port}?timeout=3s"),
    ] {
        let started = Instant::now();
        let err = headcount::connect(&url).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Rejected, "{url}: {err}");
        assert!(!format!("{err} {err:?}").contains("hunter22"), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }
    let ok = headcount::connect(&format!("redis://:right-one@127.0.0.1:{port}?timeout=3s"))
        .await
        .unwrap();
    assert_eq!(ok.incr("hc:{g}:n", None).await.unwrap(), 1);
}

/// A URL with a password for every networked backend, at `127.0.0.1:{port}` with `timeout`.
fn urls_with_a_password(port: u16, timeout: &str) -> Vec<String> {
    let mut urls = vec![
        format!("redis://:hunter22@127.0.0.1:{port}/0?timeout={timeout}"),
        format!("etcd://root:hunter22@127.0.0.1:{port}?timeout={timeout}"),
    ];
    if cfg!(feature = "postgres") {
        urls.push(format!(
            "postgres://u:hunter22@127.0.0.1:{port}/db?timeout={timeout}&sslmode=disable"
        ));
    }
    urls
}

#[tokio::test]
async fn a_refused_connection_is_retryable_and_never_shows_the_password() {
    // Port 1 on loopback: refused at once on any sane machine.
    for url in urls_with_a_password(1, "2s") {
        let err = headcount::connect(&url).await.unwrap_err();
        assert!(err.is_retryable(), "{url}: {err}");
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("hunter22"), "{url}: {shown}");
    }
}

#[tokio::test]
async fn a_silent_server_times_out_within_the_deadline() {
    // A listener that accepts but never answers, like a stopped server.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    for url in urls_with_a_password(port, "300ms") {
        let started = Instant::now();
        let err = headcount::connect(&url).await.unwrap_err();
        assert!(err.is_retryable(), "{url}: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{url}: {:?}",
            started.elapsed()
        );
        assert!(!format!("{err} {err:?}").contains("hunter22"), "{url}");
    }
    hold.abort();
}
