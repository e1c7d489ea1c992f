//! Which providers the runtime libfabric offers, asserted per version: the runtime
//! `fi_version()` and the providers compiled in (what `fi_info -l` lists) choose what each test
//! expects, so a run against libfabric 1.17 and one against 2.x both check something, and
//! neither skips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use dma_libfabric::{
    Configuration, DmaError, LibfabricEndpoint, Provider, compiled_providers, runtime_version, sys,
};

/// The directory the loaded libfabric.so came from, read from this process's own mappings.
fn loaded_libfabric_dir() -> PathBuf {
    // Make sure the library is loaded and initialised before looking.
    compiled_providers().expect("fi_getinfo(FI_PROV_ATTR_ONLY)");
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let path = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| path.contains("libfabric.so"))
        .expect("libfabric.so is mapped");
    PathBuf::from(path)
        .parent()
        .expect("a directory")
        .to_path_buf()
}

/// `fi_info -l` of the same install as the loaded library: `<prefix>/bin/fi_info` next to
/// `<prefix>/lib`, or the system's `fi_info` (libfabric-bin) for the system library.
fn fi_info_list() -> Vec<String> {
    let lib = loaded_libfabric_dir();
    let beside = lib.parent().map(|prefix| prefix.join("bin/fi_info"));
    let program = match beside {
        Some(path) if path.exists() => path,
        _ => PathBuf::from("fi_info"),
    };
    let output = Command::new(&program)
        .arg("-l")
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .unwrap_or_else(|error| panic!("{} -l: {error}", program.display()));
    assert!(output.status.success(), "{} -l failed", program.display());
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_suffix(':'))
        .filter(|name| !name.starts_with(' '))
        .map(str::to_string)
        .collect()
}

#[test]
fn compiled_providers_are_what_fi_info_lists() {
    let mut ours = compiled_providers().expect("providers");
    let mut theirs = fi_info_list();
    ours.sort();
    theirs.sort();
    assert_eq!(theirs, ours);
    assert!(ours.iter().any(|name| name == "tcp"), "{ours:?}");
    assert!(ours.iter().any(|name| name == "ofi_rxm"), "{ours:?}");
}

/// No efa device here (this suite's machines have none): efa and efa-direct are turned down
/// with a `NoProvider` that names efa and says why, whether efa is compiled in (the 2.6.0 build
/// of scripts/libfabric-build) or not (Debian's 1.17).
#[test]
fn efa_without_a_device_is_no_provider_naming_efa_and_why() {
    let compiled = compiled_providers().expect("providers");
    let efa_compiled = compiled.iter().any(|name| name == "efa");
    let (major, _) = runtime_version();
    if major >= 2 && fi_info_list().iter().any(|name| name == "verbs") {
        // The 2.x builds this suite runs (scripts/libfabric-build) compile efa in.
        assert!(efa_compiled, "efa missing from {compiled:?}");
    }
    for provider in [Provider::Efa, Provider::EfaDirect] {
        let configuration = Configuration {
            providers: vec![provider],
            bind: None,
            ..Configuration::default()
        };
        match LibfabricEndpoint::open(&configuration, None) {
            Err(DmaError::NoProvider { tried }) => {
                assert!(tried.starts_with("efa"), "{provider:?}: {tried}");
                assert!(tried.contains("fi_getinfo failed with -61"), "{tried}");
                let reason = if efa_compiled {
                    "is compiled into libfabric"
                } else {
                    "efa not compiled into this libfabric"
                };
                assert!(tried.contains(reason), "{provider:?}: {tried}");
                if efa_compiled {
                    assert!(tried.contains("no efa device"), "{tried}");
                }
                if provider == Provider::EfaDirect {
                    assert!(tried.contains("efa-direct"), "{tried}");
                }
            }
            Err(other) => panic!("{provider:?}: expected NoProvider, got {other}"),
            // Only on a host with an efa device.
            Ok(endpoint) => assert_eq!("efa", endpoint.describe().provider),
        }
    }
}

/// libfabric 2.x's tcp has a native reliable-datagram endpoint that carries real traffic; 1.x's
/// tcp offers only FI_EP_MSG, so there `Provider::TcpNative` is turned down, saying so.
#[test]
fn native_tcp_is_rdm_on_2x_and_turned_down_on_1x() {
    let configuration = Configuration {
        providers: vec![Provider::TcpNative],
        ..Configuration::default()
    };
    let (major, minor) = runtime_version();
    let opened = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"));
    if major >= 2 {
        let server = opened.expect("native tcp RDM on libfabric 2.x");
        assert_eq!("tcp", server.describe().provider);
        assert_eq!(sys::FI_SOCKADDR_IN, server.describe().addr_format);
        let client = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("client");
        let address = client.local_address().expect("address");
        std::thread::scope(|scope| {
            let received = scope.spawn(|| client.receive(Duration::from_secs(10)));
            let pinned = server.cache().pin();
            let peer = pinned.resolve(1, &address).expect("resolve");
            server.send(peer, b"native").expect("send");
            let received = received.join().expect("receiver").expect("receive");
            assert_eq!(Some(b"native".to_vec()), received);
        });
    } else {
        match opened {
            Err(DmaError::NoProvider { tried }) => {
                assert!(
                    tried.contains("no reliable-datagram endpoint of its own"),
                    "{tried}"
                );
                assert!(
                    tried.contains(&format!("libfabric {major}.{minor}")),
                    "{tried}"
                );
            }
            Err(other) => panic!("expected NoProvider on libfabric {major}.{minor}, got {other}"),
            Ok(endpoint) => panic!(
                "libfabric {major}.{minor} gave a native tcp RDM endpoint: {:?}",
                endpoint.describe()
            ),
        }
    }
}

/// Provider::Tcp is tcp over rxm on every version.
#[test]
fn tcp_is_rxm_on_every_version() {
    let endpoint =
        LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1")).expect("tcp;ofi_rxm");
    assert_eq!("tcp;ofi_rxm", endpoint.describe().provider);
}
