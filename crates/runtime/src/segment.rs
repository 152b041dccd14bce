//! Segments (registered memory allocated collectively) and global pointers into them.

use crate::{Comm, Error, Pod, Result};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use weft_fabric::pod::LocalView;
use weft_fabric::{LocalRegion, RemoteRegion};

pub use crate::global_ptr::GlobalPtr;
use crate::global_ptr::{elements, OVERFLOWED};

/// An all-gather of one byte string per member, in member order.
pub(crate) type ExchangeFn<'a> = dyn Fn(&[u8]) -> Result<Vec<Vec<u8>>> + 'a;

/// Segment slots of a world: live segments, and dropped ones kept for a later allocation of
/// their size among the same ranks.
pub const MAX_SEGMENTS: usize = 1 << SLOT_BITS;
/// Bits of a segment id that name its slot in the table (the rest: its generation).
const SLOT_BITS: u32 = 12;

/// The table slot of segment `id`.
#[inline]
fn slot_of(id: u32) -> usize {
    id as usize & (MAX_SEGMENTS - 1)
}

/// The id segment `id`'s slot takes when it is reused: the next generation (wrapping after
/// 2^20 reuses of one slot).
fn next_generation(id: u32) -> u32 {
    (id >> SLOT_BITS).wrapping_add(1) << SLOT_BITS | slot_of(id) as u32
}

pub(crate) struct SegInfo {
    /// Its id: the slot's index in the table in the low [`SLOT_BITS`] bits, and above them a
    /// generation, advanced each time the slot is reused, so that an address kept from a
    /// dropped segment names no segment instead of the one that reused its slot.
    id: AtomicU32,
    /// `bytes` while a [`Segment`] of this rank holds it, 0 once dropped (until a later
    /// allocation among the same ranks reuses it, see [`Comm::alloc_segment_among`]): the
    /// bound every access checks, so a dropped segment costs no check of its own.
    size: AtomicUsize,
    /// By world rank; `None` where the rank does not hold the segment (team segments).
    pub remote: Vec<Option<RemoteRegion>>,
    pub bytes: usize,
    pub local: LocalRegion,
    /// A [`Segment`] of this rank holds it (tells a dropped segment from an empty one).
    live: AtomicBool,
    /// An allocation of this rank offers it for reuse right now (another allocation, on
    /// another thread, must not offer it too).
    claimed: AtomicBool,
    /// When it was dropped (a stamp of [`DROPS`]): recent drops are offered first.
    dropped_at: AtomicU64,
}

/// Drops of segments so far, in this process (stamps for [`SegInfo::dropped_at`]).
static DROPS: AtomicU64 = AtomicU64::new(0);

/// What backs a new segment's part on this rank.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backing {
    /// Fresh zeroed memory.
    Fresh,
    /// Fresh memory committed where written (a pool, see
    /// [`weft_fabric::Fabric::register_sparse`]).
    Sparse,
    /// The program's static data ([`weft_fabric::Fabric::adopt_program_data`]), never reused.
    ProgramData,
}

/// Highest generation a slot reaches: a slot whose id has it is not reused again, so that a
/// generation never wraps round to an id an old address holds.
const LAST_GENERATION: u32 = (1 << (32 - SLOT_BITS)) - 1;

