//! Non-contiguous transfers (GASNet's VIS): strided sub-arrays and lists of pieces, on either
//! side, in the three completion styles of plain put/get.
//!
//! A transfer pairs the remote pieces with the local ones in order (their totals must match)
//! and then takes one of two paths:
//! - **direct**: one native RMA operation per contiguous run (what large pieces want);
//! - **packed**: the pieces' offsets and data travel together in as few medium AMs as fit
//!   (one, usually), and the target scatters (put) or gathers (get) them in its handler. Used
//!   when pieces average at most `vis_pack_bytes` ([`crate::Config`]), and always on the
//!   AM-based RMA path.
//!
//! Packed payload: `[count: u64][(byte offset, bytes): (u64, u64) × count][data]`. The target
//! checks every piece against its segment before it writes any, so a bad list changes nothing.

use crate::am::internal;
use crate::ops::{nbi_push, OpState};
use crate::rma::Started;
use crate::segment::{GlobalPtr, SegInfo};
use crate::{AmMsg, Comm, Error, NbiScope, Pod, Result, RmaHandle};
use std::ops::Range;
use std::sync::Arc;
use weft_fabric::pod::{bytes_of, bytes_of_mut};
use weft_fabric::read::ReadScope;
use weft_fabric::{AmClass, AmPayload, GetIssued, Issued};

/// Where one side's elements lie, in elements from a base (a [`GlobalPtr`] or the start of a
/// local slice).
///
/// ```
/// # use weft_runtime as weft;
/// use weft::Pieces;
/// // Column 2 of a 4 x 8 row-major matrix: 4 runs of 1 element, 8 apart.
/// let column = Pieces::Strided { counts: &[1, 4], strides: &[8] };
/// assert_eq!(column.runs(32).unwrap(), vec![0..1, 8..9, 16..17, 24..25]);
/// // The same as a list of pieces.
/// let list = Pieces::List(&[0..1, 8..9, 16..17, 24..25]);
/// assert_eq!(list.runs(32).unwrap(), column.runs(32).unwrap());
/// ```
#[derive(Clone, Copy, Debug)]
pub enum Pieces<'a> {
    /// One run of `len` elements from `start`.
    Contiguous {
        /// First element.
        start: usize,
        /// Elements.
        len: usize,
    },
    /// Explicit runs of elements, transferred in list order.
    List(&'a [Range<usize>]),
    /// An N-d sub-array (as GASNet's strided transfers): `counts[0]` contiguous elements form
    /// a run; `counts[1]` runs, `strides[0]` elements apart, form a plane; `counts[2]` planes,
    /// `strides[1]` apart, and so on (`strides.len() + 1 == counts.len()`). Row-major order,
    /// the last dimension slowest.
    Strided {
        /// Elements per dimension, fastest first.
        counts: &'a [usize],
        /// Distance in elements between consecutive items of dimensions 1.. .
        strides: &'a [usize],
    },
}

fn bad(what: impl Into<String>) -> Error {
    Error::BadPieces(what.into())
}

