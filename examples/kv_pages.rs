//! A KV-cache page server, zero copy: one pool of pages, registered once, in place; clients put
//! and get scattered pages by RDMA, and verify every byte.
//!
//! ```text
//! cargo run --release --example kv_pages -- --seconds 5 --clients 4
//! cargo run --release --example kv_pages -- --mmap   # the pool is an mmap (memmap2 feature)
//! ```
//!
//! - The **server** owns the pool (a `Vec`, or an anonymous `memmap2::MmapMut` with `--mmap`)
//!   and registers it once with `register_buffer(pool, Exposure::Local)`: only its own
//!   operations touch it, no peer holds a key to it. A client's *put* is a `read_scatter` from
//!   the client's staging buffer into the pool's pages, a *get* a `write_gather` from the pool's
//!   pages into the staging buffer: one transfer of up to `PAGES_PER_REQUEST` scattered pages,
//!   one completion. The server never copies a byte (it calls no `write_bytes`/`read_bytes`,
//!   and the pool comes back from `into_buffer` at the same address it was registered at).
//! - A **client** registers a staging buffer (`Exposure::Remote`: the server reaches it), says
//!   hello (its address and the buffer's descriptor), then puts pages stamped with (page,
//!   version) and gets them back, checking every byte. Each client owns the pages `page % clients
//!   == client`, so the checks see no other writer.
//! - Requests and replies are messages (`send`/`receive`, under the 64-byte inject size); the
//!   data moves only by RDMA.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use dma_libfabric::{
    Configuration, DmaError, Exposure, LibfabricEndpoint, MemoryRegion, RemoteRegion, Segment,
    StableBuffer,
};

const PAGE: usize = 4096;
/// Pages one request names: a request is 3 bytes and 4 a page, inside tcp's 64-byte inject.
const PAGES_PER_REQUEST: usize = 15;
const PATIENCE: Duration = Duration::from_secs(20);

const HELLO: u8 = b'H';
const PUT: u8 = b'P';
const GET: u8 = b'G';
const DONE: u8 = b'D';

#[derive(Parser)]
struct Arguments {
    /// How long the clients run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// How many clients.
    #[arg(long, default_value_t = 4)]
    clients: u8,
    /// The pool's pages.
    #[arg(long, default_value_t = 4096)]
    pages: usize,
    /// Keep the pool in an anonymous memory mapping (the `memmap2` feature).
    #[arg(long)]
    mmap: bool,
}

fn configuration() -> Configuration {
    Configuration {
        rma: true,
        ..Configuration::default()
    }
}

/// The byte page `page` holds at version `version`, at `at`.
fn stamp(page: u32, version: u32, at: usize) -> u8 {
    (page.wrapping_mul(31) ^ version.wrapping_mul(17) ^ at as u32) as u8
}