impl SegInfo {
    /// Its id now (see [`SegInfo::id`]'s field).
    #[inline]
    pub fn id(&self) -> u32 {
        self.id.load(Ordering::Relaxed)
    }
    /// Bytes accesses may reach: `bytes`, or 0 once dropped.
    #[inline]
    pub fn size(&self) -> usize {
        self.size.load(Ordering::Acquire)
    }
    /// Bytes accesses through an address of segment `id` may reach: [`SegInfo::size`] if the
    /// segment still has that id once the size is read, else 0. A reuse stores the new id
    /// before it makes the size non-zero, so an address kept from before the reuse never
    /// gets the new size.
    #[inline]
    pub fn size_for(&self, id: u32) -> usize {
        let size = self.size();
        if self.id() == id {
            size
        } else {
            0
        }
    }
    /// True while a [`Segment`] of this rank holds it.
    pub fn live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }
    fn set_live(&self, live: bool) {
        self.size.store(if live { self.bytes } else { 0 }, Ordering::Release);
        self.live.store(live, Ordering::Release);
    }
    /// True if this rank's [`Segment`] is dropped and the segment fits an allocation of
    /// `bytes` bytes held by `members` (world ranks, sorted or not).
    fn reusable_for(&self, bytes: usize, members: &[u32]) -> bool {
        !self.live()
            && !self.local.is_program_data()
            && self.bytes == bytes
            && self.id() >> SLOT_BITS < LAST_GENERATION
            && self.remote.iter().filter(|r| r.is_some()).count() == members.len()
            && members.iter().all(|&m| matches!(self.remote.get(m as usize), Some(Some(_))))
    }

    #[inline]
    pub fn remote(&self, rank: u32) -> Result<&RemoteRegion> {
        // A match, not `ok_or`: an eagerly built error is dropped on every successful call.
        match self.remote.get(rank as usize) {
            Some(Some(r)) => Ok(r),
            _ => Err(Error::NotMember { rank, segment: self.id() }),
        }
    }
}

/// Lock-free table of segments by id. The members of an allocation agree on its id (the
/// largest next id any of them proposes), so ids are equal on every rank that holds a segment.
pub(crate) struct SegmentTable {
    slots: Box<[OnceLock<Arc<SegInfo>>]>,
    count: std::sync::Mutex<u32>,
}

impl SegmentTable {
    pub fn new() -> Self {
        SegmentTable {
            slots: (0..MAX_SEGMENTS).map(|_| OnceLock::new()).collect(),
            count: std::sync::Mutex::new(0),
        }
    }
    /// Inline: every put and get looks its segment up here, from the caller's crate (the
    /// RMA calls are generic, so they are compiled there).
    #[inline]
    pub fn get(&self, id: u32) -> Option<&Arc<SegInfo>> {
        self.slots.get(slot_of(id))?.get().filter(|s| s.id() == id)
    }
    /// Id and bytes of every segment a [`Segment`] of this rank holds.
    pub fn list(&self) -> Vec<(u32, usize)> {
        let live = self.slots.iter().filter_map(|s| s.get()).filter(|s| s.live());
        live.map(|s| (s.id(), s.bytes)).collect()
    }
    /// Dropped segments an allocation of `bytes` among `members` may reuse, most recently
    /// dropped first (at most [`REUSE_CANDIDATES`]), claimed for it until the offer drops.
    fn reusable(&self, bytes: usize, members: &[u32]) -> Offer {
        let ids = *self.count.lock().unwrap_or_else(|p| p.into_inner());
        let mut found: Vec<&Arc<SegInfo>> =
            self.slots.iter().take(ids as usize).filter_map(|s| s.get()).collect();
        found.retain(|s| s.reusable_for(bytes, members));
        found.sort_by_key(|s| std::cmp::Reverse(s.dropped_at.load(Ordering::Relaxed)));
        let claim = |s: &&Arc<SegInfo>| {
            s.claimed.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        };
        Offer(found.into_iter().filter(claim).take(REUSE_CANDIDATES).cloned().collect())
    }
}

/// Dropped segments one allocation offers for reuse, claimed while it runs.
struct Offer(Vec<Arc<SegInfo>>);

impl Offer {
    fn ids(&self) -> Vec<u32> {
        self.0.iter().map(|s| s.id()).collect()
    }
    fn take(&self, id: u32) -> Option<Arc<SegInfo>> {
        self.0.iter().find(|s| s.id() == id).cloned()
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        self.0.iter().for_each(|s| s.claimed.store(false, Ordering::Release));
    }
}

/// First byte of a member's part of an allocation's exchange: a fresh allocation (or, in a
/// reuse's second exchange, success).
const FRESH: u8 = 0;
/// First byte of an offer of dropped segments for reuse.
const REUSE: u8 = 1;

