//! `coll` suite: latency of barrier, broadcast, allreduce and alltoall by message size, for
//! weft's team collectives and — with the `mpi` feature — Open MPI's, timed by the same
//! driver in the same `weft bench` run.
//!
//! Method: for each collective and size, a few calls to warm up and estimate the time, then
//! the members agree on an iteration count (about 20 ms of work), then five timed runs; each
//! run's figure is the mean over members of their time per call, and the row is the fastest
//! run (on this shared machine noise only ever adds time, and both libraries are timed alike).
//! Two figures per case:
//! - *latency*, as OSU's collective benchmarks take it: each call timed on its own, with a
//!   barrier (not timed) between calls, so that no call starts before the last one ended
//!   everywhere;
//! - *back-to-back*: the calls one after the other with nothing between, where a root that
//!   may run ahead of its receivers (a broadcast's) is paced by how much its library buffers.
//!
//! The barrier itself is timed back-to-back only. Broadcast and alltoall from 256 KiB up are
//! also timed with weft's buffers in registered memory (`RmaVec`, rows "(weft: RmaVec)"),
//! where receivers read the sender's data in place; Open MPI runs its usual collective there.
//!
//! With Open MPI, both libraries run in the same processes under `mpirun` (weft starts through
//! PMIx) and their timed runs alternate, one of Open MPI's then one of weft's, collective by
//! collective: this machine's speed drifts by several times within minutes (the cache-line
//! round trip between its two cores moves between ~120 and ~430 ns), so figures taken one
//! library after the other compare two different machines. Where weft cannot start under
//! `mpirun`, Open MPI is measured alone first and weft after it in its own ranks.

use super::limits::Limits;
use super::report::Row;
use super::Ctx;
use serde::{Deserialize, Serialize};
use weft::fabric::os;
use weft::{ReduceOp, Team};

/// Message sizes: bytes per member (broadcast, allreduce) or per pair (alltoall).
pub const SIZES: &[u64] = &[8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20];

/// Environment variable through which the launcher hands the ranks Open MPI's figures.
pub const PEER_FILE_VAR: &str = "WEFT_BENCH_MPI_COLL";

/// Timed runs per collective and size.
const RUNS: usize = 5;

/// Time the timed part of one run aims at.
const RUN_NS: f64 = 20e6;

/// What the driver needs from a collectives library.
pub trait CollBackend {
    type Error: std::fmt::Display;
    fn size(&self) -> usize;
    fn barrier(&mut self) -> Result<(), Self::Error>;
    /// From member 0.
    fn broadcast(&mut self, buf: &mut [u8]) -> Result<(), Self::Error>;
    /// Sum; the backend keeps the result.
    fn allreduce(&mut self, data: &[f64]) -> Result<(), Self::Error>;
    /// `data` holds one block per member; the backend keeps the result.
    fn alltoall(&mut self, data: &[u8]) -> Result<(), Self::Error>;
    /// As `broadcast`, on a buffer of the same length in the library's registered memory
    /// where it has such a thing for user data (weft: an `RmaVec`); else `broadcast`.
    fn broadcast_registered(&mut self, buf: &mut [u8]) -> Result<(), Self::Error> {
        self.broadcast(buf)
    }
    /// As `alltoall`, from a copy of `data` in the library's registered memory (see
    /// `broadcast_registered`); else `alltoall`.
    fn alltoall_registered(&mut self, data: &[u8]) -> Result<(), Self::Error> {
        self.alltoall(data)
    }
    /// Maximum and sum of one value over the members.
    fn max(&mut self, v: f64) -> Result<f64, Self::Error>;
    fn sum(&mut self, v: f64) -> Result<f64, Self::Error>;
}

/// One measured latency.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Sample {
    pub coll: String,
    pub bytes: u64,
    /// Timed back-to-back (else as a latency, see the module documentation).
    #[serde(default)]
    pub back_to_back: bool,
    pub ns: f64,
}

