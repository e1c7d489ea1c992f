//! Scatter/gather and writes that notify, on the real tcp provider: pieces past the provider's
//! limit split and joined into one completion under one lease, bad pieces refused with nothing
//! posted, and `fi_writedata`'s data delivered to the target.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{DmaError, Exposure, Notification, Operation, Segment};
use testkit::{PATIENCE, rma_tcp, wait_for_bytes, with_progress};

const PAGE: usize = 4096;

/// A pool of `pages` pages, page `n` filled with `n + 1`.
fn numbered_pages(pages: usize) -> Vec<u8> {
    let mut bytes = vec![0_u8; pages * PAGE];
    for (page, chunk) in bytes.chunks_mut(PAGE).enumerate() {
        chunk.fill(page as u8 + 1);
    }
    bytes
}

/// Ten scattered pages written as one transfer: more pieces than tcp's limit per message (4),
/// so split into three messages and joined into one completion with the whole length, under
/// one lease (back to none once it has been read), with the pool held until then. Fails if the
/// parts deliver their own completions, or the remote offsets of later parts are wrong.
#[test]
fn a_gather_past_the_limit_is_split_and_joined_into_one_completion() {
    let server = rma_tcp();
    let client = rma_tcp();
    let per_message = server.pieces_per_message();
    assert!(
        per_message < 10,
        "tcp carries {per_message} pieces a message"
    );
    let mut pool = server
        .register_buffer(numbered_pages(16), Exposure::Local)
        .expect("registered");
    let order = [15, 0, 7, 3, 9, 1, 12, 4, 8, 2];
    let target = client.register(order.len() * PAGE).expect("client memory");
    let address = client.local_address().expect("address");
    with_progress(&client, || {
        let lease = server.cache().lease(1, &address).expect("a lease");
        let pieces: Vec<Segment<'_>> = order
            .iter()
            .map(|&page| pool.segment(page * PAGE, PAGE).unwrap())
            .collect();
        server
            .write_gather(lease, &pieces, target.remote(), 11)
            .expect("posted");
        drop(pieces);
        assert!(matches!(pool.as_mut_slice(), Err(DmaError::Busy)));
        let completion = server.wait_for(11, PATIENCE).expect("completed");
        assert_eq!(
            (Operation::Write, order.len() * PAGE, Ok(())),
            (completion.operation, completion.len, completion.result)
        );
        for (at, &page) in order.iter().enumerate() {
            wait_for_bytes(&target, at * PAGE, &[page as u8 + 1; PAGE]);
        }
    });
    let mut rest = Vec::new();
    server.poll_completions(&mut rest).expect("poll");
    assert!(rest.is_empty(), "one completion for the transfer: {rest:?}");
    assert_eq!(0, server.operations_in_flight());
    assert_eq!(0, server.cache().stats().leases, "every part's lease went");
    pool.as_mut_slice()
        .expect("idle once the completion was read")[0] = 0;
}

/// One remote range read into nine scattered pages (three messages), joined into one
/// completion; the pages between them are untouched.
#[test]
fn a_scatter_read_lands_each_piece_in_its_page() {
    let server = rma_tcp();
    let client = rma_tcp();
    let exposed = client.register(9 * PAGE).expect("client memory");
    exposed.write_bytes(0, &numbered_pages(9)).expect("fits");
    let address = client.local_address().expect("address");
    let landing = server
        .register_buffer(vec![0_u8; 18 * PAGE], Exposure::Local)
        .expect("registered");
    with_progress(&client, || {
        let lease = server.cache().lease(1, &address).expect("a lease");
        let pieces: Vec<Segment<'_>> = (0..9)
            .map(|piece| landing.segment(2 * piece * PAGE, PAGE).unwrap())
            .collect();
        server
            .read_scatter(lease, &pieces, exposed.remote(), 4)
            .expect("posted");
        let completion = server.wait_for(4, PATIENCE).expect("completed");
        assert_eq!(
            (Operation::Read, 9 * PAGE, Ok(())),
            (completion.operation, completion.len, completion.result)
        );
    });
    let bytes = landing.as_slice().expect("idle");
    for piece in 0..9 {
        let at = 2 * piece * PAGE;
        assert!(
            bytes[at..at + PAGE]
                .iter()
                .all(|&byte| byte == piece as u8 + 1)
        );
        assert!(
            bytes[at + PAGE..at + 2 * PAGE]
                .iter()
                .all(|&byte| 0 == byte)
        );
    }
}

