//! The control block at the start of every rank's inbox file.

use crate::{FabricError, FabricResult};
use std::sync::atomic::AtomicU32;

/// Bytes reserved for the control block (one page; rings follow, 64-aligned).
pub const CONTROL_BYTES: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"WEFTSHM1");

/// Life cycle of a rank, as peers see it.
#[repr(u32)]
pub enum State {
    /// Zero in a fresh block: set up, not yet past the start-up barrier.
    #[allow(dead_code)]
    Starting = 0,
    Running = 1,
    Finalized = 2,
}

#[repr(C, align(64))]
pub struct Line<T>(T);

/// Layout of the control block. Fields that different parties write live on separate lines.
#[repr(C)]
pub struct Control {
    magic: u64,
    rank: u32,
    size: u32,
    slots: u32,
    pid: u32,
    /// [`State`], written by the owner.
    pub state: Line<AtomicU32>,
    wake: Line<Wake>,
    attached_line: Line<AtomicU32>,
    /// Bumped by an endpoint slot's doorbell after it wrote messages to this rank: pollers
    /// scan the slot inboxes only when it moved.
    slot_bell: Line<AtomicU32>,
}

#[repr(C)]
pub struct Wake {
    /// Threads of the owner sleeping on the doorbell.
    pub sleepers: AtomicU32,
    /// Bumped by senders to wake sleepers (a futex word).
    pub doorbell: AtomicU32,
}

impl std::ops::Deref for Line<AtomicU32> {
    type Target = AtomicU32;
    fn deref(&self) -> &AtomicU32 {
        &self.0
    }
}

impl std::ops::Deref for Line<Wake> {
    type Target = Wake;
    fn deref(&self) -> &Wake {
        &self.0
    }
}

const _: () = assert!(std::mem::size_of::<Control>() <= CONTROL_BYTES);

impl Control {
    /// Writes a fresh control block.
    ///
    /// # Safety
    /// `p` must point to at least [`CONTROL_BYTES`] zeroed, 64-aligned bytes not yet shared.
    pub unsafe fn init(p: *mut u8, rank: u32, size: u32, slots: u32, pid: u32) {
        let c = p.cast::<Control>();
        // SAFETY: per the contract, p is valid, aligned and exclusively ours; the atomics are
        // already zero (State::Starting).
        unsafe {
            (*c).magic = MAGIC;
            (*c).rank = rank;
            (*c).size = size;
            (*c).slots = slots;
            (*c).pid = pid;
        }
    }

    /// Views a published control block.
    ///
    /// # Safety
    /// `p` must point to a control block initialised by [`Control::init`] that stays mapped for
    /// `'a`. After publication only the atomic fields are written.
    pub unsafe fn at<'a>(p: *const u8) -> &'a Control {
        // SAFETY: per the contract.
        unsafe { &*p.cast::<Control>() }
    }

    /// Checks that the block belongs to rank `rank` of a job like ours.
    pub fn check(&self, rank: u32, size: u32, slots: u32) -> FabricResult<()> {
        if self.magic != MAGIC || self.rank != rank || self.size != size || self.slots != slots {
            return Err(FabricError::Mismatch {
                what: format!(
                    "rank {rank}'s inbox says rank {} of {} with {} ring slots, expected {size} ranks and {slots} slots",
                    self.rank, self.size, self.slots
                ),
            });
        }
        Ok(())
    }

    /// Process id of the owner.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Counter of ranks that have mapped every inbox (used in rank 0's block at start-up).
    pub fn attached(&self) -> &AtomicU32 {
        &self.attached_line
    }

    /// The endpoint slots' doorbell of this rank.
    pub fn slot_bell(&self) -> &AtomicU32 {
        &self.slot_bell
    }
}

impl std::ops::Deref for Control {
    type Target = Wake;
    fn deref(&self) -> &Wake {
        &self.wake
    }
}
