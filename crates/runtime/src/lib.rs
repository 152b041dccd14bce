//! # weft-runtime — the runtime layer of weft
//!
//! A [`World`] is one process's (rank's) membership of an SPMD job. Through it a program:
//! - allocates remotely accessible [`Segment`]s collectively and names any rank's elements with
//!   typed [`GlobalPtr`]s (every access bounds- and alignment-checked);
//! - moves data one-sidedly with put/get in three completion styles: blocking, non-blocking with
//!   a [`RmaHandle`] (also a `Future`), and implicit (NBI) completed by [`Comm::sync_nbi`];
//! - updates remote `u64`s atomically;
//! - sends active messages (short, medium, long; request and reply) to handlers registered with
//!   [`Builder::handler`];
//! - synchronises with [`Comm::barrier`].
//!
//! Progress happens in every wait, in [`Comm::poll`], and optionally on a progress thread.
//! Waits spin briefly, then yield, then sleep on the fabric's doorbell, so oversubscribed jobs
//! (more ranks than cores) do not crawl. A wait that depends on a rank that died or left fails
//! with [`Error::PeerFailed`] instead of hanging.
//!
//! ```no_run
//! # use weft_runtime as weft;
//! use weft::{World, AmHandler};
//! let mut b = World::builder();
//! let hello: AmHandler = b.handler("hello", |am| println!("rank {} says {:?}", am.src(), am.args()));
//! let world = b.init()?;
//! let seg = world.alloc_segment::<u64>(1024)?;
//! let right = (world.rank() + 1) % world.size();
//! world.put(seg.at(right, 0), &[world.rank() as u64])?;
//! world.am_request_short(right, hello, &[42])?;
//! world.barrier()?;
//! assert_eq!(seg.local().read(0), ((world.rank() + world.size() - 1) % world.size()) as u64);
//! # Ok::<(), weft_runtime::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod am;
mod collective;
mod completion;
pub mod config;
mod dist;
pub mod endpoint;
mod error;
mod fallback;
mod global_ptr;
pub mod layer;
mod ops;
mod progress;
mod progress_thread;
mod rma;
mod segment;
mod startup;
mod team;
mod vis;
mod world;

pub use am::{AmHandler, AmMsg};
pub use completion::Held;
pub use config::{Config, FabricChoice, Progress, RmaPath};
pub use dist::{current, Dist};
pub use endpoint::{CqSharing, Endpoint, EndpointConfig, EndpointPolicy, EndpointResources, EndpointSet};
pub use error::{Error, Result};
pub use ops::{AtomicHandle, GetVec, RmaHandle};
pub use progress::{block_on, RMA_WAIT_SLEEP};
pub use rma::NbiScope;
pub use segment::{GlobalPtr, Segment};
pub use startup::{end_job, launched};
pub use team::coll::Number;
pub use team::{CollHandle, ReduceOp, Team};
pub use vis::Pieces;
pub use weft_fabric::order::full_fence;
pub use weft_fabric::pod::{LocalView, Pod};
pub use weft_fabric::pool::Block;
pub use weft_fabric::prefault::populate_code;
pub use weft_fabric::signals::{at_exit, at_fork_child};
pub use weft_fabric::{AtomicOp, Caps, Exposure, FabricStats, PeerState, Registration, Resource};
pub use world::{Builder, Comm, Info, Stats, World, LAYERS};
