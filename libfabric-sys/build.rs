//! Finds the installed libfabric with pkg-config, generates bindings over its headers, and
//! compiles `shim.c`, which gives the static-inline calls a symbol to link against.
//!
//! Building against another libfabric: point `PKG_CONFIG_PATH` at its `lib/pkgconfig` (this
//! script reruns when it changes). Its library directory is published to dependents' build
//! scripts as `DEP_FABRIC_LIBDIR`, which dma-libfabric's own build script turns into an rpath,
//! so its tests and examples load that libfabric without `LD_LIBRARY_PATH`.
//!
//! AddressSanitizer: the shim is compiled with `-fsanitize=address` when the Rust build is
//! sanitized (`-Zsanitizer=address` sets `CARGO_CFG_SANITIZE`) or when
//! `DMA_LIBFABRIC_SANITIZE=address` is set. libfabric itself stays uninstrumented.

use std::env;
use std::path::PathBuf;
use std::process::exit;

/// The oldest libfabric these bindings are written against (Debian bookworm's).
const MINIMUM_VERSION: &str = "1.17";

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=shim.h");
    println!("cargo:rerun-if-changed=shim.c");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_LIBDIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_SYSROOT_DIR");
    println!("cargo:rerun-if-env-changed=DMA_LIBFABRIC_SANITIZE");

    let library = match pkg_config::Config::new()
        .atleast_version(MINIMUM_VERSION)
        .probe("libfabric")
    {
        Ok(library) => library,
        Err(error) => {
            // One sentence a person can act on, rather than bindgen failing on a missing header.
            eprintln!(
                "libfabric >= {MINIMUM_VERSION} was not found by pkg-config ({}); install it with \
                 `apt-get install libfabric-dev libfabric-bin libclang-dev pkg-config`, or point \
                 PKG_CONFIG_PATH at another install (AWS's EFA installer: \
                 /opt/amazon/efa/lib/pkgconfig).",
                first_line(&error.to_string())
            );
            exit(1);
        }
    };

    // The libfabric this build links, for dependents' build scripts (DEP_FABRIC_LIBDIR,
    // DEP_FABRIC_VERSION): an install outside the linker's default path needs an rpath.
    if let Some(libdir) = library.link_paths.first() {
        println!("cargo:libdir={}", libdir.display());
    }
    println!("cargo:version={}", library.version);

    let mut shim = cc::Build::new();
    shim.file("shim.c").warnings(true);
    for include in &library.include_paths {
        shim.include(include);
    }
    if sanitize_address() {
        // The Rust side links the ASan runtime; the shim's instrumentation calls into it.
        shim.flag("-fsanitize=address")
            .flag("-fno-omit-frame-pointer");
    }
    shim.compile("dma_libfabric_shim");

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("fi_.*")
        .allowlist_function("dmafab_.*")
        .allowlist_type("fi_.*")
        .allowlist_type("fid_.*")
        .allowlist_var("FI_.*")
        // The static-inline originals have no symbol; the shims stand in for them.
        .blocklist_function("fi_(allocinfo|domain|endpoint|av_.*|cq_.*|ep_bind|enable|close|getname|send|inject|recv|mr_reg|mr_desc|mr_key|mr_bind|mr_enable|write|read|cancel)")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false);
    for include in &library.include_paths {
        builder = builder.clang_arg(format!("-I{}", include.display()));
    }
    let bindings = match builder.generate() {
        Ok(bindings) => bindings,
        Err(error) => {
            eprintln!(
                "bindgen could not read libfabric's headers ({error}); install libclang with \
                 `apt-get install libclang-dev`."
            );
            exit(1);
        }
    };
    let Some(out) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        eprintln!("cargo did not set OUT_DIR");
        exit(1);
    };
    if let Err(error) = bindings.write_to_file(out.join("bindings.rs")) {
        eprintln!("could not write the bindings: {error}");
        exit(1);
    }
}

/// Whether this build is sanitized with AddressSanitizer, so the shim must be instrumented too.
fn sanitize_address() -> bool {
    let requested = |name: &str| {
        env::var(name)
            .map(|value| value.split(',').any(|kind| kind.trim() == "address"))
            .unwrap_or(false)
    };
    requested("CARGO_CFG_SANITIZE") || requested("DMA_LIBFABRIC_SANITIZE")
}

/// The first non-blank line of pkg-config's multi-line error.
fn first_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .unwrap_or("no detail")
}
