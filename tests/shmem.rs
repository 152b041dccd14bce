//! The OpenSHMEM conformance suite: the C programs of `tests/shmem/`, built with `weft cc`
//! (`-std=c11 -Wall -Wextra -Werror`), run with `weft run` on 1, 2 and 4 PEs, over whatever
//! fabric the environment chooses (`WEFT_FABRIC`). Erroneous calls must end the job with a
//! message naming the routine, in seconds, and leave nothing in /dev/shm.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

const WEFT: &str = env!("CARGO_BIN_EXE_weft");

/// The built programs, by name and flavour: one cell each, so that two tests wanting the same
/// program wait for one build instead of writing the file while the other runs it (which
/// fails with "Text file busy").
type Cells = Mutex<HashMap<String, Arc<OnceLock<PathBuf>>>>;
static BUILT: OnceLock<Cells> = OnceLock::new();

/// Builds `tests/shmem/NAME.c` with `weft cc` (plus `extra` flags) once; returns the program.
fn build(name: &str, extra: &[&str], cxx: bool) -> PathBuf {
    let key = format!("{name}{extra:?}{cxx}");
    let cell = BUILT.get_or_init(Default::default).lock().unwrap().entry(key).or_default().clone();
    cell.get_or_init(|| compile(name, extra, cxx)).clone()
}

/// Compiles one program under a private name and renames it into place, so that no process
/// can exec a half-written file.
fn compile(name: &str, extra: &[&str], cxx: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shmem").join(format!("{name}.c"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shmem");
    std::fs::create_dir_all(&dir).unwrap();
    let flavour = if cxx {
        "-cxx"
    } else if extra.is_empty() {
        ""
    } else {
        "-static"
    };
    let out = dir.join(format!("{name}{flavour}"));
    let partial = dir.join(format!(".{name}{flavour}.{}", std::process::id()));
    let mut cmd = Command::new(WEFT);
    cmd.arg(if cxx { "c++" } else { "cc" });
    if cxx {
        cmd.args(["-x", "c++", "-std=c++11"]);
    } else {
        cmd.arg("-std=c11");
    }
    let o = cmd
        .args(["-O1", "-Wall", "-Wextra", "-Werror"])
        .args(extra)
        .arg(&src)
        .args(["-lm", "-o"])
        .arg(&partial)
        .output()
        .unwrap();
    assert!(o.status.success(), "weft cc {name} failed\n{}", common::text(&o));
    std::fs::rename(&partial, &out).unwrap();
    out
}

/// Runs `prog` on `n` PEs; returns the output, the time taken and the launcher's pid.
fn run(prog: &Path, n: u32, args: &[&str]) -> (Output, Duration, u32) {
    run_with(prog, n, args, &[])
}

/// [`run`] with environment variables `env` set.
fn run_with(prog: &Path, n: u32, args: &[&str], env: &[(&str, &str)]) -> (Output, Duration, u32) {
    let t = Instant::now();
    let child = Command::new(WEFT)
        .envs(env.iter().copied())
        .args(["run", "-n", &n.to_string(), "--timeout", "120", "--"])
        .arg(prog)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    (out, t.elapsed(), pid)
}

/// Runs `name` on 1, 2 and 4 PEs; each must succeed, print its line, and clean up.
fn passes(name: &str) {
    passes_with(name, &[]);
}

/// [`passes`] with environment variables `env` set.
fn passes_with(name: &str, env: &[(&str, &str)]) {
    let prog = build(name, &[], false);
    for n in [1, 2, 4] {
        let (out, took, pid) = run_with(&prog, n, &[], env);
        let text = common::text(&out);
        assert!(out.status.success(), "{name} on {n} PEs failed after {took:?}\n{text}");
        assert!(text.contains(&format!("{name}: {n} PEs ok")), "{name} on {n} PEs printed no result\n{text}");
        let left = common::shm_leftovers(pid);
        assert!(left.is_empty(), "{name} on {n} PEs left {left:?} in /dev/shm");
    }
}

#[test]
fn setup_and_queries() {
    passes("setup");
}

#[test]
fn symmetric_heap() {
    passes("heap");
}

#[test]
fn puts_and_gets() {
    passes("rma");
}

#[test]
fn symmetric_static_data() {
    passes("globals");
}

