//! The software side of an endpoint: a posting list of descriptors (inline payloads copied
//! into an arena, or references to registered memory), published to a transmit slot in
//! batches, and the completion structure that publishing signals.

use crate::ops::OpState;
use crate::progress::Deps;
use crate::{Comm, Result};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use weft_fabric::{AmClass, AmOut, AmPayload, AtomicOp, Issued, RemoteRegion, TxSlot};

/// A target in a segment, resolved and bounds-checked when the operation was posted.
/// The region is copied (not borrowed) so that endpoints borrow nothing but the world.
#[derive(Clone, Copy)]
pub(super) struct Target {
    pub rank: u32,
    pub seg: u32,
    pub region: RemoteRegion,
    pub off: usize,
}

/// Where a put's payload comes from.
pub(super) enum Src<'a> {
    Bytes(&'a [u8]),
    /// This many bytes of this rank's registered memory.
    Registered(&'a Target, usize),
}

/// How an executed operation completes.
pub(super) enum Outcome {
    Done,
    /// Posted on the endpoint's transmit slot: the slot completes it.
    Slot,
    /// Pending with token 0: the fabric's quiet completes it.
    Quiet,
    /// Sent over the AM-based path: complete when the reply comes.
    Op(Arc<OpState>),
    /// Sent over the AM-based path on the endpoint's slot, which must make progress too.
    SlotOp(Arc<OpState>),
}

/// Executes a put now.
pub(super) fn exec_put(comm: &Comm, to: &Target, src: Src<'_>) -> Result<Outcome> {
    if !comm.native_rma {
        let staged;
        let bytes = match src {
            Src::Bytes(b) => b,
            Src::Registered(f, len) => {
                staged = registered_bytes(comm, f, len)?;
                &staged[..]
            }
        };
        return Ok(Outcome::Op(comm.am_put(to.rank, to.seg, to.off, bytes)?));
    }
    let issued = match src {
        Src::Bytes(b) => comm.fabric.put(&to.region, to.off, b, 0)?,
        Src::Registered(f, len) => comm.fabric.put_from(&to.region, to.off, &f.region, f.off, len, 0)?,
    };
    Ok(if issued == Issued::Pending { Outcome::Quiet } else { Outcome::Done })
}

/// A copy of `len` bytes of this rank's registered memory at `from`.
fn registered_bytes(comm: &Comm, from: &Target, len: usize) -> Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    comm.fabric.get(&from.region, from.off, &mut b)?;
    Ok(b)
}

/// Executes a put through the endpoint's slot where it carries RMA to the target (natively,
/// or as AM requests on the slot where RMA runs over AMs) and takes it, else on the world's
/// path.
pub(super) fn put_via(
    comm: &Comm,
    slot_rma: bool,
    slot: &mut SlotRef<'_>,
    to: &Target,
    bytes: &[u8],
    more: bool,
) -> Result<Outcome> {
    if let Some(s) = slot.get().filter(|s| slot_rma && s.carries_rma_to(to.rank)) {
        if !comm.native_rma {
            return Ok(Outcome::SlotOp(comm.am_put_with(
                &mut on_slot(comm, s),
                (to.rank, to.seg, to.off),
                bytes,
            )?));
        }
        if s.put(&to.region, to.off, bytes, more)? {
            return Ok(Outcome::Slot);
        }
        comm.off_slot.fetch_add(1, Ordering::Relaxed);
    }
    exec_put(comm, to, Src::Bytes(bytes))
}

/// [`put_via`] for `len` bytes of this rank's registered memory at `from`.
pub(super) fn put_from_via(
    comm: &Comm,
    slot_rma: bool,
    slot: &mut SlotRef<'_>,
    to: &Target,
    from: &Target,
    len: usize,
) -> Result<Outcome> {
    if !comm.native_rma {
        // The AM-based path sends from a buffer.
        return put_via(comm, slot_rma, slot, to, &registered_bytes(comm, from, len)?, false);
    }
    if let Some(s) = slot.get().filter(|s| slot_rma && s.carries_rma_to(to.rank)) {
        if let Some(info) = comm.segments.get(from.seg) {
            if s.put_from((&to.region, to.off), (&info.local, from.off), len)? {
                return Ok(Outcome::Slot);
            }
        }
        comm.off_slot.fetch_add(1, Ordering::Relaxed);
    }
    exec_put(comm, to, Src::Registered(from, len))
}

