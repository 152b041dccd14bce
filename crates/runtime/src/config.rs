//! Configuration: builder values, then `WEFT_*` environment variables, then defaults.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `WEFT_RANK`, `WEFT_SIZE`, `WEFT_JOB` | set by the launcher (`weft run`): this rank, the number of ranks, the job id | a job of one rank |
//! | `WEFT_FABRIC` | `shm` (processes of one node, shared memory) or `ofi` (libfabric; needs the `ofi` feature and a start-up channel: `weft run`) | shm |
//! | `WEFT_OFI_PROVIDER` | libfabric provider for `ofi` (`tcp`, `shm`, `verbs`, `efa`, `cxi`, ...) | the first that offers RDM messages and RMA |
//! | `WEFT_OFI_DOMAIN` | libfabric domain (NIC or interface, e.g. `lo`) | the provider's first |
//! | `WEFT_OFI_ZCOPY_KIB` | with `ofi`: RPC chunks (and other memory the caller owns) from this many KiB up are registered and read by the peer in place; smaller ones are copied into registered buffers | 16 |
//! | `WEFT_OFI_MR_LOCAL` | with `ofi`: `1` registers every local buffer an operation names, as providers that require `FI_MR_LOCAL` (verbs, efa) need, on any provider (to run that path) | 0 |
//! | `WEFT_OFI_SILENT_MS` | with `ofi` on a provider that listens on a TCP port (tcp, sockets): a connection accepted on it that has sent nothing for this many ms (a rank's sends its connection request at once) is shut down, so processes outside the job cannot use up the rank's file descriptors; 0: never | 2000 |
//! | `WEFT_OFI_SILENT_MAX` | with `ofi`: more silent connections than this are shut down at once, oldest first | 64 |
//! | `WEFT_SAME_HOST` | with `ofi`: how ranks of one host reach each other, `shm` (shared memory, libfabric only to other hosts: the hybrid fabric) or `ofi` (libfabric to everyone) | shm |
//! | `WEFT_AM_INBOX_KIB` | KiB of shared memory a rank's inbox gives its active-message rings (two per rank of the node, requests and replies): each ring gets its share, a power of two from 16 to 256 KiB, so the share per rank stays flat as a node's ranks grow | 4096 (256 KiB rings up to 8 ranks, 32 KiB at 64) |
//! | `WEFT_AM_RING_KIB` | instead: KiB of each ring, whatever the ranks, rounded down to a power of two | unset |
//! | `WEFT_PROGRESS_THREAD` | `auto`: a thread that sleeps while the program's threads poll or wait in weft and serves messages and pending futures when none does ([`Progress::OnDemand`]); `1`: a thread that polls whenever no program thread waits in weft (a blocking get included); `0`: none (futures poll themselves again at once) | 1 where the fabric needs target progress, else auto |
//! | `WEFT_SPIN_US` | µs a wait spins before yielding, then sleeping | 20; 0 when more of the job's ranks run on this node than it has cores (`WEFT_NODE_CPUS`) |
//! | `WEFT_NODE_CPUS` | cores the ranks of this node share, for that test (set by `weft run` from its own affinity and quota; not a rank's own mask, which a launcher that binds ranks narrows to one core) | the node's online processors |
//! | `WEFT_RMA` | `native` (the fabric's RMA and atomics) or `am` (the AM-based path, for testing the fallback) | native |
//! | `WEFT_INIT_TIMEOUT_S` | seconds start-up waits for every rank | 60 |
//! | `WEFT_PEER_CHECK_MS` | ms between checks that the peers a wait depends on are alive | 10 |
//! | `WEFT_HANG_WARN_S` | a wait that has made no progress for this many seconds prints, once, which ranks it waits for and on what (0: never) | 30 |
//! | `WEFT_COLL_CHECK` | `strict`: every team collective starts by waiting until every member has reached it and agrees on it (kind, root, size), so a mismatch fails in the call itself on every member, roots included, at the cost of a synchronisation per call; `peer`: members compare calls only where they wait (a root that only sends may return first) | peer |
//! | `WEFT_COLL_SMALL_BYTES` | team collectives up to this many bytes per member use the latency algorithms (one round of messages, recursive doubling), larger ones the bandwidth algorithms (ring, pairwise exchange) | 16384 |
//! | `WEFT_VIS_PACK_BYTES` | non-contiguous puts and gets whose pieces average at most this many bytes travel packed in AMs, larger ones as one RMA per piece | 0 with load/store RMA (shared memory), else 512 |
//! | `WEFT_COLL_DIRECT_BYTES` | team-collective messages from this many bytes up are read straight from the sender's buffer where the fabric can read peer memory (one copy instead of two, but a system call) | 16777216 |
//! | `WEFT_COLL_SCRATCH_KIB` | KiB of shared memory each member of a team gives the team's message slots (one per member, a power of two from 16 to 256 KiB), so a rank's share per team stays flat as teams grow; messages longer than a slot go in chunks | 4096 (256 KiB slots up to 16 members, 32 KiB at 128) |
//! | `WEFT_COLL_TUNE` | `1`: blocking broadcasts, reductions and alltoalls from 64 KiB up (below `WEFT_COLL_DIRECT_BYTES`) time both ways of moving their messages (slots or direct read) and take the faster, trying the other now and then | 1 where the fabric can read peer memory, unless `WEFT_COLL_DIRECT_BYTES` is set |
//! | `WEFT_AGG_BYTES` | aggregation (`weft-agg`: batch operations of distributed arrays and maps): bytes of a destination's buffer, sent when full; 0 sends every operation alone | 16384, at most the fabric's largest medium AM |
//! | `WEFT_ARRAY_MAPPED` | batch operations of distributed arrays on elements whose owner's memory this process maps (shared memory): `direct` reads and updates there with the CPU's own loads and atomics, `loads` only reads there and sends updates to the owner aggregated, `messages` sends everything to the owner like the others | loads |
//! | `WEFT_AGG_DELAY_US` | aggregation: µs an operation may wait in a buffer of a thread that stopped calling weft before a helper thread sends it | 100 |

