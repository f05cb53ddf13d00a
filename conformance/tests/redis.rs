//! Every conformance case against one Redis server: `HEADCOUNT_TEST_REDIS_URL`, or a
//! `redis-server` the harness starts (one shared, plus one per fault case).
#![cfg(feature = "redis")]

headcount_harness::conformance_tests!(redis, headcount_harness::ServerKind::Redis);