/// The lowest segment id every member offered for reuse, if any (every part is an offer).
/// Members that disagree on the size are an error, as for a fresh allocation.
fn common_offer(all: &[Vec<u8>], bytes: usize, elem: usize, members: &[u32]) -> Result<Option<u32>> {
    let mut common: Option<Vec<u32>> = None;
    for (d, &r) in all.iter().zip(members) {
        let word = |a: usize| d.get(a..a + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
        let (Some(theirs), Some(their_elem)) = (word(1), word(9)) else {
            return Err(Error::Mismatch(format!("rank {r} sent a malformed segment offer")));
        };
        if theirs != bytes as u64 || their_elem != elem as u64 {
            return Err(Error::Mismatch(format!(
                "segment allocation: {bytes} bytes ({elem}-byte elements) here, rank {r} allocates {theirs} bytes ({their_elem}-byte elements)"
            )));
        }
        let ids: Vec<u32> =
            d[17..].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap_or_default())).collect();
        common = Some(match common {
            None => ids,
            Some(c) => c.into_iter().filter(|i| ids.contains(i)).collect(),
        });
    }
    Ok(common.and_then(|c| c.into_iter().min()))
}

/// Most dropped segments one allocation offers its peers for reuse.
const REUSE_CANDIDATES: usize = 16;

/// A collectively allocated array of `len` elements of `T` on every rank, reachable by every
/// rank through [`GlobalPtr`]s.
///
/// Dropping it gives this rank's memory back at once (where the fabric allows: shared memory,
/// software libfabric providers; memory a NIC may have pinned stays until reused) and makes
/// this rank's own accesses to it [`Error::NoSuchSegment`]. Drop it on every rank once no
/// rank accesses it any more (after a barrier, say): a peer's put into a dropped part is lost.
/// A later allocation of the same size among the same ranks reuses its slot and mappings,
/// zeroed, once every member has dropped it and completed its operations, so allocating and
/// dropping in a loop keeps memory flat. The reuse has a new id (the slot in its low 12 bits,
/// a generation above), so addresses kept from the dropped segment stay errors.
///
/// ```no_run
/// # let world = weft_runtime::World::init()?;
/// let seg = world.alloc_segment::<f64>(1 << 20)?;
/// seg.local().write(0, 1.5);                       // this rank's part
/// let p = seg.at((world.rank() + 1) % world.size(), 10); // element 10 on the next rank
/// world.put(p, &[2.5, 3.5])?;
/// # Ok::<(), weft_runtime::Error>(())
/// ```
pub struct Segment<T: Pod> {
    info: Arc<SegInfo>,
    id: u32,
    len: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T: Pod> std::fmt::Debug for Segment<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Segment(id {}, {} × {})", self.id, self.len, std::any::type_name::<T>())
    }
}

impl<T: Pod> Drop for Segment<T> {
    fn drop(&mut self) {
        self.info.dropped_at.store(DROPS.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
        self.info.set_live(false);
        // Nothing to report where it fails: the memory then stays until reused.
        let _ = self.info.local.discard();
    }
}

impl<T: Pod> Segment<T> {
    /// What the world holds of this segment (its regions on every rank).
    pub(crate) fn info(&self) -> &SegInfo {
        &self.info
    }
    /// Segment id (the same on every rank).
    pub fn id(&self) -> u32 {
        self.id
    }
    /// Elements on each rank.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True if the segment has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// This rank's part, for local reads, writes and atomics.
    pub fn local(&self) -> LocalView<'_, T> {
        LocalView::new(&self.info.local, self.len).expect("segment memory is sized and aligned for T")
    }
    /// Commits memory to elements `start..start + len` of this rank's part now (see
    /// [`Comm::alloc_segment_sparse`]): an error where the system has none left, instead of
    /// a SIGBUS at the first write.
    pub fn back(&self, start: usize, len: usize) -> Result<()> {
        let z = size_of::<T>();
        let (off, bytes) = (start.checked_mul(z), len.checked_mul(z));
        match (off, bytes) {
            (Some(off), Some(bytes)) if off.checked_add(bytes).is_some_and(|e| e <= self.len * z) => {
                Ok(self.info.local.back(off, bytes)?)
            }
            _ => Err(Error::Misuse("Segment::back: the range is not inside the segment")),
        }
    }
    /// Gives back the memory of elements `start..start + len` of this rank's part (whole
    /// pages within them; they read as zeros after), where the fabric allows it: what
    /// [`Segment::back`] committed for something no longer used. False where it does not.
    pub fn release(&self, start: usize, len: usize) -> Result<bool> {
        let z = size_of::<T>();
        match (start.checked_mul(z), len.checked_mul(z)) {
            (Some(off), Some(bytes)) if off.checked_add(bytes).is_some_and(|e| e <= self.len * z) => {
                Ok(self.info.local.discard_range(off, bytes)?)
            }
            _ => Err(Error::Misuse("Segment::release: the range is not inside the segment")),
        }
    }
    /// The fabric's view of `rank`'s copy (an error where `rank` does not hold the segment).
    pub(crate) fn remote_region(&self, rank: u32) -> Result<&RemoteRegion> {
        self.info.remote(rank)
    }
    /// Address of element `index` on `rank` (checked when used: an index whose byte offset
    /// does not fit a `usize` gives an address every operation rejects as out of bounds).
    pub fn at(&self, rank: u32, index: usize) -> GlobalPtr<T> {
        GlobalPtr { rank, seg: self.id, byte_offset: elements(index, size_of::<T>()), _t: PhantomData }
    }
}

