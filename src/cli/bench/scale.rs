//! `weft bench scale`: how weft grows with the ranks of one node. For each N (2 to 64 by
//! default, `WEFT_SCALE_RANKS=2,4,...` to choose), in turns with Open MPI's `mpirun` running the
//! same programs (when the `mpi` feature is built and `mpirun` runs):
//!
//! - start-up: the wall time of `weft run -n N` of a program that initialises, meets at a
//!   barrier and finalizes (`mpirun -n N` of its MPI twin);
//! - shared memory per rank: what `/dev/shm` holds while the job runs, less what it held
//!   before, divided by N;
//! - the empty AM round trip between rank 0 and rank N-1 (MPI: a 0-byte send/receive
//!   ping-pong), and the barrier, timed inside a second job;
//! - in that job, the shared memory a team of every rank adds per rank (MPI: a duplicate of
//!   `MPI_COMM_WORLD`) and that team's barrier.
//!
//! Beyond the cores the ranks are oversubscribed (weft stops spinning in waits then; Open MPI
//! runs with `--oversubscribe`, which makes its waits yield).

use super::report::Row;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ranks measured unless `WEFT_SCALE_RANKS` says otherwise.
const DEFAULT_RANKS: &[u32] = &[2, 4, 8, 16, 32, 64];
/// Longest a job of this suite may run.
const JOB_TIMEOUT_S: u32 = 300;

/// What one job measured (its rank 0 writes it).
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Probe {
    /// Bytes `/dev/shm` holds beyond what it held before the job, while every rank runs.
    pub shm_bytes: f64,
    /// Mean round trip between rank 0 and the last rank, ns.
    pub rtt_ns: f64,
    /// Mean barrier, ns.
    pub barrier_ns: f64,
    /// Bytes per rank `/dev/shm` holds beyond `shm_bytes` once a team of every rank exists
    /// (weft's `world_team`; MPI: a duplicate of `MPI_COMM_WORLD`).
    #[serde(default)]
    pub team_shm_bytes: f64,
    /// Mean barrier of that team, ns.
    #[serde(default)]
    pub team_barrier_ns: f64,
}

/// Bytes in use on the file system of `/dev/shm`.
fn shm_used() -> Result<u64, String> {
    weft::fabric::os::fs_used_bytes(Path::new("/dev/shm")).map_err(|e| format!("/dev/shm: {e}"))
}

/// Round trips and barriers of one job: fewer when the ranks outnumber the cores.
fn iterations(n: u32) -> (u32, u32) {
    let cores = std::thread::available_parallelism().map_or(2, |c| c.get()) as u32;
    if n > cores {
        (50, 10)
    } else {
        (1000, 200)
    }
}

/// What a rank of the start-up job or of the measuring job does (`weft __rank __scale`).
pub fn weft_rank(out: Option<&Path>) -> Result<(), weft::Error> {
    let mut b = weft::World::builder();
    let pongs = Arc::new(AtomicU64::new(0));
    let p = pongs.clone();
    let pong = b.handler("scale.pong", move |_| {
        p.fetch_add(1, Ordering::Release);
    });
    let ping = b.handler("scale.ping", move |m| m.reply_short(pong, &[]).expect("reply"));
    let w = b.init()?;
    w.barrier()?;
    let Some(out) = out else { return Ok(()) };
    let (me, last) = (w.rank(), w.size() - 1);
    let mut probe = Probe::default();
    if me == 0 {
        let base: u64 = std::env::var("WEFT_SCALE_SHM_BASE").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        let used = shm_used().map_err(weft::Error::Config)?;
        probe.shm_bytes = used.saturating_sub(base) as f64 / w.size() as f64;
    }
    w.barrier()?;
    let (trips, barriers) = iterations(w.size());
    if me == 0 && last > 0 {
        for round in 0..2 {
            let t = Instant::now();
            for _ in 0..trips {
                let before = pongs.load(Ordering::Acquire);
                w.am_request_short(last, ping, &[])?;
                w.wait_until(|| pongs.load(Ordering::Acquire) > before)?;
            }
            // The first round warms up.
            if round == 1 {
                probe.rtt_ns = t.elapsed().as_nanos() as f64 / trips as f64;
            }
        }
    }
    w.barrier()?;
    let t = Instant::now();
    for _ in 0..barriers {
        w.barrier()?;
    }
    probe.barrier_ns = t.elapsed().as_nanos() as f64 / barriers as f64;
    let team = w.world_team()?;
    team.barrier()?;
    if me == 0 {
        let base: u64 = std::env::var("WEFT_SCALE_SHM_BASE").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        let used = shm_used().map_err(weft::Error::Config)?;
        probe.team_shm_bytes = used.saturating_sub(base) as f64 / w.size() as f64 - probe.shm_bytes;
    }
    team.barrier()?;
    let t = Instant::now();
    for _ in 0..barriers {
        team.barrier()?;
    }
    probe.team_barrier_ns = t.elapsed().as_nanos() as f64 / barriers as f64;
    if me == 0 {
        write_probe(out, &probe).map_err(weft::Error::Config)?;
    }
    w.barrier()
}

