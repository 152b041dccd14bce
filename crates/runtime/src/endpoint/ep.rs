//! [`Endpoint`]: what one thread communicates through.

use super::queue::{
    atomic_via, get_via, put_via, send, Cq, Desc, Knobs, Queue, SlotRef, Small, Target, SMALL,
};
use super::EndpointPolicy;
use crate::{AmHandler, AtomicOp, Comm, Error, GlobalPtr, Pod, Result};
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};
use weft_fabric::pod::bytes_of;
use weft_fabric::{AmPayload, TxSlot};

/// A slot this endpoint publishes to; `None` where the fabric has no slots (the world's
/// default AM path carries the messages).
pub(super) type Slot = Option<Box<dyn TxSlot>>;

/// How an endpoint reaches its slot.
pub(super) enum Path {
    /// Private queue and private slot: no lock anywhere.
    Own(Queue, Slot),
    /// Private queue; the slot is shared and taken under its lock to publish.
    SharedSlot(Queue, Arc<Mutex<Slot>>),
    /// One queue (with its slot) for several endpoints, under one lock for every post.
    SharedQueue(Arc<Mutex<(Queue, Slot)>>),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One thread's communication path: a queue, the transmit slot it publishes to, and a
/// completion structure, shared with other endpoints as its [`EndpointPolicy`] says.
///
/// Operations are *posted*: they are published (executed on shared memory, handed to the
/// NIC on a network) when [`crate::EndpointConfig::postlist`] of them are queued, and are
/// all complete when [`Endpoint::sync_nbi`] returns. Operations posted between two `sync_nbi` are
/// unordered, as GASNet's implicit-handle puts are: two puts to the same address may land in
/// either order (on a network, or where AMs carry the puts and several threads of the target
/// run handlers), so call `sync_nbi` between them when the last must win. An endpoint moves between
/// threads (`Send`) but is not `Sync`: one thread at a time uses it, so its private parts take
/// no lock.
///
/// ```no_run
/// # use weft_runtime::{EndpointConfig, EndpointPolicy, World};
/// # let world = World::init()?;
/// # let seg = world.alloc_segment::<u64>(1024)?;
/// let mut set = world.endpoints(&EndpointConfig::new(EndpointPolicy::Dedicated, 1))?;
/// let mut ep = set.endpoints().remove(0);
/// for i in 0..1000 {
///     ep.put_nbi(seg.at(1, i), &[i as u64])?; // queued, published 32 at a time
/// }
/// ep.sync_nbi()?; // all 1000 visible at rank 1
/// drop(ep);
/// set.close()?;
/// # Ok::<(), weft_runtime::Error>(())
/// ```
///
/// Two threads cannot use one endpoint at once; the types refuse it:
///
/// ```compile_fail
/// # use weft_runtime as weft;
/// fn needs_sync<T: Sync>(_: &T) {}
/// fn share(ep: &weft::Endpoint<'_>) {
///     needs_sync(ep); // error: `Cell<()>` cannot be shared between threads safely
/// }
/// ```
// Aligned to a pair of cache lines: endpoints of different threads (moved into their
// closures, boxed side by side) would otherwise share the lines their counters live on.
#[repr(align(128))]
pub struct Endpoint<'c> {
    pub(super) comm: &'c Comm,
    pub(super) index: usize,
    pub(super) policy: EndpointPolicy,
    pub(super) path: Path,
    pub(super) cq: Cq,
    pub(super) knobs: Knobs,
    /// The last target resolved, and its segment's size in bytes.
    pub(super) last: Option<(Target, &'c crate::segment::SegInfo)>,
    pub(super) _one_thread: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for Endpoint<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Endpoint({} #{})", self.policy.name(), self.index)
    }
}

impl<'c> Endpoint<'c> {
    /// The world it belongs to (to wait, poll, or use the world's own operations).
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }
    /// This endpoint's index in its set (0..threads).
    pub fn index(&self) -> usize {
        self.index
    }
    /// The category it was created under.
    pub fn policy(&self) -> EndpointPolicy {
        self.policy
    }
    /// Operations its completion structure has counted (a shared structure counts every
    /// sharer's); advances once per signaled completion.
    pub fn completed(&self) -> u64 {
        self.cq.count()
    }

    /// Resolves and checks `p` for `len` bytes. The last (rank, segment) resolved is cached,
    /// so a stream of operations to one segment checks only alignment and bounds.
    fn target<T>(&mut self, p: GlobalPtr<T>, len: usize) -> Result<Target> {
        let off = p.byte_offset();
        if let Some((last, seg)) = self.last.filter(|(t, _)| t.rank == p.rank() && t.seg == p.segment_id()) {
            let aligned = off.is_multiple_of(std::mem::align_of::<T>());
            // The size for this id, not the bytes: 0 once the segment is dropped or reused.
            if aligned && off.checked_add(len).is_some_and(|end| end <= seg.size_for(last.seg)) {
                return Ok(Target { off, ..last });
            }
        }
        let (seg, off) = self.comm.resolve(p, len)?;
        let target = Target { rank: p.rank(), seg: seg.id(), region: *seg.remote(p.rank())?, off };
        self.last = Some((target, &**seg));
        Ok(target)
    }

