//! Plain data types shared by every fabric and the runtime.

/// A process's index in the job, `0..size`.
pub type Rank = u32;

/// Most `u64` arguments an active message carries (as GASNet's 16 handler arguments).
pub const AM_MAX_ARGS: usize = 16;

/// What a fabric can do natively; the runtime uses AM-based paths for what is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Native one-sided put/get.
    pub rma: bool,
    /// Native remote `u64` atomics.
    pub atomics: bool,
    /// Peers' registered memory is directly load/store addressable (shared memory).
    pub load_store: bool,
    /// Most `u64` arguments of one AM.
    pub am_max_args: usize,
    /// Largest medium AM payload, bytes.
    pub am_max_medium: usize,
    /// Largest long AM payload, bytes.
    pub am_max_long: usize,
    /// [`crate::Fabric::read_peer`] works: a peer's unregistered memory can be read (the
    /// kernel's cross-memory attach on one node).
    pub peer_read: bool,
    /// One-sided operations toward a rank complete only while that rank's CPU makes progress
    /// (libfabric providers with `FI_PROGRESS_MANUAL` data progress, such as tcp): the
    /// runtime then starts a progress thread unless the user chose otherwise.
    pub target_progress: bool,
}

/// Memory this rank registered; peers attach it through [`LocalRegion::desc`].
/// The memory stays mapped as long as any clone of the `LocalRegion` lives.
#[derive(Clone)]
pub struct LocalRegion {
    /// Fabric-local id of the region.
    pub id: u32,
    addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// What a peer passes to [`crate::Fabric::attach`] to reach this region.
    pub desc: Vec<u8>,
    /// Its memory may be given back while it stays registered (see [`LocalRegion::discard`]).
    discardable: bool,
    _keep: std::sync::Arc<crate::os::Mapping>,
}

impl std::fmt::Debug for LocalRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalRegion {{ id: {}, addr: {:#x}, len: {} }}", self.id, self.addr, self.len)
    }
}

impl LocalRegion {
    /// Describes registered memory backed by `mapping`; used by fabric implementations.
    pub fn new(id: u32, mapping: std::sync::Arc<crate::os::Mapping>, desc: Vec<u8>) -> Self {
        let (addr, len) = (mapping.as_ptr() as usize, mapping.len());
        LocalRegion { id, addr, len, desc, discardable: false, _keep: mapping }
    }
    /// Marks whether the region's memory may be given back while it stays registered (no
    /// device has pinned it); set by the fabric that registered it.
    pub fn with_discard(mut self, discardable: bool) -> Self {
        self.discardable = discardable;
        self
    }
    /// True for the program's own static data ([`crate::Fabric::adopt_program_data`]): its
    /// memory is never given back nor used for anything else.
    pub fn is_program_data(&self) -> bool {
        self._keep.kind != crate::os::MapKind::Owned
    }
    /// True if [`LocalRegion::discard`] gives memory back.
    pub fn discardable(&self) -> bool {
        self.discardable
    }
    /// Gives the region's memory back to the system where that is safe (see
    /// [`crate::os::Mapping::discard`]); the region stays mapped and registered, reading
    /// zeros. Returns whether it did. For memory no one accesses any more.
    pub fn discard(&self) -> crate::FabricResult<bool> {
        if !self.discardable {
            return Ok(false);
        }
        self._keep.discard().map(|_| true)
    }
    /// Makes a region ready for reuse: all zeros, and backed by memory now where the system
    /// has it (an error, not a later SIGBUS, where it has not). Nobody may access it meanwhile.
    pub fn rearm(&self) -> crate::FabricResult<()> {
        if self.discard()? {
            return self._keep.back(0, self.len);
        }
        // SAFETY: the region is `len` bytes of this live mapping, and the caller guarantees
        // that no one reads or writes it meanwhile.
        unsafe { std::ptr::write_bytes(self.as_ptr(), 0, self.len) };
        Ok(())
    }
    /// Backs bytes `offset..offset + len` with memory now, where a sparse region
    /// ([`crate::Fabric::register_sparse`]) would commit them only when written: an error
    /// here, instead of a SIGBUS at the first write, where the system has none left.
    pub fn back(&self, offset: usize, len: usize) -> crate::FabricResult<()> {
        self._keep.back(offset, len)
    }
    /// Gives back the memory of the whole pages within `offset..offset + len` where the
    /// region allows it ([`LocalRegion::discardable`]; they read as zeros after); false
    /// where it does not.
    pub fn discard_range(&self, offset: usize, len: usize) -> crate::FabricResult<bool> {
        if !self.discardable {
            return Ok(false);
        }
        self._keep.discard_range(offset, len).map(|_| true)
    }
    /// The memory behind the region.
    pub(crate) fn mapping(&self) -> &std::sync::Arc<crate::os::Mapping> {
        &self._keep
    }
    /// Start of the region in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}

/// A peer's registered region, as seen from this rank.
///
/// Only a fabric makes these (`Fabric::attach`): on shared memory `addr` is a live mapping
/// that the fabric writes through, so a region forged from safe code must not exist. The
/// fields are read through methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    pub(crate) rank: Rank,
    pub(crate) id: u32,
    pub(crate) len: usize,
    pub(crate) addr: u64,
    pub(crate) key: u64,
}

impl RemoteRegion {
    /// Owner of the memory.
    pub fn rank(&self) -> Rank {
        self.rank
    }
    /// The owner's region id (carried by long AMs).
    pub fn id(&self) -> u32 {
        self.id
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a region of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Address used to reach it: a local mapping for shared memory, the target virtual
    /// address (or 0-based offset) for network fabrics.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Remote protection key (0 where the fabric needs none).
    pub fn key(&self) -> u64 {
        self.key
    }
    /// Checks that `[offset, offset+len)` lies inside the region.
    pub fn check(&self, offset: usize, len: usize) -> crate::FabricResult<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(crate::FabricError::OutOfBounds { offset, len, region_len: self.len }),
        }
    }
}

