//! The libfabric fabric (cargo feature `ofi`): one reliable-datagram endpoint (`FI_EP_RDM`)
//! per rank on the provider `WEFT_OFI_PROVIDER` names (tcp, shm, verbs, efa, cxi, ...).
//!
//! | weft | libfabric |
//! |---|---|
//! | registered region | `mmap` + `fi_mr_reg` (bound to the endpoint under `FI_MR_ENDPOINT`) with a random key (the provider's under `FI_MR_PROV_KEY`); descriptor = (id, len, base, key), base = virtual address under `FI_MR_VIRT_ADDR`, else 0. Staging and receive buffers are registered for local access only |
//! | put / put_from | `fi_writemsg` (`FI_INJECT` up to the inject size, else from a registered staging slot or the registered source), `FI_DELIVERY_COMPLETE` where offered |
//! | get / get_nb | `fi_read` into the destination (or a staging slot under `FI_MR_LOCAL`), waited for; `get_nb` of up to 4 KiB reads into a staging slot of its own, completing by token (copied out at completion), and reads in place and waits when the slots are all out |
//! | atomics | `fi_fetch_atomic` / `fi_compare_atomic` on `FI_UINT64` where every op is valid, else the runtime's AM path |
//! | AM | `fi_inject` / `fi_send` of a header + args + payload ([`wire`]) into pre-posted, recycled receive buffers; long AMs write first and rely on `FI_ORDER_SAW`, or carry the payload (or wait for the write) without it |
//! | completions | one CQ (`FI_CQ_FORMAT_DATA`) for transmits and receives, sized for every outstanding operation so it cannot overrun; sleeping on its wait descriptor (`FI_WAIT_FD`, `fi_trywait`) without holding it |
//! | start-up | endpoint names, host identities and pids through a [`Bootstrap`] all-gather, `fi_av_insert` into an `FI_AV_TABLE` |
//!
//! Every message carries the job key from the start-up exchange; messages with another key
//! (another job, a stray connection) or that do not add up are dropped and counted, never
//! executed. Memory is guarded by the registration keys: 64 random bits on providers with
//! 8-byte keys (tcp, verbs), which a process outside the job would have to guess.

mod am;
mod expose;
mod fabric;
mod guard;
use am::frame;
use rma::fi_op;
mod ffi;
#[cfg(test)]
mod outsider;
mod peers;
mod rma;
mod slab;
mod slots;
pub mod wire;

use crate::boot::Bootstrap;
use crate::os::{self, Mapping};
use crate::read::{Landing, ReadDst, ReadScope};
use crate::{
    AmClass, AmIn, AmInPayload, AmOut, AmPayload, AtomicOp, Caps, EventSink, Exposure, Fabric, FabricError,
    FabricResult, FabricStats, GetIssued, Issued, LocalRegion, PeerState, PollSet, Rank, RemoteRegion,
    Resource, Staged, StagedGet, TxSlot,
};
use ffi::{Access, Context, Objects, EAGAIN};
use slab::Slab;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use weft_ofi_sys as sys;
use wire::{Class, Control, Header, Kind};

pub use ffi::Wanted;