impl Pieces<'_> {
    /// Total elements, computed without overflow.
    pub fn total(&self) -> Result<usize> {
        match self {
            Pieces::Contiguous { start, len } => {
                start.checked_add(*len).map(|_| *len).ok_or_else(|| bad("piece end overflows"))
            }
            Pieces::List(l) => l.iter().try_fold(0usize, |a, r| {
                a.checked_add(
                    r.end.checked_sub(r.start).ok_or_else(|| bad(format!("piece {r:?} runs backwards")))?,
                )
                .ok_or_else(|| bad("total elements overflow"))
            }),
            Pieces::Strided { counts, strides } => {
                if counts.len() != strides.len() + 1 {
                    return Err(bad(format!(
                        "{} counts need {} strides, got {}",
                        counts.len(),
                        counts.len().saturating_sub(1),
                        strides.len()
                    )));
                }
                counts
                    .iter()
                    .try_fold(1usize, |a, &c| a.checked_mul(c).ok_or_else(|| bad("total elements overflow")))
            }
        }
    }

    /// The contiguous runs, in transfer order, adjacent ones merged. `limit` bounds the total
    /// (checked before anything is allocated): the local buffer's length.
    pub fn runs(&self, limit: usize) -> Result<Vec<Range<usize>>> {
        let total = self.total()?;
        if total > limit {
            return Err(bad(format!("{total} elements, more than the {limit} of the buffer")));
        }
        let mut out: Vec<Range<usize>> = vec![];
        let mut push = |r: Range<usize>| {
            if r.is_empty() {
                return;
            }
            match out.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => out.push(r),
            }
        };
        match self {
            Pieces::Contiguous { start, len } => push(*start..start + len),
            Pieces::List(l) => l.iter().cloned().for_each(push),
            Pieces::Strided { counts, strides } => {
                if total == 0 {
                    return Ok(out);
                }
                let dims = counts.len();
                let mut idx = vec![0usize; dims];
                loop {
                    let mut start = 0usize;
                    for d in 1..dims {
                        start = idx[d]
                            .checked_mul(strides[d - 1])
                            .and_then(|o| o.checked_add(start))
                            .ok_or_else(|| bad("offset overflow"))?;
                    }
                    push(start..start.checked_add(counts[0]).ok_or_else(|| bad("offset overflow"))?);
                    // Next index, dimension 1 fastest.
                    let mut d = 1;
                    while d < dims {
                        idx[d] += 1;
                        if idx[d] < counts[d] {
                            break;
                        }
                        idx[d] = 0;
                        d += 1;
                    }
                    if d == dims {
                        break;
                    }
                }
            }
        }
        Ok(out)
    }
}

/// One contiguous copy of a planned transfer, in bytes: remote offset (in the segment), local
/// offset (in the local buffer), length.
#[derive(Clone, Copy, Debug)]
struct Copy {
    remote: usize,
    local: usize,
    len: usize,
}

/// A transfer resolved and checked: target, segment, and the copies.
struct Plan {
    rank: u32,
    seg: Arc<SegInfo>,
    copies: Vec<Copy>,
    total: usize,
}

/// Bytes of a packed message's header for `pieces` pieces.
fn header_bytes(pieces: usize) -> usize {
    8 + 16 * pieces
}

/// Groups copies into packed messages of at most `max` bytes (`with_data`: the data travels
/// in the same message as the list, as for puts; for gets it comes back in the reply, which
/// must fit too). Pieces that do not fit the room left are split.
fn pack(copies: &[Copy], max: usize, with_data: bool) -> Vec<Vec<Copy>> {
    let mut msgs: Vec<Vec<Copy>> = vec![];
    let (mut cur, mut list, mut data) = (vec![], 0usize, 0usize);
    for c in copies {
        let mut c = *c;
        while c.len > 0 {
            let used = |pieces: usize, data: usize| {
                if with_data {
                    header_bytes(pieces) + data
                } else {
                    header_bytes(pieces).max(data)
                }
            };
            let room = max.saturating_sub(used(list + 1, data));
            // A sliver of room is not worth a piece header: start the next message.
            if !cur.is_empty() && (room == 0 || (room < 64 && c.len > room)) {
                msgs.push(std::mem::take(&mut cur));
                (list, data) = (0, 0);
                continue;
            }
            let take = c.len.min(room.max(1));
            cur.push(Copy { len: take, ..c });
            (list, data) = (list + 1, data + take);
            c = Copy { remote: c.remote + take, local: c.local + take, len: c.len - take };
        }
    }
    if !cur.is_empty() {
        msgs.push(cur);
    }
    msgs
}

/// The list of a packed message (offsets relative to the segment).
fn encode_list(msg: &[Copy], out: &mut Vec<u8>) {
    out.extend_from_slice(&(msg.len() as u64).to_le_bytes());
    for c in msg {
        out.extend_from_slice(&(c.remote as u64).to_le_bytes());
        out.extend_from_slice(&(c.len as u64).to_le_bytes());
    }
}

/// A packed message's pieces, (byte offset, bytes) each, and the bytes after the list.
type Decoded<'p> = (Vec<(u64, u64)>, &'p [u8]);

