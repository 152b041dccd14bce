//! Zero-copy argument types: [`SerializeBuffer`] (existing data, shared by reference count) and
//! [`RmaVec`] (a Vec-like container in the registered-memory pool).
//!
//! Both serialize as one byte string wrapped in the archive's chunk marker: weft's archive turns
//! it into a chunk (no copy on the sender), any other serde format simply writes the bytes.
//! On the receiving side the pulled chunk *becomes* the value: an `RmaVec` keeps the pool block
//! the bytes were pulled into, a `SerializeBuffer` the buffer.

use crate::archive::CHUNK;
use serde::de::{self, Deserializer, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use weft_fabric::pod::{bytes_of, bytes_of_mut, vec_cast, AlignedBuf, Pod};
use weft_fabric::pool::{Block, BlockPool};

/// A chunk as it arrived on this rank: in a pool block (RMA-ready) or on the heap.
#[derive(Debug)]
pub enum Received {
    /// Pulled into a block of this rank's registered pool.
    Block(Block),
    /// Pulled into a 16-byte-aligned heap buffer (the pool had no room).
    Heap(AlignedBuf),
    /// The elements of a plain sequence of numbers, pulled into the `Vec` that the decoded
    /// value takes over.
    Numbers(Numbers),
}

/// A heap vector of numbers of one width, as a plain `Vec<P>` of that width will own it.
#[derive(Debug)]
pub enum Numbers {
    /// 1-byte elements.
    W1(Vec<u8>),
    /// 2-byte elements.
    W2(Vec<u16>),
    /// 4-byte elements.
    W4(Vec<u32>),
    /// 8-byte elements.
    W8(Vec<u64>),
    /// 16-byte elements.
    W16(Vec<u128>),
}

impl Numbers {
    /// `len` zero bytes as elements of `width` bytes (`None` unless `width` is 1, 2, 4, 8 or
    /// 16 and divides `len`).
    pub fn zeroed(width: u8, len: usize) -> Option<Numbers> {
        let w = width as usize;
        if w == 0 || !len.is_multiple_of(w) {
            return None;
        }
        let n = len / w;
        Some(match width {
            1 => Numbers::W1(vec![0; n]),
            2 => Numbers::W2(vec![0; n]),
            4 => Numbers::W4(vec![0; n]),
            8 => Numbers::W8(vec![0; n]),
            16 => Numbers::W16(vec![0; n]),
            _ => return None,
        })
    }
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Numbers::W1(v) => v,
            Numbers::W2(v) => bytes_of(v),
            Numbers::W4(v) => bytes_of(v),
            Numbers::W8(v) => bytes_of(v),
            Numbers::W16(v) => bytes_of(v),
        }
    }
    /// The bytes, to be written.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Numbers::W1(v) => v,
            Numbers::W2(v) => bytes_of_mut(v),
            Numbers::W4(v) => bytes_of_mut(v),
            Numbers::W8(v) => bytes_of_mut(v),
            Numbers::W16(v) => bytes_of_mut(v),
        }
    }
    /// The vector as a `Vec<P>` without copying, if `P` has its elements' size and alignment.
    pub fn into_vec<P: Pod>(self) -> Result<Vec<P>, Numbers> {
        match self {
            Numbers::W1(v) => vec_cast(v).map_err(Numbers::W1),
            Numbers::W2(v) => vec_cast(v).map_err(Numbers::W2),
            Numbers::W4(v) => vec_cast(v).map_err(Numbers::W4),
            Numbers::W8(v) => vec_cast(v).map_err(Numbers::W8),
            Numbers::W16(v) => vec_cast(v).map_err(Numbers::W16),
        }
    }
}

impl Received {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Received::Block(b) => b.as_slice::<u8>(b.len()),
            Received::Heap(h) => h.as_bytes(),
            Received::Numbers(v) => v.as_bytes(),
        }
    }
    /// The bytes, to be written (by the pull).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Received::Block(b) => {
                let n = b.len();
                b.as_mut_slice::<u8>(n)
            }
            Received::Heap(h) => h.as_bytes_mut(),
            Received::Numbers(v) => v.as_bytes_mut(),
        }
    }
    fn view<T: Pod>(&self, n: usize) -> &[T] {
        match self {
            Received::Block(b) => b.as_slice::<T>(n),
            Received::Heap(h) => h.as_slice::<T>(n),
            // The archive hands number chunks only to sequences, never to chunk-aware values.
            Received::Numbers(_) => unreachable!("a number chunk handed to a chunk-aware value"),
        }
    }
}

