//! For the layers built on the runtime (the RPC layer), not for programs: what a layer plugs
//! into every world ([`crate::LAYERS`]; [`LayerBuilder`]: per-world state of any type,
//! start-up steps, progress hooks that run in every wait, [`Comm::poll`] and the progress
//! thread, outside AM handlers, so a hook may send requests, block and run user code; a poll
//! inside a hook runs no hooks, and waits nest them 8 deep at most), and what it reaches
//! through a world ([`Layer`]: that state, registered-memory pools, reads of a peer's
//! unregistered memory). Both are traits so that they stay out of the world's own API.
//!
//! ```no_run
//! # use weft_runtime as weft;
//! use std::sync::Arc;
//! use weft::layer::{Layer, LayerBuilder};
//! struct Counter(std::sync::atomic::AtomicU64);
//! let mut b = weft::World::builder();
//! b.extension(Arc::new(Counter(0.into())));
//! let world = b.init()?;
//! assert!(world.extension_ref::<Counter>().is_some());
//! # Ok::<(), weft_runtime::Error>(())
//! ```

pub use crate::am::as_handler;

/// Whether this thread runs an AM handler (or code under [`as_handler`]'s rules), where
/// requests cannot be sent.
#[inline]
pub fn in_handler() -> bool {
    crate::am::in_handler().is_some()
}
pub use crate::dist::serving;
use crate::{Builder, Comm, Error, Result, Segment};
use std::any::Any;
use std::sync::Arc;
use weft_fabric::pool::{Block, BlockPool};

/// A progress hook: does some work, returns how many events it handled.
pub type ProgressHook = Arc<dyn Fn(&Comm) -> Result<usize> + Send + Sync>;

/// A liveness hook: fails what futures of the layer await from ranks that are gone, and wakes
/// them. The second argument says whether a rank is gone, with the error to give (cached for
/// the one check). Returns how many it failed.
pub type LivenessHook = Arc<dyn Fn(&Comm, &dyn Fn(u32) -> Option<Error>) -> usize + Send + Sync>;

/// A collective step run at the end of start-up, on every rank in the same order.
pub type StartHook = Box<dyn FnOnce(&Comm) -> Result<()> + Send + Sync>;

/// A flush hook: sends what the layer holds back for the calling thread (aggregated
/// operations). It runs at the start of every wait, `wait_all`, `sync_nbi`, [`Comm::poll`] and
/// [`Comm::flush`], on the thread that calls them, never inside an AM handler.
pub type FlushHook = Arc<dyn Fn(&Comm) -> Result<()> + Send + Sync>;

#[derive(Default)]
pub(crate) struct Extensions {
    pub values: Vec<Arc<dyn Any + Send + Sync>>,
    pub hooks: Vec<ProgressHook>,
    pub liveness: Vec<LivenessHook>,
    pub on_start: Vec<StartHook>,
    pub flush: Vec<FlushHook>,
}

/// What a layer adds to a world as it is built.
pub trait LayerBuilder {
    /// Attaches a per-world value of type `T` that [`Layer::extension`] returns (one per type).
    fn extension<T: Any + Send + Sync>(&mut self, value: Arc<T>) -> &mut Self;
    /// Adds a collective step to the end of start-up (allocating pools, checking tables).
    fn on_start(&mut self, step: StartHook) -> &mut Self;
    /// Adds a hook that runs during progress outside AM handlers (see the module docs).
    fn progress_hook(&mut self, hook: ProgressHook) -> &mut Self;
    /// Adds a hook that runs at every liveness check (about every `WEFT_PEER_CHECK_MS`, by the
    /// progress thread and by waiting threads), so that awaited futures whose peer died or
    /// left fail instead of hanging.
    fn liveness_hook(&mut self, hook: LivenessHook) -> &mut Self;
    /// Adds a hook that sends what the layer holds back for the calling thread, run before
    /// every wait (see [`FlushHook`]), so that no wait waits on the layer's buffers.
    fn flush_hook(&mut self, hook: FlushHook) -> &mut Self;
}

