//! `weft run`: starts the ranks of a job on this node, forwards their output, and stops the
//! whole job as soon as one rank fails, naming the rank and the cause.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_fabric::os;

/// What to launch.
pub struct LaunchSpec {
    /// Number of ranks.
    pub ranks: u32,
    /// Program and arguments.
    pub program: OsString,
    pub args: Vec<OsString>,
    /// Prefix every output line with `[rank]`.
    pub label: bool,
    /// Stop the job after this long.
    pub timeout: Option<Duration>,
    /// Extra environment for every rank.
    pub env: Vec<(String, String)>,
}

/// How long ranks get between SIGTERM and SIGKILL once the job is being stopped.
const GRACE: Duration = Duration::from_millis(500);

fn describe(status: ExitStatus) -> Option<String> {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        return Some(format!("was killed by {}", os::signal_name(sig)));
    }
    match status.code() {
        Some(0) => None,
        Some(101) => Some("panicked (exit status 101)".to_string()),
        Some(c) => Some(format!("exited with status {c}")),
        None => Some("ended abnormally".to_string()),
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Copies a rank's output to ours, each line prefixed with `[rank] `; a line longer than
/// [`LONG_LINE`] goes out in pieces of that size, each prefixed and ended, so that the
/// launcher holds at most that much of it. The flag is true while the thread waits to read
/// (rather than writing what it read).
fn forward(rank: u32, src: impl Read + Send + 'static, to_stderr: bool) -> Forwarder {
    let reading = Arc::new(AtomicBool::new(true));
    let flag = reading.clone();
    let thread = std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        loop {
            flag.store(true, Ordering::Release);
            let more =
                (&mut r).take(LONG_LINE as u64).read_until(b'\n', &mut line).map(|n| n > 0).unwrap_or(false);
            flag.store(false, Ordering::Release);
            if !more {
                return;
            }
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            let mut buf = format!("[{rank}] ").into_bytes();
            buf.extend_from_slice(&line);
            let _ = if to_stderr {
                std::io::stderr().lock().write_all(&buf)
            } else {
                std::io::stdout().lock().write_all(&buf)
            };
            line.clear();
        }
    });
    Forwarder { thread, reading }
}

/// Bytes of one line (or piece of a longer one) that output forwarding holds.
const LONG_LINE: usize = 64 << 10;

/// A thread copying a rank's output, and whether it is waiting for more.
struct Forwarder {
    thread: std::thread::JoinHandle<()>,
    reading: Arc<AtomicBool>,
}

impl Forwarder {
    /// True while the copy goes on: it has not ended, and it is writing out what it read,
    /// or it waits for output and `waiting_allowed` (a process a rank started may hold the
    /// pipe open for ever; what was read is always written out).
    fn busy(&self, waiting_allowed: bool) -> bool {
        !self.thread.is_finished() && (waiting_allowed || !self.reading.load(Ordering::Acquire))
    }
}

/// A job id unique on this node and unguessable, from which a later `weft run` can tell
/// whether the job's launcher is gone (see [`weft_fabric::names::new_job_id`]).
pub fn new_job_id() -> Result<String, String> {
    weft_fabric::names::new_job_id("").map_err(|e| format!("cannot make a job id: {e}"))
}

/// The exit status of a job that reached its time limit (as timeout(1)).
const TIMED_OUT: i32 = 124;

/// How long output forwarding may go on after the last rank was reaped (a process a rank
/// started may still hold its output pipe).
const FORWARD_GRACE: Duration = Duration::from_millis(500);

/// Copies this process's standard input to rank 0's, for a terminal: a rank runs in a process
/// group of its own, and one that read the terminal from outside the foreground group would
/// be stopped (SIGTTIN). Ends with the input or when rank 0 stops reading.
fn forward_stdin(mut to: std::process::ChildStdin) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut to);
    });
}

/// Of the ranks that ended in one look, the one to name as the job's cause: the first to
/// fail where `ended` is in the order they ended; else (the order unknown) one killed by a
/// signal before one that exited with an error (a rank that sees a peer die exits with an
/// error of its own), else the first.
fn cause_of(ended: &[(u32, u32, ExitStatus)], ordered: bool) -> Option<(u32, u32, ExitStatus, String)> {
    use std::os::unix::process::ExitStatusExt;
    let failed = ended.iter().filter_map(|&(r, pid, st)| describe(st).map(|c| (r, pid, st, c)));
    let (signalled, other): (Vec<_>, Vec<_>) =
        failed.partition(|(_, _, st, _)| !ordered && st.signal().is_some());
    signalled.into_iter().chain(other).next()
}