/// Open MPI's figures as the launcher passes them to the ranks.
#[derive(Serialize, Deserialize, Debug)]
pub struct PeerResults {
    pub library: String,
    pub samples: Vec<Sample>,
    /// weft's figures, measured in the same processes as `samples` with the timed runs
    /// alternating; empty where weft could not start under `mpirun`.
    #[serde(default)]
    pub weft: Vec<Sample>,
}

/// Iterations of `op` that take about [`RUN_NS`] (the members agree), after a warm-up.
fn iterations<B: CollBackend>(
    b: &mut B,
    op: &mut impl FnMut(&mut B) -> Result<(), B::Error>,
) -> Result<u64, B::Error> {
    b.barrier()?;
    let t = os::now_ns();
    for _ in 0..5 {
        op(b)?;
    }
    let est = b.max((os::now_ns() - t) as f64 / 5.0)?;
    Ok((RUN_NS / est.max(1.0)).clamp(5.0, 20_000.0) as u64)
}

/// One timed run of `iters` calls: the mean over the members of their time per call. For a
/// latency, each call is timed on its own and followed by an untimed barrier.
fn timed_run<B: CollBackend>(
    b: &mut B,
    op: &mut impl FnMut(&mut B) -> Result<(), B::Error>,
    iters: u64,
    back_to_back: bool,
) -> Result<f64, B::Error> {
    b.barrier()?;
    let mut mine = 0;
    if back_to_back {
        let t = os::now_ns();
        for _ in 0..iters {
            op(b)?;
        }
        mine = os::now_ns() - t;
    } else {
        for _ in 0..iters {
            let t = os::now_ns();
            op(b)?;
            mine += os::now_ns() - t;
            b.barrier()?;
        }
    }
    Ok(b.sum(mine as f64 / iters as f64)? / b.size() as f64)
}

/// Sizes of the cases on registered memory (where a weft receiver reads the sender's
/// data through its own mapping).
const REGISTERED_SIZES: &[u64] = &[256 << 10, 1 << 20, 4 << 20];

/// The cases measured, in order: (collective, bytes, back-to-back).
fn cases() -> Vec<(&'static str, u64, bool)> {
    let mut c = vec![("barrier", 0, true)];
    for back_to_back in [false, true] {
        for &bytes in SIZES {
            c.extend(["broadcast", "allreduce", "alltoall"].map(|coll| (coll, bytes, back_to_back)));
        }
    }
    for back_to_back in [false, true] {
        for &bytes in REGISTERED_SIZES {
            c.extend([REG_BROADCAST, REG_ALLTOALL].map(|coll| (coll, bytes, back_to_back)));
        }
    }
    c
}

/// A broadcast whose buffers are registered memory on weft's side.
const REG_BROADCAST: &str = "broadcast (weft: RmaVec)";
/// An alltoall whose data is registered memory on weft's side.
const REG_ALLTOALL: &str = "alltoall (weft: RmaVec)";

/// Buffers of one case, kept across its calls (as a program keeps them).
struct Buffers {
    buf: Vec<u8>,
    f: Vec<f64>,
    blocks: Vec<u8>,
}

impl Buffers {
    fn new(bytes: u64, n: usize) -> Buffers {
        Buffers {
            buf: vec![1u8; bytes as usize],
            f: vec![1.0f64; (bytes as usize / 8).max(1)],
            blocks: vec![2u8; bytes as usize * n],
        }
    }
    /// One call of collective `coll` on `b`.
    fn call<B: CollBackend>(&mut self, b: &mut B, coll: &str) -> Result<(), B::Error> {
        match coll {
            "barrier" => b.barrier(),
            "broadcast" => b.broadcast(&mut self.buf),
            "allreduce" => b.allreduce(&self.f),
            REG_BROADCAST => b.broadcast_registered(&mut self.buf),
            REG_ALLTOALL => b.alltoall_registered(&self.blocks),
            _ => b.alltoall(&self.blocks),
        }
    }
}

/// One library's timing of one case: its buffers, its iteration count and its fastest run.
struct Timing {
    coll: &'static str,
    back_to_back: bool,
    bufs: Buffers,
    iters: u64,
    best: f64,
}

