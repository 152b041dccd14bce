//! `weft bench shmem`: the OSU Micro-Benchmarks' OpenSHMEM programs built twice, against
//! weft (`weft cc`) and against Open MPI's OpenSHMEM (`oshcc`) when it is installed, run
//! alternately in one run (weft, Open MPI, weft, Open MPI ...), each of weft's figures beside
//! Open MPI's. Sources: `WEFT_OSU_SHMEM`, else `../shared/third_party/osu-openshmem` beside
//! this repository.

use super::report::{median, Row};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What an OSU program prints, and so how its rows read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `size latency(us)` lines.
    Latency,
    /// `size messages/s` lines.
    Rate,
    /// `name Mops/s latency` lines.
    Atomics,
    /// One latency (us).
    Single,
    /// `size compute init wait pure overlap%` lines (`pure`: the put's latency, us).
    Overlap,
}

/// The programs, their arguments, and whether they need exactly two PEs.
const PROGRAMS: [(&str, &str, Kind, bool); 14] = [
    ("put", "heap", Kind::Latency, true),
    ("get", "heap", Kind::Latency, true),
    ("put_nb", "heap", Kind::Latency, true),
    ("get_nb", "heap", Kind::Latency, true),
    ("put_mr", "heap", Kind::Rate, false),
    ("put_mr_nb", "heap", Kind::Rate, false),
    ("get_mr_nb", "heap", Kind::Rate, false),
    ("atomics", "heap", Kind::Atomics, false),
    ("barrier", "", Kind::Single, false),
    ("broadcast", "", Kind::Latency, false),
    ("collect", "", Kind::Latency, false),
    ("fcollect", "", Kind::Latency, false),
    ("reduce", "", Kind::Latency, false),
    ("put_overlap", "heap", Kind::Overlap, true),
];

const PEER: &str = "Open MPI OpenSHMEM";

/// One run's figures: row key (label, bytes) → (value, unit).
type Figures = BTreeMap<(String, u64), (f64, &'static str)>;

fn sources() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("WEFT_OSU_SHMEM") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/third_party/osu-openshmem"),
    };
    if dir.join("c/openshmem/osu_oshm_put.c").is_file() {
        Ok(dir)
    } else {
        Err(format!("no OSU OpenSHMEM sources in {} (set WEFT_OSU_SHMEM)", dir.display()))
    }
}

/// Builds OSU program `p` with `cc` (a command and its first arguments) into `out`.
fn build(cc: &[String], src: &Path, p: &str, out: &Path) -> Result<(), String> {
    let c = src.join("c");
    let o = Command::new(&cc[0])
        .args(&cc[1..])
        .args(["-O2", "-DPACKAGE_VERSION=\"7.4\"", "-I"])
        .arg(c.join("util"))
        .arg("-o")
        .arg(out)
        .arg(c.join(format!("openshmem/osu_oshm_{p}.c")))
        .arg(c.join("util/osu_util.c"))
        .arg(c.join("util/osu_util_pgas.c"))
        .arg("-lm")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cc[0]))?;
    if !o.status.success() {
        return Err(format!("{} osu_oshm_{p}: {}", cc[0], String::from_utf8_lossy(&o.stderr)));
    }
    Ok(())
}

/// Reads an OSU program's output.
fn parse(kind: Kind, out: &str) -> Figures {
    let mut f = Figures::new();
    let lines = out.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
    for l in lines {
        let w: Vec<&str> = l.split_whitespace().collect();
        let num = |i: usize| w.get(i).and_then(|x| x.parse::<f64>().ok());
        let size = w.first().and_then(|x| x.parse::<u64>().ok());
        match (kind, size) {
            (Kind::Latency, Some(b)) => num(1).map(|v| f.insert(("latency".into(), b), (v, "us"))),
            (Kind::Rate, Some(b)) => num(1).map(|v| f.insert(("rate".into(), b), (v / 1e6, "M/s"))),
            (Kind::Overlap, Some(b)) => {
                // The put's own latency (`shmem_putmem` then `shmem_quiet`) is a latency row;
                // the overlap is a percentage, at most 100 for both libraries.
                num(4).map(|v| f.insert(("latency".into(), b), (v, "us")));
                num(5).map(|v| f.insert(("overlap".into(), b), (v, "%")))
            }
            (Kind::Atomics, _) if w.len() >= 3 => {
                num(1).map(|v| f.insert((w[0].to_string(), 0), (v, "Mops/s")))
            }
            (Kind::Single, _) => num(0).map(|v| f.insert(("latency".into(), 0), (v, "us"))),
            _ => None,
        };
    }
    f
}

/// Runs a built program; its figures (Open MPI's OpenSHMEM may crash in `shmem_finalize`
/// after printing them: what it printed counts).
fn run_one(cmd: &mut Command, kind: Kind) -> Result<Figures, String> {
    let o = cmd.output().map_err(|e| format!("cannot start: {e}"))?;
    let f = parse(kind, &String::from_utf8_lossy(&o.stdout));
    if f.is_empty() {
        return Err(format!("no figures ({}): {}", o.status, String::from_utf8_lossy(&o.stderr)));
    }
    Ok(f)
}

