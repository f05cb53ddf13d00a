//! PostgreSQL through PgBouncer in transaction mode, with a pool of two server connections that
//! every store connection takes turns on: every conformance case. PgBouncer is started by the
//! harness in front of a PostgreSQL server of its own (one shared, plus one pair per fault case,
//! whose faults hit the server behind PgBouncer), or `HEADCOUNT_TEST_PGBOUNCER_URL` names one.
//!
//! A test whose servers are missing prints `SKIP` and passes, unless `HEADCOUNT_REQUIRE_BACKENDS`
//! requires `pgbouncer` (`all` does): then it fails.
#![cfg(feature = "postgres")]

headcount_conformance::conformance_tests!(
    pgbouncer,
    headcount_conformance::harness::ServerKind::PgBouncer
);
