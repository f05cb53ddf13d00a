//! Every conformance case against headcount's in-memory store (`memory://conformance`, one
//! store shared by the cases of this process). The fault cases are generated `#[ignore]`d: there
//! is no server process to kill or pause.

headcount_harness::conformance_tests!(memory, headcount_harness::ServerKind::Memory, embedded);
