//! The hybrid fabric: shared memory to the ranks of this host, libfabric to the others,
//! chosen per peer (what GASNet's PSHM does inside a network conduit).
//!
//! It owns one [`ShmFabric`] over the ranks of this host (their *local* ranks numbered in
//! global rank order) and one [`OfiFabric`] over the whole job, and routes every operation by
//! its peer. The two meet in four places:
//! - **Memory.** A region is a shared-memory file registered with libfabric as well, under
//!   the same id, so a neighbour maps it and a remote rank reaches it through its key. Its
//!   descriptor carries both descriptors.
//! - **Ranks.** What the shared-memory fabric delivers names local ranks; the hybrid turns
//!   them into global ranks before the runtime sees them.
//! - **Atomics.** Neighbours use CPU atomics on the shared mapping; a NIC's atomics would not
//!   be atomic with respect to those, so atomics to other hosts go through AMs that the target
//!   runs with the same CPU instructions ([`Fabric::native_atomics_to`]).
//! - **Sleeping.** A waiting thread sleeps on this rank's shared-memory doorbell; a watcher
//!   thread sleeps on libfabric's completion descriptor while anyone sleeps and rings the
//!   doorbell when the network has something. Nothing polls while idle.
//!
//! Endpoint transmit slots ([`slots`]) pair a shared-memory slot (rings to this host's
//! ranks) with a libfabric slot (an endpoint to the other hosts), and each operation takes
//! the one its destination's route names.

use crate::ofi::OfiFabric;
use crate::read::{ReadDst, ReadScope};
use crate::shm::{ShmConfig, ShmFabric};
use crate::{
    AmIn, AmOut, AmPayload, AtomicOp, Caps, EventSink, Exposure, Fabric, FabricError, FabricResult,
    FabricStats, GetIssued, Issued, LocalRegion, PeerState, PollSet, Rank, RemoteRegion, Resource,
};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

mod slots;

/// How a peer is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// Through shared memory, as this local rank.
    Shm(Rank),
    /// Through libfabric.
    Ofi,
}

/// Who sleeps in `wait_incoming`, for the watcher.
#[derive(Default)]
struct Sleepers {
    count: u32,
    /// Sleeps ended so far: the watcher waits for it to move after ringing.
    ended: u64,
    stop: bool,
}

struct Parts {
    me: Rank,
    /// This rank among the ranks of its host.
    local_me: Rank,
    size: u32,
    route: Vec<Route>,
    /// Global rank of each local rank.
    global: Vec<Rank>,
    shm: ShmFabric,
    ofi: OfiFabric,
    sleepers: Mutex<Sleepers>,
    changed: Condvar,
    /// Endpoint slot inboxes open on this rank, each a pair of the two fabrics' own.
    slot_inboxes: Mutex<Vec<slots::Inbox>>,
}

/// Shared memory to this host's ranks, libfabric to the others (see the module documentation).
pub struct HybridFabric {
    parts: Arc<Parts>,
    watcher: Option<JoinHandle<()>>,
}

/// Settings of the shared-memory side.
#[derive(Clone, Debug)]
pub struct HybridConfig {
    /// Job id, unique on the host.
    pub job: String,
    /// Size of the AM rings between neighbours.
    pub rings: crate::RingSize,
    /// How long start-up waits for the neighbours.
    pub init_timeout: Duration,
}

/// Length-prefixed pair of descriptors (shared memory, libfabric).
fn join_desc(shm: &[u8], ofi: &[u8]) -> Vec<u8> {
    let mut d = (shm.len() as u32).to_le_bytes().to_vec();
    d.extend_from_slice(shm);
    d.extend_from_slice(ofi);
    d
}

fn split_desc(desc: &[u8]) -> FabricResult<(&[u8], &[u8])> {
    let bad = || FabricError::Malformed { what: format!("hybrid region descriptor of {} bytes", desc.len()) };
    let n = u32::from_le_bytes(desc.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?) as usize;
    let end = n.checked_add(4).filter(|&e| e <= desc.len()).ok_or_else(bad)?;
    Ok((&desc[4..end], &desc[end..]))
}

/// `region` as the shared-memory fabric names it: owned by local rank `local`.
fn as_local(region: &RemoteRegion, local: Rank) -> RemoteRegion {
    RemoteRegion { rank: local, ..*region }
}

