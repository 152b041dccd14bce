//! RMA writes over libfabric: staged and direct pieces, their trackers, atomic ops.

use super::*;

impl OfiFabric {
    /// Waits (making progress, queueing what arrives) until `t` has completed. Its pieces
    /// read or write the caller's memory until the provider completes them, so this never
    /// returns before: a peer that died or stopped answering is said on standard error (once)
    /// and the wait goes on until the provider completes or fails the pieces (a dead peer's
    /// connection fails them; a job whose rank hangs is stopped by its launcher).
    pub(super) fn wait_tracker(&self, t: &Arc<Tracker>, dst: Rank) -> FabricResult<u64> {
        let start = Instant::now();
        let mut spins = 0u32;
        let mut stuck: Option<FabricError> = None;
        while t.remaining.load(Ordering::Acquire) != 0 {
            let polled = self.poll_cq().unwrap_or_else(|e| {
                stuck.get_or_insert(e);
                0
            });
            if polled != 0 {
                continue;
            }
            spins += 1;
            if spins > 64 {
                std::thread::yield_now();
            }
            if stuck.is_some() {
                std::thread::sleep(Duration::from_micros(200));
            } else if spins.is_multiple_of(1024) {
                let late = start.elapsed() > self.op_timeout;
                let why = match self.check_peer(dst) {
                    Err(e) => Some(e),
                    Ok(()) if late => {
                        Some(FabricError::Timeout { what: format!("RMA with rank {dst} did not complete") })
                    }
                    Ok(()) => None,
                };
                if let Some(e) = why {
                    say_stuck(self.rank, &e);
                    stuck = Some(e);
                }
            }
        }
        match t.take_err() {
            Some(e) => Err(e),
            None => Ok(t.value.load(Ordering::Acquire)),
        }
    }

