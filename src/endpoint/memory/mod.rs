//! Registered memory: buffers a peer may write into or read from, and the descriptor it needs
//! to do so.
//!
//! [`LibfabricEndpoint::register`] allocates a buffer, registers it with `fi_mr_reg` for local
//! and remote reads and writes, and returns a [`MemoryRegion`]. Its [`RemoteRegion`] (address,
//! key, length) is what a peer needs to post `fi_write` or `fi_read` against it.
//!
//! What a user relies on is on the public items: the provider's registration mode, a region's
//! lifetime, parking, reuse and what it risks, and who touches the bytes on [`MemoryRegion`];
//! the size classes and the quarantine on [`PooledBuffer`]; the keys on
//! [`register`](LibfabricEndpoint::register).
//!
//! # Keys
//!
//! Where the provider does not choose a region's key (no `FI_MR_PROV_KEY`), every registration
//! of an endpoint ([`register`](LibfabricEndpoint::register),
//! [`register_buffer`](LibfabricEndpoint::register_buffer),
//! [`rekey`](LibfabricEndpoint::rekey)) requests a fresh random key from the endpoint's one
//! source (`registration/keys.rs`), and draws again while the domain answers that the key is in
//! use, at most [`REGION_KEY_ATTEMPTS`] times. Why the keys are random, and how they are drawn,
//! is on [`register`](LibfabricEndpoint::register) ("Keys").
//!
//! # Rooms
//!
//! This module holds the region types ([`MemoryRegion`], [`Segment`]). Below it, `face` holds
//! every public memory method of the endpoint ([`register`](LibfabricEndpoint::register),
//! [`register_shared`](LibfabricEndpoint::register_shared),
//! [`register_buffer`](LibfabricEndpoint::register_buffer),
//! [`rekey`](LibfabricEndpoint::rekey), [`parked_memory`](LibfabricEndpoint::parked_memory)),
//! `remote` the descriptor a peer is given ([`RemoteRegion`]), `registration` a registration's
//! life (`fi_mr_reg` under `mr_mode`, the keys, the holds of operations in flight,
//! [`Exposure`] and [`MemoryInterface`]), `renewal` a region's key renewed, `loans` who may
//! touch a `Local` region's bytes now (operations' holds, slices, copies), `pool` the parked
//! memory, `copies` the region's [`read_bytes`](MemoryRegion::read_bytes) and
//! [`write_bytes`](MemoryRegion::write_bytes), and `shared_bytes` the atomic copies they (and the
//! pool's zeroing) make of memory a peer may be writing, and `mapping` the check of a file
//! mapping's length at registration. The application's own buffers, registered in place, are
//! [`buffer`](super::buffer)'s, which uses this module; of this module only `face` uses it (for
//! [`StableBuffer`](super::buffer::StableBuffer), the type `register_buffer` takes).

use std::marker::PhantomData;
use std::sync::Arc;

use self::registration::{Exposure, MemoryInterface, Registration};
use super::LibfabricEndpoint;
use crate::error::DmaError;

mod copies;
mod face;
mod loans;
#[cfg(feature = "memmap2")]
pub(super) mod mapping;
pub(super) mod pool;
pub(super) mod registration;
mod remote;
mod renewal;
mod shared_bytes;
mod view;

pub use self::pool::REGION_REUSE_QUARANTINE;
pub use self::registration::{MAX_REGION_LEN, REGION_KEY_ATTEMPTS};
pub use self::remote::RemoteRegion;
pub use self::view::{RegionView, ViewBytes};

/// The buffer type of a region made by [`LibfabricEndpoint::register`]: the endpoint's own
/// memory, which is parked and reused by the endpoint, never handed out.
///
/// Why a dropped region's memory is parked rather than freed, and what its reuse risks, is on
/// [`MemoryRegion`] ("Parking", "Reuse"). This is how reuse is bounded.
///
/// # Size classes and the quarantine
///
/// Buffers are allocated at their size class's capacity: the length rounded up to a quarter of
/// its power of two, so at most 25% larger than the region, and at least 64 bytes. A dropped
/// region's buffer is parked in its class, and a later [`register`](LibfabricEndpoint::register)
/// of the same endpoint and class takes the oldest parked buffer, zeroed, once
/// [`REGION_REUSE_QUARANTINE`] more of the class have been parked after it; until then it
/// allocates.
///
/// # Bounds
///
/// [`parked_memory`](LibfabricEndpoint::parked_memory) says how many bytes are parked, until
/// reused or until the endpoint drops. A buffer is allocated only while its class has at most
/// [`REGION_REUSE_QUARANTINE`] parked, so a class never holds more buffers (alive and parked
/// together) than the most regions of that class ever alive at once, plus
/// [`REGION_REUSE_QUARANTINE`]: parked memory is bounded by the peak of registered memory, plus
/// the quarantine, plus 25% for the classes. The application's own buffers parked at a drop
/// ([`Exposure::Remote`] regions of
/// [`register_buffer`](LibfabricEndpoint::register_buffer)) are never reused, and are bounded by
/// the `Remote` buffers dropped over the endpoint's life (each its capacity; why no drop can
/// free one sooner is on [`MemoryRegion`], "Parking"); a region
/// [`rekey`](LibfabricEndpoint::rekey)ed between rounds instead of dropped adds nothing.
#[derive(Debug)]
pub struct PooledBuffer {
    _private: (),
}

