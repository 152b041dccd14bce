//! `stencil` suite: a 5-point Jacobi stencil on an n × n grid, split into horizontal strips,
//! one per (rank, thread), ranks × threads = P constant (the cores available to the job: 1×2
//! and 2×1 on 2 cores, 16×1 … 1×16 on 16). Each strip lives in its thread's memory; only the
//! halo rows travel: every iteration a thread puts its first and last rows into its
//! neighbours' halo slots (in registered memory, double-buffered) through its own endpoint,
//! then raises their arrival counters with a remote atomic, and waits for its own. Every
//! category runs at every split. Each row sits beside the same split stepping its strips with
//! no exchange, measured in this run, and the result is checked against the serial grid's checksum.

use super::report::Row;
use super::Ctx;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Barrier;
use std::time::Instant;
use weft::{AtomicOp, EndpointConfig, EndpointPolicy};

const ITERS: usize = 220;
/// Iterations before the clock starts (first touches, clocks, caches); all count in the result.
const WARMUP: usize = 20;

fn initial(row: usize, col: usize) -> f64 {
    ((row * 13 + col * 7) % 29) as f64 / 29.0
}

/// One Jacobi step on `rows` interior rows of width `nx` (rows 0 and rows+1 are halos; the
/// first and last columns are fixed).
fn step(old: &[f64], new: &mut [f64], rows: usize, nx: usize) {
    for r in 1..=rows {
        let (up, mid, down) =
            (&old[(r - 1) * nx..r * nx], &old[r * nx..(r + 1) * nx], &old[(r + 1) * nx..(r + 2) * nx]);
        let out = &mut new[r * nx..(r + 1) * nx];
        for c in 1..nx - 1 {
            out[c] = 0.25 * (up[c] + down[c] + mid[c - 1] + mid[c + 1]);
        }
        out[0] = mid[0];
        out[nx - 1] = mid[nx - 1];
    }
}

/// A strip of `rows` rows starting at global row `first`, with halo rows (zero outside).
fn strip(first: usize, rows: usize, nx: usize, ny: usize) -> Vec<f64> {
    let mut g = vec![0.0; (rows + 2) * nx];
    for r in 0..rows + 2 {
        let global = (first + r).wrapping_sub(1);
        if global < ny {
            for c in 0..nx {
                g[r * nx + c] = initial(global, c);
            }
        }
    }
    g
}

fn interior_sum(g: &[f64], rows: usize, nx: usize) -> f64 {
    g[nx..(rows + 1) * nx].iter().sum()
}

/// Serial reference: the checksum of the whole grid stepped on one thread.
fn serial(n: usize) -> f64 {
    let mut a = strip(0, n, n, n);
    let mut b = a.clone();
    for _ in 0..ITERS {
        step(&a, &mut b, n, n);
        std::mem::swap(&mut a, &mut b);
    }
    interior_sum(&a, n, n)
}

/// Waits at `ready`, runs `iteration(it)` for every `it < ITERS`, and returns the seconds per
/// iteration after the first `WARMUP`.
fn timed<E>(ready: &Barrier, mut iteration: impl FnMut(usize) -> Result<(), E>) -> Result<f64, E> {
    ready.wait();
    let mut t0 = Instant::now();
    for it in 0..ITERS {
        if it == WARMUP {
            t0 = Instant::now();
        }
        iteration(it)?;
    }
    Ok(t0.elapsed().as_secs_f64() / (ITERS - WARMUP) as f64)
}

