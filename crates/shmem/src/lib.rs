//! OpenSHMEM 1.5 for C and C++ programs, on weft: the library `libweft_shmem` (shared and
//! static) behind the header `include/shmem.h`.
//!
//! A PE is a weft rank: `shmem_init` starts weft's world (from `weft run`, `mpirun` or
//! `srun`, as any weft program), and the symmetric heap is one weft segment of
//! `SHMEM_SYMMETRIC_SIZE` bytes (default 1 GiB of address space) on every PE. A symmetric address is an
//! offset in it: every routine checks the PE and the address range and turns them into a
//! weft global address, so a wrong PE, an address outside symmetric memory or a size that
//! overflows ends the job with a message naming the routine, never a stray write.
//!
//! C programs build with `weft cc` (or `weft c++`) and run with `weft run -n N ./prog`.
//! The routines are C functions; from Rust, use weft itself.

mod amo;
mod cabi;
mod coll;
mod collectives;
mod ctx;
mod exchange;
mod heap;
mod lock;
mod p2p;
mod rma;
mod setup;
mod state;
mod sync;
mod team;
mod watch;
