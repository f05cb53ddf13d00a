//! Every conformance case against a one-member etcd: `HEADCOUNT_TEST_ETCD_URL`, or an `etcd` the
//! harness starts (one shared, plus one per fault case).
#![cfg(feature = "etcd")]

headcount_conformance::conformance_tests!(etcd, headcount_conformance::harness::ServerKind::Etcd);
