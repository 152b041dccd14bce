//! Peers: request credits, liveness probes and control messages.

use super::*;

impl OfiFabric {
    /// `n` credits toward `src` came back; false (nothing changed) if that would exceed what
    /// this rank can have outstanding, which no well-behaved peer sends.
    pub(super) fn credit_back(&self, src: Rank, n: u64) -> bool {
        let c = &self.credits[src as usize];
        c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
            let new = cur as u64 + n;
            (new <= REQUEST_CREDITS as u64).then_some(new as u32)
        })
        .is_ok()
    }

    /// Takes one request credit toward `dst`; false while all are out.
    pub(super) fn take_credit(&self, dst: Rank) -> bool {
        self.credits[dst as usize]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1))
            .is_ok()
    }

    /// A request of `src` was handled: return credits once a batch has gathered.
    pub(super) fn owe(&self, src: Rank) {
        if self.owed[src as usize].fetch_add(1, Ordering::AcqRel) + 1 >= CREDIT_BATCH {
            self.return_credits(src);
        }
    }

    pub(super) fn return_credits(&self, src: Rank) {
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
    pub(super) fn flush_credits(&self) {
        if self.owed_retry.swap(false, Ordering::AcqRel) {
            for r in 0..self.size {
                if self.owed[r as usize].load(Ordering::Acquire) >= CREDIT_BATCH {
                    self.return_credits(r);
                }
            }
        }
    }

    /// Sends a liveness probe (a `Wake`) to `dst` unless one is in flight or went out less
    /// than [`PROBE_INTERVAL_NS`] ago; its failure marks `dst` dead (see `finish`).
    pub(super) fn probe(&self, dst: Rank) {
        let d = dst as usize;
        let now = os::now_ns();
        if now.saturating_sub(self.probed_at[d].load(Ordering::Acquire)) < PROBE_INTERVAL_NS
            || self.probing[d].swap(true, Ordering::AcqRel)
        {
            return;
        }
        self.probed_at[d].store(now, Ordering::Release);
        let ret = match self.post_control(dst, Control::Wake, true) {
            Some(ret) => ret,
            None => {
                self.probing[d].store(false, Ordering::Release);
                return;
            }
        };
        if ret < 0 {
            self.probing[d].store(false, Ordering::Release);
            let since = first_seen(&self.refused_since[d], now);
            if ret != EAGAIN {
                self.mark_failed(dst, format!("unreachable: {}", ffi::strerror(ret as i64)));
            } else if now.saturating_sub(since) >= PROBE_REFUSED_NS {
                self.mark_failed(
                    dst,
                    format!(
                        "its endpoint refused connections for {} s (process or host gone)",
                        now.saturating_sub(since) / 1_000_000_000
                    ),
                );
            }
            return;
        }
        self.refused_since[d].store(0, Ordering::Release);
    }

    /// Sends control message `c` to `dst` from a small slot with a completion (`probe`: it is
    /// the liveness probe); `None` when no small slot is free, else what the provider said.
    pub(super) fn post_control(&self, dst: Rank, c: Control, probe: bool) -> Option<isize> {
        let slot = self.smalls.take()?;
        let msg = self.control_message(c, 0);
        let at = self.smalls.addr(slot);
        // SAFETY: the small slot (64 bytes ≥ a header) is ours until the send completes.
        unsafe { std::slice::from_raw_parts_mut(at as *mut u8, msg.len()) }.copy_from_slice(&msg);
        let ctx = Context::into_raw(Op::Control { slot, dst, probe });
        let ret =
            self.obj.ep().send(at, msg.len(), self.stage.mr.desc(), self.addrs[dst as usize], TAG_REPLY, ctx);
        if ret < 0 {
            // SAFETY: refused, so the context is ours again.
            drop(unsafe { Context::<Op>::from_raw(ctx) });
            self.smalls.give(slot);
        } else {
            self.inflight.fetch_add(1, Ordering::AcqRel);
        }
        Some(ret)
    }

    /// Tells every running peer this rank leaves, then waits (at most [`FINAL_FLUSH_NS`])
    /// until everything it sent has completed: a provider may still hold injected messages
    /// (no completion) in a queue of its own that dies with the process, and a peer may be
    /// waiting on the last of them. The notice is a send with a completion (delivery complete
    /// where the provider offers it) behind those messages on the same connection.
    pub(super) fn leave(&self, peers: impl Iterator<Item = Rank>) {
        let deadline = os::now_ns() + FINAL_FLUSH_NS;
        for r in peers {
            // A peer that left (finalized or dead) reads nothing more: no message to it, as
            // the provider may retry a connection to a closed endpoint until the timeout.
            while matches!(self.peer_state(r), PeerState::Running) && os::now_ns() < deadline {
                match self.post_control(r, Control::Finalized, false) {
                    Some(ret) if ret != EAGAIN => break,
                    _ => {
                        let _ = self.poll_cq();
                    }
                }
            }
        }
        while self.inflight.load(Ordering::Acquire) > 0 && os::now_ns() < deadline {
            if matches!(self.poll_cq(), Ok(0)) {
                std::thread::yield_now();
            }
        }
    }

    pub(super) fn control_message(&self, c: Control, value: u64) -> [u8; wire::HEADER] {
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
    pub(super) fn send_control(&self, dst: Rank, c: Control) -> FabricResult<()> {
        let buf = self.control_message(c, 0);
        let fa = self.addrs[dst as usize];
        self.post_retry(dst, "fi_inject", || self.obj.ep().inject(&buf, fa, TAG_REPLY))
    }

    /// One attempt to send control message `c` carrying `value`.
    pub(super) fn try_control(&self, dst: Rank, c: Control, value: u64) -> FabricResult<()> {
        let buf = self.control_message(c, value);
        ffi::check(self.obj.ep().inject(&buf, self.addrs[dst as usize], TAG_REPLY) as i64, "fi_inject")
    }
}
