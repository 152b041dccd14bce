//! Connections from outside the job to a rank's listening port (the tcp and sockets
//! providers listen on the configured interface's address). The provider accepts every
//! connection and keeps its descriptor until the other side speaks; an outsider that opens
//! idle connections would use up the rank's descriptors, and the rank's next connection to a
//! peer would fail ("Too many open files").
//!
//! A thread of the fabric looks at the accepted sockets of the port every 100 ms. One that
//! has received nothing (a rank's provider sends its connection request at once) is shut
//! down once it has stayed so for `wait`, and at once beyond `max` such connections, oldest
//! first; the provider then sees the end of the stream and closes its descriptor. The
//! descriptor is judged through a duplicate whose inode is checked, so a number the provider
//! has closed and reused meanwhile is never touched.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How often the accepted sockets are looked at.
const EVERY: Duration = Duration::from_millis(100);

/// What the guard has seen, for messages.
#[derive(Default)]
pub(crate) struct Seen {
    /// Connections shut down so far.
    pub closed: AtomicU64,
    /// Silent connections at the last look.
    pub silent: AtomicU64,
    warned: AtomicBool,
}

/// The guard of one listening port; stops its thread when dropped.
pub(crate) struct Guard {
    pub port: u16,
    pub seen: Arc<Seen>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The port of an endpoint name that is an IPv4 or IPv6 socket address.
pub(crate) fn port_of(name: &[u8]) -> Option<u16> {
    let family = u16::from_ne_bytes(name.get(..2)?.try_into().ok()?);
    let ok = (family == libc::AF_INET as u16 && name.len() >= 16)
        || (family == libc::AF_INET6 as u16 && name.len() >= 28);
    ok.then(|| u16::from_be_bytes([name[2], name[3]]))
}

impl Guard {
    /// Starts guarding `port` for rank `rank`: silent connections go after `wait`, and
    /// beyond `max` at once.
    pub(crate) fn start(rank: u32, port: u16, wait: Duration, max: usize) -> std::io::Result<Guard> {
        let seen = Arc::new(Seen::default());
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let (s, st) = (seen.clone(), stop.clone());
        let mut watch = Watch::new(port, wait, max)?;
        let builder = std::thread::Builder::new().name(format!("weft-guard-{rank}")).stack_size(64 << 10);
        let thread = crate::signals::spawn_quiet(builder, move || {
            let (lock, cv) = &*st;
            let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
            while !*stopped {
                drop(stopped);
                watch.look(rank, &s);
                stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
                if !*stopped {
                    stopped = cv.wait_timeout(stopped, EVERY).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
        })?;
        Ok(Guard { port, seen, stop, thread: Some(thread) })
    }

    /// What to add to a "Too many open files" error: the outsiders, if any.
    pub(crate) fn explain(&self) -> String {
        let (silent, closed) =
            (self.seen.silent.load(Ordering::Relaxed), self.seen.closed.load(Ordering::Relaxed));
        if silent + closed == 0 {
            return String::new();
        }
        format!(
            " ({silent} connections to this rank's port {} that never spoke are open now, {closed} closed so far: \
             processes outside the job are connecting to it)",
            self.port
        )
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The guard thread's state.
struct Watch {
    port: u16,
    wait: Duration,
    max: usize,
    /// When each silent connection (by inode) was first seen.
    first_seen: HashMap<u64, Instant>,
    /// Connections shut down whose descriptors the provider has not closed yet.
    shut: HashSet<u64>,
    /// A descriptor of `/dev/null`, and one that takes a duplicate of the socket judged.
    null: std::os::fd::OwnedFd,
    spare: std::os::fd::OwnedFd,
    /// `/proc/self/fd`, opened once: when the flood has taken every descriptor, the guard
    /// still needs to list them.
    fds: FdDir,
}

impl Watch {
    fn new(port: u16, wait: Duration, max: usize) -> std::io::Result<Watch> {
        let null: std::os::fd::OwnedFd = std::fs::File::open("/dev/null")?.into();
        let spare = null.try_clone()?;
        let fds = FdDir::open()?;
        Ok(Watch { port, wait, max, first_seen: HashMap::new(), shut: HashSet::new(), null, spare, fds })
    }

    /// One look: finds the port's silent accepted connections and shuts down those due.
    fn look(&mut self, rank: u32, seen: &Seen) {
        let now = Instant::now();
        // (inode, descriptor, first seen) of each silent connection.
        let mut silent = Vec::new();
        let mut open = HashSet::new();
        for fd in self.fds.list() {
            let Some(ino) = socket_inode(fd) else { continue };
            open.insert(ino);
            if !self.shut.contains(&ino) && accepted_on(fd, self.port) && tcp_bytes_received(fd) == Some(0) {
                let since = *self.first_seen.entry(ino).or_insert(now);
                silent.push((ino, fd, since));
            }
        }
        let alive: HashSet<u64> = silent.iter().map(|s| s.0).collect();
        self.first_seen.retain(|ino, _| alive.contains(ino));
        self.shut.retain(|ino| open.contains(ino));
        seen.silent.store(silent.len() as u64, Ordering::Relaxed);
        // Oldest first: past the wait, or beyond the cap.
        silent.sort_by_key(|s| s.2);
        let over = silent.len().saturating_sub(self.max);
        let mut closed = 0;
        for (i, &(ino, fd, since)) in silent.iter().enumerate() {
            if (i < over || now.duration_since(since) >= self.wait)
                && shut_down_socket(fd, ino, &self.spare, &self.null)
            {
                self.first_seen.remove(&ino);
                self.shut.insert(ino);
                closed += 1;
            }
        }
        if closed > 0 {
            seen.closed.fetch_add(closed, Ordering::Relaxed);
            if !seen.warned.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "weft: rank {rank}: closing connections to its port {} that never sent libfabric's \
                     connection request within {:?} or beyond {} at once (from outside the job?)",
                    self.port, self.wait, self.max
                );
            }
        }
    }
}

/// Whether descriptor `fd` is a TCP connection accepted on local port `port` (not the
/// listening socket, not a connection this process made).
fn accepted_on(fd: i32, port: u16) -> bool {
    // SAFETY: sockaddr_storage is plain data, large enough for any address; getsockname
    // writes at most `len` bytes into it. A descriptor that is no socket gives an error.
    let local = unsafe {
        let mut a: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if libc::getsockname(fd, (&mut a as *mut libc::sockaddr_storage).cast(), &mut len) != 0 {
            return false;
        }
        let bytes =
            std::slice::from_raw_parts((&a as *const libc::sockaddr_storage).cast::<u8>(), len as usize);
        port_of(bytes)
    };
    if local != Some(port) {
        return false;
    }
    let mut listening: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_ACCEPTCONN writes one int into `listening`, whose size `len` gives.
    let ok = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut listening as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    ok == 0 && listening == 0
}

/// Bytes the TCP connection on `fd` has received (`None`: not a TCP socket).
fn tcp_bytes_received(fd: i32) -> Option<u64> {
    // SAFETY: tcp_info is plain data; TCP_INFO writes at most `len` bytes of it.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let ok = libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        // Kernels before 4.1 do not report the count: nothing is judged then.
        let known = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_received) + 8;
        (ok == 0 && len as usize >= known).then_some(info.tcpi_bytes_received)
    }
}

/// Shuts down (both ways) the socket that descriptor `fd` refers to, if it is still the one
/// of inode `ino`: `spare` takes a duplicate of `fd` first (the number may have been closed
/// and reused since it was judged), and `null` back afterwards. The descriptor stays the
/// provider's, which sees the stream end and closes it.
fn shut_down_socket(fd: i32, ino: u64, spare: &std::os::fd::OwnedFd, null: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let spare = spare.as_raw_fd();
    // SAFETY: dup2 makes `spare` (ours) refer to what `fd` refers to now, atomically; fstat
    // and shutdown act on that duplicate only; the second dup2 points `spare` at /dev/null.
    unsafe {
        if libc::dup2(fd, spare) != spare {
            return false;
        }
        let mut st: libc::stat = std::mem::zeroed();
        let same = libc::fstat(spare, &mut st) == 0 && st.st_ino == ino;
        let done = same && libc::shutdown(spare, libc::SHUT_RDWR) == 0;
        libc::dup2(null.as_raw_fd(), spare);
        done
    }
}

/// `/proc/self/fd`, read again from its start at each [`FdDir::list`].
struct FdDir(std::ptr::NonNull<libc::DIR>);

// SAFETY: the stream is used by one thread at a time (the guard's, through `&mut Watch`).
unsafe impl Send for FdDir {}

impl FdDir {
    fn open() -> std::io::Result<FdDir> {
        // SAFETY: a NUL-terminated path; opendir returns a stream we own, or null.
        let d = unsafe { libc::opendir(c"/proc/self/fd".as_ptr()) };
        std::ptr::NonNull::new(d).map(FdDir).ok_or_else(std::io::Error::last_os_error)
    }

