//! The launcher's reaping of what its ranks left behind: processes that left a rank's process
//! group come back to it (a child subreaper) and are killed at the job's end.

use std::time::Duration;

/// Makes this process the reaper of its orphaned descendants (`PR_SET_CHILD_SUBREAPER`): a
/// process a rank started that leaves the rank's process group (`setsid`) and outlives the
/// rank becomes this process's child, so [`kill_orphans`] reaches it.
pub fn adopt_orphans() -> bool {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes a flag and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) == 0 }
}

/// Kills and reaps every child this process still has (the descendants it adopted, see
/// [`adopt_orphans`]; their own children are adopted in turn as they die), for at most
/// `limit`. Call it once every child it waits for otherwise has been reaped. Returns how
/// many it killed.
pub fn kill_orphans(limit: Duration) -> usize {
    let start = std::time::Instant::now();
    let mut killed = 0;
    loop {
        let kids: Vec<u32> = std::fs::read_dir("/proc/self/task")
            .map(|d| {
                d.flatten()
                    .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                    .flat_map(|s| s.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
                    .collect()
            })
            .unwrap_or_default();
        for &k in &kids {
            crate::os::kill(k, libc::SIGKILL);
        }
        killed += kids.len();
        // SAFETY: waitpid writes no memory when the status pointer is null; WNOHANG never
        // blocks; it reaps only children of this process.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        if kids.is_empty() || start.elapsed() > limit {
            return killed;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
