//! `weft bench`: weft's figures beside this machine's limits, measured in the same run.

mod am;
mod bale;
mod coll;
#[cfg(feature = "mpi")]
pub mod coll_mpi;
mod dgemm;
mod ft;
mod limits;
mod msgrate;
mod net;
pub(crate) mod report;
mod rma;
mod rpc;
pub mod scale;
mod serialize;
mod shmem;
mod stencil;

use clap::{Args, ValueEnum};
use report::{print_json, print_table, Progress, Row};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use weft::fabric::os;
use weft::{AmHandler, World};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Suite {
    /// Cache-line round trip between two processes, memcpy by size.
    Limits,
    /// Put/get latency, put+flag ping-pong, NB/NBI flood bandwidth, 8 B NBI rate.
    Rma,
    /// Empty AM round trip, short/medium/long rates.
    Am,
    /// weft's archive (zero-copy on and off) beside bincode 2, postcard, bitcode and rkyv.
    Serialize,
    /// Empty call round trip; ping-pong and bidirectional bandwidth of Vec, SerializeBuffer
    /// and RmaVec arguments, 1 and 2 threads per rank.
    Rpc,
    /// Barrier, broadcast, allreduce and alltoall latency by size, beside Open MPI's (built
    /// with `--features mpi`) or the machine's floor.
    Coll,
    /// Message rate of T threads on their own endpoints, per sharing category and feature
    /// (Zambre et al.'s method), with the resources each point holds. Threads: 1, 2, 4 ...
    /// up to the cores (at most 16), or `WEFT_MSGRATE_THREADS=1,2,...`.
    Msgrate,
    /// The global-array kernel: rank 0's threads fetch tiles of A and B from rank 1, multiply
    /// and put C tiles back, each thread on its own endpoint, every category; beside the
    /// compute-only rate. Matrix order `WEFT_DGEMM_N` (default 1024).
    Dgemm,
    /// 5-point stencil, strips over ranks × threads = the cores (1×2, 2×1 on 2 cores), halo
    /// rows through each thread's endpoint, every category; beside the same split with no exchange. Grid
    /// `WEFT_STENCIL_N` (default 1024), P = `WEFT_STENCIL_P` (default the cores, at most 16).
    /// Run with as many ranks as splits wanted (`-n P`).
    Stencil,
    /// A network fabric beside libfabric's `fi_pingpong` on the same provider, measured in the
    /// same run: 8 B put latency and empty AM round trip beside its round trip, 1 MiB put
    /// bandwidth beside its bandwidth. Run with `--fabric ofi --provider tcp` (build with
    /// `--features ofi`). Not in the default set.
    Net,
    /// NAS FT (class `--class`): exchange, slabs and pencils, one-sided and two-sided, each
    /// beside the bulk exchange of the same model. Not in the default set (seconds to minutes).
    Ft,
    /// Ranks of one node, N = 2..64 (`WEFT_SCALE_RANKS=2,4,...`): start-up of `weft run`,
    /// /dev/shm per rank, round trip rank 0 - N-1 and barrier, each beside `mpirun` running
    /// the same programs (with `--features mpi`). Ignores `-n`. The /dev/shm figure counts
    /// the whole node's: run it on a quiet node. Not in the default set.
    Scale,
    /// The OSU Micro-Benchmarks' OpenSHMEM programs (`WEFT_OSU_SHMEM`, else
    /// `../shared/third_party/osu-openshmem`) built against weft (`weft cc`) and against Open
    /// MPI's OpenSHMEM (`oshcc`), run alternately (`WEFT_SHMEM_ROUNDS` each, default 2), each
    /// row beside Open MPI's. Point-to-point programs on 2 PEs, collectives on `-n`. Not in the
    /// default set.
    Shmem,
    /// bale's kernels on distributed arrays (histogram, index gather), each verified, in three
    /// forms alternating in one run: aggregated batches, one blocking operation at a time,
    /// and every rank's updates applied to a local array only (the memory limit). Updates per
    /// rank `WEFT_BALE_UPDATES` (default 1 Mi), 100 k table entries per rank.
    Bale,
}

#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// Suites to run (default: all but ft, msgrate, dgemm, stencil, net and scale).
    #[arg(value_enum)]
    pub suites: Vec<Suite>,
    /// Number of ranks.
    #[arg(short = 'n', long = "ranks", default_value_t = 2)]
    pub n: u32,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// NAS FT problem class for the ft suite: S, W, A, B or C.
    #[arg(long, default_value = "A")]
    pub class: weft_ft::Class,
    /// Fabric of the ranks (sets `WEFT_FABRIC`); `ofi` also sends the traffic between ranks
    /// of this host through libfabric (`WEFT_SAME_HOST=ofi`), which is what a network
    /// benchmark on one machine needs.
    #[arg(long)]
    pub fabric: Option<String>,
    /// libfabric provider with `--fabric ofi` (sets `WEFT_OFI_PROVIDER`; `fi_pingpong` uses it too).
    #[arg(long)]
    pub provider: Option<String>,
    /// libfabric domain with `--fabric ofi` (sets `WEFT_OFI_DOMAIN`, e.g. `lo`).
    #[arg(long)]
    pub domain: Option<String>,
}

