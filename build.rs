//! Gives this crate's tests, examples and benches an rpath to the libfabric that dma-libfabric-sys
//! found through pkg-config, so a build with `PKG_CONFIG_PATH` pointing at another install (say
//! `target/libfabric-2.6.0/lib/pkgconfig`) also runs against it, without `LD_LIBRARY_PATH`.
//! The system's own libdir needs no rpath and gets none.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_FABRIC_LIBDIR");
    let Ok(libdir) = std::env::var("DEP_FABRIC_LIBDIR") else {
        return;
    };
    let system = ["/usr/lib", "/usr/lib64", "/lib", "/lib64"];
    let on_default_path = system.iter().any(|dir| libdir == *dir)
        || libdir.starts_with("/usr/lib/x86_64-linux-gnu")
        || libdir.starts_with("/usr/lib/aarch64-linux-gnu");
    if !libdir.is_empty() && !on_default_path {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    }
}
