//! Thin, safe wrappers over the operating-system calls weft needs: shared-memory files,
//! futexes, process liveness and signals. Every `unsafe` block here has its `// SAFETY:` note.

use crate::{FabricError, FabricResult};
use std::ffi::CString;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Directory of POSIX shared-memory files.
pub const SHM_DIR: &str = "/dev/shm";

/// A shared mapping of a file in [`SHM_DIR`] (or anonymous memory); unmapped on drop, but for
/// the program's own static data (see [`crate::adopt`]).
#[derive(Debug)]
pub struct Mapping {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) kind: MapKind,
}

/// What dropping a [`Mapping`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MapKind {
    /// Unmaps it: weft mapped it.
    Owned,
    /// Nothing: the program's memory, registered in place.
    #[cfg_attr(not(feature = "ofi"), allow(dead_code))]
    Borrowed,
    /// Puts private memory with the same bytes back in its place: the program's static data,
    /// moved into a shared file while weft held it.
    Adopted,
}

// SAFETY: a Mapping is a plain address range; synchronisation of what is stored in it is the
// business of its users (atomics and the ring protocol).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out the address.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length mapping.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Mapping {
    /// Backs bytes `[offset, offset + len)` (widened to whole pages) with memory now
    /// (`MADV_POPULATE_WRITE`): where the system has none left (a full `/dev/shm`) this is an
    /// error instead of a SIGBUS at the first write. A kernel without it (before 5.14) backs
    /// pages at first write, as before.
    pub fn back(&self, offset: usize, len: usize) -> FabricResult<()> {
        const PAGE: usize = 4096;
        let end = offset.checked_add(len).filter(|&e| e <= self.len).ok_or(FabricError::OutOfBounds {
            offset,
            len,
            region_len: self.len,
        })?;
        let start = offset / PAGE * PAGE;
        let end = end.div_ceil(PAGE).saturating_mul(PAGE).min(self.len);
        if end <= start {
            return Ok(());
        }
        // SAFETY: [start, end) lies inside this mapping (checked above; ptr is page-aligned,
        // as mmap returns it); populating changes no byte of it.
        let rc = unsafe { libc::madvise(self.ptr.add(start).cast(), end - start, libc::MADV_POPULATE_WRITE) };
        if rc == 0 {
            return Ok(());
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINVAL) => Ok(()),
            errno => Err(FabricError::Os {
                what: format!("backing {} bytes of shared memory ({SHM_DIR}: {})", end - start, shm_space()),
                errno: errno.unwrap_or(0),
            }),
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        match self.kind {
            // SAFETY: ptr/len came from a successful mmap of exactly this length and nothing
            // created by this Mapping outlives it (callers keep the Mapping alive while they use
            // pointers into it).
            MapKind::Owned => unsafe {
                libc::munmap(self.ptr.cast(), self.len);
            },
            MapKind::Borrowed => {}
            MapKind::Adopted => crate::adopt::restore(self.ptr, self.len),
        }
    }
}

/// What `/dev/shm` has left, for an error that ran out of it.
fn shm_space() -> String {
    match fs_space(std::path::Path::new(SHM_DIR)) {
        Ok((size, free)) => format!("full? {free} bytes free of {size}, shared by every job on the node"),
        Err(_) => "full?".to_string(),
    }
}

fn path_of(name: &str) -> FabricResult<CString> {
    CString::new(format!("{SHM_DIR}/{name}"))
        .map_err(|_| FabricError::Malformed { what: format!("shared-memory name {name:?}") })
}

/// How much of a new shared file is backed by memory up front.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// All of it, reserved before use (`posix_fallocate`: a full `/dev/shm` is an error here,
    /// not a SIGBUS at the first write) and mapped in.
    Reserved,
    /// Only what is written (a pool): nothing is reserved or mapped in up front.
    Sparse,
}

/// `mmap` of `len` read-write bytes anywhere in the address space; `fd` is -1 for anonymous
/// mappings (`MAP_ANONYMOUS` in `flags`).
fn map_raw(fd: libc::c_int, len: usize, flags: libc::c_int, what: &str) -> FabricResult<Mapping> {
    if len == 0 {
        return Ok(Mapping {
            ptr: std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
            len: 0,
            kind: MapKind::Owned,
        });
    }
    // SAFETY: fd is -1 (anonymous) or an open descriptor of a file at least `len` bytes long;
    // we ask for a fresh mapping anywhere in the address space, so no existing memory is
    // affected.
    let p =
        unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(FabricError::last_os(format!("mmap of {len} bytes for {what}")));
    }
    Ok(Mapping { ptr: p.cast(), len, kind: MapKind::Owned })
}