/// A registered buffer of this process: the local side of this endpoint's RMA operations and,
/// unless registered [`Exposure::Local`], memory peers may write into and read from.
///
/// Made by [`LibfabricEndpoint::register`] (the endpoint's
/// own memory, `B` = [`PooledBuffer`]) or
/// [`register_buffer`](LibfabricEndpoint::register_buffer) (the application's buffer `B`,
/// registered in place); it borrows that endpoint. Dropping it while an operation on it is in
/// flight is safe: the memory and the registration live until the operation's completion has
/// been read. Memory a peer may reach is then parked by the endpoint, not freed, since a peer's
/// transfer may still reach it ([`parked_memory`](LibfabricEndpoint::parked_memory)). See
/// [`StableBuffer`](super::buffer::StableBuffer) for the application's memory, and who may
/// touch its bytes when.
///
/// ```
/// use dma_libfabric::{Configuration, LibfabricEndpoint, RemoteRegion};
///
/// let configuration = Configuration { rma: true, ..Configuration::default() };
/// let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
/// let region = endpoint.register(64)?;
/// region.write_bytes(8, b"hello")?;
/// let mut out = [0; 5];
/// region.read_bytes(8, &mut out)?;
/// assert_eq!(b"hello", &out);
///
/// let advertised = region.remote().to_bytes(); // what a peer is told
/// assert_eq!(region.remote(), RemoteRegion::from_bytes(&advertised)?);
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
///
/// # Registration mode
///
/// Providers differ in what they ask (`domain_attr.mr_mode`); each bit is read from the
/// `fi_info` the endpoint was opened with, never assumed:
///
/// - `FI_MR_VIRT_ADDR`: a peer addresses the region by its virtual address; otherwise by its
///   offset from 0. [`MemoryRegion::remote`] gives whichever the provider wants.
/// - `FI_MR_PROV_KEY`: the provider chooses the key (read back with `fi_mr_key`); otherwise the
///   endpoint requests a random one of its own (see [`register`](LibfabricEndpoint::register)),
///   drawing again while the domain answers that it is in use.
/// - `FI_MR_LOCAL`: local buffers of an operation need their descriptor (`fi_mr_desc`). Every
///   local buffer of an RMA operation here is a registered region, and its descriptor is always
///   passed, so the bit is honoured whether or not it is set.
/// - `FI_MR_ALLOCATED`: only allocated memory may be registered. The region allocates its own.
/// - `FI_MR_ENDPOINT`: the region is bound to the endpoint (`fi_mr_bind`) and enabled
///   (`fi_mr_enable`) before use.
/// - `FI_MR_RAW` (keys wider than 64 bits) is not supported: registering fails with a clear
///   error.
///
/// # Lifetime
///
/// A [`MemoryRegion`] borrows its endpoint, or (made by
/// [`register_shared`](LibfabricEndpoint::register_shared)) holds an `Arc` of it, so it
/// cannot outlive the domain it is registered in.
/// Its memory and registration are shared (an `Arc`) with every operation in flight on it:
/// dropping the `MemoryRegion` while this endpoint's own write or read is in flight leaves both
/// alive until the operation's completion has been read, and only then closes the registration.
/// Its memory is then *parked* by the endpoint (next section), never freed while the endpoint is
/// open.
///
/// # Parking: memory a peer may still reach
///
/// A peer's `fi_write` into a region, or `fi_read` from it, completes only at the peer: this
/// endpoint never sees a completion for it, so no order of drops in this process can wait for
/// it. What happens to such a transfer when the region's registration is closed is the
/// provider's:
///
/// - **Software providers** (tcp, sockets, and rxm over either; libfabric 1.17 and 2.6.0) check a
///   peer's transfer once, when its header arrives (`ofi_mr_verify`, in
///   `prov/tcp/src/xnet_progress.c`'s `xnet_handle_write` and `xnet_handle_read_req`), and keep
///   the buffer's address in the transfer (`rx_entry->iov`, the read response's `iov`). The data
///   then moves through those raw pointers over later progress calls, for as long as the peer
///   keeps sending or receiving. `fi_close` of the registration removes the key from the
///   domain's map, which refuses *new* transfers, but touches no transfer already admitted.
///   Measured on 1.17 (`tests/rma_edges.rs`, before parking): 8 MiB written by a peer landed in
///   an unrelated `Vec` allocated after the region was dropped, and a peer's read was answered
///   with unrelated memory.
/// - **fi_mr(3)** (2.6.0 `man/fi_mr.3.md`, "fi_close") promises no more for any provider:
///   "Active or queued operations that reference a memory region being closed may attempt to
///   access an invalid memory region and fail [...] Applications are responsible for ensuring
///   that a MR is no longer needed prior to closing it." Only *new* accesses from a remote peer
///   are promised to fail.
/// - **Hardware registration** (verbs, efa) would stop the NIC: `ibv_dereg_mr` destroys the
///   device's memory key before the kernel unpins the pages. But libfabric puts `fi_mr_reg`
///   behind its registration cache on both (2.6.0 `prov/verbs/src/verbs_mr.c`,
///   `vrb_mr_cache_reg`; its `fi_close` is `ofi_mr_cache_delete`, which may keep the device
///   registration, and so the old key, alive), efa emulates some RMA protocols in software
///   through its own copies, and `fi_efa(7)`'s `FI_EFA_TRACK_MR` only *warns* when an MR is
///   closed while operations still reference it. No libfabric document guarantees, for any
///   provider, that a closed registration's memory is no longer accessed.
///
/// So on every provider the endpoint parks a dropped region's memory: the registration is
/// closed at once (new transfers under its key fail at the peer), and the buffer goes to the
/// endpoint's pool, which frees it only when the endpoint itself drops, after its `fid_ep`,
/// queues, address vector, domain and fabric have been closed (the pool is owned by the
/// endpoint's operations, a field declared after its handles): with the domain closed, no
/// transfer of the provider's remains. There is no provider for which the endpoint frees at
/// once, because none documents that it may.
///
/// What the endpoint relies on from `fi_close`, read in libfabric 2.6.0's tcp (the same design
/// as 1.17's, under rxm too, whose registration wraps tcp's): `xnet_mr_close` (under the
/// progress lock) calls `ofi_mr_close`, which removes the key from the domain's map
/// (`ofi_mr_map_remove`) under the domain's lock, the lock `ofi_mr_verify` looks keys up under
/// for `xnet_handle_write` and `xnet_handle_read_req`; so once `fi_close` has returned **no new
/// transfer is admitted under the key**. Nothing more: a write admitted before keeps its
/// pointer in `rx_entry->iov`, and `xnet_recv_msg_data` receives into it whenever its bytes
/// arrive, so **the provider may still write the memory after `fi_close` returns**, for as long
/// as the peer takes to send them. So
/// the bound on parked memory is what was registered, not less: every `Remote` buffer dropped
/// stays parked (its capacity and a few words: 4,136 B of heap a 4 KiB `Vec`, 4,161 B resident)
/// until the endpoint closes, and `Local` buffers are not parked at all. A server that gives
/// peers memory round after round does not drop it between rounds:
/// [`rekey`](LibfabricEndpoint::rekey) revokes the key and renews it on the same buffer, which
/// parks and allocates nothing (10,000 rounds of a 4 KiB buffer: parked 0 B, heap +0 B,
/// resident +0 B, where register/drop grew both by 41 MB; `tests/parking_bounded.rs`), or
/// [`register`](LibfabricEndpoint::register)'s memory is reused past a quarantine (below).
///
/// # Reuse, and what it risks
///
/// A server that registers and drops regions in a loop must not grow without bound, so a parked
/// buffer of [`register`](LibfabricEndpoint::register)'s is reused by a later `register` of the
/// same endpoint in the same size class, past a quarantine: zeroed, and registered under a new
/// key. [`PooledBuffer`] states the classes, the quarantine and the bound on parked memory. The
/// application's own buffers ([`register_buffer`](LibfabricEndpoint::register_buffer)) are
/// parked too, and never reused.
///
/// Reuse is sound for *memory*: a transfer admitted under the old registration can reach only
/// bytes inside that buffer (the provider checked it against the old region, whose length is at
/// most the capacity; libfabric's unchecked `addr + len`, in `docs/rma.md`, is the one exception
/// and needs a valid key), which the pool owns for as long as the provider may run, and which
/// this crate only ever touches through byte copies (see "Contents"; the zeroing for the new
/// region is one more), never through a reference. No allocation outside the pool can be written or
/// leaked, which is what freeing the buffer at the drop allowed.
///
/// Reuse cannot be argued sound for the *contents* while the endpoint is open: no condition this
/// process can observe proves that a peer's transfer admitted before the drop has finished (it
/// finishes when the peer has sent, or drained, all its bytes, which a stalled peer never does).
/// A stale transfer that is still moving bytes when its buffer is reused writes into, or reads
/// from, the new region, although its key is not the new region's. As a mitigation, a parked
/// buffer is reused only after [`REGION_REUSE_QUARANTINE`] more buffers of its class have been
/// parked after it (a quarantine by count, which needs no progress and no clock), so a drop
/// followed at once by a registration of the same size never gets the buffer just dropped. That
/// narrows the window; it does not close it. An application that needs the guarantee keeps a
/// region registered until its peers have confirmed (on their own messages) that they are done
/// with it.
///
/// # Contents
///
/// A registered buffer is written by peers, and by the provider on behalf of local reads, at
/// times this process does not choose. So the bytes of a region peers may reach (every region of
/// `register`, and the application's buffers registered [`Exposure::Remote`]) are only ever
/// copied in and out ([`MemoryRegion::write_bytes`], [`MemoryRegion::read_bytes`]), never lent
/// out as a slice in safe code, and those copies are atomic byte by byte, so a transfer landing
/// during one is not a data race (undefined behaviour) in this process, only a mix of old and new
/// bytes: a copy taken while a transfer lands may be torn, and [`MemoryRegion::read_bytes`] says
/// which reads never are. A buffer registered [`Exposure::Local`] is reached by no peer: it
/// lends slices, and copies out with `read_bytes`, only while no operation of this endpoint
/// holds it, and refuses them ([`DmaError::Busy`]) while one does, so no safe read of it ever
/// sees bytes in flight (see [`StableBuffer`](super::buffer::StableBuffer)).
pub struct MemoryRegion<'ep, B = PooledBuffer> {
    pub(crate) inner: Arc<Registration>,
    /// The endpoint, for a region made by
    /// [`register_shared`](LibfabricEndpoint::register_shared): declared after `inner`, so
    /// the registration goes before the endpoint can. Held for its `Drop`.
    #[allow(dead_code)]
    owner: Option<Arc<LibfabricEndpoint>>,
    endpoint: PhantomData<&'ep ()>,
    /// The type of the memory, for [`into_buffer`](Self::into_buffer); `fn() -> B` so that the
    /// region is `Sync` whatever `B` is (no `&B` is ever lent).
    buffer: PhantomData<fn() -> B>,
}

