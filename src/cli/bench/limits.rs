//! The machine's limits, measured in the same run as weft: the round trip of one cache line
//! between two processes (pinned to nothing; on 2 cores they get one each) and memcpy by size.

use super::report::{median, size_name, Row};
use super::Ctx;
use std::sync::atomic::Ordering;
use weft::fabric::os;

pub struct Limits {
    /// Cache-line round trip between two processes, ns (None with one rank).
    pub line_rt_ns: Option<f64>,
    /// memcpy time by size, ns.
    memcpy_ns: Vec<(u64, f64)>,
}

impl Limits {
    pub fn memcpy_ns(&self, bytes: u64) -> f64 {
        self.memcpy_ns
            .iter()
            .find(|(b, _)| *b == bytes)
            .map(|(_, t)| *t)
            .unwrap_or(f64::NAN)
    }
    pub fn memcpy_gbs(&self, bytes: u64) -> f64 {
        bytes as f64 / self.memcpy_ns(bytes)
    }
    pub fn rows(&self) -> Vec<Row> {
        let mut rows = vec![];
        if let Some(rt) = self.line_rt_ns {
            rows.push(Row::new(
                "limits",
                "cache-line round trip (2 procs)",
                64,
                rt,
                "ns",
            ));
        }
        for &(b, t) in &self.memcpy_ns {
            rows.push(Row::new(
                "limits",
                format!("memcpy time {}", size_name(b)),
                b,
                t,
                "ns",
            ));
            rows.push(Row::new(
                "limits",
                "memcpy bandwidth",
                b,
                b as f64 / t,
                "GB/s",
            ));
        }
        rows
    }
}

/// Sizes every size-swept benchmark uses.
pub const SIZES: &[u64] = &[
    8,
    64,
    512,
    4 << 10,
    32 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
];

/// Repetitions of a copy of `bytes` that take a few milliseconds.
pub fn reps_for(bytes: u64) -> u64 {
    ((64u64 << 20) / bytes.max(64)).clamp(16, 200_000)
}

fn cache_line_rt(ctx: &Ctx) -> Result<Option<f64>, weft::Error> {
    let w = &ctx.world;
    if w.size() < 2 {
        return Ok(None);
    }
    let name = format!("weft-{}-bench-line", w.config().job);
    let shared = |e: weft::fabric::FabricError| weft::Error::Fabric(e);
    let map = if w.rank() == 0 {
        Some(os::create_shared(&name, 4096, |_| {}).map_err(shared)?)
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
    let mut result = None;
    if let Some(map) = &map {
        let (ping, pong) = (
            map.atomic_u64(0).expect("in map"),
            map.atomic_u64(16).expect("in map"),
        );
        let iters = 100_000u64;
        let mut samples = vec![];
        for rep in 0..5u64 {
            let base = rep * iters;
            let t = os::now_ns();
            for i in base + 1..=base + iters {
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
            samples.push((os::now_ns() - t) as f64 / iters as f64);
        }
        result = Some(median(samples));
    }
    w.barrier()?;
    Ok(result)
}

fn memcpy_ns(bytes: u64) -> f64 {
    let src = vec![1u8; bytes as usize];
    let mut dst = vec![0u8; bytes as usize];
    let reps = reps_for(bytes);
    let mut samples = vec![];
    for _ in 0..5 {
        let t = os::now_ns();
        for _ in 0..reps {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        samples.push((os::now_ns() - t) as f64 / reps as f64);
    }
    median(samples)
}

pub fn measure(ctx: &Ctx) -> Result<Limits, weft::Error> {
    ctx.progress.note("cache-line round trip");
    let line_rt_ns = cache_line_rt(ctx)?;
    ctx.progress.note("memcpy");
    let memcpy = if ctx.world.rank() == 0 {
        SIZES.iter().map(|&b| (b, memcpy_ns(b))).collect()
    } else {
        vec![]
    };
    ctx.world.barrier()?;
    Ok(Limits {
        line_rt_ns,
        memcpy_ns: memcpy,
    })
}
