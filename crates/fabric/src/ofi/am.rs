//! Active messages over libfabric: framing, sending (credits, staged payloads), receiving
//! and delivery.

use super::*;

impl OfiFabric {
    /// The bytes of receive slot `slot` as filled by the provider.
    pub(super) fn rx_bytes(&self, slot: u32, len: usize) -> &[u8] {
        // SAFETY: the slot is registered receive memory the provider filled with `len` bytes
        // (at most RX_BYTES); nothing writes it until it is posted again, which happens only
        // after the last use of this borrow.
        unsafe { std::slice::from_raw_parts(self.rx_slots.addr(slot) as *const u8, len.min(RX_BYTES)) }
    }

    /// Takes in an arriving message: checks it and copies it into the queues, so that its
    /// buffer can be posted again at once (see ARCHITECTURE.md on why, and on what it costs).
    pub(super) fn receive(&self, slot: u32, len: usize) {
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
    pub(super) fn local_range(&self, region: u32, offset: u64, len: u64) -> Option<(Arc<Mapping>, usize)> {
        let regions = self.regions.read().unwrap_or_else(|e| e.into_inner());
        let reg = regions.get(region as usize)?.as_ref()?;
        let end = offset.checked_add(len)?;
        if end > reg.map.len() as u64 {
            return None;
        }
        Some((reg.map.clone(), offset as usize))
    }

    pub(super) fn write_local(&self, region: u32, offset: u64, data: &[u8]) -> Result<(), ()> {
        let (map, off) = self.local_range(region, offset, data.len() as u64).ok_or(())?;
        // SAFETY: the range lies inside the live mapping (checked above, kept by `map`).
        unsafe { crate::copy::copy_bytes(data.as_ptr(), map.as_ptr().add(off), data.len()) };
        Ok(())
    }

    pub(super) fn deliver(&self, ev: Event, sink: &dyn EventSink) -> FabricResult<()> {
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
                    if let Some(c) = self.counts.handled.get(src as usize) {
                        c.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    }
                    self.owe(src);
                }
            }
        }
        Ok(())
    }

    /// Sends one AM (the credit is taken by the caller): `Ok(false)` when the transmit queue
    /// or the staging buffers are full.
    pub(super) fn am_send(&self, dst: Rank, msg: &AmOut<'_>) -> FabricResult<bool> {
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
            if ffi::transient(ret) {
                self.poll_cq()?;
                return Ok(false);
            }
            self.posted(dst, ret, "fi_inject")?;
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
            if ffi::transient(ret) {
                self.poll_cq()?;
                return Ok(false);
            }
            return self.posted(dst, ret, "fi_send").map(|_| false);
        }
        self.inflight.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }
}

/// How one AM travels: its header, the payload bytes inside the message, and a long payload
/// that must be written to (region, offset) before the header is sent.
pub(super) struct Framed<'a> {
    pub(super) header: Header,
    pub(super) carried: &'a [u8],
    pub(super) write_first: Option<(&'a RemoteRegion, usize, &'a [u8])>,
}

/// Checks `msg` from `src` to `dst` and decides how it travels (shared by the main endpoint
/// and the transmit slots): long payloads go inside the message up to [`MAX_MEDIUM`] where
/// the provider does not order a send after a write, else they are written first.
pub(super) fn frame<'a>(
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
    pub(super) fn encode(&self, args: &[u64], out: &mut [u8]) {
        let n = self.header.encode(args, out);
        out[n..].copy_from_slice(self.carried);
    }
}
