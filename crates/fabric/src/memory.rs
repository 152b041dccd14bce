//! What the memory behind a [`Mapping`] does: given back while mapped, and how much of it is
//! in memory.

use crate::os::Mapping;
use crate::{FabricError, FabricResult};

const PAGE: usize = 4096;

impl Mapping {
    /// Gives the memory behind the mapping back to the system while keeping the mapping:
    /// later reads see zeros and later writes take fresh pages. Shared (file) memory is
    /// punched out of its file (`MADV_REMOVE`, which also frees it for the peers that map it);
    /// private memory is dropped (`MADV_DONTNEED`). Only for memory no device has pinned.
    pub fn discard(&self) -> FabricResult<()> {
        if self.is_empty() {
            return Ok(());
        }
        // SAFETY: ptr/len is exactly this live mapping; discarding changes no address that
        // anyone holds, only the contents (to zeros), which users of a discarded region no
        // longer rely on.
        let rc = unsafe { libc::madvise(self.as_ptr().cast(), self.len(), libc::MADV_REMOVE) };
        if rc == 0 {
            return Ok(());
        }
        // Private mappings refuse MADV_REMOVE.
        // SAFETY: as above.
        if unsafe { libc::madvise(self.as_ptr().cast(), self.len(), libc::MADV_DONTNEED) } == 0 {
            return Ok(());
        }
        Err(FabricError::last_os(format!("discarding {} bytes of memory", self.len())))
    }

    /// [`Mapping::discard`] of the whole pages within `[offset, offset + len)` (clipped to the
    /// mapping); the rest stays.
    pub fn discard_range(&self, offset: usize, len: usize) -> FabricResult<()> {
        let start = offset.div_ceil(PAGE).saturating_mul(PAGE);
        let end = offset.saturating_add(len).min(self.len()) / PAGE * PAGE;
        if end <= start {
            return Ok(());
        }
        // SAFETY: [start, end) lies inside this live mapping (clipped above, page-aligned as
        // mmap's start is); its contents become zeros, which the caller no longer relies on.
        let at = unsafe { self.as_ptr().add(start) }.cast();
        // SAFETY: as above.
        if unsafe { libc::madvise(at, end - start, libc::MADV_REMOVE) } == 0 {
            return Ok(());
        }
        // SAFETY: as above.
        if unsafe { libc::madvise(at, end - start, libc::MADV_DONTNEED) } == 0 {
            return Ok(());
        }
        Err(FabricError::last_os(format!("discarding {} bytes of memory", end - start)))
    }

    /// Bytes of the mapping in memory now (`mincore`: for shared memory, what it holds in
    /// `/dev/shm`, whoever touched it). 0 where the kernel does not say.
    pub fn resident_bytes(&self) -> u64 {
        if self.is_empty() {
            return 0;
        }
        let mut pages = vec![0u8; self.len().div_ceil(PAGE)];
        // SAFETY: the range is this live, page-aligned mapping; `pages` has one byte per page
        // of it, which is all mincore writes.
        let rc = unsafe { libc::mincore(self.as_ptr().cast(), self.len(), pages.as_mut_ptr()) };
        if rc != 0 {
            return 0;
        }
        pages.iter().filter(|&&p| p & 1 != 0).count() as u64 * PAGE as u64
    }
}

impl Mapping {
    /// The `i`-th `u64` of the mapping as an atomic, or `None` if out of range.
    pub fn atomic_u64(&self, i: usize) -> Option<&std::sync::atomic::AtomicU64> {
        if i.checked_add(1)?.checked_mul(8)? > self.len {
            return None;
        }
        // SAFETY: in bounds; the mapping is page-aligned so every u64 slot is 8-aligned; the
        // memory lives as long as &self.
        Some(unsafe { &*self.ptr.cast::<std::sync::atomic::AtomicU64>().add(i) })
    }
}

/// Bytes of the C allocator's memory that the process holds allocated now: every arena's
/// chunks in use and its directly mapped blocks (glibc's `mallinfo2`: `uordblks + hblkhd`).
/// Unlike resident memory, it does not count what `free` kept for later allocations or the
/// pages of thread stacks, which vary with the machine's load; a growing figure over repeated
/// identical work is a leak (the leak tests use it). Rust's global allocator is this one.
/// Chunks cached per thread for reuse (at most a few hundred KiB a thread) count as held.
///
/// ```
/// let before = weft_fabric::heap_in_use();
/// let big = vec![1u8; 4 << 20];
/// assert!(weft_fabric::heap_in_use() >= before + (4 << 20));
/// drop(big);
/// ```
pub fn heap_in_use() -> u64 {
    // SAFETY: `mallinfo2` takes no argument and returns a plain struct by value; it locks
    // each arena while it reads it.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks as u64).saturating_add(m.hblkhd as u64)
}
