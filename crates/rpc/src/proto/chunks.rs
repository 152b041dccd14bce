//! Chunks on the wire: where a sender's chunks are (the pool locator), the rendezvous
//! descriptor and its parser, and the receiver's decoded chunks.

use super::*;
use weft_runtime::Exposure;

pub(super) fn try_heap(len: usize) -> std::result::Result<AlignedBuf, ArchiveError> {
    // Checked again per chunk: memory may have gone since the message was checked.
    match weft_fabric::os::mem_available() {
        Some(free) if len as u64 > free => Err(ArchiveError(format!(
            "a chunk of {len} bytes does not fit in the pool or in the {free} bytes of memory available"
        ))),
        _ => AlignedBuf::try_zeroed(len).ok_or_else(|| {
            ArchiveError(format!("a chunk of {len} bytes does not fit in the pool, and the heap refused it"))
        }),
    }
}

/// How the target reaches memory of this process outside the pool (see
/// [`weft_runtime::layer::Layer::expose`]).
pub(super) type Expose<'a> = &'a dyn Fn(&[u8]) -> weft_runtime::Result<Exposure>;

/// Finds chunks in the pool, and places the others as the fabric lets the target reach them:
/// read in place, registered for the transfer (kept until the target acknowledges), or staged
/// into the pool (one copy, the blocks kept for the transfer).
pub(super) struct PoolLocator<'a> {
    pool: Option<&'a RmaPool>,
    expose: Expose<'a>,
    /// Chunks of plain numbers up to this many bytes are staged where they could be read in
    /// place all the same.
    stage_max: usize,
    stats: &'a RpcStats,
    pub(super) staged: RefCell<Vec<weft_fabric::pool::Block>>,
    /// Registrations made for chunks, with the local address of each.
    pub(super) exposed: RefCell<Vec<(u64, weft_runtime::Registration)>>,
    /// Why a chunk that had to be staged (the fabric cannot read it in place) was not.
    unstaged: RefCell<Option<String>>,
}

impl<'a> PoolLocator<'a> {
    pub(super) fn new(
        pool: Option<&'a RmaPool>,
        expose: Expose<'a>,
        stage_max: usize,
        stats: &'a RpcStats,
    ) -> Self {
        PoolLocator {
            pool,
            expose,
            stage_max,
            stats,
            staged: RefCell::default(),
            exposed: RefCell::default(),
            unstaged: RefCell::default(),
        }
    }

    /// Fails if a chunk the target could not have read was left in place.
    pub(super) fn check(&self) -> Result<()> {
        match self.unstaged.take() {
            Some(why) => Err(Error::Encode(why)),
            None => Ok(()),
        }
    }

    /// Lets go of what was staged and registered (before encoding again).
    pub(super) fn reset(&self) {
        self.staged.take();
        self.exposed.take();
        self.unstaged.take();
    }

    /// Whether a chunk refers to memory at one of `addrs` of this process.
    pub(super) fn points_into(&self, c: &ChunkRef, within: &dyn Fn(u64) -> bool) -> bool {
        match *c {
            ChunkRef::Pointer { addr, .. } => within(addr),
            ChunkRef::Registered { .. } => self.exposed.borrow().iter().any(|(a, _)| within(*a)),
            ChunkRef::Rma { .. } => false,
        }
    }

    fn refuse(&self, bytes: usize, why: &dyn std::fmt::Display) {
        self.unstaged.borrow_mut().get_or_insert_with(|| {
            format!(
                "a chunk of {bytes} bytes could not be staged into the registered pool, which this \
                 fabric needs (WEFT_RPC_POOL_MIB sets its size): {why}"
            )
        });
    }
}
impl Locate for PoolLocator<'_> {
    fn locate(&self, addr: u64, len: u64) -> Option<(u32, u64)> {
        let p = self.pool?;
        p.locate(addr, len).map(|off| (p.segment(), off as u64))
    }
    fn outside(&self, bytes: &[u8], width: u8) -> Option<ChunkRef> {
        let len = bytes.len() as u64;
        let in_place = match (self.expose)(bytes) {
            Ok(Exposure::InPlace) if !(width > 0 && bytes.len() <= self.stage_max) => return None,
            Ok(Exposure::InPlace) => true,
            Ok(Exposure::Registered(r)) => {
                let c = ChunkRef::Registered { addr: r.addr(), key: r.key(), len, width };
                self.stats.registered_bytes.fetch_add(len, Ordering::Relaxed);
                self.exposed.borrow_mut().push((bytes.as_ptr() as u64, r));
                return Some(c);
            }
            Ok(Exposure::Copy) => false,
            Err(e) => {
                self.refuse(bytes.len(), &e);
                return None;
            }
        };
        let staged = self.pool.ok_or(Error::Misuse("the RPC pool is not allocated yet")).and_then(|p| {
            let b = p.alloc(bytes.len())?;
            Ok((p, b))
        });
        let (p, mut b) = match staged {
            Ok(s) => s,
            Err(e) => {
                if !in_place {
                    // The target can only read the pool: this chunk cannot travel.
                    self.refuse(bytes.len(), &e);
                }
                return None;
            }
        };
        b.as_mut_slice::<u8>(bytes.len()).copy_from_slice(bytes);
        self.stats.copied_bytes.fetch_add(len, Ordering::Relaxed);
        let (segment, offset) = (p.segment(), b.offset() as u64);
        self.staged.borrow_mut().push(b);
        Some(ChunkRef::Rma { segment, offset, len, width })
    }
}

