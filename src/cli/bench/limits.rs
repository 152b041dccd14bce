//! The machine's limits, measured in the same run as weft: the round trip of one cache line
//! between two processes (pinned to nothing; on 2 cores they get one each) and memcpy by size.

use super::report::{median, ns_per_op, size_name, Row};
use super::Ctx;
use std::sync::atomic::Ordering;
use weft::fabric::os;

pub struct Limits {
    /// The shared line, for latency benchmarks that interleave the limit with their own runs.
    pub line: SharedLine,
    /// Cache-line round trip between two processes, ns (None with one rank).
    pub line_rt_ns: Option<f64>,
    /// memcpy time by size, ns.
    memcpy_ns: Vec<(u64, f64)>,
    /// 256 KiB copied with 4K aliasing: (weft's copy, glibc's memcpy), ns.
    aliased: Option<(f64, f64)>,
}

impl Limits {
    /// memcpy time for `bytes`: from the limits run, or measured now for a size it skipped.
    pub fn memcpy_ns(&self, bytes: u64) -> f64 {
        self.memcpy_ns.iter().find(|(b, _)| *b == bytes).map(|(_, t)| *t).unwrap_or_else(|| memcpy_ns(bytes))
    }
    pub fn memcpy_gbs(&self, bytes: u64) -> f64 {
        bytes as f64 / self.memcpy_ns(bytes)
    }
    /// Collective: `reps` repetitions of a latency benchmark `run` (which returns its sample on
    /// the rank that measures), each preceded by a cache-line round trip so that weft and the
    /// limit see the same machine conditions. Returns the medians.
    pub fn interleaved(
        &self,
        ctx: &Ctx,
        reps: usize,
        mut run: impl FnMut() -> Result<Option<f64>, weft::Error>,
    ) -> Result<Interleaved, weft::Error> {
        let (mut samples, mut line, mut fresh) = (vec![], vec![], vec![]);
        for _ in 0..reps {
            line.extend(self.line.round_trip(ctx, 20_000, Lines::Same)?);
            fresh.extend(self.line.round_trip(ctx, 20_000, Lines::Fresh)?);
            samples.extend(run()?);
            ctx.world.barrier()?;
        }
        let med = |v: Vec<f64>| (!v.is_empty()).then(|| median(v));
        Ok(Interleaved { weft: med(samples), line_rt: med(line), fresh_line_rt: med(fresh) })
    }

    pub fn rows(&self) -> Vec<Row> {
        let mut rows = vec![];
        if let Some(rt) = self.line_rt_ns {
            rows.push(Row::new("limits", "cache-line round trip (2 procs)", 64, rt, "ns"));
        }
        for &(b, t) in &self.memcpy_ns {
            rows.push(Row::new("limits", format!("memcpy time {}", size_name(b)), b, t, "ns"));
            rows.push(Row::new("limits", "memcpy bandwidth", b, b as f64 / t, "GB/s"));
        }
        if let Some((weft, glibc)) = self.aliased {
            let metric = "weft copy, dst 16 B after src mod 4 KiB";
            rows.push(
                Row::new("limits", metric, 256 << 10, weft, "ns").vs("glibc memcpy, same offsets", glibc),
            );
        }
        rows
    }
}

/// Medians of a latency benchmark and of the limits measured between its repetitions.
pub struct Interleaved {
    /// weft's figure (on the measuring rank).
    pub weft: Option<f64>,
    /// Round trip of the same two cache lines (ping line, pong line).
    pub line_rt: Option<f64>,
    /// Round trip where each ping and pong uses a fresh line of a 64 KiB array, as messages in a
    /// ring do: the hardware floor of any ring-based message passing.
    pub fresh_line_rt: Option<f64>,
}

/// Which lines a [`SharedLine::round_trip`] bounces.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    /// The same ping line and pong line every time.
    Same,
    /// The next line of a ring of [`FRESH_LINES`] each time, for ping and for pong.
    Fresh,
}

/// Lines in each direction of the [`Lines::Fresh`] pattern (64 KiB, like a small AM ring).
const FRESH_LINES: usize = 1024;

