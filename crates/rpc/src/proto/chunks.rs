//! Chunks on the wire: where a sender's chunks are (the pool locator), the rendezvous
//! descriptor and its parser, and the receiver's decoded chunks.

use super::*;

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

/// Finds chunks in the pool and, where the fabric cannot read peer memory, stages the others
/// into it (one copy), keeping the staged blocks for the transfer.
pub(super) struct PoolLocator<'a> {
    pool: Option<&'a RmaPool>,
    /// The fabric can read unregistered peer memory (else every chunk outside the pool is
    /// staged).
    peer_read: bool,
    /// Chunks of plain numbers up to this many bytes are staged all the same.
    stage_max: usize,
    pub(super) staged: RefCell<Vec<weft_fabric::pool::Block>>,
    /// Why a chunk that had to be staged (the fabric cannot read it in place) was not.
    unstaged: RefCell<Option<String>>,
}

impl<'a> PoolLocator<'a> {
    pub(super) fn new(pool: Option<&'a RmaPool>, peer_read: bool, stage_max: usize) -> Self {
        PoolLocator { pool, peer_read, stage_max, staged: RefCell::default(), unstaged: RefCell::default() }
    }

    /// Fails if a chunk the target could not have read was left in place.
    pub(super) fn check(&self) -> Result<()> {
        match self.unstaged.take() {
            Some(why) => Err(Error::Encode(why)),
            None => Ok(()),
        }
    }
}
impl Locate for PoolLocator<'_> {
    fn locate(&self, addr: u64, len: u64) -> Option<(u32, u64)> {
        let p = self.pool?;
        p.locate(addr, len).map(|off| (p.segment(), off as u64))
    }
    fn stage(&self, bytes: &[u8], plain: bool) -> Option<(u32, u64)> {
        if self.peer_read && !(plain && bytes.len() <= self.stage_max) {
            return None;
        }
        let staged = self.pool.ok_or(Error::Misuse("the RPC pool is not allocated yet")).and_then(|p| {
            let b = p.alloc(bytes.len())?;
            Ok((p, b))
        });
        let (p, mut b) = match staged {
            Ok(s) => s,
            Err(e) => {
                if !self.peer_read {
                    // The target can only read the pool: this chunk cannot travel.
                    self.unstaged.borrow_mut().get_or_insert_with(|| {
                        format!(
                            "a chunk of {} bytes could not be staged into the registered pool, which this \
                             fabric needs (WEFT_RPC_POOL_MIB sets its size): {e}",
                            bytes.len()
                        )
                    });
                }
                return None;
            }
        };
        b.as_mut_slice::<u8>(bytes.len()).copy_from_slice(bytes);
        let at = (p.segment(), b.offset() as u64);
        self.staged.borrow_mut().push(b);
        Some(at)
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
/// b = offset). When the index does not fit, it is the last chunk (a pointer chunk).
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
            k => return Err(bad(&format!("chunk kind {k}"))),
        });
        at += 25;
    }
    if !inline && chunks.last().is_none_or(|c| c.len() != ilen) {
        return Err(bad("index chunk missing"));
    }
    Ok((index, chunks))
}