impl Comm {
    /// Allocates a segment of `len` elements of `T` on every rank. Collective: every rank must
    /// call it, in the same order relative to other collectives, with the same `len` (a
    /// mismatch is an error on every rank).
    pub fn alloc_segment<T: Pod>(&self, len: usize) -> Result<Segment<T>> {
        let members: Vec<u32> = (0..self.size()).collect();
        let exchange = |mine: &[u8]| self.world_exchange(crate::collective::SEGMENT_CALL, mine);
        self.alloc_segment_among(len, &members, &exchange, Backing::Fresh)
    }

    /// As [`Comm::alloc_segment`], but memory is committed only where it is written or
    /// backed with [`Segment::back`] (on shared memory; elsewhere as the fabric does): a large
    /// segment of which parts are used, such as OpenSHMEM's symmetric heap.
    pub fn alloc_segment_sparse<T: Pod>(&self, len: usize) -> Result<Segment<T>> {
        let members: Vec<u32> = (0..self.size()).collect();
        let exchange = |mine: &[u8]| self.world_exchange(crate::collective::SEGMENT_CALL, mine);
        self.alloc_segment_among(len, &members, &exchange, Backing::Sparse)
    }

    /// The program's own writable static data (its global and static variables) as a
    /// segment of every rank, the variables staying where they are: OpenSHMEM's symmetric
    /// static data. Collective; every rank must run the same executable (the sizes are
    /// compared). Call it before the program's other threads write its statics. An error
    /// where the fabric cannot (see [`weft_fabric::Fabric::adopt_program_data`]).
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// let data = world.alloc_program_data()?;
    /// // `data.local().as_ptr()` is where the program's data starts; an address of a global
    /// // variable minus it is that variable's offset on every rank.
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn alloc_program_data(&self) -> Result<Segment<u8>> {
        let Some((_, len)) = weft_fabric::adopt::program_data() else {
            return Err(Error::Fabric(weft_fabric::FabricError::Unsupported {
                what: "a program without static data",
            }));
        };
        let members: Vec<u32> = (0..self.size()).collect();
        let exchange = |mine: &[u8]| self.world_exchange(crate::collective::SEGMENT_CALL, mine);
        self.alloc_segment_among(len, &members, &exchange, Backing::ProgramData)
    }