/// Seconds per iteration of `threads` threads stepping their own strips with no exchange,
/// bound from CPU `first_cpu` on as the exchanging threads are.
fn compute_only(threads: usize, first_cpu: usize, rows: usize, n: usize) -> f64 {
    let ready = Barrier::new(threads);
    let cpus = weft::fabric::os::allowed_cpus();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (ready, cpus) = (&ready, &cpus);
                s.spawn(move || {
                    weft::fabric::os::pin_to_nth(cpus, first_cpu + t);
                    let mut a = strip(t * rows, rows, n, n);
                    let mut b = a.clone();
                    let per_iter = timed(ready, |_| {
                        step(&a, &mut b, rows, n);
                        std::mem::swap(&mut a, &mut b);
                        Ok::<(), std::convert::Infallible>(())
                    });
                    std::hint::black_box(&a);
                    per_iter.unwrap_or_else(|e| match e {})
                })
            })
            .collect();
        workers.into_iter().map(|h| h.join().unwrap_or(0.0)).fold(0.0, f64::max)
    })
}

/// `u64`s between arrival counters: 128 bytes, so that a neighbour's increment does not take
/// the line that other threads of the rank are polling.
const COUNTER_STRIDE: usize = 16;

/// Index of local strip `thread`'s arrival counter for `side` (0: from above, 1: from below).
fn counter(thread: usize, side: usize) -> usize {
    (thread * 2 + side) * COUNTER_STRIDE
}

/// Halo slots per rank: for each local strip, [buffer 2][side 2 (top, bottom)][n].
fn slot(n: usize, thread: usize, buf: usize, bottom: bool) -> usize {
    ((thread * 2 + buf) * 2 + usize::from(bottom)) * n
}

