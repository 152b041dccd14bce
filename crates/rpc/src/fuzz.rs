//! The body of weft's fuzz target (`fuzz/fuzz_targets/archive_decode.rs`, run with
//! `cargo +nightly fuzz run archive_decode`) and of its corpus replay in the test suite: bytes
//! from anywhere go through every decoder the RPC layer exposes to the network.

use crate::archive::{decode, ChunkSource, NoChunks};
use crate::buffer::Received;
use crate::proto::parse_desc;
use crate::SerializeBuffer;
use serde::Deserialize;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use weft_fabric::pod::AlignedBuf;

/// An enum of every variant kind (also the archive's unit tests' sample).
#[derive(serde::Serialize, Deserialize, Debug, PartialEq)]
pub(crate) enum Shape {
    Dot,
    Circle(f64),
    Rect { w: u32, h: u32 },
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Record {
    id: u64,
    name: String,
    tags: Vec<Option<i16>>,
    shapes: Vec<Shape>,
    map: BTreeMap<String, (bool, char)>,
    data: SerializeBuffer<f64>,
    nested: Vec<Vec<Vec<u8>>>,
}

/// Chunks as a transport would deliver them: two small heap chunks.
struct TwoChunks(RefCell<Vec<Option<Received>>>);
impl ChunkSource for TwoChunks {
    fn take(&self, i: usize) -> Option<Received> {
        self.0.borrow_mut().get_mut(i)?.take()
    }
}

fn chunks() -> TwoChunks {
    TwoChunks(RefCell::new(vec![
        Some(Received::Heap(AlignedBuf::zeroed(64))),
        Some(Received::Heap(AlignedBuf::zeroed(24))),
    ]))
}

/// Decodes `data` as a rendezvous descriptor and as the archive of several argument types,
/// with and without chunks. Every outcome must be a value or an error: a panic, a hang or an
/// allocation beyond what `data` can justify is a bug.
pub fn decode_untrusted(data: &[u8]) {
    let words: Vec<u64> =
        data.chunks(8).map(|c| c.iter().rev().fold(0u64, |w, &b| w << 8 | b as u64)).collect();
    let _ = crate::proto::Header::decode(&words[..words.len().min(6)]);
    let _ = parse_desc(data);
    let _ = decode::<Record>(data, &NoChunks);
    let _ = decode::<Record>(data, &chunks());
    let _ = decode::<(u64, String, Vec<u8>)>(data, &NoChunks);
    let _ = decode::<(SerializeBuffer<u8>, SerializeBuffer<f64>)>(data, &chunks());
    let _ = decode::<Vec<Shape>>(data, &NoChunks);
    let _ = decode::<Option<(f64, bool, char)>>(data, &NoChunks);
    let _ = decode::<BTreeMap<String, Vec<i16>>>(data, &NoChunks);
    let _ = decode::<Vec<()>>(data, &NoChunks);
    let _ = decode::<(Vec<f64>, VecDeque<u32>, Vec<u8>)>(data, &chunks());
    let _ = decode::<String>(data, &NoChunks);
}
