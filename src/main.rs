//! The `weft` command: `weft run` (launcher), `weft info`, `weft bench`.

mod cli;

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "weft",
    version,
    about = "weft: one-sided communication, active messages and a launcher for multi-process programs"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start N ranks of PROGRAM on this node; if one fails, stop the others and say why.
    Run {
        /// Number of ranks.
        #[arg(short = 'n', long = "ranks", default_value_t = 2)]
        n: u32,
        /// Forward output unchanged instead of prefixing each line with "[rank] ".
        #[arg(long)]
        raw: bool,
        /// Stop the job after this many seconds.
        #[arg(long, value_name = "SECONDS")]
        timeout: Option<f64>,
        /// The program and its arguments.
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "PROGRAM [ARGS]"
        )]
        command: Vec<OsString>,
    },
    /// Show the fabric, ranks, segments and communication resources of a job of N ranks.
    Info {
        /// Number of ranks.
        #[arg(short = 'n', long = "ranks", default_value_t = 2)]
        n: u32,
        /// Size of the segment the job allocates, KiB.
        #[arg(long, default_value_t = 1024)]
        segment_kib: usize,
        /// Endpoints per rank for the table of endpoint categories (default: this machine's
        /// cores, at most 16).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Measure weft beside this machine's limits (default suites: limits rma am).
    Bench(cli::bench::BenchArgs),
    /// PNG figures from `weft bench --json` output (msgrate, dgemm, stencil).
    Plot {
        /// A file of `weft bench --json` lines.
        input: std::path::PathBuf,
        /// Folder for the PNG files.
        #[arg(long, default_value = "plots")]
        out: std::path::PathBuf,
    },
    /// Compile and link a C OpenSHMEM program against weft (`shmem.h`, libweft_shmem), as
    /// `oshcc` does: `weft cc -O2 -o prog prog.c`, then `weft run -n 4 ./prog`. `--show`
    /// prints the command; `--weft-static` links the static library; `--pkg-config` prints a
    /// pkg-config file (`weft cc --pkg-config > weft-shmem.pc`).
    #[command(disable_help_flag = true)]
    Cc {
        /// Compiler arguments (the compiler is `cc`, or `WEFT_CC`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
        args: Vec<OsString>,
    },
    /// `weft cc` for C++ (the compiler is `c++`, or `WEFT_CXX`).
    #[command(name = "c++", disable_help_flag = true)]
    Cxx {
        /// Compiler arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
        args: Vec<OsString>,
    },
    /// Internal: what one rank of `weft info` / `weft bench` runs.
    #[command(hide = true, name = "__rank")]
    Rank {
        #[command(subcommand)]
        what: RankCmd,
    },
}

#[derive(Subcommand)]
enum RankCmd {
    Info {
        #[arg(long)]
        segment_kib: usize,
        #[arg(long)]
        threads: usize,
    },
    Bench(cli::bench::BenchArgs),
    /// One rank of the `scale` suite's jobs: start-up only, or measuring (rank 0 writes OUT).
    #[command(name = "__scale")]
    Scale {
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// One MPI process of the `scale` suite's Open MPI twin.
    #[cfg(feature = "mpi")]
    #[command(name = "__mpi-scale")]
    MpiScale {
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// One MPI process of the `coll` suite's Open MPI comparison; rank 0 writes OUT.
    #[cfg(feature = "mpi")]
    #[command(name = "__mpi-coll")]
    MpiColl {
        out: std::path::PathBuf,
    },
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(code.clamp(0, 255) as u8)
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("weft: {e}");
    ExitCode::from(1)
}

fn cc(cxx: bool, args: Vec<OsString>) -> ExitCode {
    match cli::cc::main(cxx, args) {
        Ok(code) => exit(code),
        Err(e) => fail(format!("{}: {e}", if cxx { "c++" } else { "cc" })),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Run { n, raw, timeout, mut command } => {
            let program = command.remove(0);
            let timeout = match timeout.map(std::time::Duration::try_from_secs_f64) {
                None => None,
                Some(Ok(t)) if !t.is_zero() => Some(t),
                Some(_) => return fail(format!("run: --timeout {}: expected a positive number of seconds", timeout.unwrap_or_default())),
            };
            let spec =
                cli::run::LaunchSpec { ranks: n, program, args: command, label: !raw, timeout, env: vec![] };
            match cli::run::launch(&spec) {
                Ok(code) => exit(code),
                Err(e) => fail(format!("run: {e}")),
            }
        }
        Cmd::Info { n, segment_kib, threads } => {
            let threads = threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |c| c.get()).min(16));
            if weft::launched() {
                // Under mpirun, srun or `weft run`: this process is a rank of that job, and
                // reports on it, rather than starting a job of its own inside each rank.
                return match cli::info::rank_main(segment_kib, threads) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => fail(e),
                };
            }
            let args = vec![
                "__rank".into(),
                "info".into(),
                "--segment-kib".into(),
                segment_kib.to_string().into(),
                "--threads".into(),
                threads.to_string().into(),
            ];
            match cli::self_launch(n, args, vec![]) {
                Ok(code) => exit(code),
                Err(e) => fail(e),
            }
        }
        Cmd::Bench(_) if weft::launched() => fail(
            "bench starts its ranks itself (and Open MPI's, for coll): run `weft bench` outside mpirun, srun and `weft run`",
        ),
        Cmd::Bench(b) => match cli::bench::launch(&b) {
            Ok(code) => exit(code),
            Err(e) => fail(e),
        },
        Cmd::Cc { args } => cc(false, args),
        Cmd::Cxx { args } => cc(true, args),
        Cmd::Plot { input, out } => match cli::plot::plot(&input, &out) {
            Ok(files) if files.is_empty() => {
                fail(format!("{}: no msgrate, dgemm, stencil or scale rows", input.display()))
            }
            Ok(files) => {
                files.iter().for_each(|f| println!("{}", f.display()));
                exit(0)
            }
            Err(e) => fail(e),
        },
        Cmd::Rank { what } => {
            let r = match what {
                RankCmd::Info { segment_kib, threads } => cli::info::rank_main(segment_kib, threads),
                RankCmd::Bench(b) => cli::bench::rank_main(&b),
                RankCmd::Scale { out } => cli::bench::scale::weft_rank(out.as_deref()),
                #[cfg(feature = "mpi")]
                RankCmd::MpiScale { out } => {
                    cli::bench::scale::mpi_rank(out.as_deref()).map_err(weft::Error::Config)
                }
                #[cfg(feature = "mpi")]
                RankCmd::MpiColl { out } => cli::bench::coll_mpi::worker(&out).map_err(weft::Error::Config),
            };
            match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
    }
}
