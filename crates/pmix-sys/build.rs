//! Generates the PMIx client bindings against the system headers found by pkg-config
//! (Debian installs them under /usr/lib/x86_64-linux-gnu/pmix2, named by pmix.pc).

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    let lib = pkg_config::Config::new().atleast_version("4").probe("pmix").unwrap_or_else(|e| {
        panic!(
            "PMIx >= 4 not found through pkg-config ({e}).\n\
             The `pmix` feature needs the system's PMIx headers: apt-get install libpmix-dev"
        )
    });
    // The library lives outside the loader's default path: record where it is.
    for dir in &lib.link_paths {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let mut b = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function(
            "PMIx_(Init|Finalize|Initialized|Get|Put|Commit|Fence|Error_string|Value_destruct|Abort)",
        )
        .allowlist_type("pmix_.*")
        .allowlist_var("PMIX_.*")
        .derive_default(true)
        .prepend_enum_name(false)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for p in &lib.include_paths {
        b = b.clang_arg(format!("-I{}", p.display()));
    }
    b.generate()
        .expect("bindgen failed on PMIx's headers")
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");
}