/// Bad pieces: none, pieces of two regions, longer together than the target, a lent slice, more
/// parts than the endpoint keeps in flight. Each is refused with nothing posted and the lease
/// back.
#[test]
fn bad_pieces_are_refused_with_nothing_posted() {
    let server = rma_tcp();
    let client = rma_tcp();
    let target = client.register(2 * PAGE).expect("client memory");
    let address = client.local_address().expect("address");
    let one = server.register(2 * PAGE).expect("one region");
    let other = server.register(PAGE).expect("another region");
    let lease = || server.cache().lease(1, &address).expect("a lease");
    let refused = |result: Result<(), DmaError>| {
        assert!(
            matches!(result, Err(DmaError::InvalidArgument(_))),
            "{result:?}"
        );
        assert_eq!(0, server.operations_in_flight());
        assert_eq!(0, server.cache().stats().leases);
    };
    refused(server.write_gather(lease(), &[], target.remote(), 1));
    refused(server.write_gather(
        lease(),
        &[one.segment(0, 8).unwrap(), other.segment(0, 8).unwrap()],
        target.remote(),
        1,
    ));
    refused(server.read_scatter(
        lease(),
        &[
            one.segment(0, PAGE).unwrap(),
            one.segment(0, PAGE).unwrap(),
            one.segment(0, 1).unwrap(),
        ],
        target.remote(),
        1,
    ));
    let many: Vec<Segment<'_>> = (0..(dma_libfabric::MAX_OPERATIONS + 1)
        * server.pieces_per_message())
        .map(|_| one.segment(0, 1).unwrap())
        .collect();
    let big = client.register(many.len()).expect("client memory");
    refused(server.write_gather(lease(), &many, big.remote(), 1));

    let lent = server
        .register_buffer(vec![0_u8; PAGE], Exposure::Local)
        .expect("registered");
    let slice = lent.as_slice().expect("idle");
    let result = server.write_gather(lease(), &[lent.segment(0, 8).unwrap()], target.remote(), 1);
    assert!(matches!(result, Err(DmaError::Busy)), "{result:?}");
    assert_eq!(0, server.operations_in_flight());
    drop(slice);
}

/// `fi_writedata`: the target's receive queue reports the write with the initiator's data,
/// once its bytes have landed, and `poll_notifications` hands it out once.
#[test]
fn a_write_with_data_notifies_the_target() {
    let server = rma_tcp();
    let client = rma_tcp();
    let target = client.register(64).expect("client memory");
    let address = client.local_address().expect("address");
    let source = server
        .register_buffer(b"chunk landed".to_vec(), Exposure::Local)
        .expect("registered");
    let notifications = with_progress(&client, || {
        let lease = server.cache().lease(1, &address).expect("a lease");
        server
            .write_with_data(
                lease,
                source.segment(0, 12).unwrap(),
                target.remote(),
                0xfeed_0042,
                5,
            )
            .expect("posted");
        assert_eq!(
            Ok(()),
            server.wait_for(5, PATIENCE).expect("completed").result
        );
        let deadline = std::time::Instant::now() + PATIENCE;
        let mut notifications = Vec::new();
        while notifications.is_empty() {
            client.poll_notifications(&mut notifications);
            assert!(std::time::Instant::now() < deadline, "no notification");
            std::thread::yield_now();
        }
        notifications
    });
    assert_eq!(vec![Notification { data: 0xfeed_0042 }], notifications);
    wait_for_bytes(&target, 0, b"chunk landed");
    let mut again = Vec::new();
    assert_eq!(0, client.poll_notifications(&mut again));
    assert_eq!(0, client.dropped_notifications());
}

