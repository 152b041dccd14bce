//! Endpoint transmit slots on the hybrid fabric.
//!
//! A slot inbox is a pair: the shared-memory fabric's (rings from this host's ranks' slots,
//! numbered by local rank) and the libfabric fabric's (a context: a domain of its own). Its
//! descriptor joins the two descriptors as a region's does. A transmit slot is likewise a
//! shared-memory slot and a libfabric slot opened with the same numbers; each request AM and
//! each put takes the one its destination's route names, so threads on different slots share
//! no path to any rank. Puts to this host's ranks stay CPU copies on the world's path
//! ([`TxSlot::put`] declines them), as on the shared-memory fabric alone.

use super::{join_desc, send_routed, split_desc, Parts, Route};
use crate::{
    AmOut, AtomicOp, Fabric, FabricError, FabricResult, LocalRegion, Rank, RemoteRegion, Resource, TxSlot,
};
use std::sync::{Arc, MutexGuard};

/// One open slot inbox: the two fabrics' inboxes. The runtime knows it by the shared-memory
/// region's id.
pub(super) struct Inbox {
    near: LocalRegion,
    far: LocalRegion,
}

impl Parts {
    fn slot_inboxes(&self) -> MutexGuard<'_, Vec<Inbox>> {
        self.slot_inboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot counts of this host's ranks (by local rank) out of the job's.
    fn local_counts(&self, slots: &[u32]) -> FabricResult<Vec<u32>> {
        if slots.len() != self.size as usize {
            return Err(FabricError::Mismatch {
                what: format!("slot counts for {} ranks in a job of {}", slots.len(), self.size),
            });
        }
        Ok(self.global.iter().map(|&g| slots[g as usize]).collect())
    }
}

/// [`crate::Fabric::open_slot_inbox`]: both fabrics' inboxes, under one region.
pub(super) fn open_inbox(p: &Parts, slots: &[u32], ring_bytes: usize) -> FabricResult<LocalRegion> {
    let near = p.shm.open_slot_inbox(&p.local_counts(slots)?, ring_bytes)?;
    let far = match p.ofi.open_slot_inbox(slots, ring_bytes) {
        Ok(far) => far,
        Err(e) => {
            // Empty (nobody has its descriptor yet), so it closes at once.
            let _ = p.shm.close_slot_inbox(&near);
            return Err(e);
        }
    };
    let region = LocalRegion::new(near.id, near.mapping().clone(), join_desc(&near.desc, &far.desc));
    p.slot_inboxes().push(Inbox { near, far });
    Ok(region)
}

/// [`crate::Fabric::close_slot_inbox`]: the shared-memory inbox first (it may still hold
/// messages), then the libfabric context.
pub(super) fn close_inbox(p: &Parts, region: &LocalRegion) -> FabricResult<bool> {
    let mut inboxes = p.slot_inboxes();
    let at = inboxes.iter().position(|i| i.near.id == region.id).ok_or_else(|| FabricError::Malformed {
        what: format!("region {} is no endpoint slot inbox", region.id),
    })?;
    if !p.shm.close_slot_inbox(&inboxes[at].near)? {
        return Ok(false);
    }
    let inbox = inboxes.swap_remove(at);
    drop(inboxes);
    p.ofi.close_slot_inbox(&inbox.far)
}

/// [`crate::Fabric::open_tx_slots`]: slots `first..first + count` of both fabrics, paired.
pub(super) fn open_tx(
    p: &Arc<Parts>,
    inboxes: &[Vec<u8>],
    slots: &[u32],
    first: u32,
    count: u32,
) -> FabricResult<Vec<Box<dyn TxSlot>>> {
    let local = p.local_counts(slots)?;
    if inboxes.len() != p.size as usize {
        return Err(FabricError::Mismatch {
            what: format!("{} slot inbox descriptors in a job of {}", inboxes.len(), p.size),
        });
    }
    let split = inboxes.iter().map(|d| split_desc(d)).collect::<FabricResult<Vec<_>>>()?;
    let near_descs: Vec<Vec<u8>> = p.global.iter().map(|&g| split[g as usize].0.to_vec()).collect();
    let far_descs: Vec<Vec<u8>> = split.iter().map(|d| d.1.to_vec()).collect();
    let near = p.shm.open_tx_slots(&near_descs, &local, first, count)?;
    let far = p.ofi.open_tx_slots(&far_descs, slots, first, count)?;
    if near.len() != far.len() {
        return Err(FabricError::Mismatch {
            what: format!("{} shared-memory slots against {} libfabric slots", near.len(), far.len()),
        });
    }
    Ok(near
        .into_iter()
        .zip(far)
        .map(|(near, far)| Box::new(HybridTxSlot { near, far, parts: p.clone() }) as Box<dyn TxSlot>)
        .collect())
}

/// A shared-memory slot to this host's ranks and a libfabric slot to the others.
struct HybridTxSlot {
    near: Box<dyn TxSlot>,
    far: Box<dyn TxSlot>,
    parts: Arc<Parts>,
}

impl TxSlot for HybridTxSlot {
    fn am_try_send(&mut self, dst: Rank, msg: &AmOut<'_>) -> FabricResult<bool> {
        let (near, far) = (&mut self.near, &mut self.far);
        send_routed(self.parts.route(dst)?, msg, |l, m| near.am_try_send(l, m), |m| far.am_try_send(dst, m))
    }

    fn doorbell(&mut self) {
        self.near.doorbell();
        self.far.doorbell();
    }

    fn carries_rma(&self) -> bool {
        self.far.carries_rma()
    }

    fn put(&mut self, dst: &RemoteRegion, offset: usize, src: &[u8], more: bool) -> FabricResult<bool> {
        match self.parts.route(dst.rank)? {
            // A CPU copy on the world's path.
            Route::Shm(_) => Ok(false),
            Route::Ofi => self.far.put(dst, offset, src, more),
        }
    }

    fn carries_rma_to(&self, dst: Rank) -> bool {
        matches!(self.parts.route(dst), Ok(Route::Ofi)) && self.far.carries_rma()
    }

    fn put_from(
        &mut self,
        dst: (&RemoteRegion, usize),
        src: (&LocalRegion, usize),
        len: usize,
    ) -> FabricResult<bool> {
        match self.parts.route(dst.0.rank)? {
            Route::Shm(_) => Ok(false),
            Route::Ofi => self.far.put_from(dst, src, len),
        }
    }

    fn get(&mut self, src: &RemoteRegion, offset: usize, dst: &mut [u8]) -> FabricResult<bool> {
        match self.parts.route(src.rank)? {
            Route::Shm(_) => Ok(false),
            Route::Ofi => self.far.get(src, offset, dst),
        }
    }

    fn atomic(
        &mut self,
        dst: (&RemoteRegion, usize),
        op: AtomicOp,
        fetch: bool,
    ) -> FabricResult<Option<u64>> {
        match self.parts.route(dst.0.rank)? {
            Route::Shm(_) => Ok(None),
            Route::Ofi => self.far.atomic(dst, op, fetch),
        }
    }

    fn complete(&mut self) -> FabricResult<bool> {
        let near = self.near.complete()?;
        Ok(self.far.complete()? && near)
    }

    fn resources(&self) -> Resource {
        let (n, f) = (self.near.resources(), self.far.resources());
        Resource {
            kind: format!("{} (this host) + {} (other hosts)", n.kind, f.kind),
            count: n.count + f.count,
            bytes: n.bytes + f.bytes,
        }
    }
}