struct Fd(libc::c_int);
impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is owned by this guard and closed once.
        unsafe { libc::close(self.0) };
    }
}

/// Creates `name` (exclusively) with `len` zero bytes, maps it, lets `init` fill it, then
/// publishes it under `name` (a peer never sees a half-initialised file). Nothing existing is
/// followed or replaced: the file is made under a temporary name with `O_EXCL | O_NOFOLLOW`
/// and published with `link`, which fails where `name` exists. An existing `name` is
/// [`FabricError::Exists`].
pub fn create_shared(
    name: &str,
    len: usize,
    fill: Fill,
    init: impl FnOnce(*mut u8),
) -> FabricResult<Mapping> {
    let tmp = format!("{name}.tmp");
    let cpath = path_of(&tmp)?;
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: cpath is a valid NUL-terminated string; O_EXCL makes us the only creator.
    let fd = unsafe { libc::open(cpath.as_ptr(), flags, 0o600) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EEXIST) {
            return Err(FabricError::Exists { path: format!("{SHM_DIR}/{tmp}") });
        }
        return Err(FabricError::last_os(format!("creating {SHM_DIR}/{tmp}")));
    }
    let fd = Fd(fd);
    let cleanup = |e: FabricError| {
        unlink(&tmp);
        e
    };
    // SAFETY: fd is open for writing.
    if unsafe { libc::ftruncate(fd.0, len as libc::off_t) } != 0 {
        return Err(cleanup(FabricError::last_os(format!(
            "sizing {SHM_DIR}/{tmp} to {len} bytes (is /dev/shm full?)"
        ))));
    }
    let mut flags = libc::MAP_SHARED;
    if fill == Fill::Reserved && len > 0 {
        // SAFETY: fd is open for writing; posix_fallocate touches no memory of ours.
        let rc = unsafe { libc::posix_fallocate(fd.0, 0, len as libc::off_t) };
        if rc != 0 {
            return Err(cleanup(FabricError::Os {
                what: format!("reserving {len} bytes of {SHM_DIR} for {tmp} ({SHM_DIR}: {})", shm_space()),
                errno: rc,
            }));
        }
        flags |= libc::MAP_POPULATE;
    }
    let map = map_raw(fd.0, len, flags, &tmp).map_err(cleanup)?;
    init(map.as_ptr());
    let final_path = path_of(name)?;
    // SAFETY: both paths are valid C strings; link creates a second name and never replaces.
    let linked = unsafe { libc::link(cpath.as_ptr(), final_path.as_ptr()) };
    let e = std::io::Error::last_os_error();
    unlink(&tmp);
    if linked != 0 {
        if e.raw_os_error() == Some(libc::EEXIST) {
            return Err(FabricError::Exists { path: format!("{SHM_DIR}/{name}") });
        }
        return Err(FabricError::Os {
            what: format!("publishing {SHM_DIR}/{name}"),
            errno: e.raw_os_error().unwrap_or(0),
        });
    }
    Ok(map)
}

/// Maps an existing shared file; `Ok(None)` if it does not exist (yet). Only a regular file
/// of this user that nobody else may read or write is mapped (what [`create_shared`] makes):
/// a link, or a file another user placed under the name, is refused.
pub fn open_shared(name: &str) -> FabricResult<Option<Mapping>> {
    let cpath = path_of(name)?;
    // SAFETY: valid C string.
    let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOENT) => return Ok(None),
            Some(libc::ELOOP) => {
                return Err(FabricError::Untrusted {
                    what: format!(
                        "{SHM_DIR}/{name} is a symbolic link; weft maps only regular files it made"
                    ),
                })
            }
            _ => return Err(FabricError::last_os(format!("opening {SHM_DIR}/{name}"))),
        }
    }
    let fd = Fd(fd);
    let mut st = zeroed_stat();
    // SAFETY: fd is open and st is writable.
    if unsafe { libc::fstat(fd.0, &mut st) } != 0 {
        return Err(FabricError::last_os(format!("stat of {SHM_DIR}/{name}")));
    }
    owned_private(&st, libc::S_IFREG, name, "maps only regular files of its own user with mode 600")?;
    let len = usize::try_from(st.st_size)
        .map_err(|_| FabricError::Malformed { what: format!("size of {SHM_DIR}/{name}") })?;
    // Not mapped in up front: a peer's pages are faulted in where this process touches them
    // (its owner reserved them, or made them sparse).
    map_raw(fd.0, len, libc::MAP_SHARED, name).map(Some)
}

