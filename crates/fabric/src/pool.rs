//! A block allocator over one registered region: memory that is registered once and handed out
//! in pieces (HPX's and UCX's registered-memory pools), so that sending a buffer from it never
//! registers anything per message.
//!
//! Blocks are 64-byte aligned and rounded up to 64 bytes; freed blocks merge with free
//! neighbours (first fit over an ordered free list). A freed block of 1 MiB or more gives
//! its pages back where the region allows, once they stayed free for [`DECAY`] (a block
//! allocated meanwhile takes them as they are: a program that sends one large buffer after
//! another does not fault the same pages in again each time, as jemalloc's decay keeps
//! them); a block reaching into pages given back backs them first. Pages are given back at
//! the next allocation or free, or at [`BlockPool::purge_idle`] (which the RPC layer calls as
//! it makes progress). A [`Block`] owns its byte range: the pool
//! never hands it out again until the block is dropped, which makes the safe slice accessors
//! below sound. Peers may *read* a block through RMA while this rank owns it (that is how a
//! rendezvous pulls it); no part of weft writes into another rank's pool.

use crate::pod::Pod;
use crate::LocalRegion;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Alignment and size granularity of blocks.
pub const BLOCK_ALIGN: usize = 64;

/// Free ranges of a pool, by offset, and the page ranges whose memory was given back.
struct FreeList {
    ranges: BTreeMap<usize, usize>,
    /// Ranges below `backed` discarded when a large block was freed: backed again when a
    /// block reaches into them (so that a full `/dev/shm` is still an error, not a SIGBUS).
    holes: BTreeMap<usize, usize>,
    /// Page ranges of freed large blocks, still backed, with when they were freed
    /// ([`os::now_ns`](crate::os::now_ns)): given back once free for [`DECAY`].
    cooling: BTreeMap<usize, (usize, u64)>,
}

/// A pool over one registered region (see the module documentation).
pub struct BlockPool {
    region: LocalRegion,
    free: Mutex<FreeList>,
    in_use: AtomicUsize,
    /// Bytes from the start known to be backed by memory (see [`BlockPool::alloc`]).
    backed: AtomicUsize,
    /// When the oldest cooling range was freed (0: none), read without the lock.
    cooling_since: AtomicU64,
}

/// A sparse pool's memory is backed this much at a time, ahead of the blocks handed out.
const BACK_STEP: usize = 2 << 20;
/// Freed blocks from this size up give their memory back (where the region allows).
const DISCARD_MIN: usize = 1 << 20;
/// How long a freed large block's pages stay backed for the next block before they go back.
pub const DECAY: std::time::Duration = std::time::Duration::from_millis(200);

impl std::fmt::Debug for BlockPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BlockPool {{ region: {}, bytes: {}, in use: {} }}",
            self.region.id,
            self.capacity(),
            self.in_use()
        )
    }
}

impl BlockPool {
    /// A pool that hands out the whole of `region`.
    pub fn new(region: LocalRegion) -> Arc<Self> {
        let len = region.len / BLOCK_ALIGN * BLOCK_ALIGN;
        let mut ranges = BTreeMap::new();
        if len > 0 {
            ranges.insert(0, len);
        }
        Arc::new(BlockPool {
            region,
            free: Mutex::new(FreeList { ranges, holes: BTreeMap::new(), cooling: BTreeMap::new() }),
            in_use: AtomicUsize::new(0),
            backed: AtomicUsize::new(0),
            cooling_since: AtomicU64::new(0),
        })
    }

