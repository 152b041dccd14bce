//! The archive: serde values as one flat *index* buffer plus a list of *chunks* (HPX's
//! serialization with zero-copy chunking).
//!
//! ```text
//!  index buffer (copied into the message)          chunk list (descriptors only)
//!  ┌────────┬───────┬──────────┬────────────┐      ┌─────────────────────────────────┐
//!  │ u64 id │ "abc" │ chunk #0 │ f64 scalar │      │ #0 pointer: addr, len (caller)  │
//!  └────────┴───────┴────┬─────┴────────────┘      │ #1 rma: segment, offset, len    │
//!                        └──────────────────────►  └─────────────────────────────────┘
//! ```
//!
//! Small values are written into the index with a fixed little-endian encoding (lengths as
//! u64). A byte string at or above the threshold — the bytes of a [`crate::SerializeBuffer`],
//! an [`crate::RmaVec`] or any `serialize_bytes` — becomes a chunk instead: the index holds only
//! its number and the chunk records where the bytes are, so they travel once, straight from the
//! caller's memory (pointer chunk) or registered pool (RMA chunk).
//!
//! The decoder is total: every length is checked against the bytes that remain before anything
//! is allocated, so arbitrary input gives an [`ArchiveError`], never a panic or a huge
//! allocation.

use serde::de;
use serde::ser::{self, Serialize};
use std::fmt;

mod decode;
pub use decode::{decode, ChunkSource, NoChunks};

/// The newtype name that marks a byte string as chunk material.
pub(crate) const CHUNK: &str = "\u{0}weft.chunk";

/// Where a chunk's bytes are, as the sender sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkRef {
    /// Memory of the sending process, not registered (read with the fabric's peer read, or
    /// staged through the pool where the fabric has none).
    Pointer {
        /// Address in the sender.
        addr: u64,
        /// Bytes.
        len: u64,
        /// [`ChunkRef::width`].
        width: u8,
    },
    /// Memory of the sending process registered for this transfer (networks): the receiver
    /// reads it with the fabric's RMA under `key`.
    Registered {
        /// The address the receiver names (the sender's virtual address, or 0).
        addr: u64,
        /// The registration's key.
        key: u64,
        /// Bytes.
        len: u64,
        /// [`ChunkRef::width`].
        width: u8,
    },
    /// A block of the sender's registered pool.
    Rma {
        /// The pool's segment id.
        segment: u32,
        /// Byte offset in the segment.
        offset: u64,
        /// Bytes.
        len: u64,
        /// [`ChunkRef::width`].
        width: u8,
    },
}

impl ChunkRef {
    /// Bytes of the chunk.
    pub fn len(&self) -> u64 {
        match *self {
            ChunkRef::Pointer { len, .. } | ChunkRef::Registered { len, .. } | ChunkRef::Rma { len, .. } => {
                len
            }
        }
    }
    /// `0` for the bytes of a chunk-aware value ([`crate::SerializeBuffer`], [`crate::RmaVec`],
    /// any byte string); 1, 2, 4, 8 or 16 for the elements of a plain sequence of numbers of
    /// that width, which the target pulls straight into the `Vec` it will hand over.
    pub fn width(&self) -> u8 {
        match *self {
            ChunkRef::Pointer { width, .. }
            | ChunkRef::Registered { width, .. }
            | ChunkRef::Rma { width, .. } => width,
        }
    }
    /// The chunk for `bytes` of element width `width`: an RMA chunk if they lie in the pool
    /// `locate` knows, else what [`Locate::outside`] makes of them (staged into the pool, or
    /// registered), else a pointer chunk.
    pub fn place(locate: &dyn Locate, bytes: &[u8], width: u8) -> ChunkRef {
        let (addr, len) = (bytes.as_ptr() as u64, bytes.len() as u64);
        match locate.locate(addr, len) {
            Some((segment, offset)) => ChunkRef::Rma { segment, offset, len, width },
            None => locate.outside(bytes, width).unwrap_or(ChunkRef::Pointer { addr, len, width }),
        }
    }
    /// True for an empty chunk.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Errors of encoding and decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveError(pub String);

impl fmt::Display for ArchiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ArchiveError {}
impl ser::Error for ArchiveError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        ArchiveError(msg.to_string())
    }
}
impl de::Error for ArchiveError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        ArchiveError(msg.to_string())
    }
}