/// 64 bits from the kernel's random number generator (`getrandom`), for names and keys
/// nobody can guess.
pub fn random_u64() -> FabricResult<u64> {
    let mut b = [0u8; 8];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: the destination range lies inside `b`, which is writable.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(FabricError::Os { what: "getrandom".into(), errno: e.raw_os_error().unwrap_or(0) });
        }
        got += n as usize;
    }
    Ok(u64::from_le_bytes(b))
}

/// Makes, or checks, the directory `name` in [`SHM_DIR`] that holds a job's files: mode 700
/// and this user's. Another user can create nothing in it, so the names a job publishes later
/// cannot be squatted even by one who has seen the job's id (its directory). An existing
/// `name` that is not such a directory (a link, a file, another user's) is refused.
pub fn private_dir(name: &str) -> FabricResult<()> {
    let c = path_of(name)?;
    // SAFETY: valid C string; mkdir has no memory effects.
    if unsafe { libc::mkdir(c.as_ptr(), 0o700) } == 0 {
        return Ok(());
    }
    if std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
        return Err(FabricError::last_os(format!("creating {SHM_DIR}/{name}")));
    }
    let mut st = zeroed_stat();
    // SAFETY: valid C string and a writable stat; lstat does not follow a link.
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } != 0 {
        return Err(FabricError::last_os(format!("stat of {SHM_DIR}/{name}")));
    }
    owned_private(
        &st,
        libc::S_IFDIR,
        name,
        "keeps a job's files only in a directory of its own user with mode 700",
    )
}

/// Checks that `st` (of `name` in [`SHM_DIR`]) is of type `kind`, this user's, and closed
/// to everyone else; else [`FabricError::Untrusted`] saying what weft `wants`.
fn owned_private(st: &libc::stat, kind: libc::mode_t, name: &str, wants: &str) -> FabricResult<()> {
    let me = euid();
    if st.st_mode & libc::S_IFMT == kind && st.st_uid == me && st.st_mode & 0o077 == 0 {
        return Ok(());
    }
    Err(FabricError::Untrusted {
        what: format!(
            "{SHM_DIR}/{name}: owner uid {}, mode {:o}; weft {wants} (uid {me})",
            st.st_uid,
            st.st_mode & 0o7777
        ),
    })
}

/// Removes the directory `name` of [`SHM_DIR`] if it is empty and this user's own (a
/// directory of the same name made by someone else is left alone).
pub fn remove_dir(name: &str) {
    let Ok(c) = path_of(name) else {
        return;
    };
    let mut st = zeroed_stat();
    // SAFETY: valid C string and a writable stat; lstat does not follow a link.
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } != 0
        || owned_private(&st, libc::S_IFDIR, name, "").is_err()
    {
        return;
    }
    // SAFETY: valid C string; rmdir has no memory effects and fails on a non-empty one.
    unsafe { libc::rmdir(c.as_ptr()) };
}

/// Removes the directory `name` of [`SHM_DIR`] and the files in it, if it is a directory of
/// this user; returns how many files it held.
pub fn remove_tree(name: &str) -> usize {
    use std::os::unix::fs::MetadataExt;
    let path = std::path::Path::new(SHM_DIR).join(name);
    let me = euid();
    let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == me);
    if !ours {
        return 0;
    }
    let files = std::fs::read_dir(&path)
        .map(|rd| rd.flatten().filter(|e| std::fs::remove_file(e.path()).is_ok()).count())
        .unwrap_or(0);
    let _ = std::fs::remove_dir(&path);
    files
}

/// Removes the directories [`remove_tree`] removes that are named `dir` or `dir-…` (a job's,
/// and those of fabrics built on it, such as the hybrid's per-host `JOB-hN`); returns how
/// many files they held.
pub fn remove_trees(dir: &str) -> usize {
    let Ok(rd) = std::fs::read_dir(SHM_DIR) else {
        return 0;
    };
    let sub = format!("{dir}-");
    rd.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n == dir || n.starts_with(&sub))
        .map(|n| remove_tree(&n))
        .sum()
}

