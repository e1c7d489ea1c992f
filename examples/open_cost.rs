//! What an endpoint costs: open time, resident memory, and a bare `fi_av_insert` +
//! `fi_av_remove`, for one provider and one sizing.
//!
//! ```sh
//! cargo run --release --example open_cost -- --provider tcp --sizing server
//! cargo run --release --example open_cost -- --provider tcp --sizing provider   # rxm's defaults
//! ```
//!
//! `--sizing server` applies [`Configuration::default`]'s sizing (queue hints, CQ size, rxm's
//! buffer size through the environment, before libfabric initialises); `--sizing provider`
//! leaves every size to the provider, as the crate did before the sizing existed. Each run is one
//! process, since rxm reads its environment once per process. The endpoints stay open until the
//! end, so the resident-memory growth divided by their number is what each one holds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::error::Error;
use std::time::{Duration, Instant};

use clap::Parser;
use dma_libfabric::{Configuration, LibfabricEndpoint, Provider, RxmSizing, sys};

/// Command-line flags.
#[derive(Debug, Parser)]
#[command(about = "Open time, memory and AV insert/remove cost of one endpoint")]
struct Flags {
    /// The provider: tcp (tcp;ofi_rxm), tcp-native (libfabric 2.x), sockets, udp.
    #[arg(long, default_value = "tcp")]
    provider: String,
    /// server (Configuration::default's sizing) or provider (every size left to the provider).
    #[arg(long, default_value = "server")]
    sizing: String,
    /// Endpoints opened (and held open) for the open-time and memory figures.
    #[arg(long, default_value_t = 16)]
    endpoints: usize,
    /// fi_av_insert + fi_av_remove pairs timed.
    #[arg(long, default_value_t = 20_000)]
    av_rounds: usize,
}

type Result<T> = std::result::Result<T, Box<dyn Error>>;

fn main() -> Result<()> {
    let flags = Flags::parse();
    let provider = match flags.provider.as_str() {
        "tcp" => Provider::Tcp,
        "tcp-native" => Provider::TcpNative,
        "sockets" => Provider::Sockets,
        "udp" => Provider::Udp,
        other => return Err(format!("unknown provider {other:?}").into()),
    };
    let mut configuration = Configuration {
        providers: vec![provider],
        ..Configuration::default()
    };
    match flags.sizing.as_str() {
        "server" => {
            // SAFETY: the first thing main does; no other thread runs.
            unsafe { configuration.apply_rxm_environment() }?;
        }
        "provider" => {
            configuration.tx_size = None;
            configuration.rx_size = None;
            configuration.cq_size = configuration.receive_buffers.max(64) * 2;
            configuration.rxm = RxmSizing::provider_defaults();
        }
        other => return Err(format!("unknown sizing {other:?}").into()),
    }

    // The first open pays for libfabric's initialisation (provider discovery): reported apart.
    let started = Instant::now();
    let first = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    let first_open = started.elapsed();
    let description = first.describe().clone();

    let before = resident_bytes()?;
    let mut opens = Vec::with_capacity(flags.endpoints);
    let mut endpoints = Vec::with_capacity(flags.endpoints);
    for _ in 0..flags.endpoints {
        let started = Instant::now();
        endpoints.push(LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?);
        opens.push(started.elapsed());
    }
    let after = resident_bytes()?;
    opens.sort();
    let median = opens[opens.len() / 2];
    let per_endpoint = (after.saturating_sub(before)) / flags.endpoints.max(1) as u64;

    let (insert, remove) = av_cost(&first, flags.av_rounds)?;

    println!(
        "libfabric {} (fi_version), provider {} (inject size {}), sizing {}",
        version(),
        description.provider,
        description.inject_size,
        flags.sizing
    );
    println!("first open (includes libfabric init): {first_open:.1?}");
    println!(
        "open, median of {}: {median:.1?} (min {:.1?}, max {:.1?})",
        flags.endpoints,
        opens[0],
        opens[opens.len() - 1]
    );
    println!(
        "resident memory per open endpoint: {:.1} MiB",
        per_endpoint as f64 / (1024.0 * 1024.0)
    );
    println!(
        "fi_av_insert: {:.0} ns, fi_av_remove: {:.0} ns (mean of {})",
        insert.as_nanos() as f64 / flags.av_rounds as f64,
        remove.as_nanos() as f64 / flags.av_rounds as f64,
        flags.av_rounds
    );
    drop(endpoints);
    Ok(())
}

/// Total time of `rounds` inserts and of `rounds` removes of one peer address, alternating.
fn av_cost(endpoint: &LibfabricEndpoint, rounds: usize) -> Result<(Duration, Duration)> {
    // Its own address: any well-formed address of the provider's format costs the same.
    let peer = endpoint.local_address()?;
    let av = endpoint.address_vector();
    let mut inserting = Duration::ZERO;
    let mut removing = Duration::ZERO;
    for _ in 0..rounds {
        let mut fi_addr = sys::FI_ADDR_NOTAVAIL;
        let started = Instant::now();
        // SAFETY: the AV is open while `endpoint` lives; `peer` is a full address of the
        // endpoint's own format (its own address).
        let inserted = unsafe {
            sys::fi_av_insert(
                av,
                peer.as_ptr().cast(),
                1,
                &raw mut fi_addr,
                0,
                std::ptr::null_mut(),
            )
        };
        inserting += started.elapsed();
        if inserted != 1 {
            return Err(format!("fi_av_insert returned {inserted}").into());
        }
        let started = Instant::now();
        // SAFETY: as above; `fi_addr` was inserted just now and is removed once.
        let code = unsafe { sys::fi_av_remove(av, &raw mut fi_addr, 1, 0) };
        removing += started.elapsed();
        if code != 0 {
            return Err(format!("fi_av_remove returned {code}").into());
        }
    }
    Ok((inserting, removing))
}

/// The runtime libfabric's version, as "major.minor".
fn version() -> String {
    // SAFETY: fi_version takes nothing and returns a number.
    let version = unsafe { sys::fi_version() };
    format!("{}.{}", version >> 16, version & 0xffff)
}

/// This process's resident set, from /proc/self/statm.
fn resident_bytes() -> Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .ok_or("no resident field in /proc/self/statm")?
        .parse()?;
    Ok(pages * 4096)
}