    /// Allocates a segment held by `members` only (world ranks; `exchange` runs among them,
    /// parts in member order), backed as `backing` says. Collective over the members.
    pub(crate) fn alloc_segment_among<T: Pod>(
        &self,
        len: usize,
        members: &[u32],
        exchange: &ExchangeFn<'_>,
        backing: Backing,
    ) -> Result<Segment<T>> {
        let elem = std::mem::size_of::<T>();
        let bytes = len.checked_mul(elem).filter(|&b| b <= isize::MAX as usize).ok_or(Error::TooLarge {
            what: "segment size (elements)",
            len,
            max: isize::MAX as usize / elem.max(1),
        })?;
        // A dropped segment of this size among these ranks is offered for reuse; where every
        // member offers it, nothing is registered or attached.
        // This rank's operations in flight are completed first, only where there is a slot to
        // offer (declining drops the offer and its claims).
        let mut offer = self.segments.reusable(bytes, members);
        if backing == Backing::ProgramData || (!offer.0.is_empty() && !self.quiet_for_reuse()) {
            offer = Offer(vec![]);
        }
        let offered = offer.ids();
        let mut fresh = None;
        let mut all = if offered.is_empty() {
            exchange(&self.fresh_proposal(bytes, elem, backing, &mut fresh))?
        } else {
            let mut mine = vec![REUSE];
            mine.extend_from_slice(&(bytes as u64).to_le_bytes());
            mine.extend_from_slice(&(elem as u64).to_le_bytes());
            offered.iter().for_each(|id| mine.extend_from_slice(&id.to_le_bytes()));
            exchange(&mine)?
        };
        if all.iter().all(|d| d.first() == Some(&REUSE)) {
            if let Some(id) = common_offer(&all, bytes, elem, members)? {
                let info = offer.take(id).ok_or(Error::NoSuchSegment(id))?;
                return self.reuse(info, len, exchange);
            }
        }
        if all.iter().any(|d| d.first() != Some(&FRESH)) {
            // Some members offered segments but not all the same: allocate afresh after all.
            all = exchange(&self.fresh_proposal(bytes, elem, backing, &mut fresh))?;
        }
        let registered = fresh.expect("a fresh proposal registered its region");
        // The id: the largest any member proposed (members that allocated elsewhere meanwhile
        // have moved on further than the others).
        let id = all
            .iter()
            .filter_map(|d| d.get(1..9))
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
            .max()
            .unwrap_or(0);
        let id = u32::try_from(id).ok().filter(|&i| (i as usize) < MAX_SEGMENTS).ok_or(Error::TooLarge {
            what: "number of segment slots (a dropped segment's slot is reused only by an allocation of its size among the same ranks)",
            len: id as usize + 1,
            max: MAX_SEGMENTS,
        });
        let descs: Vec<&[u8]> = all.iter().map(|d| d.get(9..).unwrap_or_default()).collect();
        // Publish locally *before* the closing exchange: a peer that leaves it first may at
        // once send AM-based accesses to this segment, which this rank handles while inside.
        let published = match (&registered, &id) {
            (Ok(region), Ok(id)) => {
                self.attach_all(*id, bytes, elem, members, &descs, region).and_then(|remote| {
                    let info = Arc::new(SegInfo {
                        id: AtomicU32::new(*id),
                        bytes,
                        local: region.clone(),
                        remote,
                        size: AtomicUsize::new(bytes),
                        live: AtomicBool::new(true),
                        claimed: AtomicBool::new(false),
                        dropped_at: AtomicU64::new(0),
                    });
                    self.segments.slots[slot_of(*id)].set(info.clone()).map_err(|_| {
                        Error::Misuse(
                            "segment allocations of one rank must not run concurrently on several threads",
                        )
                    })?;
                    // Only a slot taken counts: failed allocations use up no ids.
                    let mut c = self.segments.count.lock().unwrap_or_else(|p| p.into_inner());
                    *c = (*c).max(*id + 1);
                    Ok(info)
                })
            }
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
        };
        // Every member says whether it holds the segment now, so that all of them succeed or
        // fail alike, and all run the same collectives whatever failed where. After it nobody
        // needs the region's public name.
        let mine = match &published {
            Ok(_) => vec![FRESH],
            Err(e) => format!("-{e}").into_bytes(),
        };
        let all = exchange(&mine);
        if let Ok(region) = &registered {
            // A name left behind goes with the job's directory.
            let _ = self.fabric.seal(region);
        }
        let failed = all.as_ref().ok().and_then(|all| all.iter().position(|d| d.first() != Some(&FRESH)));
        if let (Ok(info), Ok(_), None) = (&published, &all, failed) {
            return Ok(Segment { info: info.clone(), id: info.id(), len, _t: PhantomData });
        }
        // Failed somewhere: this rank's memory goes back at once (its slot, if it took one,
        // stays for a later allocation of this size, as a dropped segment's).
        if let Ok(region) = &registered {
            let _ = region.discard();
            match &published {
                Ok(info) => info.set_live(false),
                Err(_) => self.fabric.deregister(region),
            }
        }
        published?;
        let all = all?;
        let r = failed.unwrap_or(0);
        let reason = String::from_utf8_lossy(all[r].get(1..).unwrap_or_default()).into_owned();
        Err(Error::PeerFailed { rank: members.get(r).copied().unwrap_or(r as u32), reason })
    }

