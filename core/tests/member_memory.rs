//! What a member of a group with 65,536 declared partitions keeps in memory as views come and
//! go, measured with a counting allocator on Tokio's paused time: the views it remembers for its
//! fencing tokens are bounded, so forty view changes leave its memory where one left it.
// Tests fail by panicking.
#![allow(unsafe_code, clippy::expect_used, clippy::panic, clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

mod paused_group;
use paused_group::{converged, Fixture};

/// Bytes allocated and not yet freed, by the whole process.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call is passed on to the system allocator unchanged; only a counter is kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: the caller's contract is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const PARTITIONS: u32 = 65_536;

fn mib(bytes: isize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[tokio::test(start_paused = true)]
async fn forty_view_changes_leave_a_member_with_65536_partitions_where_one_left_it() {
    let f = Fixture::new();
    let config = |id: &str| f.config(id).with_partitions(PARTITIONS);
    let before = LIVE.load(Ordering::Relaxed);
    let a = f.join(config("a")).await;
    let b = f.join(config("b")).await;
    converged(&[&a, &b]).await;
    // A third member joins and leaves, once to warm up, then twenty times: forty views.
    let c = f.join(config("c")).await;
    converged(&[&a, &b, &c]).await;
    c.leave().await.unwrap();
    converged(&[&a, &b]).await;
    let warm = LIVE.load(Ordering::Relaxed);
    for _ in 0..20 {
        let c = f.join(config("c")).await;
        converged(&[&a, &b, &c]).await;
        c.leave().await.unwrap();
        converged(&[&a, &b]).await;
    }
    let after = LIVE.load(Ordering::Relaxed);
    eprintln!(
        "two members and the store: {:.1} MiB after the first changes, {:.1} MiB after forty more view changes",
        mib(warm - before),
        mib(after - before)
    );
    // Each remembered view of this size costs about a megabyte: 64 of them, as before, would
    // add tens of MiB per member.
    assert!(
        after - warm < 8 << 20,
        "grew {:.1} MiB over forty view changes",
        mib(after - warm)
    );
    a.leave().await.unwrap();
    b.leave().await.unwrap();
}
