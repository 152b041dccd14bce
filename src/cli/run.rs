//! `weft run`: starts the ranks of a job on this node, forwards their output, and stops the
//! whole job as soon as one rank fails, naming the rank and the cause.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, ExitStatus, Stdio};
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

fn forward(rank: u32, src: impl Read + Send + 'static, to_stderr: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        while r.read_until(b'\n', &mut line).map(|n| n > 0).unwrap_or(false) {
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
    })
}

/// A job id unique on this node: letters and digits only.
pub fn new_job_id() -> String {
    format!("{:x}x{:x}", std::process::id(), os::now_ns() & 0xffff_ffff_ffff)
}

/// Runs the job. Returns the exit status of the rank that failed first (128+signal for a
/// signal), or, if none failed, the worst status of all ranks (0 when all succeeded).
pub fn launch(spec: &LaunchSpec) -> Result<i32, String> {
    if spec.ranks == 0 {
        return Err("need at least one rank (-n 1 or more)".into());
    }
    os::catch_interrupts();
    let job = new_job_id();
    let mut children: Vec<(u32, Child)> = Vec::new();
    let mut forwarders = Vec::new();
    // One start-up channel per rank (`WEFT_BOOT_FD`), answered by `boot::serve`: network
    // fabrics exchange their endpoint addresses through it.
    let mut boot_ends = Vec::new();
    // The cores the ranks share (they inherit this process's affinity and quota), for their
    // oversubscription test, which must not look at a rank's own mask (see the runtime's
    // config).
    let node_cpus = std::thread::available_parallelism().map_or(0, |c| c.get());
    for rank in 0..spec.ranks {
        let (ours, theirs) =
            UnixStream::pair().map_err(|e| format!("cannot create the start-up channel: {e}"))?;
        let mut cmd = Command::new(&spec.program);
        os::inherit_fd(&mut cmd, theirs.as_raw_fd());
        cmd.args(&spec.args)
            .env("WEFT_RANK", rank.to_string())
            .env("WEFT_SIZE", spec.ranks.to_string())
            .env("WEFT_NODE_CPUS", node_cpus.to_string())
            .env("WEFT_JOB", &job)
            .env("WEFT_BOOT_FD", theirs.as_raw_fd().to_string())
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(if rank == 0 { Stdio::inherit() } else { Stdio::null() });
        if spec.label {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let spawned = os::spawn_tied_to_parent(&mut cmd);
        drop(theirs);
        boot_ends.push(ours);
        match spawned {
            Ok(mut child) => {
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
                    let _ = c.kill();
                    let _ = c.wait();
                }
                os::unlink_prefix(&weft_fabric::shm::file_prefix(&job));
                return Err(format!("cannot start {:?}: {e}", spec.program));
            }
        }
    }
    // Ends by itself once a rank exits (and with it the exchange).
    drop(weft_fabric::boot::serve(boot_ends));
    let started = Instant::now();
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; spec.ranks as usize];
    let mut stopping: Option<Instant> = None;
    let mut first_failure: Option<i32> = None;
    let mut terminated = false;
    let terminate = |children: &[(u32, Child)], statuses: &[Option<ExitStatus>]| {
        for (r, c) in children {
            if statuses[*r as usize].is_none() {
                os::kill(c.id(), os::SIGTERM);
            }
        }
    };
    loop {
        let mut running = 0;
        for (rank, child) in children.iter_mut() {
            let r = *rank as usize;
            if statuses[r].is_some() {
                continue;
            }
            match child.try_wait() {
                Ok(Some(st)) => {
                    statuses[r] = Some(st);
                    if stopping.is_none() {
                        if let Some(cause) = describe(st) {
                            eprintln!(
                                "weft run: rank {rank} (pid {}) {cause}; stopping the other {} rank(s)",
                                child.id(),
                                statuses.iter().filter(|s| s.is_none()).count()
                            );
                            stopping = Some(Instant::now());
                            first_failure = Some(exit_code(st));
                        }
                    }
                }
                Ok(None) => running += 1,
                Err(_) => statuses[r] = Some(ExitStatus::default()),
            }
        }
        if running == 0 {
            break;
        }
        match stopping {
            None => {
                if let Some(sig) = os::interrupted() {
                    eprintln!(
                        "weft run: interrupted by {}; stopping {running} rank(s)",
                        os::signal_name(sig)
                    );
                    stopping = Some(Instant::now());
                } else if let Some(t) = spec.timeout.filter(|t| started.elapsed() > *t) {
                    // Which ranks are still there says where a hang is.
                    let still: Vec<String> = children
                        .iter()
                        .filter(|(r, _)| statuses[*r as usize].is_none())
                        .map(|(r, c)| format!("{r} (pid {})", c.id()))
                        .collect();
                    eprintln!(
                        "weft run: time limit of {t:?} reached; stopping {running} rank(s): {}",
                        still.join(", ")
                    );
                    stopping = Some(Instant::now());
                }
            }
            Some(t) if t.elapsed() > GRACE => {
                for (r, c) in children.iter_mut() {
                    if statuses[*r as usize].is_none() {
                        let _ = c.kill();
                    }
                }
            }
            Some(_) => {}
        }
        if stopping.is_some() && !terminated {
            terminate(&children, &statuses);
            terminated = true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    for f in forwarders {
        let _ = f.join();
    }
    // Our own files, and libfabric's shm provider regions, named after a rank's pid
    // ("PID:N:N") and unlinked only when the endpoint closes, which a rank that was killed or
    // left without finalizing never does. Every rank has exited by now: one scan for all.
    let pids: Vec<String> = children.iter().map(|(_, c)| format!("{}:", c.id())).collect();
    let mut prefixes = vec![weft_fabric::shm::file_prefix(&job)];
    prefixes.extend(pids);
    let removed = os::unlink_prefixes(&prefixes.iter().map(String::as_str).collect::<Vec<_>>());
    if removed > 0 {
        eprintln!("weft run: removed {removed} shared-memory file(s) a rank left in {}", os::SHM_DIR);
    }
    // The rank that failed first is the cause: the others' statuses are the launcher's doing.
    let worst = statuses.iter().flatten().map(|s| exit_code(*s)).max().unwrap_or(0);
    Ok(match (first_failure, stopping) {
        (Some(code), _) => code,
        (None, Some(_)) => worst.max(1),
        (None, None) => worst,
    })
}