    /// This rank's part of a fresh allocation's exchange: the id it proposes, the size, and
    /// the descriptor of a region it registers now (once: `fresh` keeps it) or its error.
    fn fresh_proposal(
        &self,
        bytes: usize,
        elem: usize,
        backing: Backing,
        fresh: &mut Option<Result<LocalRegion>>,
    ) -> Vec<u8> {
        // Registration may fail on one rank only (memory): everyone learns it in the exchange.
        let registered = fresh.get_or_insert_with(|| {
            let r = match backing {
                Backing::Fresh => self.fabric.register(bytes),
                Backing::Sparse => self.fabric.register_sparse(bytes),
                Backing::ProgramData => self.fabric.adopt_program_data(),
            };
            r.map_err(Error::from)
        });
        let proposed = *self.segments.count.lock().unwrap_or_else(|p| p.into_inner());
        let mut mine = Vec::with_capacity(48);
        mine.push(FRESH);
        mine.extend_from_slice(&(proposed as u64).to_le_bytes());
        mine.extend_from_slice(&(bytes as u64).to_le_bytes());
        mine.extend_from_slice(&(elem as u64).to_le_bytes());
        match registered {
            Ok(r) => mine.extend_from_slice(&r.desc),
            Err(e) => mine.extend_from_slice(format!("ERR{e}").as_bytes()),
        }
        mine
    }

    /// Reuses dropped segment `info`, which every member offered: zeroes this rank's part and
    /// tells the others whether that worked (the exchange is the allocation's barrier).
    fn reuse<T: Pod>(&self, info: Arc<SegInfo>, len: usize, exchange: &ExchangeFn<'_>) -> Result<Segment<T>> {
        // Every member that agreed moves on to the next generation, whatever follows.
        let id = next_generation(info.id());
        info.id.store(id, Ordering::Relaxed);
        let rearmed = info.local.rearm();
        // Published before the exchange, as a fresh segment is before its barrier.
        info.set_live(rearmed.is_ok());
        let mine = match &rearmed {
            Ok(()) => vec![FRESH],
            Err(e) => format!("-could not reuse segment {id}: {e}").into_bytes(),
        };
        let all = exchange(&mine);
        let failed = all.as_ref().map_or(None, |all| all.iter().position(|d| d.first() != Some(&FRESH)));
        if rearmed.is_err() || all.is_err() || failed.is_some() {
            info.set_live(false);
        }
        rearmed?;
        let all = all?;
        if let Some(r) = failed {
            let reason = String::from_utf8_lossy(all[r].get(1..).unwrap_or_default()).into_owned();
            return Err(Error::PeerFailed { rank: r as u32, reason });
        }
        Ok(Segment { info, id, len, _t: PhantomData })
    }

