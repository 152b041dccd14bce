//! Sequences of fixed-width numbers (`Vec<u8>`, `Vec<f64>`, `&[i32]`, …) as one block of bytes.
//!
//! serde hands a format every `Vec<T>` element by element, and takes it back the same way; for
//! a `Vec<u8>` of a MiB that is a million calls each way. The archive writes a sequence as its
//! count followed by each element's fixed little-endian bytes, which on a little-endian machine
//! are exactly the bytes of the slice in memory. So:
//! - **encoding**: the archive's `collect_seq` (which serde calls for slices, `Vec`s and
//!   `VecDeque`s) asks [`number_block`] whether the iterator is a slice iterator over a number
//!   type ([`weft_fabric::pod::remaining_slice`]); if so the elements are copied as one block,
//!   or, at the chunk threshold, become a chunk that travels straight from the caller's memory;
//! - **decoding**: `deserialize_seq` asks [`recognise`] whether the visitor is serde's own
//!   visitor for `Vec<P>`. Its type key is learnt once, by asking `Vec<P>::deserialize` to read
//!   from a probe that records the visitor it is given and then fails. A recognised visitor gets
//!   its `Vec<P>` built from the block with one copy ([`build`]).
//!
//! Every other sequence, and every sequence on a big-endian machine, goes element by element.
//! The bytes on the wire are the same either way, so each side may take either path; only a
//! chunked sequence read by a visitor that is not recognised needs [`NumberItems`], which hands
//! the chunk's numbers out one by one.

use crate::archive::ArchiveError;
use crate::buffer::Received;
use serde::de::{self, DeserializeSeed, Visitor};
use std::any::TypeId;
use std::sync::OnceLock;
use weft_fabric::pod::{bytes_of, remaining_slice, type_key, vec_as, vec_from_bytes};

/// The number types whose sequences travel as blocks, each with its width on the wire.
macro_rules! numbers {
    ($m:ident) => {
        $m!(0 u8 1, 1 i8 1, 2 u16 2, 3 i16 2, 4 u32 4, 5 i32 4, 6 u64 8, 7 i64 8, 8 u128 16,
            9 i128 16, 10 f32 4, 11 f64 8, 12 usize 8, 13 isize 8)
    };
}
const KINDS: usize = 14;

/// A number type of the list above (its position in it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Kind(usize);

impl Kind {
    /// Bytes per element on the wire.
    pub(crate) fn width(self) -> usize {
        macro_rules! width {
            ($($i:literal $t:ident $w:literal),*) => {
                match self.0 { $($i => $w,)* _ => unreachable!("kind {}", self.0) }
            };
        }
        numbers!(width)
    }
}

/// The element count and bytes of `it` if it is a slice iterator over a number type whose
/// memory layout is its wire format (little-endian, and `usize` only where it is 8 bytes).
#[inline]
pub(crate) fn number_block<I: Iterator>(it: &I) -> Option<(usize, &[u8])> {
    // Constant filters: only a two-word iterator of references can be a slice iterator.
    if !cfg!(target_endian = "little")
        || std::mem::size_of::<I>() != std::mem::size_of::<std::slice::Iter<'_, u8>>()
        || std::mem::size_of::<I::Item>() != std::mem::size_of::<&u8>()
    {
        return None;
    }
    // One type key for the iterator, looked up among the slice iterators of the number types.
    let key = type_key::<I>();
    let kind = keys().slice_iters.iter().position(|k| *k == Some(key))?;
    macro_rules! take {
        ($($i:literal $t:ident $w:literal),*) => {
            match kind {
                $($i => remaining_slice::<I, $t>(it).map(|s| (s.len(), bytes_of(s))),)*
                _ => None,
            }
        };
    }
    numbers!(take)
}

/// The kind of `Vec<P>` that `V` builds, if `V` is serde's visitor for `Vec<P>` and `P` is a
/// number type whose memory layout is its wire format.
#[inline]
pub(crate) fn recognise<'de, V: Visitor<'de>>() -> Option<Kind> {
    // serde's Vec visitor is a zero-sized marker whose value is a Vec: everything else is
    // filtered out by constants.
    if !cfg!(target_endian = "little")
        || std::mem::size_of::<V>() != 0
        || std::mem::size_of::<V::Value>() != std::mem::size_of::<Vec<u8>>()
    {
        return None;
    }
    let key = type_key::<V>();
    keys().vec_visitors.iter().position(|k| *k == Some(key)).map(Kind)
}

/// `V`'s value built from `bytes`, the elements of a sequence of kind `kind` (as [`recognise`]
/// said `V` builds).
pub(crate) fn build<'de, V: Visitor<'de>>(kind: Kind, bytes: &[u8]) -> Result<V::Value, ArchiveError> {
    macro_rules! build {
        ($($i:literal $t:ident $w:literal),*) => {
            match kind.0 {
                $($i => vec_as::<$t, V::Value>(vec_from_bytes::<$t>(bytes)).ok(),)*
                _ => None,
            }
        };
    }
    numbers!(build).ok_or_else(|| ArchiveError(format!("visitor of kind {kind:?} builds another type")))
}

