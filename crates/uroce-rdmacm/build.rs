//! Links the shared library as rdma-core's: SONAME `librdmacm.so.1`, the version nodes the
//! `.symver` directives in `src/lib.rs` put every exported symbol in, and a dependency on
//! `libibverbs.so.1`, where the functions it forwards to live (uroce's, found first in the
//! library path as this one is). The dependency is recorded by linking against an empty
//! stand-in with that SONAME, made here with the C compiler Rust links with; the symbols stay
//! undefined until the program loads.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into()));
    println!("cargo:rerun-if-changed=librdmacm.map");
    println!("cargo:rerun-if-changed=build.rs");
    let stub = out.join("libibverbs.so.1");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let made = Command::new(&cc)
        .args(["-shared", "-nostdlib", "-Wl,-soname,libibverbs.so.1", "-o"])
        .arg(&stub)
        .args(["-x", "c", "/dev/null"])
        .status();
    match made {
        Ok(s) if s.success() => {}
        other => panic!("building the libibverbs.so.1 stand-in with {cc} failed: {other:?}"),
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/librdmacm.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-cdylib-link-arg={}", stub.display());
}
