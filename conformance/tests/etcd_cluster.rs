//! Every conformance case against a 3-member etcd cluster: `HEADCOUNT_TEST_ETCD_CLUSTER_URL`, or
//! three `etcd` members the harness starts, with every member as an endpoint.
#![cfg(feature = "etcd")]

headcount_harness::conformance_tests!(
    etcd_cluster,
    headcount_harness::ServerKind::EtcdCluster,
    cluster
);
