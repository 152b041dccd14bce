//! Launcher-level checks: each starts jobs of its own.

use super::*;

pub(crate) fn weft() -> Command {
    Command::new(env!("CARGO_BIN_EXE_weft"))
}

pub(crate) fn me() -> std::path::PathBuf {
    std::env::current_exe().expect("test executable")
}

pub(crate) fn both(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

pub(crate) fn fail(what: &str, o: &Output) -> libtest_mimic::Failed {
    format!("{what} ({})\n{}", o.status, common::text(o)).into()
}

/// `Ok` if job `job` left nothing in /dev/shm.
pub(crate) fn nothing_left(job: &str) -> Trial {
    let left = shm_files(&dir_of(job));
    if !left.is_empty() {
        return Err(format!("files left in /dev/shm: {left:?}").into());
    }
    Ok(())
}

/// The directory, in /dev/shm, of job `job`'s files.
pub(crate) fn dir_of(job: &str) -> String {
    weft::fabric::names::job_dir(job)
}

/// A job id of our own for ranks started by hand (no launcher).
pub(crate) fn hand_job() -> String {
    format!("hand{}x{:x}", std::process::id(), weft::fabric::os::now_ns())
}

/// One rank started by hand, as `weft run` would start it, without the launcher.
pub(crate) fn by_hand(job: &str, rank: u32, size: u32, env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(me());
    c.env("WEFT_HARDEN_CASE", "init_only")
        .env("WEFT_RANK", rank.to_string())
        .env("WEFT_SIZE", size.to_string())
        .env("WEFT_JOB", job)
        .env_remove("WEFT_BOOT_FD")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

pub(crate) fn shm_files(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Settings out of range or not numbers are errors naming the variable, never a panic or a
/// silent default.
pub(crate) fn bad_settings() -> Trial {
    let cases: &[(&str, &str)] = &[
        ("WEFT_INIT_TIMEOUT_S", "18446744073709551615"),
        ("WEFT_PEER_CHECK_MS", "18446744073709551615"),
        ("WEFT_SPIN_US", "18446744073709551615"),
        ("WEFT_HANG_WARN_S", "-1"),
        ("WEFT_NODE_CPUS", "abc"),
        ("WEFT_NODE_CPUS", "0"),
    ];
    for (var, val) in cases {
        // Started by hand: `weft run` sets WEFT_NODE_CPUS itself.
        let out = by_hand(&hand_job(), 0, 1, &[(var, val)]).output()?;
        let text = both(&out);
        if out.status.success() || !text.contains(var) || text.contains("panicked") {
            return Err(fail(&format!("{var}={val}"), &out));
        }
    }
    // Under `weft run` too: the launcher's own count never hides the user's value.
    for val in ["abc", "0"] {
        let out = weft()
            .args(["run", "-n", "1", "--"])
            .arg(me())
            .env("WEFT_HARDEN_CASE", "init_only")
            .env("WEFT_NODE_CPUS", val)
            .output()?;
        if out.status.success() || !both(&out).contains("WEFT_NODE_CPUS") || both(&out).contains("panicked") {
            return Err(fail(&format!("weft run with WEFT_NODE_CPUS={val}"), &out));
        }
    }
    for t in ["-1", "1e300", "0", "nan"] {
        let out = weft().args(["run", "-n", "1", "--timeout", t, "--", "true"]).output()?;
        if out.status.success() || !both(&out).contains("--timeout") || both(&out).contains("panicked") {
            return Err(fail(&format!("--timeout {t}"), &out));
        }
    }
    Ok(())
}

/// Two processes started as the same rank of one job: both fail at once with an error that
/// says so (the second used to replace the first's inbox silently).
pub(crate) fn same_rank_twice() -> Trial {
    let job = hand_job();
    let env = [("WEFT_INIT_TIMEOUT_S", "30")];
    let t = Instant::now();
    let first = by_hand(&job, 0, 2, &env).spawn()?;
    // The first has published its inbox when its file is there.
    let published = std::path::PathBuf::from(format!("/dev/shm/{}/0", dir_of(&job)));
    while !published.exists() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let second = by_hand(&job, 0, 2, &env).output()?;
    let first = first.wait_with_output()?;
    let took = t.elapsed();
    for (who, o) in [("first", &first), ("second", &second)] {
        if o.status.success() || !both(o).contains("same WEFT_RANK") {
            return Err(fail(&format!("{who} of two rank-0 processes"), o));
        }
    }
    if took > Duration::from_secs(10) {
        return Err(format!("the duplicate was noticed only after {took:?}").into());
    }
    nothing_left(&job)
}

/// A process started as rank 1 of a job that is running already: it fails at once, and so
/// does the rank 1 that was there (it used to go on unaware while the newcomer waited out
/// its start-up time and reported a timeout).
pub(crate) fn same_rank_late() -> Trial {
    let job = hand_job();
    let env = [("WEFT_HARDEN_CASE", "barrier_loop")];
    let ranks = [by_hand(&job, 0, 2, &env).spawn()?, by_hand(&job, 1, 2, &env).spawn()?];
    // Started when the inboxes, unlinked after start-up, are gone (the directory with them).
    let dir = std::path::PathBuf::from(format!("/dev/shm/{}", dir_of(&job)));
    let t = Instant::now();
    let (mut seen, mut started) = (false, false);
    while !started && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(2));
        let entries = std::fs::read_dir(&dir).map(|d| d.count());
        seen |= entries.is_ok();
        started = seen && !entries.is_ok_and(|n| n > 0);
    }
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let late = by_hand(&job, 1, 2, &[("WEFT_INIT_TIMEOUT_S", "30")]).output()?;
    let late_took = t.elapsed();
    let [r0, r1] = ranks.map(|c| c.wait_with_output());
    let (r0, r1) = (r0?, r1?);
    let took = t.elapsed();
    for (who, o) in [("the late rank 1", &late), ("the running rank 1", &r1)] {
        if o.status.success() || !both(o).contains("same WEFT_RANK") {
            return Err(fail(who, o));
        }
    }
    if r0.status.success() {
        return Err(fail("rank 0, whose peer failed", &r0));
    }
    if late_took > Duration::from_secs(3) || took > Duration::from_secs(10) {
        return Err(format!("noticed after {late_took:?} (newcomer) and {took:?} (holder)").into());
    }
    nothing_left(&job)
}

/// Another user can neither pose as a second rank 1 (a job whose rank 1 such a process
/// knocked on goes on) nor hold a rank's claim unnoticed (the rank fails, naming the user).
pub(crate) fn claim_strangers() -> Trial {
    let root = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)?;
    if !root {
        return Err("this check acts as another user (setpriv): run it as root".into());
    }
    let as_stranger = |var: &str, name: &str| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(me())
            .env("WEFT_HARDEN_CASE", "stranger")
            .env(var, name)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let job = hand_job();
    let env = [("WEFT_HARDEN_CASE", "barrier_loop"), ("WEFT_LOOP_MS", "1500")];
    let ranks = [by_hand(&job, 0, 2, &env).spawn()?, by_hand(&job, 1, 2, &env).spawn()?];
    std::thread::sleep(Duration::from_millis(500));
    let knock = as_stranger("WEFT_CLAIM_KNOCK", &weft::fabric::names::claim_name(&job, 1)).output()?;
    if !knock.status.success() {
        return Err(fail("uid 65534 knocking on rank 1's claim", &knock));
    }
    for (r, c) in ranks.into_iter().enumerate() {
        let o = c.wait_with_output()?;
        if !o.status.success() {
            return Err(fail(&format!("rank {r}, knocked on by another user"), &o));
        }
    }
    let job = hand_job();
    let mut holder = as_stranger("WEFT_CLAIM_HOLD", &weft::fabric::names::claim_name(&job, 0)).spawn()?;
    let mut line = String::new();
    let stdout = holder.stdout.take().ok_or("no stdout")?;
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
    let out = by_hand(&job, 0, 1, &[]).output();
    let _ = holder.kill();
    let _ = holder.wait();
    let out = out?;
    if line.trim() != "holding" || out.status.success() || !both(&out).contains("user 65534") {
        return Err(fail(&format!("rank 0 of a job whose claim uid 65534 holds ({line:?})"), &out));
    }
    Ok(())
}

