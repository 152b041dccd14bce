//! `weft cc` and `weft c++`: compile and link C or C++ OpenSHMEM programs against weft's
//! `shmem.h` and `libweft_shmem`, as `oshcc` does for other implementations.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the header and library are, and how to link.
pub struct Toolchain {
    pub include: PathBuf,
    pub libdir: PathBuf,
    /// Link `libweft_shmem.a` into the program instead of the shared library.
    pub static_lib: bool,
}

/// Native libraries a static `libweft_shmem.a` needs (what `rustc --print
/// native-static-libs` lists for it, and libfabric / PMIx where they are built in).
fn static_deps() -> Vec<&'static str> {
    let mut v = vec!["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"];
    if cfg!(feature = "ofi") {
        v.push("-lfabric");
    }
    if cfg!(feature = "pmix") {
        v.push("-lpmix");
    }
    v
}

impl Toolchain {
    /// Finds the header (`WEFT_SHMEM_INCLUDE`, else `../include` beside this `weft`'s
    /// directory, else the source tree it was built from) and the library (`WEFT_SHMEM_LIB`,
    /// else where cargo put it when it built this `weft`, else `../lib`).
    pub fn find(static_lib: bool) -> Result<Toolchain, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find the weft executable: {e}"))?;
        // An installed layout: PREFIX/bin/weft beside PREFIX/include and PREFIX/lib.
        let prefix = exe.parent().and_then(Path::parent).map(Path::to_path_buf);
        let include = match std::env::var_os("WEFT_SHMEM_INCLUDE") {
            Some(p) => PathBuf::from(p),
            None => prefix
                .as_ref()
                .map(|p| p.join("include"))
                .filter(|d| d.join("shmem.h").is_file())
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/shmem/include")),
        };
        if !include.join("shmem.h").is_file() {
            return Err(format!("no shmem.h in {} (set WEFT_SHMEM_INCLUDE)", include.display()));
        }
        let file = if static_lib { "libweft_shmem.a" } else { "libweft_shmem.so" };
        let mut dirs: Vec<PathBuf> =
            std::env::var_os("WEFT_SHMEM_LIB").map(PathBuf::from).into_iter().collect();
        if let Some(d) = exe.parent() {
            // Cargo's build of this `weft` (its dependency's copy first: built with the same
            // features, where the copy beside `weft` may be from another build).
            dirs.push(d.join("deps"));
            dirs.push(d.to_path_buf());
        }
        dirs.extend(prefix.map(|p| p.join("lib")));
        let libdir = dirs.iter().find(|d| d.join(file).is_file()).cloned().ok_or_else(|| {
            format!(
                "no {file} in {} (build it with `cargo build --release -p weft-shmem`, or set WEFT_SHMEM_LIB)",
                dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
            )
        })?;
        Ok(Toolchain { include, libdir, static_lib })
    }

    /// The compiler command line for `args` (the user's flags and files).
    pub fn command(&self, compiler: &str, args: &[OsString]) -> Vec<OsString> {
        let mut cmd: Vec<OsString> = vec![compiler.into(), format!("-I{}", self.include.display()).into()];
        cmd.extend(args.iter().cloned());
        let links = !args.iter().any(|a| a == "-c" || a == "-S" || a == "-E" || a == "-M" || a == "-MM");
        if links {
            if self.static_lib {
                cmd.push(self.libdir.join("libweft_shmem.a").into());
                cmd.extend(static_deps().into_iter().map(OsString::from));
            } else {
                cmd.push(format!("-L{}", self.libdir.display()).into());
                // DT_RPATH, not DT_RUNPATH: the program loads the library it was linked
                // with, whatever LD_LIBRARY_PATH says (cargo's puts another build first).
                cmd.push(format!("-Wl,--disable-new-dtags,-rpath,{}", self.libdir.display()).into());
                cmd.push("-lweft_shmem".into());
            }
        }
        cmd
    }
}

impl Toolchain {
    /// A pkg-config file for the header and library found (`weft cc --pkg-config >
    /// weft-shmem.pc`, then `pkg-config --cflags --libs weft-shmem`).
    pub fn pkg_config(&self) -> String {
        format!(
            "Name: weft-shmem\nDescription: OpenSHMEM 1.5 on weft\nVersion: {}\nCflags: -I{}\n\
             Libs: -L{} -Wl,--disable-new-dtags,-rpath,{} -lweft_shmem\nLibs.private: {}\n",
            env!("CARGO_PKG_VERSION"),
            self.include.display(),
            self.libdir.display(),
            self.libdir.display(),
            static_deps().join(" ")
        )
    }
}

/// Runs the compiler (`WEFT_CC`/`WEFT_CXX`, else `cc`/`c++`) for `weft cc` or `weft c++`;
/// `--show` prints the command instead, `--weft-static` links the static library,
/// `--pkg-config` prints a pkg-config file.
pub fn main(cxx: bool, mut args: Vec<OsString>) -> Result<i32, String> {
    let show = take_flag(&mut args, "--show");
    let static_lib = take_flag(&mut args, "--weft-static");
    if take_flag(&mut args, "--pkg-config") {
        print!("{}", Toolchain::find(false)?.pkg_config());
        return Ok(0);
    }
    let compiler = match std::env::var(if cxx { "WEFT_CXX" } else { "WEFT_CC" }) {
        Ok(c) if !c.is_empty() => c,
        _ => (if cxx { "c++" } else { "cc" }).to_string(),
    };
    let cmd = Toolchain::find(static_lib)?.command(&compiler, &args);
    if show {
        println!("{}", cmd.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "));
        return Ok(0);
    }
    let status = Command::new(&cmd[0]).args(&cmd[1..]).status().map_err(|e| {
        format!(
            "cannot run the compiler {compiler:?}: {e} (set {})",
            if cxx { "WEFT_CXX" } else { "WEFT_CC" }
        )
    })?;
    Ok(status.code().unwrap_or(1))
}

/// Removes `flag` from `args`; whether it was there.
fn take_flag(args: &mut Vec<OsString>, flag: &str) -> bool {
    let before = args.len();
    args.retain(|a| a != flag);
    args.len() != before
}