/// Sizes every size-swept benchmark uses.
pub const SIZES: &[u64] = &[8, 64, 512, 4 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];

/// Repetitions of a copy of `bytes` that take a few milliseconds.
pub fn reps_for(bytes: u64) -> u64 {
    ((64u64 << 20) / bytes.max(64)).clamp(16, 200_000)
}

/// Cache lines shared by ranks 0 and 1, outside weft, to measure the hardware alone.
pub struct SharedLine {
    map: Option<os::Mapping>,
    next: std::cell::Cell<u64>,
}

impl SharedLine {
    /// Collective: rank 0 creates the line, rank 1 maps it, then the name is removed.
    pub fn new(ctx: &Ctx) -> Result<SharedLine, weft::Error> {
        let w = &ctx.world;
        let name = format!("{}bench-line", weft_fabric::shm::file_prefix(&w.config().job));
        let shared = weft::Error::Fabric;
        let map = if w.rank() == 0 && w.size() > 1 {
            // The job's directory is made here over libfabric alone (`weft run` removes it).
            let job = &w.config().job;
            Some(
                weft_fabric::shm::create_in_job(
                    job,
                    &name,
                    4096 + 2 * 64 * FRESH_LINES,
                    os::Fill::Reserved,
                    |_| {},
                )
                .map_err(shared)?,
            )
        } else {
            None
        };
        w.barrier()?;
        let map = match (w.rank(), map) {
            (0, m) => m,
            (1, _) => os::open_shared(&name).map_err(shared)?,
            _ => None,
        };
        w.barrier()?;
        if w.rank() == 0 {
            os::unlink(&name);
        }
        Ok(SharedLine { map, next: std::cell::Cell::new(0) })
    }

    /// Collective: ranks 0 and 1 bounce a line `iters` times; rank 0 gets the round trip in
    /// ns, everyone else `None`.
    pub fn round_trip(&self, ctx: &Ctx, iters: u64, lines: Lines) -> Result<Option<f64>, weft::Error> {
        let w = &ctx.world;
        w.barrier()?;
        let mut result = None;
        if let Some(map) = &self.map {
            // Ping at byte 0, pong at byte 128 (two lines); the fresh lines follow the first
            // page, pings then pongs. All looked up before the clock starts.
            let at = |byte: usize| map.atomic_u64(byte / 8).expect("in map");
            let (pings, pongs): (Vec<_>, Vec<_>) = match lines {
                Lines::Same => (vec![at(0)], vec![at(128)]),
                Lines::Fresh => {
                    (0..FRESH_LINES).map(|k| (at(4096 + k * 64), at(4096 + (FRESH_LINES + k) * 64))).unzip()
                }
            };
            let base = self.next.get();
            self.next.set(base + iters);
            let t = os::now_ns();
            for i in base + 1..=base + iters {
                let k = i as usize % pings.len();
                let (ping, pong) = (pings[k], pongs[k]);
                if w.rank() == 0 {
                    ping.store(i, Ordering::Release);
                    while pong.load(Ordering::Acquire) != i {
                        std::hint::spin_loop();
                    }
                } else {
                    while ping.load(Ordering::Acquire) != i {
                        std::hint::spin_loop();
                    }
                    pong.store(i, Ordering::Release);
                }
            }
            result = (w.rank() == 0).then(|| (os::now_ns() - t) as f64 / iters as f64);
        }
        w.barrier()?;
        Ok(result)
    }
}

fn cache_line_rt(ctx: &Ctx, line: &SharedLine) -> Result<Option<f64>, weft::Error> {
    let mut samples = vec![];
    for _ in 0..5 {
        samples.extend(line.round_trip(ctx, 100_000, Lines::Same)?);
    }
    Ok((!samples.is_empty()).then(|| median(samples)))
}

/// memcpy time for `bytes`, ns (median of five runs), source and destination at the same
/// offset in their pages: the machine's best case.
pub fn memcpy_ns(bytes: u64) -> f64 {
    copy_ns(bytes as usize, 0, |d, s| d.copy_from_slice(s))
}

