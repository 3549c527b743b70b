//! Memory per entry: a counting global allocator, and the caches filled under it.

use super::*;

/// Counts the bytes the process has allocated while `COUNTING` is on.
pub(crate) struct Counting;

pub(crate) static COUNTING: AtomicBool = AtomicBool::new(false);
pub(crate) static NET_BYTES: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is forwarded to `System` with the same arguments; the counter is a side
// effect that allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() && COUNTING.load(Ordering::Relaxed) {
            NET_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            NET_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        }
        // SAFETY: forwarded from the caller, who allocated `ptr` with `layout` here.
        unsafe { System.dealloc(ptr, layout) };
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded from the caller, who allocated `ptr` with `layout` here.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() && COUNTING.load(Ordering::Relaxed) {
            NET_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
pub(crate) static ALLOCATOR: Counting = Counting;

/// Net bytes allocated while `fill` runs, per entry.
pub(crate) fn bytes_per_entry(entries: u64, fill: impl FnOnce()) -> f64 {
    NET_BYTES.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::SeqCst);
    fill();
    COUNTING.store(false, Ordering::SeqCst);
    NET_BYTES.load(Ordering::Relaxed) as f64 / entries as f64
}

pub(crate) fn memory(rows: &mut Vec<Row>) {
    const N: u64 = 100_000;
    let runcache = {
        let c = runcache::Cache::<u64, u64>::new(2 * N);
        let b = bytes_per_entry(N, || {
            (0..N).for_each(|k| {
                c.insert(k, k).expect("the capacity holds every entry");
            })
        });
        drop(c);
        b
    };
    let quick = {
        let c = quick_cache::sync::Cache::<u64, u64>::new(2 * N as usize);
        bytes_per_entry(N, || (0..N).for_each(|k| c.insert(k, k)))
    };
    let moka = {
        let c = moka::sync::Cache::<u64, u64>::new(2 * N);
        bytes_per_entry(N, || {
            (0..N).for_each(|k| c.insert(k, k));
            c.run_pending_tasks();
        })
    };
    let papaya = {
        let c = papaya::HashMap::<u64, u64>::new();
        bytes_per_entry(N, || {
            (0..N).for_each(|k| {
                c.pin().insert(k, k);
            })
        })
    };
    let dash = {
        let c = dashmap::DashMap::<u64, u64>::new();
        bytes_per_entry(N, || {
            (0..N).for_each(|k| {
                c.insert(k, k);
            })
        })
    };
    let unsync = {
        let mut c = HashMap::<u64, u64, Hasher>::with_hasher(Hasher::default());
        let b = bytes_per_entry(N, || {
            (0..N).for_each(|k| {
                c.insert(k, k);
            })
        });
        black_box(&c);
        b
    };
    // The same with what each cache allocates when it is built for its capacity (200k
    // entries): quick_cache's table, runcache's sketch and ghost, moka's sketch. The maps
    // have no capacity and allocate almost nothing up front, so they are not in this row.
    // `keys` distinct keys are inserted; the bytes are divided by `N`, the entries held.
    fn built_and_filled<C>(keys: u64, build: impl FnOnce() -> C, insert: impl Fn(&C, u64)) -> f64 {
        let mut keep = None;
        let b = bytes_per_entry(N, || {
            let c = build();
            (0..keys).for_each(|k| insert(&c, k));
            keep = Some(c);
        });
        drop(keep);
        b
    }
    let built = [
        built_and_filled(
            N,
            || runcache::Cache::<u64, u64>::new(2 * N),
            |c, k| {
                c.insert(k, k).expect("the capacity holds every entry");
            },
        ),
        built_and_filled(
            N,
            || quick_cache::sync::Cache::<u64, u64>::new(2 * N as usize),
            |c, k| c.insert(k, k),
        ),
        built_and_filled(
            N,
            || moka::sync::Cache::<u64, u64>::new(2 * N),
            |c, k| {
                c.insert(k, k);
                if k == N - 1 {
                    c.run_pending_tasks();
                }
            },
        ),
    ];
    rows.push(Row {
        workload: "memory per entry (u64 → u64, 100k entries), bytes".to_string(),
        unit: "B",
        runcache,
        peers: vec![
            ("quick_cache", quick),
            ("moka", moka),
            ("papaya", papaya),
            ("dashmap", dash),
            ("HashMap", unsync),
        ],
        higher_is_better: false,
    });
    rows.push(Row {
        workload: "memory per entry with the cache's construction (capacity 200k), bytes"
            .to_string(),
        unit: "B",
        runcache: built[0],
        peers: vec![("quick_cache", built[1]), ("moka", built[2])],
        higher_is_better: false,
    });
    // After churn: a full cache of N entries that has evicted nine times its capacity keeps
    // what its evictions left behind (dead table entries, queue slots, garbage not yet
    // reclaimed) on top of the live entries.
    const CHURNED: u64 = 10 * N;
    let after_churn = [
        built_and_filled(
            CHURNED,
            || runcache::Cache::<u64, u64>::new(N),
            |c, k| {
                c.insert(k, k).expect("an evicting cache makes room");
            },
        ),
        built_and_filled(
            CHURNED,
            || quick_cache::sync::Cache::<u64, u64>::new(N as usize),
            |c, k| c.insert(k, k),
        ),
        built_and_filled(
            CHURNED,
            || moka::sync::Cache::<u64, u64>::new(N),
            |c, k| {
                c.insert(k, k);
                if k == CHURNED - 1 {
                    c.run_pending_tasks();
                }
            },
        ),
    ];
    rows.push(Row {
        workload: "memory per entry after churn (capacity 100k, 1M keys inserted), bytes"
            .to_string(),
        unit: "B",
        runcache: after_churn[0],
        peers: vec![("quick_cache", after_churn[1]), ("moka", after_churn[2])],
        higher_is_better: false,
    });
}
