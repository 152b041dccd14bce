//! What a run measured, printed like NPB's report or as JSON.

use crate::class::{matches, Class};
use crate::{Model, Options, Variant};
use serde::Serialize;

/// The verification result.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verification {
    /// Every iteration's checksum is within 1e-12 of NPB's reference.
    Successful,
    /// The first iteration whose checksum is off.
    Failed {
        /// 1-based iteration.
        iteration: usize,
    },
    /// This class has no reference here.
    NoReference,
}

impl Verification {
    /// Checks `checksums` against the class's reference.
    pub fn check(class: Class, checksums: &[[f64; 2]]) -> Verification {
        let Some(reference) = class.reference() else { return Verification::NoReference };
        if checksums.len() != reference.len() {
            return Verification::Failed { iteration: checksums.len().min(reference.len()) + 1 };
        }
        match checksums.iter().zip(&reference).position(|(&got, &want)| !matches(got, want)) {
            Some(i) => Verification::Failed { iteration: i + 1 },
            None => Verification::Successful,
        }
    }
    /// NPB's word for it.
    pub fn word(&self) -> &'static str {
        match self {
            Verification::Successful => "SUCCESSFUL",
            Verification::Failed { .. } => "UNSUCCESSFUL",
            Verification::NoReference => "NOT PERFORMED (no reference)",
        }
    }
}

/// One run's figures (times are the maximum over the ranks).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Problem class.
    pub class: Class,
    /// Transpose variant.
    pub variant: Variant,
    /// Communication model.
    pub model: Model,
    /// Ranks.
    pub ranks: usize,
    /// Iterations.
    pub iterations: usize,
    /// The timed region (initial conditions, forward FFT, all iterations), s.
    pub time_s: f64,
    /// Time inside communication calls: initiation and completion, the part of the
    /// communication not overlapped with computation, s.
    pub comm_s: f64,
    /// Time outside communication calls, s.
    pub compute_s: f64,
    /// Of `comm_s`: starting sends, s.
    pub initiation_s: f64,
    /// Of `comm_s`: waiting for completion (and progress calls), s.
    pub completion_s: f64,
    /// Messages each rank sent to other ranks (the most of any rank).
    pub messages_per_rank: u64,
    /// Bytes each rank sent to other ranks (the most of any rank).
    pub bytes_per_rank: u64,
    /// Mean message size, bytes.
    pub message_bytes: f64,
    /// NPB's operation count over the time, millions per second.
    pub mops: f64,
    /// Checksum of each iteration (real, imaginary).
    pub checksums: Vec<[f64; 2]>,
    /// Against NPB's reference.
    pub verification: Verification,
}

/// A run's times, each the maximum over the ranks, s.
pub(crate) struct Times {
    pub total: f64,
    pub comm: f64,
    pub compute: f64,
    pub initiation: f64,
    pub completion: f64,
}

impl Report {
    pub(crate) fn new(
        opts: &Options,
        ranks: usize,
        t: Times,
        [messages, bytes]: [u64; 2],
        checksums: Vec<[f64; 2]>,
        verification: Verification,
    ) -> Report {
        Report {
            class: opts.class,
            variant: opts.variant,
            model: opts.model,
            ranks,
            iterations: opts.class.iterations(),
            time_s: t.total,
            comm_s: t.comm,
            compute_s: t.compute,
            initiation_s: t.initiation,
            completion_s: t.completion,
            messages_per_rank: messages,
            bytes_per_rank: bytes,
            message_bytes: if messages > 0 { bytes as f64 / messages as f64 } else { 0.0 },
            mops: mops(opts.class, t.total),
            checksums,
            verification,
        }
    }

    /// Whether the run verified (or had nothing to verify against).
    pub fn passed(&self) -> bool {
        !matches!(self.verification, Verification::Failed { .. })
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Prints the per-iteration checksums and an NPB-style summary.
    pub fn print(&self) {
        let [nx, ny, nz] = self.class.dims();
        println!("\n NAS Parallel Benchmarks (weft) - FT Benchmark\n");
        println!(" Size                : {nx:4}x{ny:4}x{nz:4}");
        println!(" Iterations          : {:>12}", self.iterations);
        println!(" Number of ranks     : {:>12}", self.ranks);
        println!(" Transpose           : {} {}\n", self.variant, self.model);
        for (t, c) in self.checksums.iter().enumerate() {
            println!(" T = {:4}     Checksum = {:22.12e} {:22.12e}", t + 1, c[0], c[1]);
        }
        if let Verification::Failed { iteration } = self.verification {
            println!(" Checksum of iteration {iteration} differs from the reference by more than 1e-12");
        }
        println!(" Result verification {}", self.verification.word());
        println!("\n FT Benchmark Completed.");
        println!(" Class           = {:>24}", self.class);
        println!(" Size            = {:>24}", format!("{nx:4}x{ny:4}x{nz:4}"));
        println!(" Iterations      = {:>24}", self.iterations);
        println!(" Time in seconds = {:>24.3}", self.time_s);
        println!("   compute       = {:>24.3}", self.compute_s);
        println!("   communication = {:>24.3}   (not overlapped with computation)", self.comm_s);
        println!("     initiation  = {:>24.3}", self.initiation_s);
        println!("     completion  = {:>24.3}", self.completion_s);
        println!(" Total ranks     = {:>24}", self.ranks);
        println!(" Mop/s total     = {:>24.2}", self.mops);
        println!(" Messages/rank   = {:>24}", self.messages_per_rank);
        println!(" Mean message    = {:>22.0} B", self.message_bytes);
        println!(" Verification    = {:>24}", self.verification.word());
    }
}

/// NPB FT's Mop/s: 1e-6·N·(14.8157 + 7.19641·ln N + (5.23518 + 7.21113·ln N)·niter) / t.
pub fn mops(class: Class, seconds: f64) -> f64 {
    let n = class.points() as f64;
    let ln = n.ln();
    let niter = class.iterations() as f64;
    if seconds > 0.0 {
        1e-6 * n * (14.8157 + 7.19641 * ln + (5.23518 + 7.21113 * ln) * niter) / seconds
    } else {
        0.0
    }
}