/// A rank killed with SIGKILL while its segment's file waits for the peers (a job started
/// without `weft run`, as under mpirun or srun, where no launcher of ours cleans up): the
/// survivor unlinks what the dead rank left, and nothing stays in /dev/shm.
pub(crate) fn dead_peer_files_removed() -> Trial {
    let job = hand_job();
    let env = [("WEFT_HARDEN_CASE", "alloc_late")];
    let r0 = by_hand(&job, 0, 2, &env).spawn()?;
    let mut r1 = by_hand(&job, 1, 2, &env).spawn()?;
    let t = Instant::now();
    let published = || shm_files(&format!("{}/", dir_of(&job))).is_empty() && dir_has(&job, "1-r");
    while !published() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    r1.kill()?;
    r1.wait()?;
    let out = r0.wait_with_output()?;
    if out.status.success() || !both(&out).contains("rank 1") {
        return Err(fail("rank 0, whose peer was killed", &out));
    }
    let left = shm_files(&dir_of(&job));
    if !left.is_empty() {
        return Err(format!("left in /dev/shm after rank 1 was killed: {left:?}").into());
    }
    Ok(())
}

/// Whether job `job`'s directory holds a file whose name starts with `prefix`.
pub(crate) fn dir_has(job: &str, prefix: &str) -> bool {
    std::fs::read_dir(format!("/dev/shm/{}", dir_of(job)))
        .is_ok_and(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with(prefix)))
}

