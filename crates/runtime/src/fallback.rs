//! RMA and atomics over active messages, for fabrics without native RMA (and for testing:
//! `WEFT_RMA=am`), as GASNet's reference extended API does. Transfers larger than one medium
//! AM travel in several parts; every part is acknowledged by a `weft.rma.done` reply that
//! carries an error text when the target rejects the access.

use crate::am::internal;
use crate::ops::OpState;
use crate::{AmMsg, Comm, Error, Result};
use std::sync::Arc;
use weft_fabric::pod::LocalView;
use weft_fabric::{AmClass, AmPayload, AtomicOp};

const OK: u64 = 0;
const FAILED: u64 = 1;

impl Comm {
    fn parts(&self, len: usize) -> usize {
        len.div_ceil(self.caps.am_max_medium).max(1)
    }

    pub(crate) fn am_put(&self, rank: u32, seg: u32, off: usize, bytes: &[u8]) -> Result<Arc<OpState>> {
        let chunk = self.caps.am_max_medium;
        let op = OpState::new(rank, self.parts(bytes.len()), 0);
        let token = self.ops.register(&op);
        for i in 0..self.parts(bytes.len()) {
            let part = &bytes[i * chunk..((i + 1) * chunk).min(bytes.len())];
            let args = [seg as u64, (off + i * chunk) as u64, token];
            self.send_am(rank, internal::RMA_PUT, AmClass::Request, &args, AmPayload::Medium(part))?;
        }
        Ok(op)
    }

    pub(crate) fn am_get(&self, rank: u32, seg: u32, off: usize, len: usize) -> Result<Arc<OpState>> {
        let chunk = self.caps.am_max_medium;
        let op = OpState::new(rank, self.parts(len), len);
        let token = self.ops.register(&op);
        for i in 0..self.parts(len) {
            let part = chunk.min(len - i * chunk);
            let args = [seg as u64, (off + i * chunk) as u64, part as u64, token, (i * chunk) as u64];
            self.send_am(rank, internal::RMA_GET, AmClass::Request, &args, AmPayload::Short)?;
        }
        Ok(op)
    }

    pub(crate) fn am_atomic(&self, rank: u32, seg: u32, off: usize, a: AtomicOp) -> Result<Arc<OpState>> {
        let op = OpState::new(rank, 1, 0);
        let token = self.ops.register(&op);
        let [w0, w1, w2] = a.encode();
        let args = [seg as u64, off as u64, w0, w1, w2, token];
        self.send_am(rank, internal::RMA_ATOMIC, AmClass::Request, &args, AmPayload::Short)?;
        Ok(op)
    }

    /// The local bytes `[off, off+len)` of segment `seg`, checked.
    fn local_bytes(
        &self,
        seg: u64,
        off: u64,
        len: usize,
    ) -> std::result::Result<(LocalView<'_, u8>, usize), String> {
        let s = self.segments.get(seg as u32).ok_or(format!("rank {}: no segment {seg}", self.rank()))?;
        let off = off as usize;
        if off.checked_add(len).is_none_or(|e| e > s.bytes) {
            return Err(format!(
                "rank {}: {len} bytes at offset {off} is outside segment {seg} of {} bytes",
                self.rank(),
                s.bytes
            ));
        }
        Ok((LocalView::new(&s.local, s.bytes).ok_or("segment view")?, off))
    }

    fn reply_done(
        &self,
        m: &AmMsg<'_>,
        token: u64,
        value: u64,
        data_off: u64,
        result: std::result::Result<&[u8], String>,
    ) {
        let sent = match result {
            Ok(data) => self.send_am(
                m.src(),
                internal::RMA_DONE,
                AmClass::Reply,
                &[token, value, OK, data_off],
                AmPayload::Medium(data),
            ),
            Err(e) => {
                let text = &e.as_bytes()[..e.len().min(self.caps.am_max_medium)];
                self.send_am(
                    m.src(),
                    internal::RMA_DONE,
                    AmClass::Reply,
                    &[token, 0, FAILED, 0],
                    AmPayload::Medium(text),
                )
            }
        };
        if let Err(e) = sent {
            self.record_error(e);
        }
    }

    pub(crate) fn on_am_put(&self, m: &AmMsg<'_>) {
        let &[seg, off, token] = m.args() else {
            return self.record_error(Error::Remote(format!("malformed AM put from rank {}", m.src())));
        };
        let r = self.local_bytes(seg, off, m.payload().len()).map(|(v, off)| v.copy_in(off, m.payload()));
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
        let r = self.local_bytes(seg, off, buf.len()).map(|(v, off)| v.copy_out(off, &mut buf));
        self.reply_done(m, token, 0, data_off, r.map(|_| &buf[..]));
    }

    pub(crate) fn on_am_atomic(&self, m: &AmMsg<'_>) {
        let &[seg, off, w0, w1, w2, token] = m.args() else {
            return self.record_error(Error::Remote(format!("malformed AM atomic from rank {}", m.src())));
        };
        let r = (|| {
            let op = AtomicOp::decode([w0, w1, w2]).ok_or(format!("unknown atomic opcode {w0}"))?;
            if off % 8 != 0 {
                return Err(format!("atomic at offset {off} is not 8-byte aligned"));
            }
            let s = self.segments.get(seg as u32).ok_or(format!("no segment {seg}"))?;
            let (view, i) =
                (LocalView::<u64>::new(&s.local, s.bytes / 8).ok_or("segment view")?, off as usize / 8);
            if i >= view.len() {
                return Err(format!("atomic at offset {off} is outside segment {seg} of {} bytes", s.bytes));
            }
            Ok(op.apply(view.atomic(i)))
        })();
        match r {
            Ok(old) => self.reply_done(m, token, old, 0, Ok(&[])),
            Err(e) => self.reply_done(m, token, 0, 0, Err(format!("rank {}: {e}", self.rank()))),
        }
    }

    pub(crate) fn on_am_done(&self, m: &AmMsg<'_>) {
        let &[token, value, status, data_off] = m.args() else {
            return self
                .record_error(Error::Remote(format!("malformed RMA completion from rank {}", m.src())));
        };
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
            match data.get_mut(off..off + m.payload().len()) {
                Some(dst) => dst.copy_from_slice(m.payload()),
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
