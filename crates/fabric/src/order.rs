//! A full memory barrier that costs less than `fence(SeqCst)` on x86-64.
//!
//! Rust compiles `fence(SeqCst)` to `mfence` there. A locked read-modify-write is as strong a
//! barrier for ordinary (write-back) memory and, on this machine's AMD EPYC, costs several
//! times less after a store (measured with a loop of one store and one barrier; figures in
//! the commit that added this), which is why Linux's `smp_mb()` is one. weft's copies that use non-temporal stores end with their own `sfence`
//! (glibc's `memcpy` does), so every store a barrier must order is an ordinary one.

/// Orders every load and store of this thread before it with every load and store after it,
/// as seen by other threads and processes (as `fence(SeqCst)` does for ordinary memory).
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// // Dekker's pattern: raise my flag, then look at the other's.
/// let (mine, theirs) = (AtomicU64::new(0), AtomicU64::new(0));
/// mine.store(1, Ordering::Relaxed);
/// weft_fabric::order::full_fence(); // my store is visible before my load below
/// let other_is_in = theirs.load(Ordering::Relaxed) != 0;
/// # assert!(!other_is_in);
/// ```
#[inline(always)]
pub fn full_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a locked OR of 0 into the 8 bytes below the stack pointer (the red zone, this
    // thread's own mapped stack, which the System V ABI lets a function use without moving
    // the pointer) writes back the value it reads, atomically, so no thread or signal handler
    // can see a change; it clobbers only the flags, which `asm!` treats as clobbered unless
    // told otherwise, and as it may touch memory the compiler keeps memory accesses on their
    // side of it.
    unsafe {
        std::arch::asm!("lock or qword ptr [rsp - 8], 0", options(nostack));
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::full_fence;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    /// The store-buffering litmus test: each thread stores its flag, fences, loads the
    /// other's. Without a full barrier x86 lets both loads miss the other's store (each
    /// still sat in its core's store buffer); with one, at least one load sees it. The two
    /// threads start each round together by spinning on a shared counter.
    #[test]
    fn stores_are_visible_before_later_loads() {
        const ROUNDS: u64 = 2_000_000;
        let (x, y, sync) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
        let side = |me: &AtomicU64, other: &AtomicU64| -> Vec<u64> {
            let mut seen = vec![0; ROUNDS as usize];
            for r in 0..ROUNDS {
                sync.fetch_add(1, Relaxed);
                // Spins, and yields the core now and then: on a busy machine the other
                // thread may need it to get here.
                let mut spins = 0u32;
                while sync.load(Relaxed) < 2 * (r + 1) {
                    spins = spins.wrapping_add(1);
                    match spins % 1024 {
                        0 => std::thread::yield_now(),
                        _ => std::hint::spin_loop(),
                    }
                }
                me.store(r + 1, Relaxed);
                full_fence();
                seen[r as usize] = other.load(Relaxed);
            }
            seen
        };
        let (a, b) = std::thread::scope(|s| {
            let t = s.spawn(|| side(&x, &y));
            let b = side(&y, &x);
            (t.join().unwrap(), b)
        });
        // In round r both stored r + 1: a load that saw at most r missed this round's store.
        let missed = (0..ROUNDS).filter(|&r| a[r as usize] <= r && b[r as usize] <= r).count();
        assert_eq!(missed, 0, "{missed} of {ROUNDS} rounds: both loads passed the stores before them");
    }
}
