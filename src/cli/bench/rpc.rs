//! `rpc` suite: the empty call round trip beside the cache-line round trip; ping-pong (echo)
//! and bidirectional bandwidth (OSU bibw: windows of calls from both ranks at once) by argument
//! size for a plain `Vec<u8>` (serde copies it), a `SerializeBuffer<u8>` and an `RmaVec<u8>`,
//! with 1 and 2 threads per rank.

use super::limits::Limits;
use super::report::{median, size_name, Row};
use super::Ctx;
use std::sync::atomic::Ordering;
use std::sync::Barrier;
use weft::fabric::os;
use weft::rpc::CallFuture;
use weft::{remote, RmaVec, RpcExt, SerializeBuffer, World};

remote! { fn empty() {} }
remote! { fn echo_vec(v: Vec<u8>) -> Vec<u8> { v } }
remote! { fn echo_buf(v: SerializeBuffer<u8>) -> SerializeBuffer<u8> { v } }
remote! { fn echo_rma(v: RmaVec<u8>) -> RmaVec<u8> { v } }
remote! { fn sink_vec(v: Vec<u8>) -> u64 { v.len() as u64 } }
remote! { fn sink_buf(v: SerializeBuffer<u8>) -> u64 { v.len() as u64 } }
remote! { fn sink_rma(v: RmaVec<u8>) -> u64 { v.len() as u64 } }

const SIZES: &[u64] = &[8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];
const THREADS: &[usize] = &[1, 2];

/// An argument type under test.
trait Kind: Sized + Send {
    const NAME: &'static str;
    fn make(w: &World, bytes: &[u8]) -> Result<Self, weft::Error>;
    fn echo(w: &World, to: u32, v: Self) -> Result<Self, weft::Error>;
    fn sink(w: &World, to: u32, v: Self) -> CallFuture<u64>;
    fn bytes(&self) -> &[u8];
}

/// Implements [`Kind`] for an argument type and its echo and sink functions.
macro_rules! kind {
    ($t:ty, $name:literal, $echo:ident, $sink:ident, $make:expr) => {
        impl Kind for $t {
            const NAME: &'static str = $name;
            fn make(w: &World, b: &[u8]) -> Result<Self, weft::Error> {
                $make(w, b)
            }
            fn echo(w: &World, to: u32, v: Self) -> Result<Self, weft::Error> {
                w.call(to, $echo, (v,)).wait()
            }
            fn sink(w: &World, to: u32, v: Self) -> CallFuture<u64> {
                w.call(to, $sink, (v,))
            }
            fn bytes(&self) -> &[u8] {
                self
            }
        }
    };
}

kind!(Vec<u8>, "Vec", echo_vec, sink_vec, |_: &World, b: &[u8]| Ok(b.to_vec()));
kind!(SerializeBuffer<u8>, "SerializeBuffer", echo_buf, sink_buf, |_: &World, b: &[u8]| Ok(b
    .to_vec()
    .into()));
kind!(RmaVec<u8>, "RmaVec", echo_rma, sink_rma, |w: &World, b: &[u8]| RmaVec::from_slice(w, b));

fn pattern(bytes: u64) -> Vec<u8> {
    (0..bytes).map(|i| (i * 7 + 3) as u8).collect()
}

/// Round trips per measurement: about 32 MiB moved each way, at least 4.
fn iters_for(bytes: u64) -> u64 {
    ((32u64 << 20) / bytes.max(64)).clamp(4, 5000)
}

/// Echo ping-pong from rank 0 to rank 1 on `threads` threads at once: ns per round trip (each
/// thread's own, the slowest thread's median), on rank 0.
fn ping_pong<K: Kind>(ctx: &Ctx, bytes: u64, threads: usize) -> Result<Option<f64>, weft::Error> {
    let w = &ctx.world;
    let mut result = None;
    if w.rank() == 0 {
        let data = pattern(bytes);
        let iters = iters_for(bytes);
        let start = Barrier::new(threads);
        let samples: Vec<f64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| -> Result<f64, weft::Error> {
                        let mut v = K::make(w, &data)?;
                        v = K::echo(w, 1, v)?; // warm-up (first touches of the pool blocks)
                        let mut times = vec![];
                        for _ in 0..3 {
                            start.wait();
                            let t = os::now_ns();
                            for _ in 0..iters {
                                v = K::echo(w, 1, v)?;
                            }
                            times.push((os::now_ns() - t) as f64 / iters as f64);
                        }
                        if v.bytes() != &data[..] {
                            return Err(weft::Error::Remote(format!("{} echo changed the data", K::NAME)));
                        }
                        Ok(median(times))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("bench thread")).collect::<Result<_, _>>()
        })?;
        result = samples.into_iter().reduce(f64::max);
    }
    w.barrier()?;
    Ok(result)
}

