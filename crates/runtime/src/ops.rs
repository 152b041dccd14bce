//! Operations in flight: their shared state, the table the completion path looks them up in,
//! explicit handles ([`RmaHandle`], [`AtomicHandle`]) and the per-thread list of implicit
//! (NBI) operations.
//!
//! An operation that the fabric completed before returning needs none of this: its handle is
//! born complete. Only operations that complete later (AM-based path, network fabrics) get an
//! [`OpState`] and a token.

use crate::progress::Deps;
use crate::{Comm, Error, Pod, Result};
use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use weft_fabric::read::ReadBuf;

/// Shared state of one operation in flight.
pub(crate) struct OpState {
    /// Parts still outstanding (a large AM-based transfer travels in several).
    remaining: AtomicUsize,
    value: AtomicU64,
    error: Mutex<Option<Error>>,
    /// Bytes fetched by an AM-based get, copied to the caller's buffer at completion.
    pub data: Mutex<Vec<u8>>,
    /// Where a fabric's non-blocking gets hold their bytes until completion, each with the
    /// offset in the caller's buffer it goes to.
    staged: Mutex<Vec<(usize, weft_fabric::StagedGet)>>,
    waker: Mutex<Option<Waker>>,
    /// The rank whose answer completes the operation.
    pub target: u32,
}

impl OpState {
    /// Copies a finished get's data into `out`: all of it, or into the given ranges of `out`
    /// in order.
    pub(crate) fn copy_out(
        &self,
        out: &mut [u8],
        scatter: impl ExactSizeIterator<Item = std::ops::Range<usize>>,
    ) {
        let staged = std::mem::take(&mut *self.staged.lock().unwrap_or_else(|p| p.into_inner()));
        for (at, piece) in &staged {
            // Complete here (the operation is); a piece copies at most what it fetched.
            if let Some(dst) = out.get_mut(*at..) {
                piece.copy_to(dst);
            }
        }
        if !staged.is_empty() {
            // A network's gets (no AM-borne data).
            return;
        }
        let data = self.data.lock().unwrap_or_else(|p| p.into_inner());
        if scatter.len() == 0 {
            weft_fabric::copy::copy_slice(out, &data);
        }
        let mut at = 0;
        for r in scatter {
            let len = r.len();
            weft_fabric::copy::copy_slice(&mut out[r], &data[at..at + len]);
            at += len;
        }
    }
    pub fn new(target: u32, parts: usize, data_len: usize) -> Arc<Self> {
        Arc::new(OpState {
            remaining: AtomicUsize::new(parts),
            value: AtomicU64::new(0),
            error: Mutex::new(None),
            data: Mutex::new(vec![0; data_len]),
            staged: Mutex::new(Vec::new()),
            waker: Mutex::new(None),
            target,
        })
    }
    /// Keeps the fabric's staging of a non-blocking get until [`OpState::copy_out`].
    pub(crate) fn stage(&self, at: usize, staged: weft_fabric::StagedGet) {
        self.staged.lock().unwrap_or_else(|p| p.into_inner()).push((at, staged));
    }
    pub fn is_done(&self) -> bool {
        self.remaining.load(Ordering::Acquire) == 0
    }
    /// The operation's result once done; a failure stays (asked again, it is the same error).
    pub(crate) fn outcome(&self) -> Result<u64> {
        match &*self.error.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(self.value.load(Ordering::Acquire)),
        }
    }
}

/// Token → operation, for completions that arrive later.
#[derive(Default)]
pub(crate) struct OpTable {
    next: AtomicU64,
    live: Mutex<HashMap<u64, Arc<OpState>>>,
}