    /// The descriptors open now.
    fn list(&mut self) -> Vec<i32> {
        let mut out = Vec::new();
        // SAFETY: the stream is ours and open; each entry readdir returns stays valid until
        // the next call on the stream, and its name is NUL-terminated.
        unsafe {
            libc::rewinddir(self.0.as_ptr());
            loop {
                let e = libc::readdir(self.0.as_ptr());
                if e.is_null() {
                    break;
                }
                let name = std::ffi::CStr::from_ptr((*e).d_name.as_ptr());
                if let Some(fd) = name.to_str().ok().and_then(|s| s.parse().ok()) {
                    out.push(fd);
                }
            }
        }
        out
    }
}

impl Drop for FdDir {
    fn drop(&mut self) {
        // SAFETY: the stream is ours and closed once.
        unsafe { libc::closedir(self.0.as_ptr()) };
    }
}

/// The inode of the socket that descriptor `fd` is (`/proc/self/fd/N` names it).
fn socket_inode(fd: i32) -> Option<u64> {
    let target = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let s = target.to_str()?;
    s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn silent_connections_are_closed_and_speaking_ones_kept() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut talker = TcpStream::connect(("127.0.0.1", port)).unwrap();
        talker.write_all(b"hello").unwrap();
        let quiet: Vec<_> = (0..5).map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
        let accepted: Vec<_> = (0..6).map(|_| listener.accept().unwrap().0).collect();
        // The talker's bytes have arrived before the guard looks.
        let mut buf = [0u8; 5];
        std::io::Read::read_exact(&mut &accepted[0], &mut buf).unwrap();
        // Two silent ones at most: three go at once, the rest after the wait.
        let mut watch = Watch::new(port, Duration::from_millis(300), 2).unwrap();
        let seen = Seen::default();
        watch.look(0, &seen);
        assert_eq!(seen.closed.load(Ordering::Relaxed), 3);
        assert_eq!(seen.silent.load(Ordering::Relaxed), 5);
        std::thread::sleep(Duration::from_millis(350));
        watch.look(0, &seen);
        assert_eq!(seen.closed.load(Ordering::Relaxed), 5);
        // The silent clients see the end of their streams; the talker's stays open.
        for mut q in quiet {
            q.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            assert_eq!(std::io::Read::read(&mut q, &mut buf).unwrap_or(0), 0);
        }
        talker.write_all(b"still here").unwrap();
        let mut more = [0u8; 10];
        std::io::Read::read_exact(&mut &accepted[0], &mut more).unwrap();
        assert_eq!(&more, b"still here");
    }

    #[test]
    fn ports_of_socket_addresses_only() {
        let mut v4 = vec![0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&4242u16.to_be_bytes());
        assert_eq!(port_of(&v4), Some(4242));
        assert_eq!(port_of(b"fi_shm://1234"), None);
        assert_eq!(port_of(&v4[..8]), None);
    }
}
