//! A rank's claim on its place in a job: an abstract Unix socket named after the job and the
//! rank, bound for as long as the rank's fabric lives. The kernel releases the name when the
//! process ends, however it ends, so a claim never outlives its holder and leaves no file.
//!
//! A second process started as the same rank finds the name bound: it connects, which tells
//! the holder, and fails at once. The holder's watcher thread, blocked in `accept`, hears it
//! at once, once the newcomer has said which claim it wants (a process of ours that connects
//! and says nothing, or something else, changes nothing): it marks the claim lost ([`Claim::check`] fails from then on) and sounds the
//! alarm the runtime set ([`crate::Fabric::set_alarm`]), so the holder fails at its next
//! wait, however short. The kernel records who connected (`SO_PEERCRED`), so a process of
//! another user can neither pose as a duplicate nor hold the name unnoticed.

use crate::os;
use crate::{Alarm, FabricError, FabricResult};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the holder and its watcher thread share.
struct Shared {
    /// Pid of a process of ours that claimed the same rank (0: none yet).
    by: AtomicU32,
    /// Set when the claim is dropped: the watcher ends.
    closing: AtomicBool,
    alarm: Mutex<Option<Alarm>>,
    rank: u32,
    job: String,
}

impl Shared {
    fn lost(&self) -> Option<FabricError> {
        let by = self.by.load(Ordering::Acquire);
        (by != 0).then(|| duplicate(by, self.rank, &self.job))
    }
}

pub struct Claim {
    shared: Arc<Shared>,
    /// `None` where this system has no abstract sockets: duplicates are then found only
    /// during start-up (by the inbox, created exclusively).
    listener: Option<Arc<UnixListener>>,
    watcher: Option<JoinHandle<()>>,
}

fn address(job: &str, rank: u32) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(crate::names::claim_name(job, rank).as_bytes())
}

fn duplicate(pid: u32, rank: u32, job: &str) -> FabricError {
    FabricError::Mismatch {
        what: format!(
            "process {pid} started as rank {rank} of job {job} too: two processes started with the same WEFT_RANK?"
        ),
    }
}

fn os_error(what: &str, e: std::io::Error) -> FabricError {
    FabricError::Os { what: what.into(), errno: e.raw_os_error().unwrap_or(0) }
}

/// What a second process started as the rank says to the holder: the claim's name.
fn greeting(job: &str, rank: u32) -> Vec<u8> {
    let mut g = crate::names::claim_name(job, rank).into_bytes();
    g.push(b'\n');
    g
}

/// Whether the process at the other end of `s` says, within a second, that it claims this
/// rank too.
fn says_duplicate(s: &UnixStream, job: &str, rank: u32) -> bool {
    let want = greeting(job, rank);
    let mut got = Vec::with_capacity(want.len());
    // One second in all, however the bytes are spread: a connection that dribbles holds the
    // watcher no longer than one that says nothing.
    let end = std::time::Instant::now() + Duration::from_secs(1);
    while got.len() < want.len() {
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return false;
        }
        let mut buf = [0u8; 64];
        let take = (want.len() - got.len()).min(buf.len());
        match std::io::Read::read(&mut &*s, &mut buf[..take]) {
            Ok(0) | Err(_) => return false,
            Ok(k) => got.extend_from_slice(&buf[..k]),
        }
    }
    got == want
}

/// The watcher: waits for connections until the claim closes; the first from a process of
/// this user that says it claims the rank marks the claim lost and sounds the alarm. Other
/// connections (other users', or a process that says anything else) are dropped unheeded.
fn watch(listener: Arc<UnixListener>, shared: Arc<Shared>) {
    let me = os::euid();
    loop {
        let conn = listener.accept();
        if shared.closing.load(Ordering::Acquire) {
            return;
        }
        let Ok((s, _)) = conn else {
            // Out of descriptors or memory, say: try again shortly.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        match os::peer_credentials(&s) {
            Ok((pid, uid)) if uid == me && pid != 0 && says_duplicate(&s, &shared.job, shared.rank) => {
                shared.by.store(pid, Ordering::Release);
                let alarm = shared.alarm.lock().unwrap_or_else(|e| e.into_inner());
                if let (Some(alarm), Some(e)) = (alarm.as_ref(), shared.lost()) {
                    alarm(e);
                }
                return;
            }
            _ => {}
        }
    }
}