/// `Configuration::hmem` asks `fi_getinfo` for `FI_HMEM`: a provider that does not offer it is
/// passed over, with the reason (tcp on 1.17); one that does registers host memory through
/// `FI_HMEM_SYSTEM` as any other.
#[test]
fn hmem_is_asked_of_fi_getinfo_when_configured() {
    let configuration = dma_libfabric::Configuration {
        rma: true,
        hmem: true,
        ..dma_libfabric::Configuration::default()
    };
    match dma_libfabric::LibfabricEndpoint::open(&configuration, Some("127.0.0.1")) {
        Err(DmaError::NoProvider { .. }) => {}
        Ok(endpoint) => {
            let mut buffer = vec![0_u8; 64];
            buffer[0] = 1;
            let region = endpoint
                .register_buffer(buffer, Exposure::Local)
                .expect("registered");
            assert_eq!(1, region.as_slice().expect("idle")[0]);
        }
        Err(other) => panic!("FI_HMEM asked: {other:?}"),
    }
}

/// CUDA memory registered in place (`fi_mr_regattr`, `FI_HMEM_CUDA`) and written from, with the
/// peer checking every byte. Needs a GPU, `libcudart.so`, and a provider built with CUDA support.
#[test]
#[ignore = "needs an NVIDIA GPU with CUDA (libcudart.so) and a libfabric provider built with FI_HMEM CUDA support"]
fn cuda_memory_is_written_from_in_place() {
    use std::ffi::{c_char, c_int, c_void};
    unsafe extern "C" {
        fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    }
    type Malloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
    type Free = unsafe extern "C" fn(*mut c_void) -> c_int;
    type Memcpy = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> c_int;
    const RTLD_NOW: c_int = 2;
    const HOST_TO_DEVICE: c_int = 1;

    // SAFETY: dlopen/dlsym of the CUDA runtime; each symbol is cast to its documented type.
    let (malloc, free, memcpy) = unsafe {
        let cudart = dlopen(c"libcudart.so".as_ptr(), RTLD_NOW);
        assert!(!cudart.is_null(), "libcudart.so");
        let symbol = |name: &std::ffi::CStr| {
            let found = dlsym(cudart, name.as_ptr());
            assert!(!found.is_null(), "{name:?}");
            found
        };
        (
            std::mem::transmute::<*mut c_void, Malloc>(symbol(c"cudaMalloc")),
            std::mem::transmute::<*mut c_void, Free>(symbol(c"cudaFree")),
            std::mem::transmute::<*mut c_void, Memcpy>(symbol(c"cudaMemcpy")),
        )
    };

    struct Device {
        start: *mut c_void,
        len: usize,
        free: Free,
    }
    // SAFETY: the device allocation is this value's alone.
    unsafe impl Send for Device {}
    // SAFETY: cudaMalloc'd memory stays at its address until cudaFree, in `Drop`.
    unsafe impl dma_libfabric::StableBuffer for Device {
        fn as_mut_ptr(&mut self) -> *mut u8 {
            self.start.cast()
        }
        fn len(&self) -> usize {
            self.len
        }
        fn interface(&self) -> dma_libfabric::MemoryInterface {
            dma_libfabric::MemoryInterface::Cuda { device: 0 }
        }
    }
    impl Drop for Device {
        fn drop(&mut self) {
            // SAFETY: allocated by cudaMalloc, freed once.
            unsafe { (self.free)(self.start) };
        }
    }

    const LEN: usize = 1 << 20;
    let pattern: Vec<u8> = (0..LEN).map(|at| (at % 251) as u8).collect();
    let mut start = std::ptr::null_mut();
    // SAFETY: documented signatures; `pattern` holds LEN bytes.
    unsafe {
        assert_eq!(0, malloc(&raw mut start, LEN));
        assert_eq!(
            0,
            memcpy(start, pattern.as_ptr().cast(), LEN, HOST_TO_DEVICE)
        );
    }
    let configuration = dma_libfabric::Configuration {
        rma: true,
        hmem: true,
        ..dma_libfabric::Configuration::default()
    };
    let server = dma_libfabric::LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))
        .expect("a provider with FI_HMEM");
    let client = rma_tcp();
    let device = server
        .register_buffer(
            Device {
                start,
                len: LEN,
                free,
            },
            Exposure::Local,
        )
        .expect("CUDA memory registered");
    assert!(device.as_slice().is_err(), "device memory lends no slices");
    let target = client.register(LEN).expect("client memory");
    let address = client.local_address().expect("address");
    with_progress(&client, || {
        let lease = server.cache().lease(1, &address).expect("a lease");
        server
            .write(lease, device.segment(0, LEN).unwrap(), target.remote(), 1)
            .expect("posted");
        assert_eq!(
            Ok(()),
            server.wait_for(1, PATIENCE).expect("completed").result
        );
        wait_for_bytes(&target, 0, &pattern);
    });
}

