//! The shared-memory fabric: every rank of a node maps every other rank's registered memory,
//! so put, get and atomics are plain copies and atomic instructions that need nothing from the
//! target's CPU (the design of GASNet-EX's PSHM). Active messages travel through one
//! single-producer ring per (sender, receiver, request/reply) in the receiver's inbox file.
//!
//! Files live in the job's directory `/dev/shm/weft-JOB/` (mode 700, for the job's whole life)
//! and are unlinked as soon as every rank has mapped them, so nothing but the directory is left
//! behind even after `kill -9`; the files of a peer found dead are unlinked by the survivors.
//! (The launcher also removes anything of its job that a rank killed during start-up left.)

mod bias;
mod claim;
mod control;
mod deliver;
pub mod ring;
mod slots;
mod spin;

pub use slots::{MAX_SLOT_INBOXES, MAX_SLOT_RINGS};

use crate::os::{self, Mapping};
use crate::{
    AmClass, AmOut, AmPayload, AtomicOp, Caps, EventSink, Fabric, FabricError, FabricResult, Issued,
    LocalRegion, PeerState, PollSet, Rank, RemoteRegion, Resource, TxSlot,
};
use bias::Bias;
use claim::Claim;
use control::{Control, State};
use deliver::Inbound;
use ring::{Body, RingPtr, Sender};
use spin::SpinLock;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Largest medium AM payload of the shared-memory fabric.
pub const MAX_MEDIUM: usize = 64 * 1024;

/// Start-up parameters of the shared-memory fabric.
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// Job id, unique on the node (part of every file name).
    pub job: String,
    /// This rank.
    pub rank: Rank,
    /// Ranks in the job (all on this node).
    pub size: u32,
    /// Size of each AM ring (rounded down to a power-of-two number of 64-byte slots, at least
    /// 64).
    pub rings: crate::RingSize,
    /// How long start-up waits for every rank to appear.
    pub init_timeout: Duration,
}

/// The directory, in [`os::SHM_DIR`], of job `job`'s shared-memory files (see
/// [`os::private_dir`]).
pub fn job_dir(job: &str) -> String {
    crate::names::job_dir(job)
}

/// Prefix of every shared-memory file of job `job` (in its directory).
pub fn file_prefix(job: &str) -> String {
    format!("{}/", job_dir(job))
}

/// Creates shared file `name` (under [`file_prefix`]) of job `job` with [`os::create_shared`],
/// making (or checking) the job's directory first. The directory stays while any rank of the
/// job runs: were it removed when empty, another user who saw its name could make one of
/// their own under it, and the job's next file would fail.
pub fn create_in_job(
    job: &str,
    name: &str,
    len: usize,
    fill: os::Fill,
    init: impl FnOnce(*mut u8),
) -> FabricResult<Mapping> {
    os::private_dir(&job_dir(job))?;
    os::create_shared(name, len, fill, init)
}

/// The shared-memory fabric (see the module documentation).
pub struct ShmFabric {
    rank: Rank,
    size: u32,
    job: String,
    slots: usize,
    max_medium: usize,
    inbox_bytes: usize,
    /// Every rank's inbox (control block + rings), ours included.
    inboxes: Vec<Arc<Mapping>>,
    /// Producer state of the rings in each destination's inbox: [request, reply].
    senders: Vec<[SpinLock<Sender>; 2]>,
    /// Consumer state of the rings in our inbox, per source: [request, reply].
    receivers: Vec<[Inbound; 2]>,
    local_regions: RwLock<Vec<Option<Arc<Mapping>>>>,
    remote_maps: Mutex<Vec<Arc<Mapping>>>,
    next_region: AtomicU32,
    /// Receive side of endpoint transmit slots (one inbox per endpoint context).
    slot_rx: slots::SlotInboxes,
    /// The bias of every ring-end lock above (`senders`, the receivers' and slot inboxes'
    /// consumers): plain acquisitions while one thread communicates.
    bias: Bias,
    /// This rank's claim on its place in the job, held while the fabric lives.
    claim: Claim,
    /// Per peer: found dead, and its files unlinked.
    buried: Vec<AtomicBool>,
    /// Requests sent (the default rings' and the slots'), for remote completion.
    counts: crate::counts::RequestCounts,
}

fn inbox_name(job: &str, rank: Rank) -> String {
    format!("{}{rank}", file_prefix(job))
}

fn region_name(job: &str, rank: Rank, id: u32) -> String {
    format!("{}{rank}-r{id}", file_prefix(job))
}

