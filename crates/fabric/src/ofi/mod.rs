//! The libfabric fabric (cargo feature `ofi`): one reliable-datagram endpoint (`FI_EP_RDM`)
//! per rank on the provider `WEFT_OFI_PROVIDER` names (tcp, shm, verbs, efa, cxi, ...).
//!
//! | weft | libfabric |
//! |---|---|
//! | registered region | `mmap` + `fi_mr_reg` (bound to the endpoint under `FI_MR_ENDPOINT`); descriptor = (id, len, base, key), base = virtual address under `FI_MR_VIRT_ADDR`, else 0 |
//! | put / put_from | `fi_writemsg` (`FI_INJECT` up to the inject size, else from a registered staging slot or the registered source), `FI_DELIVERY_COMPLETE` where offered |
//! | get | `fi_read` into the destination (or a staging slot under `FI_MR_LOCAL`), waited for |
//! | atomics | `fi_fetch_atomic` / `fi_compare_atomic` on `FI_UINT64` where every op is valid, else the runtime's AM path |
//! | AM | `fi_inject` / `fi_send` of a header + args + payload ([`wire`]) into pre-posted, recycled receive buffers; long AMs write first and rely on `FI_ORDER_SAW`, or carry the payload (or wait for the write) without it |
//! | completions | one CQ (`FI_CQ_FORMAT_DATA`) for transmits and receives, sized for every outstanding operation so it cannot overrun; sleeping on its wait descriptor (`FI_WAIT_FD`, `fi_trywait`) without holding it |
//! | start-up | endpoint names, host identities and pids through a [`Bootstrap`] all-gather, `fi_av_insert` into an `FI_AV_TABLE` |
//!
//! Every message carries the job key from the start-up exchange; messages with another key
//! (another job, a stray connection) or that do not add up are dropped and counted, never
//! executed.

mod ffi;
mod slab;
mod slots;
pub mod wire;

use crate::boot::Bootstrap;
use crate::os::{self, Mapping};
use crate::{
    AmClass, AmIn, AmInPayload, AmOut, AmPayload, AtomicOp, Caps, EventSink, Fabric, FabricError,
    FabricResult, Issued, LocalRegion, PeerState, PollSet, Rank, RemoteRegion, Resource, TxSlot,
};
use ffi::{Context, Objects, EAGAIN};
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
}

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
    /// A liveness probe in a small slot.
    Probe {
        slot: u32,
        dst: Rank,
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
    Atomic {
        slot: u32,
        dst: Rank,
        track: Arc<Tracker>,
    },
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
    // Dropped last: every registration above must close before the domain.
    obj: Objects,
}

fn random_key() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok() {
        return u64::from_le_bytes(b) | 1;
    }
    (os::now_ns() ^ ((os::pid() as u64) << 32)) | 1
}

fn register_map(obj: &Objects, len: usize, key: u64) -> FabricResult<Reg> {
    let map = Arc::new(os::map_anonymous(len.max(1).next_multiple_of(4096))?);
    let mr = obj.register(map.as_ptr() as usize, map.len(), key)?;
    Ok(Reg { map, mr })
}

/// Requested keys of regions (when the provider does not pick them): staging and receive
/// buffers use 1 and 2, region `id` uses `id + 16`.
fn region_key(id: u32) -> u64 {
    id as u64 + 16
}