/// A `/dev/shm` too full for what the job needs (another user can fill it): an error naming
/// it, never a SIGBUS, for the ranks' inboxes and for the (sparse) RPC pool. Each job runs in
/// a private mount namespace with a small tmpfs on /dev/shm.
pub(crate) fn full_shm_is_an_error() -> Trial {
    let in_small_shm =
        |mib: u32, fill_kib: u32, case: &str, env: &[(&str, &str)]| -> std::io::Result<Output> {
            let script = format!(
            "mount -t tmpfs -o size={mib}m tmpfs /dev/shm && \
             {{ head -c {fill_kib}k /dev/zero > /dev/shm/filler || true; }} && exec \"$0\" run -n 2 -- \"$1\""
        );
            Command::new("unshare")
                .args(["-m", "sh", "-c", &script])
                .arg(env!("CARGO_BIN_EXE_weft"))
                .arg(me())
                .env("WEFT_HARDEN_CASE", case)
                .envs(env.iter().copied())
                .output()
        };
    let out = in_small_shm(4, 4096, "init_only", &[])?;
    let text = both(&out);
    if out.status.success() || !text.contains("/dev/shm: full?") || text.contains("SIGBUS") {
        return Err(fail("a job on a full /dev/shm", &out));
    }
    let out = in_small_shm(16, 0, "pool_beyond_shm", &[("WEFT_RPC_POOL_MIB", "64")])?;
    if !out.status.success() || both(&out).contains("SIGBUS") {
        return Err(fail("a 64 MiB pool on a 16 MiB /dev/shm", &out));
    }
    // One rank's reservation fails, the other's works: an error on both, the world usable.
    let out = in_small_shm(64, 0, "partial_alloc", &[])?;
    if !out.status.success() || both(&out).contains("SIGBUS") {
        return Err(fail("a segment that fits one rank's share of a 64 MiB /dev/shm", &out));
    }
    // Docker's default /dev/shm: a 1 TiB segment is an error on every rank, at once.
    let out = in_small_shm(64, 0, "huge_segment", &[])?;
    if !out.status.success() || both(&out).contains("SIGBUS") {
        return Err(fail("a 1 TiB segment on a 64 MiB /dev/shm", &out));
    }
    Ok(())
}