/// Parses a packed message's list.
fn decode_list(p: &[u8]) -> std::result::Result<Decoded<'_>, String> {
    let word =
        |i: usize| -> Option<u64> { Some(u64::from_le_bytes(p.get(i * 8..i * 8 + 8)?.try_into().ok()?)) };
    let count = word(0).ok_or("packed message without a piece count")?;
    let list_end = (count as usize).checked_mul(16).and_then(|b| b.checked_add(8)).filter(|&e| e <= p.len());
    let list_end = list_end.ok_or(format!("packed message claims {count} pieces in {} bytes", p.len()))?;
    let pieces =
        (0..count as usize).map(|k| (word(1 + 2 * k).unwrap_or(0), word(2 + 2 * k).unwrap_or(0))).collect();
    Ok((pieces, &p[list_end..]))
}

impl Comm {
    /// Resolves and checks a transfer between `remote` + `rp` and a local buffer of `local_len`
    /// elements + `lp`.
    fn plan<T: Pod>(
        &self,
        remote: GlobalPtr<T>,
        rp: Pieces<'_>,
        local_len: usize,
        lp: Pieces<'_>,
    ) -> Result<Plan> {
        let size = std::mem::size_of::<T>();
        let lruns = lp.runs(local_len)?;
        if let Some(r) = lruns.iter().find(|r| r.end > local_len) {
            return Err(bad(format!("local piece {r:?} is outside the buffer of {local_len} elements")));
        }
        let total = lp.total()?;
        if rp.total()? != total {
            return Err(bad(format!("the remote side has {} elements, the local side {total}", rp.total()?)));
        }
        let rruns = rp.runs(total)?;
        let extent = rruns.iter().map(|r| r.end).max().unwrap_or(0);
        let (seg, base) =
            self.resolve(remote, extent.checked_mul(size).ok_or_else(|| bad("extent overflow"))?)?;
        // Pair the runs in order, cutting at every boundary of either side.
        let mut copies = Vec::with_capacity(rruns.len().max(lruns.len()));
        let (mut ri, mut li) = (rruns.into_iter(), lruns.into_iter());
        let (mut r, mut l) = (ri.next(), li.next());
        while let (Some(rr), Some(ll)) = (r.clone(), l.clone()) {
            let n = rr.len().min(ll.len());
            copies.push(Copy { remote: base + rr.start * size, local: ll.start * size, len: n * size });
            r = if n == rr.len() { ri.next() } else { Some(rr.start + n..rr.end) };
            l = if n == ll.len() { li.next() } else { Some(ll.start + n..ll.end) };
        }
        Ok(Plan { rank: remote.rank(), seg: seg.clone(), copies, total: total * size })
    }

    /// True if the plan travels packed in AMs.
    fn packed(&self, plan: &Plan) -> bool {
        // With load/store RMA a piece is a memcpy, cheaper than any message (see the `rma`
        // bench's strided rows); elsewhere each RMA costs a network operation.
        let limit = self.cfg.vis_pack_bytes.unwrap_or(if self.caps.load_store { 0 } else { 512 });
        !self.native_rma || plan.total <= plan.copies.len().saturating_mul(limit)
    }

    fn start_put_pieces<T: Pod>(
        &self,
        dst: GlobalPtr<T>,
        dp: Pieces<'_>,
        src: &[T],
        sp: Pieces<'_>,
    ) -> Result<Started> {
        let plan = self.plan(dst, dp, src.len(), sp)?;
        let bytes = bytes_of(src);
        if !self.packed(&plan) {
            let region = plan.seg.remote(plan.rank)?;
            let mut pending = false;
            for c in &plan.copies {
                pending |= matches!(
                    self.fabric.put(region, c.remote, &bytes[c.local..c.local + c.len], 0)?,
                    Issued::Pending
                );
            }
            if pending {
                self.fabric.quiet()?;
            }
            return Ok(Started::Done(0));
        }
        let msgs = pack(&plan.copies, self.caps.am_max_medium, true);
        let op = OpState::new(plan.rank, msgs.len(), 0);
        let token = self.ops.register(&op);
        let mut payload = Vec::new();
        for msg in &msgs {
            payload.clear();
            encode_list(msg, &mut payload);
            msg.iter().for_each(|c| payload.extend_from_slice(&bytes[c.local..c.local + c.len]));
            let args = [plan.seg.id() as u64, token];
            self.send_am(plan.rank, internal::VIS_PUT, AmClass::Request, &args, AmPayload::Medium(&payload))?;
        }
        if msgs.is_empty() {
            return Ok(Started::Done(0));
        }
        Ok(Started::Pending(op))
    }

