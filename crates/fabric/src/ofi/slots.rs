//! Endpoint transmit slots on libfabric (the Zambre et al. mapping).
//!
//! A *context* (one per [`Fabric::open_slot_inbox`](crate::Fabric::open_slot_inbox) call) is
//! a libfabric domain of its own, with an address vector holding every rank's main endpoint;
//! a context with one slot asks for `FI_THREAD_DOMAIN` (its user is serialised, so the
//! provider takes no locks). A *slot* is an `FI_EP_RDM` endpoint of that domain with its own
//! completion queue and two registered staging buffers: puts (`fi_writemsg`, `FI_INJECT` up
//! to the inject size, `FI_MORE` inside a batch, whose last write is held back until the
//! slot's next operation shows that it is the last) and request AMs leave through it, so
//! threads on different slots share no provider queue. Where the provider offers scalable
//! endpoints (`max_ep_tx_ctx` > 1: sockets 16; tcp 1) a context for several threads holds one,
//! and its slots are its transmit contexts (`fi_tx_context`, each with its own CQ); other
//! contexts, slots beyond the contexts offered, and other providers get one endpoint per
//! slot, as Chapel's libfabric layer does.
//!
//! Receiving stays on each rank's main endpoint (a shared receive context, as in the paper,
//! which studies the initiator side): AMs from slots land in the same pre-posted buffers
//! under the same request credits, which the slots take from the fabric's shared counters.
//!
//! Closed contexts are kept with their endpoints and reused by the next sets ([`Spares`]):
//! opening libfabric endpoints costs far more than an endpoint set's life in a loop, and a
//! provider may hold a peer's state for every endpoint that ever reached it (libfabric's shm
//! provider: 256 per rank, after which writes wait for ever).

use super::expose::OpReg;
use super::ffi::{self, Access, Context, Domain, TxEndpoint, EAGAIN};
use super::{fi_op, frame, CHUNK, RX_BYTES, TAG_REQUEST};
use crate::os::{self, Mapping};
use crate::{
    AmClass, AmOut, AtomicOp, FabricError, FabricResult, LocalRegion, Rank, RemoteRegion, Resource, TxSlot,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_ofi_sys as sys;

/// Most endpoint contexts (domains) one rank opens.
pub(super) const MAX_CONTEXTS: usize = 256;
/// Staging buffers of one slot, each holding one whole AM.
const BUFS: usize = 2;
/// Atomic operand slots of one slot (operand, compare value, result: 32 bytes each), after
/// the staging buffers.
const SMALLS: usize = 64;
const SMALL_BYTES: usize = 32;
/// How long a slot waits for its own completions before reporting the peer.
const STALL: Duration = Duration::from_secs(60);
/// How often a waiting slot looks at a near peer's process, and how long it may be gone.
const CHECK_EVERY: Duration = Duration::from_millis(10);
const GONE_GRACE: Duration = Duration::from_nanos(super::GONE_GRACE_NS);

/// What a slot needs of its fabric.
pub(super) struct SlotParams {
    pub key: u64,
    pub rank: Rank,
    pub credits: Arc<Vec<AtomicU32>>,
    /// Per peer: it finalized or failed (the main endpoint's record).
    pub left: Arc<Vec<std::sync::atomic::AtomicBool>>,
    /// Per peer: its pid where it runs on this host (a slot's waits see it die, as the main
    /// endpoint's waits do; far peers are the main endpoint's probes' to find).
    pub near_pids: Vec<Option<u32>>,
    pub inject: usize,
    pub tx_size: usize,
    pub send_after_write: bool,
    pub counters: Arc<super::expose::Counters>,
    /// Local buffers must be registered (`FI_MR_LOCAL`).
    pub mr_local: bool,
    /// Buffers from this size up are used in place (registered under `FI_MR_LOCAL`).
    pub zcopy_bytes: usize,
    pub max_msg: usize,
    /// The provider's transmit contexts per scalable endpoint (`max_ep_tx_ctx`), for reports.
    pub tx_contexts: usize,
}

/// A closed slot's libfabric objects, ready for another slot of the same context. Fields drop
/// in order: the registration before the endpoint it may be bound to.
pub(super) struct SlotParts {
    stage_mr: ffi::Mr,
    tx: TxEndpoint,
    stage: Mapping,
}

/// The slots a context's closed endpoints left behind (shared by the context and its slots,
/// which return their parts when they drop, whichever closes first).
pub(super) type Returned = Arc<Mutex<Vec<SlotParts>>>;

/// A context (domain) with the endpoints of its slots, open or kept for reuse. Fields drop in
/// order: the returned endpoints before their domain.
pub(super) struct SlotContext {
    pub returned: Returned,
    pub domain: Arc<Domain>,
    /// Whether the domain was opened for one thread (`FI_THREAD_DOMAIN`).
    pub single_thread: bool,
}

/// Closed contexts kept for reuse, with what their slots returned.
#[derive(Default)]
pub(super) struct Spares(Mutex<Vec<SlotContext>>);

impl Spares {
    /// A kept context opened for the same threading, if any.
    pub fn take(&self, single_thread: bool) -> Option<SlotContext> {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let at = v.iter().position(|c| c.single_thread == single_thread)?;
        Some(v.swap_remove(at))
    }
    pub fn keep(&self, c: SlotContext) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(c);
    }
    /// Closes the contexts kept.
    pub fn clear(&self) {
        drop(std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner())));
    }
    /// Contexts kept, and endpoints they hold.
    pub fn counts(&self) -> (usize, usize) {
        let v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        (v.len(), v.iter().map(|c| c.returned.lock().unwrap_or_else(|e| e.into_inner()).len()).sum())
    }
}

