//! `bale` suite: bale's fine-grained kernels on weft's distributed arrays, each verified, each
//! in forms measured alternately in one run: aggregated batches (the owners apply them), the
//! same batches applied straight to mapped memory where the fabric maps the owners (shared
//! memory), one operation at a time (blocking remote atomics), and the same updates applied by
//! every rank to a local array only (the memory limit, "local"). Rates count the updates of
//! all ranks together.

use super::report::{median, Row};
use super::Ctx;
use weft::fabric::os;
use weft::{AtomicArray, Mapped, World};

/// Updates per rank (`WEFT_BALE_UPDATES`, default 1 M) and table entries per rank (100 k).
fn sizes() -> (usize, usize) {
    let updates = std::env::var("WEFT_BALE_UPDATES").ok().and_then(|v| v.parse().ok()).unwrap_or(1 << 20);
    (updates, 100_000)
}

/// bale's index stream: uniform random table indices, different on every rank.
fn indices(seed: u64, count: usize, len: usize) -> Vec<usize> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..count)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % len as u64) as usize
        })
        .collect()
}

/// Seconds `f` takes on every rank together: from a barrier to the barrier after it.
fn timed(w: &World, f: impl FnOnce() -> Result<(), weft::Error>) -> Result<f64, weft::Error> {
    w.barrier()?;
    let t = os::now_ns();
    f()?;
    w.barrier()?;
    Ok((os::now_ns() - t) as f64 / 1e9)
}

fn fail(what: String) -> weft::Error {
    weft::Error::Remote(format!("bale verification failed: {what}"))
}

/// The rows of one kernel: the median of each form's rates, beside the local one.
fn kernel_rows(kernel: &str, local: Vec<f64>, forms: Vec<(&str, Vec<f64>)>) -> Vec<Row> {
    let limit = median(local) / 1e6;
    let mut rows = vec![Row::new("bale", format!("{kernel}, local"), 0, limit, "M/s")];
    for (form, rates) in forms.into_iter().filter(|(_, r)| !r.is_empty()) {
        rows.push(
            Row::new("bale", format!("{kernel}, {form}"), 0, median(rates) / 1e6, "M/s").vs("local", limit),
        );
    }
    rows
}

pub fn run(ctx: &Ctx) -> Result<Vec<Row>, weft::Error> {
    let w = &ctx.world;
    let (updates, per_rank) = sizes();
    let n = w.size() as usize;
    let len = per_rank * n;
    let total = (updates * n) as f64;
    let idx = indices(w.rank() as u64 + 1, updates, len);
    // The one-at-a-time form does a tenth of the updates (it is slow), at the same rate.
    let few = &idx[..updates / 10];
    // Where the fabric maps the owners' memory, batches are timed both ways.
    let mapped = w.caps().load_store;
    let mut rows = vec![];

    ctx.progress.note("bale histogram");
    let table = AtomicArray::<u64>::new(w, len)?;
    let mut local = vec![0u64; per_rank];
    let (mut agg, mut direct, mut one, mut loc) = (vec![], vec![], vec![], vec![]);
    for _ in 0..3 {
        let t = timed(w, || {
            for &i in &idx {
                local[i % per_rank] += 1;
            }
            Ok(())
        })?;
        loc.push(total / t);
        table.set_mapped(Mapped::Messages);
        agg.push(total / timed(w, || table.batch_add(idx.iter().copied(), 1)?.wait())?);
        if mapped {
            table.set_mapped(Mapped::Direct);
            direct.push(total / timed(w, || table.batch_add(idx.iter().copied(), 1)?.wait())?);
        }
        one.push(total / 10.0 / timed(w, || few.iter().try_for_each(|&i| table.add(i, 1)))?);
    }
    std::hint::black_box(&local);
    // Every update landed: 3 rounds of all updates (twice where mapped) and of a tenth of them.
    let batches = if mapped { 2 } else { 1 };
    let want = 3 * (batches * n * updates + n * few.len()) as u64;
    let got = table.sum()?;
    if got != want {
        return Err(fail(format!("histogram total {got}, expected {want}")));
    }
    let forms = vec![("aggregated", agg), ("direct (mapped memory)", direct), ("one at a time", one)];
    rows.extend(kernel_rows("histogram", loc, forms));
    drop(table);

    ctx.progress.note("bale index gather");
    let source = AtomicArray::<u64>::new(w, len)?;
    for off in 0..source.local_len() {
        let g = source.global_index(off);
        source.store(g, 3 * g as u64 + 1)?;
    }
    w.barrier()?;
    let local: Vec<u64> = (0..per_rank as u64).map(|i| 3 * i + 1).collect();
    let check = |got: &[u64]| match (0..idx.len()).find(|&k| got[k] != 3 * idx[k] as u64 + 1) {
        Some(k) => Err(fail(format!("gather item {k}: index {} gave {}", idx[k], got[k]))),
        None => Ok(()),
    };
    let (mut agg, mut direct, mut one, mut loc) = (vec![], vec![], vec![], vec![]);
    for round in 0..3 {
        let mut sink = 0u64;
        let t = timed(w, || {
            for &i in &idx {
                sink = sink.wrapping_add(local[i % per_rank]);
            }
            Ok(())
        })?;
        loc.push(total / t);
        std::hint::black_box(sink);
        for (how, rates) in [(Mapped::Messages, &mut agg), (Mapped::Direct, &mut direct)] {
            if how == Mapped::Direct && !mapped {
                continue;
            }
            source.set_mapped(how);
            let mut got = vec![];
            rates.push(
                total
                    / timed(w, || {
                        got = source.batch_load(idx.iter().copied())?.wait()?;
                        Ok(())
                    })?,
            );
            if round == 0 {
                check(&got)?;
            }
        }
        let t = timed(w, || {
            for &i in few {
                let v = source.load(i)?;
                if v != 3 * i as u64 + 1 {
                    return Err(fail(format!("load of index {i} gave {v}")));
                }
            }
            Ok(())
        })?;
        one.push(total / 10.0 / t);
    }
    let forms = vec![("aggregated", agg), ("direct (mapped memory)", direct), ("one at a time", one)];
    rows.extend(kernel_rows("index gather", loc, forms));
    let s = weft::agg::Agg::get(w)?.stats();
    rows.push(Row::new("bale", "aggregation, mean items per message", 0, s.mean_batch(), "items"));
    Ok(rows)
}