impl OpTable {
    pub fn register(&self, op: &Arc<OpState>) -> u64 {
        let token = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.live.lock().unwrap_or_else(|p| p.into_inner()).insert(token, op.clone());
        token
    }
    pub fn get(&self, token: u64) -> Option<Arc<OpState>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).get(&token).cloned()
    }
    /// One part of operation `token` finished.
    pub fn complete(&self, token: u64, value: u64, result: Result<()>) {
        let Some(op) = self.get(token) else { return };
        if let Err(e) = result {
            op.error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
        }
        op.value.store(value, Ordering::Release);
        // Never below zero: an operation failed by `fail_gone` meanwhile is already done.
        let left = op.remaining.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if left == Ok(1) {
            self.live.lock().unwrap_or_else(|p| p.into_inner()).remove(&token);
            if let Some(w) = op.waker.lock().unwrap_or_else(|p| p.into_inner()).take() {
                w.wake();
            }
        }
    }
    /// Fails every operation in flight whose target `gone` names (with the error it gives) and
    /// wakes its future. They leave the table, so a late answer finds nothing to complete.
    pub fn fail_gone(&self, gone: &dyn Fn(u32) -> Option<Error>) -> usize {
        let mut failed = vec![];
        self.live.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, op| match gone(op.target) {
            Some(e) => {
                failed.push((op.clone(), e));
                false
            }
            None => true,
        });
        for (op, e) in &failed {
            op.error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e.clone());
            op.remaining.store(0, Ordering::Release);
            if let Some(w) = op.waker.lock().unwrap_or_else(|p| p.into_inner()).take() {
                w.wake();
            }
        }
        failed.len()
    }
    /// Number of operations in flight.
    pub fn in_flight(&self) -> usize {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

thread_local! {
    /// Implicit operations this thread issued that completed later, by world id.
    static NBI: RefCell<Vec<(u64, Arc<OpState>)>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn nbi_push(world: u64, op: Arc<OpState>) {
    NBI.with(|l| l.borrow_mut().push((world, op)));
}

impl Comm {
    /// Completes every implicit (NBI) operation this thread issued on this world: puts are
    /// visible at their targets and atomics applied when it returns. Other threads' implicit
    /// operations are theirs to sync (as in GASNet-EX), and an [`crate::Endpoint`]'s are
    /// completed by its own `sync_nbi`. Active messages and handles are not covered: a handle
    /// completes by its `wait`, an AM by the reply its handler sends.
    pub fn sync_nbi(&self) -> Result<()> {
        self.flush()?;
        let mine: Vec<Arc<OpState>> = NBI.with(|l| {
            let mut l = l.borrow_mut();
            if l.is_empty() {
                return Vec::new();
            }
            if l.iter().all(|(w, _)| *w == self.id) {
                // The common case (none pending, or one world's): the list keeps its room.
                return l.drain(..).map(|(_, op)| op).collect();
            }
            let (mine, rest) = std::mem::take(&mut *l).into_iter().partition(|(w, _)| *w == self.id);
            *l = rest;
            mine.into_iter().map(|(_, op)| op).collect()
        });
        let mut first_err = None;
        for op in mine {
            let r = self
                .wait(Deps::Rank(op.target), "an RMA or atomic operation", || op.is_done())
                .and_then(|_| op.outcome().map(drop));
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        weft_fabric::order::full_fence();
        first_err.map_or(Ok(()), Err)
    }

    pub(crate) fn wait_op(&self, op: &OpState) -> Result<u64> {
        self.wait(Deps::Rank(op.target), "an RMA or atomic operation", || op.is_done())?;
        op.outcome()
    }

    /// Polls a pending operation once from a future.
    fn poll_op(&self, op: &OpState, cx: &mut Context<'_>) -> Poll<Result<u64>> {
        if let Err(e) = self.poll() {
            return Poll::Ready(Err(e));
        }
        if op.is_done() {
            return Poll::Ready(op.outcome());
        }
        *op.waker.lock().unwrap_or_else(|p| p.into_inner()) = Some(cx.waker().clone());
        if op.is_done() {
            return Poll::Ready(op.outcome());
        }
        self.future_pending(cx);
        Poll::Pending
    }
}

/// Polls a handle's operation in flight: ready once it completed (or there is none). A
/// failed operation stays with the handle, so asking again gives the same error.
fn poll_in_flight(op: &Option<(Arc<Comm>, Arc<OpState>)>, cx: &mut Context<'_>) -> Poll<Result<()>> {
    let Some((comm, o)) = op else { return Poll::Ready(Ok(())) };
    comm.poll_op(o, cx).map(|r| r.map(drop))
}

/// Handle of a non-blocking put or get. Complete it with [`RmaHandle::wait`], check it with
/// [`RmaHandle::test`], or `.await` it (it is a `Future`). Dropping an unfinished handle waits
/// for it, so a get's destination is never left half-written.
///
/// ```no_run
/// # let world = weft_runtime::World::init()?;
/// # let seg = world.alloc_segment::<u64>(16)?;
/// let mut buf = [0u64; 4];
/// let h = world.get_nb(seg.at(0, 0), &mut buf)?;
/// // ... compute while the data moves ...
/// h.wait()?;
/// # Ok::<(), weft_runtime::Error>(())
/// ```
#[must_use = "an RMA handle does nothing unless waited on, tested or awaited"]
pub struct RmaHandle<'a> {
    /// The world and the operation while it is in flight.
    op: Option<(Arc<Comm>, Arc<OpState>)>,
    /// A pending get's destination (boxed: a put's handle stays three words, which floods of
    /// handles feel).
    out: Option<Box<GetOut<'a>>>,
}

/// Where a pending get's data goes.
struct GetOut<'a> {
    buf: &'a mut [u8],
    /// Byte ranges of `buf` that the fetched data fills, in order (empty: all of `buf`).
    scatter: Vec<std::ops::Range<usize>>,
}

impl<'a> RmaHandle<'a> {
    pub(crate) fn done() -> Self {
        RmaHandle { op: None, out: None }
    }
    pub(crate) fn pending(comm: &Comm, op: Arc<OpState>, out: Option<&'a mut [u8]>) -> Self {
        let out = out.map(|buf| Box::new(GetOut { buf, scatter: vec![] }));
        RmaHandle { op: Some((comm.arc(), op)), out }
    }
    /// A get whose data lands in the given ranges of `out`, in order.
    pub(crate) fn pending_scatter(
        comm: &Comm,
        op: Arc<OpState>,
        out: &'a mut [u8],
        scatter: Vec<std::ops::Range<usize>>,
    ) -> Self {
        RmaHandle { op: Some((comm.arc(), op)), out: Some(Box::new(GetOut { buf: out, scatter })) }
    }
    /// Hands over a completed operation's data; a failed one keeps failing.
    fn finish(&mut self) -> Result<()> {
        let Some((_, op)) = &self.op else {
            return Ok(());
        };
        op.outcome()?;
        let Some((_, op)) = self.op.take() else { return Ok(()) };
        if let Some(out) = self.out.take() {
            let GetOut { buf, scatter } = *out;
            op.copy_out(buf, scatter.into_iter());
        }
        Ok(())
    }
    /// Blocks (making progress) until the operation is complete: data visible at the target
    /// for a put, in the destination buffer for a get.
    pub fn wait(mut self) -> Result<()> {
        if let Some((comm, op)) = &self.op {
            comm.wait_op(op)?;
        }
        self.finish()
    }
    /// Makes progress once; true if the operation is complete (then the handle is spent).
    pub fn test(&mut self) -> Result<bool> {
        match &self.op {
            None => Ok(true),
            Some((comm, op)) => {
                comm.poll()?;
                if op.is_done() {
                    self.finish()?;
                    return Ok(true);
                }
                Ok(false)
            }
        }
    }
}

impl Future for RmaHandle<'_> {
    type Output = Result<()>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = &mut *self;
        poll_in_flight(&this.op, cx).map(|r| r.and_then(|()| this.finish()))
    }
}

