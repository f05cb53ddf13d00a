//! Lookups allocate nothing: a counting global allocator watches them.
//!
//! Only this thread's allocations count: the test harness's own threads may allocate while it
//! runs (they did on a loaded machine).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use headcount_core::assign::{hash_u64, AssignorKind, Topology};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    // try_with: a thread being torn down has no thread-locals left; its allocations do not
    // matter here.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn lookups_do_not_allocate() {
    let keys: Vec<u64> = (0..20_000).map(hash_u64).collect();
    let names: Vec<String> = (0..2_000).map(|i| format!("task-{i}")).collect();
    for n in [10u32, 100, 1000] {
        let all_live = Topology::new(n).unwrap();
        // Half dead, every other slot: at most 32 dead slots in a row is the jump-with-failover
        // limit for staying on the stack, far beyond what half dead produces in practice.
        let half_dead = Topology::from_live(n, (0..n).filter(|s| s % 2 == 0)).unwrap();
        for kind in AssignorKind::ALL {
            for topology in [&all_live, &half_dead] {
                let a = kind.build(topology).unwrap();
                let before = allocations();
                let mut sum = 0u64;
                for &k in &keys {
                    sum = sum.wrapping_add(u64::from(a.owner(k)));
                }
                for name in &names {
                    sum = sum.wrapping_add(u64::from(a.owner_of_bytes(name.as_bytes())));
                }
                let after = allocations();
                assert_eq!(after, before, "{kind} at {n} slots allocated (sum {sum})");
            }
        }
    }
}