impl Claim {
    /// Claims rank `rank` of job `job`, or fails if a live process holds it.
    pub fn take(job: &str, rank: u32) -> FabricResult<Claim> {
        let shared = Arc::new(Shared {
            by: AtomicU32::new(0),
            closing: AtomicBool::new(false),
            alarm: Mutex::new(None),
            rank,
            job: job.to_string(),
        });
        let Ok(addr) = address(job, rank) else {
            return Ok(Claim { shared, listener: None, watcher: None });
        };
        let listener = match UnixListener::bind_addr(&addr) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => match held(job, rank, &addr) {
                // The holder ended between our bind and connect: its name is free now.
                Ok(()) => UnixListener::bind_addr(&addr).map_err(|e| os_error("claim socket", e))?,
                Err(e) => return Err(e),
            },
            Err(_) => return Ok(Claim { shared, listener: None, watcher: None }),
        };
        let listener = Arc::new(listener);
        let (l, s) = (listener.clone(), shared.clone());
        let builder = std::thread::Builder::new().name(format!("weft-claim-{rank}")).stack_size(64 << 10);
        let watcher = crate::signals::spawn_quiet(builder, move || watch(l, s))
            .map_err(|e| os_error("starting the claim's watcher thread", e))?;
        Ok(Claim { shared, listener: Some(listener), watcher: Some(watcher) })
    }

    /// Fails once a process of ours has started as this rank too.
    pub fn check(&self) -> FabricResult<()> {
        self.shared.lost().map_or(Ok(()), Err)
    }

    /// Sets what the watcher calls when the claim is lost (at once if it is lost already).
    pub fn set_alarm(&self, alarm: Alarm) {
        let mut slot = self.shared.alarm.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = self.shared.lost() {
            alarm(e);
        }
        *slot = Some(alarm);
    }
}

/// Rank `rank` of job `job` is held: say so to the holder (connecting is the message) and
/// fail; `Ok` if nobody answers (the holder has just ended).
fn held(job: &str, rank: u32, addr: &SocketAddr) -> FabricResult<()> {
    let Ok(s) = UnixStream::connect_addr(addr) else {
        return Ok(());
    };
    let (pid, uid) = os::peer_credentials(&s)?;
    if uid == os::euid() {
        let _ = std::io::Write::write_all(&mut &s, &greeting(job, rank));
        return Err(FabricError::Mismatch {
            what: format!(
                "rank {rank} of job {job} is taken by process {pid}: two processes started with the same WEFT_RANK?"
            ),
        });
    }
    Err(FabricError::Untrusted {
        what: format!(
            "rank {rank} of job {job}: its claim (abstract socket @{}) is held by \
             process {pid} of user {uid}, not ours",
            crate::names::claim_name(job, rank)
        ),
    })
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        if let Some(l) = &self.listener {
            // Wakes the watcher from `accept` (which then fails).
            os::shutdown_socket(l);
        }
        if let Some(w) = self.watcher.take() {
            // Not from the watcher itself (an alarm that let go of the last handle to a world).
            if w.thread().id() != std::thread::current().id() {
                let _ = w.join();
            }
        }
    }
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
        let t = std::time::Instant::now();
        while first.check().is_ok() && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let heard = first.check().expect_err("the holder must hear of the second claim");
        assert!(heard.to_string().contains(&std::process::id().to_string()), "{heard}");
        // Sticky: every later check fails too.
        assert!(first.check().is_err());
        // A process of ours that connects and says nothing, or something else, is no claim.
        let other = format!("{job}x");
        let holder = Claim::take(&other, 3).unwrap();
        let addr = super::address(&other, 3).unwrap();
        for says in [&b""[..], b"hello\n"] {
            let s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
            std::io::Write::write_all(&mut &s, says).unwrap();
            // The watcher closes the connection once it has judged it (within a second).
            assert_eq!(std::io::Read::read(&mut &s, &mut [0u8; 8]).unwrap_or(0), 0);
            holder.check().expect("a connection that does not claim the rank is no duplicate");
        }
        // A real duplicate after them is still heard: the watcher went on.
        assert!(Claim::take(&other, 3).is_err());
        let t = std::time::Instant::now();
        while holder.check().is_ok() && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let heard = holder.check().expect_err("the duplicate after the strangers must be heard");
        assert!(heard.to_string().contains("same WEFT_RANK"), "{heard}");
        // Another rank of the job is free.
        Claim::take(&job, 4).unwrap().check().unwrap();
        // A released claim can be taken again.
        drop(first);
        Claim::take(&job, 3).unwrap();
    }
}