/// How a peer can read memory of this process that was never registered (an RPC argument's
/// buffer), as [`crate::Fabric::expose`] answers.
pub enum Exposure {
    /// In place, by address ([`crate::Fabric::read_peer`]).
    InPlace,
    /// Through a registration made for it: the peer reads with
    /// [`crate::Fabric::read_exposed`] and the registration's `addr` and `key`, until it is
    /// dropped.
    Registered(Registration),
    /// Not at all (or a copy costs less): copy the bytes into registered memory.
    Copy,
}

/// A registration of memory the caller owns, readable by peers under its key until dropped.
/// The caller keeps the memory alive and unchanged until then.
pub struct Registration {
    pub(crate) addr: u64,
    pub(crate) key: u64,
    pub(crate) _guard: Box<dyn Send + Sync>,
}

impl Registration {
    /// The address a peer names (the virtual address, or 0 where the provider counts from the
    /// registration's start).
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// The key a peer presents.
    pub fn key(&self) -> u64 {
        self.key
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("addr", &self.addr).finish_non_exhaustive()
    }
}

/// What a fabric counted on this rank since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Bytes copied through bounce buffers (staging) on their way to or from the network.
    pub staged_bytes: u64,
    /// Registrations made for memory the caller owns ([`crate::Fabric::expose`]).
    pub registrations: u64,
    /// Of those, released again.
    pub released: u64,
    /// Operations on local memory that used a registration weft already held (a segment,
    /// the RPC pool) where the provider needs local buffers registered.
    pub cached: u64,
}

/// How an operation was issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Issued {
    /// Complete before returning; carries the fetched value for atomics (0 otherwise).
    Done(u64),
    /// Completion comes later through [`crate::EventSink::on_complete`].
    Pending,
}

/// How big each shared-memory AM ring is (one per peer, direction and class, so a rank's
/// inbox holds `2 × ranks` of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingSize {
    /// Every ring this many bytes, whatever the ranks (`WEFT_AM_RING_KIB`).
    Fixed(usize),
    /// The rings of one inbox share `inbox` bytes (`WEFT_AM_INBOX_KIB`): each gets its share,
    /// at most `max` and at least [`RingSize::MIN`], so that a rank's shared memory stays
    /// flat as the ranks of a node grow instead of growing with each peer.
    Budget {
        /// Bytes of all of one inbox's rings.
        inbox: usize,
        /// Bytes of one ring at most (few ranks).
        max: usize,
    },
}

impl RingSize {
    /// The smallest ring a budget gives (it still carries 4 KiB medium payloads).
    pub const MIN: usize = 16 << 10;

