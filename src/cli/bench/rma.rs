//! `rma` suite: put/get latency, put+flag ping-pong, flood bandwidth (NB and NBI), 8 B NBI
//! put rate. Rank 0 drives, rank 1 is the target (it only makes progress, except in the
//! ping-pong).

use super::limits::{memcpy_into_ns, page_aligned, reps_for, CopyBufs, Limits, SIZES};
use super::report::{ns_per_op, size_name, Row};
use super::Ctx;
use std::sync::atomic::Ordering;
use weft::fabric::os;

/// Rounds of the flood benchmarks (each figure is the fastest round).
const FLOOD_ROUNDS: usize = 5;

/// Keeps in `best` the lesser of it and `f`'s time per operation, for `f` doing `ops` of them.
fn keep_fastest(
    best: &mut f64,
    ops: u64,
    f: impl FnOnce() -> Result<(), weft::Error>,
) -> Result<(), weft::Error> {
    let t = os::now_ns();
    f()?;
    *best = best.min((os::now_ns() - t) as f64 / ops as f64);
    Ok(())
}

/// ns per repetition of `f`, median of three runs of `reps`.
fn per_op(reps: u64, f: impl FnMut() -> Result<(), weft::Error>) -> Result<f64, weft::Error> {
    ns_per_op(3, reps, f)
}

pub fn run(ctx: &Ctx, lim: &Limits) -> Result<Vec<Row>, weft::Error> {
    let w = &ctx.world;
    let mut rows = vec![];
    if w.size() < 2 {
        return Ok(rows);
    }
    let max = *SIZES.last().unwrap_or(&8) as usize;
    let data = w.alloc_segment::<u8>(max)?;
    let flags = w.alloc_segment::<u64>(16)?;
    // Page-aligned, as the memcpy they are compared with: a source 16 bytes past a line
    // boundary (where the heap puts it) costs a copy 10-20% here.
    let mut src_buf = vec![7u8; max + 4096];
    let mut dst_buf = vec![0u8; max + 4096];
    let src = page_aligned(&mut src_buf, max);
    let dst = page_aligned(&mut dst_buf, max);
    let driver = w.rank() == 0;
    let target = data.at(1, 0);

    ctx.progress.note("rma put/get latency");
    for &b in SIZES {
        if driver {
            let n = b as usize;
            let reps = reps_for(b) / 4 + 1;
            let put = per_op(reps, || w.put(target, &src[..n]))?;
            let get = per_op(reps, || w.get(target, &mut dst[..n]))?;
            let m = lim.memcpy_ns(b);
            rows.push(
                Row::new("rma", format!("put latency (blocking) {}", size_name(b)), b, put, "ns")
                    .vs("memcpy time", m),
            );
            rows.push(
                Row::new("rma", format!("get latency (blocking) {}", size_name(b)), b, get, "ns")
                    .vs("memcpy time", m),
            );
        }
        w.barrier()?;
    }

    ctx.progress.note("rma put+flag ping-pong");
    // Data and flag share one cache line (elements 0 and 1); repetitions alternate with the
    // cache-line round trip so that both see the same machine conditions. Twice: a put then an
    // atomic store, and the same through `put_signal` (OpenSHMEM's fused put with signal).
    let local = flags.local();
    let iters = 20_000u64;
    let mut rep = 0;
    let mut ping_pong = |fused: bool| {
        lim.interleaved(ctx, 7, || {
            let base = rep * iters;
            rep += 1;
            let t = os::now_ns();
            let send = |to: u32, i: u64| {
                if fused {
                    w.put_signal(flags.at(to, 0), &[i], flags.at(to, 1), i)
                } else {
                    w.put(flags.at(to, 0), &[i])?;
                    w.atomic_store(flags.at(to, 1), i)
                }
            };
            for i in base + 1..=base + iters {
                let flag_set = || local.atomic(1).load(Ordering::Acquire) == i;
                if driver {
                    send(1, i)?;
                    w.wait_until(flag_set)?;
                } else if w.rank() == 1 {
                    w.wait_until(flag_set)?;
                    send(0, i)?;
                }
            }
            Ok(driver.then(|| (os::now_ns() - t) as f64 / iters as f64 / 2.0))
        })
    };
    let m = ping_pong(false)?;
    let fused = ping_pong(true)?;
    if let (Some(half), Some(line)) = (m.weft, m.line_rt) {
        rows.push(
            Row::new("rma", "put+flag ping-pong half RT", 8, half, "ns").vs("half cache-line RT", line / 2.0),
        );
    }
    if let (Some(half), Some(line)) = (fused.weft, fused.line_rt) {
        let metric = "put_signal ping-pong half RT";
        rows.push(Row::new("rma", metric, 8, half, "ns").vs("half cache-line RT", line / 2.0));
    }
    w.barrier()?;

    ctx.progress.note("rma flood bandwidth");
    for &b in SIZES {
        if driver {
            let n = b as usize;
            let reps = reps_for(b);
            let gbs = |ns_per: f64| b as f64 / ns_per;
            // Gets in flight need distinct destinations; keep them within 256 KiB (in L2). Their
            // limit is memcpy into the same destinations in turn.
            let chunks = ((256 << 10) / n).max(1) as u64;
            let passes = reps.div_ceil(chunks);
            // memcpy and the three floods take turns, five rounds, and each keeps its fastest
            // round: on this shared machine noise only adds time, and its speed drifts within
            // seconds, so the limit is measured under the same conditions as weft.
            let mut bufs = CopyBufs::new(n, 0);
            let (mut memcpy, mut nb, mut nbi, mut get) = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
            let mut memcpy_spread = f64::MAX;
            for _ in 0..FLOOD_ROUNDS {
                memcpy = memcpy.min(bufs.memcpy_ns(reps));
                let spread = memcpy_into_ns(bufs.src(), &mut dst[..chunks as usize * n], passes * chunks);
                memcpy_spread = memcpy_spread.min(spread);
                keep_fastest(&mut nb, reps, || {
                    let hs: Vec<_> =
                        (0..reps).map(|_| w.put_nb(target, &src[..n])).collect::<Result<_, _>>()?;
                    hs.into_iter().try_for_each(|h| h.wait())
                })?;
                keep_fastest(&mut nbi, reps, || {
                    for _ in 0..reps {
                        w.put_nbi(target, &src[..n])?;
                    }
                    w.sync_nbi()
                })?;
                keep_fastest(&mut get, passes * chunks, || {
                    for _ in 0..passes {
                        w.nbi(|s| {
                            dst.chunks_mut(n).take(chunks as usize).try_for_each(|c| s.get(target, c))
                        })?;
                    }
                    Ok(())
                })?;
            }
            let m = b as f64 / memcpy;
            rows.push(
                Row::new("rma", format!("put flood NB {}", size_name(b)), b, gbs(nb), "GB/s")
                    .vs("memcpy bandwidth", m),
            );
            rows.push(
                Row::new("rma", format!("put flood NBI {}", size_name(b)), b, gbs(nbi), "GB/s")
                    .vs("memcpy bandwidth", m),
            );
            rows.push(
                Row::new("rma", format!("get flood NBI {}", size_name(b)), b, gbs(get), "GB/s")
                    .vs("memcpy bw, same dsts", b as f64 / memcpy_spread),
            );
        }
        w.barrier()?;
    }

    ctx.progress.note("rma 8 B NBI put rate");
    if driver {
        let reps = 2_000_000u64;
        // The fastest of a few runs, as for the floods.
        let mut ns = f64::MAX;
        for _ in 0..FLOOD_ROUNDS {
            keep_fastest(&mut ns, reps, || {
                for i in 0..reps {
                    w.put_nbi(flags.at(1, (i & 7) as usize), &[i])?;
                }
                w.sync_nbi()
            })?;
        }
        rows.push(
            Row::new("rma", "8 B put NBI rate (1 thread)", 8, 1e3 / ns, "M/s")
                .vs("8 B memcpy rate", 1e3 / lim.memcpy_ns(8)),
        );
    }
    w.barrier()?;

    ctx.progress.note("rma strided put/get");
    if driver {
        rows.extend(strided(w, data.at(1, 0))?);
    }
    w.barrier()?;
    Ok(rows)
}