impl LayerBuilder for Builder {
    fn extension<T: Any + Send + Sync>(&mut self, value: Arc<T>) -> &mut Self {
        self.ext.values.retain(|v| !v.is::<T>());
        self.ext.values.push(value);
        self
    }
    fn on_start(&mut self, step: StartHook) -> &mut Self {
        self.ext.on_start.push(step);
        self
    }
    fn progress_hook(&mut self, hook: ProgressHook) -> &mut Self {
        self.ext.hooks.push(hook);
        self
    }
    fn liveness_hook(&mut self, hook: LivenessHook) -> &mut Self {
        self.ext.liveness.push(hook);
        self
    }
    fn flush_hook(&mut self, hook: FlushHook) -> &mut Self {
        self.ext.flush.push(hook);
        self
    }
}

/// What a layer reaches through a world.
pub trait Layer {
    /// The value of type `T` attached with [`LayerBuilder::extension`].
    fn extension<T: Any + Send + Sync>(&self) -> Option<Arc<T>>;
    /// A reference to the value of type `T` attached with [`LayerBuilder::extension`], for
    /// the world's lifetime: no reference count is touched (a layer looks its state up on
    /// every call).
    fn extension_ref<T: Any + Send + Sync>(&self) -> Option<&T>;
    /// Collective: a pool of `bytes` registered bytes on every rank (a segment; memory is
    /// only committed where blocks are written).
    fn alloc_pool(&self, bytes: usize) -> Result<RmaPool>;
    /// Copies `dst.len()` bytes at address `addr` of rank `rank`'s process (memory it never
    /// registered). Fails with [`Error::Fabric`] where the fabric cannot (see
    /// [`crate::Caps::peer_read`]).
    fn read_peer(&self, rank: u32, addr: u64, dst: &mut [u8]) -> Result<()>;
    /// How `rank` can read `bytes`, memory of this process the caller keeps alive and
    /// unchanged until it drops a [`crate::Registration`] it gets (see
    /// [`weft_fabric::Fabric::expose`]).
    fn expose(&self, rank: u32, bytes: &[u8]) -> Result<crate::Exposure>;
    /// Copies `dst.len()` bytes at `addr` of what `rank` exposed under `key`.
    fn read_exposed(&self, rank: u32, addr: u64, key: u64, dst: &mut [u8]) -> Result<()>;
    /// What a layer's future does on returning `Pending` (after storing its waker): make sure
    /// something makes progress and wakes it, as the configured [`crate::Progress`] says.
    fn future_pending(&self, cx: &std::task::Context<'_>);
    /// Makes progress until `cond` holds, failing with [`crate::Error::PeerFailed`] if `rank`
    /// dies or leaves the job first (`what` names the wait in hang warnings).
    fn wait_on(&self, rank: u32, what: &str, cond: &mut dyn FnMut() -> bool) -> Result<()>;
    /// For a future pending on `rank` since `began`: once the hang warning's time
    /// (`WEFT_HANG_WARN_S`) has passed, says on standard error what it waits for (`what`)
    /// and sets `warned`, so that it is said once.
    fn warn_if_overdue(
        &self,
        rank: u32,
        what: &dyn Fn() -> String,
        began: std::time::Instant,
        warned: &mut bool,
    );
    /// A layer's hook has work that nothing else will trigger (a task its waker woke): ask
    /// the progress thread to run the hooks soon.
    fn want_progress(&self);
    /// `rank`'s part of `seg` as atomics where this process maps it (shared memory: loads and
    /// CPU atomics with no message, as `local().atomics()` for this rank's own part); `None`
    /// where it does not (a network, a rank of another host).
    fn mapped_words<'a>(
        &'a self,
        seg: &'a Segment<u64>,
        rank: u32,
    ) -> Option<&'a [std::sync::atomic::AtomicU64]>;
}