    /// Bytes of each ring among `ranks` ranks of a node (before rounding to slots).
    pub fn ring_bytes(self, ranks: u32) -> usize {
        match self {
            RingSize::Fixed(b) => b,
            RingSize::Budget { inbox, max } => {
                let share = inbox / (2 * ranks.max(1) as usize);
                let pow2 = if share == 0 { 0 } else { 1usize << share.ilog2() };
                pow2.min(max).max(Self::MIN)
            }
        }
    }
}

/// How a non-blocking get was issued ([`crate::Fabric::get_nb`]).
pub enum GetIssued {
    /// The bytes are in the destination already.
    Done,
    /// The fabric reads into memory of its own; once the completion of the get's token came
    /// through [`crate::EventSink::on_complete`], [`StagedGet::copy_to`] hands them over.
    Staged(StagedGet),
}

/// Bytes a fabric fetches into memory of its own for a get that completes later. The memory
/// goes back to the fabric when both this and the fabric's own reference are gone, so
/// dropping it early (or forgetting it) never frees memory the network still writes.
pub struct StagedGet(std::sync::Arc<dyn Staged>);

/// Where a [`StagedGet`]'s bytes wait (a fabric's staging buffer).
pub trait Staged: Send + Sync {
    /// Copies the fetched bytes into `dst` (as many as both hold) and returns `true`, or
    /// returns `false` and copies nothing while the read has not completed.
    fn copy_to(&self, dst: &mut [u8]) -> bool;
}

impl StagedGet {
    /// Wraps a fabric's staging buffer.
    pub fn new(staged: std::sync::Arc<dyn Staged>) -> Self {
        StagedGet(staged)
    }
    /// See [`Staged::copy_to`].
    pub fn copy_to(&self, dst: &mut [u8]) -> bool {
        self.0.copy_to(dst)
    }
}

impl std::fmt::Debug for StagedGet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StagedGet")
    }
}

/// A remote atomic operation on a `u64`; every variant yields the previous value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Reads the value.
    Load,
    /// Writes `v` (release ordering).
    Store(u64),
    /// Adds `v` (wrapping).
    FetchAdd(u64),
    /// Bitwise and with `v`.
    FetchAnd(u64),
    /// Bitwise or with `v`.
    FetchOr(u64),
    /// Bitwise xor with `v`.
    FetchXor(u64),
    /// Replaces with `v`.
    Swap(u64),
    /// Writes `new` if the value equals `expected`.
    CompareSwap { expected: u64, new: u64 },
}

impl AtomicOp {
    /// Encodes the operation as three words (for AM-based atomics).
    pub fn encode(self) -> [u64; 3] {
        match self {
            AtomicOp::Load => [0, 0, 0],
            AtomicOp::Store(v) => [1, v, 0],
            AtomicOp::FetchAdd(v) => [2, v, 0],
            AtomicOp::FetchAnd(v) => [3, v, 0],
            AtomicOp::FetchOr(v) => [4, v, 0],
            AtomicOp::FetchXor(v) => [5, v, 0],
            AtomicOp::Swap(v) => [6, v, 0],
            AtomicOp::CompareSwap { expected, new } => [7, expected, new],
        }
    }
    /// Decodes [`AtomicOp::encode`]'s words; `None` for an unknown opcode.
    pub fn decode(w: [u64; 3]) -> Option<Self> {
        Some(match w[0] {
            0 => AtomicOp::Load,
            1 => AtomicOp::Store(w[1]),
            2 => AtomicOp::FetchAdd(w[1]),
            3 => AtomicOp::FetchAnd(w[1]),
            4 => AtomicOp::FetchOr(w[1]),
            5 => AtomicOp::FetchXor(w[1]),
            6 => AtomicOp::Swap(w[1]),
            7 => AtomicOp::CompareSwap { expected: w[1], new: w[2] },
            _ => return None,
        })
    }
    /// Applies the operation to a local atomic; returns the previous value.
    pub fn apply(self, a: &std::sync::atomic::AtomicU64) -> u64 {
        use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};
        match self {
            AtomicOp::Load => a.load(Acquire),
            AtomicOp::Store(v) => {
                let old = a.load(Acquire);
                a.store(v, Release);
                old
            }
            AtomicOp::FetchAdd(v) => a.fetch_add(v, AcqRel),
            AtomicOp::FetchAnd(v) => a.fetch_and(v, AcqRel),
            AtomicOp::FetchOr(v) => a.fetch_or(v, AcqRel),
            AtomicOp::FetchXor(v) => a.fetch_xor(v, AcqRel),
            AtomicOp::Swap(v) => a.swap(v, AcqRel),
            AtomicOp::CompareSwap { expected, new } => {
                match a.compare_exchange(expected, new, AcqRel, Acquire) {
                    Ok(v) | Err(v) => v,
                }
            }
        }
    }
}

