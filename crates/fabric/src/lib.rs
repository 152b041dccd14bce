//! # weft-fabric — the layer that moves bytes
//!
//! A *fabric* moves bytes between the ranks of a job: it registers memory so that peers can
//! reach it, performs RMA (put/get) and remote atomics where it can, sends and receives active
//! messages (AMs) and reports completions. It knows nothing of segments' element types, handler
//! closures or completion styles: those belong to the runtime layer above (`weft-runtime`),
//! which only ever talks to a fabric through the [`Fabric`] trait.
//!
//! Every fabric has the same shape (as libfabric providers do), and says what it can do through
//! [`Caps`]. Where a fabric lacks a capability (say, native remote atomics) the runtime falls
//! back to an AM-based implementation.
//!
//! All `unsafe` code of weft that touches shared memory or the operating system lives in this
//! crate, each block with a `// SAFETY:` comment.
//!
//! [`open()`] opens the fabric a configuration names. Fabrics available:
//! - [`shm::ShmFabric`]: processes of one node, through shared-memory files mapped by every
//!   rank. RMA and atomics are direct loads and stores; AMs travel through lock-free rings.
//! - `ofi::OfiFabric` (feature `ofi`): libfabric, for ranks on other hosts.
//! - `hybrid::HybridFabric` (feature `ofi`): shared memory to the ranks of this host and
//!   libfabric to the others, chosen per peer.

pub mod adopt;
pub mod boot;
pub mod copy;
mod counts;
pub mod exits;
#[cfg(feature = "ofi")]
pub mod hybrid;
pub mod names;
#[cfg(feature = "ofi")]
pub mod ofi;
pub mod open;
pub mod order;
pub mod os;
pub mod pod;
pub mod pool;
pub mod prefault;
pub mod read;
pub mod reap;
pub mod shm;
pub mod signals;

mod error;
mod memory;
mod types;

pub use error::{FabricError, FabricResult};
pub use memory::heap_in_use;
pub use open::{open, FabricChoice, OpenConfig};
pub use types::*;

/// What a fabric calls when this rank can no longer go on (see [`Fabric::set_alarm`]).
pub type Alarm = Box<dyn Fn(FabricError) + Send + Sync>;