fn ring_offset(slots: usize, src: Rank, class: AmClass) -> usize {
    let idx = src as usize * 2 + usize::from(class == AmClass::Reply);
    control::CONTROL_BYTES + idx * ring::ring_bytes(slots)
}

fn class_index(c: AmClass) -> usize {
    usize::from(c == AmClass::Reply)
}

/// Removes a shared file when dropped.
struct Unlink(String);

impl Drop for Unlink {
    fn drop(&mut self) {
        os::unlink(&self.0);
    }
}

/// Removes the job's directory, if empty, when start-up fails (the last rank out does).
struct RemoveDirOnError<'a> {
    job: &'a str,
    armed: bool,
}

impl Drop for RemoveDirOnError<'_> {
    fn drop(&mut self) {
        if self.armed {
            os::remove_dir(&job_dir(self.job));
        }
    }
}

impl ShmFabric {
    /// Creates this rank's inbox, maps every peer's and waits until all ranks have done so.
    pub fn init(cfg: ShmConfig) -> FabricResult<Self> {
        if cfg.rank >= cfg.size {
            return Err(FabricError::Mismatch {
                what: format!("rank {} of a job of {}", cfg.rank, cfg.size),
            });
        }
        // First of all: a second process started as this rank fails here, and tells us.
        let claim = Claim::take(&cfg.job, cfg.rank)?;
        let slots = ring_slots(cfg.rings.ring_bytes(cfg.size));
        let max_medium = max_medium_for(slots);
        let inbox_bytes = control::CONTROL_BYTES + 2 * cfg.size as usize * ring::ring_bytes(slots);
        // Declared before the inbox's guard, so dropped after it: the directory is empty then.
        let mut dir_guard = RemoveDirOnError { job: &cfg.job, armed: true };
        let name = inbox_name(&cfg.job, cfg.rank);
        // Taken though our claim was free: a file left by a process of this job id that died,
        // or planted; never replaced.
        let own = create_in_job(&cfg.job, &name, inbox_bytes, os::Fill::Reserved, |p| {
            // SAFETY: p is a fresh zeroed mapping of inbox_bytes ≥ CONTROL_BYTES bytes.
            unsafe { Control::init(p, cfg.rank, cfg.size, slots as u32, os::pid()) }
        })
        .map_err(|e| match e {
            // Out of /dev/shm: say what sets the inbox's size.
            FabricError::Os { what, errno: errno @ (libc::ENOSPC | libc::ENOMEM) } => FabricError::Os {
                what: format!(
                    "{what}: this rank's inbox of {inbox_bytes} bytes (its AM rings; WEFT_AM_INBOX_KIB sets \
                     their budget, WEFT_AM_RING_KIB fixes their size: lower one, or give /dev/shm more room)"
                ),
                errno,
            },
            e => e,
        })?;
        // From here on an error leaves nothing behind: the inbox is unlinked on every way out
        // (it is unlinked on success too, once every rank has mapped it).
        let _unlink = Unlink(name);
        let own = Arc::new(own);
        let deadline = Instant::now() + cfg.init_timeout;
        let mut inboxes = Vec::with_capacity(cfg.size as usize);
        for r in 0..cfg.size {
            if r == cfg.rank {
                inboxes.push(own.clone());
                continue;
            }
            let name = inbox_name(&cfg.job, r);
            let map = loop {
                if let Some(m) = os::open_shared(&name)? {
                    break m;
                }
                claim.check()?;
                if Instant::now() > deadline {
                    return Err(FabricError::Timeout {
                        what: format!(
                            "rank {r} did not start within {:?} ({} missing)",
                            cfg.init_timeout, name
                        ),
                    });
                }
                os::sleep_until_elapsed(Duration::from_millis(1));
            };
            if map.len() != inbox_bytes {
                return Err(FabricError::Mismatch {
                    what: format!("rank {r}'s inbox is {} bytes, ours {inbox_bytes} (different WEFT_AM_RING_KIB, WEFT_AM_INBOX_KIB or size?)", map.len()),
                });
            }
            // SAFETY: the map holds at least CONTROL_BYTES bytes, published after init.
            unsafe { Control::at(map.as_ptr()) }.check(r, cfg.size, slots as u32)?;
            inboxes.push(Arc::new(map));
        }
        let ring_at = |inbox: &Mapping, src: Rank, class: AmClass| {
            // SAFETY: the offset lies inside the inbox (layout computed from the same slots and
            // size, checked above), is 64-aligned, and the mapping outlives the fabric's rings.
            unsafe { RingPtr::new(inbox.as_ptr().add(ring_offset(slots, src, class)), slots) }
        };
        let senders = inboxes
            .iter()
            .map(|ib| {
                [AmClass::Request, AmClass::Reply]
                    .map(|c| SpinLock::new(Sender::new(ring_at(ib, cfg.rank, c))))
            })
            .collect();
        let receivers = (0..cfg.size)
            .map(|src| {
                [AmClass::Request, AmClass::Reply].map(|c| Inbound::new(ring_at(&own, src, c), max_medium))
            })
            .collect();
        let fab = ShmFabric {
            rank: cfg.rank,
            size: cfg.size,
            job: cfg.job.clone(),
            slots,
            max_medium,
            inbox_bytes,
            inboxes,
            senders,
            receivers,
            local_regions: RwLock::new(Vec::new()),
            remote_maps: Mutex::new(Vec::new()),
            next_region: AtomicU32::new(0),
            slot_rx: slots::SlotInboxes::new(),
            bias: Bias::new(),
            claim,
            buried: (0..cfg.size).map(|_| AtomicBool::new(false)).collect(),
            counts: crate::counts::RequestCounts::new(cfg.size),
        };
        // Start-up barrier: count ourselves in rank 0's control block once every inbox is mapped.
        fab.control(0).attached().fetch_add(1, Ordering::AcqRel);
        loop {
            if fab.control(0).attached().load(Ordering::Acquire) >= cfg.size {
                break;
            }
            if let Some((r, why)) = (0..cfg.size).find_map(|r| match fab.peer_state(r) {
                PeerState::Dead(w) => Some((r, w)),
                _ => None,
            }) {
                return Err(FabricError::Peer { rank: r, reason: format!("died during start-up ({why})") });
            }
            fab.claim.check()?;
            if Instant::now() > deadline {
                return Err(FabricError::Timeout {
                    what: "waiting for every rank to map the others' inboxes".into(),
                });
            }
            os::sleep_until_elapsed(Duration::from_micros(200));
        }
        fab.control(cfg.rank).state.store(State::Running as u32, Ordering::Release);
        // The directory stays for the job's later files; the last rank out removes it.
        dir_guard.armed = false;
        Ok(fab)
    }