impl Rpc {
    /// Refuses a message whose chunks together could not be held here (the pool's free room
    /// plus the memory the kernel has available), before anything is allocated.
    pub(super) fn check_room(&self, chunks: &[ChunkRef]) -> std::result::Result<(), ArchiveError> {
        let total = chunks.iter().try_fold(0u64, |t, c| t.checked_add(c.len()));
        let max = self.max_arg.load(Ordering::Relaxed);
        if total.is_none_or(|t| t > max) {
            return Err(ArchiveError(format!(
                "chunks declare {} bytes, more than the largest argument or result this rank takes, \
                 {max} bytes (WEFT_RPC_MAX_ARG_MIB)",
                total.map_or("over 2^64".into(), |t| t.to_string())
            )));
        }
        let pool_free = self.pool.get().map_or(0, |p| {
            let (cap, used) = p.usage();
            (cap - used) as u64
        });
        if total.is_some_and(|t| t <= pool_free) {
            return Ok(()); // the usual case: no need to ask the kernel (a file read)
        }
        let room = weft_fabric::os::mem_available().map_or(u64::MAX, |m| m.saturating_add(pool_free));
        match total {
            Some(t) if t <= room => Ok(()),
            _ => Err(ArchiveError(format!(
                "chunks declare {} bytes, more than the {room} this rank can hold",
                total.map_or("over 2^64".into(), |t| t.to_string())
            ))),
        }
    }

    /// Pulls every chunk a rendezvous descriptor names into this rank's memory.
    pub(super) fn pull(
        &self,
        comm: &Comm,
        src: u32,
        desc: &[u8],
    ) -> std::result::Result<(Vec<u8>, Vec<Option<Received>>), ArchiveError> {
        let (inline_index, chunks) = parse_desc(desc)?;
        self.check_room(&chunks)?;
        let mut got: Vec<Option<Received>> = Vec::with_capacity(chunks.len());
        for c in &chunks {
            let len = usize::try_from(c.len()).map_err(|_| ArchiveError("chunk length".into()))?;
            // Numbers go straight into the Vec the value will own; bytes into the pool.
            let mut dst = match (c.width(), self.pool.get().map(|p| p.alloc(len))) {
                (0, Some(Ok(b))) => Received::Block(b),
                (0, _) => Received::Heap(try_heap(len)?),
                (w, _) => Received::Numbers(
                    Numbers::zeroed(w, len).ok_or_else(|| ArchiveError(format!("chunk width {w}")))?,
                ),
            };
            let bytes = dst.as_bytes_mut();
            let r = match *c {
                ChunkRef::Rma { segment, offset, .. } => {
                    comm.get(GlobalPtr::<u8>::new(src, segment, offset as usize), bytes)
                }
                ChunkRef::Pointer { addr, .. } => comm.read_peer(src, addr, bytes),
                ChunkRef::Registered { addr, key, .. } => comm.read_exposed(src, addr, key, bytes),
            };
            r.map_err(|e| ArchiveError(format!("pulling a chunk of {len} bytes from rank {src}: {e}")))?;
            got.push(Some(dst));
        }
        let index = match inline_index {
            Some(ix) => ix.to_vec(),
            None => {
                // The index itself travelled as the last chunk.
                let last = got.pop().flatten().ok_or_else(|| ArchiveError("no index chunk".into()))?;
                last.as_bytes().to_vec()
            }
        };
        Ok((index, got))
    }
}

/// Chunks taken out by the values that decode them.
pub(super) struct Pulled(pub(super) RefCell<Vec<Option<Received>>>);
impl ChunkSource for Pulled {
    fn take(&self, i: usize) -> Option<Received> {
        self.0.borrow_mut().get_mut(i)?.take()
    }
}