fn write_probe(out: &Path, p: &Probe) -> Result<(), String> {
    let text = serde_json::to_string(p).map_err(|e| e.to_string())?;
    std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))
}

fn read_probe(out: &Path) -> Result<Probe, String> {
    let text = std::fs::read_to_string(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let _ = std::fs::remove_file(out);
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", out.display()))
}

/// Runs `cmd` to its end; its wall time, or why it failed.
fn timed(mut cmd: Command) -> Result<Duration, String> {
    let t = Instant::now();
    let status = cmd.stdout(Stdio::null()).status().map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let wall = t.elapsed();
    if !status.success() {
        return Err(format!("{:?} failed ({status})", cmd.get_program()));
    }
    Ok(wall)
}

/// How one library starts its jobs: `weft run` or `mpirun`.
#[derive(Clone, Copy, PartialEq)]
enum Launcher {
    Weft,
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Mpi,
}

impl Launcher {
    fn command(self, exe: &Path, n: u32, out: Option<&Path>) -> Command {
        let mut c = match self {
            Launcher::Weft => {
                let mut c = Command::new(exe);
                c.args(["run", "-n", &n.to_string(), "--timeout", &JOB_TIMEOUT_S.to_string(), "--"]).arg(exe);
                c.args(["__rank", "__scale"]);
                c
            }
            Launcher::Mpi => {
                let mut c = Command::new("mpirun");
                c.args(["-n", &n.to_string(), "--oversubscribe", "--allow-run-as-root", "--timeout"])
                    .arg(JOB_TIMEOUT_S.to_string())
                    .arg(exe)
                    .args(["__rank", "__mpi-scale"]);
                c
            }
        };
        if let Some(out) = out {
            c.arg("--out").arg(out);
        }
        c
    }

    /// Start-up time, then what the measuring job saw.
    fn point(self, exe: &Path, n: u32) -> Result<(Duration, Probe), String> {
        let startup = timed(self.command(exe, n, None))?;
        let out = std::env::temp_dir().join(format!("weft-scale-{}-{n}.json", std::process::id()));
        let mut c = self.command(exe, n, Some(&out));
        c.env("WEFT_SCALE_SHM_BASE", shm_used()?.to_string());
        timed(c)?;
        Ok((startup, read_probe(&out)?))
    }
}

/// Whether Open MPI can be the peer: built with `mpi` and `mpirun` starts.
fn mpi_available() -> bool {
    cfg!(feature = "mpi")
        && Command::new("mpirun")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
}

fn rank_counts() -> Result<Vec<u32>, String> {
    match std::env::var("WEFT_SCALE_RANKS") {
        Err(_) => Ok(DEFAULT_RANKS.to_vec()),
        Ok(v) => v
            .split(',')
            .map(|s| s.trim().parse::<u32>().ok().filter(|&n| (1..=1024).contains(&n)))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| format!("WEFT_SCALE_RANKS={v:?}: expected rank counts 1-1024, comma-separated")),
    }
}

