//! `weft bench ft`: NAS FT's transpose variants × communication models for one class, in one
//! job, each beside the bulk exchange of the same model (the paper's baseline, Figures 7–10
//! of Bell et al., IPDPS 2006).

use super::Ctx;
use serde::Serialize;
use weft::Team;
use weft_ft::{Class, Ft, Model, Options, Report, Variant};

/// One configuration's report with its ratios to the exchange of the same model.
#[derive(Serialize)]
pub struct FtRow {
    suite: &'static str,
    #[serde(flatten)]
    report: Report,
    /// Total time / the exchange's total time (same model).
    time_vs_exchange: f64,
    /// Non-overlapped communication time / the exchange's (same model).
    comm_vs_exchange: f64,
    /// The copy floor: time for every rank at once to copy the bytes it sends, in pieces of
    /// the run's message size, from a cache-hot buffer into memory, s. On a fabric whose
    /// puts are CPU copies (shared memory) this bounds the initiation time from below.
    copy_floor_s: f64,
}

/// Runs every variant and model of `class`.
pub fn run(ctx: &Ctx, ft: &Ft, class: Class) -> Result<Vec<FtRow>, weft::Error> {
    let mut rows = vec![];
    let team = ctx.world.world_team()?;
    let mut dst = vec![];
    for model in Model::ALL {
        let mut exchange: Option<(f64, f64)> = None;
        for variant in Variant::ALL {
            ctx.progress.note(&format!("FT class {class} {variant} {model}"));
            let report = ft
                .run(&ctx.world, &Options::new(class, variant, model))
                .map_err(|e| weft::Error::Config(format!("ft {class} {variant} {model}: {e}")))?;
            let (t, c) = *exchange.get_or_insert((report.time_s, report.comm_s));
            let copy_floor_s = copy_floor(&team, &mut dst, report.bytes_per_rank, report.message_bytes)?;
            rows.push(FtRow {
                suite: "ft",
                copy_floor_s,
                time_vs_exchange: report.time_s / t,
                comm_vs_exchange: if c > 0.0 { report.comm_s / c } else { 0.0 },
                report,
            });
        }
    }
    Ok(rows)
}

/// Seconds for every member of `team` at once to copy `total` bytes in `piece`-byte pieces
/// from a hot source into a destination larger than the caches (the maximum over the
/// members). `dst` is the destination, kept across calls (its pages faulted in once).
fn copy_floor(team: &Team, dst: &mut Vec<u8>, total: u64, piece: f64) -> Result<f64, weft::Error> {
    let piece = (piece.round() as usize).max(1);
    if total == 0 {
        return Ok(0.0);
    }
    let src = vec![1u8; piece];
    let len = (256 << 20).min(total as usize).max(piece);
    if dst.len() < len {
        dst.resize(len, 2); // writes, so the pages are faulted in before timing
    }
    let slots = len / piece;
    team.barrier()?;
    let start = weft::fabric::os::now_ns();
    let mut left = total as usize;
    let mut slot = 0;
    while left > 0 {
        let n = piece.min(left);
        weft::fabric::copy::copy_slice(&mut dst[slot * piece..slot * piece + n], &src[..n]);
        std::hint::black_box(&mut *dst);
        slot = (slot + 1) % slots;
        left -= n;
    }
    let mine = (weft::fabric::os::now_ns() - start) as f64 * 1e-9;
    Ok(team.allreduce(&[mine], weft::ReduceOp::Max)?[0])
}

/// The table: one line per variant and model.
pub fn print_table(rows: &[FtRow]) {
    let Some(first) = rows.first() else { return };
    let [nx, ny, nz] = first.report.class.dims();
    println!(
        "\n== ft: NAS FT class {} ({nx}x{ny}x{nz}, {} iterations), {} ranks; comm = time inside communication calls (not overlapped) ==",
        first.report.class, first.report.iterations, first.report.ranks
    );
    println!(
        "{:<9} {:<10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>10} {:>10} {:>9}  verification",
        "variant",
        "model",
        "time s",
        "compute",
        "comm s",
        "init",
        "wait",
        "comm/exch",
        "time/exch",
        "copy floor",
        "msgs/rank",
        "msg size"
    );
    for r in rows {
        let p = &r.report;
        println!(
            "{:<9} {:<10} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.2}x {:>8.2}x {:>10.3} {:>10} {:>9}  {} ({:.0} Mop/s)",
            p.variant.name(),
            p.model.name(),
            p.time_s,
            p.compute_s,
            p.comm_s,
            p.initiation_s,
            p.completion_s,
            r.comm_vs_exchange,
            r.time_vs_exchange,
            r.copy_floor_s,
            p.messages_per_rank,
            super::report::size_name(p.message_bytes.round() as u64),
            p.verification.word(),
            p.mops
        );
    }
}

/// One JSON object per configuration.
pub fn print_json(rows: &[FtRow]) {
    for r in rows {
        println!("{}", serde_json::to_string(r).unwrap_or_default());
    }
}