/// Reads `dst.len()` bytes at `from` through the endpoint's slot where it carries RMA to it;
/// `false` where the world's path must.
pub(super) fn get_via(
    comm: &Comm,
    slot_rma: bool,
    slot: &mut SlotRef<'_>,
    from: &Target,
    dst: &mut [u8],
) -> Result<bool> {
    if let Some(s) = slot.get().filter(|s| slot_rma && s.carries_rma_to(from.rank)) {
        if !comm.native_rma {
            let op = comm.am_get_with(&mut on_slot(comm, s), (from.rank, from.seg, from.off), dst.len())?;
            wait_on_slot(comm, s, &op)?;
            op.copy_out(dst, std::iter::empty());
            return Ok(true);
        }
        if s.get(&from.region, from.off, dst)? {
            return Ok(true);
        }
        comm.off_slot.fetch_add(1, Ordering::Relaxed);
    }
    Ok(false)
}

/// Applies an atomic through the endpoint's slot where it carries RMA to the target:
/// natively where the fabric's atomics reach it, else as an AM request the target's CPU
/// applies, sent on the slot. `fetch`: waits and returns the previous value; else
/// `Outcome::Slot` or the AM's operation. `None` where the world's path must.
pub(super) fn atomic_via(
    comm: &Comm,
    slot_rma: bool,
    slot: &mut SlotRef<'_>,
    to: &Target,
    op: AtomicOp,
    fetch: bool,
) -> Result<Option<(Outcome, u64)>> {
    let Some(s) = slot.get().filter(|s| slot_rma && s.carries_rma_to(to.rank)) else { return Ok(None) };
    if comm.native_atomics && comm.fabric.native_atomics_to(to.rank) {
        if let Some(v) = s.atomic((&to.region, to.off), op, fetch)? {
            return Ok(Some((if fetch { Outcome::Done } else { Outcome::Slot }, v)));
        }
        comm.off_slot.fetch_add(1, Ordering::Relaxed);
        return Ok(None);
    }
    let state = comm.am_atomic_with(&mut on_slot(comm, s), (to.rank, to.seg, to.off), op)?;
    if fetch {
        let v = wait_on_slot(comm, s, &state)?;
        return Ok(Some((Outcome::Done, v)));
    }
    Ok(Some((Outcome::SlotOp(state), 0)))
}

/// Waits for an AM-based operation whose requests left on slot `s` (which makes progress
/// meanwhile: a provider with manual progress sends only then); returns its value.
fn wait_on_slot(comm: &Comm, s: &mut (dyn TxSlot + 'static), op: &OpState) -> Result<u64> {
    s.doorbell();
    comm.wait_fabric(Deps::Rank(op.target), "an endpoint operation over AMs", || {
        s.complete()?;
        Ok(op.is_done())
    })?;
    op.outcome()
}

/// Sends the AM-based path's requests through slot `s`.
fn on_slot<'s>(
    comm: &'s Comm,
    s: &'s mut (dyn TxSlot + 'static),
) -> impl FnMut(u32, u16, &[u64], AmPayload<'_>) -> Result<()> + 's {
    move |rank, h, args, payload| send(comm, Some(&mut *s), rank, h, args, payload)
}

/// Executes an atomic whose result is discarded now.
pub(super) fn exec_atomic(comm: &Comm, to: &Target, op: AtomicOp) -> Result<Outcome> {
    if !comm.native_atomics || !comm.fabric.native_atomics_to(to.rank) {
        return Ok(Outcome::Op(comm.am_atomic(to.rank, to.seg, to.off, op)?));
    }
    let issued = comm.fabric.atomic(&to.region, to.off, op, 0)?;
    Ok(if issued == Issued::Pending { Outcome::Quiet } else { Outcome::Done })
}

/// Inline payloads up to this size travel inside the descriptor.
pub(super) const SMALL: usize = 16;

/// Up to [`SMALL`] bytes held in two words: bytes `0..8` and bytes `len-8..len` (for
/// shorter payloads, the first word alone, zero-padded). Kept in registers while a descriptor
/// is built and read back word by word: a byte array written piecewise and then moved as a
/// whole stalls on store forwarding (it cost a third of an 8-byte put).
#[derive(Clone, Copy)]
pub(super) struct Small {
    lo: u64,
    hi: u64,
    pub len: u8,
}

impl Small {
    pub fn new(b: &[u8]) -> Self {
        let len = b.len();
        debug_assert!(len <= SMALL);
        let word = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or_default());
        if len >= 8 {
            Small { lo: word(&b[..8]), hi: word(&b[len - 8..]), len: len as u8 }
        } else {
            let lo = b.iter().rev().fold(0u64, |acc, &x| acc << 8 | x as u64);
            Small { lo, hi: 0, len: len as u8 }
        }
    }

    pub fn bytes(&self) -> [u8; SMALL] {
        let mut out = [0u8; SMALL];
        let len = self.len as usize;
        out[..8].copy_from_slice(&self.lo.to_le_bytes());
        if len >= 8 {
            out[len - 8..len].copy_from_slice(&self.hi.to_le_bytes());
        }
        out
    }
}

