//! The apps-and-tools layer: the launcher and the commands built on it.

pub mod bench;
pub mod cc;
pub mod info;
pub mod plot;
pub mod run;

use std::ffi::OsString;

/// Runs `n` ranks of this very executable with `args` (how `info` and `bench` start jobs).
pub fn self_launch(n: u32, args: Vec<OsString>, env: Vec<(String, String)>) -> Result<i32, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the weft executable: {e}"))?;
    run::launch(&run::LaunchSpec { ranks: n, program: exe.into(), args, label: false, timeout: None, env })
}