impl OfiFabric {
    /// Opens the provider's objects and meets the other ranks through `boot`.
    pub fn init(cfg: OfiConfig, boot: &dyn Bootstrap) -> FabricResult<Self> {
        let (rank, size) = (boot.rank(), boot.size());
        let obj = Objects::open(&cfg.wanted)?;
        let atomics = obj.neg.atomics() && obj.atomics_valid();
        let stage = register_map(&obj, CHUNK * CHUNKS + 64 * SMALLS, 1)?;
        let base = stage.map.as_ptr() as usize;
        let rx = register_map(&obj, RX_BYTES * RX_BUFS, 2)?;
        // Start-up exchange: key (rank 0's wins), pid, endpoint name, host identity.
        let name = obj.name()?;
        let mut mine = random_key().to_le_bytes().to_vec();
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
            names,
            contexts: Mutex::new(Vec::new()),
            spares: slots::Spares::default(),
            next_context: AtomicU32::new(1),
            owed: (0..size).map(|_| AtomicU32::new(0)).collect(),
            owed_retry: AtomicBool::new(false),
            probed_at: (0..size).map(|_| AtomicU64::new(0)).collect(),
            probing: (0..size).map(|_| AtomicBool::new(false)).collect(),
            refused_since: (0..size).map(|_| AtomicU64::new(0)).collect(),
            failed: Mutex::new(vec![None; size as usize]),
            rejected: AtomicU64::new(0),
            unposted: Mutex::new(Vec::new()),
            delivering: AtomicUsize::new(0),
            done: AtomicBool::new(false),
            same_host_elsewhere: false,
            op_timeout: if cfg.op_timeout.is_zero() { Duration::from_secs(60) } else { cfg.op_timeout },
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
        let mr = self.obj.register(map.as_ptr() as usize, map.len(), region_key(id))?;
        let base = if self.obj.neg.virt_addr() { map.as_ptr() as u64 } else { 0 };
        let mut desc = id.to_le_bytes().to_vec();
        desc.extend_from_slice(&(len as u64).to_le_bytes());
        desc.extend_from_slice(&base.to_le_bytes());
        desc.extend_from_slice(&mr.key().to_le_bytes());
        if regions.len() <= id as usize {
            regions.resize_with(id as usize + 1, || None);
        }
        regions[id as usize] = Some(Reg { map: map.clone(), mr });
        Ok(LocalRegion::new(id, map, desc))
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
        let stalled = || format!("{what} to rank {dst}: provider queue stayed full");
        self.progress_until(dst, stalled, || match post() {
            EAGAIN => Ok(None),
            ret => ffi::check(ret as i64, what).map(Some),
        })
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
            Op::Probe { slot, dst } => {
                self.smalls.give(slot);
                self.probing[dst as usize].store(false, Ordering::Release);
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

    /// The bytes of receive slot `slot` as filled by the provider.
    fn rx_bytes(&self, slot: u32, len: usize) -> &[u8] {
        // SAFETY: the slot is registered receive memory the provider filled with `len` bytes
        // (at most RX_BYTES); nothing writes it until it is posted again, which happens only
        // after the last use of this borrow.
        unsafe { std::slice::from_raw_parts(self.rx_slots.addr(slot) as *const u8, len.min(RX_BYTES)) }
    }

    /// Takes in an arriving message: checks it and copies it into the queues, so that its
    /// buffer can be posted again at once (see ARCHITECTURE.md on why, and on what it costs).
    fn receive(&self, slot: u32, len: usize) {
        let m = match wire::decode(self.rx_bytes(slot, len), self.key, self.size) {
            Ok(m) => m,
            Err(why) => {
                self.reject(|| format!("a message of {len} bytes: {why}"));
                return;
            }
        };
        let h = m.header;
        let class = match h.class {
            Class::Am(AmClass::Request) if slot < REQUEST_BUFS => AmClass::Request,
            Class::Am(AmClass::Reply) if slot >= REQUEST_BUFS => AmClass::Reply,
            Class::Control if slot >= REQUEST_BUFS => {
                if h.handler == Control::Finalized as u16 {
                    self.finalized[h.src as usize].store(true, Ordering::Release);
                    self.left[h.src as usize].store(true, Ordering::Release);
                } else if h.handler == Control::Credit as u16 && !self.credit_back(h.src, h.len) {
                    self.reject(|| format!("{} credits from rank {}: more than it may return", h.len, h.src));
                }
                return;
            }
            _ => {
                // A message under the wrong tag is not ours.
                self.reject(|| {
                    format!("a {:?} message from rank {} in receive buffer {slot}", h.class, h.src)
                });
                return;
            }
        };
        let body = match h.kind {
            Kind::Short => Body::Short,
            Kind::Medium => Body::Medium(m.payload.to_vec()),
            Kind::LongWritten => Body::Long { region: h.region, offset: h.offset, len: h.len },
            Kind::LongCarried => {
                if self.write_local(h.region, h.offset, m.payload).is_err() {
                    self.reject(|| {
                        format!(
                            "a long AM from rank {} outside region {} (offset {})",
                            h.src, h.region, h.offset
                        )
                    });
                    return;
                }
                Body::Long { region: h.region, offset: h.offset, len: h.len }
            }
        };
        let ev = Event::Am(Box::new(AmEvent {
            src: h.src,
            handler: h.handler,
            class,
            args: m.args,
            nargs: h.nargs as usize,
            body,
        }));
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        match class {
            AmClass::Request => q.requests.push_back(ev),
            AmClass::Reply => q.replies.push_back(ev),
        }
    }

    /// A local region's mapping and the bounds-checked range `[offset, offset + len)`.
    fn local_range(&self, region: u32, offset: u64, len: u64) -> Option<(Arc<Mapping>, usize)> {
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        let reg = regions.get(region as usize)?.as_ref()?;
        let end = offset.checked_add(len)?;
        if end > reg.map.len() as u64 {
            return None;
        }
        Some((reg.map.clone(), offset as usize))
    }

    fn write_local(&self, region: u32, offset: u64, data: &[u8]) -> Result<(), ()> {
        let (map, off) = self.local_range(region, offset, data.len() as u64).ok_or(())?;
        // SAFETY: the range lies inside the live mapping (checked above, kept by `map`).
        unsafe { crate::copy::copy_bytes(data.as_ptr(), map.as_ptr().add(off), data.len()) };
        Ok(())
    }

    fn deliver(&self, ev: Event, sink: &dyn EventSink) -> FabricResult<()> {
        match ev {
            Event::Done { token, value, result } => sink.on_complete(token, value, result),
            Event::Am(a) => {
                let args = &a.args[..a.nargs];
                let (src, handler, class) = (a.src, a.handler, a.class);
                match &a.body {
                    Body::Short => {
                        sink.on_am(AmIn { src, handler, class, args, payload: AmInPayload::Short })
                    }
                    Body::Medium(p) => {
                        sink.on_am(AmIn { src, handler, class, args, payload: AmInPayload::Medium(p) })
                    }
                    &Body::Long { region, offset, len } => {
                        let Some((map, off)) = self.local_range(region, offset, len) else {
                            self.reject(|| {
                                format!("a long AM from rank {src} outside region {region} (offset {offset})")
                            });
                            return Ok(());
                        };
                        // SAFETY: the range lies inside the mapping, kept alive by `map` for
                        // the duration of the handler call.
                        let data = unsafe { std::slice::from_raw_parts(map.as_ptr().add(off), len as usize) };
                        let payload = AmInPayload::Long { region, offset: off, data };
                        sink.on_am(AmIn { src, handler, class, args, payload });
                    }
                }
                if class == AmClass::Request {
                    self.owe(src);
                }
            }
        }
        Ok(())
    }

    /// `n` credits toward `src` came back; false (nothing changed) if that would exceed what
    /// this rank can have outstanding, which no well-behaved peer sends.
    fn credit_back(&self, src: Rank, n: u64) -> bool {
        let c = &self.credits[src as usize];
        c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
            let new = cur as u64 + n;
            (new <= REQUEST_CREDITS as u64).then_some(new as u32)
        })
        .is_ok()
    }

