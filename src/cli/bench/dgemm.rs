//! `dgemm` suite: the global-array kernel of Zambre et al. Matrices A, B and C (n × n `f64`,
//! stored tile by tile so that a tile is one contiguous get) live on rank 1, the server.
//! Rank 0's T threads, each on its own endpoint, take C tiles from a shared counter on the
//! server (fetch-add, GA's NXTVAL), get the A and B tiles they need, multiply, and put the C
//! tile back. Every category runs at every thread count; each row sits beside the same
//! multiplications on local tiles with no communication, measured in this run, and carries
//! the resources the endpoints held. A sample of C is checked against a direct computation.

use super::report::Row;
use super::Ctx;
use serde_json::json;
use std::time::Instant;
use weft::{AtomicOp, EndpointConfig, EndpointPolicy, GlobalPtr, Segment};

const TILE: usize = 64;
const TILE_ELEMS: usize = TILE * TILE;

fn a_at(i: usize, k: usize) -> f64 {
    ((i * 7 + k * 3) % 17) as f64 * 0.25 - 2.0
}
fn b_at(k: usize, j: usize) -> f64 {
    ((k * 5 + j * 11) % 13) as f64 * 0.5 - 3.0
}

/// Matrix order: `WEFT_DGEMM_N` (a multiple of 64), default 1024.
fn order() -> usize {
    std::env::var("WEFT_DGEMM_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|n| n % TILE == 0 && *n > 0)
        .unwrap_or(1024)
}

/// Element offset of tile (ti, tj) in tile-major storage of an n × n matrix.
fn tile_at(n: usize, ti: usize, tj: usize) -> usize {
    (ti * (n / TILE) + tj) * TILE_ELEMS
}

/// c += a · b for 64 × 64 row-major tiles (i-k-j order, so the inner loop vectorises). Never
/// inlined, so that the kernel and its compute-only reference run the same machine code.
#[inline(never)]
fn multiply(c: &mut [f64], a: &[f64], b: &[f64]) {
    for i in 0..TILE {
        for k in 0..TILE {
            let x = a[i * TILE + k];
            let (brow, crow) = (&b[k * TILE..(k + 1) * TILE], &mut c[i * TILE..(i + 1) * TILE]);
            for j in 0..TILE {
                crow[j] += x * brow[j];
            }
        }
    }
}

/// Fills the server's A and B (tile-major).
fn fill(seg: &Segment<f64>, n: usize, f: fn(usize, usize) -> f64) {
    let nt = n / TILE;
    let local = seg.local();
    for ti in 0..nt {
        for tj in 0..nt {
            let base = tile_at(n, ti, tj);
            for r in 0..TILE {
                for c in 0..TILE {
                    local.write(base + r * TILE + c, f(ti * TILE + r, tj * TILE + c));
                }
            }
        }
    }
}

/// One C tile on one endpoint: gets, multiplications, put.
fn tile_job(
    ep: &mut weft::Endpoint<'_>,
    mats: (&Segment<f64>, &Segment<f64>, &Segment<f64>),
    n: usize,
    t: usize,
    bufs: &mut [Vec<f64>; 3],
) -> Result<(), weft::Error> {
    let nt = n / TILE;
    let (ti, tj) = (t / nt, t % nt);
    let [acc, ta, tb] = bufs;
    acc.fill(0.0);
    for tk in 0..nt {
        ep.get(mats.0.at(1, tile_at(n, ti, tk)), ta)?;
        ep.get(mats.1.at(1, tile_at(n, tk, tj)), tb)?;
        multiply(acc, ta, tb);
    }
    ep.put_nbi(mats.2.at(1, tile_at(n, ti, tj)), acc)
}

/// Runs of the whole multiplication per second on local tiles, `threads` threads sharing the
/// tiles as the kernel's do, with local copies in place of the gets.
fn compute_only(threads: usize, tiles: usize, nt: usize, a: &[f64], b: &[f64]) -> f64 {
    let cpus = weft::fabric::os::allowed_cpus();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for id in 0..threads {
            let cpus = &cpus;
            s.spawn(move || {
                // Bound as the endpoint threads are.
                weft::fabric::os::pin_to_nth(cpus, id);
                // Buffers made as the kernel makes them (their relative placement decides
                // whether the tile loops stall on 4K aliasing).
                let [mut acc, mut ta, mut tb] =
                    [vec![0.0; TILE_ELEMS], vec![0.0; TILE_ELEMS], vec![0.0; TILE_ELEMS]];
                for _ in (id..tiles).step_by(threads) {
                    acc.fill(0.0);
                    for _ in 0..nt {
                        // The fabric's copy, as the gets use (glibc's memcpy stalls on 4K
                        // aliasing between same-sized buffers: ARCHITECTURE, "Copies").
                        weft::fabric::copy::copy_slice(&mut ta, a);
                        weft::fabric::copy::copy_slice(&mut tb, b);
                        multiply(&mut acc, &ta, &tb);
                    }
                    std::hint::black_box(&acc);
                }
            });
        }
    });
    1.0 / t0.elapsed().as_secs_f64()
}

