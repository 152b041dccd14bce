//! Decoding an archive: total over arbitrary input (every length checked against what
//! remains before anything is allocated, nesting bounded).

use super::{err, short_input, ArchiveError, CHUNK, CHUNKED, INLINE, SEQ_CHUNKED};
use crate::numbers;
use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

/// What a chunk became on the receiving side, handed to the value that asks for it.
pub trait ChunkSource {
    /// Takes chunk `i` (each chunk can be taken once).
    fn take(&self, i: usize) -> Option<crate::buffer::Received>;
}

/// No chunks: an archive made only of an index.
pub struct NoChunks;
impl ChunkSource for NoChunks {
    fn take(&self, _: usize) -> Option<crate::buffer::Received> {
        None
    }
}

/// Most nested containers the decoder follows (deeper input is rejected, not a stack overflow).
const MAX_DEPTH: usize = 128;

/// Decodes a `T` from `index`, taking chunks from `chunks`; trailing bytes are an error.
pub fn decode<T: de::DeserializeOwned>(index: &[u8], chunks: &dyn ChunkSource) -> Result<T, ArchiveError> {
    let mut d = Decoder { input: index, chunks, depth: 0 };
    let v = T::deserialize(&mut d)?;
    if !d.input.is_empty() {
        return err(format!("{} trailing bytes after the value", d.input.len()));
    }
    Ok(v)
}

enum ByteString<'de> {
    Inline(&'de [u8]),
    Chunk(usize, crate::buffer::Received),
}

struct Decoder<'de, 'c> {
    input: &'de [u8],
    chunks: &'c dyn ChunkSource,
    depth: usize,
}

impl<'de> Decoder<'de, '_> {
    #[inline]
    fn take(&mut self, n: usize) -> Result<&'de [u8], ArchiveError> {
        if n > self.input.len() {
            return short_input(n, self.input.len());
        }
        let (a, b) = self.input.split_at(n);
        self.input = b;
        Ok(a)
    }
    #[inline]
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], ArchiveError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    #[inline]
    fn u64(&mut self) -> Result<u64, ArchiveError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    /// A length of items each at least `min_item` bytes long: checked against what remains.
    fn len(&mut self, min_item: usize) -> Result<usize, ArchiveError> {
        let n = self.u64()?;
        self.fits(n, min_item)
    }
    /// `n` items each at least `min_item` bytes long, checked against what remains.
    fn fits(&self, n: u64, min_item: usize) -> Result<usize, ArchiveError> {
        if n.saturating_mul(min_item as u64) > self.input.len() as u64 {
            return err(format!("declared length {n} exceeds the {} bytes that remain", self.input.len()));
        }
        usize::try_from(n).or_else(|_| err("length overflows usize"))
    }
    /// A byte string: inline bytes, or a chunk (its number and the chunk itself).
    fn byte_string(&mut self) -> Result<ByteString<'de>, ArchiveError> {
        match self.arr::<1>()?[0] {
            INLINE => {
                let n = self.len(1)?;
                Ok(ByteString::Inline(self.take(n)?))
            }
            CHUNKED => match self.chunk()? {
                (i, crate::buffer::Received::Numbers(_)) => {
                    err(format!("chunk {i} holds numbers, not bytes"))
                }
                (i, c) => Ok(ByteString::Chunk(i, c)),
            },
            t => err(format!("byte-string tag {t}")),
        }
    }

    /// A chunk number and the chunk it names.
    fn chunk(&mut self) -> Result<(usize, crate::buffer::Received), ArchiveError> {
        let i = self.u64()? as usize;
        let c =
            self.chunks.take(i).ok_or_else(|| ArchiveError(format!("chunk {i} missing or taken twice")))?;
        Ok((i, c))
    }

    /// A sequence of `count` numbers whose bytes are a chunk (see [`crate::numbers`]).
    fn chunked_seq<V: Visitor<'de>>(&mut self, count: u64, v: V) -> Result<V::Value, ArchiveError> {
        let (_, c) = self.chunk()?;
        let count = usize::try_from(count).or_else(|_| err("length overflows usize"))?;
        let len = c.as_bytes().len();
        if let Some(kind) = numbers::recognise::<V>() {
            if count.checked_mul(kind.width()) != Some(len) {
                return err(format!("{len} bytes are not {count} numbers of {} bytes", kind.width()));
            }
            return numbers::build_from::<V>(kind, c);
        }
        self.nest()?;
        let r = v.visit_seq(numbers::NumberItems::new(count, c.as_bytes())?);
        self.depth -= 1;
        r
    }

    fn nest(&mut self) -> Result<(), ArchiveError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return err(format!("nested deeper than {MAX_DEPTH}"));
        }
        Ok(())
    }
}