    /// Takes one request credit toward `dst`; false while all are out.
    fn take_credit(&self, dst: Rank) -> bool {
        self.credits[dst as usize]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1))
            .is_ok()
    }

    /// A request of `src` was handled: return credits once a batch has gathered.
    fn owe(&self, src: Rank) {
        if self.owed[src as usize].fetch_add(1, Ordering::AcqRel) + 1 >= CREDIT_BATCH {
            self.return_credits(src);
        }
    }

    fn return_credits(&self, src: Rank) {
        let n = self.owed[src as usize].swap(0, Ordering::AcqRel);
        if n == 0 || matches!(self.peer_state(src), PeerState::Dead(_)) {
            return;
        }
        if self.try_control(src, Control::Credit, n as u64).is_err() {
            // The transmit queue is full: keep the count for the next progress call.
            self.owed[src as usize].fetch_add(n, Ordering::AcqRel);
            self.owed_retry.store(true, Ordering::Release);
        }
    }

    /// Retries credit returns that found the transmit queue full.
    fn flush_credits(&self) {
        if self.owed_retry.swap(false, Ordering::AcqRel) {
            for r in 0..self.size {
                if self.owed[r as usize].load(Ordering::Acquire) >= CREDIT_BATCH {
                    self.return_credits(r);
                }
            }
        }
    }

    /// Waits (making progress, queueing what arrives) until `t` has completed.
    fn wait_tracker(&self, t: &Arc<Tracker>, dst: Rank) -> FabricResult<u64> {
        let start = Instant::now();
        let mut spins = 0u32;
        while t.remaining.load(Ordering::Acquire) != 0 {
            if self.poll_cq()? == 0 {
                spins += 1;
                if spins > 64 {
                    std::thread::yield_now();
                }
                if spins.is_multiple_of(1024) {
                    self.check_peer(dst)?;
                    if start.elapsed() > self.op_timeout {
                        return Err(FabricError::Timeout {
                            what: format!("RMA with rank {dst} did not complete"),
                        });
                    }
                }
            }
        }
        match t.take_err() {
            Some(e) => Err(e),
            None => Ok(t.value.load(Ordering::Acquire)),
        }
    }

    /// Writes `src` to `dst` at `offset` in pieces; each piece completes `track`.
    fn write_pieces(
        &self,
        dst: &RemoteRegion,
        offset: usize,
        src: &[u8],
        track: &Arc<Tracker>,
    ) -> FabricResult<()> {
        let piece = CHUNK.min(self.obj.neg.max_msg.max(1));
        let mut done = 0;
        while done < src.len() {
            let n = (src.len() - done).min(piece);
            let part = &src[done..done + n];
            let raddr = dst.addr + (offset + done) as u64;
            if n <= self.obj.neg.inject {
                self.post_write(dst, raddr, (part.as_ptr() as usize, 0), n, None, track)?;
            } else {
                let slot = self.take_chunk(dst.rank)?;
                let at = self.chunks.addr(slot);
                // SAFETY: the chunk is ours until the write completes and holds CHUNK ≥ n bytes.
                unsafe { crate::copy::copy_bytes(part.as_ptr(), at as *mut u8, n) };
                self.post_write(dst, raddr, (at, self.stage.mr.desc()), n, Some(slot), track)?;
            }
            done += n;
        }
        Ok(())
    }

    /// Writes straight from memory the NIC can read (no staging), waiting for completion.
    fn write_direct(
        &self,
        dst: &RemoteRegion,
        offset: usize,
        addr: usize,
        desc: usize,
        len: usize,
        track: &Arc<Tracker>,
    ) -> FabricResult<()> {
        let piece = self.obj.neg.max_msg.max(1);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(piece);
            self.post_write(dst, dst.addr + (offset + done) as u64, (addr + done, desc), n, None, track)?;
            done += n;
        }
        Ok(())
    }

    /// Posts one write of `n` bytes from local `(address, MR descriptor)` to `raddr` of `dst`
    /// as a piece of `track`. Without a staging `slot` (which then holds the bytes and is
    /// returned when the write completes), up to the inject size is copied before returning.
    fn post_write(
        &self,
        dst: &RemoteRegion,
        raddr: u64,
        (buf, desc): (usize, usize),
        n: usize,
        slot: Option<u32>,
        track: &Arc<Tracker>,
    ) -> FabricResult<()> {
        let fa = self.addrs[dst.rank as usize];
        let inject = slot.is_none() && n <= self.obj.neg.inject;
        track.remaining.fetch_add(1, Ordering::AcqRel);
        let op = Op::Write { slot, dst: dst.rank, track: track.clone() };
        let r = self.post_op(dst.rank, "fi_writemsg", op, |ctx| {
            self.obj.ep().write(buf, n, desc, fa, raddr, dst.key, inject, false, ctx)
        });
        if r.is_err() {
            track.remaining.fetch_sub(1, Ordering::AcqRel);
            if let Some(s) = slot {
                self.chunks.give(s);
            }
        }
        r
    }

    /// Issues a put completing `track`. Large unregistered sources on providers that can
    /// read them are written in place and waited for (local completion at return).
    fn issue_put(
        &self,
        dst: &RemoteRegion,
        offset: usize,
        src: &[u8],
        track: &Arc<Tracker>,
    ) -> FabricResult<bool> {
        dst.check(offset, src.len())?;
        if src.len() > CHUNK && !self.obj.neg.mr_local() {
            let waiter = Tracker::new(Target::Waiter);
            let r = self.write_direct(dst, offset, src.as_ptr() as usize, 0, src.len(), &waiter);
            waiter.remaining.fetch_sub(1, Ordering::AcqRel);
            // Even after a failed post the pieces already posted read `src`: wait for them.
            let w = self.wait_tracker(&waiter, dst.rank);
            r?;
            w?;
            return Ok(true);
        }
        self.write_pieces(dst, offset, src, track)?;
        Ok(false)
    }

    fn start(&self, token: u64) -> Arc<Tracker> {
        if token == 0 {
            self.untracked.fetch_add(1, Ordering::AcqRel);
            Tracker::new(Target::Untracked)
        } else {
            Tracker::new(Target::Token(token))
        }
    }

    /// Sends one AM (the credit is taken by the caller): `Ok(false)` when the transmit queue
    /// or the staging buffers are full.
    fn am_send(&self, dst: Rank, msg: &AmOut<'_>) -> FabricResult<bool> {
        let neg = &self.obj.neg;
        let f = frame(self.key, self.rank, dst, msg, neg.send_after_write)?;
        if let Some((region, offset, data)) = f.write_first {
            // The payload goes first; the header follows it (send-after-write order), or
            // after the write completed where the provider does not order them.
            let t = Tracker::new(Target::Waiter);
            let r = self.issue_put(region, offset, data, &t);
            t.remaining.fetch_sub(1, Ordering::AcqRel);
            if !neg.send_after_write || r.is_err() {
                self.wait_tracker(&t, dst)?;
            }
            r?;
        }
        let total = f.header.total();
        let fa = self.addrs[dst as usize];
        let tag = if msg.class == AmClass::Request { TAG_REQUEST } else { TAG_REPLY };
        if total <= neg.inject.min(512) {
            let mut buf = [0u8; 512];
            f.encode(msg.args, &mut buf[..total]);
            let ret = self.obj.ep().inject(&buf[..total], fa, tag);
            if ret == EAGAIN {
                self.poll_cq()?;
                return Ok(false);
            }
            ffi::check(ret as i64, "fi_inject")?;
            return Ok(true);
        }
        if self.tx_full() {
            self.poll_cq()?;
            return Ok(false);
        }
        let Some(slot) = self.chunks.take().or_else(|| {
            let _ = self.poll_cq();
            self.chunks.take()
        }) else {
            return Ok(false);
        };
        let at = self.chunks.addr(slot);
        // SAFETY: the chunk (CHUNK bytes ≥ header + args + MAX_MEDIUM) is ours until the send
        // completes.
        f.encode(msg.args, unsafe { std::slice::from_raw_parts_mut(at as *mut u8, total) });
        let ctx = Context::into_raw(Op::Send { slot: Some(slot), dst });
        let ret = self.obj.ep().send(at, total, self.stage.mr.desc(), fa, tag, ctx);
        if ret < 0 {
            // SAFETY: the provider refused the send, so the context is ours again.
            drop(unsafe { Context::<Op>::from_raw(ctx) });
            self.chunks.give(slot);
            if ret == EAGAIN {
                self.poll_cq()?;
                return Ok(false);
            }
            return ffi::check(ret as i64, "fi_send").map(|_| false);
        }
        self.inflight.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    /// Sends a liveness probe (a `Wake`) to `dst` unless one is in flight or went out less
    /// than [`PROBE_INTERVAL_NS`] ago; its failure marks `dst` dead (see `finish`).
    fn probe(&self, dst: Rank) {
        let d = dst as usize;
        let now = os::now_ns();
        if now.saturating_sub(self.probed_at[d].load(Ordering::Acquire)) < PROBE_INTERVAL_NS
            || self.probing[d].swap(true, Ordering::AcqRel)
        {
            return;
        }
        self.probed_at[d].store(now, Ordering::Release);
        let Some(slot) = self.smalls.take() else {
            self.probing[d].store(false, Ordering::Release);
            return;
        };
        let msg = self.control_message(Control::Wake, 0);
        let at = self.smalls.addr(slot);
        // SAFETY: the small slot (64 bytes ≥ a header) is ours until the probe completes.
        unsafe { std::slice::from_raw_parts_mut(at as *mut u8, msg.len()) }.copy_from_slice(&msg);
        let ctx = Context::into_raw(Op::Probe { slot, dst });
        let ret = self.obj.ep().send(at, msg.len(), self.stage.mr.desc(), self.addrs[d], TAG_REPLY, ctx);
        if ret < 0 {
            // SAFETY: refused, so the context is ours again.
            drop(unsafe { Context::<Op>::from_raw(ctx) });
            self.smalls.give(slot);
            self.probing[d].store(false, Ordering::Release);
            let since =
                match self.refused_since[d].compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => now,
                    Err(t) => t,
                };
            if ret != EAGAIN {
                self.mark_failed(dst, format!("unreachable: {}", ffi::strerror(ret as i64)));
            } else if now - since >= PROBE_REFUSED_NS {
                self.mark_failed(
                    dst,
                    format!(
                        "its endpoint refused connections for {} s (process or host gone)",
                        (now - since) / 1_000_000_000
                    ),
                );
            }
            return;
        }
        self.refused_since[d].store(0, Ordering::Release);
        self.inflight.fetch_add(1, Ordering::AcqRel);
    }

    fn control_message(&self, c: Control, value: u64) -> [u8; wire::HEADER] {
        let h = Header {
            key: self.key,
            src: self.rank,
            handler: c as u16,
            class: Class::Control,
            kind: Kind::Short,
            nargs: 0,
            region: 0,
            offset: 0,
            len: value,
        };
        let mut buf = [0u8; wire::HEADER];
        h.encode(&[], &mut buf);
        buf
    }

    /// Sends control message `c`, making progress while the transmit queue is full.
    fn send_control(&self, dst: Rank, c: Control) -> FabricResult<()> {
        let buf = self.control_message(c, 0);
        let fa = self.addrs[dst as usize];
        self.post_retry(dst, "fi_inject", || self.obj.ep().inject(&buf, fa, TAG_REPLY))
    }

    /// One attempt to send control message `c` carrying `value`.
    fn try_control(&self, dst: Rank, c: Control, value: u64) -> FabricResult<()> {
        let buf = self.control_message(c, value);
        ffi::check(self.obj.ep().inject(&buf, self.addrs[dst as usize], TAG_REPLY) as i64, "fi_inject")
    }
}

