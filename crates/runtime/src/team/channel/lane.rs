//! The sending side of a team channel: one message to one receiver, by the lane its length
//! picks (see [`Channels::send`](super::Channels)).

use super::*;

/// One message on its way to one receiver (see [`Channels::send`]).
pub(super) struct Lane<'a, 'c> {
    pub ch: &'a Channels,
    pub comm: &'c crate::Comm,
    pub me: usize,
    pub n: usize,
    pub dst: u32,
    pub tag: u64,
    pub o: &'a Out<'a>,
}

impl Lane<'_, '_> {
    /// True once the receiver drained `need` messages (the cached count first).
    fn drained_at_least(&self, peer: &mut Peer, need: u64) -> Result<bool> {
        if peer.drained < need {
            peer.drained =
                self.comm.atomic_load(self.ch.flags.at(self.dst, drained_word(self.n, self.me)))?;
        }
        Ok(peer.drained >= need)
    }

    /// Writes message `sent + 1`'s line words after `filled` (header, and inline data), then
    /// stores the message number into `filled`, in one put with signal. Message m goes into
    /// line (m - 1) % LINES.
    fn publish(&self, sent: u64, words: &[u64]) -> Result<()> {
        let line = line_word(self.me, sent);
        self.comm.put_signal_within(&self.ch.flags, self.dst, line + 1, words, line, sent + 1)?;
        self.comm.fabric.notify(self.dst);
        Ok(())
    }

    fn header(&self, addr: u64) -> [u64; 3] {
        [self.o.data.len() as u64, self.tag, addr]
    }

    /// One record of the packed ring: its data word, then its header (with the message
    /// number) as the signal. Free once the message `RECORDS` before this one was drained
    /// (the record's last user came no later). `done` becomes 1 when it is out.
    pub fn packed(&self, peer: &mut Peer, done: &mut u64) -> Result<bool> {
        if !self.drained_at_least(peer, (peer.sent + 1).saturating_sub(RECORDS as u64))? {
            return Ok(false);
        }
        let data = self.o.data;
        let mut word = [0u64; 1];
        bytes_of_mut(&mut word)[..data.len()].copy_from_slice(data);
        let rec = record_word(self.n, self.me, peer.packed_sent);
        let head = record_header(peer.sent + 1, data.len(), self.tag);
        let words = &word[..data.len().div_ceil(8)];
        self.comm.put_signal_within(&self.ch.flags, self.dst, rec + 1, words, rec, head)?;
        self.comm.fabric.notify(self.dst);
        peer.sent += 1;
        peer.packed_sent += 1;
        *done = 1;
        Ok(true)
    }

    /// Announces the buffer (its address, or its place in a segment both hold), which the
    /// receiver reads. `done`: 0 not announced, 1 announced (the receiver is reading), 2
    /// read: the buffer is free again once the receiver drained this very message.
    pub fn direct(&self, peer: &mut Peer, done: &mut u64, in_segment: Option<(u32, usize)>) -> Result<bool> {
        if *done == 0 && self.drained_at_least(peer, line_free(peer.sent))? {
            match in_segment {
                Some((seg, off)) => {
                    let [len, tag, _] = self.header(0);
                    self.publish(peer.sent, &[len, tag, IN_SEGMENT | seg as u64, off as u64])?;
                }
                None => self.publish(peer.sent, &self.header(self.o.data.as_ptr() as u64))?,
            }
            peer.sent += 1;
            *done = 1;
        }
        if *done == 1 && self.drained_at_least(peer, peer.sent)? {
            *done = 2;
        }
        Ok(*done == 2)
    }

    /// Chunks through the flag line (inline data), a sub-slot, or the whole slot (pipelined
    /// halves for one-way messages). `done`: chunks sent so far.
    pub fn chunks(&self, peer: &mut Peer, done: &mut u64) -> Result<bool> {
        let data = self.o.data;
        let pipelined = self.tag & PIPELINED != 0;
        let slot = self.ch.slot;
        let total = slot.chunks(data.len(), pipelined);
        let kind = slot.kind(data.len());
        let (me, dst, slots) = (self.me, self.dst, &self.ch.slots);
        while *done < total {
            // A message needs its line; in a sub-slot also the end of the last whole-slot
            // message; a whole-slot chunk needs everything sent before drained.
            let need = match kind {
                Kind::Inline => line_free(peer.sent),
                Kind::Sub => line_free(peer.sent).max(sub_free(peer.sent)).max(peer.whole),
                // The first chunk: everything before drained (sub-slots span both halves);
                // chunk j > 0: chunk j - 2, in the same half, drained.
                Kind::Whole if *done == 0 || !pipelined => peer.sent,
                Kind::Whole => peer.sent - 1,
            };
            if !self.drained_at_least(peer, need)? {
                break;
            }
            let chunk = &data[slot.chunk_range(*done, data.len(), pipelined)];
            match kind {
                Kind::Inline => {
                    // Header and data in the flag's line: one put with signal.
                    let mut words = [0u64; LINE - 1];
                    (words[0], words[1]) = (data.len() as u64, self.tag);
                    bytes_of_mut(&mut words[3..])[..chunk.len()].copy_from_slice(chunk);
                    self.publish(peer.sent, &words[..3 + chunk.len().div_ceil(8)])?;
                }
                Kind::Sub => {
                    self.comm.put(slots.at(dst, me * slot.bytes() + slot.sub_slot(peer.sent)), chunk)?;
                    self.publish(peer.sent, &self.header(0))?;
                }
                Kind::Whole => {
                    self.comm
                        .put(slots.at(dst, me * slot.bytes() + slot.chunk_at(*done, pipelined)), chunk)?;
                    self.publish(peer.sent, &self.header(0))?;
                    peer.whole = peer.sent + 1;
                }
            }
            peer.sent += 1;
            *done += 1;
        }
        Ok(*done == total)
    }
}

/// Message m (= `sent` + 1) goes into line (m - 1) % LINES, free once message m - LINES was
/// drained.
fn line_free(sent: u64) -> u64 {
    (sent + 1).saturating_sub(LINES as u64)
}

/// Message m's sub-slot (m - 1) % SUBS is free once message m - SUBS was drained.
fn sub_free(sent: u64) -> u64 {
    (sent + 1).saturating_sub(SUBS as u64)
}
