//! Regression tests for bugs the fuzz targets found, each with its reproducer in
//! `fuzz/corpus/<target>/regression-*` (replayed by `tests/fuzz_corpus.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{Configuration, LibfabricEndpoint};

/// A `sockaddr_in` of `family`, `port` and `host`, with nothing in `sin_zero`.
use testkit::sockaddr_parts as sockaddr;

/// Found by `tcp_av` (`fuzz/corpus/tcp_av/regression-bad-family-poisons-av`): a client that
/// advertises a sockaddr whose family is `AF_UNSPEC` (or `AF_UNIX`) gets an error, as it should,
/// but libfabric 1.17's tcp AV then refuses every new address with `-FI_EINVAL`, for every
/// client, for the life of the endpoint. Entries already cached keep working. The cache hands
/// the bytes to `fi_av_insert` unchecked; now `FabricAv::insert` refuses a family other than
/// `AF_INET` itself, with `DmaError::InvalidAddress`.
#[test]
fn a_bad_address_family_does_not_poison_the_tcp_av() {
    let configuration = Configuration {
        av_capacity: 8,
        ..Configuration::default()
    };
    let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
    let cache = endpoint.cache();
    let pinned = cache.pin();
    for (client, family) in [(1, 0_u16), (2, 1)] {
        let bad = sockaddr(family, 1, [127, 0, 0, 1]);
        assert!(
            pinned.resolve(client, &bad).is_err(),
            "family {family} accepted"
        );
    }
    let good = sockaddr(2, 2, [127, 0, 0, 1]);
    let peer = pinned
        .resolve(3, &good)
        .expect("a well-formed address after a bad one");
    assert_eq!(Some(good), endpoint.lookup(peer.fi_addr()).unwrap());
    drop(pinned);
    for client in 1..=3 {
        cache.release(client);
    }
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!((0, 0), (stats.entries, stats.inserts - stats.removes));
}
