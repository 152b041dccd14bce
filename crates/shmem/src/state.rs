//! The PE's state between `shmem_init` and `shmem_finalize`: the weft world, the symmetric
//! heap (one segment), and the checks that turn a C address into a global one.

use crate::heap::Heap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use weft_runtime::{Comm, GlobalPtr, ReduceOp, Segment, Team, World};

/// Default size of the symmetric heap when `SHMEM_SYMMETRIC_SIZE` is not set (address space:
/// memory is committed as objects are allocated).
pub const DEFAULT_HEAP: usize = 1 << 30;

/// Largest alignment `shmem_align` gives: every PE's heap starts at an address aligned so
/// (the segment is this much longer, and each PE's heap starts where its mapping is aligned).
pub const MAX_ALIGN: usize = 2 << 20;

/// One PE's OpenSHMEM state.
pub(crate) struct Shmem {
    pub comm: Arc<Comm>,
    /// The world, until `shmem_finalize` ends it.
    world: Mutex<Option<World>>,
    /// The symmetric heap's segment and the program's static data, until `shmem_finalize`.
    segs: Mutex<Vec<Segment<u8>>>,
    /// The symmetric heap.
    heap: Area,
    /// The program's static data (global and static variables), or why it is not symmetric.
    data: Result<Area, String>,
    /// weft's own symmetric words: team barriers' counters, collect's sizes (see `crate::team`).
    internal: Area,
    /// Teams, by handle (see `crate::team`).
    pub teams: Mutex<crate::team::Teams>,
    /// Small reductions made on each team slot (see `crate::coll`).
    pub team_calls: [std::sync::atomic::AtomicU64; crate::team::SLOTS],
    /// Communication contexts (see `crate::ctx`).
    pub ctxs: crate::ctx::Contexts,
    /// weft's team of all PEs, for the heap's agreement (made once: a team costs memory).
    world_team: Mutex<Option<Team>>,
    pub alloc: Mutex<Heap>,
    pub me: u32,
    pub n: u32,
    /// The thread level granted.
    pub thread_level: i32,
    /// How long a collective waits before it reads its members' calls (`crate::watch`).
    pub patience: Option<std::time::Duration>,
    /// The locks this PE holds (by address), with their tickets (see `crate::lock`).
    locks: Mutex<std::collections::HashMap<usize, u32>>,
}

/// Symmetric memory of one kind: a segment, where this PE's part starts in its mapping,
/// and where every PE's starts in its segment (`origins`; none: at 0).
struct Area {
    id: u32,
    base: usize,
    len: usize,
    origins: Vec<usize>,
    /// Where each PE's part is mapped in this process, where the fabric maps it (shared
    /// memory): loads and stores reach it without weft's RMA.
    mapped: Vec<Option<usize>>,
}

impl Area {
    fn of(seg: &Segment<u8>) -> Area {
        Area {
            id: seg.id(),
            base: seg.local().as_ptr() as usize,
            len: seg.len(),
            origins: vec![],
            mapped: vec![],
        }
    }
    /// Finds where every PE's part is mapped here (see `mapped`).
    fn map_peers(mut self, world: &World) -> Area {
        self.mapped = (0..world.size())
            .map(|pe| {
                let start = GlobalPtr::<u8>::new(pe, self.id, self.origin(pe));
                world.local_address(start, self.len).ok().flatten()
            })
            .collect();
        self
    }
    /// Where PE `pe`'s part starts in the segment.
    #[inline]
    fn origin(&self, pe: u32) -> usize {
        self.origins.get(pe as usize).copied().unwrap_or(0)
    }
    /// The offset of `bytes` bytes at `addr`, if they lie in the area.
    #[inline]
    fn offset(&self, addr: *const c_void, bytes: usize) -> Option<usize> {
        let off = (addr as usize).checked_sub(self.base)?;
        (off.checked_add(bytes)? <= self.len).then_some(off)
    }
}

static STATE: OnceLock<Shmem> = OnceLock::new();
static FINALIZED: AtomicBool = AtomicBool::new(false);
/// Set in a child of `fork`: the parent's world is not the child's to use (its network
/// connections are shared with the parent, and a call would corrupt the parent's traffic).
static FORK_CHILD: AtomicBool = AtomicBool::new(false);