/// Runs the job. Returns the exit status of the rank that failed first (128+signal for a
/// signal), or, if none failed, the worst status of all ranks (0 when all succeeded).
pub fn launch(spec: &LaunchSpec) -> Result<i32, String> {
    if spec.ranks == 0 {
        return Err("need at least one rank (-n 1 or more)".into());
    }
    os::catch_interrupts();
    // What a rank starts outside its process group (setsid) comes back here when the rank
    // ends, so the job's end reaches it too.
    weft_fabric::reap::adopt_orphans();
    let orphans = os::remove_orphaned_files();
    if orphans > 0 {
        eprintln!(
            "weft run: removed {orphans} file(s) of earlier jobs whose launcher is gone from {}",
            os::SHM_DIR
        );
    }
    let job = new_job_id()?;
    let mut children: Vec<(u32, Child)> = Vec::new();
    let mut forwarders = Vec::new();
    // One start-up channel per rank (`WEFT_BOOT_FD`), answered by `boot::serve`: network
    // fabrics exchange their endpoint addresses through it.
    let mut boot_ends = Vec::new();
    // The cores the ranks share (they inherit this process's affinity and quota), for their
    // oversubscription test, which must not look at a rank's own mask (see the runtime's
    // config).
    // The user's own value (checked by the rank) wins over the launcher's.
    let node_cpus = std::env::var_os("WEFT_NODE_CPUS")
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(0, |c| c.get()).to_string().into());
    let stdin_is_terminal = std::io::stdin().is_terminal();
    for rank in 0..spec.ranks {
        let (ours, theirs) =
            UnixStream::pair().map_err(|e| format!("cannot create the start-up channel: {e}"))?;
        let mut cmd = Command::new(&spec.program);
        os::inherit_fd(&mut cmd, theirs.as_raw_fd());
        cmd.args(&spec.args)
            .env("WEFT_RANK", rank.to_string())
            .env("WEFT_SIZE", spec.ranks.to_string())
            .env("WEFT_JOB", &job)
            .env("WEFT_NODE_CPUS", &node_cpus)
            .env("WEFT_BOOT_FD", theirs.as_raw_fd().to_string())
            .env("WEFT_LAUNCHER_PID", std::process::id().to_string())
            // libfabric's psm provider loads a library whose SIGSEGV handler prints a backtrace
            // into a file and exits 1; without it a crash reads as the signal (as mpirun does).
            .env("IPATH_NO_BACKTRACE", std::env::var_os("IPATH_NO_BACKTRACE").unwrap_or("1".into()))
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(match rank {
                0 if stdin_is_terminal => Stdio::piped(),
                0 => Stdio::inherit(),
                _ => Stdio::null(),
            });
        if spec.label {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let spawned = os::spawn_rank(&mut cmd);
        drop(theirs);
        boot_ends.push(ours);
        match spawned {
            Ok(mut child) => {
                if let Some(i) = child.stdin.take() {
                    forward_stdin(i);
                }
                if let Some(o) = child.stdout.take() {
                    forwarders.push(forward(rank, o, false));
                }
                if let Some(e) = child.stderr.take() {
                    forwarders.push(forward(rank, e, true));
                }
                children.push((rank, child));
            }
            Err(e) => {
                for (_, c) in &mut children {
                    os::kill_group(c.id(), os::SIGKILL);
                    let _ = c.wait();
                }
                os::remove_trees(&weft_fabric::shm::job_dir(&job));
                return Err(format!("cannot start {:?}: {e}", spec.program));
            }
        }
    }
    // Ends by itself once a rank exits (and with it the exchange).
    drop(weft_fabric::boot::serve(boot_ends));
    let started = Instant::now();
    // Exits in the order they happen (`None`: unknown here; the launcher then looks every 2 ms).
    let pids: Vec<u32> = children.iter().map(|(_, c)| c.id()).collect();
    let mut exits = weft_fabric::exits::ExitOrder::new(&pids);
    let mut exited: Vec<u32> = vec![];
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; spec.ranks as usize];
    let mut stopping: Option<Instant> = None;
    let mut first_failure: Option<i32> = None;
    // The exit status of a job the launcher stopped (interrupt, time limit).
    let mut forced: Option<i32> = None;
    let (mut terminated, mut killed) = (false, false);
    // Every rank leads a process group; signalling the groups reaches what the ranks started
    // too (a group lives on while any of its processes does, after its rank was reaped).
    let signal_all = |children: &[(u32, Child)], sig: i32| {
        for (_, c) in children {
            os::kill_group(c.id(), sig);
        }
    };
    loop {
        let mut running = Vec::new();
        let mut ended = Vec::new();
        if let Some(e) = &mut exits {
            exited.extend(e.wait(Duration::ZERO));
        }
        for (rank, child) in children.iter_mut() {
            let r = *rank as usize;
            if statuses[r].is_some() {
                continue;
            }
            match child.try_wait() {
                Ok(Some(st)) => {
                    statuses[r] = Some(st);
                    ended.push((*rank, child.id(), st));
                }
                Ok(None) => running.push(child.id()),
                Err(_) => statuses[r] = Some(ExitStatus::default()),
            }
        }
        // Those whose exits were seen, in the order they happened; then the rest in rank order
        // (any that ended since ended after them).
        ended.sort_by_key(|&(rank, pid, _)| {
            (exited.iter().position(|&p| p == pid).unwrap_or(usize::MAX), rank)
        });
        // A rank's shmem_global_exit: the job ends with the status it asked for, whatever the
        // ranks that saw it vanish did since (it asked before it began to exit).
        if let (None, Some((status, by))) = (stopping, os::end_asked()) {
            match children.iter().find(|(_, c)| c.id() == by) {
                Some((rank, _)) => {
                    eprintln!(
                        "weft run: rank {rank} ended the job with status {status}; stopping the ranks still running"
                    );
                    forced = Some(status);
                    stopping = Some(Instant::now());
                }
                None => eprintln!("weft run: ignoring SIGUSR1 from process {by}, which is not a rank"),
            }
        }
        if stopping.is_none() {
            if let Some((rank, pid, st, cause)) = cause_of(&ended, exits.is_some()) {
                match running.len() {
                    0 => eprintln!("weft run: rank {rank} (pid {pid}) {cause}"),
                    left => eprintln!(
                        "weft run: rank {rank} (pid {pid}) {cause}; stopping the other {left} rank(s)"
                    ),
                }
                stopping = Some(Instant::now());
                first_failure = Some(exit_code(st));
            }
        }
        if running.is_empty() {
            break;
        }
        match stopping {
            None => {
                if let Some(sig) = os::interrupted() {
                    forced = Some(128 + sig);
                    eprintln!(
                        "weft run: interrupted by {}; stopping {} rank(s) (again to kill them at once)",
                        os::signal_name(sig),
                        running.len()
                    );
                    stopping = Some(Instant::now());
                } else if let Some(t) = spec.timeout.filter(|t| started.elapsed() > *t) {
                    // Which ranks are still there says where a hang is.
                    let still: Vec<String> = children
                        .iter()
                        .filter(|(r, _)| statuses[*r as usize].is_none())
                        .map(|(r, c)| format!("{r} (pid {})", c.id()))
                        .collect();
                    forced = Some(TIMED_OUT);
                    eprintln!(
                        "weft run: time limit of {t:?} reached; stopping {} rank(s): {}",
                        running.len(),
                        still.join(", ")
                    );
                    stopping = Some(Instant::now());
                }
            }
            // A grace period, or a second interrupt: SIGKILL.
            Some(t) if !killed && (t.elapsed() > GRACE || os::interrupts() >= 2) => {
                signal_all(&children, os::SIGKILL);
                killed = true;
            }
            Some(_) => {}
        }
        if stopping.is_some() && !terminated {
            signal_all(&children, os::SIGTERM);
            terminated = true;
        }
        exited = match &mut exits {
            Some(e) => e.wait(Duration::from_millis(2)),
            None => {
                std::thread::sleep(Duration::from_millis(2));
                vec![]
            }
        };
    }
    // What the ranks started and left behind goes with the job, however it ended: their
    // process groups, and what left them (adopted).
    signal_all(&children, os::SIGKILL);
    weft_fabric::reap::kill_orphans(Duration::from_secs(2));
    // Output still held open by a process a rank started ends the forwarding after a grace
    // period (the job is over when its ranks are); output already read is written out.
    let reaped = Instant::now();
    while forwarders.iter().any(|f| f.busy(reaped.elapsed() < FORWARD_GRACE)) {
        std::thread::sleep(Duration::from_millis(2));
    }
    for f in forwarders.into_iter().filter(|f| f.thread.is_finished()) {
        let _ = f.thread.join();
    }
    // Our own files, and libfabric's shm provider regions, named after a rank's pid
    // ("PID:N:N") and unlinked only when the endpoint closes, which a rank that was killed or
    // left without finalizing never does. Every rank has exited by now: one scan for all.
    let pids: Vec<String> = children.iter().map(|(_, c)| format!("{}:", c.id())).collect();
    let removed = os::remove_trees(&weft_fabric::shm::job_dir(&job))
        + os::unlink_prefixes(&pids.iter().map(String::as_str).collect::<Vec<_>>());
    if removed > 0 {
        eprintln!("weft run: removed {removed} shared-memory file(s) a rank left in {}", os::SHM_DIR);
    }
    // The rank that failed first is the cause: the others' statuses are the launcher's doing.
    let worst = statuses.iter().flatten().map(|s| exit_code(*s)).max().unwrap_or(0);
    // A job stopped by an interrupt or the time limit says so (128 + the signal; 124, as
    // timeout(1) does), not with the status its ranks got from being stopped.
    Ok(match (first_failure, forced, stopping) {
        (Some(code), _, _) => code,
        (None, Some(code), _) => code,
        (None, None, Some(_)) => worst.max(1),
        (None, None, None) => worst,
    })
}