    /// Completes this rank's operations in flight (briefly): a segment is offered for reuse
    /// only when none of this rank's accesses to it can still land.
    fn quiet_for_reuse(&self) -> bool {
        let end = std::time::Instant::now() + std::time::Duration::from_millis(100);
        while self.ops.in_flight() > 0 {
            if std::time::Instant::now() > end || self.poll().is_err() {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }

    fn attach_all(
        &self,
        id: u32,
        bytes: usize,
        elem: usize,
        members: &[u32],
        all: &[&[u8]],
        region: &LocalRegion,
    ) -> Result<Vec<Option<RemoteRegion>>> {
        for (&r, d) in members.iter().zip(all) {
            if d.len() < 16 {
                return Err(Error::Mismatch(format!(
                    "rank {r} sent a malformed descriptor for segment {id}"
                )));
            }
            if d[16..].starts_with(b"ERR") {
                return Err(Error::PeerFailed {
                    rank: r,
                    reason: format!("could not allocate segment {id}: {}", String::from_utf8_lossy(&d[19..])),
                });
            }
            let theirs = u64::from_le_bytes(d[..8].try_into().unwrap_or_default()) as usize;
            let their_elem = u64::from_le_bytes(d[8..16].try_into().unwrap_or_default()) as usize;
            if theirs != bytes || their_elem != elem {
                return Err(Error::Mismatch(format!(
                    "segment {id}: rank {} allocates {bytes} bytes ({elem}-byte elements) but rank {r} allocates {theirs} bytes ({their_elem}-byte elements)",
                    self.rank()
                )));
            }
        }
        let mut remote: Vec<Option<RemoteRegion>> = (0..self.size()).map(|_| None).collect();
        for (&r, d) in members.iter().zip(all) {
            let desc = if r == self.rank() { &region.desc[..] } else { &d[16..] };
            remote[r as usize] = Some(self.fabric.attach(r, desc)?);
        }
        Ok(remote)
    }

    /// The segment whose part on this rank holds all of `bytes`, and their offset in it, if
    /// one does and rank `reader` holds that segment too (it can then read them through its
    /// own mapping or RMA instead of a copy of them).
    pub(crate) fn segment_holding(&self, bytes: &[u8], reader: u32) -> Option<(u32, usize)> {
        let start = bytes.as_ptr() as usize;
        let ids = *self.segments.count.lock().unwrap_or_else(|p| p.into_inner());
        let mut live =
            self.segments.slots.iter().take(ids as usize).filter_map(|s| s.get()).filter(|s| s.live());
        live.find_map(|seg| {
            let off = start.checked_sub(seg.local.as_ptr() as usize)?;
            let inside = off.checked_add(bytes.len())? <= seg.size();
            (inside && seg.remote(reader).is_ok()).then_some((seg.id(), off))
        })
    }

    /// Where this process can load and store the `len` bytes at `p` directly: `Some` where
    /// the fabric maps `p`'s rank's memory here (shared memory), `None` elsewhere; an error
    /// for an address that is out of bounds. Accesses through it are plain loads and stores,
    /// ordered with weft's RMA as the fabric's copies are (synchronize as for any RMA).
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// let seg = world.alloc_segment::<u64>(8)?;
    /// if let Some(addr) = world.local_address(seg.at(1, 0), 8)? {
    ///     println!("rank 1's element 0 is at {addr:#x} in this process");
    /// }
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn local_address<T>(&self, p: GlobalPtr<T>, len: usize) -> Result<Option<usize>> {
        let (seg, off) = self.resolve(p, len)?;
        if !self.fabric.maps_peer(p.rank) {
            return Ok(None);
        }
        Ok(Some(seg.remote(p.rank)?.addr() as usize + off))
    }

    /// Checks a global address for an access of `len` bytes; returns the segment and offset.
    pub(crate) fn resolve<T>(&self, p: GlobalPtr<T>, len: usize) -> Result<(&Arc<SegInfo>, usize)> {
        if p.rank >= self.size() {
            return Err(Error::NoSuchRank { rank: p.rank, size: self.size() });
        }
        let Some(seg) = self.segments.get(p.seg) else {
            return Err(Error::NoSuchSegment(p.seg));
        };
        seg.remote(p.rank)?;
        Ok((seg, Self::checked_offset(seg, p, len)?))
    }

    /// The offset of `p` in `seg` (the segment it names, on a rank that holds it), checked for
    /// alignment and for `len` bytes: the part of [`Comm::resolve`] after the lookup.
    pub(crate) fn checked_offset<T>(seg: &SegInfo, p: GlobalPtr<T>, len: usize) -> Result<usize> {
        let align = std::mem::align_of::<T>();
        if p.byte_offset != OVERFLOWED && !p.byte_offset.is_multiple_of(align) {
            return Err(Error::Misaligned { offset: p.byte_offset, align });
        }
        match p.byte_offset.checked_add(len) {
            Some(end) if end <= seg.size_for(p.seg) => Ok(p.byte_offset),
            _ => Err(Self::outside(seg, p.rank, p.byte_offset, len)),
        }
    }

    /// The error of an access outside `seg` (or to it once dropped); out of line, as every
    /// put and get inlines the check that leads here.
    #[cold]
    #[inline(never)]
    fn outside(seg: &SegInfo, rank: u32, offset: usize, len: usize) -> Error {
        if !seg.live() {
            return Error::NoSuchSegment(seg.id());
        }
        Error::OutOfBounds { rank, segment: seg.id(), offset, len, segment_len: seg.bytes }
    }
}
