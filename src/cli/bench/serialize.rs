//! `serialize` suite: an HPX-style record (scalars, a string, a vector of 1 KiB … 16 MiB)
//! through weft's archive (zero-copy chunks on and off) and through bincode 2, postcard, bitcode
//! and rkyv, in one process: time of serialize + deserialize and bytes of the archive.
//!
//! weft's zero-copy archive leaves the vector where it is (a chunk); the transport then moves it
//! once (the target's pull). "archive only" is the cost above that transport copy — the figure
//! comparable with the other formats, which add their own copies on top of the transport; "with
//! pull" adds one copy into a fresh buffer, as the target's pull does.

use super::report::{median, ns_per_op, size_name, Row};
use super::Ctx;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::convert::Infallible;
use std::hint::black_box;
use weft::fabric::os;
use weft::fabric::pod::{bytes_of, AlignedBuf};
use weft::rpc::archive::{self, ChunkSource, NoChunks, NoPool};
use weft::rpc::{proto, Received};
use weft::SerializeBuffer;

/// The record, for the serde formats (the vector is a `SerializeBuffer`, which every serde
/// format writes as one byte string).
#[derive(Serialize, Deserialize)]
struct Record {
    id: u64,
    step: u32,
    time: f64,
    converged: bool,
    name: String,
    data: SerializeBuffer<f64>,
}

/// The same record for rkyv and bitcode, with their own derives (bitcode's serde path writes
/// byte strings element by element: 40 ms for 16 MiB here, so it gets its native one).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, bitcode::Encode, bitcode::Decode)]
struct NativeRecord {
    id: u64,
    step: u32,
    time: f64,
    converged: bool,
    name: String,
    data: Vec<f64>,
}

const SIZES: &[u64] = &[1 << 10, 16 << 10, 256 << 10, 1 << 20, 16 << 20];

fn record(bytes: u64) -> Record {
    let data: Vec<f64> = (0..bytes / 8).map(|i| i as f64 * 0.5).collect();
    Record { id: 42, step: 7, time: 1.25, converged: true, name: "pressure field".into(), data: data.into() }
}

/// Operations per timed batch: a few tens of milliseconds of the slowest format.
fn ops_for(bytes: u64) -> usize {
    ((256u64 << 20) / bytes).clamp(8, 2000) as usize
}

/// ns per call of `f`: one warm-up call, then the median of 5 batches of `n`.
fn per_op(n: u64, mut f: impl FnMut()) -> f64 {
    f();
    let Ok(ns) = ns_per_op::<Infallible>(5, n, || {
        f();
        Ok(())
    });
    ns
}

/// Checks what came back (so no format is timed doing less than the others).
fn check(r: &Record, want: &Record) {
    assert!(
        r.id == want.id && r.name == want.name && r.data.len() == want.data.len(),
        "round trip changed the record"
    );
    assert!(r.data.last() == want.data.last(), "round trip changed the data");
}

/// Chunks as the transport delivered them.
struct Delivered(RefCell<Vec<Option<Received>>>);
impl ChunkSource for Delivered {
    fn take(&self, i: usize) -> Option<Received> {
        self.0.borrow_mut().get_mut(i)?.take()
    }
}

/// The target's pull of a chunk: one copy into a fresh 64-byte-aligned buffer.
fn pull(bytes: &[u8]) -> Received {
    let mut b = AlignedBuf::zeroed(bytes.len());
    b.as_bytes_mut().copy_from_slice(bytes);
    Received::Heap(b)
}

fn weft_zero_copy(rec: &Record) -> Record {
    let a = archive::encode(rec, proto::DEFAULT_THRESHOLD, &NoPool).expect("encode");
    let delivered = Delivered(RefCell::new(vec![Some(pull(bytes_of(&rec.data)))]));
    archive::decode(&a.index, &delivered).expect("decode")
}