fn main() -> Result<(), DmaError> {
    let arguments = Arguments::parse();
    if arguments.clients == 0 || arguments.pages < usize::from(arguments.clients) {
        return Err(DmaError::InvalidArgument(
            "at least one client, and a page per client".into(),
        ));
    }
    let server = LibfabricEndpoint::open(&configuration(), Some("127.0.0.1"))?;
    let server_address = server.local_address()?;
    let stop = AtomicBool::new(false);
    let clients_done = AtomicBool::new(false);
    let served = AtomicU64::new(0);
    let started = Instant::now();
    let (checked, pool_moved) = std::thread::scope(|scope| -> Result<_, DmaError> {
        let server_thread = scope.spawn(|| {
            if arguments.mmap {
                serve(&server, mmap_pool(arguments.pages)?, &clients_done, &served)
            } else {
                let pool = vec![0_u8; arguments.pages * PAGE];
                serve(&server, pool, &clients_done, &served)
            }
        });
        let clients: Vec<_> = (0..arguments.clients)
            .map(|client| {
                let (address, arguments, stop) = (&server_address, &arguments, &stop);
                scope.spawn(move || run_client(client, address, arguments, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_secs(arguments.seconds));
        stop.store(true, Ordering::Release);
        let mut checked = 0;
        let mut failed = None;
        for client in clients {
            match client.join().expect("a client thread") {
                Ok(pages) => checked += pages,
                Err(error) => failed = Some(error),
            }
        }
        // Every client has had its last reply: the server may stop.
        clients_done.store(true, Ordering::Release);
        if let Some(error) = failed {
            return Err(error);
        }
        let moved = server_thread.join().expect("the server thread")?;
        Ok((checked, moved))
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let pages = served.load(Ordering::Relaxed);
    println!(
        "pool: {} pages of {PAGE} bytes ({})",
        arguments.pages,
        if arguments.mmap { "mmap" } else { "Vec" }
    );
    println!(
        "pages served: {pages} ({:.0} pages/s, {:.1} MiB/s)",
        pages as f64 / seconds,
        (pages as f64 * PAGE as f64) / seconds / f64::from(1 << 20)
    );
    println!("pages checked by clients, every byte: {checked}");
    println!(
        "bytes copied by the server: 0 (the pool came back at the address it was registered at: {})",
        !pool_moved
    );
    if pool_moved || 0 == checked {
        return Err(DmaError::InvalidArgument(
            "the run checked nothing, or the pool moved".into(),
        ));
    }
    Ok(())
}

#[cfg(feature = "memmap2")]
fn mmap_pool(pages: usize) -> Result<memmap2::MmapMut, DmaError> {
    memmap2::MmapMut::map_anon(pages * PAGE)
        .map_err(|error| DmaError::InvalidArgument(format!("an anonymous mapping: {error}")))
}

#[cfg(not(feature = "memmap2"))]
fn mmap_pool(_: usize) -> Result<Vec<u8>, DmaError> {
    Err(DmaError::InvalidArgument(
        "--mmap needs the memmap2 feature (cargo run --features memmap2 ...)".into(),
    ))
}

/// What the server knows of a client: its address and its staging buffer.
struct Known {
    address: Vec<u8>,
    staging: RemoteRegion,
}

/// Serve requests until `stop` (every client has had its last reply); returns whether the pool
/// moved (it must not).
fn serve<B: StableBuffer>(
    server: &LibfabricEndpoint,
    mut pool: B,
    stop: &AtomicBool,
    served: &AtomicU64,
) -> Result<bool, DmaError> {
    let registered_at = pool.as_mut_ptr() as usize;
    let pool = server.register_buffer(pool, Exposure::Local)?;
    let mut known: Vec<Option<Known>> = Vec::new();
    let mut id = 0_u64;
    while !stop.load(Ordering::Acquire) {
        let Some(request) = server.receive(Duration::from_millis(10))? else {
            continue;
        };
        match request.first().copied() {
            Some(HELLO) => {
                let client = usize::from(request[1]);
                let staging = RemoteRegion::from_bytes(&request[2..2 + RemoteRegion::ENCODED_LEN])?;
                let address = request[2 + RemoteRegion::ENCODED_LEN..].to_vec();
                known.resize_with(known.len().max(client + 1), || None);
                known[client] = Some(Known { address, staging });
                reply(server, client as u64, &known[client], &[DONE])?;
            }
            Some(operation @ (PUT | GET)) => {
                let client = usize::from(request[1]);
                let Some(Some(peer)) = known.get(client) else {
                    continue;
                };
                let pieces: Vec<Segment<'_>> = request[3..]
                    .chunks_exact(4)
                    .take(usize::from(request[2]))
                    .map(|page| {
                        let page = u32::from_le_bytes(page.try_into().expect("4 bytes"));
                        pool.segment(page as usize * PAGE, PAGE)
                    })
                    .collect::<Result<_, _>>()?;
                let lease = server.cache().lease(client as u64, &peer.address)?;
                let staging = peer.staging.slice(0, (pieces.len() * PAGE) as u64)?;
                id += 1;
                if PUT == operation {
                    server.read_scatter(lease, &pieces, staging, id)?;
                } else {
                    server.write_gather(lease, &pieces, staging, id)?;
                }
                server.wait_for(id, PATIENCE)?.result?;
                served.fetch_add(pieces.len() as u64, Ordering::Relaxed);
                reply(server, client as u64, &known[client], &[DONE])?;
            }
            _ => {}
        }
    }
    let moved = match back(pool) {
        Ok(mut pool) => pool.as_mut_ptr() as usize != registered_at,
        Err(error) => return Err(error),
    };
    Ok(moved)
}

fn back<B: StableBuffer>(pool: MemoryRegion<'_, B>) -> Result<B, DmaError> {
    pool.into_buffer().map_err(|(_, error)| error)
}

fn reply(
    server: &LibfabricEndpoint,
    client: u64,
    known: &Option<Known>,
    message: &[u8],
) -> Result<(), DmaError> {
    let Some(known) = known else { return Ok(()) };
    let pinned = server.cache().pin();
    let peer = pinned.resolve(client, &known.address)?;
    server.send(peer, message)
}

/// Put and get pages until `stop`; returns how many pages it checked.
fn run_client(
    client: u8,
    server_address: &[u8],
    arguments: &Arguments,
    stop: &AtomicBool,
) -> Result<u64, DmaError> {
    let endpoint = LibfabricEndpoint::open(&configuration(), Some("127.0.0.1"))?;
    let mut staging =
        endpoint.register_buffer(vec![0_u8; PAGES_PER_REQUEST * PAGE], Exposure::Remote)?;
    let mut hello = vec![HELLO, client];
    hello.extend_from_slice(&staging.remote().to_bytes());
    hello.extend_from_slice(&endpoint.local_address()?);
    request(&endpoint, server_address, &hello)?;

    let clients = usize::from(arguments.clients);
    let mine: Vec<u32> = (0..arguments.pages)
        .filter(|page| page % clients == usize::from(client))
        .map(|page| page as u32)
        .collect();
    let mut versions = vec![0_u32; mine.len()];
    let mut checked = 0_u64;
    let mut next = usize::from(client);
    while !stop.load(Ordering::Acquire) {
        let count = PAGES_PER_REQUEST.min(mine.len());
        let picks: Vec<usize> = (0..count).map(|n| (next + n * 7) % mine.len()).collect();
        next = next.wrapping_add(count * 3 + 1);
        // Put: stamp the pages in the staging buffer, in place.
        {
            // SAFETY: the server touches the staging buffer only between a request of ours and
            // its reply, and we wait for the reply before touching it again: no peer writes or
            // reads it while this slice lives.
            let bytes = unsafe { staging.as_mut_slice_unchecked()? };
            for (slot, &pick) in picks.iter().enumerate() {
                versions[pick] += 1;
                let page = &mut bytes[slot * PAGE..(slot + 1) * PAGE];
                for (at, byte) in page.iter_mut().enumerate() {
                    *byte = stamp(mine[pick], versions[pick], at);
                }
            }
        }
        request(
            &endpoint,
            server_address,
            &pages_request(PUT, client, &picks, &mine),
        )?;
        // Get them back, in the other order, into a cleared staging buffer.
        let reversed: Vec<usize> = picks.iter().rev().copied().collect();
        // SAFETY: as above: between a reply and our next request.
        unsafe { staging.as_mut_slice_unchecked()? }.fill(0);
        request(
            &endpoint,
            server_address,
            &pages_request(GET, client, &reversed, &mine),
        )?;
        // SAFETY: as above.
        let bytes = unsafe { staging.as_slice_unchecked()? };
        for (slot, &pick) in reversed.iter().enumerate() {
            let page = &bytes[slot * PAGE..(slot + 1) * PAGE];
            if let Some(at) =
                (0..PAGE).find(|&at| page[at] != stamp(mine[pick], versions[pick], at))
            {
                return Err(DmaError::InvalidArgument(format!(
                    "client {client}: page {} byte {at} is {}, not {}",
                    mine[pick],
                    page[at],
                    stamp(mine[pick], versions[pick], at)
                )));
            }
            checked += 1;
        }
    }
    Ok(checked)
}

fn pages_request(operation: u8, client: u8, picks: &[usize], mine: &[u32]) -> Vec<u8> {
    let mut message = vec![operation, client, picks.len() as u8];
    for &pick in picks {
        message.extend_from_slice(&mine[pick].to_le_bytes());
    }
    message
}

/// Send `message` to the server and wait for its reply.
fn request(endpoint: &LibfabricEndpoint, server: &[u8], message: &[u8]) -> Result<(), DmaError> {
    {
        let pinned = endpoint.cache().pin();
        let peer = pinned.resolve(0, server)?;
        endpoint.send(peer, message)?;
    }
    match endpoint.receive(PATIENCE)? {
        Some(reply) if reply == [DONE] => Ok(()),
        other => Err(DmaError::InvalidArgument(format!(
            "no reply from the server: {other:?}"
        ))),
    }
}
