//! Every conformance case against PostgreSQL: `HEADCOUNT_TEST_POSTGRES_URL`, or a server the
//! harness starts from the installed binaries (one shared, plus one per fault case).
#![cfg(feature = "postgres")]

headcount_harness::conformance_tests!(postgres, headcount_harness::ServerKind::Postgres);
