//! `am` suite: empty request/reply round trip, and short/medium/long message rates.

use super::limits::Limits;
use super::report::{median, size_name, Row};
use super::Ctx;
use std::sync::atomic::Ordering;
use weft::fabric::os;

pub fn run(ctx: &Ctx, lim: &Limits) -> Result<Vec<Row>, weft::Error> {
    let w = &ctx.world;
    let h = &ctx.handlers;
    let mut rows = vec![];
    if w.size() < 2 {
        return Ok(rows);
    }
    let driver = w.rank() == 0;
    let data = w.alloc_segment::<u8>(4 << 20)?;

    ctx.progress.note("am round trip");
    // Repetitions alternate with the cache-line round trip (same machine conditions).
    let (mut samples, mut limit) = (vec![], vec![]);
    for _ in 0..7 {
        limit.extend(lim.line.round_trip(ctx, 20_000)?);
        if driver {
            let iters = 20_000u64;
            let t = os::now_ns();
            for _ in 0..iters {
                let want = h.pongs.load(Ordering::Relaxed) + 1;
                w.am_request_short(1, h.ping, &[])?;
                w.wait_until(|| h.pongs.load(Ordering::Acquire) >= want)?;
            }
            samples.push((os::now_ns() - t) as f64 / iters as f64);
        }
        w.barrier()?;
    }
    if driver {
        let row = Row::new(
            "am",
            "empty request/reply round trip",
            0,
            median(samples),
            "ns",
        );
        rows.push(if limit.is_empty() {
            row
        } else {
            row.vs("cache-line round trip", median(limit))
        });
    }
    w.barrier()?;

    // Floods: `count` requests, then one whose reply says all were handled (rings are FIFO).
    let flood =
        |count: u64, send: &dyn Fn() -> Result<(), weft::Error>| -> Result<f64, weft::Error> {
            let t = os::now_ns();
            for _ in 0..count {
                send()?;
            }
            let want = h.fin_acks.load(Ordering::Relaxed) + 1;
            w.am_request_short(1, h.fin, &[])?;
            w.wait_until(|| h.fin_acks.load(Ordering::Acquire) >= want)?;
            Ok((os::now_ns() - t) as f64 / count as f64)
        };

    ctx.progress.note("am short rate");
    if driver {
        let ns = median(
            (0..3)
                .map(|_| flood(200_000, &|| w.am_request_short(1, h.sink, &[1, 2])))
                .collect::<Result<_, _>>()?,
        );
        rows.push(Row::new(
            "am",
            "short request rate (2 args)",
            0,
            1e3 / ns,
            "M/s",
        ));
    }
    w.barrier()?;

    ctx.progress.note("am medium/long rate");
    let payload = vec![3u8; 4 << 20];
    let max_medium = w.caps().am_max_medium as u64;
    for &b in &[
        64u64,
        1 << 10,
        16 << 10,
        32 << 10,
        64 << 10,
        1 << 20,
        4 << 20,
    ] {
        if driver {
            let p = &payload[..b as usize];
            let count = ((256u64 << 20) / b).clamp(64, 200_000);
            let m = lim.memcpy_gbs(b.min(4 << 20));
            if b <= max_medium {
                let ns = median(
                    (0..3)
                        .map(|_| flood(count, &|| w.am_request_medium(1, h.sink, &[], p)))
                        .collect::<Result<_, _>>()?,
                );
                rows.push(Row::new(
                    "am",
                    format!("medium {} rate", size_name(b)),
                    b,
                    1e3 / ns,
                    "M/s",
                ));
                rows.push(
                    Row::new(
                        "am",
                        format!("medium {} bandwidth", size_name(b)),
                        b,
                        b as f64 / ns,
                        "GB/s",
                    )
                    .vs("memcpy bandwidth", m),
                );
            }
            let ns = median(
                (0..3)
                    .map(|_| flood(count, &|| w.am_request_long(h.sink, &[], p, data.at(1, 0))))
                    .collect::<Result<_, _>>()?,
            );
            rows.push(Row::new(
                "am",
                format!("long {} rate", size_name(b)),
                b,
                1e3 / ns,
                "M/s",
            ));
            rows.push(
                Row::new(
                    "am",
                    format!("long {} bandwidth", size_name(b)),
                    b,
                    b as f64 / ns,
                    "GB/s",
                )
                .vs("memcpy bandwidth", m),
            );
        }
        w.barrier()?;
    }
    Ok(rows)
}