#[cold]
fn short_input<T>(n: usize, left: usize) -> Result<T, ArchiveError> {
    err(format!("needs {n} bytes, {left} remain"))
}

fn err<T>(msg: impl Into<String>) -> Result<T, ArchiveError> {
    Err(ArchiveError(msg.into()))
}

/// Decides which memory a chunk's bytes are in: returns the RMA location of `[addr, addr+len)`
/// if it lies in a registered pool block.
pub trait Locate {
    /// `(segment, offset)` of the bytes in this rank's pool, if they are there.
    fn locate(&self, addr: u64, len: u64) -> Option<(u32, u64)>;
    /// The chunk for `bytes` (outside the pool, elements of `width` bytes, 0 for bytes) when
    /// the target should not read them by address: an RMA chunk once they are copied into the
    /// pool (where the fabric cannot read them in place, or a copy costs less than the read),
    /// or a registered chunk (`None`: leave them as a pointer chunk).
    fn outside(&self, bytes: &[u8], width: u8) -> Option<ChunkRef> {
        let _ = (bytes, width);
        None
    }
}

/// No pool: every chunk is a pointer chunk.
pub struct NoPool;
impl Locate for NoPool {
    fn locate(&self, _: u64, _: u64) -> Option<(u32, u64)> {
        None
    }
}

/// An encoded value: the index buffer and the chunks it refers to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Archive {
    /// The flat buffer of small values.
    pub index: Vec<u8>,
    /// Large buffers, by number.
    pub chunks: Vec<ChunkRef>,
}

/// Encodes `value`; byte strings of `threshold` bytes or more become chunks.
///
/// The chunks point into `value`'s memory: keep `value` alive (and unmodified) until the
/// archive has been sent and pulled.
pub fn encode<T: Serialize + ?Sized>(
    value: &T,
    threshold: usize,
    pool: &dyn Locate,
) -> Result<Archive, ArchiveError> {
    encode_into(value, threshold, pool, Vec::with_capacity(256))
}

/// As [`encode`], writing the index into `index` (cleared first; pass a buffer to reuse).
pub fn encode_into<T: Serialize + ?Sized>(
    value: &T,
    threshold: usize,
    pool: &dyn Locate,
    mut index: Vec<u8>,
) -> Result<Archive, ArchiveError> {
    index.clear();
    let mut s = Encoder { out: Archive { index, chunks: vec![] }, threshold, pool };
    value.serialize(&mut s)?;
    Ok(s.out)
}

struct Encoder<'p> {
    out: Archive,
    threshold: usize,
    pool: &'p dyn Locate,
}

impl Encoder<'_> {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.out.index.extend_from_slice(b);
    }
    #[inline]
    fn len(&mut self, n: usize) {
        self.put(&(n as u64).to_le_bytes());
    }
    /// Makes `bytes` (elements of `width` bytes, 0 for a byte string) a chunk and returns its
    /// number.
    fn chunk(&mut self, bytes: &[u8], width: u8) -> usize {
        self.out.chunks.push(ChunkRef::place(self.pool, bytes, width));
        self.out.chunks.len() - 1
    }
    /// A sequence of `count` numbers whose wire bytes are `bytes` (see [`crate::numbers`]):
    /// one block in the index, or a chunk at the threshold.
    fn number_seq(&mut self, count: usize, bytes: &[u8]) {
        if count > 0 && bytes.len() >= self.threshold {
            self.put(&(count as u64 | SEQ_CHUNKED).to_le_bytes());
            let i = self.chunk(bytes, (bytes.len() / count) as u8);
            self.len(i);
        } else {
            self.out.index.reserve(8 + bytes.len());
            self.len(count);
            self.put(bytes);
        }
    }
}

/// Tags of a byte string in the index.
const INLINE: u8 = 0;
const CHUNKED: u8 = 1;
/// Set in a sequence's count when its elements (numbers) are a chunk, whose number follows.
const SEQ_CHUNKED: u64 = 1 << 63;

macro_rules! ser_num {
    ($($f:ident $t:ty),*) => {$(
        #[inline]
        fn $f(self, v: $t) -> Result<(), ArchiveError> {
            self.put(&v.to_le_bytes());
            Ok(())
        }
    )*};
}