/// The interface every fabric implements. The runtime layer is written against this trait only.
///
/// Operations on remote memory name a [`RemoteRegion`] (obtained from [`Fabric::attach`] with a
/// peer's registration descriptor) and a byte offset. Bounds are checked by the caller (the
/// runtime) *and* by the fabric: an out-of-range access is an error, never a stray write.
///
/// Completion: an operation returns [`Issued::Done`] when it has completed (remotely visible)
/// before returning, as every shared-memory operation does, or [`Issued::Pending`] when its
/// completion will be reported later through [`EventSink::on_complete`] during
/// [`Fabric::progress`] with the token the caller passed in.
pub trait Fabric: Send + Sync + 'static {
    /// Short name of the fabric ("shm", "ofi").
    fn name(&self) -> &'static str;
    /// This process's rank in the job.
    fn rank(&self) -> Rank;
    /// Number of ranks in the job.
    fn size(&self) -> u32;
    /// What this fabric can do natively.
    fn caps(&self) -> Caps;

    /// Allocates `len` bytes of registered memory that peers can reach once they attach it.
    /// The memory is zero-filled and page-aligned.
    fn register(&self, len: usize) -> FabricResult<LocalRegion>;
    /// As [`Fabric::register`], for a pool whose memory is committed only where it is
    /// written: a fabric that can need not back it up front.
    fn register_sparse(&self, len: usize) -> FabricResult<LocalRegion> {
        self.register(len)
    }
    /// Makes the main program's writable static data ([`adopt::program_data`]) a region that
    /// peers can reach once they attach it, the program keeping its variables where they are
    /// (OpenSHMEM's symmetric static data). Call it before the program's other threads write
    /// its statics; signal handlers may (asynchronous signals wait on the calling thread until
    /// the data has moved, and weft's threads never take them). Refused where weft is linked
    /// into the program, and by fabrics that cannot.
    fn adopt_program_data(&self) -> FabricResult<LocalRegion> {
        Err(FabricError::Unsupported { what: "symmetric static data on this fabric" })
    }
    /// Releases a region this rank registered: the fabric forgets it (its memory goes when
    /// the last `LocalRegion` clone does). Peers must no longer use it.
    fn deregister(&self, region: &LocalRegion);
    /// Attaches a peer's registered region from the descriptor its owner produced.
    fn attach(&self, rank: Rank, desc: &[u8]) -> FabricResult<RemoteRegion>;
    /// Called once every peer has attached `region`: the fabric may drop the names it used to
    /// publish the region (shared-memory files are unlinked here).
    fn seal(&self, region: &LocalRegion) -> FabricResult<()>;

    /// Writes `src` to `dst` at byte `offset`. `src` may be reused as soon as this returns
    /// (local completion); remote completion is `Issued::Done` or a later completion event.
    fn put(&self, dst: &RemoteRegion, offset: usize, src: &[u8], token: u64) -> FabricResult<Issued>;
    /// Reads `dst.len()` bytes at byte `offset` of `src` into `dst`; complete when it returns.
    fn get(&self, src: &RemoteRegion, offset: usize, dst: &mut [u8]) -> FabricResult<()>;
    /// Whether a get from `rank` is done when [`Fabric::get`] returns anyway (a copy from
    /// mapped memory): [`Fabric::get_nb`] then gains nothing and its caller may skip the
    /// bookkeeping of a completion.
    fn gets_at_once(&self, rank: Rank) -> bool {
        let _ = rank;
        self.caps().load_store
    }
    /// Whether `rank`'s regions are mapped into this process: then [`RemoteRegion::addr`] of
    /// one of them is where this process loads and stores its bytes (OpenSHMEM's
    /// `shmem_ptr`). Shared memory: every rank; elsewhere none.
    fn maps_peer(&self, rank: Rank) -> bool {
        let _ = rank;
        self.caps().load_store
    }
    /// The 8-byte words of `region` as atomics, where this process maps it ([`Fabric::maps_peer`]):
    /// loads, stores and CPU atomics on them reach the owner's memory with no message.
    /// `None` where the region is not mapped here.
    fn mapped_words<'a>(&'a self, region: &'a RemoteRegion) -> Option<&'a [std::sync::atomic::AtomicU64]> {
        let _ = region;
        None
    }
    /// Starts a get of `dst.len()` bytes at `offset` of `src` that may complete later, so
    /// that many can be in flight: either done at return (the bytes in `dst`), or read into
    /// the fabric's own memory and completed with `on_complete(token)` (then
    /// [`StagedGet::copy_to`]). The default is [`Fabric::get`].
    fn get_nb(
        &self,
        src: &RemoteRegion,
        offset: usize,
        dst: &mut [u8],
        token: u64,
    ) -> FabricResult<GetIssued> {
        let _ = token;
        self.get(src, offset, dst).map(|_| GetIssued::Done)
    }
    /// Starts a get of `dst.len()` bytes at `offset` of `src` into memory that stays valid
    /// until the read completes (see [`read`]): done at return, or `Issued::Pending` with the
    /// bytes in place once `on_complete(token)` came. Fabrics that read over a network read
    /// straight into it, many reads in flight at once; the default is [`Fabric::get`].
    fn get_into(
        &self,
        src: &RemoteRegion,
        offset: usize,
        dst: read::ReadDst<'_>,
        token: u64,
    ) -> FabricResult<Issued> {
        let _ = token;
        self.get(src, offset, dst.into_slice()).map(|_| Issued::Done(0))
    }
    /// Makes progress until [`read::ReadScope::settled`]: no read into the scope's slices is in
    /// flight. Never returns earlier, whatever fails (a failed read completes with its error).
    fn wait_reads(&self, scope: &read::ReadScope<'_>) {
        while !scope.settled() {
            std::thread::yield_now();
        }
    }
    /// Performs an atomic operation on the 8-byte-aligned `u64` at `offset` of `dst`.
    /// `Issued::Done` carries the previous value.
    fn atomic(&self, dst: &RemoteRegion, offset: usize, op: AtomicOp, token: u64) -> FabricResult<Issued>;

    /// Writes `src` to `dst` at `offset`, then stores `value` into the `u64` at `sig_offset` of
    /// `sig` (a region of the same rank) once the data is visible there: OpenSHMEM's put with
    /// signal, the pattern of a put followed by a flag. Complete when it returns. Fabrics whose
    /// memory is mapped do both in one checked call; the default puts, waits for the put and
    /// stores the signal with [`Fabric::atomic`].
    fn put_signal(
        &self,
        dst: &RemoteRegion,
        offset: usize,
        src: &[u8],
        sig: &RemoteRegion,
        sig_offset: usize,
        value: u64,
    ) -> FabricResult<()> {
        crate::types::check_signal_rank(dst, sig)?;
        if let Issued::Pending = self.put(dst, offset, src, 0)? {
            self.quiet()?;
        }
        if let Issued::Pending = self.atomic(sig, sig_offset, AtomicOp::Store(value), 0)? {
            self.quiet()?;
        }
        Ok(())
    }

    /// Copies `len` bytes at `src_offset` of this rank's own registered region `src` to `dst`
    /// at `dst_offset`: a put whose payload the fabric reads from registered memory (what a
    /// NIC does by DMA) instead of from a caller's slice. `src` must be this rank's region.
    fn put_from(
        &self,
        dst: &RemoteRegion,
        dst_offset: usize,
        src: &RemoteRegion,
        src_offset: usize,
        len: usize,
        token: u64,
    ) -> FabricResult<Issued>;

    /// Whether atomics on `rank`'s memory should go through [`Fabric::atomic`]. `false` sends
    /// them through AMs executed by the target's CPU: what a fabric asks for when its native
    /// atomics to that peer would not be atomic with respect to other ranks reaching the same
    /// memory another way (a NIC's atomics against a neighbour's CPU atomics).
    fn native_atomics_to(&self, rank: Rank) -> bool {
        let _ = rank;
        self.caps().atomics
    }

    /// Completes remotely every put and atomic this process issued with token 0 that
    /// returned [`Issued::Pending`] (OpenSHMEM's quiet).
    fn quiet(&self) -> FabricResult<()>;

    /// Copies `dst.len()` bytes at virtual address `addr` of rank `rank`'s process, memory that
    /// was never registered (for zero-copy RPC arguments). Only fabrics with
    /// [`Caps::peer_read`] implement it; the others return [`FabricError::Unsupported`] and the
    /// runtime stages such memory through registered buffers instead.
    fn read_peer(&self, rank: Rank, addr: u64, dst: &mut [u8]) -> FabricResult<()> {
        let _ = (rank, addr, dst);
        Err(FabricError::Unsupported { what: "reading unregistered peer memory" })
    }

    /// How `rank` can read `len` bytes at `addr` of this process, memory the caller owns but
    /// never registered (a zero-copy RPC argument): in place ([`Caps::peer_read`], the
    /// default where the fabric has it), through a registration made for it (libfabric, from
    /// `WEFT_OFI_ZCOPY_KIB` up), or not at all. The caller keeps the memory alive and
    /// unchanged until it drops the registration.
    fn expose(&self, rank: Rank, addr: usize, len: usize) -> FabricResult<Exposure> {
        let _ = (rank, addr, len);
        Ok(if self.caps().peer_read { Exposure::InPlace } else { Exposure::Copy })
    }

    /// Copies `dst.len()` bytes at `addr` of what rank `rank` registered with
    /// [`Fabric::expose`] under `key` (checked by the provider: a wrong key or range reads
    /// nothing and fails).
    fn read_exposed(&self, rank: Rank, addr: u64, key: u64, dst: &mut [u8]) -> FabricResult<()> {
        let _ = (rank, addr, key, dst);
        Err(FabricError::Unsupported { what: "reading registrations of peer memory" })
    }

    /// What this fabric counted on this rank (bounce-buffer bytes, registrations).
    fn stats(&self) -> FabricStats {
        FabricStats::default()
    }

    /// Tries to send an active message; `Ok(false)` means the path to `dst` is full right now
    /// (back-pressure): make progress and try again. Nothing is dropped or queued unboundedly.
    fn am_try_send(&self, dst: Rank, msg: &AmOut<'_>) -> FabricResult<bool>;

    /// Receive side of endpoint transmit slots (see [`TxSlot`]): creates the paths through
    /// which `slots[s]` transmit slots of each rank `s` reach this rank, each `ring_bytes` deep,
    /// and starts delivering what arrives on them in [`Fabric::progress`] (as requests from
    /// `s`). Every rank does this with the same `slots`, exchanges the returned regions'
    /// descriptors, opens its slots with [`Fabric::open_tx_slots`], and then seals the region.
    /// Fabrics without transmit slots return [`FabricError::Unsupported`] and the runtime
    /// sends endpoint AMs on the default path.
    fn open_slot_inbox(&self, slots: &[u32], ring_bytes: usize) -> FabricResult<LocalRegion> {
        let _ = (slots, ring_bytes);
        Err(FabricError::Unsupported { what: "endpoint transmit slots" })
    }

    /// Stops delivering from a slot inbox and releases it, once nothing waits in it:
    /// `Ok(false)` while messages remain (make progress and ask again). Call it only after
    /// every rank has closed the slots that send into it.
    fn close_slot_inbox(&self, region: &LocalRegion) -> FabricResult<bool> {
        let _ = region;
        Err(FabricError::Unsupported { what: "endpoint transmit slots" })
    }

    /// Transmit side: opens this rank's slots `first..first + count` of a slot inbox set made
    /// with [`Fabric::open_slot_inbox`] and the same `slots`; `inboxes[r]` is rank `r`'s
    /// descriptor. Each returned slot reaches every rank, itself included.
    fn open_tx_slots(
        &self,
        inboxes: &[Vec<u8>],
        slots: &[u32],
        first: u32,
        count: u32,
    ) -> FabricResult<Vec<Box<dyn TxSlot>>> {
        let _ = (inboxes, slots, first, count);
        Err(FabricError::Unsupported { what: "endpoint transmit slots" })
    }

    /// Delivers incoming AMs and completions to `sink`; returns how many events were delivered.
    /// With `PollSet::RepliesOnly` only replies and completions are delivered, which is what a
    /// request handler may wait on without recursion. A call may deliver what completes the
    /// caller's waits (replies, completions) and leave arrived requests to the next call:
    /// callers poll in a loop.
    fn progress(&self, sink: &dyn EventSink, set: PollSet) -> FabricResult<usize>;

    /// True if an event is probably waiting (cheap check, no delivery).
    fn has_incoming(&self) -> bool;

    /// Sleeps until an AM arrives for this rank, a peer calls [`Fabric::notify`] on it, or
    /// `timeout` passes. True when it woke for traffic (something may be waiting, such as an
    /// RMA operation the provider carries out during progress, which delivers no event): the
    /// waiter should poll eagerly again.
    ///
    /// `ready` is the waiter's own condition (a flag a peer's put sets, then notifies): it is
    /// checked once the sleep is announced, so a notify that came after the waiter last looked
    /// but before it announced the sleep (and so rang no bell) is not slept through. True if
    /// `ready` held.
    fn wait_incoming(&self, timeout: std::time::Duration, ready: &mut dyn FnMut() -> bool) -> bool;

    /// Wakes `rank` if one of its threads sleeps in [`Fabric::wait_incoming`]: for one-sided
    /// writes (a flag set by a put) that the rank waits on. Cheap when nobody sleeps.
    fn notify(&self, rank: Rank) {
        let _ = rank;
    }

    /// Reports whether peer `rank` is still part of the job.
    fn peer_state(&self, rank: Rank) -> PeerState;

    /// Fails once another process has started as this rank of the job (by hand, with the same
    /// rank number), so that both processes fail.
    fn check_claim(&self) -> FabricResult<()> {
        Ok(())
    }

    /// Sets what the fabric calls, from a thread of its own, when this rank can no longer go
    /// on for a reason outside any call (another process claimed its rank): the runtime
    /// records the error for the rank's next wait and wakes it.
    fn set_alarm(&self, alarm: Alarm) {
        let _ = alarm;
    }

    /// True when everything `rank` sent to this rank has been delivered: nothing waits in its
    /// paths and no thread is delivering from them right now. Used before declaring a wait on
    /// a departed peer failed.
    fn peer_drained(&self, rank: Rank) -> bool;

    /// Request AMs this process has sent to `dst` on every path (endpoint slots included):
    /// with [`Fabric::requests_handled`] on `dst`, the runtime's remote completion.
    fn requests_sent(&self, dst: Rank) -> u64;

    /// Request AMs from `src` whose handlers have returned on this rank.
    fn requests_handled(&self, src: Rank) -> u64;

    /// The calling thread is about to poll on behalf of the process's other threads, which are
    /// away from the fabric (the runtime's on-demand progress thread): keep their
    /// single-thread fast path for them instead of ending it (shared memory: the lock bias is
    /// lent, not revoked). True if [`Fabric::return_fast_path`] must follow once the
    /// thread's fabric calls are done.
    fn borrow_fast_path(&self) -> bool {
        false
    }

    /// Ends what [`Fabric::borrow_fast_path`] began.
    fn return_fast_path(&self) {}

    /// Marks this rank as finalized: peers waiting on it get an error instead of hanging.
    fn finalize(&self);

    /// After [`Fabric::finalize`], once this rank's world has ended: gives back at once what
    /// the fabric holds outside this process (a libfabric endpoint's shared-memory region,
    /// its listening port), even if the fabric itself lives on (a program that keeps a
    /// handle, or OpenSHMEM's state, which lives as long as the process). Its operations
    /// fail from then on.
    fn release(&self) {}

    /// This process is about to exit without finalizing, ending the job (an error): removes
    /// what the job keeps where no launcher may clean up (shared memory: the job's
    /// directory, if it is empty; under `mpirun` nothing else would). Peers that make new
    /// regions fail from then on.
    fn abandon(&self) {}

    /// The communication resources this fabric holds (for `weft info`).
    fn resources(&self) -> Vec<Resource>;

    /// Bytes of shared memory this rank created (its inbox and registered regions) that are
    /// in memory now: what it holds in `/dev/shm` (`None` where it holds none there).
    fn shm_in_memory(&self) -> Option<u64> {
        None
    }
}