/// Sends `msg` by its destination's route: through `near` to a local rank (a long AM's
/// region renamed for the shared-memory fabric) or through `far`.
fn send_routed<R>(
    route: Route,
    msg: &AmOut<'_>,
    near: impl FnOnce(Rank, &AmOut<'_>) -> R,
    far: impl FnOnce(&AmOut<'_>) -> R,
) -> R {
    match route {
        Route::Shm(l) => match msg.payload {
            AmPayload::Long { region, offset, data } => {
                let region = as_local(region, l);
                near(l, &AmOut { payload: AmPayload::Long { region: &region, offset, data }, ..*msg })
            }
            _ => near(l, msg),
        },
        Route::Ofi => far(msg),
    }
}

/// Hands what the shared-memory fabric delivers on, with global ranks.
struct ToGlobal<'a> {
    sink: &'a dyn EventSink,
    global: &'a [Rank],
}

impl EventSink for ToGlobal<'_> {
    fn on_am(&self, am: AmIn<'_>) {
        let src = self.global.get(am.src as usize).copied().unwrap_or(Rank::MAX);
        self.sink.on_am(AmIn { src, ..am });
    }
    fn on_complete(&self, token: u64, value: u64, result: FabricResult<()>) {
        self.sink.on_complete(token, value, result);
    }
}

impl HybridFabric {
    /// Registers shared-memory region `s` of `len` bytes with libfabric too.
    fn also_ofi(&self, s: LocalRegion, len: usize) -> FabricResult<LocalRegion> {
        let p = &self.parts;
        let o = match p.ofi.register_mapping(s.id, s.mapping().clone(), len) {
            Ok(o) => o,
            Err(e) => {
                p.shm.deregister(&s);
                return Err(e);
            }
        };
        let discard = s.discardable() && o.discardable();
        Ok(LocalRegion::new(s.id, s.mapping().clone(), join_desc(&s.desc, &o.desc)).with_discard(discard))
    }

    /// Builds the hybrid over an opened libfabric fabric: meets this host's ranks in shared
    /// memory. Every rank of the job calls it (each host's ranks form one shared-memory group).
    pub fn init(mut ofi: OfiFabric, cfg: HybridConfig) -> FabricResult<Self> {
        let (me, size) = (ofi.rank(), ofi.size());
        let global = ofi.same_host_ranks();
        let local = global.iter().position(|&r| r == me).ok_or_else(|| FabricError::Mismatch {
            what: format!("rank {me} is missing from its own host's ranks"),
        })? as Rank;
        // Ranks in different network namespaces of one machine share /dev/shm: the group's
        // first rank tells the groups' files apart.
        let shm = ShmFabric::init(ShmConfig {
            job: format!("{}-h{}", cfg.job, global[0]),
            rank: local,
            size: global.len() as u32,
            rings: cfg.rings,
            init_timeout: cfg.init_timeout,
        })?;
        ofi.leave_same_host_peers();
        let mut route = vec![Route::Ofi; size as usize];
        for (l, &g) in global.iter().enumerate() {
            route[g as usize] = Route::Shm(l as Rank);
        }
        let parts = Arc::new(Parts {
            me,
            local_me: local,
            size,
            route,
            global,
            shm,
            ofi,
            sleepers: Mutex::new(Sleepers::default()),
            changed: Condvar::new(),
            slot_inboxes: Mutex::default(),
        });
        let p = parts.clone();
        let watcher = crate::signals::spawn_quiet(
            std::thread::Builder::new().name("weft-net-watch".into()),
            move || p.watch(),
        )
        .map_err(|e| FabricError::Os { what: format!("network watcher thread: {e}"), errno: 0 })?;
        Ok(HybridFabric { parts, watcher: Some(watcher) })
    }

    /// The libfabric side (for its provider name).
    pub fn network(&self) -> &OfiFabric {
        &self.parts.ofi
    }

    fn route(&self, rank: Rank) -> FabricResult<Route> {
        self.parts.route(rank)
    }
}

impl Parts {
    fn route(&self, rank: Rank) -> FabricResult<Route> {
        self.route.get(rank as usize).copied().ok_or_else(|| FabricError::Peer {
            rank,
            reason: format!("does not exist (job of {})", self.size),
        })
    }

