//! Links the shared library as rdma-core's: SONAME `libibverbs.so.1`, and the version nodes the
//! `.symver` directives in `src/symbols.rs` put every exported symbol in. (rustc writes its own
//! version script for a cdylib; a second script that only declares nodes combines with it.)

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    println!("cargo:rerun-if-changed=libibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
