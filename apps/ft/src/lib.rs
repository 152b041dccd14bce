//! # weft-ft — the NAS FT benchmark on weft
//!
//! NPB FT solves a 3-D diffusion equation spectrally: a forward 3-D FFT of random initial
//! data, then for each time step an evolution in frequency space, an inverse 3-D FFT and a
//! checksum, verified against NPB's reference values. Each 3-D FFT needs one global
//! transpose, which is where the communication is. Following Bell, Bonachea, Nishtala and
//! Yelick (IPDPS 2006), the transpose is done three ways ([`Variant`]): one bulk exchange
//! after the local FFTs, a slab per plane as soon as the plane is done, or a pencil per
//! column as soon as it is done, each in two models ([`Model`]): one-sided puts into the
//! owner's segment, or two-sided messages matched at the receiver.
//!
//! ```no_run
//! use weft_ft::{Class, Ft, Model, Options, Variant};
//! let mut b = weft_runtime::World::builder();
//! let ft = Ft::register(&mut b);
//! let world = b.init()?;
//! let opts = Options::new(Class::S, Variant::Pencils, Model::OneSided);
//! let report = ft.run(&world, &opts)?;
//! if world.rank() == 0 {
//!     report.print();
//! }
//! # Ok::<(), weft_ft::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod class;
pub mod exchange;
pub mod local_fft;
mod report;
pub mod rng;
mod solver;
pub mod transform;

pub use class::Class;
pub use report::{Report, Verification};
pub use solver::{Ft, Options, DEFAULT_PAD};

use std::fmt;
use std::str::FromStr;

/// How the transpose of each 3-D FFT is spread over the computation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// All local FFTs, then one bulk all-to-all, then the last FFTs (what NPB does).
    Exchange,
    /// Each plane's part for each rank is sent as soon as the plane is done.
    Slabs,
    /// Each column's part for each rank is sent as soon as the column is done.
    Pencils,
}

/// How data reaches its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Model {
    /// Non-blocking puts into the owner's segment, completed by a sync and a flag per source.
    OneSided,
    /// Messages matched at the receiver against receives it posted (built on weft AMs).
    TwoSided,
}

/// `ALL`, the command-line `name`, `Display` and `FromStr` of a fieldless enum, from its
/// variants and their names.
macro_rules! named {
    ($ty:ident, $what:literal, $($v:ident => $name:literal),+) => {
        impl $ty {
            /// Every value.
            pub const ALL: [$ty; [$($name),+].len()] = [$($ty::$v),+];
            /// The command-line name.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$v => $name),+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                $ty::ALL.into_iter().find(|v| v.name() == s.trim()).ok_or_else(|| {
                    format!("unknown {} {s:?} (expected {})", $what, [$($name),+].join(", "))
                })
            }
        }
    };
}

named!(Variant, "variant", Exchange => "exchange", Slabs => "slabs", Pencils => "pencils");
named!(Model, "model", OneSided => "one-sided", TwoSided => "two-sided");

/// What can go wrong in a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// weft failed (a peer died, bad address, ...).
    Weft(weft_runtime::Error),
    /// The problem does not fit this job (sizes not divisible by the ranks, too little memory).
    Setup(String),
    /// A message broke the exchange protocol.
    Protocol(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Weft(e) => write!(f, "{e}"),
            Error::Setup(s) => write!(f, "cannot run: {s}"),
            Error::Protocol(s) => write!(f, "exchange protocol: {s}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<weft_runtime::Error> for Error {
    fn from(e: weft_runtime::Error) -> Self {
        Error::Weft(e)
    }
}