#[test]
fn collectives_and_teams() {
    passes("coll");
}

#[test]
fn locks() {
    passes("lock");
}

#[test]
fn atomics() {
    passes("amo");
}

/// Contexts on the world's path (the default), then on a pool of endpoints where PEs are
/// reached over a network (on shared memory the variables are only checked).
#[test]
fn contexts() {
    passes("ctx");
    passes_with("ctx", &[("WEFT_SHMEM_CONTEXTS", "3"), ("WEFT_SHMEM_CTX_CATEGORY", "dynamic")]);
    passes_with("ctx", &[("WEFT_SHMEM_CONTEXTS", "2"), ("WEFT_SHMEM_CTX_CATEGORY", "shared")]);
}

#[test]
fn point_to_point_synchronization() {
    passes("sync");
}

/// The static library and C++ compilers build and run the same programs. With weft linked
/// into the program its globals cannot be made symmetric (weft's own statics are among
/// them): an access to one ends the job saying so.
#[test]
fn static_library_and_cxx() {
    for prog in [build("rma", &["--weft-static"], false), build("setup", &[], true)] {
        let (out, took, _) = run(&prog, 2, &[]);
        assert!(out.status.success(), "{} failed after {took:?}\n{}", prog.display(), common::text(&out));
    }
    let (out, _, _) = run(&build("globals", &["--weft-static"], false), 2, &[]);
    let text = common::text(&out);
    assert!(!out.status.success() && text.contains("linked into the program"), "static globals\n{text}");
}

/// True (and says so) where the fabric is not shared memory, which a test needs for `why`.
fn not_on_shared_memory(why: &str) -> bool {
    let other = std::env::var("WEFT_FABRIC").is_ok_and(|f| f != "shm");
    if other {
        eprintln!("skipped: {why}");
    }
    other
}

/// Runs shell `script` in a private mount namespace with a tmpfs of `size` on /dev/shm
/// (`unshare -m`, root); `None` (and says so) where no such namespace can be made.
fn in_private_dev_shm(size: &str, script: &str) -> Option<(Output, String)> {
    let script = format!("mount -t tmpfs -o size={size} tmpfs /dev/shm && {script}");
    let out = Command::new("unshare").args(["-m", "sh", "-c", &script]).output().unwrap();
    let text = common::text(&out);
    if text.contains("unshare failed") || text.contains("Operation not permitted") {
        eprintln!("skipped: no private mount namespace here ({text})");
        return None;
    }
    Some((out, text))
}

/// An allocation no PE can back (a private 256 MiB /dev/shm, as allocation-failure tests must
/// use) gives NULL everywhere and gives its memory back. Needs `unshare -m` (root) and the
/// shared-memory fabric (whose heap is in /dev/shm).
#[test]
fn running_out_of_memory_gives_null_and_loses_nothing() {
    if not_on_shared_memory("the heap is in /dev/shm on the shared-memory fabric only") {
        return;
    }
    let prog = build("oom", &[], false);
    let script = format!("exec {WEFT} run -n 2 --timeout 60 -- {}", prog.display());
    let Some((out, text)) = in_private_dev_shm("256m", &script) else {
        return;
    };
    assert!(out.status.success() && text.contains("oom: 2 PEs ok"), "{text}");
}

/// `weft cc --pkg-config` gives a pkg-config file with which a plain `cc` builds a program.
#[test]
fn pkg_config_file_builds_a_program() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shmem-pc");
    std::fs::create_dir_all(&dir).unwrap();
    let pc = Command::new(WEFT).args(["cc", "--pkg-config"]).output().unwrap();
    assert!(pc.status.success(), "{}", common::text(&pc));
    std::fs::write(dir.join("weft-shmem.pc"), &pc.stdout).unwrap();
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "weft-shmem"])
        .env("PKG_CONFIG_PATH", &dir)
        .output()
        .unwrap();
    assert!(flags.status.success(), "{}", common::text(&flags));
    let flags = String::from_utf8_lossy(&flags.stdout).into_owned();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shmem/setup.c");
    let prog = dir.join("setup");
    let o =
        Command::new("cc").arg(&src).arg("-o").arg(&prog).args(flags.split_whitespace()).output().unwrap();
    assert!(o.status.success(), "cc with pkg-config flags {flags}\n{}", common::text(&o));
    let (out, _, _) = run(&prog, 2, &[]);
    assert!(out.status.success(), "{}", common::text(&out));
}