/// One posted operation.
pub(super) enum Desc {
    /// A put of at most [`SMALL`] bytes, carried in the descriptor itself.
    PutSmall { to: Target, small: Small },
    /// A put whose payload was copied into the arena at post time (inline).
    Put { to: Target, data: Range<usize> },
    /// A put whose payload is read from this rank's registered memory when published.
    PutFrom { to: Target, from: Target, len: usize },
    /// An atomic whose result is discarded.
    Atomic { to: Target, op: AtomicOp },
    /// A request AM with arguments in `words` and an inline medium payload in the arena.
    Am { dst: u32, handler: u16, args: Range<usize>, payload: Option<Range<usize>> },
}

/// A completion structure: a counter of completed operations, bumped once per signaled
/// completion. Private ones are plain cells; shared ones are an atomic on its own line.
pub(super) enum Cq {
    Own(u64),
    Shared(Arc<CqLine>),
}

/// A shared completion counter, alone on its cache line.
#[repr(align(64))]
#[derive(Default)]
pub(super) struct CqLine(AtomicU64);

impl Cq {
    fn signal(&mut self, ops: u64) {
        match self {
            Cq::Own(n) => *n += ops,
            Cq::Shared(line) => {
                line.0.fetch_add(ops, Ordering::Release);
            }
        }
    }
    pub fn count(&self) -> u64 {
        match self {
            Cq::Own(n) => *n,
            Cq::Shared(line) => line.0.load(Ordering::Acquire),
        }
    }
}

/// Per-endpoint knobs (the paper's features).
#[derive(Clone, Copy, Debug)]
pub(super) struct Knobs {
    pub postlist: usize,
    pub signal_every: u64,
    pub inline_max: usize,
}

/// A posting list. Everything in it is published, in order, by [`Queue::publish`].
#[derive(Default)]
pub(super) struct Queue {
    pub descs: Vec<Desc>,
    pub arena: Vec<u8>,
    pub words: Vec<u64>,
    /// Operations executed since the last signaled completion.
    unsignaled: u64,
    /// Some operation came back `Pending` with token 0: the fabric's quiet completes it.
    needs_quiet: bool,
    /// Operations that went over the AM-based path and complete with a reply.
    pending: Vec<Arc<OpState>>,
    /// The slot carries puts itself ([`TxSlot::carries_rma`]: a network endpoint).
    pub slot_rma: bool,
    /// Some operation was posted on the slot and completes there.
    slot_pending: bool,
}

impl Queue {
    pub fn with_capacity(postlist: usize, slot_rma: bool) -> Self {
        Queue { descs: Vec::with_capacity(postlist), slot_rma, ..Default::default() }
    }

    /// Copies `bytes` into the arena.
    pub fn stage(&mut self, bytes: &[u8]) -> Range<usize> {
        let start = self.arena.len();
        self.arena.extend_from_slice(bytes);
        start..self.arena.len()
    }

    /// Executes every posted operation through `slot` (or the default path), rings the
    /// doorbell once, and signals the completion structure once per `signal_every` operations.
    pub fn publish(&mut self, comm: &Comm, slot: &mut SlotRef<'_>, cq: &mut Cq, k: Knobs) -> Result<()> {
        let n = self.descs.len() as u64;
        let mut descs = std::mem::take(&mut self.descs);
        let mut result = Ok(());
        let rma = self.slot_rma;
        for (i, d) in descs.drain(..).enumerate() {
            let more = (i as u64) + 1 < n;
            let r = match d {
                Desc::PutSmall { to, small } => {
                    put_via(comm, rma, slot, &to, &small.bytes()[..small.len as usize], more)
                }
                Desc::Put { to, data } => put_via(comm, rma, slot, &to, &self.arena[data], more),
                Desc::PutFrom { to, from, len } => put_from_via(comm, rma, slot, &to, &from, len),
                Desc::Atomic { to, op } => match atomic_via(comm, rma, slot, &to, op, false) {
                    Ok(Some((o, _))) => Ok(o),
                    Ok(None) => exec_atomic(comm, &to, op),
                    Err(e) => Err(e),
                },
                Desc::Am { dst, handler, args, payload } => {
                    let payload = match payload {
                        Some(p) => AmPayload::Medium(&self.arena[p]),
                        None => AmPayload::Short,
                    };
                    send(comm, slot.get(), dst, handler, &self.words[args], payload).map(|_| Outcome::Done)
                }
            }
            .map(|o| self.record(o));
            if let Err(e) = r {
                result = Err(e);
                break;
            }
        }
        // `drain` left `descs` empty (an error drops the rest); keep its allocation.
        self.descs = descs;
        self.arena.clear();
        self.words.clear();
        slot.doorbell();
        self.count(n, cq, k);
        result
    }