    /// The region the blocks live in.
    pub fn region(&self) -> &LocalRegion {
        &self.region
    }
    /// Bytes the pool can hand out in all.
    pub fn capacity(&self) -> usize {
        self.region.len / BLOCK_ALIGN * BLOCK_ALIGN
    }
    /// Bytes handed out now (rounded block sizes).
    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }

    /// A block of at least `bytes` bytes; `Ok(None)` if no free range is large enough. The
    /// pool's memory is backed as blocks reach into it (a sparse region commits nothing up
    /// front), so a system out of shared memory is an error here, never a SIGBUS later.
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> crate::FabricResult<Option<Block>> {
        if bytes == 0 {
            return Ok(Some(Block { pool: self.clone(), offset: 0, len: 0, rounded: 0 }));
        }
        let Some(rounded) = bytes.checked_add(BLOCK_ALIGN - 1).map(|b| b / BLOCK_ALIGN * BLOCK_ALIGN) else {
            return Ok(None);
        };
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let Some((&off, &len)) = free.ranges.iter().find(|(_, &len)| len >= rounded) else {
            return Ok(None);
        };
        let end = off + rounded;
        take_range(&mut free.cooling, off, end, |&(l, _)| l, |(_, at), n| (n, at));
        self.refill(&mut free.holes, off, end)?;
        let backed = self.backed.load(Ordering::Relaxed);
        if end > backed {
            // Under the lock: one thread backs a range at a time.
            // A step ahead where the system has it, else what this block needs.
            let ahead = end.saturating_add(BACK_STEP).min(self.capacity());
            let to = match self.region.mapping().back(backed, ahead - backed) {
                Ok(()) => ahead,
                Err(_) if ahead > end => {
                    self.region.mapping().back(backed, end - backed)?;
                    end
                }
                Err(e) => return Err(e),
            };
            self.backed.store(to, Ordering::Relaxed);
        }
        free.ranges.remove(&off);
        if len > rounded {
            free.ranges.insert(end, len - rounded);
        }
        self.in_use.fetch_add(rounded, Ordering::Relaxed);
        if !free.cooling.is_empty() {
            self.purge(&mut free, crate::os::now_ns());
        }
        Ok(Some(Block { pool: self.clone(), offset: off, len: bytes, rounded }))
    }

    /// Gives back the pages of large blocks freed at least [`DECAY`] ago (cheap when there
    /// are none: one atomic load).
    pub fn purge_idle(&self) {
        let since = self.cooling_since.load(Ordering::Relaxed);
        if since == 0 {
            return;
        }
        let now = crate::os::now_ns();
        if now.saturating_sub(since) >= DECAY.as_nanos() as u64 {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            self.purge(&mut free, now);
        }
    }

    /// Gives back the cooling ranges freed at least [`DECAY`] before `now` (their pages
    /// become holes).
    fn purge(&self, free: &mut FreeList, now: u64) {
        if free.cooling.is_empty() {
            return;
        }
        let decay = DECAY.as_nanos() as u64;
        let due: Vec<(usize, usize)> = free
            .cooling
            .iter()
            .filter(|(_, &(_, at))| now.saturating_sub(at) >= decay)
            .map(|(&start, &(len, _))| (start, len))
            .collect();
        for (start, len) in due {
            free.cooling.remove(&start);
            if self.region.mapping().discard_range(start, len).is_ok() {
                free.holes.insert(start, len);
            }
        }
        let oldest = free.cooling.values().map(|&(_, at)| at).min().unwrap_or(0);
        self.cooling_since.store(oldest, Ordering::Relaxed);
    }

    /// Backs the parts of `[off, end)` that were given back (holes), and forgets them.
    fn refill(&self, holes: &mut BTreeMap<usize, usize>, off: usize, end: usize) -> crate::FabricResult<()> {
        for (from, to) in overlaps(holes, off, end, |&l| l) {
            self.region.mapping().back(from, to - from)?;
        }
        take_range(holes, off, end, |&l| l, |_, n| n);
        Ok(())
    }

    fn release(&self, offset: usize, rounded: usize) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        // A large block's memory goes back to the system (its whole pages) once it stayed free
        // for DECAY, to be backed again when a block reaches into it.
        if rounded >= DISCARD_MIN && self.region.discardable() {
            let (start, end) = (offset.next_multiple_of(4096), (offset + rounded) / 4096 * 4096);
            if end > start {
                free.cooling.insert(start, (end - start, crate::os::now_ns().max(1)));
            }
        }
        let (mut off, mut len) = (offset, rounded);
        if let Some((&prev, &plen)) = free.ranges.range(..off).next_back() {
            if prev + plen == off {
                free.ranges.remove(&prev);
                off = prev;
                len += plen;
            }
        }
        if let Some(&nlen) = free.ranges.get(&(offset + rounded)) {
            free.ranges.remove(&(offset + rounded));
            len += nlen;
        }
        free.ranges.insert(off, len);
        self.in_use.fetch_sub(rounded, Ordering::Relaxed);
        if !free.cooling.is_empty() {
            self.purge(&mut free, crate::os::now_ns());
        }
    }
}

/// The parts of `map`'s ranges (start -> a value whose length `len` gives) inside
/// `[off, end)`, as `(from, to)`.
fn overlaps<V>(
    map: &BTreeMap<usize, V>,
    off: usize,
    end: usize,
    len: impl Fn(&V) -> usize,
) -> Vec<(usize, usize)> {
    map.range(..end)
        .map(|(&h, v)| (h, h + len(v)))
        .filter(|&(_, h_end)| h_end > off)
        .map(|(h, h_end)| (h.max(off), h_end.min(end)))
        .collect()
}

/// Removes `[off, end)` from `map`'s ranges, keeping the parts outside it (`resize` gives a
/// part's value from its range's value and its new length).
fn take_range<V: Copy>(
    map: &mut BTreeMap<usize, V>,
    off: usize,
    end: usize,
    len: impl Fn(&V) -> usize,
    resize: impl Fn(V, usize) -> V,
) {
    let hit: Vec<(usize, V)> =
        map.range(..end).filter(|(&h, v)| h + len(v) > off).map(|(&h, &v)| (h, v)).collect();
    for (h, v) in hit {
        map.remove(&h);
        let h_end = h + len(&v);
        if h < off {
            map.insert(h, resize(v, off - h));
        }
        if h_end > end {
            map.insert(end, resize(v, h_end - end));
        }
    }
}