pub fn run(ctx: &Ctx) -> Result<Vec<Row>, weft::Error> {
    let w = &ctx.world;
    let n: usize = std::env::var("WEFT_STENCIL_N").ok().and_then(|s| s.parse().ok()).unwrap_or(1024);
    let p = match std::env::var("WEFT_STENCIL_P").ok().and_then(|s| s.parse::<usize>().ok()) {
        Some(p) if (1..=256).contains(&p) => p,
        _ => std::thread::available_parallelism().map_or(2, |c| c.get()).clamp(2, 16),
    };
    if !n.is_multiple_of(p) || n < 4 {
        return Err(weft::Error::Config(format!("WEFT_STENCIL_N={n}: must be a multiple of {p}")));
    }
    let rows = n / p;
    let halos = w.alloc_segment::<f64>(p * 4 * n)?;
    let arrivals = w.alloc_segment::<u64>(2 * p * COUNTER_STRIDE)?;
    let reference = if w.rank() == 0 { serial(n) } else { 0.0 };
    let mut out = vec![];
    let splits: Vec<usize> = (1..=p).filter(|r| p.is_multiple_of(*r) && *r <= w.size() as usize).collect();
    for &ranks in &splits {
        let threads = p / ranks;
        // The limit of this split: the same strips stepped by the same threads on the same
        // ranks at once, with no halo exchange (memory bandwidth is shared, so P strips do
        // not run P times faster than one grid).
        w.barrier()?;
        let me = w.rank() as usize;
        let mine = if me < ranks { compute_only(threads, me * threads, rows, n) } else { 0.0 };
        let compute_iter = w
            .exchange(&mine.to_le_bytes())?
            .iter()
            .map(|m| f64::from_le_bytes(m[..8].try_into().unwrap_or_default()))
            .fold(0.0, f64::max);
        for policy in EndpointPolicy::CATEGORIES {
            ctx.progress.note(&format!("stencil {ranks}x{threads} {}", policy.name()));
            for i in 0..2 * p {
                arrivals.local().write(counter(i / 2, i % 2), 0);
            }
            let active = (w.rank() as usize) < ranks;
            let mut set = w.endpoints(&EndpointConfig::new(policy, if active { threads } else { 1 }))?;
            let res = set.resources().clone();
            let eps = set.endpoints();
            w.barrier()?;
            let (mut sum, mut per_iter) = (0.0, 0.0);
            if active {
                let ready = Barrier::new(threads);
                let results = super::on_own_threads(eps, Some(me * threads), |mut ep| {
                    let t = ep.index();
                    let g = me * threads + t;
                    let owner = |g: usize| ((g / threads) as u32, g % threads);
                    let mut a = strip(g * rows, rows, n, n);
                    let mut b = a.clone();
                    let per_iter = timed(&ready, |it| {
                        let (cur, next) = (it % 2, (it + 1) % 2);
                        if it > 0 {
                            // Halos of this iteration arrived in buffer `cur`.
                            let local = halos.local();
                            if g > 0 {
                                local.copy_out(slot(n, t, cur, false), &mut a[..n]);
                            }
                            if g + 1 < p {
                                local.copy_out(slot(n, t, cur, true), &mut a[(rows + 1) * n..]);
                            }
                        }
                        step(&a, &mut b, rows, n);
                        std::mem::swap(&mut a, &mut b);
                        if it + 1 == ITERS {
                            return Ok(());
                        }
                        // My new first row is the upper neighbour's bottom halo, my
                        // last row the lower neighbour's top halo.
                        if g > 0 {
                            let (r, u) = owner(g - 1);
                            ep.put_nbi(halos.at(r, slot(n, u, next, true)), &a[n..2 * n])?;
                        }
                        if g + 1 < p {
                            let (r, d) = owner(g + 1);
                            ep.put_nbi(halos.at(r, slot(n, d, next, false)), &a[rows * n..(rows + 1) * n])?;
                        }
                        ep.sync_nbi()?;
                        // One arrival counter per side: a neighbour may be an iteration
                        // ahead, so a shared count could hide the other's missing halo.
                        if g > 0 {
                            let (r, u) = owner(g - 1);
                            ep.atomic_nbi(arrivals.at(r, counter(u, 1)), AtomicOp::FetchAdd(1))?;
                        }
                        if g + 1 < p {
                            let (r, d) = owner(g + 1);
                            ep.atomic_nbi(arrivals.at(r, counter(d, 0)), AtomicOp::FetchAdd(1))?;
                        }
                        ep.sync_nbi()?;
                        // Neighbours asleep in their wait learn of the flags now.
                        for nb in [g.wrapping_sub(1), g + 1].into_iter().filter(|&x| x < p) {
                            ep.comm().notify(owner(nb).0)?;
                        }
                        let want = it as u64 + 1;
                        let flag = arrivals.local();
                        let arrived = |side: usize, exists: bool| {
                            !exists || flag.atomic(counter(t, side)).load(Ordering::Acquire) >= want
                        };
                        ep.comm().wait_until(|| arrived(0, g > 0) && arrived(1, g + 1 < p))
                    })?;
                    Ok((interior_sum(&a, rows, n), per_iter))
                })?;
                sum = results.iter().map(|r| r.0).sum();
                per_iter = results.iter().map(|r| r.1).fold(0.0, f64::max);
            } else {
                drop(eps);
            }
            set.close()?;
            // Every rank's checksum and time to rank 0.
            let mine: Vec<u8> = [sum.to_le_bytes(), per_iter.to_le_bytes()].concat();
            let all = w.exchange(&mine)?;
            if w.rank() == 0 {
                let f = |m: &[u8], i: usize| {
                    f64::from_le_bytes(m[i * 8..i * 8 + 8].try_into().unwrap_or_default())
                };
                let total: f64 = all.iter().map(|m| f(m, 0)).sum();
                let slowest = all[..ranks].iter().map(|m| f(m, 1)).fold(0.0, f64::max);
                if (total - reference).abs() > 1e-9 * reference.abs() {
                    return Err(weft::Error::Remote(format!(
                        "stencil {ranks}x{threads} {}: checksum {total}, serial {reference}",
                        policy.name()
                    )));
                }
                let per_iter = slowest * 1e6;
                let row = Row::new(
                    "stencil",
                    format!("{} {ranks}x{threads} n={n}", policy.name()),
                    0,
                    per_iter,
                    "us/it",
                )
                .vs("same split, no exchange", compute_iter * 1e6);
                let row = row.with_resources(&res, json!({ "ranks": ranks, "threads": threads }));
                out.push(row);
            }
            w.barrier()?;
        }
    }
    Ok(out)
}
