//! Errors of the zero-copy path that say why (issue 42, items 4 and 5): asking for device memory
//! where the provider lacks `FI_HMEM`, and registering a file mapping that extends past its file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint, Provider};

/// tcp on libfabric 1.17 (and 2.6.0) offers no `FI_HMEM`: opening with `hmem: true` names
/// `FI_HMEM`, the provider, and what to do. Fails if the error goes back to the bare
/// "offers no thread-safe reliable-datagram endpoint" of issue 42.
#[test]
fn hmem_on_a_provider_without_it_names_fi_hmem_and_the_provider() {
    let configuration = Configuration {
        providers: vec![Provider::Tcp],
        rma: true,
        hmem: true,
        ..Configuration::default()
    };
    let error = match LibfabricEndpoint::open(&configuration, Some("127.0.0.1")) {
        Ok(endpoint) => panic!(
            "tcp gave FI_HMEM here ({:?}): this test needs a provider without it",
            endpoint.describe().provider
        ),
        Err(error) => error,
    };
    let text = error.to_string();
    assert!(matches!(error, DmaError::NoProvider { .. }), "{text}");
    for needed in ["FI_HMEM", Provider::Tcp.name(), "hmem: false"] {
        assert!(text.contains(needed), "{needed:?} missing from: {text}");
    }
    // The same configuration without hmem opens: FI_HMEM alone was why.
    let host_only = Configuration {
        hmem: false,
        ..configuration
    };
    LibfabricEndpoint::open(&host_only, Some("127.0.0.1")).expect("tcp without FI_HMEM");
}

/// A file of its own in the temporary directory, removed when dropped.
struct TempFile(std::path::PathBuf, std::fs::File);

impl TempFile {
    fn new(name: &str, len: u64) -> Self {
        let path = std::env::temp_dir().join(format!("dma-{name}-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("a fresh file");
        file.set_len(len).expect("sized");
        Self(path, file)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A shared mapping of 12 KiB over a 4 KiB file is refused at registration, naming the file,
/// its length and `SIGBUS`; so is a whole-file mapping whose file was truncated before it was
/// registered; a mapping inside its file registers. Fails if `register_buffer` stops checking
/// (the region would register, and a peer's write past 4 KiB would raise SIGBUS here).
#[test]
fn a_file_mapping_past_its_files_end_is_refused() {
    let endpoint = testkit::rma_tcp();
    let short = TempFile::new("short", 4096);
    // SAFETY: the file is this test's own; nothing else maps or truncates it.
    let past =
        unsafe { memmap2::MmapOptions::new().len(3 * 4096).map_mut(&short.1) }.expect("mapped");
    let Err(DmaError::InvalidArgument(reason)) =
        endpoint.register_buffer(past, dma_libfabric::Exposure::Remote)
    else {
        panic!("a mapping two pages past its file registered");
    };
    let name = short.0.to_string_lossy().into_owned();
    for needed in [name.as_str(), "4096 bytes long", "12288", "SIGBUS"] {
        assert!(reason.contains(needed), "{needed:?} missing from: {reason}");
    }

    let whole = TempFile::new("truncated", 4 * 4096);
    // SAFETY: as above; the test truncates it itself below, before registering.
    let mapping = unsafe { memmap2::MmapMut::map_mut(&whole.1) }.expect("mapped");
    whole.1.set_len(4096).expect("truncated");
    assert!(matches!(
        endpoint.register_buffer(mapping, dma_libfabric::Exposure::Local),
        Err(DmaError::InvalidArgument(_))
    ));

    let inside = TempFile::new("inside", 2 * 4096);
    // SAFETY: as above.
    let mut mapping = unsafe { memmap2::MmapMut::map_mut(&inside.1) }.expect("mapped");
    mapping[8191] = 9;
    let region = endpoint
        .register_buffer(mapping, dma_libfabric::Exposure::Local)
        .expect("inside its file");
    assert_eq!(9, region.as_slice().expect("idle")[8191]);
    let anonymous = memmap2::MmapMut::map_anon(1 << 20).expect("anonymous");
    endpoint
        .register_buffer(anonymous, dma_libfabric::Exposure::Remote)
        .expect("no file, nothing to check");
}