/// A format under test: its name and a round trip giving (archive bytes, value back).
type Format<R> = (&'static str, fn(&R) -> (usize, R));

fn serde_formats() -> Vec<Format<Record>> {
    vec![
        ("weft archive, copying", |r| {
            let a = archive::encode(r, usize::MAX, &NoPool).expect("encode");
            (a.index.len(), archive::decode(&a.index, &NoChunks).expect("decode"))
        }),
        ("bincode 2", |r| {
            let cfg = bincode::config::standard();
            let v = bincode::serde::encode_to_vec(r, cfg).expect("bincode");
            (v.len(), bincode::serde::decode_from_slice(&v, cfg).expect("bincode").0)
        }),
        ("postcard", |r| {
            let v = postcard::to_allocvec(r).expect("postcard");
            (v.len(), postcard::from_bytes(&v).expect("postcard"))
        }),
    ]
}

fn native_formats() -> Vec<Format<NativeRecord>> {
    vec![
        ("rkyv", |r| {
            let v = rkyv::to_bytes::<rkyv::rancor::Error>(r).expect("rkyv");
            (v.len(), rkyv::from_bytes::<NativeRecord, rkyv::rancor::Error>(&v).expect("rkyv"))
        }),
        ("bitcode", |r| {
            let v = bitcode::encode(r);
            (v.len(), bitcode::decode(&v).expect("bitcode"))
        }),
    ]
}

/// weft's zero-copy archive, serialize + deserialize, with the chunk already delivered (the
/// pulls are made before the clock starts): ns per record.
fn zero_copy_archive_only(rec: &Record, n: usize) -> f64 {
    let bytes = bytes_of(&rec.data);
    median(
        (0..5)
            .map(|_| {
                let mut ready: Vec<Received> = (0..n).map(|_| pull(bytes)).collect();
                let t = os::now_ns();
                for _ in 0..n {
                    let a = archive::encode(rec, proto::DEFAULT_THRESHOLD, &NoPool).expect("encode");
                    let delivered = Delivered(RefCell::new(vec![ready.pop()]));
                    let r: Record = archive::decode(&a.index, &delivered).expect("decode");
                    black_box(r);
                }
                (os::now_ns() - t) as f64 / n as f64
            })
            .collect(),
    )
}

pub fn run(ctx: &Ctx) -> Result<Vec<Row>, weft::Error> {
    let mut rows = vec![];
    if ctx.world.rank() == 0 {
        ctx.progress.note("serialize");
        for &b in SIZES {
            rows.extend(one_size(b));
        }
        rows.extend(plain_vec());
    }
    ctx.world.barrier()?;
    Ok(rows)
}

fn one_size(b: u64) -> Vec<Row> {
    let rec = record(b);
    let n = ops_for(b);
    let size = size_name(b);
    let row = |what: &str, ns: f64| Row::new("serialize", format!("{what} {size}"), b, ns, "ns");
    let len_row =
        |what: &str, len: usize| Row::new("serialize", format!("bytes: {what} {size}"), b, len as f64, "B");

    // The peers and weft's copying archive.
    let mut results = vec![];
    for (name, f) in serde_formats() {
        let (len, back) = f(&rec);
        check(&back, &rec);
        let ns = per_op(n as u64, || {
            black_box(f(black_box(&rec)));
        });
        results.push((name, ns, len));
    }
    let rk = NativeRecord {
        id: rec.id,
        step: rec.step,
        time: rec.time,
        converged: rec.converged,
        name: rec.name.clone(),
        data: rec.data.to_vec(),
    };
    for (name, f) in native_formats() {
        let (len, back) = f(&rk);
        assert!(back.data == rk.data && back.name == rk.name, "{name} round trip changed the record");
        results.push((name, per_op(n as u64, || drop(black_box(f(black_box(&rk))))), len));
    }

    // weft zero-copy.
    check(&weft_zero_copy(&rec), &rec);
    let a = archive::encode(&rec, proto::DEFAULT_THRESHOLD, &NoPool).expect("encode");
    let zc_len = proto::rendezvous_message(&a, 64 << 10).len();
    let zc_only = zero_copy_archive_only(&rec, n.min(((512u64 << 20) / b) as usize).max(4));
    let zc_pull = per_op(n as u64, || drop(black_box(weft_zero_copy(black_box(&rec)))));

    let bincode = results.iter().find(|r| r.0 == "bincode 2").map(|r| (r.1, r.2)).unwrap_or((0.0, 0));
    let mut rows = vec![
        row("weft zero-copy, archive only", zc_only).vs("bincode 2", bincode.0),
        row("weft zero-copy, with pull", zc_pull).vs("bincode 2", bincode.0),
    ];
    for &(name, ns, _) in &results {
        rows.push(row(name, ns).vs("bincode 2", bincode.0));
    }
    rows.push(len_row("weft zero-copy (message)", zc_len).vs("bincode 2", bincode.1 as f64));
    for &(name, _, len) in &results {
        rows.push(len_row(name, len).vs("bincode 2", bincode.1 as f64));
    }
    rows
}

/// Plain `Vec<u8>` and `Vec<f64>` of 1 MiB, which serde hands every format element by element
/// (Lamellar spends 14 ms on the `Vec<u8>` here) and weft's archive recognises as one block:
/// encode + decode beside bincode 2 and beside two copies of the bytes (the floor: one into the
/// archive, one out of it).
fn plain_vec() -> Vec<Row> {
    fn one<T>(name: &str, v: Vec<T>) -> Vec<Row>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Clone + PartialEq,
    {
        let bytes = std::mem::size_of_val(v.as_slice()) as u64;
        let weft = per_op(16, || {
            let a = archive::encode(black_box(&v), usize::MAX, &NoPool).expect("encode");
            let back: Vec<T> = archive::decode(&a.index, &NoChunks).expect("decode");
            assert!(back.len() == v.len() && back.last() == v.last());
        });
        let cfg = bincode::config::standard().with_fixed_int_encoding();
        let bincode = per_op(16, || {
            let e = bincode::serde::encode_to_vec(black_box(&v), cfg).expect("bincode");
            let back: Vec<T> = bincode::serde::decode_from_slice(&e, cfg).expect("bincode").0;
            assert!(back.len() == v.len() && back.last() == v.last());
        });
        let copies = per_op(16, || {
            let a = black_box(&v).clone();
            drop(black_box(black_box(&a).clone()));
        });
        let label = format!("plain {name} 1 MiB, encode + decode");
        vec![
            Row::new("serialize", &label, bytes, weft, "ns").vs("bincode 2", bincode),
            Row::new("serialize", &label, bytes, weft, "ns").vs("two copies", copies),
        ]
    }
    let mut rows = one("Vec<u8>", (0..1u32 << 20).map(|i| i as u8).collect::<Vec<u8>>());
    rows.extend(one("Vec<f64>", (0..1u32 << 17).map(|i| i as f64 * 0.5).collect::<Vec<f64>>()));
    rows
}