macro_rules! de_num {
    ($($f:ident $t:ty => $visit:ident),*) => {$(
        #[inline]
        fn $f<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
            v.$visit(<$t>::from_le_bytes(self.arr()?))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for &mut Decoder<'de, '_> {
    type Error = ArchiveError;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ArchiveError> {
        err("the archive is not self-describing (deserialize_any)")
    }
    de_num!(deserialize_i8 i8 => visit_i8, deserialize_i16 i16 => visit_i16, deserialize_i32 i32 => visit_i32,
            deserialize_i64 i64 => visit_i64, deserialize_i128 i128 => visit_i128,
            deserialize_u8 u8 => visit_u8, deserialize_u16 u16 => visit_u16, deserialize_u32 u32 => visit_u32,
            deserialize_u64 u64 => visit_u64, deserialize_u128 u128 => visit_u128,
            deserialize_f32 f32 => visit_f32, deserialize_f64 f64 => visit_f64);

    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
        match self.arr::<1>()?[0] {
            0 => v.visit_bool(false),
            1 => v.visit_bool(true),
            b => err(format!("bool byte {b}")),
        }
    }
    fn deserialize_char<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
        let c = u32::from_le_bytes(self.arr()?);
        v.visit_char(char::from_u32(c).ok_or_else(|| ArchiveError(format!("char {c:#x}")))?)
    }
    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
        let n = self.len(1)?;
        let b = self.take(n)?;
        v.visit_borrowed_str(std::str::from_utf8(b).map_err(|e| ArchiveError(format!("string: {e}")))?)
    }
    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
        self.deserialize_str(v)
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
        match self.byte_string()? {
            ByteString::Inline(b) => v.visit_borrowed_bytes(b),
            // A plain byte container gets an owned copy; chunk-aware types ask through the
            // newtype path below and take the buffer itself.
            ByteString::Chunk(_, c) => v.visit_byte_buf(c.as_bytes().to_vec()),
        }
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
        self.deserialize_bytes(v)
    }
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
        match self.arr::<1>()?[0] {
            0 => v.visit_none(),
            1 => {
                self.nest()?;
                let r = v.visit_some(&mut *self);
                self.depth -= 1;
                r
            }
            t => err(format!("option tag {t}")),
        }
    }
    fn deserialize_unit<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
        v.visit_unit()
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, ArchiveError> {
        v.visit_unit()
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        v: V,
    ) -> Result<V::Value, ArchiveError> {
        if name == CHUNK {
            return match self.byte_string()? {
                ByteString::Inline(b) => v.visit_borrowed_bytes(b),
                ByteString::Chunk(i, c) => crate::buffer::with_handoff(c, || v.visit_u64(i as u64)),
            };
        }
        self.nest()?;
        let r = v.visit_newtype_struct(&mut *self);
        self.depth -= 1;
        r
    }
    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
        let raw = self.u64()?;
        if raw & SEQ_CHUNKED != 0 {
            return self.chunked_seq(raw & !SEQ_CHUNKED, v);
        }
        if let Some(kind) = numbers::recognise::<V>() {
            // A Vec of numbers: its elements are one block, built with one copy.
            let n = self.fits(raw, kind.width())?;
            let bytes = self.take(n * kind.width())?;
            return numbers::build::<V>(kind, bytes);
        }
        // Every element takes at least one byte (sequences of zero-sized values longer than the
        // remaining input are rejected): a forged count cannot make the decoder spin.
        let n = self.fits(raw, 1)?;
        self.nest()?;
        let r = v.visit_seq(Items { d: &mut *self, left: n });
        self.depth -= 1;
        r
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, n: usize, v: V) -> Result<V::Value, ArchiveError> {
        self.nest()?;
        let r = v.visit_seq(Items { d: &mut *self, left: n });
        self.depth -= 1;
        r
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        n: usize,
        v: V,
    ) -> Result<V::Value, ArchiveError> {
        self.deserialize_tuple(n, v)
    }
    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
        let n = self.len(1)?;
        self.nest()?;
        let r = v.visit_map(Items { d: &mut *self, left: n });
        self.depth -= 1;
        r
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, ArchiveError> {
        self.deserialize_tuple(fields.len(), v)
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, ArchiveError> {
        self.nest()?;
        let r = v.visit_enum(&mut *self);
        self.depth -= 1;
        r
    }
    fn deserialize_identifier<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
        self.deserialize_u32(v)
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ArchiveError> {
        err("the archive cannot skip values (deserialize_ignored_any)")
    }
    fn is_human_readable(&self) -> bool {
        false
    }
}

/// Elements of a sequence, tuple or map: `left` more to read. serde's size hint is capped by
/// the bytes that remain, so a huge declared count never preallocates.
struct Items<'a, 'de, 'c> {
    d: &'a mut Decoder<'de, 'c>,
    left: usize,
}

impl<'de> de::SeqAccess<'de> for Items<'_, 'de, '_> {
    type Error = ArchiveError;
    #[inline]
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, ArchiveError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.d).map(Some)
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.left.min(self.d.input.len()))
    }
}

impl<'de> de::MapAccess<'de> for Items<'_, 'de, '_> {
    type Error = ArchiveError;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, ArchiveError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.d).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, ArchiveError> {
        seed.deserialize(&mut *self.d)
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.left.min(self.d.input.len()))
    }
}

impl<'de> de::EnumAccess<'de> for &mut Decoder<'de, '_> {
    type Error = ArchiveError;
    type Variant = Self;
    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), ArchiveError> {
        let i = u32::from_le_bytes(self.arr()?);
        let v = seed.deserialize(i.into_deserializer())?;
        Ok((v, self))
    }
}

impl<'de> de::VariantAccess<'de> for &mut Decoder<'de, '_> {
    type Error = ArchiveError;
    fn unit_variant(self) -> Result<(), ArchiveError> {
        Ok(())
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, ArchiveError> {
        seed.deserialize(self)
    }
    fn tuple_variant<V: Visitor<'de>>(self, n: usize, v: V) -> Result<V::Value, ArchiveError> {
        de::Deserializer::deserialize_tuple(self, n, v)
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, ArchiveError> {
        de::Deserializer::deserialize_tuple(self, fields.len(), v)
    }
}