/// How one AM travels: its header, the payload bytes inside the message, and a long payload
/// that must be written to (region, offset) before the header is sent.
struct Framed<'a> {
    header: Header,
    carried: &'a [u8],
    write_first: Option<(&'a RemoteRegion, usize, &'a [u8])>,
}

/// Checks `msg` from `src` to `dst` and decides how it travels (shared by the main endpoint
/// and the transmit slots): long payloads go inside the message up to [`MAX_MEDIUM`] where
/// the provider does not order a send after a write, else they are written first.
fn frame<'a>(
    key: u64,
    src: Rank,
    dst: Rank,
    msg: &AmOut<'a>,
    send_after_write: bool,
) -> FabricResult<Framed<'a>> {
    if msg.args.len() > crate::AM_MAX_ARGS {
        return Err(FabricError::TooLarge {
            what: "AM arguments",
            len: msg.args.len(),
            max: crate::AM_MAX_ARGS,
        });
    }
    let mut write_first = None;
    let (kind, region, offset, carried, len): (Kind, u32, u64, &[u8], usize) = match msg.payload {
        AmPayload::Short => (Kind::Short, 0, 0, &[], 0),
        AmPayload::Medium(p) => {
            crate::types::check_medium(p, MAX_MEDIUM)?;
            (Kind::Medium, 0, 0, p, p.len())
        }
        AmPayload::Long { region, offset, data } => {
            if region.rank != dst {
                return Err(FabricError::Malformed {
                    what: format!("long AM to rank {dst} targets rank {}'s memory", region.rank),
                });
            }
            region.check(offset, data.len())?;
            if !send_after_write && data.len() <= MAX_MEDIUM {
                (Kind::LongCarried, region.id, offset as u64, data, data.len())
            } else {
                write_first = Some((region, offset, data));
                (Kind::LongWritten, region.id, offset as u64, &[][..], data.len())
            }
        }
    };
    let header = Header {
        key,
        src,
        handler: msg.handler,
        class: Class::Am(msg.class),
        kind,
        nargs: msg.args.len() as u8,
        region,
        offset,
        len: len as u64,
    };
    Ok(Framed { header, carried, write_first })
}