/// A PE that vanishes while another reads or writes it through a context's endpoint (over a
/// network; on shared memory the copies succeed and the next barrier finds it) ends the job
/// within seconds, with a message naming the PE's process, not a hang.
#[test]
fn a_vanished_pe_fails_context_operations() {
    let prog = build("errors", &[], false);
    for case in ["dead_pe_ctx_get", "dead_pe_ctx_put"] {
        let (out, took, pid) = run_with(&prog, 2, &[case], &[("WEFT_SHMEM_CONTEXTS", "2")]);
        let text = common::text(&out);
        assert!(!out.status.success(), "{case}: the job succeeded\n{text}");
        assert!(text.contains("PE 0: shmem_"), "{case}: no message from PE 0\n{text}");
        assert!(text.contains("is gone") || text.contains("died"), "{case}: no word of PE 1\n{text}");
        assert!(took < Duration::from_secs(30), "{case}: the job took {took:?} to end");
        assert!(common::shm_leftovers(pid).is_empty(), "{case}: left files in /dev/shm");
    }
}

/// `shmem_global_exit(0)` and `(7)` on one PE, while the other waits in a barrier, stop the
/// job at once with that status (`weft run` is told it).
#[test]
fn global_exit_ends_the_job_with_its_status() {
    let prog = build("errors", &[], false);
    for (case, status) in [("global_exit_zero", 0), ("global_exit_seven", 7)] {
        let (out, took, pid) = run(&prog, 2, &[case]);
        let text = common::text(&out);
        assert_eq!(out.status.code(), Some(status), "{case}: the job's status\n{text}");
        let said = format!("rank 0 ended the job with status {status}");
        assert!(text.contains(&said), "{case}: no word from the launcher\n{text}");
        assert!(!text.contains("did not fail"), "{case}: the other PE ran on\n{text}");
        assert!(took < Duration::from_secs(30), "{case}: the job took {took:?} to end");
        assert!(common::shm_leftovers(pid).is_empty(), "{case}: left files in /dev/shm");
    }
}

/// `weft cc` installed as `PREFIX/bin/weft` finds `PREFIX/include/shmem.h` and
/// `PREFIX/lib/libweft_shmem.so` by itself.
#[test]
fn cc_finds_an_installed_layout() {
    let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("installed-{}", std::process::id()));
    for d in ["bin", "include", "lib"] {
        std::fs::create_dir_all(prefix.join(d)).unwrap();
    }
    // A hard link, not a copy: a copy's write descriptor, inherited by a process another test
    // thread forks meanwhile, would make running it fail with "Text file busy".
    if std::fs::hard_link(WEFT, prefix.join("bin/weft")).is_err() {
        std::fs::copy(WEFT, prefix.join("bin/weft")).unwrap();
    }
    let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/shmem/include/shmem.h");
    std::fs::copy(header, prefix.join("include/shmem.h")).unwrap();
    std::fs::write(prefix.join("lib/libweft_shmem.so"), b"").unwrap();
    let out = Command::new(prefix.join("bin/weft"))
        .args(["cc", "--show", "x.c"])
        .env_remove("WEFT_SHMEM_INCLUDE")
        .env_remove("WEFT_SHMEM_LIB")
        .output()
        .unwrap();
    let text = common::text(&out);
    let _ = std::fs::remove_dir_all(&prefix);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(&format!("-I{}", prefix.join("include").display())), "{text}");
    assert!(text.contains(&format!("-L{}", prefix.join("lib").display())), "{text}");
}

/// A PE that exits with 3 while the others wait in a barrier: the job ends with 3 and names
/// that PE, never one that exited because it saw it vanish, even when the launcher finds them
/// all ended at one look (it takes exits in the order they happen). The launcher is stopped
/// (SIGSTOP) from before that PE exits until well after the others saw it vanish and exited.
#[test]
fn a_pe_that_exits_is_named_not_the_peers_that_saw_it() {
    let prog = build("errors", &[], false);
    let child = Command::new(WEFT)
        .args(["run", "-n", "4", "--timeout", "120", "--"])
        .arg(&prog)
        .arg("last_exits_three")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    // PE 3 exits 2 s after start-up, which takes well under 1.2 s.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    std::thread::sleep(Duration::from_millis(3500));
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    let text = common::text(&out);
    assert_eq!(out.status.code(), Some(3), "status\n{text}");
    assert!(text.contains("weft run: rank 3 (pid") && text.contains("exited with status 3"), "{text}");
}

