//! RMA and atomics over active messages, for fabrics without native RMA (and for testing:
//! `WEFT_RMA=am`), as GASNet's reference extended API does. Transfers larger than one medium
//! AM travel in several parts; every part is acknowledged by a `weft.rma.done` reply that
//! carries an error text when the target rejects the access.

use crate::am::internal;
use crate::ops::OpState;
use crate::{AmMsg, Comm, Error, Pod, Result};
use std::sync::Arc;
use weft_fabric::pod::LocalView;
use weft_fabric::{AmClass, AmPayload, AtomicOp};

/// Sends one request of the AM-based path to a rank: the world's default path, or an
/// endpoint's slot.
pub(crate) type AmSend<'a> = &'a mut dyn FnMut(u32, u16, &[u64], AmPayload<'_>) -> Result<()>;

const OK: u64 = 0;
const FAILED: u64 = 1;

impl Comm {
    fn parts(&self, len: usize) -> usize {
        len.div_ceil(self.caps.am_max_medium).max(1)
    }

    pub(crate) fn am_put(&self, rank: u32, seg: u32, off: usize, bytes: &[u8]) -> Result<Arc<OpState>> {
        self.am_put_with(&mut self.on_world(), (rank, seg, off), bytes)
    }

    pub(crate) fn am_get(&self, rank: u32, seg: u32, off: usize, len: usize) -> Result<Arc<OpState>> {
        self.am_get_with(&mut self.on_world(), (rank, seg, off), len)
    }

    pub(crate) fn am_atomic(&self, rank: u32, seg: u32, off: usize, a: AtomicOp) -> Result<Arc<OpState>> {
        self.am_atomic_with(&mut self.on_world(), (rank, seg, off), a)
    }

    /// Sends the AM-based path's requests on the world's default path.
    fn on_world(&self) -> impl FnMut(u32, u16, &[u64], AmPayload<'_>) -> Result<()> + '_ {
        move |rank, h, args, payload| self.send_am(rank, h, AmClass::Request, args, payload)
    }

    /// [`Comm::am_put`] with its requests sent by `send` (an endpoint's slot).
    pub(crate) fn am_put_with(
        &self,
        send: AmSend<'_>,
        (rank, seg, off): (u32, u32, usize),
        bytes: &[u8],
    ) -> Result<Arc<OpState>> {
        let chunk = self.caps.am_max_medium;
        let op = OpState::new(rank, self.parts(bytes.len()), 0);
        let token = self.ops.register(&op);
        for i in 0..self.parts(bytes.len()) {
            let part = &bytes[i * chunk..((i + 1) * chunk).min(bytes.len())];
            let args = [seg as u64, (off + i * chunk) as u64, token];
            send(rank, internal::RMA_PUT, &args, AmPayload::Medium(part))?;
        }
        Ok(op)
    }

    /// [`Comm::am_get`] with its requests sent by `send`.
    pub(crate) fn am_get_with(
        &self,
        send: AmSend<'_>,
        (rank, seg, off): (u32, u32, usize),
        len: usize,
    ) -> Result<Arc<OpState>> {
        let chunk = self.caps.am_max_medium;
        let op = OpState::new(rank, self.parts(len), len);
        let token = self.ops.register(&op);
        for i in 0..self.parts(len) {
            let part = chunk.min(len - i * chunk);
            let args = [seg as u64, (off + i * chunk) as u64, part as u64, token, (i * chunk) as u64];
            send(rank, internal::RMA_GET, &args, AmPayload::Short)?;
        }
        Ok(op)
    }

    /// [`Comm::am_atomic`] with its request sent by `send`.
    pub(crate) fn am_atomic_with(
        &self,
        send: AmSend<'_>,
        (rank, seg, off): (u32, u32, usize),
        a: AtomicOp,
    ) -> Result<Arc<OpState>> {
        let op = OpState::new(rank, 1, 0);
        let token = self.ops.register(&op);
        let [w0, w1, w2] = a.encode();
        send(rank, internal::RMA_ATOMIC, &[seg as u64, off as u64, w0, w1, w2, token], AmPayload::Short)?;
        Ok(op)
    }

    /// This rank's part of segment `seg` as `T`s, and the index of byte offset `off`, checked
    /// for bounds (`len` bytes) and alignment; errors are texts sent back to the initiator.
    pub(crate) fn local_view<T: Pod>(
        &self,
        seg: u64,
        off: u64,
        len: usize,
    ) -> std::result::Result<(LocalView<'_, T>, usize), String> {
        let me = self.rank();
        let s = self.segments.get(seg as u32).ok_or(format!("rank {me}: no segment {seg}"))?;
        let (off, size) = (off as usize, std::mem::size_of::<T>());
        if !off.is_multiple_of(size) {
            return Err(format!("rank {me}: offset {off} is not {size}-byte aligned"));
        }
        if !s.live() {
            return Err(format!("rank {me}: segment {seg} was dropped"));
        }
        if off.checked_add(len).is_none_or(|e| e > s.size()) {
            return Err(format!(
                "rank {me}: {len} bytes at offset {off} is outside segment {seg} of {} bytes",
                s.bytes
            ));
        }
        Ok((LocalView::new(&s.local, s.bytes / size).ok_or("segment view")?, off / size))
    }

    pub(crate) fn reply_done(
        &self,
        m: &AmMsg<'_>,
        token: u64,
        value: u64,
        data_off: u64,
        result: std::result::Result<&[u8], String>,
    ) {
        let (args, payload) = match &result {
            Ok(data) => ([token, value, OK, data_off], *data),
            Err(e) => ([token, 0, FAILED, 0], &e.as_bytes()[..e.len().min(self.caps.am_max_medium)]),
        };
        if let Err(e) =
            self.send_am(m.src(), internal::RMA_DONE, AmClass::Reply, &args, AmPayload::Medium(payload))
        {
            self.record_error(e);
        }
    }

    pub(crate) fn on_am_put(&self, m: &AmMsg<'_>) {
        let &[seg, off, token] = m.args() else {
            return self.record_error(Error::Remote(format!("malformed AM put from rank {}", m.src())));
        };
        let r = self.local_view::<u8>(seg, off, m.payload().len()).map(|(v, i)| v.copy_in(i, m.payload()));
        self.reply_done(m, token, 0, 0, r.map(|_| &[][..]));
    }

    pub(crate) fn on_am_get(&self, m: &AmMsg<'_>) {
        let &[seg, off, len, token, data_off] = m.args() else {
            return self.record_error(Error::Remote(format!("malformed AM get from rank {}", m.src())));
        };
        if len as usize > self.caps.am_max_medium {
            return self.reply_done(m, token, 0, 0, Err(format!("get part of {len} bytes is too large")));
        }
        let mut buf = vec![0u8; len as usize];
        let r = self.local_view::<u8>(seg, off, buf.len()).map(|(v, i)| v.copy_out(i, &mut buf));
        self.reply_done(m, token, 0, data_off, r.map(|_| &buf[..]));
    }

    pub(crate) fn on_am_atomic(&self, m: &AmMsg<'_>) {
        let &[seg, off, w0, w1, w2, token] = m.args() else {
            return self.record_error(Error::Remote(format!("malformed AM atomic from rank {}", m.src())));
        };
        let r = AtomicOp::decode([w0, w1, w2])
            .ok_or(format!("rank {}: unknown atomic opcode {w0}", self.rank()))
            .and_then(|op| self.local_view::<u64>(seg, off, 8).map(|(v, i)| op.apply(v.atomic(i))));
        match r {
            Ok(old) => self.reply_done(m, token, old, 0, Ok(&[])),
            Err(e) => self.reply_done(m, token, 0, 0, Err(e)),
        }
    }

    pub(crate) fn on_am_done(&self, m: &AmMsg<'_>) {
        let &[token, value, status, data_off] = m.args() else {
            return self
                .record_error(Error::Remote(format!("malformed RMA completion from rank {}", m.src())));
        };
        // Only the operation's target answers for it, and only with a reply: a completion
        // another rank forged (tokens are sequential) is dropped.
        if !m.is_reply() || self.ops.get(token).is_none_or(|op| op.target != m.src()) {
            return;
        }
        if status != OK {
            let text = String::from_utf8_lossy(m.payload()).into_owned();
            return self.ops.complete(token, 0, Err(Error::Remote(text)));
        }
        if !m.payload().is_empty() {
            let Some(op) = self.ops.get(token) else {
                return;
            };
            let mut data = op.data.lock().unwrap_or_else(|p| p.into_inner());
            let off = data_off as usize;
            match off.checked_add(m.payload().len()).and_then(|end| data.get_mut(off..end)) {
                Some(dst) => weft_fabric::copy::copy_slice(dst, m.payload()),
                None => {
                    drop(data);
                    return self.ops.complete(
                        token,
                        0,
                        Err(Error::Remote("get reply outside the buffer".into())),
                    );
                }
            }
        }
        self.ops.complete(token, value, Ok(()));
    }
}