/// A buffer that claims any length, to try the bounds with.
struct Claims {
    bytes: Vec<u8>,
    len: usize,
    dropped: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Claims {
    fn drop(&mut self) {
        self.dropped
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

// SAFETY: only ever registered with a length the registration refuses before `fi_mr_reg`, or
// the `Vec`'s own.
unsafe impl dma_libfabric::StableBuffer for Claims {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Lengths past the bound (`usize::MAX`, `MAX_REGION_LEN + 1`) and 0 are refused before
/// libfabric sees them, the buffer dropped and nothing parked; a lent slice moved to another
/// thread keeps posts out until it is dropped there (a post with no patience answers `Busy`);
/// a gather with `Duration::MAX` posts.
#[test]
fn bounds_threads_and_durations_at_their_edges() {
    let server = rma_tcp();
    let bound = dma_libfabric::MAX_REGION_LEN;
    for len in [0, bound + 1, usize::MAX] {
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let claims = Claims {
            bytes: vec![0; 64],
            len,
            dropped: std::sync::Arc::clone(&dropped),
        };
        let result = server.register_buffer(claims, Exposure::Remote);
        assert!(
            matches!(result, Err(DmaError::InvalidArgument(_))),
            "{len}: {result:?}"
        );
        assert!(dropped.load(std::sync::atomic::Ordering::Acquire));
    }
    assert_eq!(0, server.parked_memory());

    let client = rma_tcp();
    let target = client.register(PAGE).expect("client memory");
    let address = client.local_address().expect("address");
    let pool = server
        .register_buffer(numbered_pages(2), Exposure::Local)
        .expect("registered");
    let slice = pool.as_slice().expect("idle");
    std::thread::scope(|scope| {
        let lent = scope.spawn(move || {
            let first = slice[0];
            (first, slice)
        });
        let (first, slice) = lent.join().expect("the other thread");
        assert_eq!(1, first);
        let lease = server.cache().lease(1, &address).expect("a lease");
        let piece = [pool.segment(0, PAGE).unwrap()];
        assert!(matches!(
            // Not `Duration::MAX`: a post waits for the slices lent (this thread's own) within
            // its patience; none answers Busy once tried.
            server.write_gather_within(
                lease,
                &piece,
                target.remote(),
                1,
                std::time::Duration::ZERO
            ),
            Err(DmaError::Busy)
        ));
        drop(slice);
    });
    with_progress(&client, || {
        let lease = server.cache().lease(1, &address).expect("a lease");
        let piece = [pool.segment(PAGE, PAGE).unwrap()];
        server
            .write_gather_within(lease, &piece, target.remote(), 2, std::time::Duration::MAX)
            .expect("posted");
        let completion = server
            .wait_for(2, std::time::Duration::MAX)
            .expect("completed");
        assert_eq!((PAGE, Ok(())), (completion.len, completion.result));
        wait_for_bytes(&target, 0, &[2; PAGE]);
    });
}