/// Without a launcher the process is the whole job: `shmem_global_exit(0)` exits 0.
#[test]
fn global_exit_without_a_launcher_exits_with_its_status() {
    let prog = build("errors", &[], false);
    let out = Command::new(&prog).arg("global_exit_zero").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", common::text(&out));
    let out = Command::new(&prog).arg("global_exit_seven").output().unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", common::text(&out));
}

/// Under `mpirun`, `shmem_global_exit(0)` and `(7)` end the job at once with that status
/// (PMIx's abort), while the other PE waits in a barrier.
#[cfg(feature = "pmix")]
#[test]
fn global_exit_under_mpirun_ends_the_job_with_its_status() {
    let prog = build("errors", &[], false);
    for (case, status) in [("global_exit_zero", 0), ("global_exit_seven", 7)] {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ompi-{case}-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let t = Instant::now();
        let out = Command::new("mpirun")
            .args(["-n", "2", "--allow-run-as-root", "--oversubscribe", "--timeout", "120"])
            .arg("--mca")
            .arg("orte_tmpdir_base")
            .arg(&base)
            .arg(&prog)
            .arg(case)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&base);
        let text = common::text(&out);
        assert_eq!(out.status.code(), Some(status), "{case}: mpirun's status\n{text}");
        assert!(!text.contains("did not fail"), "{case}: the other PE ran on\n{text}");
        assert!(t.elapsed() < Duration::from_secs(30), "{case}: the job took {:?}", t.elapsed());
    }
}