/// Time of `copy(dst, src)` for `bytes` with `dst` placed `skew` bytes after `src` modulo
/// 4 KiB, ns (median of five runs).
fn copy_ns(bytes: usize, skew: usize, copy: impl Fn(&mut [u8], &[u8])) -> f64 {
    let mut bufs = CopyBufs::new(bytes, skew);
    let Ok(ns) = ns_per_op::<std::convert::Infallible>(5, reps_for(bytes as u64), || {
        bufs.copy_with(&copy);
        Ok(())
    });
    ns
}

/// `len` bytes of `buf` from its first page boundary on.
pub fn page_aligned(buf: &mut [u8], len: usize) -> &mut [u8] {
    let at = buf.as_ptr().align_offset(4096);
    &mut buf[at..at + len]
}

/// ns per copy of `src` into the `src.len()`-byte buffers of `dsts` in turn, over `reps`
/// copies.
pub fn memcpy_into_ns(src: &[u8], dsts: &mut [u8], reps: u64) -> f64 {
    let n = src.len();
    let k = (dsts.len() / n.max(1)).max(1);
    let t = os::now_ns();
    for i in 0..reps as usize {
        let at = (i % k) * n;
        let d = &mut dsts[at..at + n];
        d.copy_from_slice(std::hint::black_box(src));
        std::hint::black_box(d);
    }
    (os::now_ns() - t) as f64 / reps as f64
}

/// A page-aligned source and a destination `skew` bytes past a page boundary, for timing
/// copies.
pub struct CopyBufs {
    src: Vec<u8>,
    dst: Vec<u8>,
    skew: usize,
    bytes: usize,
}

impl CopyBufs {
    pub fn new(bytes: usize, skew: usize) -> Self {
        CopyBufs { src: vec![1u8; bytes + 4096], dst: vec![0u8; bytes + 8192], skew, bytes }
    }

    /// The source (page-aligned) and the destination (`skew` bytes past a page boundary).
    fn aligned(&mut self) -> (&[u8], &mut [u8]) {
        let (n, skew) = (self.bytes, self.skew);
        (page_aligned(&mut self.src, n), &mut page_aligned(&mut self.dst, n + skew)[skew..])
    }

    /// The source, page-aligned.
    pub fn src(&mut self) -> &[u8] {
        self.aligned().0
    }

    fn copy_with(&mut self, copy: impl Fn(&mut [u8], &[u8])) {
        let (src, dst) = self.aligned();
        copy(dst, std::hint::black_box(src));
        std::hint::black_box(dst);
    }

    /// ns per memcpy, over one run of `reps` copies.
    pub fn memcpy_ns(&mut self, reps: u64) -> f64 {
        let (src, dst) = self.aligned();
        memcpy_into_ns(src, dst, reps)
    }
}

/// The 4K-aliasing case (see `weft_fabric::copy`): 256 KiB with the destination 16 bytes
/// after the source modulo 4 KiB, as two heap blocks of one size lie. Returns (weft's copy,
/// glibc's memcpy), ns.
fn aliased_copy_ns() -> (f64, f64) {
    const BYTES: usize = 256 << 10;
    (copy_ns(BYTES, 16, weft::fabric::copy::copy_slice), copy_ns(BYTES, 16, |d, s| d.copy_from_slice(s)))
}

pub fn measure(ctx: &Ctx) -> Result<Limits, weft::Error> {
    ctx.progress.note("cache-line round trip");
    let line = SharedLine::new(ctx)?;
    let line_rt_ns = cache_line_rt(ctx, &line)?;
    ctx.progress.note("memcpy");
    let rank0 = ctx.world.rank() == 0;
    let memcpy = if rank0 { SIZES.iter().map(|&b| (b, memcpy_ns(b))).collect() } else { vec![] };
    let aliased = rank0.then(aliased_copy_ns);
    ctx.world.barrier()?;
    Ok(Limits { line, line_rt_ns, memcpy_ns: memcpy, aliased })
}