    fn sleepers(&self) -> std::sync::MutexGuard<'_, Sleepers> {
        self.sleepers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The watcher: while a thread sleeps on the doorbell, sleep on the network's completion
    /// descriptor and ring the doorbell when it fires.
    fn watch(&self) {
        loop {
            let mut s = self.sleepers();
            while s.count == 0 && !s.stop {
                s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            if s.stop {
                return;
            }
            let ended = s.ended;
            drop(s);
            let ready = match self.ofi.wait_ready(Duration::from_millis(50)) {
                Some(r) => r,
                // No descriptor to sleep on: look again soon.
                None => {
                    std::thread::sleep(Duration::from_micros(200));
                    true
                }
            };
            if ready {
                self.shm.notify(self.local_me);
                // Give the woken thread time to read the queue before looking again.
                let s = self.sleepers();
                let _ = self
                    .changed
                    .wait_timeout_while(s, Duration::from_millis(2), |s| s.ended == ended && !s.stop);
            }
        }
    }
}

impl Drop for HybridFabric {
    fn drop(&mut self) {
        self.parts.sleepers().stop = true;
        self.parts.changed.notify_all();
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
    }
}

impl Fabric for HybridFabric {
    fn name(&self) -> &'static str {
        "ofi+shm"
    }
    fn rank(&self) -> Rank {
        self.parts.me
    }
    fn size(&self) -> u32 {
        self.parts.size
    }
    fn caps(&self) -> Caps {
        let (s, o) = (self.parts.shm.caps(), self.parts.ofi.caps());
        Caps {
            rma: s.rma && o.rma,
            // Neighbours' atomics are native; the others' go through AMs (native_atomics_to).
            atomics: s.atomics,
            load_store: false,
            am_max_args: s.am_max_args.min(o.am_max_args),
            am_max_medium: s.am_max_medium.min(o.am_max_medium),
            am_max_long: s.am_max_long.min(o.am_max_long),
            peer_read: false,
            target_progress: o.target_progress,
        }
    }

    fn native_atomics_to(&self, rank: Rank) -> bool {
        matches!(self.route(rank), Ok(Route::Shm(_)))
    }

    fn gets_at_once(&self, rank: Rank) -> bool {
        matches!(self.route(rank), Ok(Route::Shm(_)))
    }

    fn maps_peer(&self, rank: Rank) -> bool {
        matches!(self.route(rank), Ok(Route::Shm(_)))
    }

    fn register(&self, len: usize) -> FabricResult<LocalRegion> {
        let s = self.parts.shm.register(len)?;
        self.also_ofi(s, len)
    }

    fn register_sparse(&self, len: usize) -> FabricResult<LocalRegion> {
        let s = self.parts.shm.register_sparse(len)?;
        self.also_ofi(s, len)
    }

    fn adopt_program_data(&self) -> FabricResult<LocalRegion> {
        let s = self.parts.shm.adopt_program_data()?;
        let len = s.len;
        self.also_ofi(s, len)
    }

    fn deregister(&self, region: &LocalRegion) {
        self.parts.ofi.deregister(region);
        self.parts.shm.deregister(region);
    }

    fn attach(&self, rank: Rank, desc: &[u8]) -> FabricResult<RemoteRegion> {
        let (s, o) = split_desc(desc)?;
        match self.route(rank)? {
            Route::Shm(l) => self.parts.shm.attach(l, s).map(|r| RemoteRegion { rank, ..r }),
            Route::Ofi => self.parts.ofi.attach(rank, o),
        }
    }

    fn seal(&self, region: &LocalRegion) -> FabricResult<()> {
        self.parts.shm.seal(region)?;
        self.parts.ofi.seal(region)
    }

    fn put(&self, dst: &RemoteRegion, offset: usize, src: &[u8], token: u64) -> FabricResult<Issued> {
        match self.route(dst.rank)? {
            Route::Shm(l) => self.parts.shm.put(&as_local(dst, l), offset, src, token),
            Route::Ofi => self.parts.ofi.put(dst, offset, src, token),
        }
    }

    fn get(&self, src: &RemoteRegion, offset: usize, dst: &mut [u8]) -> FabricResult<()> {
        match self.route(src.rank)? {
            Route::Shm(l) => self.parts.shm.get(&as_local(src, l), offset, dst),
            Route::Ofi => self.parts.ofi.get(src, offset, dst),
        }
    }