use crate::startup::Identity;
use crate::{Error, Result};
use std::time::Duration;

/// Which implementation carries RMA and atomics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaPath {
    /// The fabric's native RMA/atomics where it has them, the AM-based path otherwise.
    Native,
    /// Always the AM-based path (what a fabric without RMA gets).
    ActiveMessages,
}

pub use weft_fabric::FabricChoice;

/// Resolved configuration of a world (see the module documentation for the variables).
#[derive(Clone, Debug)]
pub struct Config {
    /// This rank.
    pub rank: u32,
    /// Ranks in the job.
    pub size: u32,
    /// Job id.
    pub job: String,
    /// The fabric.
    pub fabric: FabricChoice,
    /// Size of the shared-memory AM rings.
    pub rings: weft_fabric::RingSize,
    /// Which progress thread runs. Unless set by the builder or `WEFT_PROGRESS_THREAD`, it
    /// polls all the time exactly when the fabric needs the target's CPU to complete
    /// one-sided operations ([`weft_fabric::Caps::target_progress`]), so that puts and gets
    /// stay one-sided, and is [`Progress::OnDemand`] otherwise.
    pub progress: Progress,
    /// Whether `progress` was chosen by the user (else the fabric decides).
    pub progress_chosen: bool,
    /// Spin time of waits before backing off.
    pub spin: Duration,
    /// RMA implementation.
    pub rma: RmaPath,
    /// Start-up timeout.
    pub init_timeout: Duration,
    /// Interval of peer liveness checks during waits.
    pub peer_check: Duration,
    /// A wait that has seen no progress for this long says once which ranks it waits for
    /// (`None`: never).
    pub hang_warn: Option<Duration>,
    /// Team collectives start by agreeing on the call with every member
    /// (`WEFT_COLL_CHECK=strict`, see `team/call.rs`).
    pub coll_strict: bool,
    /// Largest per-member message for which team collectives use latency algorithms.
    pub coll_small_bytes: usize,
    /// Smallest team-collective message read straight from the sender's buffer.
    pub coll_direct_bytes: usize,
    /// Bytes of a team's message slots on each member (one slot per member, see
    /// `team/channel.rs`).
    pub coll_scratch_bytes: usize,
    /// Blocking collectives below `coll_direct_bytes` choose between the slots and the direct
    /// read by timing both (see `team/tune.rs`).
    pub coll_tune: bool,
    /// Largest average piece of a non-contiguous transfer sent packed in AMs (`None`: the
    /// fabric's default).
    pub vis_pack_bytes: Option<usize>,
}

/// The progress thread a world runs (`WEFT_PROGRESS_THREAD`, [`crate::Builder::progress`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// None: only the program's own calls make progress, and a pending weft future asks its
    /// executor to poll it again at once (it spins).
    Off,
    /// A thread that parks while the program's threads poll or wait in weft, and otherwise
    /// (threads computing, only sending, or waiting on futures) sleeps on the rank's doorbell and serves what
    /// arrives: AM handlers and remote functions run, pending futures are woken.
    OnDemand,
    /// A thread that polls all the time, standing aside only while a program thread waits.
    Always,
}