thread_local! {
    /// The chunk a decoding value may take (set around the visitor call).
    static HANDOFF: RefCell<Option<Received>> = const { RefCell::new(None) };
    /// The pool values decoded on this thread allocate from.
    static DECODE_POOL: RefCell<Option<Arc<BlockPool>>> = const { RefCell::new(None) };
}

pub(crate) fn with_handoff<R>(c: Received, f: impl FnOnce() -> R) -> R {
    HANDOFF.with(|h| *h.borrow_mut() = Some(c));
    let r = f();
    HANDOFF.with(|h| h.borrow_mut().take());
    r
}

fn take_handoff() -> Option<Received> {
    HANDOFF.with(|h| h.borrow_mut().take())
}

/// Runs `f` with `pool` as the pool that decoded [`RmaVec`]s allocate from.
pub(crate) fn with_decode_pool<R>(pool: Option<Arc<BlockPool>>, f: impl FnOnce() -> R) -> R {
    let old = DECODE_POOL.with(|p| std::mem::replace(&mut *p.borrow_mut(), pool));
    let r = f();
    DECODE_POOL.with(|p| *p.borrow_mut() = old);
    r
}

fn elems<T: Pod, E: de::Error>(bytes: usize) -> Result<usize, E> {
    let size = std::mem::size_of::<T>();
    if size == 0 || !bytes.is_multiple_of(size) {
        return Err(E::custom(format!("{bytes} bytes are not a whole number of {size}-byte elements")));
    }
    Ok(bytes / size)
}

/// Writes `bytes` as a chunk-marked byte string.
struct ChunkBytes<'a>(&'a [u8]);
impl Serialize for ChunkBytes<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

fn serialize_chunk<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_newtype_struct(CHUNK, &ChunkBytes(bytes))
}

/// What a chunk-aware value is built from while decoding.
enum Source<'a> {
    Inline(&'a [u8]),
    /// Bytes a foreign format could not lend (its input is not kept).
    Owned(Vec<u8>),
    Pulled(Received),
}

impl Source<'_> {
    /// The bytes of an inline or owned source; `None` for a pulled chunk.
    fn copied(&self) -> Option<&[u8]> {
        match self {
            Source::Inline(b) => Some(b),
            Source::Owned(v) => Some(v),
            Source::Pulled(_) => None,
        }
    }
}

struct SourceVisitor;
impl<'de> Visitor<'de> for SourceVisitor {
    type Value = Source<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a weft chunk")
    }
    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Source<'de>, E> {
        Ok(Source::Inline(v))
    }
    // Other serde formats (bincode, postcard, ...) see a newtype around a byte string.
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Source<'de>, D::Error> {
        d.deserialize_bytes(self)
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Source<'de>, E> {
        Ok(Source::Owned(v.to_vec()))
    }
    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Source<'de>, E> {
        Ok(Source::Owned(v))
    }
    fn visit_u64<E: de::Error>(self, i: u64) -> Result<Source<'de>, E> {
        take_handoff().map(Source::Pulled).ok_or_else(|| E::custom(format!("chunk {i} was not handed over")))
    }
}

/// Existing data passed by value without a copy: a reference-counted `[T]`. Clones share the
/// data; the runtime holds a clone until the transfer is done (see `call_with_sent`), so the
/// data can be reused once [`SerializeBuffer::is_unique`] is true again.
///
/// ```
/// # mod weft { pub use weft_runtime::*; pub use weft_rpc::*; }
/// let data = weft::SerializeBuffer::from(vec![1.0f64; 1 << 20]);
/// let copy = data.clone(); // no copy of the elements
/// assert_eq!(copy.len(), 1 << 20);
/// ```
pub struct SerializeBuffer<T: Pod> {
    data: Storage<T>,
}

enum Storage<T: Pod> {
    Vec(Arc<Vec<T>>),
    Received(Arc<Received>, usize),
}

impl<T: Pod> Clone for SerializeBuffer<T> {
    fn clone(&self) -> Self {
        SerializeBuffer {
            data: match &self.data {
                Storage::Vec(v) => Storage::Vec(v.clone()),
                Storage::Received(r, n) => Storage::Received(r.clone(), *n),
            },
        }
    }
}

impl<T: Pod + fmt::Debug> fmt::Debug for SerializeBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SerializeBuffer({} elements)", self.len())
    }
}

impl<T: Pod> From<Vec<T>> for SerializeBuffer<T> {
    fn from(v: Vec<T>) -> Self {
        SerializeBuffer { data: Storage::Vec(Arc::new(v)) }
    }
}