    /// Registers a region of `len` bytes backed as `fill` says.
    fn register_with(&self, len: usize, fill: os::Fill) -> FabricResult<LocalRegion> {
        // Shared memory may be given back (no device pins it).
        self.new_region(len, true, |name| os::create_shared(name, len, fill, |_| {}))
    }

    /// The program's static data moved into a region file (see [`crate::adopt`]); its
    /// variables are never given back.
    fn adopt_data(&self) -> FabricResult<LocalRegion> {
        let (start, len) = crate::adopt::adoptable()?;
        // A signal handler that stores to a variable between the copy and the move would
        // lose the store: signals wait for the end of the move (weft's own threads block
        // them for good, see `signals::spawn_quiet`).
        let _blocked = crate::signals::block_async_signals();
        self.new_region(len, false, |name| {
            let copy =
                os::create_shared(name, len, os::Fill::Reserved, |p| crate::adopt::copy_in(start, p, len))?;
            crate::adopt::move_over(copy, start).inspect_err(|_| os::unlink(name))
        })
    }

    /// A region of `len` bytes whose file of the job `make` creates under the name it is
    /// given, entered in the table of this rank's regions.
    fn new_region(
        &self,
        len: usize,
        discard: bool,
        make: impl FnOnce(&str) -> FabricResult<os::Mapping>,
    ) -> FabricResult<LocalRegion> {
        let id = self.next_region.fetch_add(1, Ordering::Relaxed);
        // The job's directory exists: init made or checked it, and it lasts the job's life.
        let map = Arc::new(make(&region_name(&self.job, self.rank, id))?);
        let mut regions = self.local_regions.write().unwrap_or_else(|e| e.into_inner());
        if regions.len() <= id as usize {
            regions.resize(id as usize + 1, None);
        }
        regions[id as usize] = Some(map.clone());
        let mut desc = id.to_le_bytes().to_vec();
        desc.extend_from_slice(&(len as u64).to_le_bytes());
        Ok(LocalRegion::new(id, map, desc).with_discard(discard))
    }

