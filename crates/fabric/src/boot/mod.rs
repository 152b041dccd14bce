//! Start-up exchange for fabrics whose ranks cannot find each other on their own (network
//! fabrics): each rank contributes a few bytes (its endpoint address, host identity, ...) and
//! gets everyone's. The shared-memory fabric does not need it: its ranks meet in `/dev/shm`.
//!
//! Two implementations:
//! - [`LauncherBoot`]: `weft run` gives each rank one end of a Unix socket pair
//!   (`WEFT_BOOT_FD`) and answers all-gathers on the other ([`serve`]), as MPICH's Hydra does
//!   with `PMI_FD`. It works through any exec wrapper that keeps descriptors open (such as
//!   `ip netns exec`).
//! - `pmix::PmixBoot` (`mpirun`, `srun --mpi=pmix`), with the `pmix` feature.
//!
//! Frames are little-endian: a contribution is `len: u32, bytes`; an answer is `n: u32`, then
//! `n` contributions in rank order. Sizes are checked before anything is allocated.

#[cfg(feature = "pmix")]
pub mod pmix;

use crate::{FabricError, FabricResult, Rank};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::Duration;

/// Largest contribution of one rank to one all-gather.
pub const MAX_CONTRIBUTION: usize = 64 * 1024;

/// An out-of-band all-gather among the ranks of a job, used once at start-up.
pub trait Bootstrap: Send + Sync {
    /// This rank.
    fn rank(&self) -> Rank;
    /// Ranks in the job.
    fn size(&self) -> u32;
    /// Contributes `data` (at most [`MAX_CONTRIBUTION`] bytes) and returns every rank's
    /// contribution, in rank order. Collective: every rank calls it the same number of times.
    fn allgather(&self, data: &[u8]) -> FabricResult<Vec<Vec<u8>>>;
}

/// True when this process was started by a PMIx launcher (`mpirun`, `srun --mpi=pmix`): the
/// launcher's server told it its namespace and rank.
pub fn launched_by_pmix() -> bool {
    std::env::var_os("PMIX_NAMESPACE").is_some() && std::env::var_os("PMIX_RANK").is_some()
}

/// Ends the whole job with `status` (0-255) through its launcher: `weft run`, when it is this
/// process's parent (`WEFT_LAUNCHER_PID`); a PMIx launcher (`mpirun`, `srun --mpi=pmix`) for any
/// status, when weft was built with PMIx and started by one. False where neither can: the
/// caller ends its process, and the launcher learns of the job's end from a failure status
/// only (OpenSHMEM's `shmem_global_exit`).
pub fn ask_launcher_to_end_job(status: i32) -> bool {
    let launcher = std::env::var("WEFT_LAUNCHER_PID").ok().and_then(|v| v.parse::<u32>().ok());
    if let Some(pid) = launcher.filter(|&p| p == std::os::unix::process::parent_id()) {
        // The status travels with the signal, before this process begins to exit: the
        // launcher knows it before any rank that sees this one vanish can fail.
        return crate::os::ask_to_end(pid, status);
    }
    #[cfg(feature = "pmix")]
    if pmix::abort_job(status, &format!("weft: a rank ended the job with status {status}")) {
        return true;
    }
    false
}

/// Refuses a contribution larger than [`MAX_CONTRIBUTION`].
fn check_contribution(data: &[u8]) -> FabricResult<()> {
    if data.len() > MAX_CONTRIBUTION {
        return Err(FabricError::TooLarge {
            what: "start-up contribution",
            len: data.len(),
            max: MAX_CONTRIBUTION,
        });
    }
    Ok(())
}

fn io_err(what: &str, e: std::io::Error) -> FabricError {
    FabricError::Os { what: what.to_string(), errno: e.raw_os_error().unwrap_or(0) }
}

fn write_frame(s: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4 + data.len());
    buf.extend_from_slice(&(data.len() as u32).to_le_bytes());
    buf.extend_from_slice(data);
    s.write_all(&buf)
}

fn read_u32(s: &mut impl Read) -> std::io::Result<u32> {
    let mut w = [0u8; 4];
    s.read_exact(&mut w)?;
    Ok(u32::from_le_bytes(w))
}

fn read_frame(s: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let len = read_u32(s)? as usize;
    if len > MAX_CONTRIBUTION {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("start-up frame of {len} bytes (at most {MAX_CONTRIBUTION})"),
        ));
    }
    let mut v = vec![0; len];
    s.read_exact(&mut v)?;
    Ok(v)
}

/// The rank side of `weft run`'s start-up channel.
pub struct LauncherBoot {
    rank: Rank,
    size: u32,
    stream: Mutex<UnixStream>,
}