/// Largest medium AM payload.
pub const MAX_MEDIUM: usize = 64 * 1024;
/// Bytes of one staging slot (bulk transfers are split into pieces of this size).
const CHUNK: usize = 128 * 1024;
/// Staging slots for transfers and AM sends.
const CHUNKS: usize = 32;
/// Small slots for atomics' operands and results.
const SMALLS: usize = 1024;
/// Staging of non-blocking gets, of their own (a get's slot stays out until its handle
/// completes, so sharing slots with puts and atomics could starve them): (bytes, slots) of
/// each tier, enough for floods of a few thousand small gets in flight (the bale
/// index-gather pattern). A get that finds none free in its tier, or is larger, reads in
/// place and waits.
const GET_TIERS: [(usize, usize); 3] = [(64, 4096), (512, 1024), (4096, 256)];
const GET_BYTES: usize = {
    let (mut sum, mut i) = (0, 0);
    while i < GET_TIERS.len() {
        sum += GET_TIERS[i].0 * GET_TIERS[i].1;
        i += 1;
    }
    sum
};
/// Bytes of the staging region: chunks, small slots, then the gets' slots.
const STAGE_BYTES: usize = CHUNK * CHUNKS + 64 * SMALLS + GET_BYTES;
/// Receive buffers posted at any time, each holding one whole AM: the first `REQUEST_BUFS`
/// for requests (tag [`TAG_REQUEST`]), the others for replies and control messages.
const RX_BUFS: usize = 64;
const REQUEST_BUFS: u32 = 32;
/// Message tags: requests and replies have separate receive buffers, so that a flood of
/// requests cannot take the buffers replies need.
const TAG_REQUEST: u64 = 1;
const TAG_REPLY: u64 = 2;
/// Requests a rank may have sent to one peer and not yet seen handled (flow control: the
/// receiver returns credits in batches of [`CREDIT_BATCH`] once its handlers ran, so a flood
/// of requests waits at the sender instead of piling up in the receiver's memory).
const REQUEST_CREDITS: u32 = 32;
const CREDIT_BATCH: u32 = REQUEST_CREDITS / 2;
/// While a rank waits on a peer on another host, a probe message goes to it this often: a
/// peer whose process is gone refuses it, which marks it dead (same-host peers are checked
/// through /proc instead).
const PROBE_INTERVAL_NS: u64 = 500_000_000;
/// A peer whose endpoint refuses probes (the provider answers `-FI_EAGAIN`: it cannot
/// reconnect, as when the process or its host is gone) for this long is reported dead.
const PROBE_REFUSED_NS: u64 = 2_000_000_000;
/// A same-host peer whose process is gone is reported dead this long after it was first seen
/// gone: what it sent before it exited (its finalize notice, its last barrier message) may
/// still be inside the provider (a socket's buffer, the provider's thread) and is delivered
/// meanwhile.
const GONE_GRACE_NS: u64 = 500_000_000;
/// Errors of a post that say the peer cannot be reached (no route, connection refused or
/// gone), unlike errors of the operation itself.
const UNREACHABLE: [u32; 7] = [
    sys::FI_ENOENT,
    sys::FI_ECONNREFUSED,
    sys::FI_ECONNRESET,
    sys::FI_ECONNABORTED,
    sys::FI_ENOTCONN,
    sys::FI_EHOSTUNREACH,
    sys::FI_ENETUNREACH,
];
/// How long finalize waits for what this rank sent to complete.
const FINAL_FLUSH_NS: u64 = 2_000_000_000;
/// When something was first seen, kept in `cell` (`os::now_ns`; 0: not yet): stores `now`
/// if the cell holds nothing, and returns what it holds.
fn first_seen(cell: &AtomicU64, now: u64) -> u64 {
    let now = now.max(1);
    match cell.compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => now,
        Err(t) => t,
    }
}

/// Says on standard error that a wait for operations on the caller's memory goes on past
/// `e` (a failed or silent peer): the memory is not handed back before the provider is done.
fn say_stuck(rank: Rank, e: &FabricError) {
    eprintln!("weft: rank {rank}: {e}; the operation's memory stays in use until the provider completes it");
}

/// Dropped messages reported on standard error (the rest are only counted).
const REPORTED_REJECTS: u64 = 16;
const RX_BYTES: usize = (wire::HEADER + 8 * crate::AM_MAX_ARGS + MAX_MEDIUM + 4095) & !4095;

/// Start-up parameters.
#[derive(Clone, Debug, Default)]
pub struct OfiConfig {
    /// Provider and domain to use.
    pub wanted: Wanted,
    /// How long operations wait on an unresponsive peer before reporting it.
    pub op_timeout: Duration,
    /// Memory the caller owns is registered for a transfer from this many bytes up, and
    /// copied into registered buffers below (`WEFT_OFI_ZCOPY_KIB`; `None`: [`ZCOPY_BYTES`]).
    pub zcopy_bytes: Option<usize>,
    /// Silent connections to the rank's TCP port go after this long (zero: never), and beyond
    /// this many at once (see [`guard`]).
    pub silent: (Duration, usize),
}

/// Default of [`OfiConfig::zcopy_bytes`].
pub const ZCOPY_BYTES: usize = 16 << 10;

/// What an outstanding operation's completion means.
enum Target {
    /// Report `on_complete(token)`.
    Token(u64),
    /// Counted for `quiet`.
    Untracked,
    /// A thread inside the fabric waits for `remaining == 0`.
    Waiter,
}

/// Completion state shared by the pieces of one operation.
struct Tracker {
    remaining: AtomicUsize,
    value: AtomicU64,
    err: Mutex<Option<FabricError>>,
    target: Target,
}

