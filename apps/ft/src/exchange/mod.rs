//! How the transpose's data reaches its owner: the [`Transport`] trait and its two models,
//! [`OneSided`] (puts into the owner's segment, completed by a flag per source) and
//! [`TwoSided`] (messages matched at the receiver against receives it posted, on weft AMs).
//!
//! Every rank receives into an [`Inbox`]: a segment holding two buffers of the transform's
//! size, used by alternate epochs. A sender can be at most one transform ahead of a receiver
//! (it needs the receiver's data of the current transform before it can finish it), so while
//! a rank still reads epoch `e`'s buffer, peers write only epoch `e + 1`'s.

mod onesided;
mod twosided;

pub use onesided::OneSided;
pub use twosided::{Mailbox, TwoSided};

use crate::local_fft::C64;
use crate::Error;
use weft_runtime::{LocalView, Segment};

/// Bytes of one point (a complex double).
pub const POINT: usize = std::mem::size_of::<C64>();

/// The global shape of one distributed transform: input `[c/P][b][a]` (a fastest, c split
/// over ranks), output `[b/P][a][c]` (c fastest, b split over ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Points along the first (contiguous) input dimension.
    pub a: usize,
    /// Points along the second input dimension, split over ranks in the output.
    pub b: usize,
    /// Points along the input's split dimension, the last one transformed.
    pub c: usize,
    /// Ranks.
    pub ranks: usize,
    /// This rank.
    pub me: usize,
}

impl Shape {
    /// Input planes on each rank.
    pub fn c_local(&self) -> usize {
        self.c / self.ranks
    }
    /// Output rows (of the b dimension) on each rank.
    pub fn b_local(&self) -> usize {
        self.b / self.ranks
    }
    /// Points on each rank.
    pub fn local_points(&self) -> usize {
        self.a * self.b * self.c / self.ranks
    }
    /// Element offset in a receiver's buffer where `src`'s part starts: received data is laid
    /// out `[c][a][b_local]`, and `src` holds planes `src·c_local ..`.
    pub fn region(&self, src: usize) -> usize {
        src * self.c_local() * self.a * self.b_local()
    }
}

/// The messages of one source in one epoch: `count` messages of `unit` points, consecutive
/// in the receiver's buffer (message `i` lands at `region(src) + i·unit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pattern {
    /// Messages per source and epoch.
    pub count: usize,
    /// Points per message.
    pub unit: usize,
}

/// Two receive buffers of `points` complex values in one segment.
pub struct Inbox {
    seg: Segment<u8>,
    points: usize,
}

impl Inbox {
    /// Bytes of a segment for two buffers of `points`.
    pub fn bytes(points: usize) -> usize {
        2 * points * POINT
    }
    /// Wraps a segment of at least [`Inbox::bytes`]`(points)` bytes.
    pub fn new(seg: Segment<u8>, points: usize) -> Inbox {
        assert!(seg.len() >= Inbox::bytes(points), "inbox segment too small");
        Inbox { seg, points }
    }
    /// Points each buffer holds.
    pub fn points(&self) -> usize {
        self.points
    }
    /// The segment.
    pub fn segment(&self) -> &Segment<u8> {
        &self.seg
    }
    /// Byte offset of the buffer that epoch `epoch` uses.
    pub fn base(&self, epoch: u64) -> usize {
        (epoch % 2) as usize * self.points * POINT
    }
    /// Byte offset where message `index` from `src` lands in epoch `epoch`.
    pub fn message_at(
        &self,
        epoch: u64,
        shape: &Shape,
        pattern: &Pattern,
        src: usize,
        index: usize,
    ) -> usize {
        self.base(epoch) + (shape.region(src) + index * pattern.unit) * POINT
    }
    /// This rank's view of the segment.
    pub fn view(&self) -> LocalView<'_, u8> {
        self.seg.local()
    }
}

/// Moves one transform's data to its owners (see the module documentation).
pub trait Transport {
    /// Starts epoch `epoch` (1, 2, ...) of a transform of `shape` whose messages follow
    /// `pattern`; a two-sided receiver posts its receives here.
    fn begin(&mut self, epoch: u64, shape: Shape, pattern: Pattern) -> Result<(), Error>;
    /// Sends message `index` of this rank's part to `dst`, another rank.
    fn send(&mut self, dst: usize, index: usize, data: &[C64]) -> Result<(), Error>;
    /// Lets arriving messages make progress while this rank computes.
    fn progress(&mut self) -> Result<(), Error>;
    /// Completes the epoch: everything sent is at its target and everything expected here.
    fn finish(&mut self) -> Result<(), Error>;
    /// The receive buffer and the epoch in use.
    fn inbox(&self) -> (&Inbox, u64);

    /// Places message `index` of this rank's own part in its own buffer.
    fn keep(&mut self, index: usize, data: &[C64], shape: &Shape, pattern: &Pattern) {
        let (inbox, epoch) = self.inbox();
        inbox
            .view()
            .copy_in(inbox.message_at(epoch, shape, pattern, shape.me, index), bytemuck::cast_slice(data));
    }
}