/// `weft run` removes only the files of jobs whose launcher it can see is gone: neither a job
/// started by hand under a name that looks like one of its own, nor a job of another pid
/// namespace sharing /dev/shm (a container with the host's IPC), whose launcher's pid means
/// nothing here.
pub(crate) fn other_jobs_left_alone() -> Trial {
    let before = shm_files("weft-");
    // A job in a pid namespace of its own; rank 1 starts 30 s late, so rank 0's inbox waits.
    let mut other = Command::new("unshare")
        .args(["-p", "-f", "--kill-child", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_weft"))
        .args(["run", "-n", "2", "--"])
        .arg(me())
        .env("WEFT_HARDEN_CASE", "late_rank")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    // A job by hand whose name has the old form of a launcher's (pid ffffff, gone).
    let hand = "ffffffx1";
    let mut by_hand_job = by_hand(hand, 0, 2, &[("WEFT_INIT_TIMEOUT_S", "30")]).spawn()?;
    let t = Instant::now();
    let mine = |f: &String| !before.contains(f);
    let theirs = || shm_files("weft-").into_iter().filter(mine).collect::<Vec<_>>();
    while theirs().len() < 2 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let started = theirs();
    let out = weft().args(["run", "-n", "1", "--", "true"]).output()?;
    let after = theirs();
    let _ = other.kill();
    let _ = other.wait();
    let _ = by_hand_job.kill();
    let _ = by_hand_job.wait();
    for d in &started {
        let _ = std::fs::remove_dir_all(format!("/dev/shm/{d}"));
    }
    if started.len() < 2 || after != started || !out.status.success() {
        return Err(fail(&format!("jobs {started:?} before another weft run, {after:?} after"), &out));
    }
    Ok(())
}

/// What another user sees of a starting job (its directory in /dev/shm, its ranks' claim
/// sockets in /proc/net/unix) does not contain the job id, so it cannot name the job's other
/// things before they exist: the directory before the first rank makes it, the claims of
/// ranks yet to start (it used to read `@weft-JOB-0` and squat `weft-JOB`, `@weft-JOB-1`...).
pub(crate) fn public_names_reveal_nothing() -> Trial {
    let job = hand_job();
    let mut r0 = by_hand(&job, 0, 2, &[("WEFT_INIT_TIMEOUT_S", "20")]).spawn()?;
    let t = Instant::now();
    while !std::path::Path::new(&format!("/dev/shm/{}", dir_of(&job))).exists()
        && t.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let sockets = std::fs::read_to_string("/proc/net/unix")?;
    let _ = r0.kill();
    let _ = r0.wait();
    let _ = std::fs::remove_dir_all(format!("/dev/shm/{}", dir_of(&job)));
    let claim = weft::fabric::names::claim_name(&job, 0);
    let visible: Vec<&str> = sockets.lines().filter(|l| l.contains(&format!("@{claim}"))).collect();
    if visible.is_empty() {
        return Err(format!("rank 0's claim @{claim} is not in /proc/net/unix").into());
    }
    if sockets.contains(&job) || dir_of(&job).contains(&job) {
        return Err(format!("job id {job} readable in {:?} or {}", visible, dir_of(&job)).into());
    }
    Ok(())
}

/// A job in a pid namespace of its own that still sees the host's /proc (`unshare -p`
/// without `--mount-proc`): its ranks must not take each other for dead (they did: /proc
/// showed other processes under their pids).
pub(crate) fn pid_namespace_with_host_proc() -> Trial {
    let out = Command::new("unshare")
        .args(["-p", "-f"])
        .arg(env!("CARGO_BIN_EXE_weft"))
        .args(["run", "-n", "2", "--"])
        .arg(me())
        .env("WEFT_HARDEN_CASE", "barrier_loop")
        .env("WEFT_LOOP_MS", "300")
        .output()?;
    if !out.status.success() {
        return Err(fail("a 2-rank job under unshare -p -f", &out));
    }
    Ok(())
}

/// Ranks that disagree at start-up (ring sizes) fail and leave no inbox behind.
pub(crate) fn startup_mismatch_cleans_up() -> Trial {
    let job = hand_job();
    let a = by_hand(&job, 0, 2, &[("WEFT_AM_RING_KIB", "64"), ("WEFT_INIT_TIMEOUT_S", "20")]).spawn()?;
    let b = by_hand(&job, 1, 2, &[("WEFT_AM_RING_KIB", "128"), ("WEFT_INIT_TIMEOUT_S", "20")]).spawn()?;
    let (a, b) = (a.wait_with_output()?, b.wait_with_output()?);
    if a.status.success() && b.status.success() {
        return Err(fail("ranks with different ring sizes both started", &a));
    }
    if !both(&a).contains("WEFT_AM_RING_KIB") && !both(&b).contains("WEFT_AM_RING_KIB") {
        return Err(fail("the mismatch does not name WEFT_AM_RING_KIB", &a));
    }
    let left = shm_files(&dir_of(&job));
    if !left.is_empty() {
        return Err(format!("files left in /dev/shm after a start-up mismatch: {left:?}").into());
    }
    Ok(())
}

/// Another user cannot squat a job's names. Its files live in a directory of mode 700, and
/// nothing can be added to it but by its user: uid 65534 fails to create the names the job
/// publishes next while the job starts (where this test runs as root and can act as another
/// user). A job whose directory name is taken before it makes it (by someone who learnt the
/// id: a link, a file, another user's directory) refuses it with an error, never uses it, and
/// leaves nothing.
pub(crate) fn squatted_names() -> Trial {
    use std::os::unix::fs::PermissionsExt;
    // Only root can give a file away or act as another user.
    let root = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)?;
    // Where a link points: it must stay empty.
    let decoy = std::env::temp_dir().join(format!("weft-squat-{}", std::process::id()));
    std::fs::create_dir_all(&decoy)?;
    let decoy_path = decoy.clone();
    let mut plants: Vec<(&str, Plant)> = vec![
        ("a link to a directory", Box::new(move |path: &str| std::os::unix::fs::symlink(&decoy, path))),
        ("a file", Box::new(|path: &str| std::fs::write(path, b"squat"))),
    ];
    if root {
        plants.push((
            "another user's directory",
            Box::new(|path: &str| {
                std::fs::create_dir(path)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777))?;
                std::os::unix::fs::chown(path, Some(65534), Some(65534))
            }),
        ));
    }
    for (what, plant) in &plants {
        let job = hand_job();
        let path = format!("/dev/shm/{}", dir_of(&job));
        plant(&path)?;
        let out = by_hand(&job, 0, 2, &[("WEFT_INIT_TIMEOUT_S", "10")]).output()?;
        let planted = shm_files(&dir_of(&job));
        let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir(&path));
        if out.status.success() || !both(&out).contains("refusing") {
            return Err(fail(&format!("{what} under the job's directory name"), &out));
        }
        let written = std::fs::read_dir(&decoy_path)?.count();
        if planted != [dir_of(&job)] || written > 0 {
            return Err(format!("{what}: /dev/shm holds {planted:?} after the job").into());
        }
    }
    let _ = std::fs::remove_dir(&decoy_path);
    if !root {
        return Ok(());
    }
    // While rank 0 waits for rank 1, another user tries the names rank 1 and rank 0 publish.
    let job = hand_job();
    let dir = format!("/dev/shm/{}", dir_of(&job));
    let first = by_hand(&job, 0, 2, &[("WEFT_INIT_TIMEOUT_S", "20")]).spawn()?;
    let t = Instant::now();
    while !std::path::Path::new(&format!("{dir}/0")).exists() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mode = std::fs::symlink_metadata(&dir)?.permissions().mode() & 0o777;
    for name in ["1", "1.tmp", "0-r0", "0-r0.tmp"] {
        let squat = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "touch"])
            .arg(format!("{dir}/{name}"))
            .output()?;
        if squat.status.success() {
            let _ = std::fs::remove_file(format!("{dir}/{name}"));
            return Err(format!("uid 65534 created {dir}/{name} (directory mode {mode:o})").into());
        }
    }
    let second = by_hand(&job, 1, 2, &[("WEFT_INIT_TIMEOUT_S", "20")]).output()?;
    let first = first.wait_with_output()?;
    for (who, o) in [("rank 0", &first), ("rank 1", &second)] {
        if !o.status.success() {
            return Err(fail(&format!("{who} of the job another user tried to squat"), o));
        }
    }
    nothing_left(&job)
}