impl Tracker {
    fn new(target: Target) -> Arc<Self> {
        // One guard count, released when the issuer has posted every piece.
        Arc::new(Tracker {
            remaining: AtomicUsize::new(1),
            value: AtomicU64::new(0),
            err: Mutex::new(None),
            target,
        })
    }
    fn fail(&self, e: FabricError) {
        self.err.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
    }
    fn take_err(&self) -> Option<FabricError> {
        self.err.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// An operation in flight; boxed into a libfabric context.
enum Op {
    Recv {
        slot: u32,
    },
    Send {
        slot: Option<u32>,
        dst: Rank,
    },
    /// A control message in a small slot: a liveness probe, or the finalize notice.
    Control {
        slot: u32,
        dst: Rank,
        probe: bool,
    },
    Write {
        slot: Option<u32>,
        dst: Rank,
        track: Arc<Tracker>,
    },
    Read {
        dst: Rank,
        track: Arc<Tracker>,
    },
    /// A non-blocking get into a staging slot (see [`StageSlot`]), copied at the completion
    /// to where `land` says if it says.
    ReadStaged {
        dst: Rank,
        track: Arc<Tracker>,
        stage: Arc<StageSlot>,
        land: Option<Landing>,
    },
    /// A piece of a get read in place into a destination that outlives it
    /// ([`Fabric::get_into`]), with the registration it uses under `FI_MR_LOCAL`.
    ReadInto {
        dst: Rank,
        track: Arc<Tracker>,
        hold: (Landing, Option<Arc<expose::OpReg>>),
    },
    Atomic {
        slot: u32,
        dst: Rank,
        track: Arc<Tracker>,
    },
}

/// The staging slot of a non-blocking get: it returns to its slab when both the operation's
/// context (dropped at the completion) and the runtime's [`StagedGet`] let go of it.
struct StageSlot {
    /// The staging memory stays mapped while a slot of it is out (a handle may outlive the
    /// fabric).
    _map: Arc<Mapping>,
    slab: Arc<Slab>,
    slot: u32,
    len: usize,
    /// Set at the completion: the provider has finished writing the slot.
    done: AtomicBool,
    counters: Arc<expose::Counters>,
}

impl Staged for StageSlot {
    fn copy_to(&self, dst: &mut [u8]) -> bool {
        if !self.done.load(Ordering::Acquire) {
            return false;
        }
        let n = dst.len().min(self.len);
        // SAFETY: the slot holds `len` bytes inside the mapping `_map` keeps alive; the read
        // into it completed (`done`), so nothing writes it; `dst` is a live exclusive slice.
        unsafe { crate::copy::copy_bytes(self.slab.addr(self.slot) as *const u8, dst.as_mut_ptr(), n) };
        self.counters.staged(n);
        true
    }
}

impl StageSlot {
    /// Copies the completed read to `land`.
    fn copy_to_landing(&self, land: &Landing) {
        let n = land.len.min(self.len);
        // SAFETY: the slot holds `len` bytes inside the mapping `_map` keeps alive and its
        // read completed; `land` is valid and written by nobody else while it is held.
        unsafe { crate::copy::copy_bytes(self.slab.addr(self.slot) as *const u8, land.addr as *mut u8, n) };
        self.counters.staged(n);
    }
}

impl Drop for StageSlot {
    fn drop(&mut self) {
        self.slab.give(self.slot);
    }
}

/// What an incoming AM carries, copied out of its receive buffer.
enum Body {
    Short,
    Medium(Vec<u8>),
    Long { region: u32, offset: u64, len: u64 },
}

struct AmEvent {
    src: Rank,
    handler: u16,
    class: AmClass,
    args: [u64; crate::AM_MAX_ARGS],
    nargs: usize,
    body: Body,
}

enum Event {
    /// An AM, copied out of its receive buffer.
    Am(Box<AmEvent>),
    Done {
        token: u64,
        value: u64,
        result: FabricResult<()>,
    },
}

#[derive(Default)]
struct Queues {
    /// Replies and completions (what `PollSet::RepliesOnly` delivers).
    replies: VecDeque<Event>,
    requests: VecDeque<Event>,
}

/// A registered region of this rank.
struct Reg {
    map: Arc<Mapping>,
    mr: ffi::Mr,
}

/// The libfabric fabric (see the module documentation).
pub struct OfiFabric {
    rank: Rank,
    size: u32,
    key: u64,
    addrs: Vec<u64>,
    /// Process id of every rank.
    pids: Vec<u32>,
    /// Whether each rank runs on this rank's host (boot id + network namespace).
    same_host: Vec<bool>,
    /// Whether some host runs more than one rank.
    hosts_shared: bool,
    atomics: bool,
    regions: RwLock<Vec<Option<Reg>>>,
    stage: Reg,
    chunks: Slab,
    smalls: Slab,
    /// Non-blocking gets' staging, a slab per [`GET_TIERS`] entry.
    get_slots: [Arc<Slab>; GET_TIERS.len()],
    rx: Reg,
    rx_slots: Slab,
    cq_lock: Mutex<()>,
    events: Mutex<Queues>,
    untracked: AtomicUsize,
    untracked_err: Mutex<Option<FabricError>>,
    inflight: AtomicUsize,
    finalized: Vec<AtomicBool>,
    /// Per peer: it finalized or was marked failed (shared with the endpoint slots, whose
    /// retry loops end on it; read without the `failed` lock).
    left: Arc<Vec<AtomicBool>>,
    /// Requests this rank may still send to each peer (shared with the endpoint slots).
    credits: Arc<Vec<AtomicU32>>,
    /// Requests sent and handled, for remote completion.
    counts: crate::counts::RequestCounts,
    /// Every rank's main endpoint name, for the address vectors of endpoint contexts.
    names: Vec<Vec<u8>>,
    /// Endpoint contexts (see `slots.rs`) by id, and the next id.
    contexts: Mutex<Vec<(u32, Arc<slots::SlotContext>)>>,
    /// Closed contexts kept for reuse.
    spares: slots::Spares,
    next_context: AtomicU32,
    /// Requests of each peer handled here and not yet credited back.
    owed: Vec<AtomicU32>,
    /// A credit return could not be sent; `progress` retries.
    owed_retry: AtomicBool,
    /// When the last liveness probe went to each peer (`os::now_ns`), and whether it is in
    /// flight.
    probed_at: Vec<AtomicU64>,
    probing: Vec<AtomicBool>,
    /// Since when probes to each peer have been refused (0: the last one was accepted).
    refused_since: Vec<AtomicU64>,
    /// When each same-host peer's process was first seen gone (`os::now_ns`; 0: never).
    gone_since: Vec<AtomicU64>,
    failed: Mutex<Vec<Option<String>>>,
    rejected: AtomicU64,
    /// Receive buffers whose re-post the provider refused for now (`-FI_EAGAIN`): posted again
    /// at the next poll, never dropped.
    unposted: Mutex<Vec<u32>>,
    delivering: AtomicUsize,
    done: AtomicBool,
    /// Ranks on this host are reached through another fabric (see `leave_same_host_peers`).
    same_host_elsewhere: bool,
    op_timeout: Duration,
    zcopy_bytes: usize,
    /// Registrations of caller memory (closed before the domain: declared before `obj`).
    exposed: expose::Exposed,
    counters: Arc<expose::Counters>,
    /// The guard of the listening port against silent connections, where there is one.
    guard: Option<guard::Guard>,
    // Dropped last: every registration above must close before the domain.
    obj: Objects,
}

fn register_map(obj: &Objects, len: usize) -> FabricResult<Reg> {
    let map = Arc::new(os::map_anonymous(len.max(1).next_multiple_of(4096))?);
    let mr = obj.register(map.as_ptr() as usize, map.len(), Access::Local)?;
    Ok(Reg { map, mr })
}

impl OfiFabric {
    /// Opens the provider's objects and meets the other ranks through `boot`.
    pub fn init(cfg: OfiConfig, boot: &dyn Bootstrap) -> FabricResult<Self> {
        let (rank, size) = (boot.rank(), boot.size());
        let obj = Objects::open(&cfg.wanted)?;
        let atomics = obj.neg.atomics() && obj.atomics_valid();
        let stage = register_map(&obj, STAGE_BYTES)?;
        let base = stage.map.as_ptr() as usize;
        let rx = register_map(&obj, RX_BYTES * RX_BUFS)?;
        // Start-up exchange: key (rank 0's wins), pid, endpoint name, host identity.
        let name = obj.name()?;
        let mut mine = (os::random_u64()? | 1).to_le_bytes().to_vec();
        mine.extend_from_slice(&os::pid().to_le_bytes());
        mine.extend_from_slice(&(name.len() as u16).to_le_bytes());
        mine.extend_from_slice(&name);
        mine.extend_from_slice(os::host_identity().as_bytes());
        let all = boot.allgather(&mine)?;
        let mut names = Vec::with_capacity(all.len());
        let mut hosts = Vec::with_capacity(all.len());
        let mut pids = Vec::with_capacity(all.len());
        for (r, c) in all.iter().enumerate() {
            let bad = || FabricError::Malformed {
                what: format!("start-up record of rank {r} ({} bytes)", c.len()),
            };
            let n =
                u16::from_le_bytes(c.get(12..14).ok_or_else(bad)?.try_into().map_err(|_| bad())?) as usize;
            let name = c.get(14..14 + n).ok_or_else(bad)?;
            let pid = u32::from_le_bytes(c[8..12].try_into().map_err(|_| bad())?);
            names.push(name.to_vec());
            pids.push(pid);
            hosts.push(&c[14 + n..]);
        }
        let same_host: Vec<bool> = hosts.iter().map(|h| *h == hosts[rank as usize]).collect();
        let hosts_shared = {
            let mut sorted = hosts.clone();
            sorted.sort_unstable();
            sorted.windows(2).any(|w| w[0] == w[1])
        };
        let key = u64::from_le_bytes(all[0][..8].try_into().unwrap_or_default());
        let addrs = obj.insert(&names)?;
        let guard = match (guard::port_of(&name), cfg.silent) {
            (Some(port), (wait, max)) if !wait.is_zero() => {
                Some(guard::Guard::start(rank, port, wait, max).map_err(|e| FabricError::Os {
                    what: format!("starting the port guard: {e}"),
                    errno: 0,
                })?)
            }
            _ => None,
        };
        let fab = OfiFabric {
            rank,
            size,
            key,
            addrs,
            pids,
            same_host,
            hosts_shared,
            atomics,
            regions: RwLock::new(Vec::new()),
            chunks: Slab::new(base, CHUNK, CHUNKS),
            smalls: Slab::new(base + CHUNK * CHUNKS, 64, SMALLS),
            get_slots: {
                let mut at = base + CHUNK * CHUNKS + 64 * SMALLS;
                GET_TIERS.map(|(bytes, count)| {
                    let slab = Arc::new(Slab::new(at, bytes, count));
                    at += bytes * count;
                    slab
                })
            },
            stage,
            rx_slots: Slab::new(rx.map.as_ptr() as usize, RX_BYTES, RX_BUFS),
            rx,
            cq_lock: Mutex::new(()),
            events: Mutex::new(Queues::default()),
            untracked: AtomicUsize::new(0),
            untracked_err: Mutex::new(None),
            inflight: AtomicUsize::new(0),
            finalized: (0..size).map(|_| AtomicBool::new(false)).collect(),
            left: Arc::new((0..size).map(|_| AtomicBool::new(false)).collect()),
            credits: Arc::new((0..size).map(|_| AtomicU32::new(REQUEST_CREDITS)).collect()),
            counts: crate::counts::RequestCounts::new(size),
            names,
            contexts: Mutex::new(Vec::new()),
            spares: slots::Spares::default(),
            next_context: AtomicU32::new(1),
            owed: (0..size).map(|_| AtomicU32::new(0)).collect(),
            owed_retry: AtomicBool::new(false),
            probed_at: (0..size).map(|_| AtomicU64::new(0)).collect(),
            probing: (0..size).map(|_| AtomicBool::new(false)).collect(),
            refused_since: (0..size).map(|_| AtomicU64::new(0)).collect(),
            gone_since: (0..size).map(|_| AtomicU64::new(0)).collect(),
            failed: Mutex::new(vec![None; size as usize]),
            rejected: AtomicU64::new(0),
            unposted: Mutex::new(Vec::new()),
            delivering: AtomicUsize::new(0),
            done: AtomicBool::new(false),
            same_host_elsewhere: false,
            op_timeout: if cfg.op_timeout.is_zero() { Duration::from_secs(60) } else { cfg.op_timeout },
            zcopy_bytes: cfg.zcopy_bytes.unwrap_or(ZCOPY_BYTES),
            exposed: expose::Exposed::default(),
            counters: Arc::default(),
            guard,
            obj,
        };
        while let Some(slot) = fab.rx_slots.take() {
            fab.post_recv(slot)?;
        }
        // Nobody sends before everyone has posted its receives.
        boot.allgather(&[])?;
        Ok(fab)
    }

    /// The provider chosen, for `weft info` and benchmark labels.
    pub fn provider(&self) -> &str {
        &self.obj.neg.provider
    }

    /// Registers memory mapped elsewhere (by another fabric) as region `id`, of which `len`
    /// bytes are reachable: how the hybrid fabric makes one segment reachable both through
    /// shared memory and through the network. `id` must not be registered already.
    pub fn register_mapping(&self, id: u32, map: Arc<Mapping>, len: usize) -> FabricResult<LocalRegion> {
        self.register_at(Some(id), map, len)
    }

    /// Registers `map` as region `id`, or as the next unused id.
    fn register_at(&self, id: Option<u32>, map: Arc<Mapping>, len: usize) -> FabricResult<LocalRegion> {
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        let id = id.unwrap_or(regions.len() as u32);
        if regions.get(id as usize).is_some_and(Option::is_some) || len > map.len() {
            return Err(FabricError::Mismatch {
                what: format!("region {id} of {len} bytes registered twice or too long"),
            });
        }
        let mr = self.obj.register(map.as_ptr() as usize, map.len(), Access::Remote)?;
        let base = if self.obj.neg.virt_addr() { map.as_ptr() as u64 } else { 0 };
        let mut desc = id.to_le_bytes().to_vec();
        desc.extend_from_slice(&(len as u64).to_le_bytes());
        desc.extend_from_slice(&base.to_le_bytes());
        desc.extend_from_slice(&mr.key().to_le_bytes());
        if regions.len() <= id as usize {
            regions.resize_with(id as usize + 1, || None);
        }
        regions[id as usize] = Some(Reg { map: map.clone(), mr });
        Ok(LocalRegion::new(id, map, desc).with_discard(self.pins_nothing()))
    }

    /// True where the provider reaches registered memory through the process's page tables
    /// (software providers), so that pages given back and later refaulted stay reachable; a
    /// NIC that pinned the old pages would keep writing to them.
    fn pins_nothing(&self) -> bool {
        const SOFTWARE: [&str; 6] = ["tcp", "sockets", "shm", "udp", "ofi_rxm", "ofi_rxd"];
        self.obj.neg.provider.split(';').all(|p| SOFTWARE.contains(&p))
    }

    /// The ranks on this rank's host (itself included), in rank order: processes that could
    /// share memory instead of going through the network.
    pub fn same_host_ranks(&self) -> Vec<Rank> {
        (0..self.size).filter(|&r| self.same_host[r as usize]).collect()
    }

    /// True when some host of the job runs more than one rank (the same answer on every
    /// rank): whether shared memory could carry part of the traffic.
    pub fn hosts_shared(&self) -> bool {
        self.hosts_shared
    }

    /// From now on this fabric carries no traffic to ranks on this host (another fabric does):
    /// it sends them nothing when it finalizes.
    pub fn leave_same_host_peers(&mut self) {
        self.same_host_elsewhere = true;
    }

    /// Sleeps until the completion queue may hold something or `timeout` passes: `Some(true)`
    /// when something may be ready, `None` when the provider offers no wait descriptor.
    pub fn wait_ready(&self, timeout: Duration) -> Option<bool> {
        self.obj.wait(timeout.as_millis().clamp(1, i32::MAX as u128) as i32)
    }

    fn post_recv(&self, slot: u32) -> FabricResult<()> {
        let ctx = Context::into_raw(Op::Recv { slot });
        let tag = if slot < REQUEST_BUFS { TAG_REQUEST } else { TAG_REPLY };
        let ret = self.obj.ep().post_recv(self.rx_slots.addr(slot), RX_BYTES, self.rx.mr.desc(), tag, ctx);
        if ret < 0 {
            // SAFETY: the context was not accepted, so it is ours to take back.
            drop(unsafe { Context::<Op>::from_raw(ctx) });
            if ret == EAGAIN {
                // The receive queue is full for now: keep the buffer for the next poll.
                self.unposted.lock().unwrap_or_else(|e| e.into_inner()).push(slot);
                return Ok(());
            }
            return ffi::check(ret as i64, "fi_recv");
        }
        Ok(())
    }

    /// Posts again the receive buffers the provider refused earlier.
    fn repost(&self) -> FabricResult<()> {
        let slots = std::mem::take(&mut *self.unposted.lock().unwrap_or_else(|e| e.into_inner()));
        slots.into_iter().try_for_each(|s| self.post_recv(s))
    }

    /// Makes progress (checking that `dst` lives) until `ready` gives a value, giving up
    /// after the operation timeout with `stalled` as the reason.
    fn progress_until<T>(
        &self,
        dst: Rank,
        stalled: impl Fn() -> String,
        mut ready: impl FnMut() -> FabricResult<Option<T>>,
    ) -> FabricResult<T> {
        let start = Instant::now();
        loop {
            if let Some(v) = ready()? {
                return Ok(v);
            }
            if self.poll_cq()? == 0 {
                self.check_peer(dst)?;
                if start.elapsed() > self.op_timeout {
                    return Err(FabricError::Timeout { what: stalled() });
                }
                std::thread::yield_now();
            }
        }
    }

    /// Posts with `post` until the provider accepts (`-FI_EAGAIN` means its queue is full:
    /// make progress and retry), giving up after the operation timeout.
    fn post_retry(&self, dst: Rank, what: &str, mut post: impl FnMut() -> isize) -> FabricResult<()> {
        let stalled = || {
            let why = self.guard.as_ref().map(guard::Guard::explain).unwrap_or_default();
            format!("{what} to rank {dst}: provider queue stayed full, or no file descriptor was free{why}")
        };
        self.progress_until(dst, stalled, || match post() {
            // No descriptor for a connection (those of silent outsiders go, see `guard`).
            ret if ffi::transient(ret) => Ok(None),
            ret => self.posted(dst, ret, what).map(Some),
        })
    }

    /// What a post toward `dst` that returned `ret` (not `-FI_EAGAIN`) means: done, a failed
    /// peer (the provider has no connection to it and cannot make one, as sockets says once
    /// the peer's endpoint closed: it is marked failed), or an error of the operation.
    fn posted(&self, dst: Rank, ret: isize, what: &str) -> FabricResult<()> {
        if ret < 0 && UNREACHABLE.contains(&(-ret as u32)) {
            let why = format!("unreachable: {what}: {}", ffi::strerror(ret as i64));
            self.mark_failed(dst, why.clone());
            return Err(FabricError::Peer { rank: dst, reason: why });
        }
        ffi::check(ret as i64, what)
    }

    /// Posts an operation with a boxed context; the context is taken back if refused.
    fn post_op(
        &self,
        dst: Rank,
        what: &str,
        op: Op,
        post: impl Fn(*mut c_void) -> isize,
    ) -> FabricResult<()> {
        self.wait_for_room(dst)?;
        let ctx = Context::into_raw(op);
        self.inflight.fetch_add(1, Ordering::AcqRel);
        let r = self.post_retry(dst, what, || post(ctx));
        if r.is_err() {
            self.inflight.fetch_sub(1, Ordering::AcqRel);
            // SAFETY: libfabric refused the operation, so the context is ours again.
            drop(unsafe { Context::<Op>::from_raw(ctx) });
        }
        r
    }

    /// True while the operations in flight fill the transmit queue: one more could make the
    /// completion queue overrun (sized for tx_size transmits plus the posted receives).
    fn tx_full(&self) -> bool {
        self.inflight.load(Ordering::Acquire) >= self.obj.neg.tx_size
    }

    /// Makes progress until one more operation fits in the transmit queue.
    fn wait_for_room(&self, dst: Rank) -> FabricResult<()> {
        let stalled = || format!("transmit queue stayed full (toward rank {dst})");
        self.progress_until(dst, stalled, || Ok((!self.tx_full()).then_some(())))
    }

    /// An error if rank `r` can take nothing more from this rank: it died, or it finalized
    /// (its endpoint is closed, so the provider would retry a connection to it until the
    /// operation timeout; a wake-up sent just after a peer's last put had been read, to a
    /// peer that then left, held the sender for 60 s per peer).
    fn check_peer(&self, r: Rank) -> FabricResult<()> {
        match self.peer_state(r) {
            PeerState::Dead(why) => Err(FabricError::Peer { rank: r, reason: why }),
            PeerState::Finalized => {
                Err(FabricError::Peer { rank: r, reason: "has left the job (finalized)".into() })
            }
            PeerState::Running => Ok(()),
        }
    }

    /// True unless rank `r` is known to have left or failed (no probe, no system call).
    fn known_running(&self, r: Rank) -> bool {
        !self.left[r as usize].load(Ordering::Acquire)
    }

    /// A staging chunk, making progress while none is free.
    fn take_chunk(&self, dst: Rank) -> FabricResult<u32> {
        self.take_slot(&self.chunks, dst)
    }

    fn take_slot(&self, slab: &Slab, dst: Rank) -> FabricResult<u32> {
        let stalled = || format!("staging buffers toward rank {dst} never came back");
        self.progress_until(dst, stalled, || Ok(slab.take()))
    }

    /// Reads completions: finishes operations and copies arriving AMs into the queues.
    /// Returns how many completions were read. One thread reads at a time; the others return.
    fn poll_cq(&self) -> FabricResult<usize> {
        let Ok(_g) = self.cq_lock.try_lock() else { return Ok(0) };
        self.poll_locked(|o, out| o.cq_read(out))
    }

    fn poll_locked(
        &self,
        read: impl FnOnce(&ffi::Ep, &mut [sys::fi_cq_data_entry]) -> Result<usize, sys::fi_cq_err_entry>,
    ) -> FabricResult<usize> {
        self.repost()?;
        let mut entries = [sys::fi_cq_data_entry::default(); 16];
        match read(&self.obj.ep(), &mut entries) {
            Ok(n) => {
                // Every entry read is finished, even after one fails: an entry skipped here
                // would be a message or completion lost for good.
                let mut failed = None;
                for e in &entries[..n] {
                    if e.op_context.is_null() {
                        // Not one of ours (every post carries a context): counted, skipped.
                        self.reject(|| "a completion without a context".into());
                        continue;
                    }
                    // SAFETY: every context we post comes from Context::<Op>::into_raw and
                    // completes exactly once.
                    let op = unsafe { Context::<Op>::from_raw(e.op_context) };
                    if let Err(err) = self.finish(op.op, e.len, Ok(())) {
                        failed.get_or_insert(err);
                    }
                }
                failed.map_or(Ok(n), Err)
            }
            Err(e) => {
                let why = format!("{} (provider error {})", ffi::strerror(e.err as i64), e.prov_errno);
                if e.op_context.is_null() {
                    // An error no operation of ours can own (e.g. of an injected send).
                    self.reject(|| format!("an error completion without a context: {why}"));
                    return Ok(1);
                }
                // SAFETY: as above; an error entry names one of our contexts.
                let op = unsafe { Context::<Op>::from_raw(e.op_context) };
                self.finish(op.op, e.len, Err(why))?;
                Ok(1)
            }
        }
    }

    fn finish(&self, op: Op, len: usize, res: Result<(), String>) -> FabricResult<()> {
        match op {
            Op::Recv { slot } => {
                if let Err(why) = &res {
                    self.reject(|| format!("a receive failed: {why}"));
                } else {
                    self.receive(slot, len);
                }
                return self.post_recv(slot);
            }
            Op::Send { slot, dst } => {
                if let Some(s) = slot {
                    self.chunks.give(s);
                }
                if let Err(why) = res {
                    self.mark_failed(dst, format!("a message to it failed: {why}"));
                }
            }
            Op::Control { slot, dst, probe } => {
                self.smalls.give(slot);
                if probe {
                    self.probing[dst as usize].store(false, Ordering::Release);
                }
                if let Err(why) = res {
                    self.mark_failed(dst, format!("unreachable: {why}"));
                }
            }
            Op::Write { slot, dst, track } => {
                if let Some(s) = slot {
                    self.chunks.give(s);
                }
                self.piece_done(dst, &track, res, 0);
            }
            Op::Read { dst, track } => self.piece_done(dst, &track, res, 0),
            Op::ReadStaged { dst, track, stage, land } => {
                stage.done.store(true, Ordering::Release);
                if let (Some(l), true) = (land, res.is_ok()) {
                    stage.copy_to_landing(&l);
                }
                self.piece_done(dst, &track, res, 0);
            }
            Op::ReadInto { dst, track, hold } => {
                // The destination goes before the completion is reported: whoever waits for
                // it may then take it back.
                drop(hold);
                self.piece_done(dst, &track, res, 0);
            }
            Op::Atomic { slot, dst, track } => {
                // SAFETY: the result word lies in the small slot this operation owned; the
                // provider finished writing it before reporting the completion.
                let v = unsafe { std::ptr::read_volatile((self.smalls.addr(slot) + 16) as *const u64) };
                self.smalls.give(slot);
                self.piece_done(dst, &track, res, v);
            }
        }
        self.inflight.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }

    /// Counts a message or completion that is dropped (foreign, malformed or failed) and
    /// says why on standard error for the first [`REPORTED_REJECTS`] of them: in a job of
    /// well-behaved ranks none is ever dropped, so each is worth a line.
    fn reject(&self, why: impl FnOnce() -> String) {
        if self.rejected.fetch_add(1, Ordering::Relaxed) < REPORTED_REJECTS {
            eprintln!("weft: rank {} (libfabric) dropped {}", self.rank, why());
        }
    }

    fn mark_failed(&self, r: Rank, why: String) {
        if let Some(slot) = self.failed.lock().unwrap_or_else(|e| e.into_inner()).get_mut(r as usize) {
            slot.get_or_insert(why);
            self.left[r as usize].store(true, Ordering::Release);
        }
    }

    fn piece_done(&self, dst: Rank, t: &Tracker, res: Result<(), String>, value: u64) {
        if let Err(why) = res {
            // Providers close the connection over an access they refuse (a wrong key or
            // range: tcp does): the peer is unusable from here on, and waits on it must end.
            self.mark_failed(dst, format!("an RMA operation with it failed: {why}"));
            t.fail(FabricError::Peer { rank: dst, reason: format!("RMA failed: {why}") });
        }
        t.value.store(value, Ordering::Relaxed);
        if t.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.complete(t);
        }
    }

    /// The last piece of an operation (or its issuer's guard) is done.
    fn complete(&self, t: &Tracker) {
        match t.target {
            Target::Token(token) => {
                let result = t.take_err().map_or(Ok(()), Err);
                let value = t.value.load(Ordering::Relaxed);
                self.events.lock().unwrap_or_else(|e| e.into_inner()).replies.push_back(Event::Done {
                    token,
                    value,
                    result,
                });
            }
            Target::Untracked => {
                if let Some(e) = t.take_err() {
                    self.untracked_err.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                }
                self.untracked.fetch_sub(1, Ordering::AcqRel);
            }
            Target::Waiter => {}
        }
    }

    /// Releases the issuer's guard count of `t`.
    fn release_guard(&self, t: &Arc<Tracker>) {
        if t.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.complete(t);
        }
    }
}

impl OfiFabric {
    /// After `finalize`: lets what this rank sent leave (at most `linger`), then closes its
    /// endpoint and the endpoint contexts kept for reuse (what the provider holds outside the
    /// process: the shm provider's region, tcp's listening port). Idempotent.
    fn close_network(&self, linger: Duration) {
        let start = Instant::now();
        while self.inflight.load(Ordering::Acquire) != 0 && start.elapsed() < linger {
            if self.poll_cq().unwrap_or(0) == 0 {
                std::thread::yield_now();
            }
        }
        // The endpoint goes first: a provider may still copy arriving data into posted
        // receive buffers or regions while closing it, so they must outlive it.
        self.obj.close_endpoint();
        self.spares.clear();
    }
}

impl Drop for OfiFabric {
    fn drop(&mut self) {
        self.finalize();
        self.close_network(Duration::from_secs(2));
        self.regions.write().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