impl Drop for RmaHandle<'_> {
    fn drop(&mut self) {
        if let Some((comm, op)) = &self.op {
            let _ = comm.wait_op(op);
            let _ = self.finish();
        }
    }
}

/// Handle of a non-blocking remote atomic; yields the previous value.
#[must_use = "an atomic handle does nothing unless waited on, tested or awaited"]
pub struct AtomicHandle {
    state: Result<u64, (Arc<Comm>, Arc<OpState>)>,
}

impl AtomicHandle {
    pub(crate) fn done(v: u64) -> Self {
        AtomicHandle { state: Ok(v) }
    }
    pub(crate) fn pending(comm: &Comm, op: Arc<OpState>) -> Self {
        AtomicHandle { state: Err((comm.arc(), op)) }
    }
    /// Blocks until the operation is applied; returns the previous value.
    pub fn wait(self) -> Result<u64> {
        match &self.state {
            Ok(v) => Ok(*v),
            Err((comm, op)) => comm.wait_op(op),
        }
    }
    /// Makes progress once; `Some(previous value)` when complete.
    pub fn test(&mut self) -> Result<Option<u64>> {
        match &self.state {
            Ok(v) => Ok(Some(*v)),
            Err((comm, op)) => {
                comm.poll()?;
                if op.is_done() {
                    let v = op.outcome()?;
                    self.state = Ok(v);
                    return Ok(Some(v));
                }
                Ok(None)
            }
        }
    }
}

