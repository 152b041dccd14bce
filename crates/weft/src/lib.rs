//! # weft
//!
//! A communication runtime for programs made of many multithreaded processes (ranks) on one or
//! many nodes: one-sided RMA with three completion styles, remote atomics, active messages,
//! remote functions, teams and collectives, endpoints. The launcher (`weft run`) and the
//! benchmarks (`weft bench`) are the `weft` command, in the workspace's root package.
//!
//! This crate re-exports the runtime layer ([`weft_runtime`]), the RPC layer ([`rpc`]:
//! [`remote!`] functions, [`RmaVec`], [`SerializeBuffer`]), distributed arrays ([`array`]:
//! [`AtomicArray`] and its aggregated batch operations) and the aggregation they ride on
//! ([`agg`]); the byte-moving layer is [`fabric`]. Start ranks with `weft run -n 4 -- ./my-program`.
//!
//! ```no_run
//! let world = weft::World::init()?;
//! let seg = world.alloc_segment::<u64>(1)?;
//! let next = (world.rank() + 1) % world.size();
//! world.put(seg.at(next, 0), &[world.rank() as u64])?;
//! world.barrier()?;
//! println!("rank {} got {}", world.rank(), seg.local().read(0));
//! # Ok::<(), weft::Error>(())
//! ```
#[doc(inline)]
pub use weft_agg as agg;
#[doc(inline)]
pub use weft_array as array;
pub use weft_array::{AtomicArray, BatchHandle, Distribution, Mapped};
#[doc(inline)]
pub use weft_fabric as fabric;
#[doc(inline)]
pub use weft_rpc as rpc;
pub use weft_rpc::{remote, CallFuture, EndpointRpcExt, RmaVec, RpcExt, Sent, SerializeBuffer};
pub use weft_runtime::*;
