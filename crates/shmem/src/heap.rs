//! The symmetric heap's allocator: byte offsets in one segment, handed out first-fit.
//!
//! Every PE runs the same allocator over a segment of the same size, and OpenSHMEM requires
//! every PE to make the same sequence of collective allocation calls with the same
//! arguments, so the same call gives the same offset everywhere: an object's offset is its
//! symmetric address. (The calls are checked to agree: see `crate::setup`.)

use std::collections::BTreeMap;

/// Alignment of what `shmem_malloc` returns: enough for every C type (`long double`,
/// `max_align_t`) and a cache line apart, so that two objects never share one.
pub const MALLOC_ALIGN: usize = 64;

/// Free and used byte ranges of a heap of `size` bytes.
#[derive(Debug)]
pub struct Heap {
    size: usize,
    /// Free ranges: start → length (never two adjacent).
    free: BTreeMap<usize, usize>,
    /// Allocated ranges: start → length.
    used: BTreeMap<usize, usize>,
}

impl Heap {
    /// A heap of `size` bytes, all free.
    pub fn new(size: usize) -> Self {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        Heap { size, free, used: BTreeMap::new() }
    }

    /// Bytes in the heap.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes allocated now (rounded up as allocations are).
    pub fn used_bytes(&self) -> usize {
        self.used.values().sum()
    }

    /// The offset of `len` fresh bytes aligned to `align` (a power of two), or `None` when
    /// no free range holds them.
    pub fn alloc(&mut self, len: usize, align: usize) -> Option<usize> {
        if !align.is_power_of_two() {
            return None;
        }
        // Multiples of the allocation alignment keep the next object aligned too.
        let len = len.max(1).checked_next_multiple_of(MALLOC_ALIGN)?;
        let (start, at, flen) = self.free.iter().find_map(|(&start, &flen)| {
            let at = start.checked_next_multiple_of(align)?;
            let end = at.checked_add(len)?;
            (end <= start + flen).then_some((start, at, flen))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        let tail = start + flen - (at + len);
        if tail > 0 {
            self.free.insert(at + len, tail);
        }
        self.used.insert(at, len);
        Some(at)
    }

    /// Bytes held by the allocation at `off`, if one starts there.
    pub fn len_of(&self, off: usize) -> Option<usize> {
        self.used.get(&off).copied()
    }

    /// Frees the allocation at `off`; false when no allocation starts there (a double free
    /// or an address that was never returned).
    pub fn free(&mut self, off: usize) -> bool {
        let Some(len) = self.used.remove(&off) else { return false };
        self.release(off, len);
        true
    }

    /// Grows or shrinks the allocation at `off` to `len` bytes where it stands, if the free
    /// range after it allows; true on success.
    pub fn resize_in_place(&mut self, off: usize, len: usize) -> bool {
        let Some(&have) = self.used.get(&off) else { return false };
        let Some(want) = len.max(1).checked_next_multiple_of(MALLOC_ALIGN) else { return false };
        if want <= have {
            self.used.insert(off, want);
            if want < have {
                self.release(off + want, have - want);
            }
            return true;
        }
        let next = off + have;
        match self.free.get(&next) {
            Some(&flen) if have + flen >= want => {
                self.free.remove(&next);
                let rest = have + flen - want;
                if rest > 0 {
                    self.free.insert(off + want, rest);
                }
                self.used.insert(off, want);
                true
            }
            _ => false,
        }
    }

    /// Returns `off..off + len` to the free ranges, merged with its neighbours.
    fn release(&mut self, off: usize, len: usize) {
        let (mut start, mut len) = (off, len);
        if let Some((&p, &plen)) = self.free.range(..start).next_back() {
            if p + plen == start {
                self.free.remove(&p);
                start = p;
                len += plen;
            }
        }
        if let Some(nlen) = self.free.remove(&(start + len)) {
            len += nlen;
        }
        self.free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_disjoint_and_reused() {
        let mut h = Heap::new(1 << 20);
        let a = h.alloc(10, MALLOC_ALIGN).unwrap();
        let b = h.alloc(100, MALLOC_ALIGN).unwrap();
        let c = h.alloc(8, 4096).unwrap();
        assert_eq!(a % 64, 0);
        assert_eq!(b % 64, 0);
        assert_eq!(c % 4096, 0);
        assert!(a + 64 <= b && b + 128 <= c);
        assert!(h.free(b));
        assert!(!h.free(b), "a double free is refused");
        assert!(!h.free(a + 1), "an address inside an allocation is refused");
        assert_eq!(h.alloc(64, MALLOC_ALIGN), Some(b));
        assert!(h.free(a) && h.free(b) && h.free(c));
        assert_eq!(h.used_bytes(), 0);
        // Everything merged back into one range.
        assert_eq!(h.alloc(1 << 20, MALLOC_ALIGN), Some(0));
    }

    #[test]
    fn too_large_or_overflowing_requests_fail() {
        let mut h = Heap::new(4096);
        assert_eq!(h.alloc(4097, MALLOC_ALIGN), None);
        assert_eq!(h.alloc(usize::MAX, MALLOC_ALIGN), None);
        assert_eq!(h.alloc(8, 3), None);
        let a = h.alloc(8, MALLOC_ALIGN).unwrap();
        assert_eq!(h.alloc(8, 1 << 40), None, "no offset above 0 is aligned so");
        assert!(h.free(a));
        assert_eq!(h.alloc(4096, MALLOC_ALIGN), Some(0));
    }

    #[test]
    fn resizing_grows_into_free_space_or_refuses() {
        let mut h = Heap::new(1024);
        let a = h.alloc(64, MALLOC_ALIGN).unwrap();
        assert!(h.resize_in_place(a, 500));
        assert_eq!(h.len_of(a), Some(512));
        let b = h.alloc(64, MALLOC_ALIGN).unwrap();
        assert!(!h.resize_in_place(a, 600), "b is in the way");
        assert!(h.resize_in_place(a, 10));
        assert_eq!(h.len_of(a), Some(64));
        assert!(h.free(a) && h.free(b));
        assert_eq!(h.alloc(1024, MALLOC_ALIGN), Some(0));
    }

    #[test]
    fn the_same_calls_give_the_same_offsets() {
        let run = || {
            let mut h = Heap::new(1 << 16);
            let mut got = vec![];
            let mut live = vec![];
            for i in 0..200usize {
                if i % 3 == 2 {
                    let off = live.remove(i % live.len());
                    assert!(h.free(off));
                } else if let Some(off) = h.alloc(i * 37 % 900, 1 << (i % 8)) {
                    live.push(off);
                    got.push(off);
                }
            }
            got
        };
        assert_eq!(run(), run());
    }
}