    /// Writes the elements of `src` that `sp` selects to the places `dp` selects from `dst`
    /// (both in elements, paired in order; totals must match). Returns when the data is
    /// visible at the target.
    ///
    /// ```no_run
    /// # use weft_runtime as weft;
    /// use weft::Pieces;
    /// # let world = weft_runtime::World::init()?;
    /// // A 4 x 8 row-major matrix on every rank; write this rank's 4 values into column 2 of
    /// // rank 0's matrix.
    /// let m = world.alloc_segment::<f64>(32)?;
    /// let col = [1.0, 2.0, 3.0, 4.0];
    /// let column = Pieces::Strided { counts: &[1, 4], strides: &[8] };
    /// world.put_pieces(m.at(0, 2), column, &col, Pieces::Contiguous { start: 0, len: 4 })?;
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn put_pieces<T: Pod>(
        &self,
        dst: GlobalPtr<T>,
        dp: Pieces<'_>,
        src: &[T],
        sp: Pieces<'_>,
    ) -> Result<()> {
        match self.start_put_pieces(dst, dp, src, sp)? {
            Started::Done(_) => Ok(()),
            Started::Pending(op) => self.wait_op(&op).map(drop),
        }
    }

    /// Starts [`Comm::put_pieces`]; `src` may be reused at once, the handle completes when the
    /// data is visible at the target.
    pub fn put_pieces_nb<T: Pod>(
        &self,
        dst: GlobalPtr<T>,
        dp: Pieces<'_>,
        src: &[T],
        sp: Pieces<'_>,
    ) -> Result<RmaHandle<'static>> {
        Ok(match self.start_put_pieces(dst, dp, src, sp)? {
            Started::Done(_) => RmaHandle::done(),
            Started::Pending(op) => RmaHandle::pending(self, op, None),
        })
    }

    /// Starts [`Comm::put_pieces`], completed by the next [`Comm::sync_nbi`] of this thread.
    pub fn put_pieces_nbi<T: Pod>(
        &self,
        dst: GlobalPtr<T>,
        dp: Pieces<'_>,
        src: &[T],
        sp: Pieces<'_>,
    ) -> Result<()> {
        if let Started::Pending(op) = self.start_put_pieces(dst, dp, src, sp)? {
            nbi_push(self.id, op);
        }
        Ok(())
    }

    /// Strided put of an N-d sub-array (GASNet's `gex_VIS_StridedPut`): `counts` elements per
    /// dimension, fastest first; each side with its own strides (`counts.len() - 1` each).
    pub fn put_strided<T: Pod>(
        &self,
        dst: GlobalPtr<T>,
        dst_strides: &[usize],
        src: &[T],
        src_strides: &[usize],
        counts: &[usize],
    ) -> Result<()> {
        let dp = Pieces::Strided { counts, strides: dst_strides };
        self.put_pieces(dst, dp, src, Pieces::Strided { counts, strides: src_strides })
    }

    /// Reads the elements `sp` selects from `src` into the places `dp` selects in `dst`.
    pub fn get_pieces<T: Pod>(
        &self,
        src: GlobalPtr<T>,
        sp: Pieces<'_>,
        dst: &mut [T],
        dp: Pieces<'_>,
    ) -> Result<()> {
        self.get_pieces_nb(src, sp, dst, dp)?.wait()
    }

    /// Strided get of an N-d sub-array (the mirror of [`Comm::put_strided`]).
    pub fn get_strided<T: Pod>(
        &self,
        src: GlobalPtr<T>,
        src_strides: &[usize],
        dst: &mut [T],
        dst_strides: &[usize],
        counts: &[usize],
    ) -> Result<()> {
        let sp = Pieces::Strided { counts, strides: src_strides };
        self.get_pieces(src, sp, dst, Pieces::Strided { counts, strides: dst_strides })
    }

    /// Starts [`Comm::get_pieces`]; `dst` stays borrowed until the handle completes. On a
    /// network pieces of up to 4 KiB are in flight when this returns (while staging slots
    /// are free), larger ones complete before (see [`Comm::get_nb`]); inside [`Comm::nbi`]
    /// all are in flight if their local ranges do not overlap.
    pub fn get_pieces_nb<'a, T: Pod>(
        &self,
        src: GlobalPtr<T>,
        sp: Pieces<'_>,
        dst: &'a mut [T],
        dp: Pieces<'_>,
    ) -> Result<RmaHandle<'a>> {
        self.start_get_pieces(src, sp, dst, dp, None)
    }

    /// [`Comm::get_pieces_nb`]; with `reads`, a network reads the pieces in place (if they
    /// do not overlap), all in flight, the scope keeping `dst` alive.
    fn start_get_pieces<'a, T: Pod>(
        &self,
        src: GlobalPtr<T>,
        sp: Pieces<'_>,
        dst: &'a mut [T],
        dp: Pieces<'_>,
        reads: Option<&ReadScope<'a>>,
    ) -> Result<RmaHandle<'a>> {
        let plan = self.plan(src, sp, dst.len(), dp)?;
        let out = bytes_of_mut(dst);
        if !self.packed(&plan) {
            let region = plan.seg.remote(plan.rank)?;
            if self.caps.load_store || plan.copies.is_empty() || self.fabric.gets_at_once(plan.rank) {
                for c in &plan.copies {
                    self.fabric.get(region, c.remote, &mut out[c.local..c.local + c.len])?;
                }
                return Ok(RmaHandle::done());
            }
            // A network: every piece in flight at once, completing one token.
            let op = OpState::new(plan.rank, plan.copies.len(), 0);
            let token = self.ops.register(&op);
            if let (Some(reads), Some(order)) = (reads, disjoint_order(&plan.copies, out.len())) {
                for (i, (remote, piece)) in split_pieces(out, &plan.copies, &order).into_iter().enumerate() {
                    match self.fabric.get_into(region, remote, reads.dst(piece), token) {
                        Ok(Issued::Done(_)) => self.ops.complete(token, 0, Ok(())),
                        Ok(Issued::Pending) => {}
                        Err(e) => {
                            // Those in flight end the token later (the scope waits for them).
                            for _ in i..plan.copies.len() {
                                self.ops.complete(token, 0, Err(e.clone().into()));
                            }
                            return Err(e.into());
                        }
                    }
                }
                return Ok(RmaHandle::pending(self, op, None));
            }
            let mut staged_any = false;
            for (i, c) in plan.copies.iter().enumerate() {
                match self.fabric.get_nb(region, c.remote, &mut out[c.local..c.local + c.len], token) {
                    Ok(GetIssued::Done) => self.ops.complete(token, 0, Ok(())),
                    Ok(GetIssued::Staged(staged)) => {
                        op.stage(c.local, staged);
                        staged_any = true;
                    }
                    Err(e) => {
                        // The pieces not issued end here; those in flight read into the
                        // fabric's staging, never into `out`, and end the token later.
                        for _ in i..plan.copies.len() {
                            self.ops.complete(token, 0, Err(e.clone().into()));
                        }
                        return Err(e.into());
                    }
                }
            }
            // Only staged pieces are copied at completion (the others are in `out` already).
            return Ok(RmaHandle::pending(self, op, staged_any.then_some(out)));
        }
        let msgs = pack(&plan.copies, self.caps.am_max_medium, false);
        if msgs.is_empty() {
            return Ok(RmaHandle::done());
        }
        let op = OpState::new(plan.rank, msgs.len(), plan.total);
        let token = self.ops.register(&op);
        let (mut payload, mut at) = (Vec::new(), 0usize);
        let mut scatter = Vec::with_capacity(plan.copies.len());
        for msg in &msgs {
            payload.clear();
            encode_list(msg, &mut payload);
            let args = [plan.seg.id() as u64, token, at as u64];
            self.send_am(plan.rank, internal::VIS_GET, AmClass::Request, &args, AmPayload::Medium(&payload))?;
            at += msg.iter().map(|c| c.len).sum::<usize>();
            scatter.extend(msg.iter().map(|c| c.local..c.local + c.len));
        }
        Ok(RmaHandle::pending_scatter(self, op, out, scatter))
    }

    /// The checked local pieces of a packed message for segment `seg`: all or an error text.
    fn vis_pieces(&self, seg: u64, pieces: &[(u64, u64)]) -> std::result::Result<(), String> {
        pieces.iter().try_for_each(|&(off, len)| self.local_view::<u8>(seg, off, len as usize).map(drop))
    }

    pub(crate) fn on_vis_put(&self, m: &AmMsg<'_>) {
        let &[seg, token] = m.args() else {
            return self.record_error(Error::Remote(format!("malformed packed put from rank {}", m.src())));
        };
        let r = decode_list(m.payload()).and_then(|(pieces, data)| {
            let sum = pieces.iter().try_fold(0u64, |a, p| a.checked_add(p.1));
            if sum != Some(data.len() as u64) {
                return Err(format!("packed put: pieces total {sum:?} bytes, data {}", data.len()));
            }
            self.vis_pieces(seg, &pieces)?;
            let mut at = 0;
            for (off, len) in pieces {
                let (v, i) = self.local_view::<u8>(seg, off, len as usize)?;
                v.copy_in(i, &data[at..at + len as usize]);
                at += len as usize;
            }
            Ok(())
        });
        self.reply_done(m, token, 0, 0, r.map(|_| &[][..]));
    }

    pub(crate) fn on_vis_get(&self, m: &AmMsg<'_>) {
        let &[seg, token, data_off] = m.args() else {
            return self.record_error(Error::Remote(format!("malformed packed get from rank {}", m.src())));
        };
        let r = decode_list(m.payload()).and_then(|(pieces, _)| {
            let sum = pieces.iter().try_fold(0u64, |a, p| a.checked_add(p.1));
            if sum.is_none_or(|s| s as usize > self.caps.am_max_medium) {
                return Err(format!("packed get of {sum:?} bytes does not fit one reply"));
            }
            self.vis_pieces(seg, &pieces)?;
            let mut buf = Vec::with_capacity(sum.unwrap_or(0) as usize);
            for (off, len) in pieces {
                let (v, i) = self.local_view::<u8>(seg, off, len as usize)?;
                let at = buf.len();
                buf.resize(at + len as usize, 0);
                v.copy_out(i, &mut buf[at..]);
            }
            Ok(buf)
        });
        match r {
            Ok(buf) => self.reply_done(m, token, 0, data_off, Ok(&buf)),
            Err(e) => self.reply_done(m, token, 0, 0, Err(e)),
        }
    }
}