    fn get_nb(
        &self,
        src: &RemoteRegion,
        offset: usize,
        dst: &mut [u8],
        token: u64,
    ) -> FabricResult<GetIssued> {
        match self.route(src.rank)? {
            Route::Shm(l) => self.parts.shm.get_nb(&as_local(src, l), offset, dst, token),
            Route::Ofi => self.parts.ofi.get_nb(src, offset, dst, token),
        }
    }

    fn get_into(
        &self,
        src: &RemoteRegion,
        offset: usize,
        dst: ReadDst<'_>,
        token: u64,
    ) -> FabricResult<Issued> {
        match self.route(src.rank)? {
            Route::Shm(l) => self.parts.shm.get_into(&as_local(src, l), offset, dst, token),
            Route::Ofi => self.parts.ofi.get_into(src, offset, dst, token),
        }
    }

    fn wait_reads(&self, scope: &ReadScope<'_>) {
        // Only libfabric's reads complete later.
        self.parts.ofi.wait_reads(scope)
    }

    fn mapped_words<'a>(&'a self, region: &'a RemoteRegion) -> Option<&'a [std::sync::atomic::AtomicU64]> {
        match self.route(region.rank).ok()? {
            Route::Shm(_) => self.parts.shm.mapped_words(region),
            Route::Ofi => None,
        }
    }

    fn atomic(&self, dst: &RemoteRegion, offset: usize, op: AtomicOp, token: u64) -> FabricResult<Issued> {
        match self.route(dst.rank)? {
            Route::Shm(l) => self.parts.shm.atomic(&as_local(dst, l), offset, op, token),
            Route::Ofi => self.parts.ofi.atomic(dst, offset, op, token),
        }
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
        let p = &self.parts;
        match self.route(dst.rank)? {
            Route::Shm(l) => p.shm.put_from(
                &as_local(dst, l),
                dst_offset,
                &as_local(src, p.local_me),
                src_offset,
                len,
                token,
            ),
            Route::Ofi => p.ofi.put_from(dst, dst_offset, src, src_offset, len, token),
        }
    }

    fn quiet(&self) -> FabricResult<()> {
        self.parts.shm.quiet()?;
        self.parts.ofi.quiet()
    }

    fn read_peer(&self, rank: Rank, addr: u64, dst: &mut [u8]) -> FabricResult<()> {
        match self.route(rank)? {
            Route::Shm(l) => self.parts.shm.read_peer(l, addr, dst),
            Route::Ofi => self.parts.ofi.read_peer(rank, addr, dst),
        }
    }

    fn expose(&self, rank: Rank, addr: usize, len: usize) -> FabricResult<Exposure> {
        match self.route(rank)? {
            Route::Shm(l) => self.parts.shm.expose(l, addr, len),
            Route::Ofi => self.parts.ofi.expose(rank, addr, len),
        }
    }

    fn read_exposed(&self, rank: Rank, addr: u64, key: u64, dst: &mut [u8]) -> FabricResult<()> {
        match self.route(rank)? {
            Route::Shm(_) => Err(FabricError::Malformed {
                what: format!("a registered chunk from rank {rank}, which this rank reads in place"),
            }),
            Route::Ofi => self.parts.ofi.read_exposed(rank, addr, key, dst),
        }
    }

    fn stats(&self) -> FabricStats {
        self.parts.ofi.stats()
    }

    fn am_try_send(&self, dst: Rank, msg: &AmOut<'_>) -> FabricResult<bool> {
        let p = &self.parts;
        send_routed(p.route(dst)?, msg, |l, m| p.shm.am_try_send(l, m), |m| p.ofi.am_try_send(dst, m))
    }

    fn open_slot_inbox(&self, slots: &[u32], ring_bytes: usize) -> FabricResult<LocalRegion> {
        slots::open_inbox(&self.parts, slots, ring_bytes)
    }

    fn close_slot_inbox(&self, region: &LocalRegion) -> FabricResult<bool> {
        slots::close_inbox(&self.parts, region)
    }

    fn open_tx_slots(
        &self,
        inboxes: &[Vec<u8>],
        slots: &[u32],
        first: u32,
        count: u32,
    ) -> FabricResult<Vec<Box<dyn crate::TxSlot>>> {
        slots::open_tx(&self.parts, inboxes, slots, first, count)
    }

