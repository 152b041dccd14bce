//! One-sided model: puts straight into the owner's inbox; completion by one `sync_nbi` and a
//! flag per source (the epoch number, stored with release ordering after the data).

use super::{Inbox, Pattern, Shape, Transport};
use crate::local_fft::C64;
use crate::Error;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use weft_runtime::{Comm, Segment};

/// Puts into the receiver's segment; needs nothing from the receiver's CPU.
pub struct OneSided {
    comm: Arc<Comm>,
    inbox: Arc<Inbox>,
    flags: Arc<Segment<u64>>,
    epoch: u64,
    shape: Option<(Shape, Pattern)>,
}

impl OneSided {
    /// A transport over `inbox`, with `flags` (one word per rank on every rank).
    pub fn new(comm: Arc<Comm>, inbox: Arc<Inbox>, flags: Arc<Segment<u64>>) -> OneSided {
        OneSided { comm, inbox, flags, epoch: 0, shape: None }
    }
}

impl Transport for OneSided {
    fn begin(&mut self, epoch: u64, shape: Shape, pattern: Pattern) -> Result<(), Error> {
        if epoch <= self.epoch {
            return Err(Error::Protocol(format!("epoch {epoch} after epoch {}", self.epoch)));
        }
        if shape.local_points() > self.inbox.points() {
            return Err(Error::Protocol("transform larger than the inbox".into()));
        }
        self.epoch = epoch;
        self.shape = Some((shape, pattern));
        Ok(())
    }

    fn send(&mut self, dst: usize, index: usize, data: &[C64]) -> Result<(), Error> {
        let (shape, pattern) = self.shape.ok_or(Error::Protocol("send outside an epoch".into()))?;
        let at = self.inbox.message_at(self.epoch, &shape, &pattern, shape.me, index);
        self.comm.put_nbi(self.inbox.segment().at(dst as u32, at), bytemuck::cast_slice::<C64, u8>(data))?;
        Ok(())
    }

    fn progress(&mut self) -> Result<(), Error> {
        Ok(())
    }

    fn finish(&mut self) -> Result<(), Error> {
        let (shape, _) = self.shape.take().ok_or(Error::Protocol("finish outside an epoch".into()))?;
        self.comm.sync_nbi()?;
        let me = shape.me;
        for dst in (0..shape.ranks).filter(|&r| r != me) {
            self.comm.atomic_store(self.flags.at(dst as u32, me), self.epoch)?;
        }
        let flags = self.flags.local();
        let epoch = self.epoch;
        self.comm.wait_until(|| {
            (0..shape.ranks).filter(|&r| r != me).all(|r| flags.atomic(r).load(Ordering::Acquire) >= epoch)
        })?;
        Ok(())
    }

    fn inbox(&self) -> (&Inbox, u64) {
        (&self.inbox, self.epoch)
    }
}