/// A byte range of a [`BlockPool`], owned until dropped.
pub struct Block {
    pool: Arc<BlockPool>,
    offset: usize,
    len: usize,
    rounded: usize,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Block {{ region: {}, offset: {}, len: {} }}", self.pool.region.id, self.offset, self.len)
    }
}

impl Block {
    /// Byte offset of the block in the pool's region (what a peer names to read it).
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Bytes requested.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length block.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes actually reserved (the length rounded up to [`BLOCK_ALIGN`]).
    pub fn capacity(&self) -> usize {
        self.rounded
    }
    /// The pool this block came from.
    pub fn pool(&self) -> &Arc<BlockPool> {
        &self.pool
    }

    /// The first `n` elements of type `T` (n × size ≤ capacity, checked).
    pub fn as_slice<T: Pod>(&self, n: usize) -> &[T] {
        self.check::<T>(n);
        if n == 0 {
            return &[];
        }
        // SAFETY: the range lies inside the registered mapping (kept alive by the pool's
        // region), is 64-aligned (≥ align_of T, checked), and is owned by this block: the pool
        // hands it to no one else until the block drops. T is Pod, so any bytes are valid.
        unsafe { std::slice::from_raw_parts(self.pool.region.as_ptr().add(self.offset).cast::<T>(), n) }
    }

    /// The first `n` elements of type `T`, mutably.
    pub fn as_mut_slice<T: Pod>(&mut self, n: usize) -> &mut [T] {
        self.check::<T>(n);
        if n == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only reference the block
        // gives out.
        unsafe { std::slice::from_raw_parts_mut(self.pool.region.as_ptr().add(self.offset).cast::<T>(), n) }
    }

    fn check<T: Pod>(&self, n: usize) {
        let bytes = n.checked_mul(std::mem::size_of::<T>()).expect("block length overflows");
        assert!(
            bytes <= self.rounded,
            "{n} elements of {} bytes exceed a block of {}",
            std::mem::size_of::<T>(),
            self.rounded
        );
        assert!(std::mem::align_of::<T>() <= BLOCK_ALIGN, "alignment above {BLOCK_ALIGN} bytes");
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.rounded > 0 {
            self.pool.release(self.offset, self.rounded);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn pool(bytes: usize) -> Arc<BlockPool> {
        let map = crate::os::create_shared(
            &format!("weft-pooltest-{}-{bytes}", crate::os::pid()),
            bytes,
            crate::os::Fill::Sparse,
            |_| {},
        )
        .expect("map");
        crate::os::unlink(&format!("weft-pooltest-{}-{bytes}", crate::os::pid()));
        BlockPool::new(LocalRegion::new(0, Arc::new(map), vec![]).with_discard(true))
    }

    #[test]
    fn alloc_free_merge() {
        let p = pool(4096);
        let a = p.alloc(100).unwrap().unwrap();
        let mut b = p.alloc(1000).unwrap().unwrap();
        assert_eq!((a.offset(), a.capacity(), b.offset()), (0, 128, 128));
        b.as_mut_slice::<u64>(125).fill(7);
        assert_eq!(b.as_slice::<u64>(125)[124], 7);
        assert!(p.alloc(4096).unwrap().is_none());
        drop(a);
        drop(b);
        assert_eq!(p.in_use(), 0);
        let all = p.alloc(4096).unwrap().expect("free ranges merged back into one");
        assert_eq!(all.offset(), 0);
    }

    #[test]
    fn freed_large_blocks_go_back_after_decay() {
        let p = pool(8 << 20);
        let mut a = p.alloc(4 << 20).unwrap().unwrap();
        a.as_mut_slice::<u8>(4 << 20).fill(1);
        let resident = || p.region.mapping().resident_bytes();
        let held = resident();
        assert!(held >= 4 << 20, "{held} bytes resident while held");
        drop(a);
        // Still backed at once: the next block takes the pages as they are.
        assert_eq!(resident(), held, "pages given back before the decay");
        let b = p.alloc(2 << 20).unwrap().unwrap();
        assert_eq!(b.offset(), 0);
        drop(b);
        p.purge_idle();
        assert_eq!(resident(), held, "purged before the decay");
        std::thread::sleep(DECAY + std::time::Duration::from_millis(20));
        p.purge_idle();
        assert!(
            resident() + (4 << 20) <= held,
            "{} of {held} bytes still resident after the decay",
            resident()
        );
        // Backed again (and zeroed) by the next block.
        let c = p.alloc(4 << 20).unwrap().unwrap();
        assert!(c.as_slice::<u8>(4 << 20).iter().all(|&x| x == 0));
    }
}