impl LauncherBoot {
    /// Opens the channel named by `WEFT_BOOT_FD`; `Ok(None)` when the variable is not set
    /// (the process was not started by `weft run`). Waits at most `timeout` for each answer.
    pub fn from_env(rank: Rank, size: u32, timeout: Duration) -> FabricResult<Option<Self>> {
        let Some(v) = std::env::var("WEFT_BOOT_FD").ok().filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let fd: i32 = v.trim().parse().map_err(|_| FabricError::Malformed {
            what: format!("WEFT_BOOT_FD={v:?}: expected a descriptor number"),
        })?;
        let stream = crate::os::unix_stream_from_fd(fd)?;
        stream.set_read_timeout(Some(timeout)).map_err(|e| io_err("start-up channel timeout", e))?;
        Ok(Some(LauncherBoot { rank, size, stream: Mutex::new(stream) }))
    }
}

impl Bootstrap for LauncherBoot {
    fn rank(&self) -> Rank {
        self.rank
    }
    fn size(&self) -> u32 {
        self.size
    }
    fn allgather(&self, data: &[u8]) -> FabricResult<Vec<Vec<u8>>> {
        check_contribution(data)?;
        let mut s = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let lost = |e: std::io::Error| FabricError::Peer {
            rank: self.rank,
            reason: format!(
                "start-up exchange through the launcher failed ({e}): did a rank die or not start?"
            ),
        };
        write_frame(&mut *s, data).map_err(lost)?;
        let n = read_u32(&mut *s).map_err(lost)?;
        if n != self.size {
            return Err(FabricError::Mismatch {
                what: format!("launcher answered for {n} ranks, job has {}", self.size),
            });
        }
        (0..n).map(|_| read_frame(&mut *s).map_err(lost)).collect()
    }
}

/// The exchange of a job of one rank: nothing to exchange.
pub struct Solo;

impl Bootstrap for Solo {
    fn rank(&self) -> Rank {
        0
    }
    fn size(&self) -> u32 {
        1
    }
    fn allgather(&self, data: &[u8]) -> FabricResult<Vec<Vec<u8>>> {
        Ok(vec![data.to_vec()])
    }
}

/// The launcher side: answers the all-gathers of the ranks connected through `streams`
/// (index = rank) until one of them closes its end. Runs on its own thread.
pub fn serve(mut streams: Vec<UnixStream>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || loop {
        let mut round = Vec::with_capacity(streams.len());
        for s in streams.iter_mut() {
            match read_frame(s) {
                Ok(v) => round.push(v),
                // A rank finished or died: the exchange is over. Dropping the streams makes
                // the others' reads fail at once instead of waiting for their timeout.
                Err(_) => return,
            }
        }
        let mut answer = (round.len() as u32).to_le_bytes().to_vec();
        for v in &round {
            answer.extend_from_slice(&(v.len() as u32).to_le_bytes());
            answer.extend_from_slice(v);
        }
        for s in streams.iter_mut() {
            if s.write_all(&answer).is_err() {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allgather_through_the_launcher_protocol() {
        let (mut ours, theirs): (Vec<_>, Vec<_>) = (0..3).map(|_| UnixStream::pair().unwrap()).unzip();
        let server = serve(theirs);
        let ranks: Vec<_> = ours
            .drain(..)
            .enumerate()
            .map(|(r, s)| LauncherBoot { rank: r as u32, size: 3, stream: Mutex::new(s) })
            .collect();
        let got: Vec<_> = std::thread::scope(|sc| {
            let hs: Vec<_> = ranks
                .iter()
                .map(|b| {
                    sc.spawn(move || (b.allgather(&[b.rank as u8; 5]).unwrap(), b.allgather(&[]).unwrap()))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (a, b) in got {
            assert_eq!(a, vec![vec![0u8; 5], vec![1; 5], vec![2; 5]]);
            assert_eq!(b, vec![Vec::<u8>::new(); 3]);
        }
        drop(ranks);
        server.join().unwrap();
    }

    #[test]
    fn oversized_frames_are_refused_before_allocation() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&u32::MAX.to_le_bytes()).unwrap();
        assert!(read_frame(&mut b).is_err());
    }

    #[test]
    fn a_rank_that_leaves_ends_the_exchange_for_the_others() {
        let (ours, theirs): (Vec<_>, Vec<_>) = (0..2).map(|_| UnixStream::pair().unwrap()).unzip();
        let server = serve(theirs);
        let mut it = ours.into_iter();
        let first = LauncherBoot { rank: 0, size: 2, stream: Mutex::new(it.next().unwrap()) };
        drop(it.next());
        assert!(matches!(first.allgather(b"x"), Err(FabricError::Peer { .. })));
        server.join().unwrap();
    }
}
