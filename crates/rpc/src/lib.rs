//! # weft-rpc — remote functions with zero-copy arguments
//!
//! Any function declared with [`remote!`] can be called on any rank with serde arguments; the
//! call returns a future of the result. Small arguments are copied into the message; large
//! buffers ([`SerializeBuffer`], [`RmaVec`], any byte string above the threshold) travel as
//! chunks that the target pulls straight from the caller's memory (see [`archive`] and
//! [`proto`]).
//!
//! ```no_run
//! # mod weft { pub use weft_runtime::*; pub use weft_rpc::*; }
//! use weft::{remote, RmaVec, RpcExt};
//! remote! {
//!     /// Sums a vector that arrives in the target's registered pool.
//!     pub fn sum(v: RmaVec<f64>) -> f64 { v.iter().sum() }
//! }
//! let world = weft::World::init()?;
//! let v = RmaVec::from_slice(&world, &vec![1.0; 1 << 20])?;
//! let total = world.call(1 % world.size(), sum, (v,)).wait()?;
//! assert_eq!(total, (1 << 20) as f64);
//! # Ok::<(), weft_runtime::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod archive;
mod buffer;
mod calls;
pub mod fuzz;
mod numbers;
pub mod proto;
mod registry;
mod tasks;

pub use buffer::{Received, RmaVec, SerializeBuffer};
pub use proto::{CallFuture, EndpointRpcExt, RpcExt, RpcStats, Sent};
pub use registry::{fn_id, BoxFuture, Registration, RemoteFn, REMOTE_FNS};

#[doc(hidden)]
pub use linkme as __linkme;

use std::sync::{Arc, OnceLock};
use weft_runtime::layer::{Layer, LayerBuilder};
use weft_runtime::{Builder, Comm, Error, Result};

/// Every world of a program that links this crate has the RPC layer: it is one of the runtime's
/// [`weft_runtime::LAYERS`], so `World::init` and `World::builder` install it.
#[linkme::distributed_slice(weft_runtime::LAYERS)]
static RPC_LAYER: fn(&mut Builder) = install;

/// Installs the RPC layer into `b`: its AM handlers, progress hook and start-up steps.
fn install(b: &mut Builder) {
    // The handlers reach the RPC state directly (it is made after them: it needs their ids).
    let slot: Arc<OnceLock<Arc<Rpc>>> = Arc::default();
    let s = slot.clone();
    let msg = b.handler("weft.rpc.msg", move |am| {
        if let Some(r) = s.get() {
            r.on_msg(am)
        }
    });
    let s = slot.clone();
    let ack = b.handler("weft.rpc.ack", move |am| {
        if let Some(r) = s.get() {
            r.on_ack(am)
        }
    });
    let rpc = Arc::new(proto::Rpc::new(msg, ack));
    let _ = slot.set(rpc.clone());
    b.extension(rpc.clone());
    let r = rpc.clone();
    b.liveness_hook(Arc::new(move |_: &Comm, gone: &dyn Fn(u32) -> Option<weft_runtime::Error>| {
        r.fail_gone(gone)
    }));
    b.progress_hook(Arc::new(move |c: &Comm| rpc.progress(c)));
    b.on_start(Box::new(|c: &Comm| {
        WORLD_RANK.store(c.rank(), std::sync::atomic::Ordering::Relaxed);
        Rpc::of(c)?.start(c)
    }));
}

/// The RPC state of a world.
pub use proto::Rpc;

static WORLD_RANK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);

/// This process's rank (for remote functions, which run without a handle to the world);
/// `u32::MAX` before a world with the RPC layer started.
pub fn world_rank() -> u32 {
    WORLD_RANK.load(std::sync::atomic::Ordering::Relaxed)
}

const NO_RPC: Error = Error::Misuse("this world has no RPC layer (the program does not link weft-rpc)");

impl Rpc {
    /// The RPC layer of `comm`, or an error if the world was built without it.
    pub fn of(comm: &Comm) -> Result<Arc<Rpc>> {
        comm.extension::<Rpc>().ok_or(NO_RPC)
    }

    /// [`Rpc::of`] as a borrow of the world (no reference count touched: the call path).
    pub fn get(comm: &Comm) -> Result<&Rpc> {
        comm.extension_ref::<Rpc>().ok_or(NO_RPC)
    }
}