/// Rendezvous descriptor: `[u64 nchunks][u8 index inline][u64 index len][index?]` then per
/// chunk `[u8 kind][u64 len][u64 a][u64 b]` (pointer: a = address; rma: a = segment,
/// b = offset; registered: a = address, b = key). When the index does not fit, it is the last chunk (a pointer chunk).
pub(super) fn proto_desc(a: &Archive, max: usize, locate: &dyn Locate) -> Vec<u8> {
    let chunk_bytes = 25 * (a.chunks.len() + 1) + 17;
    let inline = chunk_bytes + a.index.len() <= max;
    let mut chunks = a.chunks.clone();
    if !inline {
        // The index itself is pulled: from the pool, or staged into it where the fabric
        // cannot read unregistered peer memory.
        chunks.push(ChunkRef::place(locate, &a.index, 0));
    }
    let mut d = Vec::with_capacity(chunk_bytes + if inline { a.index.len() } else { 0 });
    d.extend_from_slice(&(chunks.len() as u64).to_le_bytes());
    d.push(inline as u8);
    d.extend_from_slice(&(a.index.len() as u64).to_le_bytes());
    if inline {
        d.extend_from_slice(&a.index);
    }
    for c in &chunks {
        let (k, len, x, y) = match *c {
            ChunkRef::Pointer { addr, len, .. } => (0u8, len, addr, 0),
            ChunkRef::Rma { segment, offset, len, .. } => (1u8, len, segment as u64, offset),
            ChunkRef::Registered { addr, key, len, .. } => (2u8, len, addr, key),
        };
        // The element width (0 for bytes) in the high nibble, as its log2 + 1.
        let width = match c.width() {
            0 => 0,
            w => w.trailing_zeros() as u8 + 1,
        };
        d.push(k | width << 4);
        for w in [len, x, y] {
            d.extend_from_slice(&w.to_le_bytes());
        }
    }
    d
}

/// The payload of the rendezvous message that announces archive `a` (chunk descriptors, and
/// the index when it fits in `max_medium` bytes): what travels eagerly, whatever the size of
/// the chunks. Used to report archive sizes.
pub fn rendezvous_message(a: &Archive, max_medium: usize) -> Vec<u8> {
    proto_desc(a, max_medium, &archive::NoPool)
}

/// The inverse of [`rendezvous_message`]; total (every count checked against the bytes present).
pub fn parse_desc(d: &[u8]) -> std::result::Result<(Option<&[u8]>, Vec<ChunkRef>), ArchiveError> {
    let bad = |w: &str| ArchiveError(format!("rendezvous descriptor: {w}"));
    let word = |at: usize| -> std::result::Result<u64, ArchiveError> {
        d.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
            .ok_or_else(|| bad("truncated"))
    };
    let n = word(0)?;
    let inline = match d.get(8) {
        Some(0) => false,
        Some(1) => true,
        _ => return Err(bad("index flag")),
    };
    let ilen = word(9)?;
    let mut at = 17usize;
    let index = if inline {
        let end = at
            .checked_add(usize::try_from(ilen).map_err(|_| bad("index length"))?)
            .ok_or_else(|| bad("index length"))?;
        let ix = d.get(at..end).ok_or_else(|| bad("index truncated"))?;
        at = end;
        Some(ix)
    } else {
        None
    };
    if n.saturating_mul(25) != (d.len() - at) as u64 {
        return Err(bad(&format!("{n} chunks in {} bytes", d.len() - at)));
    }
    let mut chunks = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let (len, x, y) = (word(at + 1)?, word(at + 9)?, word(at + 17)?);
        let width = match d[at] >> 4 {
            0 => 0,
            w @ 1..=5 => 1u8 << (w - 1),
            w => return Err(bad(&format!("chunk width code {w}"))),
        };
        if width > 0 && !len.is_multiple_of(width as u64) {
            return Err(bad(&format!("{len} bytes are not elements of {width}")));
        }
        chunks.push(match d[at] & 15 {
            0 => ChunkRef::Pointer { addr: x, len, width },
            1 => ChunkRef::Rma {
                segment: u32::try_from(x).map_err(|_| bad("segment"))?,
                offset: y,
                len,
                width,
            },
            2 => ChunkRef::Registered { addr: x, key: y, len, width },
            k => return Err(bad(&format!("chunk kind {k}"))),
        });
        at += 25;
    }
    if !inline && chunks.last().is_none_or(|c| c.len() != ilen) {
        return Err(bad("index chunk missing"));
    }
    Ok((index, chunks))
}
