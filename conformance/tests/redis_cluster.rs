//! Every conformance case against a Redis Cluster: `HEADCOUNT_TEST_REDIS_CLUSTER_URL`, or three
//! `redis-server` primaries the harness joins with `redis-cli --cluster create`.
#![cfg(feature = "redis")]

headcount_harness::conformance_tests!(redis_cluster, headcount_harness::ServerKind::RedisCluster);