    /// Counts `n` executed operations, signaling the completion structure every
    /// `signal_every` of them.
    pub fn count(&mut self, n: u64, cq: &mut Cq, k: Knobs) {
        self.unsignaled += n;
        while self.unsignaled >= k.signal_every {
            cq.signal(k.signal_every);
            self.unsignaled -= k.signal_every;
        }
    }

    /// Publishes what is posted and completes everything: the last operations get a signaled
    /// completion, pending ones are waited for.
    pub fn flush(&mut self, comm: &Comm, slot: &mut SlotRef<'_>, cq: &mut Cq, k: Knobs) -> Result<()> {
        let published = self.publish(comm, slot, cq, k);
        if self.unsignaled > 0 {
            cq.signal(self.unsignaled);
            self.unsignaled = 0;
        }
        if std::mem::take(&mut self.needs_quiet) {
            comm.fabric.quiet()?;
        }
        let mut first_err = published.err();
        if std::mem::take(&mut self.slot_pending) {
            if let Some(Err(e)) =
                slot.get().map(|s| comm.wait_fabric(Deps::AnyDead, "an endpoint flush", || s.complete()))
            {
                first_err.get_or_insert(e);
            }
        }
        for op in self.pending.drain(..) {
            let r = comm
                .wait(Deps::Rank(op.target), "an endpoint flush", || op.is_done())
                .and_then(|_| op.outcome().map(drop));
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Remembers how an executed operation completes, for [`Queue::flush`].
    pub fn record(&mut self, o: Outcome) {
        match o {
            Outcome::Done => {}
            Outcome::Slot => self.slot_pending = true,
            Outcome::Quiet => self.needs_quiet = true,
            Outcome::Op(op) => self.pending.push(op),
            Outcome::SlotOp(op) => {
                self.slot_pending = true;
                self.pending.push(op);
            }
        }
    }
}

/// An endpoint's slot for one publish: its own, or a shared one locked on first use. Puts and
/// atomics need no slot on a load/store fabric (the CPU copy is the transfer), so a batch
/// without AMs never takes a shared slot's lock.
pub(super) struct SlotRef<'a> {
    direct: Option<&'a mut (dyn TxSlot + 'static)>,
    shared: Option<&'a Mutex<Option<Box<dyn TxSlot>>>>,
    guard: Option<MutexGuard<'a, Option<Box<dyn TxSlot>>>>,
}

impl<'a> SlotRef<'a> {
    /// A slot used by one queue only (`None`: a fabric without slots).
    pub fn direct(slot: Option<&'a mut (dyn TxSlot + 'static)>) -> Self {
        SlotRef { direct: slot, shared: None, guard: None }
    }
    /// A slot shared under a lock.
    pub fn shared(slot: &'a Mutex<Option<Box<dyn TxSlot>>>) -> Self {
        SlotRef { direct: None, shared: Some(slot), guard: None }
    }
    /// The slot, locked now if shared (held until this `SlotRef` goes).
    pub fn get(&mut self) -> Option<&mut (dyn TxSlot + 'static)> {
        if let Some(m) = self.shared {
            let g = self.guard.get_or_insert_with(|| m.lock().unwrap_or_else(|e| e.into_inner()));
            return g.as_deref_mut();
        }
        self.direct.as_deref_mut()
    }
    /// Rings the doorbell of a slot that was written to.
    pub fn doorbell(&mut self) {
        let slot = match &mut self.guard {
            Some(g) => g.as_deref_mut(),
            None => self.direct.as_deref_mut(),
        };
        if let Some(s) = slot {
            s.doorbell();
        }
    }
}

/// Sends one request AM through `slot`, making progress while it is full; without a slot
/// (a fabric without them) through the world's default path.
pub(super) fn send(
    comm: &Comm,
    slot: Option<&mut (dyn TxSlot + 'static)>,
    dst: u32,
    handler: u16,
    args: &[u64],
    payload: AmPayload<'_>,
) -> Result<()> {
    let Some(slot) = slot else {
        return comm.send_am(dst, handler, AmClass::Request, args, payload);
    };
    let msg = AmOut { handler, class: AmClass::Request, args, payload };
    if slot.am_try_send(dst, &msg)? {
        return Ok(());
    }
    // Full: let the target see what is there, then progress until it drains.
    slot.doorbell();
    comm.wait_fabric(Deps::Rank(dst), "an endpoint AM send", || slot.am_try_send(dst, &msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_payloads_round_trip() {
        let src: Vec<u8> = (1..=16).collect();
        for len in 0..=SMALL {
            let s = Small::new(&src[..len]);
            assert_eq!(&s.bytes()[..len], &src[..len], "len {len}");
        }
    }
}