impl BenchArgs {
    /// The fabric settings for the ranks' environment.
    fn fabric_env(&self) -> Vec<(String, String)> {
        let mut env = vec![];
        if let Some(f) = &self.fabric {
            env.push(("WEFT_FABRIC".to_string(), f.clone()));
            if f == "ofi" {
                env.push(("WEFT_SAME_HOST".to_string(), "ofi".to_string()));
            }
        }
        for (var, v) in [("WEFT_OFI_PROVIDER", &self.provider), ("WEFT_OFI_DOMAIN", &self.domain)] {
            if let Some(v) = v {
                env.push((var.to_string(), v.clone()));
            }
        }
        env
    }
}

/// Starts the ranks of a benchmark run (the `scale` suite starts its own jobs, after the
/// other suites).
pub fn launch(args: &BenchArgs) -> Result<i32, String> {
    let scale = args.suites.contains(&Suite::Scale);
    let shmem = args.suites.contains(&Suite::Shmem);
    let suites: Vec<Suite> =
        args.suites.iter().copied().filter(|&s| s != Suite::Scale && s != Suite::Shmem).collect();
    let mut code = 0;
    if !(scale || shmem) || !suites.is_empty() {
        code = launch_ranks(&BenchArgs { suites, ..args.clone() })?;
    }
    if shmem && code == 0 {
        let rows = shmem::run(args.n)?;
        if args.json {
            print_json(&rows);
        } else {
            println!("weft bench shmem: OSU OpenSHMEM programs on {}; ratio = weft / Open MPI", hostname());
            print_table(&rows);
        }
    }
    if scale && code == 0 {
        let rows = scale::run()?;
        if args.json {
            print_json(&rows);
        } else {
            println!("weft bench scale: ranks of one node on {}; ratio = weft / Open MPI", hostname());
            print_table(&rows);
        }
    }
    Ok(code)
}

fn launch_ranks(args: &BenchArgs) -> Result<i32, String> {
    let mut a: Vec<std::ffi::OsString> =
        vec!["__rank".into(), "bench".into(), "-n".into(), args.n.to_string().into()];
    a.extend(args.suites.iter().map(|s| format!("{s:?}").to_lowercase().into()));
    if args.json {
        a.push("--json".into());
    }
    a.extend(["--class".into(), args.class.to_string().into()]);
    let mut env = args.fabric_env();
    let mut files = vec![];
    if args.suites.is_empty() || args.suites.contains(&Suite::Coll) {
        let peer = peer_collectives(args.n);
        files.extend(peer.iter().map(|(_, path)| path.clone()));
        env.extend(peer);
    }
    let r = super::self_launch(args.n, a, env);
    files.iter().for_each(|f| drop(std::fs::remove_file(f)));
    r
}

/// Open MPI's collective figures for the `coll` suite, measured now, before the weft ranks
/// start (so the two never share the cores).
#[cfg(feature = "mpi")]
fn peer_collectives(n: u32) -> Option<(String, String)> {
    coll_mpi::measure_peer(n).inspect_err(|e| eprintln!("weft bench coll: no Open MPI figures: {e}")).ok()
}

#[cfg(not(feature = "mpi"))]
fn peer_collectives(_n: u32) -> Option<(String, String)> {
    None
}

/// AM handlers of the `am` suite and what they count.
pub struct Handlers {
    pub ping: AmHandler,
    pub sink: AmHandler,
    pub fin: AmHandler,
    pub pongs: Arc<AtomicU64>,
    pub fin_acks: Arc<AtomicU64>,
    /// Counts what it receives (`counted`).
    pub count: AmHandler,
    pub counted: Arc<AtomicU64>,
    /// Counts notices (`dones`).
    pub done: AmHandler,
    pub dones: Arc<AtomicU64>,
}

pub struct Ctx {
    pub world: World,
    pub handlers: Handlers,
    pub progress: Progress,
}

fn counter(b: &mut weft::Builder, name: &str) -> (AmHandler, Arc<AtomicU64>) {
    let c = Arc::new(AtomicU64::new(0));
    let c2 = c.clone();
    (
        b.handler(name, move |_| {
            c2.fetch_add(1, Ordering::AcqRel);
        }),
        c,
    )
}