impl<'a, 'p> ser::Serializer for &'a mut Encoder<'p> {
    type Ok = ();
    type Error = ArchiveError;
    type SerializeSeq = Counted<'a, 'p>;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Counted<'a, 'p>;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    ser_num!(serialize_i8 i8, serialize_i16 i16, serialize_i32 i32, serialize_i64 i64, serialize_i128 i128,
             serialize_u8 u8, serialize_u16 u16, serialize_u32 u32, serialize_u64 u64, serialize_u128 u128,
             serialize_f32 f32, serialize_f64 f64);

    fn serialize_bool(self, v: bool) -> Result<(), ArchiveError> {
        self.put(&[v as u8]);
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), ArchiveError> {
        self.serialize_u32(v as u32)
    }
    fn serialize_str(self, v: &str) -> Result<(), ArchiveError> {
        self.len(v.len());
        self.put(v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), ArchiveError> {
        // Any byte string this large becomes a chunk, whether or not a chunk-aware type wrote it.
        if v.len() >= self.threshold {
            self.put(&[CHUNKED]);
            let i = self.chunk(v, 0);
            self.len(i);
        } else {
            self.out.index.reserve(9 + v.len());
            self.put(&[INLINE]);
            self.len(v.len());
            self.put(v);
        }
        Ok(())
    }
    fn serialize_none(self) -> Result<(), ArchiveError> {
        self.put(&[0]);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<(), ArchiveError> {
        self.put(&[1]);
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), ArchiveError> {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), ArchiveError> {
        Ok(())
    }
    fn serialize_unit_variant(self, _: &'static str, i: u32, _: &'static str) -> Result<(), ArchiveError> {
        self.serialize_u32(i)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<(), ArchiveError> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        i: u32,
        _: &'static str,
        v: &T,
    ) -> Result<(), ArchiveError> {
        self.serialize_u32(i)?;
        v.serialize(self)
    }
    fn collect_seq<I>(self, items: I) -> Result<(), ArchiveError>
    where
        I: IntoIterator,
        I::Item: Serialize,
    {
        let items = items.into_iter();
        if let Some((count, bytes)) = crate::numbers::number_block(&items) {
            self.number_seq(count, bytes);
            return Ok(());
        }
        let (lo, hi) = items.size_hint();
        let mut seq = self.serialize_seq((hi == Some(lo)).then_some(lo))?;
        for x in items {
            ser::SerializeSeq::serialize_element(&mut seq, &x)?;
        }
        ser::SerializeSeq::end(seq)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Counted<'a, 'p>, ArchiveError> {
        // Every element takes at least a byte: room for them up front, not by doubling.
        self.out.index.reserve(len.unwrap_or(0).min(1 << 30));
        Ok(Counted::start(self))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self, ArchiveError> {
        Ok(self)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, ArchiveError> {
        Ok(self)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        i: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self, ArchiveError> {
        self.serialize_u32(i)?;
        Ok(self)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Counted<'a, 'p>, ArchiveError> {
        Ok(Counted::start(self))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, ArchiveError> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        i: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self, ArchiveError> {
        self.serialize_u32(i)?;
        Ok(self)
    }
}

/// A sequence or map: the element count goes first, patched at the end when serde did not
/// know it in advance.
pub struct Counted<'a, 'p> {
    enc: &'a mut Encoder<'p>,
    at: usize,
    count: usize,
}

impl<'a, 'p> Counted<'a, 'p> {
    fn start(enc: &'a mut Encoder<'p>) -> Self {
        let at = enc.out.index.len();
        enc.len(0);
        Counted { enc, at, count: 0 }
    }
    fn finish(self) -> Result<(), ArchiveError> {
        self.enc.out.index[self.at..self.at + 8].copy_from_slice(&(self.count as u64).to_le_bytes());
        Ok(())
    }
}

impl ser::SerializeSeq for Counted<'_, '_> {
    type Ok = ();
    type Error = ArchiveError;
    #[inline]
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), ArchiveError> {
        self.count += 1;
        v.serialize(&mut *self.enc)
    }
    fn end(self) -> Result<(), ArchiveError> {
        self.finish()
    }
}

impl ser::SerializeMap for Counted<'_, '_> {
    type Ok = ();
    type Error = ArchiveError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Result<(), ArchiveError> {
        self.count += 1;
        k.serialize(&mut *self.enc)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), ArchiveError> {
        v.serialize(&mut *self.enc)
    }
    fn end(self) -> Result<(), ArchiveError> {
        self.finish()
    }
}

macro_rules! ser_compound {
    ($tr:ident, $f:ident $(, $key:ty)?) => {
        impl ser::$tr for &mut Encoder<'_> {
            type Ok = ();
            type Error = ArchiveError;
            #[inline]
            fn $f<T: Serialize + ?Sized>(&mut self, $(_: $key,)? v: &T) -> Result<(), ArchiveError> {
                v.serialize(&mut **self)
            }
            fn end(self) -> Result<(), ArchiveError> {
                Ok(())
            }
        }
    };
}
ser_compound!(SerializeTuple, serialize_element);
ser_compound!(SerializeTupleStruct, serialize_field);
ser_compound!(SerializeTupleVariant, serialize_field);
ser_compound!(SerializeStruct, serialize_field, &'static str);
ser_compound!(SerializeStructVariant, serialize_field, &'static str);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz::Shape;
    use std::collections::BTreeMap;
    use weft_fabric::pod::bytes_of;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Record {
        id: u64,
        name: String,
        tags: Vec<Option<i16>>,
        shapes: Vec<Shape>,
        map: BTreeMap<String, (bool, char)>,
    }

    fn sample() -> Record {
        Record {
            id: 7,
            name: "weft".into(),
            tags: vec![Some(-3), None, Some(9)],
            shapes: vec![Shape::Dot, Shape::Circle(2.5), Shape::Rect { w: 3, h: 4 }],
            map: [("a".to_string(), (true, 'λ'))].into_iter().collect(),
        }
    }

    #[test]
    fn round_trip() {
        let a = encode(&sample(), 4096, &NoPool).unwrap();
        assert!(a.chunks.is_empty());
        assert_eq!(decode::<Record>(&a.index, &NoChunks).unwrap(), sample());
    }

    #[test]
    fn large_bytes_become_pointer_chunks() {
        let big = vec![5u8; 10_000];
        let a = encode(&(1u8, Bytes(&big)), 4096, &NoPool).unwrap();
        assert_eq!(a.chunks, vec![ChunkRef::Pointer { addr: big.as_ptr() as u64, len: 10_000, width: 0 }]);
        assert!(a.index.len() < 32, "index of {} bytes", a.index.len());
    }

    struct Bytes<'a>(&'a [u8]);
    impl serde::Serialize for Bytes<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    /// Chunks served from copies of known buffers, found by address (a transport's pull).
    struct Known(Vec<(u64, Vec<u8>)>, std::cell::RefCell<Vec<ChunkRef>>);
    impl ChunkSource for Known {
        fn take(&self, i: usize) -> Option<crate::buffer::Received> {
            let ChunkRef::Pointer { addr, len, .. } = std::mem::replace(
                self.1.borrow_mut().get_mut(i)?,
                ChunkRef::Pointer { addr: 0, len: 0, width: 0 },
            ) else {
                return None;
            };
            let (_, bytes) = self.0.iter().find(|(a, b)| *a == addr && b.len() as u64 == len)?;
            let mut buf = weft_fabric::pod::AlignedBuf::zeroed(bytes.len());
            buf.as_bytes_mut().copy_from_slice(bytes);
            Some(crate::buffer::Received::Heap(buf))
        }
    }

    #[test]
    fn number_sequences_are_blocks_with_the_element_wire_format() {
        use std::collections::VecDeque;
        let bytes: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        let floats: Vec<f64> = (0..300).map(|i| i as f64 * -0.5).collect();
        let sizes: Vec<usize> = vec![1, usize::MAX, 3];
        let value = (bytes.clone(), floats.clone(), sizes.clone(), &bytes[5..9]);
        // The same values through serde's element path (a VecDeque's iterator is no slice).
        let slow = (
            VecDeque::from(bytes.clone()),
            VecDeque::from(floats.clone()),
            VecDeque::from(sizes.clone()),
            VecDeque::from(bytes[5..9].to_vec()),
        );
        let fast = encode(&value, 1 << 20, &NoPool).unwrap();
        assert_eq!(fast.index, encode(&slow, 1 << 20, &NoPool).unwrap().index);
        // Either side may take either path.
        type Fast = (Vec<u8>, Vec<f64>, Vec<usize>, Vec<u8>);
        type Slow = (VecDeque<u8>, VecDeque<f64>, VecDeque<usize>, VecDeque<u8>);
        let back: Fast = decode(&fast.index, &NoChunks).unwrap();
        assert_eq!(back, (bytes.clone(), floats.clone(), sizes, bytes[5..9].to_vec()));
        assert_eq!(decode::<Slow>(&fast.index, &NoChunks).unwrap(), slow);
        // Truncated or forged counts are errors.
        for cut in [0, 7, 8, 100, fast.index.len() - 1] {
            assert!(decode::<Fast>(&fast.index[..cut], &NoChunks).is_err());
        }
        let mut forged = fast.index.clone();
        forged[..8].copy_from_slice(&(u64::MAX >> 1).to_le_bytes());
        assert!(decode::<Fast>(&forged, &NoChunks).is_err());
    }

    #[test]
    fn large_number_sequences_become_chunks() {
        use std::collections::VecDeque;
        let big: Vec<u32> = (0..10_000).collect();
        let a = encode(&(7u8, &big), 4096, &NoPool).unwrap();
        assert_eq!(a.chunks, vec![ChunkRef::Pointer { addr: big.as_ptr() as u64, len: 40_000, width: 4 }]);
        assert!(a.index.len() < 32, "index of {} bytes", a.index.len());
        let source = || Known(vec![(big.as_ptr() as u64, bytes_of(&big).to_vec())], a.chunks.clone().into());
        // Recognised visitor: one block; any other visitor: number by number.
        assert_eq!(decode::<(u8, Vec<u32>)>(&a.index, &source()).unwrap(), (7, big.clone()));
        let deque: (u8, VecDeque<u32>) = decode(&a.index, &source()).unwrap();
        assert_eq!(deque.1, VecDeque::from(big.clone()));
        // A receiving type of other numbers or other widths is an error, not a reinterpretation.
        assert!(decode::<(u8, Vec<u64>)>(&a.index, &source()).is_err());
        assert!(decode::<(u8, VecDeque<u16>)>(&a.index, &source()).is_err());
        assert!(decode::<(u8, Vec<String>)>(&a.index, &source()).is_err());
        assert!(decode::<(u8, Vec<u32>)>(&a.index, &NoChunks).is_err());
    }

    #[test]
    fn pulled_numbers_become_the_vec() {
        use crate::buffer::{Numbers, Received};
        struct Given(std::cell::RefCell<Option<Received>>);
        impl ChunkSource for Given {
            fn take(&self, i: usize) -> Option<Received> {
                if i == 0 {
                    self.0.borrow_mut().take()
                } else {
                    None
                }
            }
        }
        let big: Vec<u32> = (0..5000).collect();
        let a = encode(&(7u8, &big), 4096, &NoPool).unwrap();
        let given = || Given(Some(Received::Numbers(Numbers::W4(big.clone()))).into());
        // The pulled vector itself becomes the value (no copy), as u32s or as f32s.
        let source = given();
        let at = match &*source.0.borrow() {
            Some(Received::Numbers(Numbers::W4(v))) => v.as_ptr() as usize,
            _ => unreachable!(),
        };
        let (_, back): (u8, Vec<u32>) = decode(&a.index, &source).unwrap();
        assert!(back == big && back.as_ptr() as usize == at);
        let (_, floats): (u8, Vec<f32>) = decode(&a.index, &given()).unwrap();
        assert_eq!(floats[1].to_bits(), 1);
        // A number chunk is no byte string.
        assert!(decode::<(u8, crate::SerializeBuffer<u32>)>(&a.index, &given()).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // Every truncation and a deterministic pseudo-random corruption of a valid archive.
        let good = encode(&sample(), 4096, &NoPool).unwrap().index;
        for cut in 0..good.len() {
            assert!(decode::<Record>(&good[..cut], &NoChunks).is_err());
        }
        let mut x = 0x9e3779b97f4a7c15u64;
        for _ in 0..20_000 {
            let mut b = good.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize) % b.len();
                b[i] = (x >> 32) as u8;
            }
            let _ = decode::<Record>(&b, &NoChunks);
            let _ = decode::<Vec<Vec<String>>>(&b, &NoChunks);
        }
        // A forged huge length is an error, not an allocation.
        let mut huge = (u64::MAX / 2).to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 16]);
        assert!(decode::<Vec<u64>>(&huge, &NoChunks).is_err());
        assert!(decode::<String>(&huge, &NoChunks).is_err());
    }
}
