//! Fixed-size slots carved out of one registered region: staging buffers for transfers from
//! or into memory the NIC cannot reach, AM send buffers, and atomic operands and results.

use std::sync::Mutex;

/// `count` slots of `slot` bytes starting at `base` (an address inside a registered region).
pub struct Slab {
    base: usize,
    slot: usize,
    count: usize,
    free: Mutex<Vec<u32>>,
}

impl Slab {
    /// Slots of `slot` bytes over `[base, base + slot * count)`.
    pub fn new(base: usize, slot: usize, count: usize) -> Self {
        Slab { base, slot, count, free: Mutex::new((0..count as u32).rev().collect()) }
    }
    /// A free slot, or `None` while all are in use.
    pub fn take(&self) -> Option<u32> {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }
    /// Returns slot `i`.
    pub fn give(&self, i: u32) {
        debug_assert!((i as usize) < self.count);
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(i);
    }
    /// Address of slot `i`.
    pub fn addr(&self, i: u32) -> usize {
        self.base + i as usize * self.slot
    }
    /// Slots in total.
    pub fn count(&self) -> usize {
        self.count
    }
    /// Slots in use.
    pub fn in_use(&self) -> usize {
        self.count - self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_come_back() {
        let s = Slab::new(4096, 64, 3);
        let a = s.take().unwrap();
        let b = s.take().unwrap();
        let c = s.take().unwrap();
        assert!(s.take().is_none());
        assert_eq!(s.in_use(), 3);
        assert_eq!(s.addr(a), 4096);
        assert_eq!(s.addr(c), 4096 + 128);
        s.give(b);
        assert_eq!(s.take(), Some(b));
    }
}