impl Timing {
    /// Warms up and agrees on the iteration count.
    fn start<B: CollBackend>(
        b: &mut B,
        (coll, bytes, back_to_back): (&'static str, u64, bool),
    ) -> Result<Timing, B::Error> {
        let mut bufs = Buffers::new(bytes, b.size());
        let iters = iterations(b, &mut |x: &mut B| {
            bufs.call(x, coll)?;
            if back_to_back {
                Ok(())
            } else {
                x.barrier()
            }
        })?;
        Ok(Timing { coll, back_to_back, bufs, iters, best: f64::INFINITY })
    }
    /// One timed run.
    fn run<B: CollBackend>(&mut self, b: &mut B) -> Result<(), B::Error> {
        let (bufs, coll) = (&mut self.bufs, self.coll);
        let ns = timed_run(b, &mut |x: &mut B| bufs.call(x, coll), self.iters, self.back_to_back)?;
        self.best = self.best.min(ns);
        Ok(())
    }
    fn sample(&self, bytes: u64) -> Sample {
        Sample { coll: self.coll.into(), bytes, back_to_back: self.back_to_back, ns: self.best }
    }
}

/// Every collective at every size, on one library.
pub fn measure<B: CollBackend>(b: &mut B, mut note: impl FnMut(&str)) -> Result<Vec<Sample>, B::Error> {
    let mut out = vec![];
    for case in cases() {
        note(&format!("{} of {} B", case.0, case.1));
        let mut t = Timing::start(b, case)?;
        for _ in 0..RUNS {
            t.run(b)?;
        }
        out.push(t.sample(case.1));
    }
    Ok(out)
}

/// Every collective at every size on two libraries in the same processes, their timed runs
/// alternating (one of `a`'s, then one of `b`'s): `(a's samples, b's samples)`.
#[cfg(feature = "mpi")]
pub fn measure_interleaved<A: CollBackend, B: CollBackend>(
    a: &mut A,
    b: &mut B,
) -> Result<(Vec<Sample>, Vec<Sample>), String> {
    let (mut out_a, mut out_b) = (vec![], vec![]);
    for case in cases() {
        let mut ta = Timing::start(a, case).map_err(|e| e.to_string())?;
        let mut tb = Timing::start(b, case).map_err(|e| e.to_string())?;
        for _ in 0..RUNS {
            ta.run(a).map_err(|e| e.to_string())?;
            tb.run(b).map_err(|e| e.to_string())?;
        }
        out_a.push(ta.sample(case.1));
        out_b.push(tb.sample(case.1));
    }
    Ok((out_a, out_b))
}

/// weft's team collectives over the world team, into buffers kept across calls (as the
/// Open MPI side does).
pub struct WeftColl<'a> {
    world: &'a weft::World,
    team: Team,
    out_f: Vec<f64>,
    out_b: Vec<u8>,
    /// Registered copies for the RmaVec cases (remade when the length changes).
    reg_buf: Option<weft::RmaVec<u8>>,
    reg_data: Option<weft::RmaVec<u8>>,
}

impl<'a> WeftColl<'a> {
    pub fn new(world: &'a weft::World) -> weft::Result<WeftColl<'a>> {
        Ok(WeftColl {
            world,
            team: world.world_team()?,
            out_f: vec![],
            out_b: vec![],
            reg_buf: None,
            reg_data: None,
        })
    }
}

/// `slot`'s registered copy of `data`, made (from the world's pool) where it is missing or
/// of another length.
fn registered<'v>(
    world: &weft::World,
    slot: &'v mut Option<weft::RmaVec<u8>>,
    data: &[u8],
) -> weft::Result<&'v mut weft::RmaVec<u8>> {
    let v = match slot.take() {
        Some(v) if v.len() == data.len() => v,
        stale => {
            drop(stale); // back to the pool first
            weft::RmaVec::from_slice(world, data)?
        }
    };
    Ok(slot.insert(v))
}