/// One rank of `weft bench`.
pub fn rank_main(args: &BenchArgs) -> Result<(), weft::Error> {
    // Every format and path is timed on reused memory, not on page faults (~3 µs a page here).
    let heap_kept = weft::fabric::os::keep_freed_memory();
    let mut b = weft::World::builder();
    let (pong, pongs) = counter(&mut b, "bench.pong");
    let (fin_ack, fin_acks) = counter(&mut b, "bench.fin_ack");
    let ping = b.handler("bench.ping", move |m| m.reply_short(pong, &[]).expect("reply"));
    let fin = b.handler("bench.fin", move |m| m.reply_short(fin_ack, &[]).expect("reply"));
    let sink = b.handler("bench.sink", |_| {});
    let (count, counted) = counter(&mut b, "bench.count");
    let (done, dones) = counter(&mut b, "bench.done");
    let ft = weft_ft::Ft::register(&mut b);
    let world = b.init()?;
    let progress = Progress::new(args.json, world.rank());
    let ctx = Ctx {
        world,
        handlers: Handlers { ping, sink, fin, pongs, fin_acks, count, counted, done, dones },
        progress,
    };
    let suites = if args.suites.is_empty() {
        Suite::value_variants()
            .iter()
            .copied()
            .filter(|&s| {
                !matches!(
                    s,
                    Suite::Ft
                        | Suite::Msgrate
                        | Suite::Dgemm
                        | Suite::Stencil
                        | Suite::Net
                        | Suite::Scale
                        | Suite::Shmem
                )
            })
            .collect()
    } else {
        args.suites.clone()
    };
    let lim = limits::measure(&ctx)?;
    let mut rows: Vec<Row> = vec![];
    let mut ft_rows = vec![];
    for s in suites {
        match s {
            Suite::Limits => rows.extend(lim.rows()),
            Suite::Rma => rows.extend(rma::run(&ctx, &lim)?),
            Suite::Am => rows.extend(am::run(&ctx, &lim)?),
            Suite::Serialize => rows.extend(serialize::run(&ctx)?),
            Suite::Rpc => rows.extend(rpc::run(&ctx, &lim)?),
            Suite::Bale => rows.extend(bale::run(&ctx)?),
            Suite::Coll => rows.extend(coll::run(&ctx, &lim)?),
            Suite::Msgrate => rows.extend(msgrate::run(&ctx, &msgrate::thread_counts())?),
            Suite::Dgemm => rows.extend(dgemm::run(&ctx, &msgrate::thread_counts())?),
            Suite::Stencil => rows.extend(stencil::run(&ctx)?),
            Suite::Net => rows.extend(net::run(&ctx)?),
            Suite::Ft => ft_rows = ft::run(&ctx, &ft, args.class)?,
            // Started by the launcher side (`launch`), never inside the ranks.
            Suite::Scale | Suite::Shmem => {}
        }
    }
    ctx.progress.done();
    if ctx.world.rank() == 0 {
        if ctx.world.size() < 2 {
            eprintln!("weft bench: the rma, am and rpc suites need at least 2 ranks (-n 2)");
        }
        if args.json {
            print_json(&rows);
            ft::print_json(&ft_rows);
        } else {
            println!(
                "weft bench: {} ranks on {} (fabric {}); ratio = weft / limit",
                ctx.world.size(),
                hostname(),
                ctx.world.info().fabric
            );
            if heap_kept {
                println!("(malloc keeps freed memory, as RDMA setups ask: buffers are timed warm)");
            }
            print_table(&rows);
            ft::print_table(&ft_rows);
        }
    }
    ctx.world.barrier()
}

/// Runs `work` on each endpoint in a thread of its own (the endpoint moves into it); returns
/// the results in endpoint order, the first error, or an error if a thread panicked. With
/// `first_cpu` = `Some(k)`, thread i is bound to CPU `k + i` of those the process may use
/// (wrapping round), as the endpoint paper's runs bind theirs: unbound on 2 cores, the
/// scheduler sometimes kept two busy threads on one core for milliseconds.
pub fn on_own_threads<'c, T: Send>(
    eps: Vec<weft::Endpoint<'c>>,
    first_cpu: Option<usize>,
    work: impl Fn(weft::Endpoint<'c>) -> Result<T, weft::Error> + Sync,
) -> Result<Vec<T>, weft::Error> {
    let cpus = if first_cpu.is_some() { os::allowed_cpus() } else { Vec::new() };
    std::thread::scope(|s| {
        let (work, cpus) = (&work, &cpus);
        let threads: Vec<_> = eps
            .into_iter()
            .enumerate()
            .map(|(i, ep)| {
                s.spawn(move || {
                    if let Some(k) = first_cpu {
                        os::pin_to_nth(cpus, k + i);
                    }
                    work(ep)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().map_err(|_| weft::Error::Misuse("a benchmark thread panicked"))?)
            .collect()
    })
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "this node".into())
}
