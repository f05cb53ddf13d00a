//! etcd with authentication on and JWT auth tokens that expire after 2 s: a store that logs in
//! with a user and password keeps working across several token lifetimes (the client logs in
//! again when the server says its token expired), and a group member stays active through them.
#![cfg(feature = "etcd")]
// Tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::{Duration, Instant};

use headcount::recipes::group::{Group, GroupConfig, GroupPhase};
use headcount_harness::{skip_unless_required, KvStore, ServerKind};

/// The auth tokens' lifetime.
const TOKEN_TTL: Duration = Duration::from_secs(2);

/// A one-member etcd signing JWT auth tokens with the test key pair in `testdata/etcd-jwt`, or
/// None (with a SKIP line) when etcd is not installed.
fn start() -> Option<KvStore> {
    let keys = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/etcd-jwt");
    let token = format!(
        "jwt,pub-key={},priv-key={},sign-method=RS256,ttl={}s",
        keys.join("public.pem").display(),
        keys.join("private.pem").display(),
        TOKEN_TTL.as_secs()
    );
    let started = KvStore::etcd_with(1, None, &["--auth-token", &token]);
    skip_unless_required(ServerKind::Etcd, "etcd_auth", started)
}

/// Adds the `root` user (password `secret`, role `root`) and turns authentication on.
async fn enable_auth(port: u16) {
    let mut c = etcd_client::Client::connect([format!("http://127.0.0.1:{port}")], None)
        .await
        .unwrap();
    c.user_add("root", "secret", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.auth_enable().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_and_a_member_outlive_their_auth_tokens() {
    let Some(etcd) = start() else { return };
    enable_auth(etcd.servers[0].port).await;

    // Without credentials the server refuses, with a permanent error.
    let refused = match headcount::connect(&etcd.url()).await {
        Err(e) => e,
        Ok(store) => store.incr("hc:auth:n", None).await.unwrap_err(),
    };
    assert!(!refused.is_retryable(), "{refused}");

    let url = etcd.url().replacen("etcd://", "etcd://root:secret@", 1);
    let store = headcount::connect(&url).await.unwrap();
    let member = Group::join(
        store.clone(),
        GroupConfig::new("auth", Duration::from_secs(3)),
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(10), member.active(0))
        .await
        .expect("active in time")
        .unwrap();
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < 4 * TOKEN_TTL {
        n += 1;
        let got = store
            .incr("hc:auth:n", None)
            .await
            .unwrap_or_else(|e| panic!("incr {n}, {:?} after the first: {e}", start.elapsed()));
        assert_eq!(got, n);
        let a = member.assignment();
        assert_eq!(
            a.phase,
            GroupPhase::Active,
            "{:?} after the member became active: {a:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    member.leave().await.unwrap();
}