extern "C" fn in_fork_child() {
    FORK_CHILD.store(true, Ordering::Relaxed);
    FINALIZED.store(true, Ordering::Relaxed);
}

/// Ends the job after a fatal error in `call`: says what went wrong and exits with status 1,
/// which makes the launcher stop every other PE (as `shmem_global_exit` does).
#[cold]
pub(crate) fn die(call: &str, msg: impl std::fmt::Display) -> ! {
    use std::io::Write;
    let who = STATE.get().map(|s| format!("PE {}: ", s.me)).unwrap_or_default();
    // One write, so that a launcher stopping the job on another PE's failure does not cut
    // the line short.
    let line = format!("weft shmem: {who}{call}: {msg}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    // `exit_unfinalized` (atexit) removes the job's shared files.
    std::process::exit(1)
}

/// Before this PE exits without `shmem_finalize`, ending the job: removes the job's shared
/// files that a launcher other than `weft run` would leave ([`weft_runtime::Comm::abandon`]).
pub(crate) fn abandon() {
    if let Some(s) = STATE.get() {
        s.comm.abandon();
    }
}

/// The state, or the end of the job when OpenSHMEM is not initialized.
#[inline]
pub(crate) fn st(call: &str) -> &'static Shmem {
    match STATE.get() {
        Some(s) if !FINALIZED.load(Ordering::Relaxed) => s,
        Some(_) if FORK_CHILD.load(Ordering::Relaxed) => {
            die(call, "a child of fork cannot use its parent's OpenSHMEM (only the PE's own process can)")
        }
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
    let mut fresh = false;
    let s = STATE.get_or_init(|| {
        fresh = true;
        start(call, thread_level)
    });
    if fresh {
        // A PE that exits without shmem_finalize (an error, exit(3), a return from main) ends
        // the job: it removes the job's shared files that a launcher other than `weft run`
        // leaves.
        weft_runtime::at_exit(exit_unfinalized);
        weft_runtime::at_fork_child(in_fork_child);
        crate::ctx::open_pool(s, call);
        // This library's code, mapped in now rather than page by page in the program's
        // first calls, which would each wait for page faults. Where the kernel cannot,
        // the code maps at first touch as before.
        let _ = weft_runtime::populate_code(init as *const () as usize);
    }
}

extern "C" fn exit_unfinalized() {
    if !FINALIZED.load(Ordering::Relaxed) {
        abandon();
    }
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
    let span = heap.checked_add(MAX_ALIGN).unwrap_or_else(|| die(call, "heap too large"));
    let seg = world.alloc_segment_sparse::<u8>(span).unwrap_or_else(|e| {
        die(
            call,
            format_args!(
                "the symmetric heap of {heap} bytes (SHMEM_SYMMETRIC_SIZE) cannot be allocated: {e}"
            ),
        )
    });
    // The program's globals become symmetric: moved into shared memory, or registered.
    let (data, data_seg) = match world.alloc_program_data() {
        Ok(d) => (Ok(Area::of(&d).map_peers(&world)), Some(d)),
        Err(e) => (Err(e.to_string()), None),
    };
    let world_team =
        world.world_team().unwrap_or_else(|e| die(call, format_args!("weft's team of all PEs: {e}")));
    let heap_area = heap_area(call, &world_team, &seg, heap);
    let words = crate::team::internal_words(world.size());
    let internal = world.alloc_segment::<u8>(words * 8).unwrap_or_else(|e| {
        die(call, format_args!("weft's symmetric words ({} bytes) cannot be allocated: {e}", words * 8))
    });
    Shmem {
        comm: world.arc(),
        me: world.rank(),
        n: world.size(),
        heap: heap_area.map_peers(&world),
        world_team: Mutex::new(Some(world_team)),
        data,
        internal: Area::of(&internal).map_peers(&world),
        teams: Mutex::new(crate::team::Teams::new(world.size(), shared_set(&world, &seg))),
        ctxs: crate::ctx::Contexts::new(),
        team_calls: std::array::from_fn(|_| std::sync::atomic::AtomicU64::new(0)),
        alloc: Mutex::new(Heap::new(heap)),
        segs: Mutex::new([seg, internal].into_iter().chain(data_seg).collect()),
        world: Mutex::new(Some(world)),
        thread_level,
        patience: crate::watch::patience(call),
        locks: Mutex::default(),
    }
}

/// The heap in its segment: on each PE from where its mapping is aligned to [`MAX_ALIGN`], so
/// that an offset aligned so is an address aligned so on every PE.
fn heap_area(call: &str, team: &Team, seg: &Segment<u8>, len: usize) -> Area {
    let mapped = seg.local().as_ptr() as usize;
    let mine = (MAX_ALIGN - mapped % MAX_ALIGN) % MAX_ALIGN;
    let origins = team
        .allgather(&[mine as u64])
        .unwrap_or_else(|e| die(call, format_args!("exchanging heap origins: {e}")))
        .into_iter()
        .map(|o| o as usize)
        .collect();
    Area { id: seg.id(), base: mapped + mine, len, origins, mapped: vec![] }
}

/// `SHMEM_TEAM_SHARED`: the PEs whose memory this PE maps (`shmem_ptr` reaches them), if
/// they are a strided set (as a host's ranks of a job are), else this PE alone.
fn shared_set(world: &World, heap: &Segment<u8>) -> crate::coll::Set {
    let me = world.rank();
    let mapped: Vec<u32> = (0..world.size())
        .filter(|&p| p == me || matches!(world.local_address(heap.at(p, 0), 1), Ok(Some(_))))
        .collect();
    let alone = crate::coll::Set { start: me, stride: 1, size: 1 };
    let (Some(&first), Some(&second)) = (mapped.first(), mapped.get(1)) else { return alone };
    let stride = second - first;
    let strided = mapped.windows(2).all(|w| w[1] - w[0] == stride);
    if strided {
        crate::coll::Set { start: first, stride, size: mapped.len() as u32 }
    } else {
        alone
    }
}

/// Ends OpenSHMEM: completes this PE's operations, waits for every PE, releases the heap
/// and the world. A PE that cannot (another PE is gone) ends with status 1 and a message.
pub(crate) fn finalize() {
    let Some(s) = STATE.get() else { return };
    if FINALIZED.swap(true, Ordering::AcqRel) {
        return;
    }
    crate::ctx::close(s);
    let finalizing = crate::watch::finalizing(s);
    if let Err(e) = s.comm.sync_nbi().and_then(|()| s.comm.barrier()) {
        // A PE that never came (it died, or exited without `shmem_finalize`): this PE's
        // operations may not have completed, so it must not report success.
        abandon();
        die("shmem_finalize", e);
    }
    drop(finalizing);
    drop(s.world_team.lock().unwrap_or_else(|p| p.into_inner()).take());
    s.segs.lock().unwrap_or_else(|p| p.into_inner()).clear();
    drop(s.world.lock().unwrap_or_else(|p| p.into_inner()).take());
}

impl Shmem {
    /// Checks a PE number.
    #[inline]
    pub fn pe(&self, call: &str, pe: i32) -> u32 {
        match u32::try_from(pe) {
            Ok(p) if p < self.n => p,
            _ => die(call, format_args!("PE {pe} does not exist (the job's PEs are 0 to {})", self.n - 1)),
        }
    }

    /// The heap offset of `bytes` bytes at `addr`, if they lie in the symmetric heap.
    #[inline]
    pub fn offset(&self, addr: *const c_void, bytes: usize) -> Option<usize> {
        self.heap.offset(addr, bytes)
    }

    /// The segment and offset of `bytes` bytes at `addr`, if they are symmetric memory (the
    /// heap or the program's static data).
    #[inline]
    fn locate(&self, addr: *const c_void, bytes: usize) -> Option<(&Area, usize)> {
        if let Some(off) = self.heap.offset(addr, bytes) {
            return Some((&self.heap, off));
        }
        if let Some(off) = self.internal.offset(addr, bytes) {
            return Some((&self.internal, off));
        }
        let data = self.data.as_ref().ok()?;
        data.offset(addr, bytes).map(|off| (data, off))
    }

    /// Commits memory to heap bytes `off..off + len` (the heap is sparse: a large
    /// `SHMEM_SYMMETRIC_SIZE` costs only what is allocated).
    pub fn back_heap(&self, off: usize, len: usize) -> Result<(), String> {
        let segs = self.segs.lock().unwrap_or_else(|p| p.into_inner());
        match segs.first() {
            Some(heap) => {
                let at = self.heap.origin(self.me) + off;
                heap.back(at, len).map_err(|e| {
                    // What was backed before the memory ran out goes back at once.
                    let _ = heap.release(at, len);
                    e.to_string()
                })
            }
            None => Err("OpenSHMEM is finalized".into()),
        }
    }

    /// An all-reduce (maximum) over all PEs on weft's team of them.
    pub fn allreduce_max(&self, call: &str, mine: &[u64]) -> Vec<u64> {
        let team = self.world_team.lock().unwrap_or_else(|p| p.into_inner());
        match team.as_ref() {
            Some(t) => self.check(call, t.allreduce(mine, ReduceOp::Max)),
            None => die(call, "OpenSHMEM is finalized"),
        }
    }

    /// This PE's address of word `i` of weft's own symmetric words.
    pub fn internal_word(&self, i: usize) -> usize {
        self.internal.base + 8 * i
    }

    /// Whether `bytes` bytes at `addr` are symmetric memory.
    pub fn symmetric(&self, addr: *const c_void, bytes: usize) -> bool {
        self.locate(addr, bytes).is_some()
    }

    /// The global address of `bytes` bytes at symmetric address `addr` on PE `pe`, after
    /// checking both; the end of the job otherwise.
    #[inline]
    pub fn sym(&self, call: &str, addr: *const c_void, bytes: usize, pe: i32) -> GlobalPtr<u8> {
        let pe = self.pe(call, pe);
        match self.locate(addr, bytes) {
            Some((area, off)) => GlobalPtr::new(pe, area.id, area.origin(pe) + off),
            None => die(call, self.not_symmetric(addr, bytes)),
        }
    }

    /// Where this process reaches `bytes` bytes at symmetric `addr` of PE `pe` with loads and
    /// stores, where the fabric maps that PE's memory here; `None` elsewhere (and for bad
    /// addresses: the RMA path then names the error).
    #[inline]
    pub fn direct(&self, addr: *const c_void, bytes: usize, pe: i32) -> Option<usize> {
        let (area, off) = self.locate(addr, bytes)?;
        let base = (*area.mapped.get(usize::try_from(pe).ok()?)?)?;
        Some(base + off)
    }

    /// Why `bytes` bytes at `addr` are refused.
    #[cold]
    fn not_symmetric(&self, addr: *const c_void, bytes: usize) -> String {
        let (h, end) = (self.heap.base, self.heap.base + self.heap.len);
        let data = match &self.data {
            Ok(d) => format!("the program's static data {:#x}..{:#x}", d.base, d.base + d.len),
            Err(e) => format!("static data is not symmetric here: {e}"),
        };
        format!("{bytes} bytes at {addr:p} are not symmetric memory (the symmetric heap is {h:#x}..{end:#x}; {data})")
    }

    /// The address in this PE's mapping of heap offset `off`.
    pub fn local_addr(&self, off: usize) -> *mut c_void {
        (self.heap.base + off) as *mut c_void
    }

    /// Checks that `addr` is a `size`-byte word of this PE's symmetric memory, aligned for
    /// its size, for a local wait on it; returns the address.
    pub fn local_word(&self, call: &str, addr: *const c_void, size: usize) -> usize {
        if self.locate(addr, size).is_none() {
            die(call, self.not_symmetric(addr, size));
        }
        if !(addr as usize).is_multiple_of(size) {
            die(call, format_args!("{addr:p} is not aligned to {size} bytes"));
        }
        addr as usize
    }

    /// The locks this PE holds, by address, with their tickets.
    pub fn locks_held(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<usize, u32>> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
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