/// Removes a shared file; a missing file is not an error.
pub fn unlink(name: &str) {
    if let Ok(c) = path_of(name) {
        // SAFETY: valid C string; unlink has no memory effects.
        unsafe { libc::unlink(c.as_ptr()) };
    }
}

/// Removes every shared file whose name starts with `prefix`; returns how many were removed.
pub fn unlink_prefix(prefix: &str) -> usize {
    unlink_prefixes(&[prefix])
}

/// Removes the files in [`SHM_DIR`] whose names start with any of `prefixes` (one scan of the
/// directory); returns how many were removed.
pub fn unlink_prefixes(prefixes: &[&str]) -> usize {
    unlink_matching("", |name| prefixes.iter().any(|p| name.starts_with(p)))
}

/// Removes the files of directory `dir` of [`SHM_DIR`] (`""`: itself) whose names `pick`
/// chooses (one scan); returns how many were removed.
pub fn unlink_matching(dir: &str, pick: impl Fn(&str) -> bool) -> usize {
    let Ok(rd) = std::fs::read_dir(std::path::Path::new(SHM_DIR).join(dir)) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| pick(&e.file_name().to_string_lossy()))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Blocks while `*word == expected`, at most `timeout`. Works across processes on shared maps.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: word points to a live, 4-byte aligned u32; the kernel only reads it. A shared
    // (non-private) futex is used because the word may live in memory shared between processes.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const _, 0, 0)
    };
}

/// Wakes every waiter blocked in [`futex_wait`] on `word`.
pub fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: word points to a live u32; FUTEX_WAKE does not access user memory otherwise.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, 0, 0, 0) };
}

/// `membarrier(2)` commands (linux/membarrier.h).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// Registers this process for [`membarrier_all_threads`]; false where the kernel (or a seccomp
/// policy) refuses, in which case that call must not be relied on.
pub fn membarrier_register() -> bool {
    // SAFETY: membarrier takes no pointers; an unknown or refused command returns -1.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 }
}

/// Makes every running thread of this process execute a full memory barrier before it returns
/// (threads not running get one from the context switch): the heavy side of an asymmetric
/// barrier, whose light side is a compiler fence. Needs [`membarrier_register`] first; returns
/// false if the kernel refused.
pub fn membarrier_all_threads() -> bool {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0 }
}

/// This process's id.
/// Sleeps `d`, to an absolute deadline on the monotonic clock: a storm of signals cannot
/// stretch it. (`std::thread::sleep` restarts with the time left, and each restart adds the
/// timer slack: a 50 us interval timer kept a 1 ms sleep from ever ending.)
///
/// ```
/// weft_fabric::os::sleep_until_elapsed(std::time::Duration::from_micros(100));
/// ```
pub fn sleep_until_elapsed(d: Duration) {
    // SAFETY: timespec is plain data that clock_gettime fills; clock_nanosleep only reads it.
    unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        if libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) != 0 {
            return std::thread::sleep(d);
        }
        let nanos = ts.tv_nsec as u64 + d.subsec_nanos() as u64;
        ts.tv_sec += d.as_secs() as libc::time_t + (nanos / 1_000_000_000) as libc::time_t;
        ts.tv_nsec = (nanos % 1_000_000_000) as libc::c_long;
        while libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut())
            == libc::EINTR
        {}
    }
}

pub fn pid() -> u32 {
    std::process::id()
}

