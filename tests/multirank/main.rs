//! Multi-process tests: every trial starts real ranks through the launcher (`weft run -n N`),
//! each rank being this same executable with `WEFT_TEST_CASE` naming the case to run.

mod am;
mod array;
mod asyncp;
mod coll;
#[path = "../common/mod.rs"]
mod common;
mod life;
mod rma;
mod rpc;
mod segs;
mod state;

use am::*;
use array::*;
use asyncp::*;
use coll::*;
use common::{ck, Case, Failure, Res};
use life::*;
use rma::*;
use rpc::*;
use segs::*;
use state::*;

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft::{AmHandler, AtomicOp, Error, World};

/// Distributed arrays' batches through the aggregation buffers, also on shared memory.
const MESSAGES: (&str, &str) = ("WEFT_ARRAY_MAPPED", "messages");

const CASES: &[Case] = &[
    // On shared memory batches read mapped memory directly (WEFT_ARRAY_MAPPED: loads, the
    // default), read and update it directly (direct), or send every item through the
    // aggregation buffers (messages), as on networks.
    Case { name: "array_ops", run: array_ops, ranks: &[2, 4], env: &[] },
    Case { name: "array_ops_aggregated", run: array_ops, ranks: &[2, 4], env: &[MESSAGES] },
    Case { name: "array_ops_direct", run: array_ops, ranks: &[2], env: &[("WEFT_ARRAY_MAPPED", "direct")] },
    Case {
        name: "array_ops_unaggregated",
        run: array_ops,
        ranks: &[2],
        env: &[MESSAGES, ("WEFT_AGG_BYTES", "0")],
    },
    Case { name: "array_ops_am_path", run: array_ops, ranks: &[3], env: &[MESSAGES, ("WEFT_RMA", "am")] },
    Case {
        name: "array_flush_on_wait",
        run: array_flush_on_wait,
        ranks: &[2, 4],
        env: &[MESSAGES, ("WEFT_AGG_DELAY_US", "60000000")],
    },
    Case { name: "array_delay_bound", run: array_delay_bound, ranks: &[2], env: &[MESSAGES] },
    Case { name: "array_dropped_on_owner", run: array_dropped_on_owner, ranks: &[2, 3], env: &[] },
    Case { name: "array_panicking_iterator", run: array_panicking_iterator, ranks: &[2], env: &[MESSAGES] },
    Case { name: "array_fork_child", run: array_fork_child, ranks: &[2], env: &[MESSAGES] },
    Case {
        name: "array_peer_dies",
        run: array_peer_dies,
        ranks: &[2, 4],
        env: &[MESSAGES, ("WEFT_AGG_DELAY_US", "60000000"), ("WEFT_PROGRESS_THREAD", "0")],
    },
    Case { name: "put_get_sizes", run: put_get_sizes, ranks: &[2, 4], env: &[] },
    Case { name: "completion_semantics", run: completion_semantics, ranks: &[2, 4], env: &[] },
    Case { name: "gets_in_flight", run: gets_in_flight, ranks: &[2, 4], env: &[] },
    Case { name: "registered_buffers", run: registered_buffers, ranks: &[2, 4], env: &[] },
    Case { name: "large_gets_in_flight", run: large_gets_in_flight, ranks: &[2, 4], env: &[] },
    Case {
        name: "get_from_stalled_target",
        run: get_from_stalled_target,
        ranks: &[2],
        env: &[("WEFT_PROGRESS_THREAD", "0"), ("WEFT_INIT_TIMEOUT_S", "2")],
    },
    Case { name: "gets_in_flight_am_path", run: gets_in_flight, ranks: &[2], env: &[("WEFT_RMA", "am")] },
    Case {
        name: "completion_semantics_am_path",
        run: completion_semantics,
        ranks: &[2, 4],
        env: &[("WEFT_RMA", "am")],
    },
    Case { name: "atomics", run: atomics, ranks: &[2, 4], env: &[] },
    Case { name: "notify_after_the_peer_left", run: notify_after_the_peer_left, ranks: &[2], env: &[] },
    Case { name: "put_signal", run: put_signal, ranks: &[2, 4], env: &[] },
    Case { name: "put_signal_am_path", run: put_signal, ranks: &[2], env: &[("WEFT_RMA", "am")] },
    Case { name: "atomics_am_path", run: atomics, ranks: &[2], env: &[("WEFT_RMA", "am")] },
    Case { name: "am_kinds", run: am_kinds, ranks: &[2, 4], env: &[] },
    Case { name: "am_flood", run: am_flood, ranks: &[2, 4], env: &[("WEFT_AM_RING_KIB", "16")] },
    Case { name: "bad_input", run: bad_input, ranks: &[2, 4], env: &[] },
    Case { name: "segments_recycled", run: segments_recycled, ranks: &[2, 4], env: &[] },
    Case { name: "handler_mismatch", run: handler_mismatch, ranks: &[2], env: &[] },
    Case { name: "early_exit", run: early_exit, ranks: &[2, 4], env: &[] },
    Case { name: "idle_waits_sleep", run: idle_waits_sleep, ranks: &[2, 4], env: &[] },
    Case { name: "notify_before_sleep", run: notify_before_sleep, ranks: &[2], env: &[] },
    Case { name: "vanished_rank", run: vanished_rank, ranks: &[2, 4], env: &[] },
    Case { name: "threads_and_progress", run: threads_and_progress, ranks: &[2, 4], env: &[] },
    Case { name: "rpc_calls", run: rpc_calls, ranks: &[2, 4], env: &[] },
    Case { name: "rpc_plain_rules", run: rpc_plain_rules, ranks: &[2, 4], env: &[] },
    Case { name: "owned_handles", run: owned_handles, ranks: &[2, 4], env: &[] },
    Case { name: "busy_target_serves", run: busy_target_serves, ranks: &[2, 4], env: &[] },
    Case { name: "sending_rank_serves", run: sending_rank_serves, ranks: &[2, 4], env: &[] },
    Case { name: "awaited_large_collective", run: awaited_large_collective, ranks: &[2, 3], env: &[] },
    Case {
        name: "awaited_collective_member_vanishes",
        run: awaited_collective_member_vanishes,
        ranks: &[2, 3],
        env: &[],
    },
    Case {
        name: "awaited_collective_member_vanishes_am_path",
        run: awaited_collective_member_vanishes,
        ranks: &[2],
        env: &[("WEFT_RMA", "am")],
    },
    Case {
        name: "wait_all_after_endpoints_close",
        run: wait_all_after_endpoints_close,
        ranks: &[2, 4],
        env: &[],
    },
    Case {
        name: "awaited_call_target_vanishes",
        run: awaited_call_target_vanishes,
        ranks: &[2, 4],
        env: &[],
    },
    Case {
        name: "awaited_am_rma_target_vanishes",
        run: awaited_call_target_vanishes,
        ranks: &[2],
        env: &[("WEFT_RMA", "am")],
    },
    Case {
        name: "awaited_call_vanishes_no_thread",
        run: awaited_call_target_vanishes,
        ranks: &[2],
        env: &[("WEFT_PROGRESS_THREAD", "0")],
    },
    Case {
        name: "awaited_call_vanishes_polling_thread",
        run: awaited_call_target_vanishes,
        ranks: &[2],
        env: &[("WEFT_PROGRESS_THREAD", "1")],
    },
    Case { name: "pending_future_sleeps", run: pending_future_sleeps, ranks: &[2], env: &[] },
    Case { name: "pending_collective_sleeps", run: pending_collective_sleeps, ranks: &[2, 4], env: &[] },
    Case { name: "dist_objects", run: dist_objects, ranks: &[2, 4], env: &[] },
    Case { name: "wait_all_remote_completion", run: wait_all_remote_completion, ranks: &[2, 4], env: &[] },
    Case { name: "rpc_plain_vecs", run: rpc_plain_vecs, ranks: &[2, 4], env: &[] },
    Case {
        name: "rpc_plain_vecs_in_place",
        run: rpc_plain_vecs,
        ranks: &[2],
        env: &[("WEFT_RPC_STAGE_KIB", "0")],
    },
    Case { name: "rpc_bad_input", run: rpc_bad_input, ranks: &[2, 4], env: &[] },
    Case { name: "rpc_small_pool", run: rpc_small_pool, ranks: &[2], env: &[("WEFT_RPC_POOL_MIB", "1")] },
    Case {
        name: "rpc_small_pool_copied",
        run: rpc_small_pool,
        ranks: &[2],
        env: &[("WEFT_RPC_POOL_MIB", "1"), ("WEFT_OFI_ZCOPY_KIB", "1048576")],
    },
    Case { name: "rpc_zero_copy", run: rpc_zero_copy, ranks: &[2, 4], env: &[] },
    Case { name: "teams_and_collectives", run: teams_and_collectives, ranks: &[2, 4], env: &[] },
    Case {
        name: "teams_and_collectives_am_path",
        run: teams_and_collectives,
        ranks: &[3],
        env: &[("WEFT_RMA", "am")],
    },
    Case { name: "vis_transfers", run: vis_transfers, ranks: &[2, 4], env: &[] },
    Case { name: "collectives_tuned", run: collectives_tuned, ranks: &[2, 3], env: &[] },
    Case {
        name: "small_broadcasts_back_to_back",
        run: small_broadcasts_back_to_back,
        ranks: &[2, 4],
        env: &[],
    },
    Case { name: "collectives_on_segments", run: collectives_on_segments, ranks: &[2, 3], env: &[] },
    // Messages through the slots only (no direct reads), so the big one uses the whole slot.
    Case {
        name: "channel_send_ahead",
        run: channel_send_ahead,
        ranks: &[2],
        env: &[("WEFT_COLL_DIRECT_BYTES", "100000000")],
    },
    Case {
        name: "vis_transfers_packed",
        run: vis_transfers,
        ranks: &[2],
        env: &[("WEFT_VIS_PACK_BYTES", "1000000"), ("WEFT_AM_RING_KIB", "16")],
    },
    Case { name: "vis_transfers_am_path", run: vis_transfers, ranks: &[3], env: &[("WEFT_RMA", "am")] },
    // Every size through the bandwidth algorithms (ring, pairwise) with every message through
    // the slots (chunked), then through the latency algorithms.
    Case {
        name: "teams_and_collectives_large_algorithms",
        run: teams_and_collectives,
        ranks: &[3],
        env: &[("WEFT_COLL_SMALL_BYTES", "0"), ("WEFT_COLL_DIRECT_BYTES", "100000000")],
    },
    // Messages from 32 KiB up read straight from the senders' buffers (by default only from
    // 16 MiB up, or from 32 KiB in the calls where the tuner tries the direct way).
    Case {
        name: "teams_and_collectives_direct_reads",
        run: teams_and_collectives,
        ranks: &[3],
        env: &[("WEFT_COLL_DIRECT_BYTES", "32768")],
    },
    // The smallest slots (16 KiB: what teams of 256 members get by default): every message
    // longer than 2 KiB goes in 8 and 16 KiB chunks, through both kinds of algorithms.
    Case {
        name: "teams_and_collectives_small_slots",
        run: teams_and_collectives,
        ranks: &[2, 4],
        env: &[("WEFT_COLL_SCRATCH_KIB", "16"), ("WEFT_COLL_DIRECT_BYTES", "100000000")],
    },
    Case {
        name: "teams_and_collectives_small_algorithms",
        run: teams_and_collectives,
        ranks: &[4],
        env: &[("WEFT_COLL_SMALL_BYTES", "100000000")],
    },
];

