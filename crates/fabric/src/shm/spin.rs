//! A small lock for the ring ends: taken with plain loads and stores by the thread that holds
//! the fabric's [`Bias`] (no locked instruction while one thread communicates), released with
//! a plain release store (so unlocking never waits for the message just written to leave the
//! store buffer), and yielding the processor when contended (oversubscribed jobs keep moving).

use super::bias::Bias;
use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// A spin-then-yield lock.
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `value` to one holder at a time (acquire/release on
// `locked`), so sharing the lock across threads is sound when T can move between threads.
unsafe impl<T: Send> Sync for SpinLock<T> {}

/// Access to the locked value; unlocks on drop.
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> SpinLock<T> {
    pub fn new(value: T) -> Self {
        SpinLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    /// Takes the lock if it is free: with plain loads and stores where this thread holds the
    /// fabric's `bias`, with a compare-and-swap otherwise. Every acquisition of this lock must
    /// go through the same `bias`.
    #[inline]
    pub fn try_lock(&self, bias: &Bias) -> Option<SpinGuard<'_, T>> {
        if let Some(_plain) = bias.plain() {
            // Acquire: a thread that held the bias on loan, or its lender, may have released
            // the lock last (a plain load on x86).
            if self.locked.load(Ordering::Acquire) {
                return None; // held by this very thread further up its stack, or by the lender
            }
            self.locked.store(true, Ordering::Relaxed);
            return Some(SpinGuard { lock: self });
        }
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| SpinGuard { lock: self })
    }

    /// Takes the lock, waiting while another thread holds it.
    #[inline]
    pub fn lock(&self, bias: &Bias) -> SpinGuard<'_, T> {
        let mut spins = 0u32;
        loop {
            if let Some(g) = self.try_lock(bias) {
                return g;
            }
            while self.locked.load(Ordering::Relaxed) {
                relax(&mut spins);
            }
        }
    }
}

/// One turn of waiting on another thread: spin for the first 128 turns, then give the
/// processor away (the thread waited on may need it).
pub(super) fn relax(spins: &mut u32) {
    *spins += 1;
    if *spins < 128 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: holding the guard means holding the lock: no other reference exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, and the guard is borrowed mutably.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}
