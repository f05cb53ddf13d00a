//! The check of a recorded history of ID calls, shared by the majority-IDs tests on real servers
//! (`conformance/tests/ids.rs`, `cli/tests/ids_serve.rs`).

use std::collections::HashSet;

use tokio::time::Instant;

/// One ID a client got (or a call that got none: `id` is `None`), as the client saw the call. A
/// call that took a block of IDs is one entry per ID, in the block's order, with the call's
/// times.
#[derive(Debug, Clone)]
pub struct IdCall {
    /// Which client made the call.
    pub client: usize,
    /// When the call was sent.
    pub start: Instant,
    /// When its answer arrived.
    pub end: Instant,
    /// The ID, or `None` for a call that failed.
    pub id: Option<i64>,
}

/// Panics unless every returned ID is unique, each client's IDs increase, and every ID is
/// greater than every ID whose call completed before its call started (linearizability of a
/// counter).
pub fn check_id_history(calls: &[IdCall]) {
    let ok: Vec<&IdCall> = calls.iter().filter(|c| c.id.is_some()).collect();
    let mut seen = HashSet::new();
    for c in &ok {
        assert!(seen.insert(c.id), "ID {:?} was returned twice", c.id);
    }
    let clients: HashSet<usize> = ok.iter().map(|c| c.client).collect();
    for client in clients {
        // A stable sort keeps a block's IDs in their order.
        let mut mine: Vec<&&IdCall> = ok.iter().filter(|c| c.client == client).collect();
        mine.sort_by_key(|c| c.start);
        for pair in mine.windows(2) {
            assert!(
                pair[0].id < pair[1].id,
                "client {client} got {:?} then {:?}",
                pair[0].id,
                pair[1].id
            );
        }
    }
    // Sorted by completion: the largest ID among the calls that completed before a start.
    let mut by_end = ok.clone();
    by_end.sort_by_key(|c| c.end);
    let mut prefix_max = Vec::with_capacity(by_end.len());
    let mut max = i64::MIN;
    for c in &by_end {
        max = max.max(c.id.unwrap_or(i64::MIN));
        prefix_max.push(max);
    }
    for c in &ok {
        let before = by_end.partition_point(|d| d.end < c.start);
        if before > 0 {
            let floor = prefix_max[before - 1];
            assert!(
                c.id.unwrap_or(i64::MIN) > floor,
                "linearizability: client {} got {:?}, but {floor} was returned before its call started",
                c.client,
                c.id
            );
        }
    }
}
