//! The PE's state between `shmem_init` and `shmem_finalize`: the weft world, the symmetric
//! heap (one segment), and the checks that turn a C address into a global one.

use crate::heap::Heap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use weft_runtime::{Comm, GlobalPtr, Segment, World};

/// Default size of the symmetric heap when `SHMEM_SYMMETRIC_SIZE` is not set.
pub const DEFAULT_HEAP: usize = 64 << 20;

/// One PE's OpenSHMEM state.
pub(crate) struct Shmem {
    pub comm: Arc<Comm>,
    /// The world, until `shmem_finalize` ends it.
    world: Mutex<Option<World>>,
    /// The symmetric heap's segment, until `shmem_finalize`.
    heap_seg: Mutex<Option<Segment<u8>>>,
    heap_id: u32,
    /// This PE's mapping of the heap.
    base: usize,
    len: usize,
    pub alloc: Mutex<Heap>,
    pub me: u32,
    pub n: u32,
    /// The thread level granted.
    pub thread_level: i32,
}

static STATE: OnceLock<Shmem> = OnceLock::new();
static FINALIZED: AtomicBool = AtomicBool::new(false);

/// Ends the job after a fatal error in `call`: says what went wrong and exits with status 1,
/// which makes the launcher stop every other PE (as `shmem_global_exit` does).
#[cold]
pub(crate) fn die(call: &str, msg: impl std::fmt::Display) -> ! {
    let who = STATE.get().map(|s| format!("PE {}: ", s.me)).unwrap_or_default();
    eprintln!("weft shmem: {who}{call}: {msg}");
    std::process::exit(1)
}

/// The state, or the end of the job when OpenSHMEM is not initialized.
#[inline]
pub(crate) fn st(call: &str) -> &'static Shmem {
    match STATE.get() {
        Some(s) if !FINALIZED.load(Ordering::Relaxed) => s,
        _ => die(
            call,
            "OpenSHMEM is not initialized (call shmem_init first, and nothing after shmem_finalize)",
        ),
    }
}

/// Parses a size such as `64M`, `1G`, `4096` or `512K`.
pub(crate) fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1usize << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mul)
}

/// Starts OpenSHMEM once (later calls are no-ops, as the specification allows).
pub(crate) fn init(call: &str, thread_level: i32) {
    if FINALIZED.load(Ordering::Relaxed) {
        die(call, "OpenSHMEM cannot be initialized again after shmem_finalize");
    }
    STATE.get_or_init(|| start(call, thread_level));
}

fn start(call: &str, thread_level: i32) -> Shmem {
    let heap = match std::env::var("SHMEM_SYMMETRIC_SIZE") {
        Ok(v) => parse_size(&v).filter(|&n| n > 0).unwrap_or_else(|| {
            die(call, format!("SHMEM_SYMMETRIC_SIZE={v:?} is not a size (such as 4096, 512K, 64M or 2G)"))
        }),
        Err(_) => DEFAULT_HEAP,
    };
    // Whole cache lines, so that the allocator's alignment holds to the end.
    let heap = heap
        .checked_next_multiple_of(crate::heap::MALLOC_ALIGN)
        .unwrap_or_else(|| die(call, "heap too large"));
    let world = World::init().unwrap_or_else(|e| die(call, format_args!("weft start-up failed: {e}")));
    let seg = world.alloc_segment::<u8>(heap).unwrap_or_else(|e| {
        die(
            call,
            format_args!(
                "the symmetric heap of {heap} bytes (SHMEM_SYMMETRIC_SIZE) cannot be allocated: {e}"
            ),
        )
    });
    let base = seg.local().as_ptr() as usize;
    Shmem {
        comm: world.arc(),
        me: world.rank(),
        n: world.size(),
        heap_id: seg.id(),
        base,
        len: heap,
        alloc: Mutex::new(Heap::new(heap)),
        heap_seg: Mutex::new(Some(seg)),
        world: Mutex::new(Some(world)),
        thread_level,
    }
}

/// Ends OpenSHMEM: completes this PE's operations, waits for every PE, releases the heap
/// and the world.
pub(crate) fn finalize() {
    let Some(s) = STATE.get() else { return };
    if FINALIZED.swap(true, Ordering::AcqRel) {
        return;
    }
    if let Err(e) = s.comm.sync_nbi().and_then(|()| s.comm.barrier()) {
        eprintln!("weft shmem: PE {}: shmem_finalize: {e}", s.me);
    }
    drop(s.heap_seg.lock().unwrap_or_else(|p| p.into_inner()).take());
    drop(s.world.lock().unwrap_or_else(|p| p.into_inner()).take());
}

impl Shmem {
    /// Checks a PE number.
    #[inline]
    pub fn pe(&self, call: &str, pe: i32) -> u32 {
        match u32::try_from(pe) {
            Ok(p) if p < self.n => p,
            _ => die(call, format_args!("PE {pe} does not exist (the job has PEs 0..{})", self.n)),
        }
    }

    /// The offset of `bytes` bytes at `addr` in the symmetric heap, if they lie in it.
    #[inline]
    pub fn offset(&self, addr: *const c_void, bytes: usize) -> Option<usize> {
        let off = (addr as usize).checked_sub(self.base)?;
        (off.checked_add(bytes)? <= self.len).then_some(off)
    }

    /// The global address of `bytes` bytes at symmetric address `addr` on PE `pe`, after
    /// checking both; the end of the job otherwise.
    #[inline]
    pub fn sym(&self, call: &str, addr: *const c_void, bytes: usize, pe: i32) -> GlobalPtr<u8> {
        let pe = self.pe(call, pe);
        match self.offset(addr, bytes) {
            Some(off) => GlobalPtr::new(pe, self.heap_id, off),
            None => die(
                call,
                format_args!(
                    "{bytes} bytes at {addr:p} are not symmetric memory (the symmetric heap is {:#x}..{:#x})",
                    self.base,
                    self.base + self.len
                ),
            ),
        }
    }

    /// The address in this PE's mapping of heap offset `off`.
    pub fn local_addr(&self, off: usize) -> *mut c_void {
        (self.base + off) as *mut c_void
    }

    /// Checks that `addr` is a `size`-byte word of this PE's symmetric heap, aligned for its
    /// size, for a local wait on it; returns the address.
    pub fn local_word(&self, call: &str, addr: *const c_void, size: usize) -> usize {
        match self.offset(addr, size) {
            Some(_) if (addr as usize).is_multiple_of(size) => addr as usize,
            Some(_) => die(call, format_args!("{addr:p} is not aligned to {size} bytes")),
            None => die(call, format_args!("{addr:p} is not symmetric memory")),
        }
    }

    /// Turns a weft error into the end of the job, naming the call.
    pub fn check<T>(&self, call: &str, r: weft_runtime::Result<T>) -> T {
        r.unwrap_or_else(|e| die(call, e))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_units_and_refuse_garbage() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("512K"), Some(512 << 10));
        assert_eq!(parse_size("64m"), Some(64 << 20));
        assert_eq!(parse_size(" 2G "), Some(2 << 30));
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("99999999999999999999T"), None);
        assert_eq!(parse_size("16777216T"), None);
    }
}