/// An operation of a slot in flight: the staging buffer and atomic slot it holds (returned
/// at its completion; a fetching atomic's slot is kept for its caller to read).
struct SlotOp {
    buf: Option<usize>,
    small: Option<(usize, bool)>,
    dst: Rank,
    /// A registration made for the operation (closed once its last piece completed).
    _reg: Option<Arc<OpReg>>,
}

impl SlotOp {
    fn to(dst: Rank) -> Self {
        SlotOp { buf: None, small: None, dst, _reg: None }
    }
    fn staged(dst: Rank, buf: usize) -> Self {
        SlotOp { buf: Some(buf), small: None, dst, _reg: None }
    }
}

/// One transmit slot (see the module documentation). Fields drop in order: the
/// registration before the endpoint it may be bound to, the endpoint before its domain.
pub(super) struct OfiTxSlot {
    /// Taken out only when the slot drops (returned to its context for reuse).
    parts: Option<SlotParts>,
    ctx: Arc<Domain>,
    returned: Returned,
    free: Vec<usize>,
    /// Free atomic operand slots.
    smalls: Vec<usize>,
    inflight: usize,
    failed: Option<FabricError>,
    p: Arc<SlotParams>,
    /// The last write of a batch so far, not posted yet (see [`Held`]).
    held: Option<Held>,
    /// Requests sent per destination (this slot's owner is their one writer).
    sent: crate::counts::PerPeer,
    /// Its bytes (capacity: the inject size).
    held_bytes: Vec<u8>,
}

/// A write posted to the slot with `more` and kept back until the slot's next operation: that
/// one decides whether it leaves with `FI_MORE`. A provider may defer a batch's doorbell until
/// a write without `FI_MORE` (verbs, efa), and the runtime's next operation may not come to
/// this slot at all (a neighbour's put on the hybrid fabric, an atomic, a larger put), so the
/// last write the slot posts before the batch ends must not carry it.
#[derive(Clone, Copy)]
struct Held {
    dst: Rank,
    raddr: u64,
    key: u64,
}

/// What a waiting slot knows of its peer: the main endpoint's record, and for a near peer its
/// process, looked at every [`CHECK_EVERY`] (gone for [`GONE_GRACE`]: dead).
struct Liveness {
    checked: Instant,
    gone: Option<Instant>,
}