/// Copies `dst.len()` bytes from address `addr` of process `pid` (Linux cross-memory attach,
/// `process_vm_readv`: one copy, no shared mapping needed). Needs the permission to ptrace the
/// peer, which processes of one user have unless a Yama policy forbids it.
pub fn read_process(pid: u32, addr: u64, dst: &mut [u8]) -> FabricResult<()> {
    if !crate::copy::aliases(dst.as_ptr(), addr as *const u8, dst.len()) {
        return read_process_direct(pid, addr, dst);
    }
    // The kernel copies forwards and would stall on 4K aliasing (see [`crate::copy`]): read
    // through a bounce buffer placed at the source's page offset, then copy backwards.
    thread_local! {
        static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    const PIECE: usize = 64 << 10;
    BOUNCE.with_borrow_mut(|bounce| {
        bounce.resize(PIECE + 4096, 0);
        let mut done = 0;
        while done < dst.len() {
            let len = PIECE.min(dst.len() - done);
            let from = addr + done as u64;
            let at = (from as usize).wrapping_sub(bounce.as_ptr() as usize) & 4095;
            read_process_direct(pid, from, &mut bounce[at..at + len])?;
            crate::copy::copy_slice(&mut dst[done..done + len], &bounce[at..at + len]);
            done += len;
        }
        Ok(())
    })
}

fn read_process_direct(pid: u32, addr: u64, dst: &mut [u8]) -> FabricResult<()> {
    let mut done = 0usize;
    while done < dst.len() {
        let local = libc::iovec { iov_base: dst[done..].as_mut_ptr().cast(), iov_len: dst.len() - done };
        let remote =
            libc::iovec { iov_base: (addr as usize + done) as *mut libc::c_void, iov_len: dst.len() - done };
        // SAFETY: `local` describes the live exclusive slice dst[done..]; the kernel checks the
        // remote range against the peer's address space and fails instead of faulting.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            return Err(FabricError::last_os(format!(
                "process_vm_readv of {} bytes at {:#x} in process {pid}",
                dst.len() - done,
                addr as usize + done
            )));
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether process `pid` (of this pid namespace) is still running (a zombie counts as dead,
/// once all its threads have ended).
pub fn process_alive(pid: u32) -> bool {
    // 0 and negative numbers would name process groups.
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists; kill touches no memory.
    let exists = p > 0
        && (unsafe { libc::kill(p, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM));
    if !exists || !proc_is_ours() {
        // A /proc of another pid namespace (unshare -p without --mount-proc) shows other
        // processes under these numbers: existence is all that can be told.
        return exists;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => match s.rfind(')').and_then(|i| s[i + 1..].split_whitespace().next()) {
            Some("Z" | "X") => !group_exited(p).unwrap_or(true),
            Some(_) | None => true,
        },
        // Gone since `kill` saw it; any other error (no descriptor free, say) tells nothing
        // against what `kill` said.
        Err(e) => !matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)),
    }
}

/// Whether every thread of process `pid`, whose main thread has ended, has ended too: what
/// its parent is told (`None` where pidfds are not available). A main thread that exits
/// first shows as a zombie while the other threads still end, and the last of them tears
/// down the memory, which can take long; a peer that took the process for dead then could
/// exit, and be reported to the launcher, before the process that failed first.
fn group_exited(pid: libc::pid_t) -> Option<bool> {
    let fd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) => return (e.raw_os_error() == Some(libc::ESRCH)).then_some(true),
    };
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: `p` is one valid pollfd for the call; the timeout 0 only looks.
    let ready = unsafe { libc::poll(&mut p, 1, 0) };
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    Some(ready == 1 && p.revents & libc::POLLIN != 0)
}

/// A pidfd of process `pid` (readable once all its threads have ended), which the caller
/// closes.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> std::io::Result<libc::c_int> {
    // SAFETY: pidfd_open takes a pid and flags and touches no memory.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as libc::c_int;
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Whether `/proc` shows this process's pid namespace (`/proc/self` is our pid).
fn proc_is_ours() -> bool {
    static OURS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OURS.get_or_init(|| {
        std::fs::read_link("/proc/self").is_ok_and(|p| p.to_str() == Some(&std::process::id().to_string()))
    })
}