/// Runs the suite from the launcher's side; returns its rows.
pub fn run() -> Result<Vec<Row>, String> {
    let exe: PathBuf =
        std::env::current_exe().map_err(|e| format!("cannot find the weft executable: {e}"))?;
    let mpi = mpi_available();
    if !mpi {
        eprintln!(
            "weft bench scale: no Open MPI beside weft (build with --features mpi, install openmpi-bin)"
        );
    }
    let mut rows = vec![];
    for n in rank_counts()? {
        let (startup, p) = Launcher::Weft.point(&exe, n)?;
        let peer = if mpi {
            Launcher::Mpi
                .point(&exe, n)
                .inspect_err(|e| eprintln!("weft bench scale: mpirun -n {n}: {e}"))
                .ok()
        } else {
            None
        };
        let row = |kind: &str, metric: String, value: f64, unit: &'static str, peer: Option<f64>| {
            let mut r = Row::new("scale", metric, 0, value, unit);
            r.extra = Some(serde_json::json!({ "kind": kind, "ranks": n }));
            match peer {
                Some(v) => r.vs("Open MPI (mpirun)", v),
                None => r,
            }
        };
        rows.push(row(
            "startup",
            format!("start-up, init+barrier+exit, {n} ranks"),
            startup.as_secs_f64() * 1e3,
            "ms",
            peer.map(|(s, _)| s.as_secs_f64() * 1e3),
        ));
        rows.push(row(
            "shm",
            format!("/dev/shm per rank, {n} ranks"),
            p.shm_bytes / 1024.0,
            "KiB",
            peer.map(|(_, q)| q.shm_bytes / 1024.0),
        ));
        if n > 1 {
            rows.push(row(
                "rtt",
                format!("round trip rank 0 - {}, {n} ranks", n - 1),
                p.rtt_ns / 1e3,
                "us",
                peer.map(|(_, q)| q.rtt_ns / 1e3),
            ));
        }
        rows.push(row(
            "barrier",
            format!("barrier, {n} ranks"),
            p.barrier_ns / 1e3,
            "us",
            peer.map(|(_, q)| q.barrier_ns / 1e3),
        ));
        rows.push(row(
            "team_shm",
            format!("/dev/shm per rank for a team of all, {n} ranks"),
            p.team_shm_bytes / 1024.0,
            "KiB",
            peer.map(|(_, q)| q.team_shm_bytes / 1024.0),
        ));
        rows.push(row(
            "team_barrier",
            format!("team barrier, {n} ranks"),
            p.team_barrier_ns / 1e3,
            "us",
            peer.map(|(_, q)| q.team_barrier_ns / 1e3),
        ));
    }
    Ok(rows)
}

/// One MPI process of the suite's Open MPI twin (`weft __rank __mpi-scale`).
#[cfg(feature = "mpi")]
pub fn mpi_rank(out: Option<&Path>) -> Result<(), String> {
    use mpi::traits::*;
    let universe = mpi::initialize().ok_or("MPI is already initialised")?;
    let world = universe.world();
    world.barrier();
    let Some(out) = out else { return Ok(()) };
    let (me, n) = (world.rank(), world.size());
    let last = n - 1;
    let mut probe = Probe::default();
    if me == 0 {
        let base: u64 = std::env::var("WEFT_SCALE_SHM_BASE").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        probe.shm_bytes = shm_used()?.saturating_sub(base) as f64 / n as f64;
    }
    world.barrier();
    let (trips, barriers) = iterations(n as u32);
    let empty: [u8; 0] = [];
    let mut sink: [u8; 0] = [];
    for round in 0..2 {
        let t = Instant::now();
        if last > 0 && (me == 0 || me == last) {
            let other = world.process_at_rank(if me == 0 { last } else { 0 });
            for _ in 0..trips {
                if me == 0 {
                    other.send(&empty[..]);
                    other.receive_into(&mut sink[..]);
                } else {
                    other.receive_into(&mut sink[..]);
                    other.send(&empty[..]);
                }
            }
        }
        if round == 1 {
            probe.rtt_ns = t.elapsed().as_nanos() as f64 / trips as f64;
        }
    }
    world.barrier();
    let t = Instant::now();
    for _ in 0..barriers {
        world.barrier();
    }
    probe.barrier_ns = t.elapsed().as_nanos() as f64 / barriers as f64;
    let team = world.duplicate();
    team.barrier();
    if me == 0 {
        let base: u64 = std::env::var("WEFT_SCALE_SHM_BASE").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        probe.team_shm_bytes = shm_used()?.saturating_sub(base) as f64 / n as f64 - probe.shm_bytes;
    }
    team.barrier();
    let t = Instant::now();
    for _ in 0..barriers {
        team.barrier();
    }
    probe.team_barrier_ns = t.elapsed().as_nanos() as f64 / barriers as f64;
    if me == 0 {
        write_probe(out, &probe)?;
    }
    world.barrier();
    Ok(())
}