/// The indices of `copies` in the order of their local offsets if their local ranges lie in
/// `len` bytes without overlapping; `None` otherwise.
fn disjoint_order(copies: &[Copy], len: usize) -> Option<Vec<usize>> {
    let mut order: Vec<usize> = (0..copies.len()).collect();
    order.sort_unstable_by_key(|&i| copies[i].local);
    let mut at = 0usize;
    for &i in &order {
        let c = &copies[i];
        if c.local < at {
            return None;
        }
        at = c.local.checked_add(c.len).filter(|&end| end <= len)?;
    }
    Some(order)
}

/// `out` split at the local ranges of `copies` taken in `order` (from [`disjoint_order`]),
/// each piece with its remote offset.
fn split_pieces<'a>(mut out: &'a mut [u8], copies: &[Copy], order: &[usize]) -> Vec<(usize, &'a mut [u8])> {
    let (mut at, mut pieces) = (0, Vec::with_capacity(order.len()));
    for &i in order {
        let c = &copies[i];
        let (_, rest) = std::mem::take(&mut out).split_at_mut(c.local - at);
        let (piece, rest) = rest.split_at_mut(c.len);
        pieces.push((c.remote, piece));
        (out, at) = (rest, c.local + c.len);
    }
    pieces
}

impl<'env> NbiScope<'_, 'env> {
    /// Starts [`Comm::get_pieces`], complete when the scope ends.
    pub fn get_pieces<T: Pod>(
        &self,
        src: GlobalPtr<T>,
        sp: Pieces<'_>,
        dst: &'env mut [T],
        dp: Pieces<'_>,
    ) -> Result<()> {
        let h = self.comm.start_get_pieces(src, sp, dst, dp, Some(self.reads))?;
        self.gets.borrow_mut().push(h);
        Ok(())
    }
    /// Starts [`Comm::put_pieces`], complete when the scope ends.
    pub fn put_pieces<T: Pod>(
        &self,
        dst: GlobalPtr<T>,
        dp: Pieces<'_>,
        src: &[T],
        sp: Pieces<'_>,
    ) -> Result<()> {
        self.comm.put_pieces_nbi(dst, dp, src, sp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_runs_and_merging() {
        let p = Pieces::Strided { counts: &[2, 3, 2], strides: &[4, 20] };
        let runs = p.runs(100).unwrap();
        assert_eq!(runs, vec![0..2, 4..6, 8..10, 20..22, 24..26, 28..30]);
        // Contiguous rows merge into one run.
        let p = Pieces::Strided { counts: &[4, 3], strides: &[4] };
        assert_eq!(p.runs(12).unwrap(), vec![0..12]);
        assert!(Pieces::Strided { counts: &[2, 2], strides: &[] }.runs(10).is_err());
        assert!(Pieces::Strided { counts: &[usize::MAX, 2], strides: &[1] }.runs(10).is_err());
        let backwards = std::ops::Range { start: 3, end: 1 };
        assert!(Pieces::List(&[0..5, backwards]).total().is_err());
        assert!(Pieces::Strided { counts: &[0, 5], strides: &[3] }.runs(0).unwrap().is_empty());
    }

    #[test]
    fn pieces_split_only_when_disjoint() {
        let c = |local: usize, len| Copy { remote: local.wrapping_mul(10), local, len };
        let copies = [c(8, 4), c(0, 4), c(4, 2)];
        let order = disjoint_order(&copies, 12).unwrap();
        assert_eq!(order, vec![1, 2, 0]);
        let mut out: Vec<u8> = (0..12).collect();
        let pieces = split_pieces(&mut out, &copies, &order);
        let got: Vec<(usize, Vec<u8>)> = pieces.into_iter().map(|(r, p)| (r, p.to_vec())).collect();
        assert_eq!(got, vec![(0, vec![0, 1, 2, 3]), (40, vec![4, 5]), (80, vec![8, 9, 10, 11])]);
        assert!(disjoint_order(&[c(0, 4), c(3, 2)], 12).is_none(), "overlapping");
        assert!(disjoint_order(&[c(10, 4)], 12).is_none(), "past the buffer");
        assert!(disjoint_order(&[c(usize::MAX, 2)], 12).is_none(), "overflowing");
    }

    #[test]
    fn packing_splits_to_fit() {
        let copies: Vec<Copy> =
            (0..100).map(|i| Copy { remote: i * 1000, local: i * 100, len: 100 }).collect();
        for with_data in [true, false] {
            let msgs = pack(&copies, 1024, with_data);
            let moved: usize = msgs.iter().flatten().map(|c| c.len).sum();
            assert_eq!(moved, 100 * 100);
            for m in &msgs {
                let data: usize = m.iter().map(|c| c.len).sum();
                let size =
                    if with_data { header_bytes(m.len()) + data } else { header_bytes(m.len()).max(data) };
                assert!(size <= 1024, "{size}");
            }
        }
        let big = [Copy { remote: 0, local: 0, len: 10_000 }];
        let msgs = pack(&big, 1024, true);
        assert_eq!(msgs.iter().flatten().map(|c| c.len).sum::<usize>(), 10_000);
        let mut buf = vec![];
        encode_list(&msgs[0], &mut buf);
        let (pieces, rest) = decode_list(&buf).unwrap();
        assert_eq!(pieces, vec![(0, msgs[0][0].len as u64)]);
        assert!(rest.is_empty());
        assert!(decode_list(&[1, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(decode_list(&u64::MAX.to_le_bytes()).is_err());
    }
}