/// A rank killed with SIGKILL: the launcher names it within 2 s and nothing stays in /dev/shm.
fn killed_rank_reported(n: u32) -> Result<(), libtest_mimic::Failed> {
    let (out, took, pid) = common::launch("WEFT_TEST_CASE", "killed_rank", n, &[]);
    let ended = weft::fabric::os::now_ns();
    let err = String::from_utf8_lossy(&out.stderr);
    // mpirun words it "process rank 1 ... exited on signal 9 (Killed)", srun "task 1: Killed".
    let reported = match common::launcher() {
        "mpirun" => err.contains("rank 1") && err.contains("signal 9"),
        "srun" => err.contains("task 1: Killed"),
        _ => err.contains("rank 1") && err.contains("SIGKILL"),
    };
    if out.status.success() || !reported {
        return Err(format!("kill not reported ({})\n{}", out.status, common::text(&out)).into());
    }
    // The job ends when the launcher has stopped everyone: within 2 s of the kill under
    // `weft run`, 5 s under mpirun and srun (whose reaction is theirs), where the ranks would
    // otherwise sleep 30 s. Measured from the kill on the host's monotonic clock, not from the
    // launch: srun's start-up alone took over 2 s on a loaded 2-core machine.
    let out_text = String::from_utf8_lossy(&out.stdout);
    let killed_at = out_text
        .lines()
        .find_map(|l| l.split("KILLING-MYSELF at ").nth(1)?.trim().parse::<u64>().ok())
        .ok_or_else(|| format!("no kill time in the output ({took:?})\n{}", common::text(&out)))?;
    let after = Duration::from_nanos(ended.saturating_sub(killed_at));
    let limit = Duration::from_secs(if common::launcher() == "weft run" { 2 } else { 5 });
    if after > limit {
        return Err(format!("job took {after:?} to end after the kill ({took:?} in all)").into());
    }
    let left = common::shm_leftovers(pid);
    if !left.is_empty() {
        return Err(format!("files left in /dev/shm: {left:?}").into());
    }
    Ok(())
}

