//! Attacks and misuse (issue 34): wrapping addresses, squatted or forged shared-memory files,
//! ranks started twice, bad settings, hung and stopped ranks, and a launcher that must stop
//! everything a rank started. Rank programs are this executable with `WEFT_HARDEN_CASE` set;
//! the launcher checks start jobs of their own.

#[path = "../common/mod.rs"]
mod common;
mod launcher;
mod ranks;

use common::{ck, Case, Failure, Res};
use launcher::*;
use ranks::*;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use weft::{Error, World};

type Trial = Result<(), libtest_mimic::Failed>;
/// How a check plants a file under a name weft will publish.
type Plant = Box<dyn Fn(&str) -> std::io::Result<()>>;
/// A launcher-level check: its name and body.
type Check = (&'static str, fn() -> Trial);

const CASES: &[Case] = &[
    Case { name: "forged_barrier", run: forged_barrier, ranks: &[2], env: &[] },
    Case { name: "forged_exchange_flood", run: forged_exchange_flood, ranks: &[2], env: &[] },
    Case { name: "forged_rpc_flood", run: forged_rpc_flood, ranks: &[2], env: &[] },
    // No progress thread: rank 2's would serve the call while its main thread sleeps, and
    // then a true acknowledgement releases the arguments (under load, most runs).
    Case {
        name: "forged_completions",
        run: forged_completions,
        ranks: &[3],
        env: &[("WEFT_RMA", "am"), ("WEFT_PROGRESS_THREAD", "0")],
    },
    Case { name: "nested_async_calls", run: nested_async_calls, ranks: &[2, 4], env: &[] },
    // A progress thread that polls: the on-demand one would be woken (a system call) at each
    // of the chain's wake-ups, and with none every waiting level would poll itself each round.
    Case {
        name: "nested_chain_linear",
        run: nested_chain_linear,
        ranks: &[2],
        env: &[("WEFT_PROGRESS_THREAD", "1")],
    },
    Case { name: "nested_calls_under_tokio", run: nested_calls_under_tokio, ranks: &[4], env: &[] },
    Case { name: "wrapping_indexes", run: wrapping_indexes, ranks: &[2], env: &[] },
    Case { name: "wrapping_indexes_am_path", run: wrapping_indexes, ranks: &[2], env: &[("WEFT_RMA", "am")] },
];

fn main() {
    let programs: [common::Program; 11] = [
        ("slow_remote_fn", slow_remote_fn),
        ("pool_beyond_shm", pool_beyond_shm),
        ("partial_alloc", partial_alloc),
        ("huge_segment", huge_segment),
        ("alloc_late", alloc_late),
        ("stranger", stranger),
        ("init_only", init_only),
        ("barrier_loop", barrier_loop),
        ("stopped_rank", stopped_rank),
        ("sigbus_rank", sigbus_rank),
        ("late_rank", late_rank),
    ];
    common::run_rank("WEFT_HARDEN_CASE", CASES, &programs);
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = common::trials("WEFT_HARDEN_CASE", CASES);
    let checks: [Check; 20] = [
        ("slow_remote_fn_named", slow_remote_fn_named),
        ("output_all_forwarded", output_all_forwarded),
        ("bad_settings", bad_settings),
        ("same_rank_twice", same_rank_twice),
        ("same_rank_late", same_rank_late),
        ("claim_strangers", claim_strangers),
        ("public_names_reveal_nothing", public_names_reveal_nothing),
        ("dead_peer_files_removed", dead_peer_files_removed),
        ("full_shm_is_an_error", full_shm_is_an_error),
        ("other_jobs_left_alone", other_jobs_left_alone),
        ("pid_namespace_with_host_proc", pid_namespace_with_host_proc),
        ("timeout_status_and_leftovers", timeout_status_and_leftovers),
        ("startup_mismatch_cleans_up", startup_mismatch_cleans_up),
        ("squatted_names", squatted_names),
        ("job_ids_unguessable", job_ids_unguessable),
        ("stopped_rank_named", stopped_rank_named),
        ("rank_children_stopped", rank_children_stopped),
        ("interrupt_stops_everything", interrupt_stops_everything),
        ("launcher_killed", launcher_killed),
        ("first_failure_named", first_failure_named),
    ];
    trials.extend(checks.into_iter().map(|(name, f)| libtest_mimic::Trial::test(name, f)));
    libtest_mimic::run(&args, trials).exit();
}