impl<B> std::fmt::Debug for MemoryRegion<'_, B> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MemoryRegion")
            .field("len", &self.inner.len)
            .field("exposure", &self.inner.exposure)
            .field("interface", &self.inner.interface)
            .field("remote", &self.remote())
            .finish_non_exhaustive()
    }
}

impl<B> MemoryRegion<'_, B> {
    /// The same region, keeping `owner` (its endpoint) alive instead of borrowing it.
    pub(crate) fn owned_by(self, owner: Arc<LibfabricEndpoint>) -> MemoryRegion<'static, B> {
        MemoryRegion {
            inner: self.inner,
            owner: Some(owner),
            endpoint: PhantomData,
            buffer: PhantomData,
        }
    }
}

impl<'ep, B> MemoryRegion<'ep, B> {
    pub(crate) fn new(registration: Registration) -> Self {
        Self {
            inner: Arc::new(registration),
            owner: None,
            endpoint: PhantomData,
            buffer: PhantomData,
        }
    }

    /// The same region, its buffer type forgotten: for a rail set, which keeps every rail's
    /// registration as the library's own type.
    pub(crate) fn erase(self) -> MemoryRegion<'ep> {
        MemoryRegion {
            inner: self.inner,
            owner: self.owner,
            endpoint: PhantomData,
            buffer: PhantomData,
        }
    }

    /// The same region, typed again as holding a `C` (checked when the buffer is handed out).
    pub(crate) fn retype<C>(self) -> MemoryRegion<'ep, C> {
        MemoryRegion {
            inner: self.inner,
            owner: self.owner,
            endpoint: PhantomData,
            buffer: PhantomData,
        }
    }

    /// Its parts, for [`into_buffer`](Self::into_buffer) and friends.
    pub(crate) fn into_parts(self) -> (Arc<Registration>, Option<Arc<LibfabricEndpoint>>) {
        (self.inner, self.owner)
    }

    /// A region from [`into_parts`](Self::into_parts)' parts.
    pub(crate) fn from_parts(
        inner: Arc<Registration>,
        owner: Option<Arc<LibfabricEndpoint>>,
    ) -> Self {
        Self {
            inner,
            owner,
            endpoint: PhantomData,
            buffer: PhantomData,
        }
    }

    /// The same region with its borrow of the endpoint erased: for a rail set's region that keeps
    /// its rail set alive through an `Arc` instead.
    ///
    /// # Safety
    /// The endpoint this region is registered with outlives the returned region.
    pub(crate) unsafe fn unbind(self) -> MemoryRegion<'static, B> {
        MemoryRegion {
            inner: self.inner,
            owner: self.owner,
            endpoint: PhantomData,
            buffer: PhantomData,
        }
    }

    /// The region's length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Always `false`: an empty region cannot be registered.
    pub fn is_empty(&self) -> bool {
        0 == self.inner.len
    }

    /// Whether peers may reach it ([`Exposure::Remote`]; every region of
    /// [`register`](LibfabricEndpoint::register)) or only this endpoint's own operations.
    pub fn exposure(&self) -> Exposure {
        self.inner.exposure
    }

    /// Where its memory lives: host memory, or a device's.
    pub fn interface(&self) -> MemoryInterface {
        self.inner.interface
    }

    /// What a peer needs to write into or read from this whole region. A region registered
    /// [`Exposure::Local`] has no remote access and no key: its key here is `FI_KEY_NOTAVAIL`
    /// (`u64::MAX`), and the provider refuses a peer's transfer under it.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            address: self.inner.remote_base,
            key: self.inner.key,
            len: self.inner.len as u64,
        }
    }

    /// `len` bytes at `offset`, as the local side of a [`write`](LibfabricEndpoint::write)
    /// (the source) or a [`read`](LibfabricEndpoint::read) (the destination).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for an empty segment or one that does not fit the region.
    pub fn segment(&self, offset: usize, len: usize) -> Result<Segment<'_>, DmaError> {
        if 0 == len {
            return Err(DmaError::InvalidArgument(format!(
                "segment({offset}, 0) asks for an empty segment: a segment is 1 to {} bytes of \
                 the region; ask for at least one byte",
                self.inner.len
            )));
        }
        self.inner.check_range(offset, len)?;
        Ok(Segment {
            region: &self.inner,
            offset,
            len,
        })
    }

    /// How many operations in flight hold this region now.
    pub fn in_flight(&self) -> usize {
        Arc::strong_count(&self.inner).saturating_sub(1)
    }
}