impl Layer for Comm {
    #[inline]
    fn extension<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        // Type check first, then one clone: cloning every candidate to try a downcast would
        // cost an atomic increment and decrement per extension on every call.
        let v = self.ext.values.iter().find(|v| (***v).is::<T>())?;
        v.clone().downcast::<T>().ok()
    }

    #[inline]
    fn extension_ref<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.ext.values.iter().find_map(|v| (**v).downcast_ref::<T>())
    }

    fn alloc_pool(&self, bytes: usize) -> Result<RmaPool> {
        let members: Vec<u32> = (0..self.size()).collect();
        let exchange = |m: &[u8]| self.world_exchange(crate::collective::SEGMENT_CALL, m);
        let seg =
            self.alloc_segment_among::<u8>(bytes, &members, &exchange, crate::segment::Backing::Sparse)?;
        let info = self.segments.get(seg.id()).ok_or(Error::NoSuchSegment(seg.id()))?;
        let blocks = BlockPool::new(info.local.clone());
        Ok(RmaPool { seg, blocks })
    }

    fn read_peer(&self, rank: u32, addr: u64, dst: &mut [u8]) -> Result<()> {
        if rank >= self.size() {
            return Err(Error::NoSuchRank { rank, size: self.size() });
        }
        Ok(self.fabric.read_peer(rank, addr, dst)?)
    }
    fn expose(&self, rank: u32, bytes: &[u8]) -> Result<crate::Exposure> {
        if rank >= self.size() {
            return Err(Error::NoSuchRank { rank, size: self.size() });
        }
        Ok(self.fabric.expose(rank, bytes.as_ptr() as usize, bytes.len())?)
    }
    fn read_exposed(&self, rank: u32, addr: u64, key: u64, dst: &mut [u8]) -> Result<()> {
        if rank >= self.size() {
            return Err(Error::NoSuchRank { rank, size: self.size() });
        }
        Ok(self.fabric_wait(|| self.fabric.read_exposed(rank, addr, key, dst))?)
    }
    fn future_pending(&self, cx: &std::task::Context<'_>) {
        Comm::future_pending(self, cx)
    }
    fn want_progress(&self) {
        Comm::want_progress(self)
    }
    fn mapped_words<'a>(
        &'a self,
        seg: &'a Segment<u64>,
        rank: u32,
    ) -> Option<&'a [std::sync::atomic::AtomicU64]> {
        if rank >= self.size() || !self.fabric.maps_peer(rank) {
            return None;
        }
        let region = seg.info().remote(rank).ok()?;
        let words = self.fabric.mapped_words(region)?;
        words.get(..seg.len())
    }
    fn wait_on(&self, rank: u32, what: &str, cond: &mut dyn FnMut() -> bool) -> Result<()> {
        self.wait(crate::progress::Deps::Rank(rank), what, cond)
    }

    fn warn_if_overdue(
        &self,
        rank: u32,
        what: &dyn Fn() -> String,
        began: std::time::Instant,
        warned: &mut bool,
    ) {
        let waited = began.elapsed();
        if !*warned && self.cfg.hang_warn.is_some_and(|limit| waited >= limit) {
            *warned = true;
            self.warn_hang(crate::progress::Deps::Rank(rank), &what(), waited);
        }
    }
}

/// A registered-memory pool: one segment, allocated collectively, handed out in blocks that
/// peers can read with RMA (see [`weft_fabric::pool`]).
pub struct RmaPool {
    seg: Segment<u8>,
    blocks: Arc<BlockPool>,
}

impl std::fmt::Debug for RmaPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RmaPool {{ segment: {}, {:?} }}", self.seg.id(), self.blocks)
    }
}

impl RmaPool {
    /// The segment the pool lives in (peers address blocks as this segment + block offset).
    pub fn segment(&self) -> u32 {
        self.seg.id()
    }
    /// A block of at least `bytes` bytes, or an error naming the pool's size when it is full.
    pub fn alloc(&self, bytes: usize) -> Result<Block> {
        self.blocks.alloc(bytes)?.ok_or(Error::TooLarge {
            what: "block of the registered-memory pool (bytes; the limit is the pool's free room, WEFT_RPC_POOL_MIB its size)",
            len: bytes,
            max: self.blocks.capacity() - self.blocks.in_use(),
        })
    }
    /// Gives back the memory of large blocks freed a while ago (see
    /// [`weft_fabric::pool::DECAY`]).
    pub fn purge_idle(&self) {
        self.blocks.purge_idle()
    }
    /// Bytes in all, and bytes handed out now.
    pub fn usage(&self) -> (usize, usize) {
        (self.blocks.capacity(), self.blocks.in_use())
    }
    /// The block allocator (blocks free themselves into it when dropped).
    pub fn blocks(&self) -> &Arc<BlockPool> {
        &self.blocks
    }
    /// Byte offset in the pool of `[addr, addr+len)` if it lies inside this rank's pool.
    pub fn locate(&self, addr: u64, len: u64) -> Option<usize> {
        let base = self.blocks.region().as_ptr() as u64;
        let end = addr.checked_add(len)?;
        (addr >= base && end <= base + self.blocks.capacity() as u64).then(|| (addr - base) as usize)
    }
}

