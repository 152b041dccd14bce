//! Open MPI's collectives for the `coll` suite (cargo feature `mpi`): the same driver as
//! weft's, run by `weft __mpi-coll` under `mpirun` before the weft ranks start. weft starts
//! in the same processes (through PMIx) and the two libraries' timed runs alternate; where it
//! cannot, Open MPI is measured alone and the weft ranks measure weft afterwards.

use super::coll::{measure, measure_interleaved, CollBackend, PeerResults, WeftColl, PEER_FILE_VAR};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::Command;

struct MpiColl {
    world: SimpleCommunicator,
    out_f: Vec<f64>,
    out_b: Vec<u8>,
}

impl CollBackend for MpiColl {
    type Error = Infallible;
    fn size(&self) -> usize {
        self.world.size() as usize
    }
    fn barrier(&mut self) -> Result<(), Infallible> {
        self.world.barrier();
        Ok(())
    }
    fn broadcast(&mut self, buf: &mut [u8]) -> Result<(), Infallible> {
        self.world.process_at_rank(0).broadcast_into(buf);
        Ok(())
    }
    fn allreduce(&mut self, data: &[f64]) -> Result<(), Infallible> {
        self.out_f.resize(data.len(), 0.0);
        self.world.all_reduce_into(data, &mut self.out_f[..], SystemOperation::sum());
        Ok(())
    }
    fn alltoall(&mut self, data: &[u8]) -> Result<(), Infallible> {
        self.out_b.resize(data.len(), 0);
        self.world.all_to_all_into(data, &mut self.out_b[..]);
        Ok(())
    }
    fn max(&mut self, v: f64) -> Result<f64, Infallible> {
        let mut out = 0.0;
        self.world.all_reduce_into(&v, &mut out, SystemOperation::max());
        Ok(out)
    }
    fn sum(&mut self, v: f64) -> Result<f64, Infallible> {
        let mut out = 0.0;
        self.world.all_reduce_into(&v, &mut out, SystemOperation::sum());
        Ok(out)
    }
}

/// One MPI process of `weft __rank __mpi-coll OUT`: measures, and rank 0 writes the results to OUT.
pub fn worker(out: &Path) -> Result<(), String> {
    // As the weft ranks do: buffers are timed warm, not on page faults.
    weft::fabric::os::keep_freed_memory();
    let universe = mpi::initialize().ok_or("MPI is already initialised")?;
    let world = universe.world();
    let library = mpi::environment::library_version()
        .map(|v| v.trim_end_matches('\0').split(',').next().unwrap_or("MPI").trim().to_string())
        .unwrap_or_else(|_| "MPI".into());
    let rank = world.rank();
    let mut b = MpiColl { world, out_f: vec![], out_b: vec![] };
    // weft beside it (declared after `universe`, so finalized before MPI is).
    let weft_world = weft::World::init();
    let (samples, weft) = match &weft_world {
        Ok(w) => {
            let mut ours = WeftColl::new(w).map_err(|e| e.to_string())?;
            measure_interleaved(&mut b, &mut ours)?
        }
        Err(e) => {
            if rank == 0 {
                eprintln!("weft bench coll: weft cannot start under mpirun ({e}); timing Open MPI alone");
            }
            let Ok(samples) = measure(&mut b, |_| {});
            (samples, vec![])
        }
    };
    if rank == 0 {
        let text =
            serde_json::to_string(&PeerResults { library, samples, weft }).map_err(|e| e.to_string())?;
        std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(())
}

/// Runs the MPI side with `n` processes under `mpirun`; returns the environment that hands
/// its results to the weft ranks, or why there are none.
pub fn measure_peer(n: u32) -> Result<(String, String), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out: PathBuf = std::env::temp_dir().join(format!("weft-mpi-coll-{}.json", std::process::id()));
    let status = Command::new("mpirun")
        .args(["-n", &n.to_string(), "--oversubscribe", "--allow-run-as-root"])
        .arg(&exe)
        .args(["__rank", "__mpi-coll"])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run mpirun: {e}"))?;
    if !status.success() || !out.exists() {
        return Err(format!("mpirun failed ({status})"));
    }
    Ok((PEER_FILE_VAR.to_string(), out.display().to_string()))
}