impl Liveness {
    fn new(now: Instant) -> Liveness {
        Liveness { checked: now, gone: None }
    }

    fn check(&mut self, p: &SlotParams, dst: Rank, what: &str) -> FabricResult<()> {
        if p.left.get(dst as usize).is_some_and(|l| l.load(Ordering::Acquire)) {
            return Err(FabricError::Peer { rank: dst, reason: format!("left the job or failed ({what})") });
        }
        let Some(pid) = p.near_pids.get(dst as usize).copied().flatten() else { return Ok(()) };
        if self.checked.elapsed() < CHECK_EVERY {
            return Ok(());
        }
        self.checked = Instant::now();
        if crate::os::process_alive(pid) {
            self.gone = None;
        } else if self.gone.get_or_insert(self.checked).elapsed() >= GONE_GRACE {
            return Err(FabricError::Peer { rank: dst, reason: format!("process {pid} is gone ({what})") });
        }
        Ok(())
    }
}

impl OfiTxSlot {
    /// Opens a slot in context `ctx`, on an endpoint a closed slot of it returned or on a new
    /// one.
    pub fn open(ctx: &SlotContext, p: Arc<SlotParams>, sent: crate::counts::PerPeer) -> FabricResult<Self> {
        let reused = ctx.returned.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let parts = match reused {
            Some(parts) => parts,
            None => {
                let tx = ctx.domain.open_endpoint()?;
                let stage = os::map_anonymous(BUFS * RX_BYTES + SMALLS * SMALL_BYTES)?;
                let stage_mr =
                    ctx.domain.register(&tx, stage.as_ptr() as usize, stage.len(), Access::Local)?;
                SlotParts { stage_mr, tx, stage }
            }
        };
        Ok(OfiTxSlot {
            parts: Some(parts),
            ctx: ctx.domain.clone(),
            returned: ctx.returned.clone(),
            free: (0..BUFS).collect(),
            smalls: (0..SMALLS).collect(),
            inflight: 0,
            failed: None,
            held: None,
            held_bytes: Vec::with_capacity(p.inject),
            p,
            sent,
        })
    }

    fn parts(&self) -> &SlotParts {
        self.parts.as_ref().expect("a slot's parts are taken only when it drops")
    }

    fn buf_addr(&self, b: usize) -> usize {
        self.parts().stage.as_ptr() as usize + b * RX_BYTES
    }

    /// Reads this slot's completions; returns how many.
    fn poll(&mut self) -> usize {
        let mut entries = [sys::fi_cq_data_entry::default(); 16];
        match self.parts().tx.ep().cq_read(&mut entries) {
            Ok(n) => {
                for e in &entries[..n] {
                    self.finish(e.op_context, None);
                }
                n
            }
            Err(e) => {
                let why = format!("{} (provider error {})", ffi::strerror(e.err as i64), e.prov_errno);
                self.finish(e.op_context, Some(why));
                1
            }
        }
    }

    /// One completion (`failed`: its error) of the operation with context `c`.
    fn finish(&mut self, c: *mut std::ffi::c_void, failed: Option<String>) {
        if c.is_null() {
            return;
        }
        // SAFETY: every context this slot posts comes from Context::<SlotOp>::into_raw and
        // completes exactly once.
        let op = unsafe { Context::<SlotOp>::from_raw(c) }.op;
        if let Some(b) = op.buf {
            self.free.push(b);
        }
        if let Some((s, false)) = op.small {
            self.smalls.push(s);
        }
        if let Some(why) = failed {
            self.failed.get_or_insert(FabricError::Peer {
                rank: op.dst,
                reason: format!("an endpoint operation failed: {why}"),
            });
        }
        self.inflight -= 1;
    }

