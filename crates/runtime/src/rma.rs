//! One-sided RMA and remote atomics in three completion styles:
//! - blocking (`put`, `get`, `fetch_add`, ...): complete when the call returns;
//! - non-blocking with a handle (`put_nb`, `get_nb`, `atomic_nb`): [`crate::RmaHandle`] /
//!   [`crate::AtomicHandle`], also futures;
//! - implicit (`put_nbi`, `atomic_nbi`, and gets inside [`Comm::nbi`]): completed together by
//!   [`Comm::sync_nbi`] (or at the end of the scope).
//!
//! Local completion (the source buffer may be reused) is always reached when a put call
//! returns, whatever the style. Remote completion (the data is visible at the target) is what
//! the handle, the sync, or the blocking call's return stands for.

use crate::ops::{nbi_push, OpState};
use crate::segment::GlobalPtr;
use crate::{AtomicHandle, Comm, Error, Pod, Result, RmaHandle, Segment};
use std::cell::RefCell;
use std::sync::Arc;
use weft_fabric::pod::{bytes_of, bytes_of_mut};
use weft_fabric::read::{read_scope, ReadBuf, ReadDst, ReadScope};
use weft_fabric::{AtomicOp, GetIssued, Issued};

/// How an operation was started: finished already, or with state to wait on.
pub(crate) enum Started {
    Done(u64),
    Pending(Arc<OpState>),
}

/// A started get: the operation to wait on, if any, and the slice its data is copied to at
/// completion, if it is not read in place.
type GetStart<'a> = (Option<Arc<OpState>>, Option<&'a mut [u8]>);

impl Comm {
    fn start_put<T: Pod>(&self, dst: GlobalPtr<T>, src: &[T]) -> Result<Started> {
        let bytes = bytes_of(src);
        let (seg, off) = self.resolve(dst, bytes.len())?;
        if !self.native_rma {
            return self.am_put(dst.rank(), seg.id(), off, bytes).map(Started::Pending);
        }
        let region = seg.remote(dst.rank())?;
        if self.caps.load_store {
            // Shared memory: the copy is complete when the call returns.
            return match self.fabric.put(region, off, bytes, 0)? {
                Issued::Done(_) => Ok(Started::Done(0)),
                Issued::Pending => self.fabric.quiet().map(|_| Started::Done(0)).map_err(Into::into),
            };
        }
        // A network: the put completes later, reported with its own token, so a handle or an
        // NBI sync waits for exactly its operations. A large one is written in place and
        // waited for inside the fabric: this thread counts as waiting meanwhile.
        self.fabric_wait(|| self.tracked(dst.rank(), |token| self.fabric.put(region, off, bytes, token)))
    }

    /// Issues one fabric operation with a fresh completion token and returns what to wait on.
    fn tracked(
        &self,
        rank: u32,
        issue: impl FnOnce(u64) -> weft_fabric::FabricResult<Issued>,
    ) -> Result<Started> {
        let state = OpState::new(rank, 1, 0);
        let token = self.ops.register(&state);
        match issue(token) {
            Ok(Issued::Done(v)) => {
                self.ops.complete(token, v, Ok(()));
                Ok(Started::Done(v))
            }
            Ok(Issued::Pending) => Ok(Started::Pending(state)),
            Err(e) => {
                // Forget the token: nothing will complete it.
                self.ops.complete(token, 0, Err(e.clone().into()));
                Err(e.into())
            }
        }
    }

    fn start_atomic(&self, p: GlobalPtr<u64>, op: AtomicOp) -> Result<Started> {
        let (seg, off) = self.resolve(p, 8)?;
        if !self.native_atomics || !self.fabric.native_atomics_to(p.rank()) {
            return self.am_atomic(p.rank(), seg.id(), off, op).map(Started::Pending);
        }
        let region = seg.remote(p.rank())?;
        if self.caps.load_store {
            // Shared memory: the atomic instruction completes before the call returns.
            return match self.fabric.atomic(region, off, op, 0)? {
                Issued::Done(v) => Ok(Started::Done(v)),
                Issued::Pending => Err(Error::Fabric(weft_fabric::FabricError::Unsupported {
                    what: "untracked pending atomic",
                })),
            };
        }
        self.tracked(p.rank(), |token| self.fabric.atomic(region, off, op, token))
    }

    fn finish(&self, s: Started) -> Result<u64> {
        match s {
            Started::Done(v) => Ok(v),
            Started::Pending(op) => self.wait_op(&op),
        }
    }

    /// Writes `src` to `dst` (any rank, this one included) and returns when the data is
    /// visible at the target.
    pub fn put<T: Pod>(&self, dst: GlobalPtr<T>, src: &[T]) -> Result<()> {
        let s = self.start_put(dst, src)?;
        self.finish(s).map(drop)
    }