/// Strided put/get (every other run of a 2-d array) beside the same runs as one blocking
/// put/get each: what one call for the whole shape saves.
fn strided(w: &weft::World, target: weft::GlobalPtr<u8>) -> Result<Vec<Row>, weft::Error> {
    let mut rows = vec![];
    let src = vec![5u8; 1 << 16];
    let mut dst = vec![0u8; 1 << 16];
    for (run, count) in [(8usize, 1024usize), (64, 512), (512, 64), (4096, 8)] {
        let (counts, strides) = ([run, count], [2 * run]);
        let bytes = (run * count) as u64;
        let reps = (4096 / count as u64).max(16);
        let one = per_op(reps, || w.put_strided(target, &strides, &src, &[run], &counts))?;
        let each = per_op(reps, || {
            (0..count).try_for_each(|i| w.put(target + 2 * run * i, &src[i * run..(i + 1) * run]))
        })?;
        let shape = format!("{count} x {run} B");
        rows.push(
            Row::new("rma", format!("strided put {shape}"), bytes, one, "ns").vs("one put per run", each),
        );
        let one = per_op(reps, || w.get_strided(target, &strides, &mut dst, &[run], &counts))?;
        let each = per_op(reps, || {
            (0..count).try_for_each(|i| w.get(target + 2 * run * i, &mut dst[i * run..(i + 1) * run]))
        })?;
        rows.push(
            Row::new("rma", format!("strided get {shape}"), bytes, one, "ns").vs("one get per run", each),
        );
    }
    Ok(rows)
}
