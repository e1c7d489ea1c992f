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