    /// Queues one operation built by `build`; publishes when the posting list is full.
    fn post(&mut self, build: impl FnOnce(&mut Queue)) -> Result<()> {
        let (comm, k) = (self.comm, self.knobs);
        match &mut self.path {
            Path::Own(q, slot) => {
                build(q);
                if q.descs.len() >= k.postlist {
                    q.publish(comm, &mut SlotRef::direct(slot.as_deref_mut()), &mut self.cq, k)?;
                }
            }
            Path::SharedSlot(q, slot) => {
                build(q);
                if q.descs.len() >= k.postlist {
                    q.publish(comm, &mut SlotRef::shared(slot), &mut self.cq, k)?;
                }
            }
            Path::SharedQueue(shared) => {
                let mut g = lock(shared);
                let (q, slot) = &mut *g;
                build(q);
                if q.descs.len() >= k.postlist {
                    q.publish(comm, &mut SlotRef::direct(slot.as_deref_mut()), &mut self.cq, k)?;
                }
            }
        }
        Ok(())
    }

    /// Runs `f` with the queue, the slot (a shared one locked on first use) and the
    /// completion structure.
    fn with_path<R>(
        &mut self,
        f: impl FnOnce(&mut Queue, &mut SlotRef<'_>, &mut Cq) -> Result<R>,
    ) -> Result<R> {
        match &mut self.path {
            Path::Own(q, slot) => f(q, &mut SlotRef::direct(slot.as_deref_mut()), &mut self.cq),
            Path::SharedSlot(q, slot) => f(q, &mut SlotRef::shared(slot), &mut self.cq),
            Path::SharedQueue(shared) => {
                let mut g = lock(shared);
                let (q, slot) = &mut *g;
                let r = f(q, &mut SlotRef::direct(slot.as_deref_mut()), &mut self.cq);
                r
            }
        }
    }

    /// Publishes what is queued, then runs one operation at once (payloads that are not
    /// inline are read from the caller's memory, which is free again when this returns).
    fn now(&mut self, op: impl FnOnce(&'c Comm, &mut SlotRef<'_>, &mut Queue) -> Result<()>) -> Result<()> {
        let (comm, k) = (self.comm, self.knobs);
        self.with_path(|q, slot, cq| {
            q.publish(comm, slot, cq, k)?;
            op(comm, slot, q)?;
            slot.doorbell();
            q.count(1, cq, k);
            Ok(())
        })
    }

    /// Posts a put of `src` to `dst`. Payloads up to the inline threshold are copied into
    /// the posting list; larger ones are written before this returns. Either way `src` may
    /// be reused at once; the data is visible at the target after [`Endpoint::sync_nbi`].
    pub fn put_nbi<T: Pod>(&mut self, dst: GlobalPtr<T>, src: &[T]) -> Result<()> {
        let bytes = bytes_of(src);
        let to = self.target(dst, bytes.len())?;
        self.post_put_bytes(to, bytes)
    }

    /// [`Endpoint::put_nbi`] to a resolved target.
    pub(super) fn post_put_bytes(&mut self, to: Target, bytes: &[u8]) -> Result<()> {
        if bytes.len() <= self.knobs.inline_max {
            return self.post(|q| {
                if bytes.len() <= SMALL {
                    q.descs.push(Desc::PutSmall { to, small: Small::new(bytes) });
                } else {
                    let data = q.stage(bytes);
                    q.descs.push(Desc::Put { to, data });
                }
            });
        }
        self.now(|comm, slot, q| put_via(comm, q.slot_rma, slot, &to, bytes, false).map(|o| q.record(o)))
    }

    /// Posts a put of `len` elements of this rank's registered memory at `src` to `dst`: the
    /// payload is referenced, not copied, and read when the operation is published, so
    /// `src` must not change until [`Endpoint::sync_nbi`] (as with RDMA from registered memory).
    pub fn put_from_nbi<T: Pod>(&mut self, dst: GlobalPtr<T>, src: GlobalPtr<T>, len: usize) -> Result<()> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or(Error::Misuse("put length overflows"))?;
        if src.rank() != self.comm.rank() {
            return Err(Error::Misuse("put_from reads this rank's own memory; use get for a peer's"));
        }
        let to = self.target(dst, bytes)?;
        let from = self.target(src, bytes)?;
        self.post(|q| q.descs.push(Desc::PutFrom { to, from, len: bytes }))
    }