/// One transmit slot of an endpoint: an independent path to every rank for requests, used by
/// one owner at a time (`&mut self`, so it needs no lock of its own; the runtime adds one
/// where it shares a slot). On shared memory a slot is one ring per destination; on libfabric
/// it is an endpoint or a scalable endpoint's transmit context.
///
/// Messages posted with [`TxSlot::am_try_send`] may wait for [`TxSlot::doorbell`] before the
/// target is woken (the Postlist idea: one doorbell per batch).
pub trait TxSlot: Send {
    /// Tries to post one request AM to `dst`; `Ok(false)` means the path is full right now.
    /// Only [`AmClass::Request`] messages travel on slots (replies use the default path).
    fn am_try_send(&mut self, dst: Rank, msg: &AmOut<'_>) -> FabricResult<bool>;
    /// Makes everything posted so far visible and wakes the targets that sleep.
    fn doorbell(&mut self);
    /// Whether this slot carries puts itself ([`TxSlot::put`]). Where it does not, the
    /// runtime issues an endpoint's puts on the world's path: what shared memory wants (the
    /// CPU copy is the transfer, and a shared slot's lock is then never taken for puts).
    fn carries_rma(&self) -> bool {
        false
    }
    /// Posts a put of `src` (reusable when this returns) to `dst` at byte `offset` through
    /// this slot; `more` says another operation follows at once (libfabric's `FI_MORE`, the
    /// Postlist hint). `Ok(false)`: not for this slot (too large), issue it elsewhere.
    fn put(&mut self, dst: &RemoteRegion, offset: usize, src: &[u8], more: bool) -> FabricResult<bool> {
        let _ = (dst, offset, src, more);
        Ok(false)
    }
    /// Whether operations toward `dst` travel on this slot when it carries RMA (`false`
    /// where the world's path carries them by design, as a neighbour's CPU copy on the
    /// hybrid fabric).
    fn carries_rma_to(&self, dst: Rank) -> bool {
        let _ = dst;
        self.carries_rma()
    }
    /// Posts a put of `len` bytes at (`src`, offset) of this rank's registered memory to
    /// (`dst`, offset) through this slot (read when the provider sends it: the source must
    /// not change until [`TxSlot::complete`]). `Ok(false)`: not for this slot.
    fn put_from(
        &mut self,
        dst: (&RemoteRegion, usize),
        src: (&LocalRegion, usize),
        len: usize,
    ) -> FabricResult<bool> {
        let _ = (dst, src, len);
        Ok(false)
    }
    /// Reads `dst.len()` bytes at `offset` of `src` through this slot, complete when this
    /// returns. `Ok(false)`: not for this slot, read elsewhere.
    fn get(&mut self, src: &RemoteRegion, offset: usize, dst: &mut [u8]) -> FabricResult<bool> {
        let _ = (src, offset, dst);
        Ok(false)
    }
    /// Applies `op` to the `u64` at (`dst`, offset) through this slot: with `fetch`, waits
    /// and returns the previous value; without, posts it (complete at [`TxSlot::complete`])
    /// and returns `Some(0)`. `Ok(None)`: not for this slot.
    fn atomic(
        &mut self,
        dst: (&RemoteRegion, usize),
        op: AtomicOp,
        fetch: bool,
    ) -> FabricResult<Option<u64>> {
        let _ = (dst, op, fetch);
        Ok(None)
    }
    /// Makes progress on what this slot posted: `Ok(true)` once every operation posted so
    /// far has completed (puts visible at their targets); an operation that failed is
    /// reported here once.
    fn complete(&mut self) -> FabricResult<bool> {
        Ok(true)
    }
    /// Bytes of memory and paths this slot holds (for resource accounting).
    fn resources(&self) -> Resource;
}

/// Receives what [`Fabric::progress`] delivers.
pub trait EventSink {
    /// An active message arrived. The payload borrow ends when this returns.
    fn on_am(&self, am: AmIn<'_>);
    /// An operation issued with `token` completed; `value` is the fetched value for atomics.
    fn on_complete(&self, token: u64, value: u64, result: FabricResult<()>);
}