impl Framed<'_> {
    /// Writes the whole message (`header.total()` bytes) to `out`.
    fn encode(&self, args: &[u64], out: &mut [u8]) {
        let n = self.header.encode(args, out);
        out[n..].copy_from_slice(self.carried);
    }
}

fn fi_op(op: AtomicOp) -> (sys::fi_op, u64, u64) {
    match op {
        AtomicOp::Load => (sys::FI_ATOMIC_READ, 0, 0),
        AtomicOp::Store(v) | AtomicOp::Swap(v) => (sys::FI_ATOMIC_WRITE, v, 0),
        AtomicOp::FetchAdd(v) => (sys::FI_SUM, v, 0),
        AtomicOp::FetchAnd(v) => (sys::FI_BAND, v, 0),
        AtomicOp::FetchOr(v) => (sys::FI_BOR, v, 0),
        AtomicOp::FetchXor(v) => (sys::FI_BXOR, v, 0),
        AtomicOp::CompareSwap { expected, new } => (sys::FI_CSWAP, new, expected),
    }
}

impl Fabric for OfiFabric {
    fn name(&self) -> &'static str {
        "ofi"
    }
    fn rank(&self) -> Rank {
        self.rank
    }
    fn size(&self) -> u32 {
        self.size
    }
    fn caps(&self) -> Caps {
        Caps {
            rma: true,
            atomics: self.atomics,
            load_store: false,
            am_max_args: crate::AM_MAX_ARGS,
            am_max_medium: MAX_MEDIUM,
            am_max_long: usize::MAX,
            peer_read: false,
            target_progress: self.obj.neg.manual_progress,
        }
    }

    fn register(&self, len: usize) -> FabricResult<LocalRegion> {
        let map = Arc::new(os::map_anonymous(len.max(1).next_multiple_of(4096))?);
        self.register_at(None, map, len)
    }

    fn deregister(&self, region: &LocalRegion) {
        let mut regions = self.regions.write().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = regions.get_mut(region.id as usize) {
            *r = None;
        }
    }

    fn attach(&self, rank: Rank, desc: &[u8]) -> FabricResult<RemoteRegion> {
        if desc.len() != 28 || rank >= self.size {
            return Err(FabricError::Malformed {
                what: format!("region descriptor of {} bytes for rank {rank}", desc.len()),
            });
        }
        let w = |a: usize| u64::from_le_bytes(desc[a..a + 8].try_into().unwrap_or_default());
        let id = u32::from_le_bytes(desc[..4].try_into().unwrap_or_default());
        Ok(RemoteRegion { rank, id, len: w(4) as usize, addr: w(12), key: w(20) })
    }

    fn seal(&self, _region: &LocalRegion) -> FabricResult<()> {
        Ok(())
    }

    fn put(&self, dst: &RemoteRegion, offset: usize, src: &[u8], token: u64) -> FabricResult<Issued> {
        if src.is_empty() {
            return dst.check(offset, 0).map(|_| Issued::Done(0));
        }
        let t = self.start(token);
        let r = self.issue_put(dst, offset, src, &t);
        if matches!(r, Ok(true)) || r.is_err() {
            // Done in place, or failed: the operation is over either way.
            if token == 0 {
                self.untracked.fetch_sub(1, Ordering::AcqRel);
            }
            return r.map(|_| Issued::Done(0));
        }
        self.release_guard(&t);
        Ok(Issued::Pending)
    }

    fn put_from(
        &self,
        dst: &RemoteRegion,
        dst_offset: usize,
        src: &RemoteRegion,
        src_offset: usize,
        len: usize,
        token: u64,
    ) -> FabricResult<Issued> {
        if src.rank != self.rank {
            return Err(FabricError::Malformed { what: format!("put source in rank {}'s memory", src.rank) });
        }
        dst.check(dst_offset, len)?;
        let (addr, desc) = {
            let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
            let reg = regions
                .get(src.id as usize)
                .and_then(Option::as_ref)
                .ok_or_else(|| FabricError::Malformed { what: format!("no local region {}", src.id) })?;
            src.check(src_offset, len)?;
            (reg.map.as_ptr() as usize + src_offset, reg.mr.desc())
        };
        let t = self.start(token);
        let r = self.write_direct(dst, dst_offset, addr, desc, len, &t);
        self.release_guard(&t);
        r.map(|_| Issued::Pending)
    }

    fn get(&self, src: &RemoteRegion, offset: usize, dst: &mut [u8]) -> FabricResult<()> {
        src.check(offset, dst.len())?;
        let fa = self.addrs[src.rank as usize];
        let direct = !self.obj.neg.mr_local();
        let piece = if direct { self.obj.neg.max_msg.max(1) } else { CHUNK };
        let mut done = 0;
        while done < dst.len() {
            let n = (dst.len() - done).min(piece);
            let t = Tracker::new(Target::Waiter);
            let slot = if direct { None } else { Some(self.take_chunk(src.rank)?) };
            let (buf, desc) = match slot {
                None => (dst[done..].as_mut_ptr() as usize, 0),
                Some(s) => (self.chunks.addr(s), self.stage.mr.desc()),
            };
            t.remaining.fetch_add(1, Ordering::AcqRel);
            let raddr = src.addr + (offset + done) as u64;
            let op = Op::Read { dst: src.rank, track: t.clone() };
            let posted = self.post_op(src.rank, "fi_read", op, |ctx| {
                self.obj.ep().read(buf, n, desc, fa, raddr, src.key, ctx)
            });
            if posted.is_err() {
                t.remaining.fetch_sub(1, Ordering::AcqRel);
            }
            t.remaining.fetch_sub(1, Ordering::AcqRel);
            let waited = self.wait_tracker(&t, src.rank);
            if let Some(s) = slot {
                if posted.is_ok() && waited.is_ok() {
                    // SAFETY: the read into the chunk completed; the chunk holds n bytes.
                    unsafe { crate::copy::copy_bytes(buf as *const u8, dst[done..].as_mut_ptr(), n) };
                }
                self.chunks.give(s);
            }
            posted?;
            waited?;
            done += n;
        }
        Ok(())
    }

    fn atomic(&self, dst: &RemoteRegion, offset: usize, op: AtomicOp, token: u64) -> FabricResult<Issued> {
        if !self.atomics {
            return Err(FabricError::Unsupported { what: "native atomics on this provider" });
        }
        dst.check(offset, 8)?;
        if !(dst.addr + offset as u64).is_multiple_of(8) {
            return Err(FabricError::Malformed {
                what: format!("atomic at offset {offset}: not 8-byte aligned"),
            });
        }
        let (fop, operand, compare) = fi_op(op);
        let slot = self.take_slot(&self.smalls, dst.rank)?;
        let at = self.smalls.addr(slot);
        // SAFETY: the small slot (64 bytes, 8-aligned) is ours until the operation completes.
        unsafe {
            std::ptr::write(at as *mut u64, operand);
            std::ptr::write((at + 8) as *mut u64, compare);
        }
        let t = self.start(token);
        t.remaining.fetch_add(1, Ordering::AcqRel);
        let fa = self.addrs[dst.rank as usize];
        let raddr = dst.addr + offset as u64;
        let o = Op::Atomic { slot, dst: dst.rank, track: t.clone() };
        if let Err(e) = self.post_op(dst.rank, "fi_atomic", o, |ctx| {
            self.obj.ep().atomic(at, self.stage.mr.desc(), fa, raddr, dst.key, fop, ctx)
        }) {
            self.smalls.give(slot);
            if token == 0 {
                self.untracked.fetch_sub(1, Ordering::AcqRel);
            }
            return Err(e);
        }
        self.release_guard(&t);
        Ok(Issued::Pending)
    }

    fn quiet(&self) -> FabricResult<()> {
        let start = Instant::now();
        let mut spins = 0u32;
        while self.untracked.load(Ordering::Acquire) != 0 {
            if self.poll_cq()? == 0 {
                spins += 1;
                if spins > 64 {
                    std::thread::yield_now();
                }
                if spins.is_multiple_of(4096) && start.elapsed() > self.op_timeout {
                    return Err(FabricError::Timeout { what: "outstanding puts did not complete".into() });
                }
            }
        }
        match self.untracked_err.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn am_try_send(&self, dst: Rank, msg: &AmOut<'_>) -> FabricResult<bool> {
        if dst >= self.size {
            return Err(FabricError::Peer {
                rank: dst,
                reason: format!("does not exist (job of {})", self.size),
            });
        }
        let request = msg.class == AmClass::Request;
        if request && !self.take_credit(dst) {
            // The peer has not handled our earlier requests yet: back-pressure.
            self.poll_cq()?;
            self.flush_credits();
            return Ok(false);
        }
        let sent = self.am_send(dst, msg);
        if request && !matches!(sent, Ok(true)) {
            self.credits[dst as usize].fetch_add(1, Ordering::AcqRel);
        }
        sent
    }

    fn open_slot_inbox(&self, slots: &[u32], _ring_bytes: usize) -> FabricResult<LocalRegion> {
        if slots.len() != self.size as usize {
            return Err(FabricError::Mismatch {
                what: format!("slot counts for {} ranks in a job of {}", slots.len(), self.size),
            });
        }
        let mut contexts = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
        if contexts.len() >= slots::MAX_CONTEXTS {
            return Err(FabricError::Limit {
                what: "endpoint contexts (libfabric domains) per rank",
                asked: contexts.len() + 1,
                max: slots::MAX_CONTEXTS,
            });
        }
        let single_thread = slots[self.rank as usize] <= 1;
        let context = match self.spares.take(single_thread) {
            Some(c) => c,
            None => slots::SlotContext {
                returned: Arc::default(),
                domain: Arc::new(self.obj.open_domain(&self.names, single_thread)?),
                single_thread,
                next_key: AtomicU64::new(1),
            },
        };
        let id = self.next_context.fetch_add(1, Ordering::AcqRel);
        contexts.push((id, Arc::new(context)));
        // Receives stay on the main endpoint: the descriptor only names the context.
        Ok(LocalRegion::new(id, Arc::new(os::map_anonymous(4096)?), id.to_le_bytes().to_vec()))
    }

    fn close_slot_inbox(&self, region: &LocalRegion) -> FabricResult<bool> {
        let mut contexts = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
        let Some(at) = contexts.iter().position(|(id, _)| *id == region.id) else {
            return Err(FabricError::Malformed {
                what: format!("region {} is no endpoint context", region.id),
            });
        };
        // The slots hold the domain until they close; what they sent arrives on the main
        // endpoint and is delivered as usual. The context is kept for the next sets, with the
        // endpoints its slots return as they close.
        let (_, context) = contexts.swap_remove(at);
        if let Ok(c) = Arc::try_unwrap(context) {
            self.spares.keep(c);
        }
        Ok(true)
    }

    fn open_tx_slots(
        &self,
        inboxes: &[Vec<u8>],
        _slots: &[u32],
        _first: u32,
        count: u32,
    ) -> FabricResult<Vec<Box<dyn TxSlot>>> {
        let mine = inboxes.get(self.rank as usize).map(Vec::as_slice).unwrap_or_default();
        let id = u32::from_le_bytes(mine.try_into().map_err(|_| FabricError::Malformed {
            what: format!("endpoint context descriptor of {} bytes", mine.len()),
        })?);
        let ctx = {
            let contexts = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
            let found = contexts.iter().find(|(c, _)| *c == id).map(|(_, d)| d.clone());
            found.ok_or_else(|| FabricError::Malformed { what: format!("no endpoint context {id}") })?
        };
        let neg = &self.obj.neg;
        let params = Arc::new(slots::SlotParams {
            key: self.key,
            rank: self.rank,
            credits: self.credits.clone(),
            left: self.left.clone(),
            inject: neg.inject,
            tx_size: neg.tx_size,
            send_after_write: neg.send_after_write,
        });
        (0..count)
            .map(|_| Ok(Box::new(slots::OfiTxSlot::open(&ctx, params.clone())?) as Box<dyn TxSlot>))
            .collect()
    }

    fn progress(&self, sink: &dyn EventSink, set: PollSet) -> FabricResult<usize> {
        self.poll_cq()?;
        self.flush_credits();
        let mut delivered = 0;
        while delivered < 64 {
            let ev = {
                let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
                let ev = q.replies.pop_front().or_else(|| match set {
                    PollSet::All => q.requests.pop_front(),
                    PollSet::RepliesOnly => None,
                });
                if ev.is_some() {
                    self.delivering.fetch_add(1, Ordering::AcqRel);
                }
                ev
            };
            let Some(ev) = ev else { break };
            let r = self.deliver(ev, sink);
            self.delivering.fetch_sub(1, Ordering::AcqRel);
            r?;
            delivered += 1;
        }
        Ok(delivered)
    }

    fn has_incoming(&self) -> bool {
        let q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        !q.replies.is_empty() || !q.requests.is_empty()
    }

    fn wait_incoming(&self, timeout: Duration) -> bool {
        if self.has_incoming() {
            return true;
        }
        // Sleep on the CQ's descriptor without holding the CQ lock, so that threads waiting
        // for their own completions keep reading the queue. Woken, it reports traffic even
        // when no event follows: a peer's RMA is carried out inside the next poll and
        // delivers nothing, yet more of it is likely to come.
        match self.wait_ready(timeout) {
            Some(woken) => woken,
            None => {
                std::thread::sleep(timeout.min(Duration::from_micros(100)));
                false
            }
        }
    }

    fn notify(&self, rank: Rank) {
        // A wake-up is a hint: none to a peer that left (it reads nothing more), and a failed
        // one is not an error of the operation it follows, which is complete.
        if rank != self.rank && self.known_running(rank) {
            let _ = self.send_control(rank, Control::Wake);
        }
    }

    fn peer_state(&self, rank: Rank) -> PeerState {
        let r = rank as usize;
        if r >= self.size as usize {
            return PeerState::Dead(format!("rank {rank} is not in the job"));
        }
        if self.finalized[r].load(Ordering::Acquire) {
            return PeerState::Finalized;
        }
        if let Some(why) = self.failed.lock().unwrap_or_else(|e| e.into_inner())[r].clone() {
            return PeerState::Dead(why);
        }
        let pid = self.pids[r];
        if self.same_host[r] {
            if !os::process_alive(pid) {
                return PeerState::Dead(format!("process {pid} is gone"));
            }
        } else {
            self.probe(rank);
        }
        PeerState::Running
    }

    fn peer_drained(&self, rank: Rank) -> bool {
        let q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let from = |e: &Event| match e {
            Event::Am(a) => a.src == rank,
            Event::Done { .. } => false,
        };
        self.delivering.load(Ordering::Acquire) == 0
            && !q.requests.iter().any(from)
            && !q.replies.iter().any(from)
    }

    fn finalize(&self) {
        if self.done.swap(true, Ordering::AcqRel) {
            return;
        }
        let elsewhere = |r: Rank| self.same_host_elsewhere && self.same_host[r as usize];
        for r in (0..self.size).filter(|&r| r != self.rank && !elsewhere(r)) {
            // A peer that left (finalized or dead) reads nothing more: no message to it, as
            // the provider may retry a connection to a closed endpoint until the timeout.
            if matches!(self.peer_state(r), PeerState::Running) {
                let _ = self.send_control(r, Control::Finalized);
            }
        }
    }

    fn resources(&self) -> Vec<Resource> {
        let neg = &self.obj.neg;
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        let local: Vec<_> = regions.iter().flatten().collect();
        let res = |kind: String, count: u64, bytes: u64| Resource { kind, count, bytes };
        vec![
            res(
                format!(
                    "libfabric provider {} (fabric {}, domain {}; mr_mode {}; inject {} B; {} progress; {}{}{}{})",
                    neg.provider,
                    neg.fabric_name,
                    neg.domain_name,
                    neg.mr_mode_names(),
                    neg.inject,
                    if neg.manual_progress { "manual" } else { "auto" },
                    if self.atomics { "native atomics" } else { "atomics through AMs" },
                    if neg.send_after_write { ", send-after-write order" } else { "" },
                    if neg.delivery_complete { ", delivery-complete" } else { "" },
                    if neg.cq_wait_fd { ", CQ wait descriptor" } else { ", no CQ wait descriptor (short sleeps)" },
                ),
                1,
                0,
            ),
            res("domains".into(), 1, 0),
            res("RDM endpoints".into(), 1, 0),
            res(format!("completion queues ({} entries)", neg.tx_size + neg.rx_size + 64), 1, 0),
            res("address vector entries".into(), self.size as u64, 0),
            res("memory registrations (regions)".into(), local.len() as u64, local.iter().map(|r| r.map.len() as u64).sum()),
            res(format!("posted receive buffers of {RX_BYTES} B"), self.rx_slots.count() as u64, self.rx.map.len() as u64),
            res(
                format!("staging slots ({} of {} KiB, {} of 64 B) in use", CHUNKS, CHUNK / 1024, SMALLS),
                (self.chunks.in_use() + self.smalls.in_use()) as u64,
                self.stage.map.len() as u64,
            ),
            res("messages rejected (foreign key or malformed)".into(), self.rejected.load(Ordering::Relaxed), 0),
            {
                let (contexts, endpoints) = self.spares.counts();
                res(format!("idle endpoint contexts kept for reuse (holding {endpoints} endpoints)"), contexts as u64, 0)
            },
        ]
    }
}

impl Drop for OfiFabric {
    fn drop(&mut self) {
        self.finalize();
        // Let what we sent leave before the endpoint closes (bounded).
        let start = Instant::now();
        while self.inflight.load(Ordering::Acquire) != 0 && start.elapsed() < Duration::from_secs(2) {
            if self.poll_cq().unwrap_or(0) == 0 {
                std::thread::yield_now();
            }
        }
        // The endpoint goes first: a provider may still copy arriving data into posted
        // receive buffers or regions while closing it, so they must outlive it.
        self.obj.close_endpoint();
        self.regions.write().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