/// OSU-style bidirectional bandwidth: both ranks send windows of `sink` calls to each other on
/// `threads` threads each, then wait for all of them; GB/s both ways together, on rank 0.
fn bibw<K: Kind>(ctx: &Ctx, bytes: u64, threads: usize) -> Result<Option<f64>, weft::Error> {
    let w = &ctx.world;
    let peer = 1 - w.rank().min(1);
    let active = w.rank() < 2;
    let window = ((32u64 << 20) / bytes / threads as u64).clamp(1, 64) as usize;
    let windows = (((64u64 << 20) / (bytes * window as u64 * threads as u64)) as usize).clamp(3, 50);
    let data = pattern(bytes);
    let mut times = vec![];
    for _ in 0..windows {
        // The arguments exist before the clock starts (a program sends data it already has).
        let mut args: Vec<Vec<K>> = vec![];
        if active {
            for _ in 0..threads {
                args.push((0..window).map(|_| K::make(w, &data)).collect::<Result<_, _>>()?);
            }
        }
        w.barrier()?;
        if !active {
            continue;
        }
        let t = os::now_ns();
        std::thread::scope(|s| -> Result<(), weft::Error> {
            let handles: Vec<_> = args
                .into_iter()
                .map(|batch| {
                    s.spawn(move || -> Result<(), weft::Error> {
                        let futures: Vec<_> = batch.into_iter().map(|v| K::sink(w, peer, v)).collect();
                        for f in futures {
                            if f.wait()? != bytes {
                                return Err(weft::Error::Remote("sink saw a wrong length".into()));
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| h.join().expect("bench thread"))
        })?;
        times.push((os::now_ns() - t) as f64);
    }
    w.barrier()?;
    let total = 2.0 * (bytes * window as u64 * threads as u64) as f64;
    Ok((w.rank() == 0 && !times.is_empty()).then(|| total / median(times)))
}

pub fn run(ctx: &Ctx, lim: &Limits) -> Result<Vec<Row>, weft::Error> {
    let w = &ctx.world;
    let mut rows = vec![];
    if w.size() < 2 {
        return Ok(rows);
    }
    ctx.progress.note("rpc empty call");
    // Each repetition times the call and, right after, the bare AM round trip under it.
    let am_rt = std::cell::RefCell::new(vec![]);
    let h = &ctx.handlers;
    let m = lim.interleaved(ctx, 7, || {
        if w.rank() != 0 {
            return Ok(None);
        }
        let iters = 5000u64;
        let t = os::now_ns();
        for _ in 0..iters {
            w.call(1, empty, ()).wait()?;
        }
        let call = (os::now_ns() - t) as f64 / iters as f64;
        let t = os::now_ns();
        for _ in 0..iters {
            let want = h.pongs.load(Ordering::Relaxed) + 1;
            w.am_request_short(1, h.ping, &[])?;
            w.wait_until(|| h.pongs.load(Ordering::Acquire) >= want)?;
        }
        am_rt.borrow_mut().push((os::now_ns() - t) as f64 / iters as f64);
        Ok(Some(call))
    })?;
    if let (Some(rt), Some(line)) = (m.weft, m.line_rt) {
        rows.push(Row::new("rpc", "empty call round trip", 0, rt, "ns").vs("cache-line round trip", line));
        let am = median(am_rt.take());
        rows.push(Row::new("rpc", "empty call round trip", 0, rt, "ns").vs("AM round trip", am));
    }

    for &b in SIZES {
        ctx.progress.note(&format!("rpc ping-pong {}", size_name(b)));
        let mut rt = vec![];
        for &t in THREADS {
            let vec = ping_pong::<Vec<u8>>(ctx, b, t)?;
            let buf = ping_pong::<SerializeBuffer<u8>>(ctx, b, t)?;
            let rma = ping_pong::<RmaVec<u8>>(ctx, b, t)?;
            rt.push((t, vec, buf, rma));
        }
        for (t, vec, buf, rma) in rt {
            let (Some(vec), Some(buf), Some(rma)) = (vec, buf, rma) else { continue };
            let two_copies = 2.0 * lim.memcpy_ns(b);
            let label = |k: &str| format!("echo {k} {}, {t} thr", size_name(b));
            if t == 1 {
                for (k, ns) in [("Vec", vec), ("SerializeBuffer", buf), ("RmaVec", rma)] {
                    rows.push(Row::new("rpc", label(k), b, ns, "ns").vs("two memcpys", two_copies));
                }
                rows.push(Row::new("rpc", label("RmaVec"), b, rma, "ns").vs("Vec (copying) echo", vec));
            } else {
                // Threads of one rank share the target: report their combined bandwidth.
                for (k, ns) in [("Vec", vec), ("SerializeBuffer", buf), ("RmaVec", rma)] {
                    let gbs = (2 * b) as f64 * t as f64 / ns;
                    rows.push(
                        Row::new("rpc", label(k), b, gbs, "GB/s").vs("memcpy bandwidth", lim.memcpy_gbs(b)),
                    );
                }
            }
        }
        ctx.progress.note(&format!("rpc bibw {}", size_name(b)));
        for &t in THREADS {
            let vec = bibw::<Vec<u8>>(ctx, b, t)?;
            let buf = bibw::<SerializeBuffer<u8>>(ctx, b, t)?;
            let rma = bibw::<RmaVec<u8>>(ctx, b, t)?;
            if let (Some(vec), Some(buf), Some(rma)) = (vec, buf, rma) {
                for (k, gbs) in [("Vec", vec), ("SerializeBuffer", buf), ("RmaVec", rma)] {
                    let label = format!("bibw {k} {}, {t} thr", size_name(b));
                    rows.push(
                        Row::new("rpc", label, b, gbs, "GB/s").vs("memcpy bandwidth", lim.memcpy_gbs(b)),
                    );
                }
            }
        }
    }
    Ok(rows)
}
