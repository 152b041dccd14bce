//! A rank's claim on its place in a job: an abstract Unix socket named after the job and the
//! rank, bound for as long as the rank's fabric lives. The kernel releases the name when the
//! process ends, however it ends, so a claim never outlives its holder and leaves no file.
//!
//! A second process started as the same rank finds the name bound: it connects, which tells
//! the holder, and fails at once; the holder fails at its next check ([`Claim::check`], made
//! with the peer checks of every wait). The kernel records who connected (`SO_PEERCRED`), so
//! a process of another user can neither pose as a duplicate nor hold the name unnoticed.

use crate::os;
use crate::{FabricError, FabricResult};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU32, Ordering};

/// Connections from other users taken off the queue per check, at most.
const STRANGERS_PER_CHECK: usize = 16;

pub struct Claim {
    /// `None` where this system has no abstract sockets: duplicates are then found only
    /// during start-up (by the inbox, created exclusively).
    listener: Option<UnixListener>,
    /// Pid of a process of ours that claimed the same rank (0: none yet).
    by: AtomicU32,
    rank: u32,
    job: String,
}

fn address(job: &str, rank: u32) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("weft-{job}-{rank}").as_bytes())
}

fn duplicate(pid: u32, rank: u32, job: &str) -> FabricError {
    FabricError::Mismatch {
        what: format!(
            "process {pid} started as rank {rank} of job {job} too: two processes started with the same WEFT_RANK?"
        ),
    }
}

impl Claim {
    /// Claims rank `rank` of job `job`, or fails if a live process holds it.
    pub fn take(job: &str, rank: u32) -> FabricResult<Claim> {
        let unclaimed = Claim { listener: None, by: AtomicU32::new(0), rank, job: job.to_string() };
        let Ok(addr) = address(job, rank) else {
            return Ok(unclaimed);
        };
        let err = match UnixListener::bind_addr(&addr) {
            Ok(l) => {
                l.set_nonblocking(true).map_err(|e| os_error("claim socket", e))?;
                return Ok(Claim { listener: Some(l), ..unclaimed });
            }
            Err(e) => e,
        };
        if err.kind() != std::io::ErrorKind::AddrInUse {
            return Ok(unclaimed);
        }
        // Held: say so to the holder (connecting is the message) and fail.
        let holder = UnixStream::connect_addr(&addr).map(|s| os::peer_credentials(&s));
        match holder {
            Ok(Ok((pid, uid))) if uid == os::euid() => Err(FabricError::Mismatch {
                what: format!(
                    "rank {rank} of job {job} is taken by process {pid}: two processes started with the same WEFT_RANK?"
                ),
            }),
            Ok(Ok((pid, uid))) => Err(FabricError::Untrusted {
                what: format!(
                    "rank {rank} of job {job}: its claim (abstract socket @weft-{job}-{rank}) is held by \
                     process {pid} of user {uid}, not ours"
                ),
            }),
            Ok(Err(e)) => Err(e),
            // The holder ended between our bind and connect: its name is free now.
            Err(_) => Claim::take_once_more(job, rank, &addr),
        }
    }

    fn take_once_more(job: &str, rank: u32, addr: &SocketAddr) -> FabricResult<Claim> {
        let l = UnixListener::bind_addr(addr).map_err(|e| os_error("claim socket", e))?;
        l.set_nonblocking(true).map_err(|e| os_error("claim socket", e))?;
        Ok(Claim { listener: Some(l), by: AtomicU32::new(0), rank, job: job.to_string() })
    }

    /// Fails once a process of ours has started as this rank too. Connections from other
    /// users are dropped unheeded.
    pub fn check(&self) -> FabricResult<()> {
        let by = self.by.load(Ordering::Relaxed);
        if by != 0 {
            return Err(duplicate(by, self.rank, &self.job));
        }
        let Some(l) = &self.listener else {
            return Ok(());
        };
        for _ in 0..STRANGERS_PER_CHECK {
            let Ok((s, _)) = l.accept() else {
                return Ok(());
            };
            if let Ok((pid, uid)) = os::peer_credentials(&s) {
                if uid == os::euid() && pid != 0 {
                    self.by.store(pid, Ordering::Relaxed);
                    return Err(duplicate(pid, self.rank, &self.job));
                }
            }
        }
        Ok(())
    }
}

fn os_error(what: &str, e: std::io::Error) -> FabricError {
    FabricError::Os { what: what.into(), errno: e.raw_os_error().unwrap_or(0) }
}

#[cfg(test)]
mod tests {
    use super::Claim;

    #[test]
    fn a_second_claim_fails_and_the_holder_hears_of_it() {
        let job = format!("claimtest{}", std::process::id());
        let first = Claim::take(&job, 3).unwrap();
        first.check().unwrap();
        // The same process stands in for a second one: the kernel reports our own pid.
        let second = Claim::take(&job, 3).err().expect("a second claim of rank 3 must fail");
        assert!(second.to_string().contains("same WEFT_RANK"), "{second}");
        let heard = first.check().expect_err("the holder must hear of the second claim");
        assert!(heard.to_string().contains(&std::process::id().to_string()), "{heard}");
        // Sticky: every later check fails too.
        assert!(first.check().is_err());
        // Another rank of the job is free.
        Claim::take(&job, 4).unwrap().check().unwrap();
        // A released claim can be taken again.
        drop(first);
        Claim::take(&job, 3).unwrap();
    }
}