    /// Writes `src` to `dst` at `offset` in pieces; each piece completes `track`.
    pub(super) fn write_pieces(
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
                self.counters.staged(n);
                self.post_write(dst, raddr, (at, self.stage.mr.desc()), n, Some(slot), track)?;
            }
            done += n;
        }
        Ok(())
    }

    /// Writes straight from memory the NIC can read (no staging), waiting for completion.
    pub(super) fn write_direct(
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
    pub(super) fn post_write(
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

    /// Issues a put completing `track`. Large sources are written in place and waited for
    /// (local completion at return): unregistered on providers that can read them, else
    /// registered (see [`OfiFabric::local_desc`]).
    pub(super) fn issue_put(
        &self,
        dst: &RemoteRegion,
        offset: usize,
        src: &[u8],
        track: &Arc<Tracker>,
    ) -> FabricResult<bool> {
        dst.check(offset, src.len())?;
        let (addr, len) = (src.as_ptr() as usize, src.len());
        if self.registers_local(len) {
            let (desc, reg) = self.local_desc(addr, len)?;
            let r = self.write_waited(dst, offset, (addr, desc, len));
            drop(reg);
            return r.map(|_| true);
        }
        if len > CHUNK && !self.obj.neg.mr_local() {
            return self.write_waited(dst, offset, (addr, 0, len)).map(|_| true);
        }
        self.write_pieces(dst, offset, src, track)?;
        Ok(false)
    }

    /// Writes `len` bytes at `addr` (descriptor `desc`) in place and waits for them.
    fn write_waited(
        &self,
        dst: &RemoteRegion,
        offset: usize,
        (addr, desc, len): (usize, usize, usize),
    ) -> FabricResult<()> {
        let waiter = Tracker::new(Target::Waiter);
        let r = self.write_direct(dst, offset, addr, desc, len, &waiter);
        waiter.remaining.fetch_sub(1, Ordering::AcqRel);
        // Even after a failed post the pieces already posted read the source: wait for them.
        let w = self.wait_tracker(&waiter, dst.rank);
        r?;
        w.map(|_| ())
    }

    /// Reads `dst.len()` bytes at `offset` of `src`, piece by piece, each waited for: in place
    /// with descriptor `direct` (`Some`), else through staging chunks.
    pub(super) fn read_pieces(
        &self,
        src: &RemoteRegion,
        offset: usize,
        dst: &mut [u8],
        direct: Option<usize>,
    ) -> FabricResult<()> {
        let fa = self.addrs[src.rank as usize];
        let piece = if direct.is_some() { self.obj.neg.max_msg.max(1) } else { CHUNK };
        let mut done = 0;
        while done < dst.len() {
            let n = (dst.len() - done).min(piece);
            let t = Tracker::new(Target::Waiter);
            let slot = if direct.is_some() { None } else { Some(self.take_chunk(src.rank)?) };
            let (buf, desc) = match slot {
                None => (dst[done..].as_mut_ptr() as usize, direct.unwrap_or(0)),
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
                    self.counters.staged(n);
                }
                self.chunks.give(s);
            }
            posted?;
            waited?;
            done += n;
        }
        Ok(())
    }

    /// Starts a get of `n` bytes at `offset` of `src` into a staging slot of its own
    /// ([`GET_TIERS`]), completing `token`; at the completion the bytes are copied to `land`
    /// if given. `None`: nothing to read, more than a slot holds, or every slot out.
    pub(super) fn read_staged(
        &self,
        src: &RemoteRegion,
        offset: usize,
        n: usize,
        token: u64,
        land: Option<Landing>,
    ) -> FabricResult<Option<Arc<StageSlot>>> {
        let slab = GET_TIERS.iter().position(|&(bytes, _)| n <= bytes).filter(|_| n > 0);
        let Some((slab, slot)) = slab.map(|t| &self.get_slots[t]).and_then(|s| Some((s, s.take()?))) else {
            return Ok(None);
        };
        let stage = Arc::new(StageSlot {
            _map: self.stage.map.clone(),
            slab: slab.clone(),
            slot,
            len: n,
            done: AtomicBool::new(false),
            counters: self.counters.clone(),
        });
        let t = Tracker::new(Target::Token(token));
        t.remaining.fetch_add(1, Ordering::AcqRel);
        let (fa, raddr, buf) = (self.addrs[src.rank as usize], src.addr + offset as u64, slab.addr(slot));
        let op = Op::ReadStaged { dst: src.rank, track: t.clone(), stage: stage.clone(), land };
        // Never posted: nothing completes the token, and the slot goes back with `stage`.
        self.post_op(src.rank, "fi_read", op, |ctx| {
            self.obj.ep().read(buf, n, self.stage.mr.desc(), fa, raddr, src.key, ctx)
        })?;
        self.release_guard(&t);
        Ok(Some(stage))
    }

    /// [`Fabric::get_into`] (range checked): in place, every piece posted at once (bounded by
    /// the transmit queue), registered under `FI_MR_LOCAL` from the zero-copy threshold up;
    /// below it through a staging slot, or read now when none is free.
    pub(super) fn read_into(
        &self,
        src: &RemoteRegion,
        offset: usize,
        dst: ReadDst<'_>,
        token: u64,
    ) -> FabricResult<Issued> {
        let n = dst.len();
        if n == 0 {
            return Ok(Issued::Done(0));
        }
        let mut reg = None;
        if self.obj.neg.mr_local() {
            if !self.registers_local(n) {
                if self.read_staged(src, offset, n, token, Some(dst.landing()))?.is_some() {
                    return Ok(Issued::Pending);
                }
                // Not posted: nothing holds the destination.
                return self.get(src, offset, dst.into_slice()).map(|_| Issued::Done(0));
            }
            reg = Some(self.local_desc(dst.landing().addr, n)?);
        }
        let desc = reg.as_ref().map_or(0, |r| r.0);
        let hold = (dst.landing(), reg.map(|r| Arc::new(r.1)));
        let (fa, piece) = (self.addrs[src.rank as usize], self.obj.neg.max_msg.max(1));
        let t = Tracker::new(Target::Token(token));
        let mut done = 0;
        while done < n {
            let k = (n - done).min(piece);
            let (buf, raddr) = (hold.0.addr + done, src.addr + (offset + done) as u64);
            t.remaining.fetch_add(1, Ordering::AcqRel);
            let op = Op::ReadInto { dst: src.rank, track: t.clone(), hold: hold.clone() };
            let posted = self.post_op(src.rank, "fi_read", op, |ctx| {
                self.obj.ep().read(buf, k, desc, fa, raddr, src.key, ctx)
            });
            if let Err(e) = posted {
                t.remaining.fetch_sub(1, Ordering::AcqRel);
                if done == 0 {
                    // Nothing in flight: nothing completes the token.
                    return Err(e);
                }
                // The pieces in flight complete the token, with this error.
                t.fail(e);
                break;
            }
            done += k;
        }
        self.release_guard(&t);
        Ok(Issued::Pending)
    }

    /// [`Fabric::wait_reads`]: polls until no read into `scope` is in flight. Every such read
    /// ends in a completion (an error one if its peer failed), so this ends too.
    pub(super) fn settle_reads(&self, scope: &ReadScope<'_>) {
        let start = Instant::now();
        let mut spins = 0u32;
        let mut said = false;
        while !scope.settled() {
            if self.poll_cq().unwrap_or(0) == 0 {
                spins = spins.saturating_add(1);
                if spins > 1024 {
                    std::thread::sleep(Duration::from_micros(100));
                } else if spins > 64 {
                    std::thread::yield_now();
                }
                if !said && spins.is_multiple_of(1024) && start.elapsed() > self.op_timeout {
                    let what = "gets into a read scope did not complete".to_string();
                    say_stuck(self.rank, &FabricError::Timeout { what });
                    said = true;
                }
            }
        }
    }

    pub(super) fn start(&self, token: u64) -> Arc<Tracker> {
        if token == 0 {
            self.untracked.fetch_add(1, Ordering::AcqRel);
            Tracker::new(Target::Untracked)
        } else {
            Tracker::new(Target::Token(token))
        }
    }
}

pub(super) fn fi_op(op: AtomicOp) -> (sys::fi_op, u64, u64) {
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