/// `weft run` job ids carry 64 random bits: two jobs of one launcher pid differ, and the id
/// is the launcher's pid, `n`, its pid namespace, `x`, 16 hex digits.
pub(crate) fn job_ids_unguessable() -> Trial {
    let id = || -> std::io::Result<String> {
        let o = weft().args(["run", "-n", "1", "--raw", "--", "sh", "-c", "echo $WEFT_JOB"]).output()?;
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let (a, b) = (id()?, id()?);
    for j in [&a, &b] {
        let ok = j.split_once('x').is_some_and(|(head, r)| {
            head.split_once('n').is_some_and(|(pid, ns)| {
                u32::from_str_radix(pid, 16).is_ok() && u64::from_str_radix(ns, 16).is_ok()
            }) && r.len() == 16
                && r.chars().all(|c| c.is_ascii_hexdigit())
        });
        if !ok {
            return Err(format!("job id {j:?} is not PIDnNSx + 16 hex digits").into());
        }
    }
    if a.split_once('x').map(|p| p.1) == b.split_once('x').map(|p| p.1) {
        return Err(format!("two jobs got the same random part: {a} {b}").into());
    }
    Ok(())
}

/// A job that reaches `--timeout` ends with status 124 (as timeout(1)), not with the status its
/// ranks got from being stopped; and what a rank left running goes with the job, also when
/// every rank succeeded.
pub(crate) fn timeout_status_and_leftovers() -> Trial {
    let out = weft().args(["run", "-n", "2", "--timeout", "0.5", "--", "sleep", "30"]).output()?;
    if out.status.code() != Some(124) || !both(&out).contains("time limit") {
        return Err(fail("a job past its time limit", &out));
    }
    let marker = format!("weftleftover{}", std::process::id());
    // One in the rank's process group, one that left it (setsid).
    let script = format!(
        "(exec -a {marker} sleep 30) > /dev/null 2>&1 & setsid bash -c 'exec -a {marker} sleep 31' > /dev/null 2>&1 & sleep 0.2; exit 0"
    );
    let out = weft().args(["run", "-n", "2", "--", "bash", "-c", &script]).output()?;
    std::thread::sleep(Duration::from_millis(100));
    let left = Command::new("pgrep").args(["-f", &marker]).output()?;
    let _ = Command::new("pkill").args(["-f", &marker]).output();
    if !out.status.success() || left.status.success() {
        return Err(fail(
            &format!("background children left running: {}", String::from_utf8_lossy(&left.stdout)),
            &out,
        ));
    }
    Ok(())
}

/// A stopped rank is named by the rank that waits for it.
pub(crate) fn stopped_rank_named() -> Trial {
    let out = weft()
        .args(["run", "-n", "2", "--timeout", "60", "--"])
        .arg(me())
        .env("WEFT_HARDEN_CASE", "stopped_rank")
        .env("WEFT_HANG_WARN_S", "1")
        .output()?;
    let text = both(&out);
    if !out.status.success() || !text.contains("rank 0 has waited") || !text.contains("for rank 1") {
        return Err(fail("stopped rank", &out));
    }
    if text.matches("has waited").count() != 1 {
        return Err(fail("the warning is said once per wait", &out));
    }
    Ok(())
}

/// A caller waiting for a remote function that does not return names the function, in a
/// blocking wait and in a future's polls alike.
pub(crate) fn slow_remote_fn_named() -> Trial {
    let out = weft()
        .args(["run", "-n", "2", "--timeout", "60", "--"])
        .arg(me())
        .env("WEFT_HARDEN_CASE", "slow_remote_fn")
        .env("WEFT_HANG_WARN_S", "1")
        .output()?;
    let text = both(&out);
    let named =
        "in the call of remote fn hardening::ranks::harden_slow on rank 0 (it has not returned) for rank 0";
    if !out.status.success() || text.matches(named).count() != 2 {
        return Err(fail("the hang warnings name the remote function (twice)", &out));
    }
    Ok(())
}

/// A rank killed while another rank's shell waits for a child: the launcher stops the whole
/// process group at once (it used to wait for the child, 30 s, holding the output pipe).
pub(crate) fn rank_children_stopped() -> Trial {
    let script = "if [ \"$WEFT_RANK\" = 1 ]; then sleep 0.3; kill -9 $$; else sleep 30; echo never; fi";
    let t = Instant::now();
    let out = weft().args(["run", "-n", "2", "--", "sh", "-c", script]).output()?;
    let took = t.elapsed();
    if out.status.success() || !both(&out).contains("rank 1") || both(&out).contains("never") {
        return Err(fail("killed rank", &out));
    }
    if took > Duration::from_secs(5) {
        return Err(format!("the job took {took:?} to end after rank 1 was killed").into());
    }
    Ok(())
}

/// SIGINT stops ranks that ignore SIGTERM (after the grace period, with SIGKILL), and their
/// children with them; a second SIGINT kills at once.
pub(crate) fn interrupt_stops_everything() -> Trial {
    let script = "trap '' TERM; sleep 30; echo never";
    for signals in [1, 2] {
        let child = weft()
            .args(["run", "-n", "2", "--", "sh", "-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        std::thread::sleep(Duration::from_millis(500));
        let t = Instant::now();
        for _ in 0..signals {
            weft::fabric::os::kill(child.id(), 2);
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output()?;
        let took = t.elapsed();
        if out.status.code() != Some(130)
            || !both(&out).contains("interrupted by SIGINT")
            || both(&out).contains("never")
        {
            return Err(fail(&format!("{signals} SIGINT"), &out));
        }
        if took > Duration::from_secs(4) {
            return Err(format!("{signals} SIGINT: the job took {took:?} to end").into());
        }
    }
    Ok(())
}

/// The launcher killed with SIGKILL: its ranks die with it, and the next `weft run` removes
/// the files they left (here: rank 0's inbox, published while rank 1 had not started).
pub(crate) fn launcher_killed() -> Trial {
    let mut child = weft()
        .args(["run", "-n", "2", "--"])
        .arg(me())
        .env("WEFT_HARDEN_CASE", "late_rank")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let prefix = format!("weft-{:x}n", child.id());
    let t = Instant::now();
    while shm_files(&prefix).is_empty() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    if shm_files(&prefix).is_empty() {
        let _ = child.kill();
        return Err("rank 0 never published its inbox".into());
    }
    let ranks = rank_pids(child.id());
    child.kill()?;
    child.wait()?;
    let t = Instant::now();
    while ranks.iter().any(|&p| weft::fabric::os::process_alive(p)) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    if ranks.is_empty() || ranks.iter().any(|&p| weft::fabric::os::process_alive(p)) {
        return Err(format!("ranks {ranks:?} outlived their launcher").into());
    }
    let out = weft().args(["run", "-n", "1", "--", "true"]).output()?;
    if !out.status.success() || !shm_files(&prefix).is_empty() {
        return Err(fail(&format!("the next job left {:?}", shm_files(&prefix)), &out));
    }
    Ok(())
}

/// Children of process `pid` (from /proc).
pub(crate) fn rank_pids(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// When one rank dies of a signal and the other then fails because of it, the launcher names
/// the first, also when it sees both ended in one look (here: the launcher is stopped while
/// they end).
pub(crate) fn first_failure_named() -> Trial {
    let check = |out: &Output| -> Trial {
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(128 + 7) || !err.contains("rank 1") || !err.contains("SIGBUS") {
            return Err(fail("rank 1's SIGBUS", out));
        }
        Ok(())
    };
    let out =
        weft().args(["run", "-n", "2", "--"]).arg(me()).env("WEFT_HARDEN_CASE", "sigbus_rank").output()?;
    check(&out)?;
    let go = std::env::temp_dir().join(format!("weft-harden-go-{}", std::process::id()));
    let ready = go.with_extension("ready");
    let child = weft()
        .args(["run", "-n", "2", "--"])
        .arg(me())
        .env("WEFT_HARDEN_CASE", "sigbus_rank")
        .env("WEFT_GO_FILE", &go)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let t = Instant::now();
    while !ready.exists() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    weft::fabric::os::kill(child.id(), 19); // SIGSTOP: the launcher looks again only after both ended
    std::fs::write(&go, b"")?;
    std::thread::sleep(Duration::from_secs(1));
    weft::fabric::os::kill(child.id(), 18); // SIGCONT
    let out = child.wait_with_output()?;
    let _ = (std::fs::remove_file(&go), std::fs::remove_file(&ready));
    check(&out)
}

/// All a rank wrote reaches the launcher's output, even a 4 MB line with no newline read by
/// a consumer that starts late (the launcher used to let go of its forwarding 500 ms after
/// the ranks ended, dropping what it held), and the launcher holds at most a piece of it.
pub(crate) fn output_all_forwarded() -> Trial {
    let job = weft()
        .args(["run", "-n", "1", "--", "sh", "-c", "head -c 4000000 /dev/zero | tr '\\0' x"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(1500));
    let out = job.wait_with_output()?;
    let xs = out.stdout.iter().filter(|&&b| b == b'x').count();
    if !out.status.success() || xs != 4_000_000 {
        return Err(fail(&format!("{xs} of 4000000 bytes forwarded"), &out));
    }
    let pieces = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("[0] ")).count();
    if pieces != 4_000_000usize.div_ceil(64 << 10) {
        return Err(format!("the line came in {pieces} prefixed pieces").into());
    }
    Ok(())
}