impl Future for AtomicHandle {
    type Output = Result<u64>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<u64>> {
        match &self.state {
            Ok(v) => Poll::Ready(Ok(*v)),
            Err((comm, op)) => comm.poll_op(op, cx),
        }
    }
}

/// Handle of a non-blocking get into a vector it owns ([`Comm::get_vec_nb`]): `.await` it,
/// [`GetVec::wait`] for it or test it; it gives the vector. Owning its destination and its
/// world, it can move anywhere (`tokio::spawn`), unlike [`RmaHandle`] of a get, which
/// borrows the caller's buffer. Dropped unfinished, it lets the operation end unseen.
///
/// ```no_run
/// # use weft_runtime as weft;
/// # let world = weft::World::init()?;
/// let seg = world.alloc_segment::<u64>(1024)?;
/// let h = world.get_vec_nb(seg.at(0, 0), 16)?;
/// let v: Vec<u64> = weft::block_on(h)?;
/// assert_eq!(v.len(), 16);
/// # Ok::<(), weft::Error>(())
/// ```
#[must_use = "a get handle does nothing unless waited on, tested or awaited"]
pub struct GetVec<T: Pod> {
    /// The world and the operation while it is in flight.
    op: Option<(Arc<Comm>, Arc<OpState>)>,
    /// The destination: the fabric holds a share of it while it reads into it.
    buf: ReadBuf,
    /// Whether the operation's data is copied into `buf` at completion (not read in place).
    copy: bool,
    /// The data went to the caller (a later test or poll is an error).
    given: bool,
    _elem: PhantomData<T>,
}

impl<T: Pod> GetVec<T> {
    pub(crate) fn new(comm: &Comm, op: Option<Arc<OpState>>, buf: ReadBuf, copy: bool) -> Self {
        GetVec { op: op.map(|op| (comm.arc(), op)), buf, copy, given: false, _elem: PhantomData }
    }
    /// The data, once the operation is complete.
    fn finish(&mut self) -> Result<Vec<T>> {
        if self.given {
            return Err(Error::Misuse("GetVec: the data was given already"));
        }
        let held = || Error::Misuse("get_vec_nb: the fabric still holds the buffer after completion");
        if let Some((_, op)) = &self.op {
            // A failed get keeps failing: its partly written vector is never given.
            op.outcome()?;
        }
        if let Some((_, op)) = self.op.take() {
            if self.copy {
                op.copy_out(self.buf.bytes_mut().ok_or_else(held)?, std::iter::empty());
            }
        }
        let v = self.buf.take::<T>().ok_or_else(held)?;
        self.given = true;
        Ok(v)
    }
    /// Blocks (making progress) until the data is here; gives it.
    pub fn wait(mut self) -> Result<Vec<T>> {
        if let Some((comm, op)) = &self.op {
            comm.wait_op(op)?;
        }
        self.finish()
    }
    /// Makes progress once; `Some(data)` when complete (the handle is spent then: testing it
    /// again is an error).
    pub fn test(&mut self) -> Result<Option<Vec<T>>> {
        match &self.op {
            Some((comm, op)) => {
                comm.poll()?;
                if !op.is_done() {
                    return Ok(None);
                }
                self.finish().map(Some)
            }
            None => self.finish().map(Some),
        }
    }
}

impl<T: Pod> Future for GetVec<T> {
    type Output = Result<Vec<T>>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Vec<T>>> {
        let this = &mut *self;
        poll_in_flight(&this.op, cx).map(|r| r.and_then(|()| this.finish()))
    }
}

// Nothing points into the handle (the vector's bytes are on the heap), so it may move while
// polled, whatever `T`.
impl<T: Pod> Unpin for GetVec<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_stays_with_its_operation() {
        let table = OpTable::default();
        let op = OpState::new(1, 2, 0);
        let token = table.register(&op);
        table.complete(token, 0, Err(Error::PeerFailed { rank: 1, reason: "gone".into() }));
        table.complete(token, 0, Ok(()));
        assert!(op.is_done());
        assert!(op.outcome().is_err());
        assert!(op.outcome().is_err(), "asked again, a failed operation must fail again");
        let gone = OpState::new(2, 1, 0);
        table.register(&gone);
        assert_eq!(
            table.fail_gone(&|r| (r == 2).then(|| Error::PeerFailed { rank: 2, reason: "x".into() })),
            1
        );
        assert!(gone.outcome().is_err() && gone.outcome().is_err());
    }
}