    /// Reads `dst.len()` elements at `src` into `dst` after publishing what is queued;
    /// complete when it returns.
    pub fn get<T: Pod>(&mut self, src: GlobalPtr<T>, dst: &mut [T]) -> Result<()> {
        let from = self.target(src, std::mem::size_of_val(dst))?;
        self.now(|comm, slot, q| {
            if get_via(comm, q.slot_rma, slot, &from, weft_fabric::pod::bytes_of_mut(dst))? {
                return Ok(());
            }
            comm.get(src, dst)
        })
    }

    /// Posts an atomic on the `u64` at `p` whose previous value is not needed.
    pub fn atomic_nbi(&mut self, p: GlobalPtr<u64>, op: AtomicOp) -> Result<()> {
        let to = self.target(p, 8)?;
        if !to.off.is_multiple_of(8) {
            return Err(Error::Misaligned { offset: to.off, align: 8 });
        }
        self.post(|q| q.descs.push(Desc::Atomic { to, op }))
    }

    /// Applies `op` to the `u64` at `p` after publishing what is queued, and returns the
    /// previous value.
    pub fn atomic(&mut self, p: GlobalPtr<u64>, op: AtomicOp) -> Result<u64> {
        let to = self.target(p, 8)?;
        let mut value = 0;
        self.now(|comm, slot, q| {
            value = match atomic_via(comm, q.slot_rma, slot, &to, op, true)? {
                Some((_, v)) => v,
                None => comm.atomic(p, op)?,
            };
            Ok(())
        })?;
        Ok(value)
    }

    /// Posts a request AM with arguments only.
    pub fn am_request_short(&mut self, dst: u32, h: AmHandler, args: &[u64]) -> Result<()> {
        self.check_am(dst, h, args)?;
        self.post(|q| {
            let start = q.words.len();
            q.words.extend_from_slice(args);
            q.descs.push(Desc::Am { dst, handler: h.0, args: start..q.words.len(), payload: None });
        })
    }

    /// Posts a request AM whose payload is delivered to the handler: staged if it is within
    /// the inline threshold, sent from `payload` at once otherwise.
    pub fn am_request_medium(&mut self, dst: u32, h: AmHandler, args: &[u64], payload: &[u8]) -> Result<()> {
        self.check_am(dst, h, args)?;
        if payload.len() > self.comm.caps.am_max_medium {
            return Err(Error::TooLarge {
                what: "medium AM payload (bytes)",
                len: payload.len(),
                max: self.comm.caps.am_max_medium,
            });
        }
        if payload.len() <= self.knobs.inline_max {
            return self.post(|q| {
                let start = q.words.len();
                q.words.extend_from_slice(args);
                let p = q.stage(payload);
                q.descs.push(Desc::Am { dst, handler: h.0, args: start..q.words.len(), payload: Some(p) });
            });
        }
        self.now(|comm, slot, _| send(comm, slot.get(), dst, h.0, args, AmPayload::Medium(payload)))
    }

    /// Sends a request AM whose payload is first written to `at` in the target's segment;
    /// the handler runs on `at.rank()` once the bytes are there.
    pub fn am_request_long(
        &mut self,
        at: GlobalPtr<u8>,
        h: AmHandler,
        args: &[u64],
        payload: &[u8],
    ) -> Result<()> {
        self.check_am(at.rank(), h, args)?;
        if !self.comm.native_rma {
            return Err(Error::Misuse("long AMs need a fabric with RMA; use a medium AM"));
        }
        let to = self.target(at, payload.len())?;
        self.now(|comm, slot, _| {
            send(
                comm,
                slot.get(),
                to.rank,
                h.0,
                args,
                AmPayload::Long { region: &to.region, offset: to.off, data: payload },
            )
        })
    }

    fn check_am(&self, dst: u32, h: AmHandler, args: &[u64]) -> Result<()> {
        self.comm.check_request(h)?;
        if dst >= self.comm.size() {
            return Err(Error::NoSuchRank { rank: dst, size: self.comm.size() });
        }
        if args.len() > self.comm.caps.am_max_args {
            return Err(Error::TooLarge {
                what: "AM argument count",
                len: args.len(),
                max: self.comm.caps.am_max_args,
            });
        }
        Ok(())
    }

    /// Publishes everything queued and completes it: puts and atomics are visible at their
    /// targets and AMs are in their targets' queues when this returns.
    pub fn sync_nbi(&mut self) -> Result<()> {
        let (comm, k) = (self.comm, self.knobs);
        self.with_path(|q, slot, cq| q.flush(comm, slot, cq, k))
    }
}

impl Drop for Endpoint<'_> {
    /// Flushes; an error here is recorded on the world (call [`Endpoint::sync_nbi`] to see it).
    fn drop(&mut self) {
        if let Err(e) = self.sync_nbi() {
            self.comm.record_error(e);
        }
    }
}
