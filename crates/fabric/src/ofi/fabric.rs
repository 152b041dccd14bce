//! The [`Fabric`] trait over libfabric: what each operation maps to (see ARCHITECTURE.md).

use super::*;

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

    fn adopt_program_data(&self) -> FabricResult<LocalRegion> {
        let (start, len) = crate::adopt::adoptable()?;
        let region = self.register_at(None, Arc::new(crate::adopt::borrow(start, len)), len)?;
        // The program's variables are never given back.
        Ok(region.with_discard(false))
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
        if self.registers_local(dst.len()) {
            let (desc, reg) = self.local_desc(dst.as_ptr() as usize, dst.len())?;
            let r = self.read_pieces(src, offset, dst, Some(desc));
            drop(reg);
            return r;
        }
        let direct = (!self.obj.neg.mr_local()).then_some(0);
        self.read_pieces(src, offset, dst, direct)
    }

    fn get_nb(
        &self,
        src: &RemoteRegion,
        offset: usize,
        dst: &mut [u8],
        token: u64,
    ) -> FabricResult<GetIssued> {
        src.check(offset, dst.len())?;
        match self.read_staged(src, offset, dst.len(), token, None)? {
            Some(stage) => Ok(GetIssued::Staged(StagedGet::new(stage))),
            // Nothing to read, more than a slot holds, or every slot out: read in place and
            // wait (never wait for a slot, which only a handle's completion returns).
            None => self.get(src, offset, dst).map(|_| GetIssued::Done),
        }
    }

    fn get_into(
        &self,
        src: &RemoteRegion,
        offset: usize,
        dst: ReadDst<'_>,
        token: u64,
    ) -> FabricResult<Issued> {
        src.check(offset, dst.len())?;
        self.read_into(src, offset, dst, token)
    }

    fn wait_reads(&self, scope: &ReadScope<'_>) {
        self.settle_reads(scope)
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

    fn expose(&self, rank: Rank, addr: usize, len: usize) -> FabricResult<Exposure> {
        self.expose_memory(rank, addr, len)
    }

    fn read_exposed(&self, rank: Rank, addr: u64, key: u64, dst: &mut [u8]) -> FabricResult<()> {
        self.read_exposed_memory(rank, addr, key, dst)
    }

    fn stats(&self) -> FabricStats {
        self.counters.snapshot()
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
        if request && matches!(sent, Ok(true)) {
            // Any thread sends here: an atomic add (a network message costs far more).
            self.counts.sent[dst as usize].fetch_add(1, Ordering::AcqRel);
        }
        sent
    }

    fn requests_sent(&self, dst: Rank) -> u64 {
        self.counts.sent_to(dst)
    }

    fn requests_handled(&self, src: Rank) -> u64 {
        self.counts.handled.get(src as usize).map_or(0, |c| c.load(Ordering::Acquire))
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
            near_pids: (0..self.size as usize).map(|r| self.same_host[r].then_some(self.pids[r])).collect(),
            inject: neg.inject,
            tx_size: neg.tx_size,
            send_after_write: neg.send_after_write,
            counters: self.counters.clone(),
            mr_local: neg.mr_local(),
            zcopy_bytes: self.zcopy_bytes,
            max_msg: neg.max_msg,
            tx_contexts: neg.tx_contexts,
        });
        (0..count)
            .map(|_| {
                let sent = self.counts.slot();
                Ok(Box::new(slots::OfiTxSlot::open(&ctx, params.clone(), sent)?) as Box<dyn TxSlot>)
            })
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

    fn wait_incoming(&self, timeout: Duration, ready: &mut dyn FnMut() -> bool) -> bool {
        // A notify here is a message, which the queue's descriptor shows: `ready` needs no
        // place between announcing and sleeping.
        if ready() || self.has_incoming() {
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
                let now = os::now_ns();
                if now.saturating_sub(super::first_seen(&self.gone_since[r], now)) >= super::GONE_GRACE_NS {
                    return PeerState::Dead(format!("process {pid} is gone"));
                }
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

    fn release(&self) {
        self.finalize();
        self.close_network(Duration::from_secs(2));
    }

    fn finalize(&self) {
        if self.done.swap(true, Ordering::AcqRel) {
            return;
        }
        self.exposed.clear();
        let elsewhere = |r: Rank| self.same_host_elsewhere && self.same_host[r as usize];
        self.leave((0..self.size).filter(|&r| r != self.rank && !elsewhere(r)));
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
                format!(
                    "staging slots ({} of {} KiB, {} of 64 B; gets: {}) in use",
                    CHUNKS,
                    CHUNK / 1024,
                    SMALLS,
                    GET_TIERS.map(|(b, c)| format!("{c} of {b} B")).join(", ")
                ),
                (self.chunks.in_use() + self.smalls.in_use() + self.get_slots.iter().map(|s| s.in_use()).sum::<usize>())
                    as u64,
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