    /// Writes `src` to `dst`, then stores `value` into the flag `signal` on the same rank once
    /// the data is visible there (OpenSHMEM's `shmem_put_signal`): the receiver waits on its
    /// flag and then reads the data. Returns when both are visible at the target. On shared
    /// memory this is one checked copy and one release store; elsewhere a put, then an atomic
    /// store.
    ///
    /// ```no_run
    /// # use std::sync::atomic::Ordering;
    /// # let world = weft_runtime::World::init()?;
    /// let data = world.alloc_segment::<u64>(4)?;
    /// let flag = world.alloc_segment::<u64>(1)?;
    /// if world.rank() == 0 {
    ///     world.put_signal(data.at(1, 0), &[1, 2, 3, 4], flag.at(1, 0), 1)?;
    /// } else if world.rank() == 1 {
    ///     world.wait_until(|| flag.local().atomic(0).load(Ordering::Acquire) == 1)?;
    ///     assert_eq!(data.local().read(3), 4);
    /// }
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn put_signal<T: Pod>(
        &self,
        dst: GlobalPtr<T>,
        src: &[T],
        signal: GlobalPtr<u64>,
        value: u64,
    ) -> Result<()> {
        if signal.rank() != dst.rank() {
            return Err(Error::Misuse("put_signal: the signal must be on the rank the data goes to"));
        }
        if !self.direct_signal(dst.rank()) {
            // Both addresses are checked before anything is written.
            self.resolve(signal, 8)?;
            self.put(dst, src)?;
            return self.atomic_store(signal, value);
        }
        let bytes = bytes_of(src);
        let (seg, off) = self.resolve(dst, bytes.len())?;
        // The flag usually lies in the data's segment (often in its cache line): one lookup.
        let (sig_seg, sig_off) = if signal.segment_id() == dst.segment_id() {
            (seg, Self::checked_offset(seg, signal, 8)?)
        } else {
            self.resolve(signal, 8)?
        };
        let (region, sig_region) = (seg.remote(dst.rank())?, sig_seg.remote(dst.rank())?);
        Ok(self.fabric_wait(|| self.fabric.put_signal(region, off, bytes, sig_region, sig_off, value))?)
    }

    /// True if a put with signal to `rank` is the fabric's own (data and flag written by this
    /// rank's CPU), not a put followed by an atomic.
    fn direct_signal(&self, rank: u32) -> bool {
        self.native_rma && self.caps.load_store && self.native_atomics && self.fabric.native_atomics_to(rank)
    }

    /// [`Comm::put_signal`] of `words` to element `index` of `seg` on `rank`, with the signal at
    /// element `sig_index` of the same segment: the collectives' channels publish with it, one
    /// table lookup fewer than through [`GlobalPtr`]s (the fabric still checks both ranges).
    pub(crate) fn put_signal_within(
        &self,
        seg: &Segment<u64>,
        rank: u32,
        index: usize,
        words: &[u64],
        sig_index: usize,
        value: u64,
    ) -> Result<()> {
        if !self.direct_signal(rank) {
            return self.put_signal(seg.at(rank, index), words, seg.at(rank, sig_index), value);
        }
        let region = seg.remote_region(rank)?;
        // Saturated offsets lie past the region, which the fabric rejects.
        let (off, sig_off) = (index.saturating_mul(8), sig_index.saturating_mul(8));
        Ok(self
            .fabric_wait(|| self.fabric.put_signal(region, off, bytes_of(words), region, sig_off, value))?)
    }

    /// Reads `dst.len()` elements at `src` into `dst`.
    pub fn get<T: Pod>(&self, src: GlobalPtr<T>, dst: &mut [T]) -> Result<()> {
        let out = bytes_of_mut(dst);
        if let Some(op) = self.start_get(src, out, true)? {
            self.wait_op(&op)?;
            op.copy_out(out, std::iter::empty());
        }
        Ok(())
    }

    /// Starts a get into `out`: done on return (`None`), or the operation whose data goes to
    /// `out` once complete (the AM-based path; a network's get in flight unless `blocking`,
    /// for which the fabric reads straight into `out` and waits).
    fn start_get<T: Pod>(
        &self,
        src: GlobalPtr<T>,
        out: &mut [u8],
        blocking: bool,
    ) -> Result<Option<Arc<OpState>>> {
        let (seg, off) = self.resolve(src, out.len())?;
        if !self.native_rma {
            return Ok(Some(self.am_get(src.rank(), seg.id(), off, out.len())?));
        }
        let region = seg.remote(src.rank())?;
        if blocking || self.caps.load_store || self.fabric.gets_at_once(src.rank()) {
            self.fabric_wait(|| self.fabric.get(region, off, out))?;
            return Ok(None);
        }
        let state = OpState::new(src.rank(), 1, 0);
        let token = self.ops.register(&state);
        match self.fabric.get_nb(region, off, out, token) {
            Ok(GetIssued::Done) => {
                self.ops.complete(token, 0, Ok(()));
                Ok(None)
            }
            Ok(GetIssued::Staged(staged)) => {
                state.stage(0, staged);
                Ok(Some(state))
            }
            Err(e) => {
                // Forget the token: nothing will complete it.
                self.ops.complete(token, 0, Err(e.clone().into()));
                Err(e.into())
            }
        }
    }