/// Default budget of a rank's shared-memory inbox rings (`WEFT_AM_INBOX_KIB`): full-size
/// rings up to 8 ranks on a node, smaller ones beyond, so a rank's share stays flat.
const DEFAULT_INBOX_KIB: u64 = 4096;
/// Default bytes of a team's message slots on each member (`WEFT_COLL_SCRATCH_KIB`): full
/// 256 KiB slots up to 16 members, smaller ones beyond, so a rank's share stays flat.
const DEFAULT_SCRATCH_KIB: u64 = 4096;
/// Largest ring a budget gives.
const MAX_RING_KIB: usize = 256;

/// Values set on a [`crate::Builder`]; `None` means "environment, then default".
#[derive(Clone, Debug, Default)]
pub(crate) struct Overrides {
    pub ring_kib: Option<usize>,
    pub progress: Option<Progress>,
    pub spin_us: Option<u64>,
    pub rma: Option<RmaPath>,
    pub init_timeout_s: Option<u64>,
    pub coll_small_bytes: Option<usize>,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The value of environment variable `name` (a `WEFT_*` row of the table above) parsed as
/// `T`: `None` where it is unset or empty, [`Error::Config`] saying `expect` where it does not
/// parse. For the layers above the runtime, whose settings live in the same table.
///
/// ```
/// let bytes: Option<usize> = weft_runtime::config::parse("WEFT_AGG_BYTES", "a byte count")?;
/// # Ok::<(), weft_runtime::Error>(())
/// ```
pub fn parse<T: std::str::FromStr>(name: &str, expect: &str) -> Result<Option<T>> {
    match var(name) {
        None => Ok(None),
        Some(v) => {
            v.trim().parse().map(Some).map_err(|_| Error::Config(format!("{name}={v:?}: expected {expect}")))
        }
    }
}

fn parse_bool(name: &str) -> Result<Option<bool>> {
    match var(name).as_deref().map(str::trim) {
        None => Ok(None),
        Some("1" | "true" | "yes" | "on") => Ok(Some(true)),
        Some("0" | "false" | "no" | "off") => Ok(Some(false)),
        Some(v) => {
            Err(Error::Config(format!("{name}={v:?}: expected 0 or 1 (or false/true, no/yes, off/on)")))
        }
    }
}

/// `WEFT_FABRIC=ofi` with its `WEFT_OFI_*` and `WEFT_SAME_HOST` settings.
fn ofi_choice() -> Result<FabricChoice> {
    let same_host_shm = match var("WEFT_SAME_HOST").as_deref().map(str::trim) {
        None | Some("shm") => true,
        Some("ofi") => false,
        Some(v) => return Err(Error::Config(format!("WEFT_SAME_HOST={v:?}: expected shm or ofi"))),
    };
    Ok(FabricChoice::Ofi {
        provider: var("WEFT_OFI_PROVIDER"),
        domain: var("WEFT_OFI_DOMAIN"),
        same_host_shm,
        zcopy_bytes: parse::<usize>("WEFT_OFI_ZCOPY_KIB", "a number of KiB")?
            .map(|k| {
                k.checked_mul(1024).ok_or_else(|| Error::Config(format!("WEFT_OFI_ZCOPY_KIB={k}: too large")))
            })
            .transpose()?,
        mr_local: parse_bool("WEFT_OFI_MR_LOCAL")?.unwrap_or(false),
        silent: (
            Duration::from_millis(
                parse::<u64>("WEFT_OFI_SILENT_MS", "a number of milliseconds")?.unwrap_or(2000),
            ),
            parse::<usize>("WEFT_OFI_SILENT_MAX", "a number of connections")?.unwrap_or(64),
        ),
    })
}

/// True if `ranks` ranks on this node outnumber the cores they share (`cpus`, where known).
fn oversubscribed(ranks: u32, cpus: Option<usize>) -> bool {
    cpus.is_some_and(|c| ranks as usize > c)
}

/// The cores the ranks of this node share: what `weft run` had (`WEFT_NODE_CPUS`: its own
/// affinity mask and CPU quota, which every rank inherits), else the node's online
/// processors. Not this process's own affinity mask: a launcher that binds each rank to a
/// core (`mpirun`, `srun --cpu-bind`) leaves one processor in it, and every rank of two on
/// two bound cores took itself for oversubscribed and stopped spinning (2 ranks under
/// `mpirun`: 8 B broadcast 0.64 against 0.26 µs unbound, while the machine's cache-line round
/// trip was ~390 ns; with `taskset` binding under `weft run`, 340-440 against 125-140 ns).
fn node_cpus() -> Result<Option<usize>> {
    match parse::<usize>("WEFT_NODE_CPUS", "a positive number of cores")? {
        Some(0) => Err(Error::Config("WEFT_NODE_CPUS=0: expected a positive number of cores".into())),
        Some(n) => Ok(Some(n)),
        None => Ok(weft_fabric::os::online_cpus()),
    }
}

fn positive(name: &str, v: u64) -> Result<u64> {
    if v == 0 {
        return Err(Error::Config(format!("{name} must be positive")));
    }
    Ok(v)
}

/// Longest time any `WEFT_*` duration may name (a year): a deadline computed from it stays
/// far inside what the clock can represent.
const MAX_SECONDS: u64 = 365 * 24 * 3600;

/// `v` (a value of variable `name`, in `unit`s, `per_s` of them a second) if it lies in
/// `min..=MAX_SECONDS`; a configuration error naming the variable otherwise.
fn duration_in(name: &str, v: u64, min: u64, unit: &str, per_s: u64) -> Result<u64> {
    let max = MAX_SECONDS * per_s;
    if v < min || v > max {
        return Err(Error::Config(format!("{name}={v}: expected {min} to {max} {unit}")));
    }
    Ok(v)
}

impl Config {
    pub(crate) fn resolve(o: &Overrides, launched: Option<&Identity>) -> Result<Config> {
        let size: Option<u32> = parse("WEFT_SIZE", "a positive number of ranks")?;
        let rank: Option<u32> = parse("WEFT_RANK", "a rank number")?;
        let (rank, size, job) = match (rank, size, var("WEFT_JOB")) {
            (None, None, None) if launched.is_some() => {
                let l = launched.expect("checked");
                (l.rank, l.size, l.job.clone())
            }
            (None, None, None) => (0, 1, weft_fabric::names::new_job_id("solo")?),
            (Some(r), Some(s), Some(j)) => {
                if s == 0 || r >= s {
                    return Err(Error::Config(format!("WEFT_RANK={r} is not below WEFT_SIZE={s}")));
                }
                if !j.chars().all(|c| c.is_ascii_alphanumeric()) || j.len() > 64 {
                    return Err(Error::Config(format!(
                        "WEFT_JOB={j:?}: expected up to 64 letters and digits"
                    )));
                }
                (r, s, j)
            }
            _ => return Err(Error::Config(
                "WEFT_RANK, WEFT_SIZE and WEFT_JOB must be set together (start ranks with `weft run -n N`)"
                    .into(),
            )),
        };
        let ring_kib = match o.ring_kib {
            Some(v) => Some(v as u64),
            None => parse("WEFT_AM_RING_KIB", "a number of KiB")?,
        };
        let inbox_kib = parse("WEFT_AM_INBOX_KIB", "a number of KiB")?.unwrap_or(DEFAULT_INBOX_KIB);
        let rings = match ring_kib {
            Some(kib) => {
                let kib = positive("WEFT_AM_RING_KIB", kib)?;
                if !(16..=64 * 1024).contains(&kib) {
                    return Err(Error::Config(format!("WEFT_AM_RING_KIB={kib}: expected 16 to 65536")));
                }
                weft_fabric::RingSize::Fixed(kib as usize * 1024)
            }
            None => {
                if !(64..=1 << 20).contains(&inbox_kib) {
                    return Err(Error::Config(format!(
                        "WEFT_AM_INBOX_KIB={inbox_kib}: expected 64 to 1048576"
                    )));
                }
                weft_fabric::RingSize::Budget { inbox: inbox_kib as usize * 1024, max: MAX_RING_KIB * 1024 }
            }
        };
        let rma = match (o.rma, var("WEFT_RMA").as_deref()) {
            (Some(r), _) => r,
            (None, None | Some("native")) => RmaPath::Native,
            (None, Some("am")) => RmaPath::ActiveMessages,
            (None, Some(v)) => return Err(Error::Config(format!("WEFT_RMA={v:?}: expected native or am"))),
        };
        let spin_us = match o.spin_us {
            Some(v) => v,
            // More ranks on this node than cores: a spinning waiter holds the core its
            // peer needs, so yield at once (as Open MPI does when oversubscribed). The
            // ranks of this node: all of them under `weft run`, what the launcher says
            // under PMIx (two nodes of two ranks on two cores each are not oversubscribed).
            None => parse("WEFT_SPIN_US", "a number of microseconds")?.unwrap_or(
                if oversubscribed(launched.map_or(size, |l| l.local_size), node_cpus()?) { 0 } else { 20 },
            ),
        };
        let spin_us = duration_in("WEFT_SPIN_US", spin_us, 0, "µs", 1_000_000)?;
        let init_s = match o.init_timeout_s {
            Some(v) => v,
            None => parse("WEFT_INIT_TIMEOUT_S", "a number of seconds")?.unwrap_or(60),
        };
        let init_s = duration_in("WEFT_INIT_TIMEOUT_S", init_s, 1, "s", 1)?;
        let peer_ms = duration_in(
            "WEFT_PEER_CHECK_MS",
            parse("WEFT_PEER_CHECK_MS", "a number of milliseconds")?.unwrap_or(10),
            1,
            "ms",
            1000,
        )?;
        let hang_warn_s = duration_in(
            "WEFT_HANG_WARN_S",
            parse("WEFT_HANG_WARN_S", "a number of seconds")?.unwrap_or(30),
            0,
            "s",
            1,
        )?;
        let multi_node = launched.is_some_and(|l| l.multi_node());
        let fabric =
            match var("WEFT_FABRIC").as_deref().map(str::trim) {
                // Ranks on several nodes need the network.
                None if multi_node => ofi_choice()?,
                Some("shm") if multi_node => return Err(Error::Config(
                    "WEFT_FABRIC=shm, but the launcher placed ranks on several nodes: use WEFT_FABRIC=ofi"
                        .into(),
                )),
                None | Some("shm") => FabricChoice::Shm,
                Some("ofi") => ofi_choice()?,
                Some(v) => return Err(Error::Config(format!("WEFT_FABRIC={v:?}: expected shm or ofi"))),
            };
        let direct_bytes = parse("WEFT_COLL_DIRECT_BYTES", "a number of bytes")?;
        let scratch_kib = parse("WEFT_COLL_SCRATCH_KIB", "a number of KiB")?.unwrap_or(DEFAULT_SCRATCH_KIB);
        if !(16..=1 << 20).contains(&scratch_kib) {
            return Err(Error::Config(format!(
                "WEFT_COLL_SCRATCH_KIB={scratch_kib}: expected 16 to 1048576"
            )));
        }
        let progress = match o.progress {
            Some(p) => Some(p),
            None => match var("WEFT_PROGRESS_THREAD").as_deref().map(str::trim) {
                None => None,
                Some("auto" | "on-demand") => Some(Progress::OnDemand),
                Some("1" | "true" | "yes" | "on" | "always") => Some(Progress::Always),
                Some("0" | "false" | "no" | "off") => Some(Progress::Off),
                Some(v) => {
                    return Err(Error::Config(format!("WEFT_PROGRESS_THREAD={v:?}: expected auto, 1 or 0")))
                }
            },
        };
        Ok(Config {
            rank,
            size,
            job,
            fabric,
            rings,
            progress: progress.unwrap_or(Progress::OnDemand),
            progress_chosen: progress.is_some(),
            spin: Duration::from_micros(spin_us),
            rma,
            init_timeout: Duration::from_secs(init_s),
            peer_check: Duration::from_millis(peer_ms),
            hang_warn: (hang_warn_s > 0).then(|| Duration::from_secs(hang_warn_s)),
            coll_strict: match var("WEFT_COLL_CHECK").as_deref().map(str::trim) {
                None | Some("peer") => false,
                Some("strict") => true,
                Some(v) => {
                    return Err(Error::Config(format!("WEFT_COLL_CHECK={v:?}: expected peer or strict")))
                }
            },
            coll_small_bytes: match o.coll_small_bytes {
                Some(v) => v,
                None => parse("WEFT_COLL_SMALL_BYTES", "a number of bytes")?.unwrap_or(16384),
            },
            vis_pack_bytes: parse("WEFT_VIS_PACK_BYTES", "a number of bytes")?,
            coll_direct_bytes: direct_bytes.unwrap_or(16 << 20),
            coll_scratch_bytes: scratch_kib as usize * 1024,
            // A threshold the user chose is kept as chosen.
            coll_tune: parse_bool("WEFT_COLL_TUNE")?.unwrap_or(direct_bytes.is_none()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::oversubscribed;

    #[test]
    fn oversubscription_counts_this_nodes_ranks_against_its_cores() {
        assert!(!oversubscribed(2, Some(2)));
        assert!(oversubscribed(3, Some(2)));
        assert!(!oversubscribed(64, None), "unknown cores: keep spinning");
    }
}