/// A checked range of a [`MemoryRegion`]: the local side of an RMA operation.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'region> {
    pub(crate) region: &'region Arc<Registration>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl Segment<'_> {
    /// Its length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: segments are never empty.
    pub fn is_empty(&self) -> bool {
        0 == self.len
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking

    use super::*;
    use crate::configuration::Configuration;

    /// An RMA endpoint on tcp, for this room's unit tests (`registration` uses it too).
    pub(super) fn endpoint() -> LibfabricEndpoint {
        let configuration = Configuration {
            rma: true,
            ..Configuration::default()
        };
        LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint")
    }

    /// A dropped region's memory is parked, reused only past the quarantine, and zeroed.
    #[test]
    fn dropped_memory_is_parked_then_reused_zeroed_past_the_quarantine() {
        let endpoint = endpoint();
        let mut starts = Vec::new();
        for _ in 0..=REGION_REUSE_QUARANTINE {
            let region = endpoint.register(4096).expect("registered");
            region.write_bytes(0, &[0xab; 4096]).expect("fits");
            starts.push(region.inner.buffer as usize);
            drop(region);
        }
        assert_eq!(
            (REGION_REUSE_QUARANTINE + 1) * 4096,
            endpoint.parked_memory()
        );
        let mut sorted = starts.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            starts.len(),
            sorted.len(),
            "none reused inside the quarantine"
        );

        let reused = endpoint.register(4000).expect("registered");
        assert_eq!(
            starts[0], reused.inner.buffer as usize,
            "the oldest is reused"
        );
        assert_eq!(REGION_REUSE_QUARANTINE * 4096, endpoint.parked_memory());
        let mut seen = vec![0xff; 4000];
        reused.read_bytes(0, &mut seen).expect("in range");
        assert!(
            seen.iter().all(|&byte| 0 == byte),
            "zeroed for its new owner"
        );
    }
}