impl<T: Pod> From<Arc<Vec<T>>> for SerializeBuffer<T> {
    fn from(v: Arc<Vec<T>>) -> Self {
        SerializeBuffer { data: Storage::Vec(v) }
    }
}

impl<T: Pod> SerializeBuffer<T> {
    /// True when no clone (in particular none held by an unfinished transfer) shares the data.
    pub fn is_unique(&self) -> bool {
        match &self.data {
            Storage::Vec(v) => Arc::strong_count(v) == 1,
            Storage::Received(r, _) => Arc::strong_count(r) == 1,
        }
    }
    /// The elements as a `Vec` (no copy when this buffer was made from a `Vec` and is unique).
    pub fn into_vec(self) -> Vec<T> {
        match self.data {
            Storage::Vec(v) => Arc::try_unwrap(v).unwrap_or_else(|v| (*v).clone()),
            Storage::Received(r, n) => r.view::<T>(n).to_vec(),
        }
    }
}

impl<T: Pod> Deref for SerializeBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.data {
            Storage::Vec(v) => v,
            Storage::Received(r, n) => r.view::<T>(*n),
        }
    }
}

impl<T: Pod> Serialize for SerializeBuffer<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_chunk(bytes_of(self), s)
    }
}

impl<'de, T: Pod> Deserialize<'de> for SerializeBuffer<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match d.deserialize_newtype_struct(CHUNK, SourceVisitor)? {
            Source::Pulled(r) => {
                let n = elems::<T, D::Error>(r.as_bytes().len())?;
                Ok(SerializeBuffer { data: Storage::Received(Arc::new(r), n) })
            }
            src => {
                let b = src.copied().unwrap_or_default();
                let mut v = vec![T::zeroed(); elems::<T, D::Error>(b.len())?];
                bytes_of_mut(&mut v).copy_from_slice(b);
                Ok(v.into())
            }
        }
    }
}

/// A growable array of `T` in the registered-memory pool: sent without any copy on the
/// sender (an RMA chunk), received straight into the target's pool, handed to the remote
/// function by value.
///
/// Where the pool has no room, or the system no memory to back it (a full `/dev/shm`), the
/// vector lives on the heap instead ([`RmaVec::in_pool`] says which): it works the same, and
/// travels as a plain chunk (read in place where the fabric reads peer memory, else copied
/// into the pool). A pool block of 1 MiB or more gives its memory back to the system once it
/// stayed free for [`weft_fabric::pool::DECAY`] (the next large block takes it as it is
/// meanwhile); smaller ones keep it for the pool's next blocks.
///
/// ```no_run
/// # mod weft { pub use weft_runtime::*; pub use weft_rpc::*; }
/// # let world = weft_runtime::World::init()?;
/// let mut v = weft::RmaVec::<f64>::with_capacity(&world, 1024)?;
/// v.extend_from_slice(&[1.0, 2.0])?;
/// assert_eq!(&v[..], &[1.0, 2.0]);
/// # Ok::<(), weft_runtime::Error>(())
/// ```
pub struct RmaVec<T: Pod> {
    store: Store<T>,
    _t: PhantomData<T>,
}

/// Where an [`RmaVec`]'s elements live.
enum Store<T: Pod> {
    /// A block of the pool and the elements in use.
    Pool(Block, usize),
    /// The heap, where the pool could not take them.
    Heap(Vec<T>),
}

impl<T: Pod + fmt::Debug> fmt::Debug for RmaVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T: Pod> RmaVec<T> {
    /// An empty vector with room for `cap` elements in `comm`'s pool.
    pub fn with_capacity(comm: &weft_runtime::Comm, cap: usize) -> weft_runtime::Result<Self> {
        Self::alloc_in(crate::Rpc::get(comm)?.pool()?, cap)
    }

    /// A vector holding a copy of `data`.
    pub fn from_slice(comm: &weft_runtime::Comm, data: &[T]) -> weft_runtime::Result<Self> {
        let mut v = Self::with_capacity(comm, data.len())?;
        v.extend_from_slice(data)?;
        Ok(v)
    }

    /// Room for `cap` elements: in the pool, else on the heap.
    fn alloc_in(pool: &Arc<BlockPool>, cap: usize) -> weft_runtime::Result<Self> {
        let too_large = || weft_runtime::Error::TooLarge {
            what:
                "RmaVec elements (the registered pool's room is the maximum shown; the heap refused them too)",
            len: cap,
            max: (pool.capacity() - pool.in_use()) / std::mem::size_of::<T>().max(1),
        };
        let bytes = cap.checked_mul(std::mem::size_of::<T>()).ok_or_else(too_large)?;
        if let Ok(Some(block)) = pool.alloc(bytes) {
            return Ok(RmaVec { store: Store::Pool(block, 0), _t: PhantomData });
        }
        let mut v = Vec::new();
        v.try_reserve_exact(cap).map_err(|_| too_large())?;
        Ok(RmaVec { store: Store::Heap(v), _t: PhantomData })
    }