/// How deep runs of the progress hooks may nest on one thread. A hook polls futures and may
/// block, and both make progress, which runs the hooks again: remote functions awaiting calls
/// nested each poll in the one before until the stack overflowed. So [`Comm::poll`] (a
/// future's poll) runs them only on a thread that runs none (depth 0): a future polled by a
/// hook gets the fabric's progress and returns `Pending` to the hook, whose loop goes on. A
/// blocking wait runs them while fewer than this many runs are under way on its thread, and
/// beyond that only the fabric's progress. Progress threads start at depth 0.
pub(crate) const MAX_HOOK_DEPTH: u32 = 8;

thread_local! {
    /// How many runs of the progress hooks are under way on this thread.
    static HOOK_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

impl Comm {
    /// Sends now what layers hold back for this thread (operations an aggregating layer
    /// buffers); every wait, `wait_all`, `sync_nbi` and [`Comm::poll`] do it first anyway.
    /// Inside an AM handler it does nothing (handlers send no requests).
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// world.flush()?;
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    #[inline]
    pub fn flush(&self) -> Result<()> {
        if self.ext.flush.is_empty() || crate::am::in_handler().is_some() {
            return Ok(());
        }
        self.flush_each()
    }

    #[inline(never)]
    fn flush_each(&self) -> Result<()> {
        for h in &self.ext.flush {
            h(self)?;
        }
        Ok(())
    }

    /// Runs the progress hooks (never inside an AM handler) on a thread that runs none already
    /// (see [`MAX_HOOK_DEPTH`]). Returns the events they handled. Inline for its first test: it
    /// runs on every poll of every wait, and waits are generic (compiled in the caller's crate,
    /// where a plain function would be a call).
    #[inline]
    pub(crate) fn run_hooks(&self) -> Result<usize> {
        self.run_hooks_below(1)
    }

    /// [`Comm::run_hooks`] for a blocking wait: nested up to [`MAX_HOOK_DEPTH`] deep.
    #[inline]
    pub(crate) fn run_hooks_in_wait(&self) -> Result<usize> {
        self.run_hooks_below(MAX_HOOK_DEPTH)
    }

    /// Runs the hooks if fewer than `limit` runs of them are under way on this thread.
    #[inline]
    fn run_hooks_below(&self, limit: u32) -> Result<usize> {
        let internal =
            self.counts.asked() || self.any_awaited_team.load(std::sync::atomic::Ordering::Relaxed);
        if (self.ext.hooks.is_empty() && !internal) || crate::am::in_handler().is_some() {
            return Ok(0);
        }
        self.run_nested(limit)
    }

    fn run_nested(&self, limit: u32) -> Result<usize> {
        if HOOK_DEPTH.with(|d| d.get()) >= limit {
            return Ok(0);
        }
        HOOK_DEPTH.with(|d| d.set(d.get() + 1));
        // One run less once this one ends, by a panic too.
        struct Nested;
        impl Drop for Nested {
            fn drop(&mut self) {
                HOOK_DEPTH.with(|d| d.set(d.get() - 1));
            }
        }
        let _nested = Nested;
        Ok(self.answer_asked()? + self.drive_teams() + self.run_each_hook()?)
    }

    fn run_each_hook(&self) -> Result<usize> {
        let mut n = 0;
        for h in &self.ext.hooks {
            n += h(self)?;
        }
        Ok(n)
    }
}
