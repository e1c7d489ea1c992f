//! Copies in and out of a region's bytes: [`MemoryRegion::write_bytes`] and
//! [`MemoryRegion::read_bytes`], and what each may see ("Contents" on [`MemoryRegion`]). A
//! `Local` region's copies take the region's exclusion (as a lent slice does); a `Remote`
//! region's are `shared_bytes`' atomic copies.

use std::ptr;

#[cfg(doc)]
use super::registration::Exposure;
use super::registration::Registration;
use super::{MemoryRegion, shared_bytes};
#[cfg(doc)]
use crate::endpoint::LibfabricEndpoint;
use crate::error::DmaError;

impl<B> MemoryRegion<'_, B> {
    /// Copy `data` into the region at `offset`.
    ///
    /// The region is one a peer may write at any moment ([`Exposure::Remote`], and every region
    /// of [`register`](LibfabricEndpoint::register)), so the copy is made of atomic byte stores
    /// that a landing transfer cannot turn into a data race; a peer's transfer, or this
    /// endpoint's own read into the region, landing on the same bytes meanwhile leaves a mix of
    /// both (see "Contents" above).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when it does not fit, for device memory (host code cannot
    /// copy into it), and for a region registered [`Exposure::Local`] (written through
    /// [`as_mut_slice`](Self::as_mut_slice), which the borrow checker and the region keep apart
    /// from slices lent out); nothing is copied.
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<(), DmaError> {
        self.check_copy()?;
        if self.inner.lends_slices() {
            return Err(DmaError::InvalidArgument(
                "write_bytes was asked of a Local region, which is written in place: call \
                 as_mut_slice (it needs the region borrowed mutably, so no operation or slice \
                 can overlap the write)"
                    .into(),
            ));
        }
        self.inner.check_range(offset, data.len())?;
        // SAFETY: the range is inside the buffer (checked), which lives as long as `self`, in
        // host memory (checked), and does not overlap `data` (a shared borrow, which no `&mut`
        // to the region's bytes can coexist with: a region that lends no slices never hands one
        // out in safe code). Every Rust access to a region's bytes that may race this one is
        // `shared_bytes`' (atomic), over the same span (the whole region: `span`, and the pool's
        // zeroing of the same buffer before it was registered), so each location is always
        // accessed at one size; the other writers (the provider, the kernel) are outside Rust.
        unsafe { shared_bytes::store(self.span(), offset, data) };
        Ok(())
    }

    /// Copy the region's bytes at `offset` into `out`.
    ///
    /// # What a copy sees
    ///
    /// - **[`Exposure::Local`]** (the application's buffer, which no peer reaches): exactly the
    ///   bytes of the last operation of this endpoint whose completion has been read, and of the
    ///   application's own writes. While an operation of this endpoint holds the region (posted,
    ///   its completion not yet read: a `read` or `read_scatter` landing into it, or a write
    ///   reading from it), the copy is refused with [`DmaError::Busy`] rather than copying bytes
    ///   in flight, and so is it while a post on the region waits for loans to end. A post that
    ///   arrives during a copy waits for the copies and slices lent then (a copy is a `memcpy`;
    ///   a slice, from [`as_slice`](Self::as_slice), lives as long as its holder keeps it, and
    ///   the post waits for it within its patience), and new copies and slices are refused
    ///   meanwhile, so a thread that keeps copying never keeps an operation out. Never torn.
    /// - **[`Exposure::Remote`]** (and every region of
    ///   [`register`](LibfabricEndpoint::register)): a peer may write any byte at any moment,
    ///   and this endpoint's own reads into the region land without asking it, so the copy is
    ///   never refused and never waits. It is made of atomic byte loads (no undefined behaviour
    ///   whatever lands meanwhile), and each byte is a value it held during the copy: a copy that
    ///   races a landing transfer may mix old and new bytes. The pattern that never tears: read
    ///   only bytes that a completed transfer covers, and that nothing writes any more: after
    ///   the completion of this endpoint's own read has been read, or after the peer's
    ///   notification ([`write_with_data`](LibfabricEndpoint::write_with_data), delivered by
    ///   [`poll_notifications`](LibfabricEndpoint::poll_notifications)) for the bytes that write
    ///   covered, when the application's protocol keeps that peer (and every other) off them
    ///   until it has read them. Without such a protocol, tell a whole record from a torn one
    ///   yourself (a checksum, a sequence number written last), as on any RDMA NIC.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when the range does not fit, and for device memory;
    /// [`DmaError::Busy`] for a `Local` region that an operation of this endpoint holds, or that
    /// a post is waiting for (try again once the operation's completion has been read). Nothing is copied on an error.
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<(), DmaError> {
        self.check_copy()?;
        self.inner.check_range(offset, out.len())?;
        if self.inner.lends_slices() {
            let _lent = self.lend()?;
            // SAFETY: the range is inside the buffer (checked), which lives as long as `self`, in
            // host memory (checked); the region is `Local`, so no peer reaches it; no operation
            // of this endpoint holds it (`lend`, whose Acquire makes every completed operation's
            // bytes visible) and none can start while `_lent` lives; `write_bytes` is refused on
            // it and `as_mut_slice` needs `&mut self`. So nothing writes these bytes during the
            // copy, and `out` (the caller's `&mut`) cannot overlap them.
            unsafe { ptr::copy_nonoverlapping(self.inner.at(offset), out.as_mut_ptr(), out.len()) };
            return Ok(());
        }
        // SAFETY: the range is inside the buffer (checked), which lives as long as `self`, in
        // host memory (checked). No `&mut` to these bytes exists in safe code (a region that
        // lends no slices hands none out), so they do not overlap `out`. Every Rust access that
        // may race this one is atomic (`shared_bytes`' stores in `write_bytes`), over the same
        // span, so each location is always accessed at one size; the other writers, a peer's transfer or this endpoint's own read landing,
        // are the provider's and the kernel's, outside Rust. See `shared_bytes`.
        unsafe { shared_bytes::load(self.span(), offset, out) };
        Ok(())
    }

    /// The whole region, for `shared_bytes`' copies.
    pub(super) fn span(&self) -> shared_bytes::Span {
        shared_bytes::Span {
            start: self.inner.at(0),
            len: self.inner.len(),
        }
    }

    /// Lend the region for the length of one copy (see [`read_bytes`](Self::read_bytes)).
    fn lend(&self) -> Result<Lent<'_>, DmaError> {
        self.inner.lend_copy()?;
        Ok(Lent(&self.inner))
    }

    /// Host code copies only host memory.
    fn check_copy(&self) -> Result<(), DmaError> {
        if self.inner.interface.is_host() {
            Ok(())
        } else {
            Err(DmaError::InvalidArgument(format!(
                "read_bytes/write_bytes were asked of device memory ({:?}), which host code cannot \
                 copy: move it with an RMA operation, or with the device's own copy (cudaMemcpy \
                 and its kin)",
                self.inner.interface
            )))
        }
    }
}

/// A loan of a region's bytes for one copy, given back when dropped.
struct Lent<'region>(&'region Registration);

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        self.0.return_copy();
    }
}