/// Sends signal `sig` to process `pid`; errors are ignored (the process may be gone).
pub fn kill(pid: u32, sig: i32) {
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// Asks the kernel to SIGKILL this process when its parent dies. Meant for a launcher's
/// `pre_exec` hook: async-signal-safe.
pub fn die_with_parent() -> std::io::Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub use crate::signals::{ask_to_end, catch_interrupts, end_asked, interrupted, interrupts, signal_name};

/// Memory the kernel says can be allocated without swapping (`MemAvailable`), in bytes; `None`
/// where /proc/meminfo cannot be read.
pub fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Bytes in use on the file system holding `path` (`statvfs`: blocks less free blocks), as
/// `df` counts them: for `/dev/shm`, the shared memory of every job on the node.
pub fn fs_used_bytes(path: &std::path::Path) -> std::io::Result<u64> {
    fs_space(path).map(|(size, free)| size.saturating_sub(free))
}

/// Bytes of the file system holding `path` in all, and free (`statvfs`).
pub fn fs_space(path: &std::path::Path) -> std::io::Result<(u64, u64)> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path; `st` is writable space for one statvfs, which the
    // call fills when it returns 0.
    let st = unsafe {
        if libc::statvfs(c.as_ptr(), st.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        st.assume_init()
    };
    let unit = st.f_frsize as u64;
    Ok(((st.f_blocks as u64).saturating_mul(unit), (st.f_bavail as u64).saturating_mul(unit)))
}

/// Processors online on this node (`sysconf(_SC_NPROCESSORS_ONLN)`), whatever this process's
/// own affinity mask allows; `None` if the system does not say.
pub fn online_cpus() -> Option<usize> {
    // SAFETY: sysconf only reads a system setting.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).ok().filter(|&n| n > 0)
}

/// Makes glibc's malloc keep freed memory for reuse instead of returning it to the kernel
/// (large blocks come from the heap, not fresh mappings; the heap is not trimmed) — what RDMA
/// MPI setups ask for with `MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=-1`. On this machine a
/// fresh page costs about 3 µs to fault in, so without it large buffers are timed mostly on
/// page faults. Returns false if malloc refused.
pub fn keep_freed_memory() -> bool {
    // SAFETY: mallopt only changes allocator tunables; valid parameters, no memory touched.
    unsafe { libc::mallopt(libc::M_MMAP_MAX, 0) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1 }
}

/// Nanoseconds from a monotonic clock (cheap; for benchmarks and timeouts).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Spawns a rank: killed if this process (its launcher) dies, and the leader of a process
/// group of its own, so that [`kill_group`] reaches whatever it starts as well.
pub fn spawn_rank(cmd: &mut std::process::Command) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let parent = pid();
    let hook = move || {
        die_with_parent()?;
        // SAFETY: getppid and setpgid are async-signal-safe and touch no memory.
        unsafe {
            // The launcher died before the death signal was armed: end at once.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the hook runs in the child between fork and exec and calls only prctl, getppid,
    // setpgid and _exit, all async-signal-safe, and allocates nothing.
    unsafe { cmd.pre_exec(hook) };
    cmd.spawn()
}

/// Sends `sig` to every process of process group `pgid`; false when the group is empty
/// (no process left in it) or the signal could not be sent.
pub fn kill_group(pgid: u32, sig: i32) -> bool {
    // SAFETY: killpg has no memory effects.
    unsafe { libc::killpg(pgid as libc::pid_t, sig) == 0 }
}

/// Removes the shared files of this user's jobs whose launcher (or one-rank process) is gone:
/// a launcher killed with SIGKILL leaves the files of ranks that died before they unlinked
/// them. Returns how many were removed.
pub fn remove_orphaned_files() -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(SHM_DIR) else {
        return 0;
    };
    let me = euid();
    rd.flatten()
        .map(|e| {
            let name = e.file_name();
            let Some(job) = name.to_str().and_then(|n| n.strip_prefix("weft-")) else {
                return 0;
            };
            let owner = job.split('-').next().and_then(crate::names::job_owner);
            if owner.is_none_or(process_alive) {
                return 0;
            }
            match e.metadata() {
                // A job's directory (see `private_dir`), and the files of earlier versions.
                Ok(m) if m.uid() == me && m.is_dir() => name.to_str().map_or(0, remove_tree),
                Ok(m) if m.uid() == me && m.file_type().is_file() => {
                    usize::from(std::fs::remove_file(e.path()).is_ok())
                }
                _ => 0,
            }
        })
        .sum()
}

/// SIGTERM, for launchers.
pub const SIGTERM: i32 = libc::SIGTERM;
/// SIGKILL, for launchers.
pub const SIGKILL: i32 = libc::SIGKILL;

/// A private, zero-filled anonymous mapping of `len` bytes (page-aligned), for memory that a
/// network fabric registers with its NIC.
pub fn map_anonymous(len: usize) -> FabricResult<Mapping> {
    map_raw(-1, len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, "anonymous memory")
}

/// Lets the child started by `cmd` inherit descriptor `fd` under the same number (Rust opens
/// every descriptor close-on-exec): for the launcher's start-up socket.
pub fn inherit_fd(cmd: &mut std::process::Command, fd: std::os::fd::RawFd) {
    use std::os::unix::process::CommandExt;
    let hook = move || {
        // SAFETY: fcntl on a descriptor number touches no memory and is async-signal-safe.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook runs in the child between fork and exec and only calls fcntl.
    unsafe { cmd.pre_exec(hook) };
}

/// An identity of the host this process runs on, equal for processes that can share memory
/// and reach each other's `/proc`: the kernel's boot id, plus the network namespace (so that
/// namespaces standing for hosts in tests count as different hosts).
pub fn host_identity() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net").map(|p| p.display().to_string()).unwrap_or_default();
    format!("{}/{}", boot.trim(), netns)
}

/// Takes ownership of inherited descriptor `fd` as a Unix stream socket (the launcher's
/// start-up channel), after checking that it is an open socket.
pub fn unix_stream_from_fd(fd: std::os::fd::RawFd) -> FabricResult<std::os::unix::net::UnixStream> {
    use std::os::fd::FromRawFd;
    let mut st: libc::stat = zeroed_stat();
    // SAFETY: fstat writes into the valid out-parameter st; fd is just a number here.
    if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(FabricError::last_os(format!("start-up descriptor {fd}")));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(FabricError::Malformed { what: format!("start-up descriptor {fd} is not a socket") });
    }
    // SAFETY: fd is an open socket inherited from the launcher for this purpose, and nothing
    // else in the process owns it: the stream becomes its only owner.
    Ok(unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) })
}