    fn progress(&self, sink: &dyn EventSink, set: PollSet) -> FabricResult<usize> {
        let p = &self.parts;
        let near = p.shm.progress(&ToGlobal { sink, global: &p.global }, set)?;
        Ok(near + p.ofi.progress(sink, set)?)
    }

    fn has_incoming(&self) -> bool {
        self.parts.shm.has_incoming() || self.parts.ofi.has_incoming()
    }

    fn wait_incoming(&self, timeout: Duration, ready: &mut dyn FnMut() -> bool) -> bool {
        let p = &self.parts;
        let seen = p.shm.sleep_begin();
        p.sleepers().count += 1;
        p.changed.notify_all();
        let ready = ready();
        if !ready && !self.has_incoming() {
            p.shm.sleep(seen, timeout);
        }
        {
            let mut s = p.sleepers();
            s.count -= 1;
            s.ended += 1;
        }
        p.changed.notify_all();
        p.shm.sleep_end();
        ready || self.has_incoming()
    }

    fn notify(&self, rank: Rank) {
        match self.route(rank) {
            Ok(Route::Shm(l)) => self.parts.shm.notify(l),
            Ok(Route::Ofi) => self.parts.ofi.notify(rank),
            Err(_) => {}
        }
    }

    fn requests_sent(&self, dst: Rank) -> u64 {
        match self.route(dst) {
            Ok(Route::Shm(l)) => self.parts.shm.requests_sent(l),
            Ok(Route::Ofi) => self.parts.ofi.requests_sent(dst),
            Err(_) => 0,
        }
    }

    fn requests_handled(&self, src: Rank) -> u64 {
        match self.route(src) {
            Ok(Route::Shm(l)) => self.parts.shm.requests_handled(l),
            Ok(Route::Ofi) => self.parts.ofi.requests_handled(src),
            Err(_) => 0,
        }
    }

    fn borrow_fast_path(&self) -> bool {
        self.parts.shm.borrow_fast_path()
    }

    fn return_fast_path(&self) {
        self.parts.shm.return_fast_path()
    }

    fn check_claim(&self) -> FabricResult<()> {
        self.parts.shm.check_claim()
    }

    fn set_alarm(&self, alarm: crate::Alarm) {
        self.parts.shm.set_alarm(alarm);
    }

    fn peer_state(&self, rank: Rank) -> PeerState {
        match self.route(rank) {
            Ok(Route::Shm(l)) => self.parts.shm.peer_state(l),
            Ok(Route::Ofi) => self.parts.ofi.peer_state(rank),
            Err(e) => PeerState::Dead(e.to_string()),
        }
    }

    fn peer_drained(&self, rank: Rank) -> bool {
        match self.route(rank) {
            Ok(Route::Shm(l)) => self.parts.shm.peer_drained(l),
            Ok(Route::Ofi) => self.parts.ofi.peer_drained(rank),
            Err(_) => true,
        }
    }

    fn finalize(&self) {
        self.parts.shm.finalize();
        self.parts.ofi.finalize();
    }

    fn abandon(&self) {
        self.parts.shm.abandon();
    }

    fn shm_in_memory(&self) -> Option<u64> {
        self.parts.shm.shm_in_memory()
    }

    fn resources(&self) -> Vec<Resource> {
        let p = &self.parts;
        let tagged = |tag: &str, v: Vec<Resource>| {
            v.into_iter().map(|r| Resource { kind: format!("{tag}: {}", r.kind), ..r }).collect::<Vec<_>>()
        };
        let mut v = vec![Resource {
            kind: format!(
                "ranks on this host through shared memory (the other {} through libfabric)",
                p.size as usize - p.global.len()
            ),
            count: p.global.len() as u64,
            bytes: 0,
        }];
        v.extend(tagged("this host (shm)", p.shm.resources()));
        v.extend(tagged("other hosts (ofi)", p.ofi.resources()));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_split_back_and_reject_bad_lengths() {
        let d = join_desc(b"abc", b"wxyz");
        assert_eq!(split_desc(&d).unwrap(), (&b"abc"[..], &b"wxyz"[..]));
        assert!(split_desc(&d[..5]).is_err());
        assert!(split_desc(&[1, 2]).is_err());
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.push(0);
        assert!(split_desc(&huge).is_err());
    }
}