pub fn run(ctx: &Ctx, counts: &[usize]) -> Result<Vec<Row>, weft::Error> {
    let w = &ctx.world;
    if w.size() < 2 {
        return Ok(vec![]);
    }
    let n = order();
    let (nt, tiles) = (n / TILE, (n / TILE) * (n / TILE));
    let a = w.alloc_segment::<f64>(n * n)?;
    let b = w.alloc_segment::<f64>(n * n)?;
    let c = w.alloc_segment::<f64>(n * n)?;
    let next = w.alloc_segment::<u64>(1)?;
    if w.rank() == 1 {
        fill(&a, n, a_at);
        fill(&b, n, b_at);
    }
    w.barrier()?;
    let counter: GlobalPtr<u64> = next.at(1, 0);
    let flops = 2.0 * (n as f64).powi(3);
    // Local tiles for the compute-only reference.
    let local_a: Vec<f64> = (0..TILE_ELEMS).map(|e| a_at(e / TILE, e % TILE)).collect();
    let local_b: Vec<f64> = (0..TILE_ELEMS).map(|e| b_at(e / TILE, e % TILE)).collect();
    let mut rows = vec![];
    for &threads in counts {
        // Compute only: the same tile multiplications, T threads, no communication.
        let compute = if w.rank() == 0 {
            // Best of three (the first also warms the caches and the clock).
            (0..3).map(|_| compute_only(threads, tiles, nt, &local_a, &local_b)).fold(0.0, f64::max) * flops
                / 1e9
        } else {
            0.0
        };
        for policy in EndpointPolicy::CATEGORIES {
            ctx.progress.note(&format!("dgemm {} T={threads}", policy.name()));
            if w.rank() == 1 {
                next.local().write(0, 0);
                for e in 0..n * n {
                    c.local().write(e, f64::NAN);
                }
            }
            w.barrier()?;
            let mut set =
                w.endpoints(&EndpointConfig::new(policy, if w.rank() == 0 { threads } else { 1 }))?;
            let res = set.resources().clone();
            let eps = set.endpoints();
            let mut secs = 0.0;
            if w.rank() == 0 {
                let t0 = Instant::now();
                super::on_own_threads(eps, Some(0), |mut ep| {
                    let mut bufs = [vec![0.0; TILE_ELEMS], vec![0.0; TILE_ELEMS], vec![0.0; TILE_ELEMS]];
                    loop {
                        let t = ep.atomic(counter, AtomicOp::FetchAdd(1))? as usize;
                        if t >= tiles {
                            return ep.sync_nbi();
                        }
                        tile_job(&mut ep, (&a, &b, &c), n, t, &mut bufs)?;
                    }
                })?;
                secs = t0.elapsed().as_secs_f64();
            } else {
                drop(eps);
            }
            set.close()?;
            if w.rank() == 1 {
                check(&c, n)?;
            }
            w.barrier()?;
            if w.rank() == 0 {
                let metric = format!("{} T={threads} n={n}", policy.name());
                let row = Row::new("dgemm", metric, 0, flops / secs / 1e9, "GFLOP/s")
                    .vs("compute + local copies", compute);
                let row = row.with_resources(&res, json!({ "threads": threads, "seconds": secs }));
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// Checks a sample of C (every tile, a few elements each) against direct dot products.
fn check(c: &Segment<f64>, n: usize) -> Result<(), weft::Error> {
    let nt = n / TILE;
    for ti in 0..nt {
        for tj in 0..nt {
            for (r, col) in [(0, 0), (TILE - 1, 5), (17, TILE - 1)] {
                let (i, j) = (ti * TILE + r, tj * TILE + col);
                let want: f64 = (0..n).map(|k| a_at(i, k) * b_at(k, j)).sum();
                let got = c.local().read(tile_at(n, ti, tj) + r * TILE + col);
                if (got - want).abs() > 1e-9 * want.abs().max(1.0) {
                    return Err(weft::Error::Remote(format!("dgemm: C[{i}][{j}] = {got}, expected {want}")));
                }
            }
        }
    }
    Ok(())
}
