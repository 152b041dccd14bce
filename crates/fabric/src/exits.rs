//! Child processes' exits in the order they happen: a launcher that looks only every so
//! often (or is scheduled late on a busy node) may find two ranks ended at one look, the one
//! that failed and one that exited because it saw that one vanish, and must still name the
//! first.
//!
//! Each child has a pidfd on one epoll set, armed once (`EPOLLONESHOT`). A pidfd becomes
//! readable when its process exits, and epoll hands out ready descriptors in the order they
//! became ready.

use std::time::Duration;

/// The exits of a set of child processes, each reported once, in order.
pub struct ExitOrder {
    epoll: libc::c_int,
    pidfds: Vec<libc::c_int>,
    /// What `epoll_wait` fills (one entry per process).
    events: Vec<libc::epoll_event>,
}

impl ExitOrder {
    /// Watches `pids` (children of this process, not yet reaped); `None` where pidfds or
    /// epoll are not available.
    pub fn new(pids: &[u32]) -> Option<ExitOrder> {
        // SAFETY: epoll_create1 takes flags and touches no memory.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return None;
        }
        let events = vec![libc::epoll_event { events: 0, u64: 0 }; pids.len().max(1)];
        let mut order = ExitOrder { epoll, pidfds: Vec::with_capacity(pids.len()), events };
        for &pid in pids {
            let fd = crate::os::pidfd_open(pid as libc::pid_t).ok()?;
            order.pidfds.push(fd);
            let mut ev =
                libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32, u64: pid as u64 };
            // SAFETY: both descriptors are open and ev is a valid event for the call.
            if unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
                return None;
            }
        }
        Some(order)
    }

    /// Waits up to `timeout` for an exit; returns the processes that ended since the last
    /// call (none on a timeout), in the order they ended.
    pub fn wait(&mut self, timeout: Duration) -> Vec<u32> {
        let n = self.events.len();
        let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as libc::c_int;
        // SAFETY: events holds n entries for the kernel to fill; the epoll descriptor is open.
        let got = unsafe { libc::epoll_wait(self.epoll, self.events.as_mut_ptr(), n as libc::c_int, ms) };
        self.events.iter().take(got.max(0) as usize).map(|e| e.u64 as u32).collect()
    }
}

impl Drop for ExitOrder {
    fn drop(&mut self) {
        for &fd in self.pidfds.iter().chain([&self.epoll]) {
            // SAFETY: each descriptor is owned here and closed once.
            unsafe { libc::close(fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ExitOrder;
    use std::process::Command;
    use std::time::Duration;

    #[test]
    fn exits_come_in_the_order_they_happen() {
        // Started in one order, ending in the other; looked at only once both have ended.
        let mut late = Command::new("sleep").arg("0.4").spawn().unwrap();
        let mut early = Command::new("sleep").arg("0.1").spawn().unwrap();
        let mut order = ExitOrder::new(&[late.id(), early.id()]).expect("pidfds and epoll");
        std::thread::sleep(Duration::from_millis(800));
        let seen = order.wait(Duration::from_millis(100));
        assert_eq!(seen, vec![early.id(), late.id()]);
        // Each is reported once.
        assert!(order.wait(Duration::from_millis(10)).is_empty());
        early.wait().unwrap();
        late.wait().unwrap();
    }
}