    /// Makes progress until `ready` holds, giving up after [`STALL`], or at once when `dst`
    /// (if any) has left the job or failed: it takes nothing more (see the main endpoint's
    /// `check_peer`).
    fn progress_until(
        &mut self,
        dst: Option<Rank>,
        what: &str,
        ready: impl Fn(&Self) -> bool,
    ) -> FabricResult<()> {
        let start = Instant::now();
        let mut live = Liveness::new(start);
        while !ready(self) {
            if self.poll() == 0 {
                if let Some(d) = dst {
                    live.check(&self.p, d, what)?;
                }
                if start.elapsed() > STALL {
                    let toward = dst.map_or(String::new(), |d| format!(" toward rank {d}"));
                    return Err(FabricError::Timeout { what: format!("{what}{toward}") });
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Posts one operation with a boxed context, retrying while the provider's queue is full.
    fn post(
        &mut self,
        op: SlotOp,
        what: &str,
        post: impl Fn(&TxEndpoint, *mut std::ffi::c_void) -> isize,
    ) -> FabricResult<()> {
        let dst = op.dst;
        let tx_size = self.p.tx_size;
        self.progress_until(Some(dst), "a full transmit queue", |s| s.inflight < tx_size)?;
        let ctx = Context::into_raw(op);
        let start = Instant::now();
        let mut live = Liveness::new(start);
        loop {
            let ret = post(&self.parts().tx, ctx);
            if ret == 0 {
                self.inflight += 1;
                return Ok(());
            }
            // A provider that cannot reach a departed peer refuses with EAGAIN for ever.
            let departed = if ret == EAGAIN { live.check(&self.p, dst, what).err() } else { None };
            if ret != EAGAIN || departed.is_some() || start.elapsed() > STALL {
                // SAFETY: the provider refused the operation, so the context is ours again.
                let op = unsafe { Context::<SlotOp>::from_raw(ctx) };
                if let Some(b) = op.op.buf {
                    self.free.push(b);
                }
                if let Some((s, _)) = op.op.small {
                    self.smalls.push(s);
                }
                if let Some(e) = departed {
                    return Err(e);
                }
                if ret == EAGAIN {
                    return Err(FabricError::Timeout { what: format!("{what}: provider queue stayed full") });
                }
                return ffi::check(ret as i64, what);
            }
            self.poll();
            std::thread::yield_now();
        }
    }

    /// A staging buffer, making progress until one is free.
    fn take_buf(&mut self, dst: Rank) -> FabricResult<usize> {
        self.progress_until(Some(dst), "staging buffers", |s| !s.free.is_empty())?;
        Ok(self.free.pop().unwrap_or_default())
    }

    /// Writes `data` to `region` at `offset` in staged pieces (a long AM's payload).
    fn write_staged(&mut self, region: &RemoteRegion, offset: usize, data: &[u8]) -> FabricResult<()> {
        for (i, piece) in data.chunks(RX_BYTES).enumerate() {
            let raddr = region.addr + (offset + i * RX_BYTES) as u64;
            if !self.put_piece(region, raddr, piece, false)? {
                // SAFETY: `piece` is a live slice of `piece.len()` bytes.
                unsafe { self.stage_piece(region, raddr, piece.as_ptr(), piece.len()) }?;
            }
        }
        Ok(())
    }

    /// Copies `n` (≤ [`RX_BYTES`]) bytes at `src` into a staging buffer and writes them to
    /// `raddr` of `region`.
    ///
    /// # Safety
    /// `src..src + n` must be readable memory of this process for the duration of the call.
    unsafe fn stage_piece(
        &mut self,
        region: &RemoteRegion,
        raddr: u64,
        src: *const u8,
        n: usize,
    ) -> FabricResult<()> {
        let b = self.take_buf(region.rank)?;
        let at = self.buf_addr(b);
        // SAFETY: the caller's contract for `src`; buffer b (RX_BYTES ≥ n) is this slot's
        // until the write completes.
        unsafe { crate::copy::copy_bytes(src, at as *mut u8, n) };
        self.p.counters.staged(n);
        let (fa, key, desc) =
            (self.ctx.addrs[region.rank as usize], region.key, self.parts().stage_mr.desc());
        self.post(SlotOp::staged(region.rank, b), "fi_writemsg", |tx, ctx| {
            tx.ep().write(at, n, desc, fa, raddr, key, false, false, ctx)
        })
    }

    /// Writes up to the inject size from `src` directly (copied before return); false when
    /// larger. The held write, if any, leaves first (with `FI_MORE`: this one follows). With
    /// `more`, this write is held in turn.
    fn put_piece(&mut self, dst: &RemoteRegion, raddr: u64, src: &[u8], more: bool) -> FabricResult<bool> {
        if src.len() > self.p.inject {
            self.release_held()?;
            return Ok(false);
        }
        self.post_held(true)?;
        let w = Held { dst: dst.rank, raddr, key: dst.key };
        if more {
            self.held_bytes.clear();
            self.held_bytes.extend_from_slice(src);
            self.held = Some(w);
            return Ok(true);
        }
        self.inject_write(w, src, false)?;
        Ok(true)
    }

    /// Posts the held write, if any: with `FI_MORE` when a write follows at once, else as the
    /// last of its batch.
    fn post_held(&mut self, more: bool) -> FabricResult<()> {
        let Some(h) = self.held.take() else { return Ok(()) };
        let bytes = std::mem::take(&mut self.held_bytes);
        let r = self.inject_write(h, &bytes, more);
        self.held_bytes = bytes;
        r
    }

    /// Posts the held write, if any, as the last of its batch (no `FI_MORE`).
    fn release_held(&mut self) -> FabricResult<()> {
        self.post_held(false)
    }

    /// Posts one write of at most the inject size (the provider copies `src` before return).
    fn inject_write(&mut self, w: Held, src: &[u8], more: bool) -> FabricResult<()> {
        let (fa, buf) = (self.ctx.addrs[w.dst as usize], src.as_ptr() as usize);
        self.post(SlotOp::to(w.dst), "fi_writemsg", |tx, ctx| {
            tx.ep().write(buf, src.len(), 0, fa, w.raddr, w.key, true, more, ctx)
        })
    }

    /// Waits until every operation this slot posted has completed; reports a failed one.
    /// Those operations use memory the caller gets back when this returns, so it never
    /// returns before: a stalled or departed peer is said once on standard error and the wait
    /// goes on until the provider completes or fails them.
    fn drain(&mut self, dst: Rank, what: &str) -> FabricResult<()> {
        let mut stuck = None;
        while let Err(e) = self.progress_until(Some(dst), what, |s| s.inflight == 0) {
            if stuck.is_none() {
                super::say_stuck(self.p.rank, &e);
            }
            stuck.get_or_insert(e);
            std::thread::sleep(Duration::from_millis(1));
        }
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Posts writes (`write`) or reads of `len` bytes at local `addr` in place, in pieces of
    /// the provider's largest message; `desc` describes the local memory's registration (0
    /// where the provider needs none), which the pieces hold until the last completes.
    fn post_pieces(
        &mut self,
        write: bool,
        (region, offset): (&RemoteRegion, usize),
        (addr, len): (usize, usize),
        (desc, reg): (usize, Option<Arc<OpReg>>),
    ) -> FabricResult<()> {
        let (piece, fa, key) = (self.p.max_msg.max(1), self.ctx.addrs[region.rank as usize], region.key);
        let mut done = 0;
        while done < len {
            let (n, buf, raddr) =
                ((len - done).min(piece), addr + done, region.addr + (offset + done) as u64);
            let op = SlotOp { buf: None, small: None, dst: region.rank, _reg: reg.clone() };
            if write {
                self.post(op, "fi_writemsg", |tx, ctx| {
                    tx.ep().write(buf, n, desc, fa, raddr, key, false, false, ctx)
                })?;
            } else {
                self.post(op, "fi_read", |tx, ctx| tx.ep().read(buf, n, desc, fa, raddr, key, ctx))?;
            }
            done += n;
        }
        Ok(())
    }

    /// The local descriptor of `len` bytes at `addr` for an operation of this slot: none
    /// needed (0), or under `FI_MR_LOCAL` a registration in this slot's domain made for it.
    fn register_op(&self, addr: usize, len: usize) -> FabricResult<(usize, Option<Arc<OpReg>>)> {
        if !self.p.mr_local {
            return Ok((0, None));
        }
        let mr = self.ctx.register(&self.parts().tx, addr, len, Access::Local)?;
        Ok((mr.desc(), Some(Arc::new(OpReg::new(mr, &self.p.counters)))))
    }

    /// Moves `len` bytes at local `addr` to (`write`) or from (`region`, `offset`) in place
    /// and waits for them, where that beats staging: without `FI_MR_LOCAL` writes above a
    /// staging chunk and every read; under it, from the zero-copy threshold up (registered
    /// in this slot's domain). `false`: stage them.
    fn try_in_place(
        &mut self,
        write: bool,
        at: (&RemoteRegion, usize),
        (addr, len): (usize, usize),
    ) -> FabricResult<bool> {
        let wanted = if self.p.mr_local { len >= self.p.zcopy_bytes } else { !write || len > CHUNK };
        if !wanted {
            return Ok(false);
        }
        let reg = self.register_op(addr, len)?;
        let posted = self.post_pieces(write, at, (addr, len), reg);
        // Pieces already posted use the memory: wait for them even after a failed post.
        let drained = self.drain(at.0.rank, "an endpoint's transfer");
        posted.and(drained).map(|_| true)
    }

    /// Reads `dst.len()` bytes at `offset` of `src` through the staging buffers, a piece at a
    /// time.
    fn read_staged(&mut self, src: &RemoteRegion, offset: usize, dst: &mut [u8]) -> FabricResult<()> {
        let (fa, key, desc) = (self.ctx.addrs[src.rank as usize], src.key, self.parts().stage_mr.desc());
        for (i, piece) in dst.chunks_mut(RX_BYTES).enumerate() {
            let b = self.take_buf(src.rank)?;
            let (at, n, raddr) = (self.buf_addr(b), piece.len(), src.addr + (offset + i * RX_BYTES) as u64);
            self.post(SlotOp::staged(src.rank, b), "fi_read", |tx, ctx| {
                tx.ep().read(at, n, desc, fa, raddr, key, ctx)
            })?;
            self.drain(src.rank, "an endpoint's get")?;
            // SAFETY: the read into buffer b (RX_BYTES ≥ n) completed; nothing else uses the
            // slot meanwhile (`&mut self`).
            unsafe { crate::copy::copy_bytes(at as *const u8, piece.as_mut_ptr(), n) };
            self.p.counters.staged(n);
        }
        Ok(())
    }

    fn small_addr(&self, s: usize) -> usize {
        self.parts().stage.as_ptr() as usize + BUFS * RX_BYTES + s * SMALL_BYTES
    }

    /// Takes one request credit toward `dst` from the fabric's shared counters.
    fn take_credit(&self, dst: Rank) -> bool {
        self.p.credits[dst as usize]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1))
            .is_ok()
    }

    fn give_credit(&self, dst: Rank) {
        self.p.credits[dst as usize].fetch_add(1, Ordering::AcqRel);
    }

    /// Sends one framed request (the credit is taken); `Ok(false)` when nothing could take it.
    fn send(&mut self, dst: Rank, msg: &AmOut<'_>) -> FabricResult<bool> {
        let p = self.p.clone();
        let f = frame(p.key, p.rank, dst, msg, p.send_after_write)?;
        if let Some((region, offset, data)) = f.write_first {
            self.write_staged(region, offset, data)?;
            if !p.send_after_write {
                self.progress_until(Some(dst), "a long AM's payload", |s| s.inflight == 0)?;
            }
        }
        let total = f.header.total();
        let fa = self.ctx.addrs[dst as usize];
        if total <= p.inject.min(512) {
            let mut buf = [0u8; 512];
            f.encode(msg.args, &mut buf[..total]);
            let ret = self.parts().tx.ep().inject(&buf[..total], fa, TAG_REQUEST);
            if ret == EAGAIN && f.write_first.is_none() {
                self.poll();
                return Ok(false);
            }
            if ret != EAGAIN {
                ffi::check(ret as i64, "fi_inject")?;
                return Ok(true);
            }
        }
        // Staged (and a long AM's header whose payload is already written: it must go).
        let b = self.take_buf(dst)?;
        let at = self.buf_addr(b);
        // SAFETY: buffer b (RX_BYTES ≥ header + args + MAX_MEDIUM) is this slot's until the
        // send completes.
        f.encode(msg.args, unsafe { std::slice::from_raw_parts_mut(at as *mut u8, total) });
        let desc = self.parts().stage_mr.desc();
        self.post(SlotOp::staged(dst, b), "fi_send", |tx, ctx| {
            tx.ep().send(at, total, desc, fa, TAG_REQUEST, ctx)
        })?;
        Ok(true)
    }
}

impl TxSlot for OfiTxSlot {
    fn am_try_send(&mut self, dst: Rank, msg: &AmOut<'_>) -> FabricResult<bool> {
        if msg.class != AmClass::Request {
            return Err(FabricError::Malformed { what: "only requests travel on endpoint slots".into() });
        }
        if dst as usize >= self.p.credits.len() {
            return Err(FabricError::Malformed {
                what: format!("AM to rank {dst} of {}", self.p.credits.len()),
            });
        }
        self.release_held()?;
        if !self.take_credit(dst) {
            self.poll();
            return Ok(false);
        }
        match self.send(dst, msg) {
            Ok(true) => {
                crate::counts::add_single(&self.sent[dst as usize], 1);
                Ok(true)
            }
            other => {
                self.give_credit(dst);
                other
            }
        }
    }

    fn doorbell(&mut self) {
        if let Err(e) = self.release_held() {
            // Reported by the next `complete`, like a failed completion.
            self.failed.get_or_insert(e);
        }
        self.poll();
    }

    fn carries_rma(&self) -> bool {
        true
    }

    fn put(&mut self, dst: &RemoteRegion, offset: usize, src: &[u8], more: bool) -> FabricResult<bool> {
        dst.check(offset, src.len())?;
        if self.put_piece(dst, dst.addr + offset as u64, src, more)? {
            return Ok(true);
        }
        if !self.try_in_place(true, (dst, offset), (src.as_ptr() as usize, src.len()))? {
            self.write_staged(dst, offset, src)?;
        }
        Ok(true)
    }

    fn put_from(
        &mut self,
        (dst, dst_offset): (&RemoteRegion, usize),
        (src, src_offset): (&LocalRegion, usize),
        len: usize,
    ) -> FabricResult<bool> {
        dst.check(dst_offset, len)?;
        if src_offset.checked_add(len).is_none_or(|end| end > src.len) {
            return Err(FabricError::OutOfBounds { offset: src_offset, len, region_len: src.len });
        }
        if len == 0 {
            return Ok(true);
        }
        self.release_held()?;
        let addr = src.as_ptr() as usize + src_offset;
        if self.p.mr_local && len < self.p.zcopy_bytes {
            // Small sources are staged rather than registered in this slot's domain.
            for done in (0..len).step_by(RX_BYTES) {
                let n = (len - done).min(RX_BYTES);
                let raddr = dst.addr + (dst_offset + done) as u64;
                // SAFETY: [addr + done, + n) lies inside `src`'s mapping (bounds checked
                // above), which `src` keeps mapped for this call.
                unsafe { self.stage_piece(dst, raddr, (addr + done) as *const u8, n) }?;
            }
            return Ok(true);
        }
        // The source is registered in the fabric's main domain; this slot's domain needs a
        // registration of its own where the provider wants local descriptors.
        let reg = self.register_op(addr, len)?;
        self.post_pieces(true, (dst, dst_offset), (addr, len), reg)?;
        Ok(true)
    }

    fn get(&mut self, src: &RemoteRegion, offset: usize, dst: &mut [u8]) -> FabricResult<bool> {
        src.check(offset, dst.len())?;
        self.release_held()?;
        if !self.try_in_place(false, (src, offset), (dst.as_mut_ptr() as usize, dst.len()))? {
            self.read_staged(src, offset, dst)?;
        }
        Ok(true)
    }

    fn atomic(
        &mut self,
        (dst, offset): (&RemoteRegion, usize),
        op: AtomicOp,
        fetch: bool,
    ) -> FabricResult<Option<u64>> {
        dst.check(offset, 8)?;
        if !(dst.addr + offset as u64).is_multiple_of(8) {
            return Err(FabricError::Malformed {
                what: format!("atomic at offset {offset}: not 8-byte aligned"),
            });
        }
        self.release_held()?;
        self.progress_until(Some(dst.rank), "atomic operand slots", |s| !s.smalls.is_empty())?;
        let s = self.smalls.pop().unwrap_or_default();
        let at = self.small_addr(s);
        let (fop, operand, compare) = fi_op(op);
        // SAFETY: small slot s (32 bytes, 8-aligned, inside the staging mapping) is this
        // operation's until it completes.
        unsafe {
            std::ptr::write(at as *mut u64, operand);
            std::ptr::write((at + 8) as *mut u64, compare);
        }
        let (fa, raddr, key, desc) = (
            self.ctx.addrs[dst.rank as usize],
            dst.addr + offset as u64,
            dst.key,
            self.parts().stage_mr.desc(),
        );
        let op = SlotOp { buf: None, small: Some((s, fetch)), dst: dst.rank, _reg: None };
        self.post(op, "fi_atomic", |tx, ctx| tx.ep().atomic(at, desc, fa, raddr, key, fop, ctx))?;
        if !fetch {
            return Ok(Some(0));
        }
        self.drain(dst.rank, "an endpoint's atomic")?;
        // SAFETY: the atomic completed (drained); its result word lies in slot s.
        let v = unsafe { std::ptr::read((at + 16) as *const u64) };
        self.smalls.push(s);
        Ok(Some(v))
    }

    fn complete(&mut self) -> FabricResult<bool> {
        self.release_held()?;
        self.poll();
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        Ok(self.inflight == 0)
    }

    fn resources(&self) -> Resource {
        let how = match self.parts().tx.scalable {
            true => format!(
                "one of the {} transmit contexts of its context's scalable endpoint",
                self.p.tx_contexts.min(ffi::SEP_CONTEXTS)
            ),
            false if self.p.tx_contexts > 1 => format!(
                "an RDM endpoint of its own: its context is for one thread, or its scalable \
                 endpoint's {} transmit contexts are taken",
                self.p.tx_contexts.min(ffi::SEP_CONTEXTS)
            ),
            false => "an RDM endpoint of its own: the provider offers no scalable endpoints".to_string(),
        };
        Resource {
            kind: format!("libfabric endpoint + CQ + staging MR (endpoint slot: {how})"),
            count: 1,
            bytes: (self.parts().stage.len() + self.p.tx_size * std::mem::size_of::<sys::fi_cq_data_entry>())
                as u64,
        }
    }
}

impl Drop for OfiTxSlot {
    /// Waits (bounded) for what is in flight: the contexts and staging buffers must outlive
    /// their operations.
    fn drop(&mut self) {
        let released = self.release_held();
        let drained = released
            .and_then(|()| self.progress_until(None, "closing an endpoint slot", |s| s.inflight == 0));
        // An endpoint with operations still in flight is closed, not reused.
        if let (Ok(()), Some(parts)) = (drained, self.parts.take()) {
            self.returned.lock().unwrap_or_else(|e| e.into_inner()).push(parts);
        }
    }
}