/// An `mpirun` job leaves nothing in /dev/shm: the last PE to finalize removes the job's
/// directory (OpenSHMEM's state lives to the process's end; no `weft run` cleans up after
/// it), and so does a PE that ends the job by an error or an exit without finalizing (the
/// others, killed by mpirun, cannot). Run in a private mount namespace with a /dev/shm of its
/// own, where nothing else is.
#[cfg(feature = "pmix")]
#[test]
fn an_mpirun_job_leaves_nothing_in_dev_shm() {
    let (prog, errors) = (build("setup", &[], false), build("errors", &[], false));
    let mpirun = "mpirun --allow-run-as-root --oversubscribe --timeout 120";
    let script = format!(
        "{mpirun} -n 4 {} && {{ {mpirun} -n 2 {e} bad_pe; {mpirun} -n 2 {e} last_exits_three; true; }} \
         && echo left: && ls -A /dev/shm",
        prog.display(),
        e = errors.display()
    );
    let Some((out, text)) = in_private_dev_shm("64m", &script) else {
        return;
    };
    assert!(out.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let left = stdout.split("left:\n").nth(1).expect("the listing");
    assert!(left.trim().is_empty(), "left in /dev/shm: {left}\n{text}");
}

/// A bad context or mismatch variable ends the job at `shmem_init` naming it, on every
/// fabric (also where no endpoints are made).
#[test]
fn bad_variables_are_refused() {
    let prog = build("setup", &[], false);
    for (var, value) in [
        ("WEFT_SHMEM_CONTEXTS", "abc"),
        ("WEFT_SHMEM_CONTEXTS", "-1"),
        ("WEFT_SHMEM_CTX_CATEGORY", "bogus"),
        ("WEFT_SHMEM_MISMATCH_S", "soon"),
        ("WEFT_SHMEM_MISMATCH_S", "-1"),
    ] {
        let (out, _, pid) = run_with(&prog, 2, &[], &[(var, value)]);
        let text = common::text(&out);
        assert!(!out.status.success(), "{var}={value}: the job succeeded\n{text}");
        assert!(
            text.contains("shmem_init") && text.contains(var),
            "{var}={value}: no message naming it\n{text}"
        );
        assert!(common::shm_leftovers(pid).is_empty(), "{var}={value}: left files in /dev/shm");
    }
}

/// Collective calls that take different paths wait on different words: after
/// `WEFT_SHMEM_MISMATCH_S` the job ends naming each PE's call, instead of hanging. On any
/// fabric: the members' calls are loads where their memory is mapped, atomic reads elsewhere.
#[test]
fn mismatched_calls_on_different_paths_are_named() {
    let prog = build("errors", &[], false);
    let reduction = "a reduction (sum of 4-byte signed integers)";
    let cases = [
        ("mismatched_path", vec![reduction, "of 8 bytes", "of 16000 bytes"]),
        ("skipped_collective", vec!["of 8 bytes (on a team)", "a barrier of a team (shmem_team_sync"]),
        ("barrier_all_meets_reduce", vec![reduction, "shmem_barrier_all or shmem_sync_all: all PEs"]),
        ("team_meets_psync", vec!["of 8 bytes (on a team)", "of 8 bytes (on a pSync)"]),
        ("skipped_into_finalize", vec![reduction, "PE 1 is in shmem_finalize"]),
        ("skipped_barrier_all", vec!["this PE is in a barrier of a team", "PE 1 is in shmem_finalize"]),
    ];
    for (case, says) in cases {
        let (out, took, pid) = run_with(&prog, 2, &[case], &[("WEFT_SHMEM_MISMATCH_S", "0.5")]);
        let text = common::text(&out);
        assert!(!out.status.success(), "{case}: the job succeeded\n{text}");
        assert!(text.contains("mismatched collective calls"), "{case}: not named\n{text}");
        for s in says {
            assert!(text.contains(s), "{case}: no {s:?}\n{text}");
        }
        assert!(took < Duration::from_secs(20), "{case}: the job took {took:?} to end");
        assert!(common::shm_leftovers(pid).is_empty(), "{case}: left files in /dev/shm");
    }
    // Slow members are not mismatched ones: PE 1 computes for 3 s before the reduction. Nor
    // are threads of SHMEM_THREAD_MULTIPLE in different teams' calls, one of them late.
    for (case, ok) in [("late_member", "late member ok"), ("threads_not_judged", "threads ok")] {
        let (out, _, _) = run_with(&prog, 2, &[case], &[("WEFT_SHMEM_MISMATCH_S", "0.2")]);
        let text = common::text(&out);
        assert!(out.status.success() && text.contains(ok), "{case}\n{text}");
    }
}

/// A collective that hangs (its mismatch not judged: `WEFT_SHMEM_MISMATCH_S=0`) gets the
/// hang warning naming the routine and the PE it waits for.
#[test]
fn hung_collectives_name_the_awaited_pe() {
    let prog = build("errors", &[], false);
    let out = Command::new(WEFT)
        .env("WEFT_SHMEM_MISMATCH_S", "0")
        .env("WEFT_HANG_WARN_S", "1")
        .args(["run", "-n", "2", "--timeout", "4", "--"])
        .arg(&prog)
        .arg("skipped_collective")
        .output()
        .unwrap();
    let text = common::text(&out);
    assert_eq!(out.status.code(), Some(124), "{text}");
    assert!(
        text.contains("rank 0 has waited") && text.contains("in shmem_int_sum_reduce for rank 1"),
        "no warning naming the routine and PE 1\n{text}"
    );
}

/// A PE waiting long in `shmem_set_lock` names the lock and the PE that holds it.
#[test]
fn a_lock_wait_names_the_holder() {
    let prog = build("errors", &[], false);
    let out = Command::new(WEFT)
        .env("WEFT_HANG_WARN_S", "1")
        .args(["run", "-n", "2", "--timeout", "4", "--"])
        .arg(&prog)
        .arg("held_lock")
        .output()
        .unwrap();
    let text = common::text(&out);
    assert_eq!(out.status.code(), Some(124), "{text}");
    assert!(
        text.contains("rank 1 has waited")
            && text.contains("in shmem_set_lock (the lock at 0x")
            && text.contains("held by PE 0; 1 ticket ahead")
            && text.contains("for rank 0"),
        "no warning naming the lock and PE 0\n{text}"
    );
}

/// A child of `fork` that exits through `exit` leaves the job as it was.
#[test]
fn a_fork_child_exit_changes_nothing() {
    passes("fork");
}

/// Stores that signal handlers make while `shmem_init` moves the program's data are kept:
/// 10 jobs of 2 PEs, a timer every 50 us during init (which had kept start-up sleeping for ever).
#[test]
fn signal_handlers_lose_no_store_during_init() {
    let prog = build("signals", &[], false);
    for round in 0..10 {
        let (out, took, pid) = run(&prog, 2, &[]);
        let text = common::text(&out);
        assert!(
            out.status.success() && text.contains("signals: 2 PEs ok"),
            "round {round}, {took:?}\n{text}"
        );
        let left = common::shm_leftovers(pid);
        assert!(left.is_empty(), "left {left:?} in /dev/shm");
    }
}

/// Each erroneous call ends the job (status not 0) within seconds, saying which routine and
/// what was wrong; nothing is left in /dev/shm.
#[test]
fn erroneous_calls_end_the_job_with_a_message() {
    let prog = build("errors", &[], false);
    let cases = [
        ("before_init", "shmem_int_p", "not initialized"),
        ("bad_pe", "shmem_int_p", "PE 2 does not exist (the job's PEs are 0 to 1)"),
        ("negative_pe", "shmem_int_get", "PE -1 does not exist"),
        ("not_symmetric", "shmem_int_put", "not symmetric memory"),
        ("past_the_heap", "shmem_putmem", "not symmetric memory"),
        ("overflow", "shmem_int_put", "overflow"),
        ("misaligned_atomic", "shmem_long_atomic_add", "not aligned"),
        ("double_free", "shmem_free", "not an object of the symmetric heap"),
        ("mismatched_malloc", "shmem_malloc", "different sizes"),
        ("bad_cmp", "shmem_int_wait_until", "comparison 42"),
        ("bad_stride", "shmem_int_iput", "stride 0"),
        ("negative_strides", "shmem_int_alltoalls", "strides -2 and -3 must be at least 1"),
        ("clear_unheld", "shmem_clear_lock", "is not held by this PE (nobody holds it)"),
        ("clear_twice", "shmem_clear_lock", "is not held by this PE (nobody holds it)"),
        ("set_twice", "shmem_set_lock", "this PE already holds the lock at 0x"),
        ("holder_gone", "shmem_set_lock", "rank 0"),
        ("bad_team", "shmem_team_sync", "is not a team"),
        ("null_source", "shmem_putmem", "is NULL"),
        ("bad_active_set", "shmem_barrier", "is not within the job"),
        ("bad_root", "shmem_broadcast64", "root 5"),
        ("mismatched_reduce", "shmem_int_sum_reduce", "bytes where this PE reduces"),
        ("mismatched_kind", "collect", "must make the same collective calls in the same order"),
        (
            "mismatched_type",
            "_sum_reduce",
            "of 4-byte floating-point numbers where this PE reduces with sum of 4-byte",
        ),
        ("mismatched_broadcast", "shmem_broadcast32", "the root broadcasts 8 bytes where this PE expects 16"),
        ("uninitialized_psync", "shmem_int_sum_to_all", "must set its pSync to SHMEM_SYNC_VALUE"),
        ("destroyed_ctx", "shmem_ctx_int_p", "is not a context"),
        ("forged_ctx", "shmem_ctx_putmem", "is not a context"),
        ("ctx_after_team_destroy", "shmem_ctx_putmem", "is not a context"),
        ("pe_outside_ctx_team", "shmem_ctx_int_p", "PE 1 is not in the context's team"),
        // PE 1 exits 0 without it: PE 0's finalize cannot complete, so PE 0 must not exit 0.
        ("gone_at_finalize", "shmem_finalize", "rank 1 died"),
    ];
    for (case, routine, what) in cases {
        let (out, took, pid) = run(&prog, 2, &[case]);
        let text = common::text(&out);
        assert!(!out.status.success(), "{case}: the job succeeded\n{text}");
        assert!(!text.contains("did not fail"), "{case}: the call returned\n{text}");
        assert!(
            text.contains(routine) && text.contains(what),
            "{case}: no message naming {routine} ({what})\n{text}"
        );
        assert!(took < Duration::from_secs(30), "{case}: the job took {took:?} to end");
        let left = common::shm_leftovers(pid);
        assert!(left.is_empty(), "{case}: left {left:?} in /dev/shm");
    }
}

/// A process outside the job holds 2,000 idle connections to every rank's libfabric tcp port
/// while the ranks, limited to 1,024 descriptors, connect to each other: the job still ends
/// correctly (the ranks shut down connections that never speak, and retry meanwhile).
#[cfg(feature = "ofi")]
#[test]
fn idle_outsiders_cannot_exhaust_a_rank() {
    use std::io::{BufRead, BufReader, Write};
    let (prog, outsider) = (build("flood", &[], false), build("outsider", &[], false));
    let flag = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("flood-go-{}", std::process::id()));
    let _ = std::fs::remove_file(&flag);
    let script = format!(
        "ulimit -n 1024 && exec {} run -n 4 --timeout 120 -- {} {}",
        WEFT,
        prog.display(),
        flag.display()
    );
    let mut job = Command::new("sh")
        .args(["-c", &script])
        .envs([
            ("WEFT_FABRIC", "ofi"),
            ("WEFT_SAME_HOST", "ofi"),
            ("WEFT_OFI_PROVIDER", "tcp"),
            ("WEFT_OFI_DOMAIN", "lo"),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(job.stdout.take().unwrap()).lines();
    let mut ports = Vec::new();
    let mut seen = String::new();
    while ports.len() < 4 {
        let Some(Ok(line)) = lines.next() else { break };
        seen.push_str(&line);
        seen.push('\n');
        if let Some(p) = line.split(" listens on ").nth(1) {
            ports.push(p.trim().to_string());
        }
    }
    assert_eq!(ports.len(), 4, "the PEs did not say their ports\n{seen}");
    assert!(ports.iter().all(|p| p.parse::<u16>().is_ok()), "ports: {ports:?}");
    let mut attack = Command::new(&outsider)
        .arg("2000")
        .args(&ports)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    BufReader::new(attack.stdout.take().unwrap()).read_line(&mut said).unwrap();
    assert!(said.contains("holding 8000 connections"), "the outsider: {said}");
    std::fs::write(&flag, b"go").unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = job.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut job.stderr.take().unwrap(), &mut err).unwrap();
    let _ = attack.stdin.take().map(|mut s| s.write_all(b"done"));
    let _ = attack.wait();
    let _ = std::fs::remove_file(&flag);
    let text = format!("{seen}{}\n{err}", rest.join("\n"));
    assert!(status.success(), "the job failed\n{text}");
    assert!(text.contains("flood: 4 PEs ok"), "no result\n{text}");
    assert!(
        text.contains("never sent libfabric's connection request"),
        "no rank said what it closed\n{text}"
    );
}

/// 20 successful jobs over libfabric's shm provider under `weft run`, and 20 under mpirun
/// (with the `pmix` feature), in a private /dev/shm: `shmem_finalize` closes the provider's
/// endpoints, so nothing of theirs is left and `weft run` removes nothing.
#[cfg(feature = "ofi")]
#[test]
fn jobs_over_the_shm_provider_leave_nothing() {
    let prog = build("setup", &[], false);
    let env = "WEFT_FABRIC=ofi WEFT_SAME_HOST=ofi WEFT_OFI_PROVIDER=shm";
    let mpirun = if cfg!(feature = "pmix") {
        format!(
            "for i in $(seq 20); do mpirun --allow-run-as-root --oversubscribe --timeout 120 -n 2 \
             -x WEFT_FABRIC -x WEFT_SAME_HOST -x WEFT_OFI_PROVIDER {} || exit 1; done && ",
            prog.display()
        )
    } else {
        String::new()
    };
    let script = format!(
        "unset WEFT_OFI_DOMAIN; export {env} && for i in $(seq 20); do {WEFT} run -n 2 --timeout 120 -- {} || exit 1; done && \
         {mpirun}echo left: && ls -A /dev/shm",
        prog.display()
    );
    let Some((out, text)) = in_private_dev_shm("256m", &script) else {
        return;
    };
    assert!(out.status.success(), "{text}");
    assert_eq!(
        text.matches("setup: 2 PEs ok").count(),
        if cfg!(feature = "pmix") { 40 } else { 20 },
        "{text}"
    );
    assert!(!text.contains("removed"), "weft run removed a rank's files\n{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let left = stdout.split("left:\n").nth(1).expect("the listing");
    assert!(left.trim().is_empty(), "left in /dev/shm: {left}\n{text}");
}