/// As [`build`], from a pulled chunk: a chunk pulled into a vector of the right width becomes
/// the value without a copy.
pub(crate) fn build_from<'de, V: Visitor<'de>>(
    kind: Kind,
    chunk: Received,
) -> Result<V::Value, ArchiveError> {
    let Received::Numbers(numbers) = chunk else {
        return build::<V>(kind, chunk.as_bytes());
    };
    macro_rules! take {
        ($($i:literal $t:ident $w:literal),*) => {
            match kind.0 {
                $($i => match numbers.into_vec::<$t>() {
                    Ok(v) => vec_as::<$t, V::Value>(v).ok(),
                    Err(other) => return build::<V>(kind, other.as_bytes()),
                },)*
                _ => None,
            }
        };
    }
    numbers!(take).ok_or_else(|| ArchiveError(format!("visitor of kind {kind:?} builds another type")))
}

/// The type keys of each number kind `P` (`None` where `P`'s layout is not its wire format),
/// learnt once: of `std::slice::Iter<'_, P>`, and of serde's visitor for `Vec<P>`.
struct Keys {
    slice_iters: [Option<TypeId>; KINDS],
    vec_visitors: [Option<TypeId>; KINDS],
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut k = Keys { slice_iters: [None; KINDS], vec_visitors: [None; KINDS] };
        macro_rules! learn {
            ($($i:literal $t:ident $w:literal),*) => {$(
                if std::mem::size_of::<$t>() == $w {
                    k.slice_iters[$i] = Some(type_key::<std::slice::Iter<'static, $t>>());
                    let mut p = Probe(None);
                    let _ = <Vec<$t> as serde::Deserialize>::deserialize(&mut p);
                    k.vec_visitors[$i] = p.0;
                }
            )*};
        }
        numbers!(learn);
        k
    })
}

/// A deserializer that records the visitor `deserialize_seq` is given, and fails.
struct Probe(Option<TypeId>);

impl<'de> de::Deserializer<'de> for &mut Probe {
    type Error = ArchiveError;
    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ArchiveError> {
        Err(ArchiveError("probe".into()))
    }
    fn deserialize_seq<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ArchiveError> {
        self.0 = Some(type_key::<V>());
        Err(ArchiveError("probe".into()))
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

/// The elements of a chunked sequence for a visitor that is not recognised: numbers of `width`
/// bytes each.
pub(crate) struct NumberItems<'b> {
    bytes: &'b [u8],
    width: usize,
}

impl<'b> NumberItems<'b> {
    /// `count` numbers in `bytes` (an error unless they divide into equal widths of a number).
    pub(crate) fn new(count: usize, bytes: &'b [u8]) -> Result<Self, ArchiveError> {
        let width = bytes.len().checked_div(count).unwrap_or(0);
        if count == 0 || width * count != bytes.len() || ![1, 2, 4, 8, 16].contains(&width) {
            return Err(ArchiveError(format!("{} bytes are not {count} numbers", bytes.len())));
        }
        Ok(NumberItems { bytes, width })
    }
}

impl<'de> de::SeqAccess<'de> for NumberItems<'_> {
    type Error = ArchiveError;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, ArchiveError> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let (first, rest) = self.bytes.split_at(self.width);
        self.bytes = rest;
        seed.deserialize(Number(first)).map(Some)
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.bytes.len() / self.width)
    }
}

/// One number of a chunked sequence: its little-endian bytes.
struct Number<'b>(&'b [u8]);

macro_rules! de_number {
    ($($f:ident $t:ty => $visit:ident),*) => {$(
        fn $f<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ArchiveError> {
            match <[u8; std::mem::size_of::<$t>()]>::try_from(self.0) {
                Ok(b) => v.$visit(<$t>::from_le_bytes(b)),
                Err(_) => self.deserialize_any(v),
            }
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Number<'_> {
    type Error = ArchiveError;
    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, ArchiveError> {
        Err(ArchiveError(format!(
            "a chunked sequence holds {}-byte numbers, not what the receiving type expects",
            self.0.len()
        )))
    }
    de_number!(deserialize_i8 i8 => visit_i8, deserialize_i16 i16 => visit_i16, deserialize_i32 i32 => visit_i32,
               deserialize_i64 i64 => visit_i64, deserialize_i128 i128 => visit_i128,
               deserialize_u8 u8 => visit_u8, deserialize_u16 u16 => visit_u16, deserialize_u32 u32 => visit_u32,
               deserialize_u64 u64 => visit_u64, deserialize_u128 u128 => visit_u128,
               deserialize_f32 f32 => visit_f32, deserialize_f64 f64 => visit_f64);
    serde::forward_to_deserialize_any! {
        bool char str string bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_vec_visitor_is_learnt() {
        if cfg!(all(target_endian = "little", target_pointer_width = "64")) {
            let visitors = &keys().vec_visitors;
            assert!(visitors.iter().all(Option::is_some), "{visitors:?}");
            let keys_seen: std::collections::HashSet<_> = visitors.iter().collect();
            assert_eq!(keys_seen.len(), KINDS, "two kinds share a visitor");
            let iters: std::collections::HashSet<_> = keys().slice_iters.iter().flatten().collect();
            assert_eq!(iters.len(), KINDS, "two kinds share a slice iterator key");
        }
    }
}