    /// True if the elements are in the registered pool (sent without a copy), false if they
    /// are on the heap.
    pub fn in_pool(&self) -> bool {
        matches!(self.store, Store::Pool(..))
    }

    /// Elements the vector holds without growing.
    pub fn capacity(&self) -> usize {
        match &self.store {
            Store::Pool(b, _) => b.capacity() / std::mem::size_of::<T>().max(1),
            Store::Heap(v) => v.capacity(),
        }
    }

    /// Makes room for `more` elements (moving to a larger block of the pool, or to the heap,
    /// if needed).
    pub fn reserve(&mut self, more: usize) -> weft_runtime::Result<()> {
        let len = self.len();
        let need = len.checked_add(more).ok_or(weft_runtime::Error::TooLarge {
            what: "RmaVec (elements)",
            len: usize::MAX,
            max: usize::MAX - len,
        })?;
        let cap = self.capacity();
        if need <= cap {
            return Ok(());
        }
        match &mut self.store {
            Store::Pool(block, n) => {
                let mut bigger = Self::alloc_in(block.pool(), need.max(cap.saturating_mul(2)))?;
                bigger.extend_from_slice(block.as_slice::<T>(*n))?;
                *self = bigger;
            }
            Store::Heap(v) => v.try_reserve(more).map_err(|_| weft_runtime::Error::TooLarge {
                what: "RmaVec on the heap (elements)",
                len: need,
                max: v.capacity(),
            })?,
        }
        Ok(())
    }

    /// Appends one element.
    pub fn push(&mut self, v: T) -> weft_runtime::Result<()> {
        self.extend_from_slice(&[v])
    }

    /// Appends a copy of `data`.
    pub fn extend_from_slice(&mut self, data: &[T]) -> weft_runtime::Result<()> {
        self.reserve(data.len())?;
        match &mut self.store {
            Store::Pool(block, n) => {
                let (start, end) = (*n, *n + data.len());
                block.as_mut_slice::<T>(end)[start..].copy_from_slice(data);
                *n = end;
            }
            Store::Heap(v) => v.extend_from_slice(data),
        }
        Ok(())
    }

    /// Shortens the vector to `len` elements (no effect if it is shorter).
    pub fn truncate(&mut self, len: usize) {
        match &mut self.store {
            Store::Pool(_, n) => *n = (*n).min(len),
            Store::Heap(v) => v.truncate(len),
        }
    }
}

impl<T: Pod> Deref for RmaVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.store {
            Store::Pool(b, n) => b.as_slice::<T>(*n),
            Store::Heap(v) => v,
        }
    }
}

impl<T: Pod> DerefMut for RmaVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.store {
            Store::Pool(b, n) => b.as_mut_slice::<T>(*n),
            Store::Heap(v) => v,
        }
    }
}

impl<T: Pod> Serialize for RmaVec<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_chunk(bytes_of(self), s)
    }
}

impl<'de, T: Pod> Deserialize<'de> for RmaVec<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let pool = DECODE_POOL.with(|p| p.borrow().clone());
        let copy_in = |b: &[u8]| -> Result<Self, D::Error> {
            let pool =
                pool.as_ref().ok_or_else(|| de::Error::custom("RmaVec decoded outside a weft world"))?;
            let n = elems::<T, D::Error>(b.len())?;
            let mut v = Self::alloc_in(pool, n).map_err(de::Error::custom)?;
            match &mut v.store {
                Store::Pool(block, len) => {
                    bytes_of_mut(block.as_mut_slice::<T>(n)).copy_from_slice(b);
                    *len = n;
                }
                Store::Heap(h) => {
                    h.resize(n, T::zeroed());
                    bytes_of_mut(h).copy_from_slice(b);
                }
            }
            Ok(v)
        };
        match d.deserialize_newtype_struct(CHUNK, SourceVisitor)? {
            Source::Pulled(Received::Block(block)) => {
                let n = elems::<T, D::Error>(block.len())?;
                Ok(RmaVec { store: Store::Pool(block, n), _t: PhantomData })
            }
            Source::Pulled(Received::Heap(h)) => copy_in(h.as_bytes()),
            src => copy_in(src.copied().unwrap_or_default()),
        }
    }
}