/// Requests and replies travel on separate resources so that two ranks flooding each other
/// cannot deadlock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AmClass {
    /// A request: its handler may send one reply.
    Request,
    /// A reply: its handler may send nothing.
    Reply,
}

/// Payload of an outgoing AM.
#[derive(Clone, Copy, Debug)]
pub enum AmPayload<'a> {
    /// Arguments only.
    Short,
    /// Bytes delivered to the handler.
    Medium(&'a [u8]),
    /// Bytes written to `region` at `offset` before the handler runs.
    Long { region: &'a RemoteRegion, offset: usize, data: &'a [u8] },
}

/// An outgoing active message.
#[derive(Clone, Copy, Debug)]
pub struct AmOut<'a> {
    /// Handler index (runtime-assigned).
    pub handler: u16,
    /// Request or reply.
    pub class: AmClass,
    /// Handler arguments, at most [`Caps::am_max_args`].
    pub args: &'a [u64],
    /// Payload.
    pub payload: AmPayload<'a>,
}

/// Checks a medium AM payload against a fabric's largest (every fabric's `am_try_send`).
pub(crate) fn check_medium(p: &[u8], max: usize) -> crate::FabricResult<()> {
    if p.len() > max {
        return Err(crate::FabricError::TooLarge { what: "medium AM payload", len: p.len(), max });
    }
    Ok(())
}

/// Checks that a put with signal keeps its signal on the rank the data goes to (every
/// fabric's `put_signal`).
pub(crate) fn check_signal_rank(dst: &RemoteRegion, sig: &RemoteRegion) -> crate::FabricResult<()> {
    if sig.rank != dst.rank {
        return Err(crate::FabricError::Malformed {
            what: format!("signal in rank {}'s memory for a put to rank {}", sig.rank, dst.rank),
        });
    }
    Ok(())
}

/// Payload of an incoming AM.
#[derive(Debug)]
pub enum AmInPayload<'a> {
    /// Arguments only.
    Short,
    /// Bytes carried in the message.
    Medium(&'a [u8]),
    /// Bytes already written to local region `region` at `offset`.
    Long { region: u32, offset: usize, data: &'a [u8] },
}

/// An incoming active message, valid during [`crate::EventSink::on_am`].
#[derive(Debug)]
pub struct AmIn<'a> {
    /// Sender.
    pub src: Rank,
    /// Handler index.
    pub handler: u16,
    /// Request or reply.
    pub class: AmClass,
    /// Arguments.
    pub args: &'a [u64],
    /// Payload.
    pub payload: AmInPayload<'a>,
}

/// Which incoming events [`crate::Fabric::progress`] delivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollSet {
    /// Requests, replies and completions.
    All,
    /// Replies and completions only (what a request handler may wait on).
    RepliesOnly,
}

/// Whether a peer is still part of the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerState {
    /// Running normally.
    Running,
    /// Left the job cleanly.
    Finalized,
    /// Died; the text says how it was detected.
    Dead(String),
}

/// One kind of communication resource and how much of it a fabric holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    /// What it is ("AM request rings", "registered regions", ...).
    pub kind: String,
    /// How many.
    pub count: u64,
    /// Bytes of memory they take.
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::RingSize;

    #[test]
    fn a_budget_keeps_an_inbox_flat() {
        let b = RingSize::Budget { inbox: 4 << 20, max: 256 << 10 };
        assert_eq!(b.ring_bytes(2), 256 << 10, "few ranks: the largest rings");
        assert_eq!(b.ring_bytes(8), 256 << 10);
        assert_eq!(b.ring_bytes(9), 128 << 10, "rounded down to a power of two");
        assert_eq!(b.ring_bytes(64), 32 << 10);
        assert_eq!(b.ring_bytes(1024), RingSize::MIN, "never below the smallest ring");
        assert_eq!(b.ring_bytes(0), 256 << 10);
        for n in [8u32, 16, 64, 128] {
            assert!(2 * n as usize * b.ring_bytes(n) <= 4 << 20, "{n} ranks exceed the budget");
        }
        assert_eq!(RingSize::Fixed(64 << 10).ring_bytes(1000), 64 << 10);
    }
}