/// The pid and user id of the process at the other end of connected Unix socket `s`, as the
/// kernel recorded them when the connection was made (`SO_PEERCRED`): not forgeable.
pub fn peer_credentials(s: &std::os::unix::net::UnixStream) -> FabricResult<(u32, u32)> {
    use std::os::fd::AsRawFd;
    // SAFETY: libc::ucred is plain old data for which all-zero bytes are a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the valid out-parameter cred and
    // updates len; the descriptor belongs to `s`, borrowed for the call.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(FabricError::last_os("SO_PEERCRED"));
    }
    Ok((cred.pid as u32, cred.uid))
}

/// Shuts socket `s` down both ways: a thread blocked in `accept` on it wakes with an error.
pub fn shutdown_socket(s: &impl std::os::fd::AsRawFd) {
    // SAFETY: shutdown takes a descriptor number and touches no memory; the descriptor stays
    // open (owned by `s`), so no other file can be affected.
    unsafe { libc::shutdown(s.as_raw_fd(), libc::SHUT_RDWR) };
}

/// This process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no failure mode and touches no memory.
    unsafe { libc::geteuid() }
}

fn zeroed_stat() -> libc::stat {
    // SAFETY: libc::stat is plain old data for which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

/// The CPUs this thread may run on (its affinity mask), in ascending order; empty if the
/// kernel does not say.
pub fn allowed_cpus() -> Vec<usize> {
    let mut set = zeroed_cpu_set();
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into set.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: CPU_ISSET reads the initialised set for indices below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Binds the calling thread to CPU `cpu`; false if the kernel refused (a CPU outside the
/// process's mask, for example).
pub fn pin_current_thread(cpu: usize) -> bool {
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    let mut set = zeroed_cpu_set();
    // SAFETY: cpu is below CPU_SETSIZE, so CPU_SET writes inside set; sched_setaffinity reads
    // size_of::<cpu_set_t>() bytes of it.
    unsafe {
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Binds the calling thread to the `k`-th of `cpus` (a list from [`allowed_cpus`], taken
/// before any binding), wrapping round; false, and nothing done, if the list is empty or the
/// kernel refused. What benchmark and calibration threads use to get a CPU each.
pub fn pin_to_nth(cpus: &[usize], k: usize) -> bool {
    !cpus.is_empty() && pin_current_thread(cpus[k % cpus.len()])
}

fn zeroed_cpu_set() -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bit array for which all-zero bytes are the empty set.
    unsafe { std::mem::zeroed() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_may_run_on_its_cpu_only() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty(), "no CPU in the affinity mask");
        let last = *cpus.last().unwrap();
        // In a thread of its own: pinning the test harness's thread would outlive the test.
        let after = std::thread::spawn(move || (pin_current_thread(last), allowed_cpus())).join().unwrap();
        assert_eq!(after, (true, vec![last]));
        assert!(!pin_current_thread(libc::CPU_SETSIZE as usize));
        assert!(!pin_to_nth(&[], 3), "no CPUs: nothing to bind to");
        let wrapped = std::thread::spawn(move || (pin_to_nth(&[last], 5), allowed_cpus())).join().unwrap();
        assert_eq!(wrapped, (true, vec![last]));
        assert_eq!(allowed_cpus(), cpus, "the calling thread's mask changed");
    }
}
