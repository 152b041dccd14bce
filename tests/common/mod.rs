//! What the multi-process test programs share.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Ends a rank with the outcome of its case: status 0, or 1 after printing why.
pub fn exit_with(outcome: Res) -> ! {
    match outcome {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            println!("FAILED: {e}");
            std::process::exit(1);
        }
    }
}

/// A job's output, for a failure message.
pub fn text(o: &Output) -> String {
    format!(
        "--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The launcher jobs start under: `weft run` by default, or Open MPI's `mpirun` or Slurm's
/// `srun --mpi=pmix` (`WEFT_TEST_LAUNCHER=mpirun|srun`; ranks meet through PMIx, which needs a
/// build with the `pmix` feature).
#[allow(dead_code)]
pub fn launcher() -> &'static str {
    match std::env::var("WEFT_TEST_LAUNCHER").as_deref() {
        Ok("mpirun") => "mpirun",
        Ok("srun") => "srun",
        Ok(other) => panic!("WEFT_TEST_LAUNCHER={other}: expected mpirun or srun"),
        Err(_) => "weft run",
    }
}

/// Starts `n` ranks of this test executable through `weft run` (or `mpirun` or `srun`, see
/// [`launcher`]), with `var=case` naming the rank program; returns the output, how long the
/// job took, and the launcher's pid.
#[allow(dead_code)]
pub fn launch(var: &str, case: &str, n: u32, env: &[(&str, &str)]) -> (Output, Duration, u32) {
    let exe = std::env::current_exe().expect("test executable");
    let t = Instant::now();
    let mut session_base = None;
    let mut cmd = match launcher() {
        "mpirun" => {
            // Open MPI's session directory under a base of this launch's own: jobs started side
            // by side race creating and removing a shared `/tmp/ompi.HOST.UID` ("mkdir ...
            // File exists").
            static LAUNCHES: AtomicU32 = AtomicU32::new(0);
            let base = std::env::temp_dir().join(format!(
                "weft-test-ompi-{}-{}",
                std::process::id(),
                LAUNCHES.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&base).expect("Open MPI session base");
            let mut c = Command::new("mpirun");
            c.args(["-n", &n.to_string(), "--allow-run-as-root", "--oversubscribe", "--timeout", "120"]);
            c.arg("--mca").arg("orte_tmpdir_base").arg(&base);
            session_base = Some(base);
            for k in std::iter::once(var).chain(env.iter().map(|(k, _)| *k)) {
                c.args(["-x", k]);
            }
            c
        }
        "srun" => {
            // srun passes the whole environment on; a rank that fails ends the job.
            let mut c = Command::new("srun");
            c.args([
                "--mpi=pmix",
                "-n",
                &n.to_string(),
                "--oversubscribe",
                "--kill-on-bad-exit=1",
                "--time=2",
            ]);
            c
        }
        _ => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
            c.args(["run", "-n", &n.to_string(), "--timeout", "120", "--"]);
            // An exec wrapper for every rank (the two-host namespace test places ranks with it).
            if let Ok(w) = std::env::var("WEFT_TEST_WRAPPER") {
                c.arg(w);
            }
            c
        }
    };
    let child = cmd
        .arg(exe)
        .env(var, case)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start weft run");
    let pid = child.id();
    let out = child.wait_with_output().expect("weft run");
    if let Some(base) = session_base {
        let _ = std::fs::remove_dir_all(base);
    }
    (out, t.elapsed(), pid)
}

/// What the job started by launcher `launcher_pid` left in /dev/shm.
#[allow(dead_code)]
pub fn shm_leftovers(launcher_pid: u32) -> Vec<String> {
    let prefix = format!("weft-{launcher_pid:x}n");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs a job (see [`launch`]) that must succeed and leave nothing in /dev/shm.
#[allow(dead_code)]
pub fn run_job(var: &str, case: &str, n: u32, env: &[(&str, &str)]) -> Result<(), String> {
    let (out, took, pid) = launch(var, case, n, env);
    if !out.status.success() {
        return Err(format!("{case} with {n} ranks failed after {took:?} ({})\n{}", out.status, text(&out)));
    }
    let left = shm_leftovers(pid);
    if !left.is_empty() {
        return Err(format!("files left in /dev/shm: {left:?}"));
    }
    Ok(())
}

/// One multi-process test: the rank program `run`, started with each count in `ranks` and the
/// extra environment `env`.
#[allow(dead_code)]
pub struct Case {
    pub name: &'static str,
    pub run: fn() -> Res,
    pub ranks: &'static [u32],
    pub env: &'static [(&'static str, &'static str)],
}

/// One trial per case and rank count, each a job whose ranks find their case in `var`.
#[allow(dead_code)]
pub fn trials(var: &'static str, cases: &'static [Case]) -> Vec<libtest_mimic::Trial> {
    cases
        .iter()
        .flat_map(|c| {
            c.ranks.iter().map(move |&n| {
                libtest_mimic::Trial::test(format!("{}_{n}ranks", c.name), move || {
                    run_job(var, c.name, n, c.env).map_err(Into::into)
                })
            })
        })
        .collect()
}

/// Why a rank program failed: its words. Made from a weft error or any text, so that `?`
/// works on both in a rank program.
#[derive(Debug)]
pub struct Failure(pub String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<weft::Error> for Failure {
    fn from(e: weft::Error) -> Self {
        Failure(e.to_string())
    }
}

impl From<String> for Failure {
    fn from(s: String) -> Self {
        Failure(s)
    }
}

impl From<&str> for Failure {
    fn from(s: &str) -> Self {
        Failure(s.to_string())
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure(e.to_string())
    }
}

/// What a rank program returns: `Err` says why it failed.
#[allow(dead_code)]
pub type Res<T = ()> = Result<T, Failure>;

/// `Ok` if `cond` holds, else the error `what` says.
#[allow(dead_code)]
pub fn ck(cond: bool, what: impl FnOnce() -> String) -> Res {
    if cond {
        Ok(())
    } else {
        Err(Failure(what()))
    }
}

/// A weft error as a rank program's failure.
#[allow(dead_code)]
pub fn e2s(e: weft::Error) -> String {
    e.to_string()
}

/// A rank program that is not a [`Case`] of its own: its name and body.
#[allow(dead_code)]
pub type Program = (&'static str, fn() -> Res);

/// In a rank (`var` names its program, one of `cases` or `more`): runs it and exits with its
/// outcome. Returns where `var` is not set (the test driver).
#[allow(dead_code)]
pub fn run_rank(var: &str, cases: &[Case], more: &[Program]) {
    let Ok(name) = std::env::var(var) else { return };
    let found = cases.iter().find(|c| c.name == name).map(|c| c.run);
    let Some(run) = found.or_else(|| more.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)) else {
        eprintln!("unknown test case {name}");
        std::process::exit(2);
    };
    exit_with(run());
}

/// Resident memory of this process in KiB, but for mapped files: `RssShmem` (pages of
/// /dev/shm files it maps, its own and its peers') and `RssAnon` (its heap, and segments on
/// libfabric). Only this process's mappings count, not other jobs'.
#[allow(dead_code)]
pub fn rss_kib() -> Result<u64, String> {
    Ok(status_kib("RssShmem:")? + status_kib("RssAnon:")?)
}

/// What this process holds, in KiB: its resident pages of /dev/shm files (`RssShmem`) and
/// its heap in use ([`weft_fabric::heap_in_use`]). Unlike [`rss_kib`], it leaves out what the
/// allocator keeps after `free` and thread stacks' pages, which vary with the machine's load
/// (resident memory rose by 0.4-0.8 MiB at random runs of repeated FT on a loaded machine
/// while the heap in use stayed within 30 KiB), and segments on libfabric (anonymous maps).
#[allow(dead_code)]
pub fn held_kib() -> Result<u64, String> {
    Ok(status_kib("RssShmem:")? + weft_fabric::heap_in_use() / 1024)
}

/// A field of /proc/self/status in KiB.
fn status_kib(name: &str) -> Result<u64, String> {
    let s = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    s.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| format!("no {name} in /proc/self/status"))
}