/// The suite's rows: every OSU program, weft's median of `WEFT_SHMEM_ROUNDS` (2) runs beside
/// Open MPI's, the two alternating.
pub fn run(n: u32) -> Result<Vec<Row>, String> {
    let src = sources()?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the weft executable: {e}"))?;
    let dir = std::env::temp_dir().join(format!("weft-bench-shmem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let rounds: usize =
        std::env::var("WEFT_SHMEM_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(2).max(1);
    let weft_cc = vec![exe.display().to_string(), "cc".to_string()];
    let peer = Command::new("oshcc").arg("--showme:version").output().is_ok_and(|o| o.status.success());
    if !peer {
        eprintln!("weft bench shmem: no Open MPI OpenSHMEM (oshcc) here: weft's figures only");
    }
    let mut rows = vec![];
    for (p, arg, kind, two) in PROGRAMS {
        let pes = if two { 2 } else { n };
        let (wprog, oprog) = (dir.join(format!("weft-{p}")), dir.join(format!("ompi-{p}")));
        build(&weft_cc, &src, p, &wprog)?;
        let peer_built =
            peer && build(&["oshcc".to_string()], &src, p, &oprog).inspect_err(|e| eprintln!("{e}")).is_ok();
        let (mut mine, mut theirs): (Vec<Figures>, Vec<Figures>) = (vec![], vec![]);
        for _ in 0..rounds {
            let mut w = Command::new(&exe);
            w.args(["run", "-n", &pes.to_string(), "--raw", "--timeout", "300", "--"]).arg(&wprog);
            if !arg.is_empty() {
                w.arg(arg);
            }
            mine.push(run_one(&mut w, kind).map_err(|e| format!("osu_oshm_{p} on weft: {e}"))?);
            if peer_built {
                let mut o = Command::new("oshrun");
                o.args(["-np", &pes.to_string(), "--allow-run-as-root", "--oversubscribe"]).arg(&oprog);
                if !arg.is_empty() {
                    o.arg(arg);
                }
                match run_one(&mut o, kind) {
                    Ok(f) => theirs.push(f),
                    Err(e) => eprintln!("weft bench shmem: osu_oshm_{p} on Open MPI: {e}"),
                }
            }
        }
        for ((label, bytes), (_, unit)) in &mine[0] {
            let key = (label.clone(), *bytes);
            let value = median(mine.iter().filter_map(|f| f.get(&key).map(|v| v.0)).collect());
            let mut r = Row::new("shmem", format!("osu_oshm_{p} {label}"), *bytes, value, unit);
            r.extra = Some(serde_json::json!({ "pes": pes, "rounds": rounds }));
            let peer_vals: Vec<f64> = theirs.iter().filter_map(|f| f.get(&key).map(|v| v.0)).collect();
            if !peer_vals.is_empty() {
                r = r.vs(PEER, median(peer_vals));
            }
            rows.push(r);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    rows.extend(copy_limits());
    Ok(rows)
}

/// One core's `memcpy` between two cache-warm, page-aligned buffers, from 4 KiB to 4 MiB
/// (median of 5 batches per size), measured in the same run: a put or get of that size on
/// shared memory is such a copy, which neither library can beat with one core.
fn copy_limits() -> Vec<Row> {
    const PAGE: usize = 4096;
    let max = 4 << 20;
    let (mut src, mut dst) = (vec![1u8; max + PAGE], vec![0u8; max + PAGE]);
    let (s0, d0) = (src.as_ptr().align_offset(PAGE), dst.as_ptr().align_offset(PAGE));
    let (src, dst) = (&mut src[s0..s0 + max], &mut dst[d0..d0 + max]);
    let mut rows = vec![];
    let mut bytes = PAGE;
    while bytes <= max {
        let iters = ((256 << 20) / bytes).clamp(20, 20_000);
        let mut batches = vec![];
        for _ in 0..5 {
            let t = std::time::Instant::now();
            for _ in 0..iters {
                dst[..bytes].copy_from_slice(std::hint::black_box(&src[..bytes]));
                std::hint::black_box(&mut *dst);
            }
            batches.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
        }
        let mut r = Row::new("shmem", "memcpy (one core) latency", bytes as u64, median(batches), "us");
        r.extra = Some(serde_json::json!({ "pes": 1, "rounds": 5 }));
        rows.push(r);
        bytes *= 2;
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn osu_output_is_read() {
        let lat = "# OSU OpenSHMEM Put Test v7.4\n# Size            Latency (us)\n1                         0.04\n8      0.05\n";
        let f = parse(Kind::Latency, lat);
        assert_eq!(f.get(&("latency".into(), 8)), Some(&(0.05, "us")));
        assert_eq!(f.len(), 2);
        let at = "# Operation   Million ops/s   Latency (us)\nshmem_int_fadd  13.16  0.08\n";
        assert_eq!(parse(Kind::Atomics, at).get(&("shmem_int_fadd".into(), 0)), Some(&(13.16, "Mops/s")));
        assert_eq!(parse(Kind::Single, "# Avg Latency(us)\n            27.96\n").len(), 1);
        let ov = "# Size compute init wait pure overlap\n1  0.10  0.00  0.01  0.04  97.50\n";
        let f = parse(Kind::Overlap, ov);
        assert_eq!(f.get(&("latency".into(), 1)), Some(&(0.04, "us")));
        assert_eq!(f.get(&("overlap".into(), 1)), Some(&(97.5, "%")));
        let mr = "# Size  Messages/s\n8   8333333.33\n";
        assert_eq!(parse(Kind::Rate, mr).get(&("rate".into(), 8)).map(|v| v.1), Some("M/s"));
        assert!(parse(Kind::Latency, "garbage\n[vm:1] Caught signal 11\n").is_empty());
    }
}
