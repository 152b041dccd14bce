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
    let m = lim.interleaved(ctx, 7, || {
        if !driver {
            return Ok(None);
        }
        let iters = 20_000u64;
        let t = os::now_ns();
        for _ in 0..iters {
            let want = h.pongs.load(Ordering::Relaxed) + 1;
            w.am_request_short(1, h.ping, &[])?;
            w.wait_until(|| h.pongs.load(Ordering::Acquire) >= want)?;
        }
        Ok(Some((os::now_ns() - t) as f64 / iters as f64))
    })?;
    if let (Some(rt), Some(line), Some(fresh)) = (m.weft, m.line_rt, m.fresh_line_rt) {
        rows.push(
            Row::new("am", "empty request/reply round trip", 0, rt, "ns").vs("cache-line round trip", line),
        );
        // The floor of a ring (each message on a fresh line), and what weft adds to it.
        rows.push(
            Row::new("am", "fresh-line round trip (ring floor)", 0, fresh, "ns")
                .vs("cache-line round trip", line),
        );
        rows.push(
            Row::new("am", "empty request/reply round trip", 0, rt, "ns").vs("fresh-line round trip", fresh),
        );
    }
    w.barrier()?;

    // Floods: `count` requests, then one whose reply says all were handled (rings are FIFO).
    let flood = |count: u64, send: &dyn Fn() -> Result<(), weft::Error>| -> Result<f64, weft::Error> {
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
        rows.push(Row::new("am", "short request rate (2 args)", 0, 1e3 / ns, "M/s"));
    }
    w.barrier()?;

    ctx.progress.note("am medium/long rate");
    let payload = vec![3u8; 4 << 20];
    let max_medium = w.caps().am_max_medium as u64;
    for &b in &[64u64, 1 << 10, 16 << 10, 32 << 10, 64 << 10, 1 << 20, 4 << 20] {
        if driver {
            let p = &payload[..b as usize];
            let count = ((256u64 << 20) / b).clamp(64, 200_000);
            let mut rate_rows = |kind: &str,
                                 send: &dyn Fn() -> Result<(), weft::Error>|
             -> Result<(), weft::Error> {
                let ns = median((0..3).map(|_| flood(count, send)).collect::<Result<_, _>>()?);
                rows.push(Row::new("am", format!("{kind} {} rate", size_name(b)), b, 1e3 / ns, "M/s"));
                let bw =
                    Row::new("am", format!("{kind} {} bandwidth", size_name(b)), b, b as f64 / ns, "GB/s");
                rows.push(bw.vs("memcpy bandwidth", lim.memcpy_gbs(b)));
                Ok(())
            };
            if b <= max_medium {
                rate_rows("medium", &|| w.am_request_medium(1, h.sink, &[], p))?;
            }
            rate_rows("long", &|| w.am_request_long(data.at(1, 0), h.sink, &[], p))?;
        }
        w.barrier()?;
    }
    Ok(rows)
}