/// Ranks that a launcher binds to one core each (here `taskset -c 0`) are not oversubscribed
/// when the node has a core per rank: they keep spinning before they yield. They used to judge
/// by their own affinity mask (one processor), stop spinning, and run small collectives 2.5x
/// slower under `mpirun`'s binding.
fn bound_ranks_keep_spinning() -> Result<(), libtest_mimic::Failed> {
    let weft = env!("CARGO_BIN_EXE_weft");
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let want = if cpus >= 2 { "spin 20µs" } else { "spin 0ns" };
    let out = Command::new(weft)
        .args(["run", "-n", "2", "--", "taskset", "-c", "0", weft, "__rank", "info", "--segment-kib", "64"])
        .args(["--threads", "1"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let policies: Vec<&str> = text.lines().filter(|l| l.contains("wait policy")).collect();
    if !out.status.success() || policies.is_empty() || !policies.iter().all(|l| l.contains(want)) {
        return Err(
            format!("2 bound ranks on {cpus} cores, expected \"{want}\": {}", common::text(&out)).into()
        );
    }
    Ok(())
}

/// `weft bench scale` on 2 and 3 ranks: every row there, with numbers a run could produce,
/// and a bad rank list refused.
fn bench_scale_runs() -> Result<(), libtest_mimic::Failed> {
    let weft = env!("CARGO_BIN_EXE_weft");
    // On shared memory (the suite's subject), whatever fabric the other tests run on.
    let out = Command::new(weft)
        .args(["bench", "scale", "--json"])
        .env("WEFT_SCALE_RANKS", "2,3")
        .env_remove("WEFT_FABRIC")
        .env_remove("WEFT_SAME_HOST")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("\"suite\":\"scale\"")).collect();
    if !out.status.success() || rows.len() != 12 {
        return Err(format!("weft bench scale gave {} rows: {}", rows.len(), common::text(&out)).into());
    }
    let value = |kind: &str, n: u32| -> Option<f64> {
        let row = rows
            .iter()
            .find(|r| r.contains(&format!("\"kind\":\"{kind}\"")) && r.contains(&format!("\"ranks\":{n}")))?;
        let v = row.split("\"value\":").nth(1)?.split([',', '}']).next()?;
        v.parse().ok()
    };
    // The /dev/shm figure is node-wide (other tests' jobs come and go meanwhile): only its
    // presence is checked here.
    for n in [2, 3] {
        for kind in ["startup", "shm", "rtt", "barrier", "team_shm", "team_barrier"] {
            let least = if kind.ends_with("shm") { f64::MIN } else { f64::MIN_POSITIVE };
            if !value(kind, n).is_some_and(|v| v >= least && v.is_finite()) {
                return Err(format!("scale {kind} at {n} ranks: {:?}\n{text}", value(kind, n)).into());
            }
        }
    }
    let out = Command::new(weft).args(["bench", "scale"]).env("WEFT_SCALE_RANKS", "2,x").output()?;
    if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("WEFT_SCALE_RANKS") {
        return Err(format!("a bad WEFT_SCALE_RANKS: {}", common::text(&out)).into());
    }
    Ok(())
}

fn launcher_errors() -> Result<(), libtest_mimic::Failed> {
    let weft = env!("CARGO_BIN_EXE_weft");
    let out = Command::new(weft).args(["run", "-n", "2"]).output()?;
    if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("PROGRAM") {
        return Err(format!("`weft run` without a program: {}", common::text(&out)).into());
    }
    let out = Command::new(weft).args(["run", "-n", "2", "--", "/nonexistent/program"]).output()?;
    if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("cannot start") {
        return Err(format!("missing program: {}", common::text(&out)).into());
    }
    let out = Command::new(weft).args(["run", "-n", "2", "--", "sh", "-c", "exit 3"]).output()?;
    if out.status.code() != Some(3) {
        return Err(format!("exit status not forwarded: {}", common::text(&out)).into());
    }
    // Inside a job, `weft info` reports on that job (once, from its rank 0) instead of
    // starting a job of its own in every rank; `weft bench`, which starts ranks, refuses.
    let out = Command::new(weft).args(["run", "-n", "2", "--", weft, "info", "--threads", "1"]).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.matches("2 (this is rank 0)").count() != 1 {
        return Err(format!("`weft info` inside a 2-rank job: {}", common::text(&out)).into());
    }
    let out = Command::new(weft).args(["run", "-n", "1", "--", weft, "bench", "am"]).output()?;
    if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("outside mpirun") {
        return Err(format!("`weft bench` inside a job: {}", common::text(&out)).into());
    }
    let exe = std::env::current_exe()?;
    let out = Command::new(weft)
        .args(["run", "-n", "2", "--"])
        .arg(exe)
        .env("WEFT_TEST_CASE", "bad_input")
        .env("WEFT_AM_RING_KIB", "lots")
        .output()?;
    let err = String::from_utf8_lossy(&out.stdout);
    if out.status.success() || !err.contains("WEFT_AM_RING_KIB") {
        return Err(format!("bad WEFT_* value: {}", common::text(&out)).into());
    }
    Ok(())
}

fn main() {
    common::run_rank("WEFT_TEST_CASE", CASES, &[("killed_rank", killed_rank)]);
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = common::trials("WEFT_TEST_CASE", CASES);
    trials.push(libtest_mimic::Trial::test("killed_rank_reported_2ranks", || killed_rank_reported(2)));
    trials.push(libtest_mimic::Trial::test("killed_rank_reported_4ranks", || killed_rank_reported(4)));
    trials.push(libtest_mimic::Trial::test("launcher_errors", launcher_errors));
    trials.push(libtest_mimic::Trial::test("bench_scale_runs", bench_scale_runs));
    trials.push(libtest_mimic::Trial::test("bound_ranks_keep_spinning", bound_ranks_keep_spinning));
    libtest_mimic::run(&args, trials).exit();
}