    /// Starts a get into `dst`, memory that outlives the read (see [`weft_fabric::read`]): on
    /// a network the fabric reads straight into it, every get in flight at once. Returns the
    /// operation to wait on, if any, and the slice to copy its data to at completion where
    /// another path (AM-based, staged) fetched it.
    fn start_get_into<'a, T: Pod>(&self, src: GlobalPtr<T>, dst: ReadDst<'a>) -> Result<GetStart<'a>> {
        let (seg, off) = self.resolve(src, dst.len())?;
        if !self.native_rma || self.caps.load_store || self.fabric.gets_at_once(src.rank()) {
            let out = dst.into_slice();
            return Ok(match self.start_get(src, out, false)? {
                Some(op) => (Some(op), Some(out)),
                None => (None, None),
            });
        }
        let region = seg.remote(src.rank())?;
        Ok(match self.tracked(src.rank(), |token| self.fabric.get_into(region, off, dst, token))? {
            Started::Done(_) => (None, None),
            Started::Pending(op) => (Some(op), None),
        })
    }

    /// Starts a put; `src` may be reused at once, the handle completes when the data is
    /// visible at the target.
    pub fn put_nb<T: Pod>(&self, dst: GlobalPtr<T>, src: &[T]) -> Result<RmaHandle<'static>> {
        Ok(match self.start_put(dst, src)? {
            Started::Done(_) => RmaHandle::done(),
            Started::Pending(op) => RmaHandle::pending(self, op, None),
        })
    }

    /// Starts a get into `dst`, which stays borrowed until the handle completes (the handle
    /// holds its own reference to the world). On a network a get of up to 4 KiB reads into a
    /// staging slot of its own and is in flight when this returns (while slots are free: a
    /// few thousand per process, each back when its handle completes or is dropped); a larger
    /// one completes before it returns, since a handle that is forgotten (`mem::forget`) would
    /// let the network write `dst` after its borrow ended. Gets inside [`Comm::nbi`] and
    /// [`Comm::get_vec_nb`] are in flight at any size.
    pub fn get_nb<'a, T: Pod>(&self, src: GlobalPtr<T>, dst: &'a mut [T]) -> Result<RmaHandle<'a>> {
        let out = bytes_of_mut(dst);
        Ok(match self.start_get(src, out, false)? {
            Some(op) => RmaHandle::pending(self, op, Some(out)),
            None => RmaHandle::done(),
        })
    }

    /// Starts a get of `len` elements into a vector the handle owns and gives back (see
    /// [`crate::GetVec`]): the form of [`Comm::get_nb`] for futures that move, as into
    /// `tokio::spawn`.
    pub fn get_vec_nb<T: Pod>(&self, src: GlobalPtr<T>, len: usize) -> Result<crate::GetVec<T>> {
        // Checked before the vector is allocated: a wrong length is an error, not an abort.
        let bytes =
            len.checked_mul(std::mem::size_of::<T>()).ok_or(Error::Misuse("get_vec_nb: length overflows"))?;
        self.resolve(src, bytes)?;
        let mut buf = ReadBuf::new(vec![T::zeroed(); len]);
        let dst = buf.dst().ok_or(Error::Misuse("get_vec_nb: a new buffer is shared"))?;
        let (op, out) = self.start_get_into(src, dst)?;
        let copy = out.is_some();
        Ok(crate::GetVec::new(self, op, buf, copy))
    }

    /// Starts a put completed by the next [`Comm::sync_nbi`] of this thread; `src` may be
    /// reused at once.
    pub fn put_nbi<T: Pod>(&self, dst: GlobalPtr<T>, src: &[T]) -> Result<()> {
        if let Started::Pending(op) = self.start_put(dst, src)? {
            nbi_push(self.id, op);
        }
        Ok(())
    }

    /// Runs `f` with a scope in which implicit gets (and puts) may be issued; all of them are
    /// complete when `nbi` returns, also when `f` panics. Gets need the scope because their
    /// destination must stay borrowed until they complete; in exchange, on a network every
    /// get of the scope is in flight at once, read straight into its destination.
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// # let seg = world.alloc_segment::<u32>(64)?;
    /// let (mut a, mut b) = ([0u32; 8], [0u32; 8]);
    /// world.nbi(|s| {
    ///     s.get(seg.at(0, 0), &mut a)?;
    ///     s.get(seg.at(0, 8), &mut b)
    /// })?;
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn nbi<'env, R>(&'env self, f: impl FnOnce(&NbiScope<'_, 'env>) -> Result<R>) -> Result<R> {
        read_scope(&*self.fabric, |reads| {
            let scope = NbiScope { comm: self, reads, gets: RefCell::new(Vec::new()) };
            let r = f(&scope);
            let mut first_err = r.as_ref().err().cloned();
            for h in scope.gets.into_inner() {
                if let Err(e) = h.wait() {
                    first_err.get_or_insert(e);
                }
            }
            if let Err(e) = self.sync_nbi() {
                first_err.get_or_insert(e);
            }
            match first_err {
                Some(e) => Err(e),
                None => r,
            }
        })
    }

    /// Applies `op` to the `u64` at `p` and returns the previous value.
    pub fn atomic(&self, p: GlobalPtr<u64>, op: AtomicOp) -> Result<u64> {
        let s = self.start_atomic(p, op)?;
        self.finish(s)
    }
    /// Starts `op` on the `u64` at `p`; the handle yields the previous value.
    pub fn atomic_nb(&self, p: GlobalPtr<u64>, op: AtomicOp) -> Result<AtomicHandle> {
        Ok(match self.start_atomic(p, op)? {
            Started::Done(v) => AtomicHandle::done(v),
            Started::Pending(op) => AtomicHandle::pending(self, op),
        })
    }
    /// Starts `op` on the `u64` at `p` (result discarded), completed by [`Comm::sync_nbi`].
    pub fn atomic_nbi(&self, p: GlobalPtr<u64>, op: AtomicOp) -> Result<()> {
        if let Started::Pending(op) = self.start_atomic(p, op)? {
            nbi_push(self.id, op);
        }
        Ok(())
    }
    /// Atomically adds `v`; returns the previous value.
    pub fn fetch_add(&self, p: GlobalPtr<u64>, v: u64) -> Result<u64> {
        self.atomic(p, AtomicOp::FetchAdd(v))
    }
    /// Atomically replaces the value with `new` if it equals `expected`; returns the previous
    /// value (equal to `expected` on success).
    pub fn compare_exchange(&self, p: GlobalPtr<u64>, expected: u64, new: u64) -> Result<u64> {
        self.atomic(p, AtomicOp::CompareSwap { expected, new })
    }
    /// Atomically replaces the value; returns the previous value.
    pub fn swap(&self, p: GlobalPtr<u64>, v: u64) -> Result<u64> {
        self.atomic(p, AtomicOp::Swap(v))
    }
    /// Atomically reads the value.
    pub fn atomic_load(&self, p: GlobalPtr<u64>) -> Result<u64> {
        self.atomic(p, AtomicOp::Load)
    }
    /// Atomically writes the value with release ordering: everything this thread put before is
    /// visible to whoever reads this value with acquire ordering (the put+flag idiom).
    pub fn atomic_store(&self, p: GlobalPtr<u64>, v: u64) -> Result<()> {
        self.atomic(p, AtomicOp::Store(v)).map(drop)
    }
}

