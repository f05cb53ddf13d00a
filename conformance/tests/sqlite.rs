//! Every conformance case against SQLite: a database file in a temp dir (or
//! `HEADCOUNT_TEST_SQLITE_URL`). The fault cases are generated `#[ignore]`d: an embedded
//! store has no server process to kill or pause.
#![cfg(feature = "sqlite")]

headcount_harness::conformance_tests!(sqlite, headcount_harness::ServerKind::Sqlite, embedded);