    /// Unlinks what dead peer `rank` left in the job's directory (its inbox if start-up had not
    /// ended, a region it was publishing): it cannot, and under mpirun or srun nobody else would.
    fn bury(&self, rank: Rank) {
        let (inbox, region) = (rank.to_string(), format!("{rank}-r"));
        os::unlink_matching(&job_dir(&self.job), |name| {
            let base = name.strip_suffix(".tmp").unwrap_or(name);
            base == inbox || base.starts_with(&region)
        });
    }

    fn control(&self, r: Rank) -> &Control {
        // SAFETY: every inbox starts with an initialised Control block and stays mapped while
        // self lives.
        unsafe { Control::at(self.inboxes[r as usize].as_ptr()) }
    }

    /// Wakes `dst` if one of its threads sleeps on its doorbell. No fence precedes the check:
    /// a fence would stall until the message's own cache line (a miss) reached memory order,
    /// costing a line transfer per message. The race it would close (a receiver going to sleep
    /// just as the message lands) costs at most that receiver's sleep timeout (≤ 2 ms), and
    /// the window is a few nanoseconds wide.
    /// First step of a sleep in [`Fabric::wait_incoming`], split out for fabrics built on
    /// this one: from now on [`Fabric::notify`] of this rank rings its doorbell. Returns the
    /// doorbell's value; check for work, then [`ShmFabric::sleep`] with it, then
    /// [`ShmFabric::sleep_end`].
    pub fn sleep_begin(&self) -> u32 {
        let c = self.control(self.rank);
        c.sleepers.fetch_add(1, Ordering::SeqCst);
        crate::order::full_fence();
        c.doorbell.load(Ordering::Acquire)
    }

    /// Sleeps until the doorbell moves from `seen` or `timeout` passes.
    pub fn sleep(&self, seen: u32, timeout: Duration) {
        os::futex_wait(&self.control(self.rank).doorbell, seen, timeout);
    }

    /// Ends a sleep begun with [`ShmFabric::sleep_begin`].
    pub fn sleep_end(&self) {
        self.control(self.rank).sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    fn ring_doorbell(&self, dst: Rank) {
        ring_doorbell(self.control(dst));
    }

    /// The mapping of local region `id`.
    fn local_map(&self, id: u32) -> Option<Arc<Mapping>> {
        let regions = self.local_regions.read().unwrap_or_else(|e| e.into_inner());
        regions.get(id as usize)?.clone()
    }

    /// The region a registration descriptor (id, len) names: this rank's own mapping, or a
    /// fresh mapping of the peer's file (the caller keeps it alive). Its size must match.
    fn map_region(&self, rank: Rank, desc: &[u8]) -> FabricResult<(u32, Arc<Mapping>)> {
        if desc.len() != 12 || rank >= self.size {
            return Err(FabricError::Malformed {
                what: format!("region descriptor of {} bytes for rank {rank}", desc.len()),
            });
        }
        let id = u32::from_le_bytes(desc[..4].try_into().unwrap_or_default());
        let len = u64::from_le_bytes(desc[4..].try_into().unwrap_or_default()) as usize;
        if rank == self.rank {
            return match self.local_map(id) {
                Some(m) if m.len() == len => Ok((id, m)),
                _ => Err(FabricError::Malformed { what: format!("no local region {id} of {len} bytes") }),
            };
        }
        let name = region_name(&self.job, rank, id);
        let map = os::open_shared(&name)?.ok_or_else(|| FabricError::Peer {
            rank,
            reason: format!("has not published region {id} ({name})"),
        })?;
        if map.len() != len {
            return Err(FabricError::Mismatch {
                what: format!("{name} is {} bytes, descriptor says {len}", map.len()),
            });
        }
        Ok((id, Arc::new(map)))
    }
}

/// Wakes the owner of control block `c` if one of its threads sleeps (see
/// `ShmFabric::ring_doorbell`).
fn ring_doorbell(c: &Control) {
    if c.sleepers.load(Ordering::Relaxed) != 0 {
        c.doorbell.fetch_add(1, Ordering::Release);
        os::futex_wake_all(&c.doorbell);
    }
}

#[cold]
fn no_such_rank(rank: Rank, size: u32) -> FabricError {
    FabricError::Peer { rank, reason: format!("does not exist (job of {size})") }
}

fn remote_ptr(region: &RemoteRegion, offset: usize, len: usize) -> FabricResult<*mut u8> {
    region.check(offset, len)?;
    Ok((region.addr as usize + offset) as *mut u8)
}

/// The `u64` at `offset` of a peer's mapping, bounds- and alignment-checked, for atomic access.
fn remote_word(region: &RemoteRegion, offset: usize) -> FabricResult<&AtomicU64> {
    let p = remote_ptr(region, offset, 8)?;
    if !(p as usize).is_multiple_of(8) {
        return Err(FabricError::Malformed {
            what: format!("atomic at offset {offset}: not 8-byte aligned"),
        });
    }
    // SAFETY: p is 8-aligned and inside the live shared mapping the region names (bounds
    // checked; the fabric keeps peer mappings while regions naming them are in use); every
    // access to remote words goes through atomic instructions, coherent across processes.
    Ok(unsafe { &*(p as *const AtomicU64) })
}

/// A put on shared memory: a bounds-checked copy into the peer's mapping.
fn put_bytes(dst: &RemoteRegion, offset: usize, src: &[u8]) -> FabricResult<()> {
    let p = remote_ptr(dst, offset, src.len())?;
    // SAFETY: p..p+len lies in a live mapping of dst (bounds checked) and src is a live
    // slice. The ranges may overlap only for a put from a segment into itself, so use the
    // overlap-safe copy.
    unsafe { crate::copy::copy_bytes(src.as_ptr(), p, src.len()) };
    fence(Ordering::Release);
    Ok(())
}

/// The ring body for `msg` to `dst`, after checking its size; a long AM's payload is written
/// into the target's region here, before the header is sent.
fn body_for<'a>(dst: Rank, msg: &AmOut<'a>, max_medium: usize) -> FabricResult<Body<'a>> {
    Ok(match msg.payload {
        AmPayload::Short => Body::Short,
        AmPayload::Medium(p) => {
            crate::types::check_medium(p, max_medium)?;
            Body::Medium(p)
        }
        AmPayload::Long { region, offset, data } => {
            if region.rank != dst {
                return Err(FabricError::Malformed {
                    what: format!("long AM to rank {dst} targets rank {}'s memory", region.rank),
                });
            }
            put_bytes(region, offset, data)?;
            Body::Long { region: region.id, offset: offset as u64, len: data.len() as u64 }
        }
    })
}