impl CollBackend for WeftColl<'_> {
    type Error = weft::Error;
    fn size(&self) -> usize {
        self.team.size() as usize
    }
    fn barrier(&mut self) -> weft::Result<()> {
        self.team.barrier()
    }
    fn broadcast(&mut self, buf: &mut [u8]) -> weft::Result<()> {
        self.team.broadcast(0, buf)
    }
    fn allreduce(&mut self, data: &[f64]) -> weft::Result<()> {
        self.out_f.resize(data.len(), 0.0);
        self.team.allreduce_into(data, &mut self.out_f, ReduceOp::Sum)
    }
    fn alltoall(&mut self, data: &[u8]) -> weft::Result<()> {
        self.out_b.resize(data.len(), 0);
        self.team.alltoall_into(data, &mut self.out_b)
    }
    fn broadcast_registered(&mut self, buf: &mut [u8]) -> weft::Result<()> {
        let reg = registered(self.world, &mut self.reg_buf, buf)?;
        self.team.broadcast(0, reg)
    }
    fn alltoall_registered(&mut self, data: &[u8]) -> weft::Result<()> {
        self.out_b.resize(data.len(), 0);
        let reg = registered(self.world, &mut self.reg_data, data)?;
        self.team.alltoall_into(reg, &mut self.out_b)
    }
    fn max(&mut self, v: f64) -> weft::Result<f64> {
        Ok(self.team.allreduce(&[v], ReduceOp::Max)?[0])
    }
    fn sum(&mut self, v: f64) -> weft::Result<f64> {
        Ok(self.team.allreduce(&[v], ReduceOp::Sum)?[0])
    }
}

/// The floor a collective of `bytes` cannot beat on this machine: one one-way cache-line
/// transfer per round (⌈log2 n⌉ rounds) plus copying the bytes each member receives.
fn floor_ns(lim: &Limits, coll: &str, bytes: u64, n: usize) -> Option<f64> {
    let rounds = n.next_power_of_two().trailing_zeros() as f64;
    let received = match coll {
        c if c.starts_with("alltoall") => bytes * (n as u64 - 1),
        "barrier" => 0,
        _ => bytes,
    };
    let copy = if received > 0 { lim.memcpy_ns(received) } else { 0.0 };
    Some(rounds * lim.line_rt_ns? / 2.0 + copy)
}

pub fn run(ctx: &Ctx, lim: &Limits) -> Result<Vec<Row>, weft::Error> {
    let w = &ctx.world;
    let mut peer: Option<PeerResults> = std::env::var(PEER_FILE_VAR)
        .ok()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| serde_json::from_str(&s).ok());
    // weft's figures from the interleaved run beside Open MPI's where there is one, else
    // measured here and now.
    let samples = match peer.as_mut().map(|p| std::mem::take(&mut p.weft)) {
        Some(interleaved) if !interleaved.is_empty() => {
            if w.rank() == 0 {
                eprintln!(
                    "weft bench coll: weft and Open MPI timed in the same processes, their runs alternating"
                );
            }
            interleaved
        }
        _ => {
            let mut b = WeftColl::new(w)?;
            measure(&mut b, |what| ctx.progress.note(&format!("coll: {what}")))?
        }
    };
    let n = w.size() as usize;
    let mut rows = vec![];
    for s in samples {
        let how = if s.back_to_back && s.coll != "barrier" { " back-to-back" } else { "" };
        let metric = format!("{}{how} ({n} ranks)", s.coll);
        let row = Row::new("coll", metric, s.bytes, s.ns / 1e3, "us");
        let theirs = peer.as_ref().and_then(|p| {
            p.samples
                .iter()
                .find(|m| m.coll == s.coll && m.bytes == s.bytes && m.back_to_back == s.back_to_back)
                .map(|m| (p, m.ns))
        });
        rows.push(match theirs {
            Some((p, ns)) => row.vs(leak(&p.library), ns / 1e3),
            None => match floor_ns(lim, &s.coll, s.bytes, n) {
                Some(f) => row.vs("floor: rounds x line + copy", f / 1e3),
                None => row,
            },
        });
    }
    Ok(rows)
}

/// A peer's name, as the `&'static str` rows carry (once per run).
fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}
