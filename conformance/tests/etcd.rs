//! Every conformance case against a one-member etcd: `HEADCOUNT_TEST_ETCD_URL`, or an `etcd` the
//! harness starts (one shared, plus one per fault case).
#![cfg(feature = "etcd")]

headcount_harness::conformance_tests!(etcd, headcount_harness::ServerKind::Etcd);