/// Largest medium payload a ring of `slots` slots carries.
fn max_medium_for(slots: usize) -> usize {
    MAX_MEDIUM.min(slots / 4 * ring::SLOT - ring::HEADER - 8 * crate::AM_MAX_ARGS)
}

/// Ring slots for a ring of about `ring_bytes` bytes: a power of two (positions map to slots
/// with a mask), at least 64.
fn ring_slots(ring_bytes: usize) -> usize {
    let slots = (ring_bytes / ring::SLOT).max(64);
    1usize << slots.ilog2()
}

impl Fabric for ShmFabric {
    fn name(&self) -> &'static str {
        "shm"
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
            atomics: true,
            load_store: true,
            am_max_args: crate::AM_MAX_ARGS,
            am_max_medium: self.max_medium,
            am_max_long: usize::MAX,
            peer_read: true,
            target_progress: false,
        }
    }

    fn adopt_program_data(&self) -> FabricResult<LocalRegion> {
        self.adopt_data()
    }

    fn register(&self, len: usize) -> FabricResult<LocalRegion> {
        self.register_with(len, os::Fill::Reserved)
    }

    fn register_sparse(&self, len: usize) -> FabricResult<LocalRegion> {
        self.register_with(len, os::Fill::Sparse)
    }

    fn attach(&self, rank: Rank, desc: &[u8]) -> FabricResult<RemoteRegion> {
        let (id, map) = self.map_region(rank, desc)?;
        let (len, addr) = (map.len(), map.as_ptr() as u64);
        if rank != self.rank {
            self.remote_maps.lock().unwrap_or_else(|e| e.into_inner()).push(map);
        }
        Ok(RemoteRegion { rank, id, len, addr, key: 0 })
    }

    fn seal(&self, region: &LocalRegion) -> FabricResult<()> {
        os::unlink(&region_name(&self.job, self.rank, region.id));
        Ok(())
    }

    fn put(&self, dst: &RemoteRegion, offset: usize, src: &[u8], _token: u64) -> FabricResult<Issued> {
        put_bytes(dst, offset, src)?;
        Ok(Issued::Done(0))
    }

    fn put_signal(
        &self,
        dst: &RemoteRegion,
        offset: usize,
        src: &[u8],
        sig: &RemoteRegion,
        sig_offset: usize,
        value: u64,
    ) -> FabricResult<()> {
        crate::types::check_signal_rank(dst, sig)?;
        // Both checked before anything is written.
        let flag = remote_word(sig, sig_offset)?;
        put_bytes(dst, offset, src)?;
        // Release: the data is visible before the signal to whoever reads it with Acquire.
        flag.store(value, Ordering::Release);
        Ok(())
    }

    fn put_from(
        &self,
        dst: &RemoteRegion,
        dst_offset: usize,
        src: &RemoteRegion,
        src_offset: usize,
        len: usize,
        _token: u64,
    ) -> FabricResult<Issued> {
        if src.rank != self.rank {
            return Err(FabricError::Malformed {
                what: format!("put source in rank {}'s memory, not this rank's ({})", src.rank, self.rank),
            });
        }
        let from = remote_ptr(src, src_offset, len)?;
        let to = remote_ptr(dst, dst_offset, len)?;
        // SAFETY: both ranges lie in live mappings (bounds checked above); they may overlap
        // (a region copied into itself), which the overlap-safe copy handles.
        unsafe { crate::copy::copy_bytes(from, to, len) };
        fence(Ordering::Release);
        Ok(Issued::Done(0))
    }

    fn get(&self, src: &RemoteRegion, offset: usize, dst: &mut [u8]) -> FabricResult<()> {
        let p = remote_ptr(src, offset, dst.len())?;
        fence(Ordering::Acquire);
        // SAFETY: p..p+len lies in a live mapping (bounds checked); dst is a live exclusive slice.
        unsafe { crate::copy::copy_bytes(p, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn atomic(&self, dst: &RemoteRegion, offset: usize, op: AtomicOp, _token: u64) -> FabricResult<Issued> {
        Ok(Issued::Done(op.apply(remote_word(dst, offset)?)))
    }

    fn mapped_words<'a>(&'a self, region: &'a RemoteRegion) -> Option<&'a [AtomicU64]> {
        if !(region.addr as usize).is_multiple_of(8) {
            return None;
        }
        // SAFETY: a region of this fabric is a live shared mapping of `len` bytes at `addr`
        // (kept while regions naming it are in use, as for `remote_word`), 8-aligned
        // (checked); AtomicU64 has u64's layout and every access through it is atomic, so
        // the owner's and other ranks' concurrent accesses are no data race.
        Some(unsafe { std::slice::from_raw_parts(region.addr as *const AtomicU64, region.len / 8) })
    }

    fn quiet(&self) -> FabricResult<()> {
        // Every shared-memory operation completes before it returns.
        crate::order::full_fence();
        Ok(())
    }

    fn read_peer(&self, rank: Rank, addr: u64, dst: &mut [u8]) -> FabricResult<()> {
        if rank >= self.size {
            return Err(no_such_rank(rank, self.size));
        }
        os::read_process(self.control(rank).pid(), addr, dst)
    }

    fn am_try_send(&self, dst: Rank, msg: &AmOut<'_>) -> FabricResult<bool> {
        let Some(rings) = self.senders.get(dst as usize) else {
            return Err(no_such_rank(dst, self.size));
        };
        let body = body_for(dst, msg, self.max_medium)?;
        let sent = {
            let mut ring = rings[class_index(msg.class)].lock(&self.bias);
            let sent = ring.try_send(msg.handler, msg.args, body)?;
            if sent && msg.class == AmClass::Request {
                // Under the ring's lock: the one writer.
                crate::counts::add_single(&self.counts.sent[dst as usize], 1);
            }
            sent
        };
        if sent {
            self.ring_doorbell(dst);
        }
        Ok(sent)
    }

    fn progress(&self, sink: &dyn EventSink, set: PollSet) -> FabricResult<usize> {
        // Replies first: they complete what this rank waits on. A call that delivered some
        // returns at once, so the waiter sees its reply without first polling every request
        // ring (an empty AM round trip 206 -> 201 ns); requests wait for the next call, which
        // a waiter makes at once if its reply was not among them. Replies only answer this
        // rank's own requests, so they cannot keep the requests waiting for ever.
        let mut delivered = self.drain_class(AmClass::Reply, sink)?;
        if set == PollSet::All && delivered == 0 {
            delivered += self.drain_class(AmClass::Request, sink)?;
            let bell = self.control(self.rank).slot_bell();
            delivered +=
                self.slot_rx.poll(bell, |inbound, src| self.drain(inbound, src, AmClass::Request, sink))?;
        }
        Ok(delivered)
    }

    fn open_slot_inbox(&self, slots: &[u32], ring_bytes: usize) -> FabricResult<LocalRegion> {
        let total = slots::total_rings(slots, self.size)?;
        let depth = ring_slots(ring_bytes);
        let mut region = self.register(slots::inbox_bytes(total, depth))?;
        let map = self.local_map(region.id).ok_or(FabricError::Unsupported { what: "lost local region" })?;
        slots::add_inbox(&self.slot_rx, region.id, map, slots, depth)?;
        region.desc = slots::inbox_desc(&region.desc, depth);
        Ok(region)
    }

    fn close_slot_inbox(&self, region: &LocalRegion) -> FabricResult<bool> {
        if !self.slot_rx.remove(region.id, &self.bias)? {
            return Ok(false);
        }
        // Nothing polls it any more.
        self.deregister(region);
        Ok(true)
    }

    fn deregister(&self, region: &LocalRegion) {
        let mut regions = self.local_regions.write().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = regions.get_mut(region.id as usize) {
            *r = None;
        }
    }

    fn open_tx_slots(
        &self,
        inboxes: &[Vec<u8>],
        slots: &[u32],
        first: u32,
        count: u32,
    ) -> FabricResult<Vec<Box<dyn TxSlot>>> {
        let total = slots::total_rings(slots, self.size)?;
        let mine = slots[self.rank as usize];
        if inboxes.len() != self.size as usize || first.checked_add(count).is_none_or(|end| end > mine) {
            return Err(FabricError::Mismatch {
                what: format!("slots {first}+{count} of {mine}, {} inbox descriptors", inboxes.len()),
            });
        }
        let base: usize = slots[..self.rank as usize].iter().map(|&s| s as usize).sum();
        let mut maps = Vec::with_capacity(inboxes.len());
        for (r, d) in inboxes.iter().enumerate() {
            let r = r as Rank;
            let (region, depth) = slots::split_desc(r, d)?;
            // Peers' inboxes are held by the slots only, so closing them unmaps them.
            let (_, map) = self.map_region(r, region)?;
            if map.len() != slots::inbox_bytes(total, depth) {
                return Err(FabricError::Mismatch {
                    what: format!(
                        "rank {r}'s slot inbox is {} bytes, expected {}",
                        map.len(),
                        slots::inbox_bytes(total, depth)
                    ),
                });
            }
            maps.push((map, depth));
        }
        (first..first + count)
            .map(|j| {
                let rings = maps.iter().map(|(m, d)| (m.clone(), *d, base + j as usize)).collect();
                let sent = self.counts.slot();
                Ok(Box::new(slots::ShmTxSlot::new(self.inboxes.clone(), rings, sent)?) as Box<dyn TxSlot>)
            })
            .collect()
    }

    fn has_incoming(&self) -> bool {
        self.receivers.iter().flatten().any(Inbound::ready)
            || self.slot_rx.with(false, |l| l.iter().any(|(_, i)| i.rings.iter().any(|(_, r)| r.ready())))
    }

    fn notify(&self, rank: Rank) {
        self.ring_doorbell(rank);
    }

    fn wait_incoming(&self, timeout: Duration, ready: &mut dyn FnMut() -> bool) -> bool {
        let seen = self.sleep_begin();
        let ready = ready();
        if !ready && !self.has_incoming() {
            self.sleep(seen, timeout);
        }
        self.sleep_end();
        ready || self.has_incoming()
    }

    fn requests_sent(&self, dst: Rank) -> u64 {
        self.counts.sent_to(dst)
    }

    fn requests_handled(&self, src: Rank) -> u64 {
        let Some(rings) = self.receivers.get(src as usize) else { return 0 };
        rings[class_index(AmClass::Request)].handled() + self.slot_rx.handled_from(src)
    }

    fn borrow_fast_path(&self) -> bool {
        self.bias.borrow()
    }

    fn return_fast_path(&self) {
        self.bias.give_back()
    }

    fn check_claim(&self) -> FabricResult<()> {
        self.claim.check()
    }

    fn set_alarm(&self, alarm: crate::Alarm) {
        self.claim.set_alarm(alarm);
    }

    fn peer_state(&self, rank: Rank) -> PeerState {
        let c = self.control(rank);
        match c.state.load(Ordering::Acquire) {
            s if s == State::Finalized as u32 => PeerState::Finalized,
            _ => {
                let pid = c.pid();
                if os::process_alive(pid) {
                    return PeerState::Running;
                }
                if !self.buried[rank as usize].swap(true, Ordering::AcqRel) {
                    self.bury(rank);
                }
                PeerState::Dead(format!("process {pid} is gone"))
            }
        }
    }

    fn peer_drained(&self, rank: Rank) -> bool {
        // Holding the consumer lock proves no other thread is mid-delivery.
        let drained = |r: &Inbound| r.rx.try_lock(&self.bias).is_some_and(|rx| !rx.ready());
        self.receivers.get(rank as usize).is_none_or(|rings| rings.iter().all(drained))
            && self.slot_rx.with(true, |l| {
                l.iter().all(|(_, i)| i.rings.iter().filter(|(s, _)| *s == rank).all(|(_, r)| drained(r)))
            })
    }

    fn finalize(&self) {
        // SeqCst store, then SeqCst loads below: of ranks finalizing at once, at least one
        // sees all the others finalized.
        self.control(self.rank).state.store(State::Finalized as u32, Ordering::SeqCst);
        // Wake any peer sleeping on us so it notices promptly.
        for r in 0..self.size {
            let c = self.control(r);
            c.doorbell.fetch_add(1, Ordering::Release);
            os::futex_wake_all(&c.doorbell);
        }
        // The last rank to finalize removes the job's directory: nobody makes a region in it
        // any more, and sealed regions and inboxes are unlinked already (a rank that lives
        // on after finalizing, as an OpenSHMEM program does, never drops its fabric; under
        // mpirun or srun nothing else would remove it). rmdir fails on a non-empty one.
        let finalized = State::Finalized as u32;
        if (0..self.size).all(|r| self.control(r).state.load(Ordering::SeqCst) == finalized) {
            os::remove_dir(&job_dir(&self.job));
        }
    }

    fn abandon(&self) {
        // A child of `fork` is no rank: what it does on its way out is not the job's end.
        if os::pid() != self.control(self.rank).pid() {
            return;
        }
        os::remove_dir(&job_dir(&self.job));
    }

    fn shm_in_memory(&self) -> Option<u64> {
        let regions = self.local_regions.read().unwrap_or_else(|e| e.into_inner());
        let inbox = self.inboxes.get(self.rank as usize).map_or(0, |m| m.resident_bytes());
        Some(inbox + regions.iter().flatten().map(|m| m.resident_bytes()).sum::<u64>())
    }

    fn resources(&self) -> Vec<Resource> {
        let rb = ring::ring_bytes(self.slots) as u64;
        let n = self.size as u64;
        let regions = self.local_regions.read().unwrap_or_else(|e| e.into_inner());
        let local: Vec<_> = regions.iter().flatten().collect();
        let remote = self.remote_maps.lock().unwrap_or_else(|e| e.into_inner());
        vec![
            Resource {
                kind: "inbox control blocks (doorbell, state)".into(),
                count: 1,
                bytes: control::CONTROL_BYTES as u64,
            },
            Resource {
                kind: format!("AM request rings in, {} slots of 64 B each", self.slots),
                count: n,
                bytes: n * rb,
            },
            Resource {
                kind: format!("AM reply rings in, {} slots of 64 B each", self.slots),
                count: n,
                bytes: n * rb,
            },
            Resource {
                kind: "peer inboxes mapped (outgoing rings)".into(),
                count: n - 1,
                bytes: (n - 1) * self.inbox_bytes as u64,
            },
            Resource {
                kind: "endpoint slot rings in (also counted in local regions)".into(),
                count: self.slot_rx.with(0, |l| l.iter().map(|(_, i)| i.rings.len() as u64).sum()),
                bytes: self.slot_rx.with(0, |l| l.iter().map(|(_, i)| i.bytes).sum()),
            },
            Resource {
                kind: if self.bias.holds() {
                    "ring-end locks, biased: one thread uses them, plain stores".into()
                } else {
                    "ring-end locks, shared by threads: compare-and-swap".into()
                },
                count: 4 * n,
                bytes: 0,
            },
            Resource {
                kind: "registered regions (local)".into(),
                count: local.len() as u64,
                bytes: local.iter().map(|m| m.len() as u64).sum(),
            },
            Resource {
                kind: "peer regions mapped".into(),
                count: remote.len() as u64,
                bytes: remote.iter().map(|m| m.len() as u64).sum(),
            },
        ]
    }
}

impl Drop for ShmFabric {
    fn drop(&mut self) {
        self.finalize();
        // Nothing of ours may stay in /dev/shm, whatever happened during start-up.
        os::unlink(&inbox_name(&self.job, self.rank));
        let n = self.next_region.load(Ordering::Relaxed);
        for id in 0..n {
            os::unlink(&region_name(&self.job, self.rank, id));
        }
        // Empty once every rank has left: the last one removes it.
        os::remove_dir(&job_dir(&self.job));
    }
}