/// Scope of [`Comm::nbi`]: implicit operations whose destinations are borrowed for the
/// whole call (`'env`).
pub struct NbiScope<'scope, 'env> {
    pub(crate) comm: &'env Comm,
    pub(crate) reads: &'scope ReadScope<'env>,
    pub(crate) gets: RefCell<Vec<RmaHandle<'scope>>>,
}

impl<'scope, 'env> NbiScope<'scope, 'env> {
    /// Starts a get into `dst`, complete when the scope ends.
    pub fn get<T: Pod>(&self, src: GlobalPtr<T>, dst: &'env mut [T]) -> Result<()> {
        let (op, out) = self.comm.start_get_into(src, self.reads.dst(bytes_of_mut(dst)))?;
        if let Some(op) = op {
            self.gets.borrow_mut().push(RmaHandle::pending(self.comm, op, out));
        }
        Ok(())
    }
    /// Starts a put, complete when the scope ends.
    pub fn put<T: Pod>(&self, dst: GlobalPtr<T>, src: &[T]) -> Result<()> {
        self.comm.put_nbi(dst, src)
    }
    /// Starts an atomic (result discarded), complete when the scope ends.
    pub fn atomic(&self, p: GlobalPtr<u64>, op: AtomicOp) -> Result<()> {
        self.comm.atomic_nbi(p, op)
    }
}
