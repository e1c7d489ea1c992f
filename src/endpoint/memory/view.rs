//! Reading a region's bytes in place: [`MemoryRegion::view`] and [`RegionView`].
//!
//! # Why a view, not a `&[u8]`
//!
//! A `&[u8]` of memory that something writes while the slice lives is undefined behaviour, and
//! for a `Remote` region no condition this process can observe excludes every writer: revoking
//! the key ([`rekey`](crate::endpoint::LibfabricEndpoint::rekey), or the close at a drop) stops
//! only *new* transfers. On tcp (libfabric 2.6.0 `prov/tcp/src/xnet_progress.c`) a write is
//! checked once, in `xnet_handle_write`, when its header arrives, and its bytes then go through
//! the kept pointer (`rx_entry->iov`) in `xnet_recv_msg_data` over later progress calls;
//! `xnet_mr_close` only removes the key from the domain's map (`ofi_mr_close`,
//! `prov/util/src/util_mr_map.c`). A peer that sent a header and stalls can land its bytes at
//! any later progress call, under any exclusion the application set up meanwhile.
//!
//! So a view never forms a reference to the bytes: each access is `shared_bytes`' relaxed
//! atomic load of the region's aligned word (or edge byte) where it lies, as `read_bytes` makes,
//! so a transfer landing meanwhile is not a data race, only a changed value. What it saves over
//! `read_bytes` is the destination: nothing is allocated or copied to a buffer of the view's
//! size; [`RegionView::bytes`] and [`RegionView::matches`] load word by word as they go.
//!
//! # What holds it still
//!
//! The view borrows the region, so `rekey` (which needs `&mut`) cannot run while it lives: a
//! view taken after a rekey holds off the next exposure, since the new key cannot have been
//! handed out after the view began, and the old one admits nothing new. The stated pattern,
//! on [`MemoryRegion::view`], is the notification, then the rekey, then the view.

use std::marker::PhantomData;

#[cfg(doc)]
use super::registration::Exposure;
use super::{MemoryRegion, shared_bytes};
#[cfg(doc)]
use crate::endpoint::LibfabricEndpoint;
use crate::error::DmaError;

/// How many bytes [`RegionView::matches`] loads at a time, onto the stack.
const CHUNK: usize = 256;

/// The width of one load of [`ViewBytes`].
const WORD: usize = std::mem::size_of::<usize>();

impl<B> MemoryRegion<'_, B> {
    /// `len` bytes at `offset`, to read where they lie: no copy to a buffer of yours, no
    /// allocation, and no `&[u8]` (see [`RegionView`] for what a read of it sees).
    ///
    /// For any region of host memory; made for an [`Exposure::Remote`] region after a peer's
    /// [`write_with_data`](LibfabricEndpoint::write_with_data) notification, where
    /// [`as_slice`](Self::as_slice) is refused and [`read_bytes`](Self::read_bytes) would copy.
    ///
    /// # The rule that keeps the bytes still
    ///
    /// 1. Read the peer's notification ([`poll_notifications`](
    ///    LibfabricEndpoint::poll_notifications)): its write has landed whole.
    /// 2. [`rekey`](LibfabricEndpoint::rekey) the region: no new transfer is admitted under the
    ///    key the peers were given.
    /// 3. View it. The view borrows the region, so no rekey (and so no new key to advertise) can
    ///    happen while it lives: the view holds off the next exposure.
    ///
    /// Then the bytes change only by a transfer the provider admitted before step 2 (one whose
    /// header had arrived, from a peer that did not follow the protocol) or by this endpoint's
    /// own read into the region, if the application posted one. Either is still no undefined
    /// behaviour: a read sees, per aligned word, a value the word held during the read. Without
    /// step 2, a peer that keeps the key may write at any moment, as for `read_bytes`.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when the range does not fit, and for device memory (host
    /// code cannot read it).
    ///
    /// ```
    /// use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let pages = b"header:payload".to_vec();
    /// let address = pages.as_ptr() as usize;
    /// let mut region = endpoint.register_buffer(pages, Exposure::Remote)?;
    /// // ... a peer's write_with_data landed, and its notification was read ...
    /// endpoint.rekey(&mut region)?; // the key the peer had admits nothing new
    /// let payload = region.view(7, 7)?;
    /// assert_eq!(address + 7, payload.as_ptr() as usize, "where it lies");
    /// assert!(payload.matches(b"payload"));
    /// assert_eq!(b"payload".to_vec(), payload.bytes().collect::<Vec<u8>>());
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// A view holds off the next exposure: no rekey while it lives.
    ///
    /// ```compile_fail,E0502
    /// # use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint};
    /// # let configuration = Configuration { rma: true, ..Configuration::default() };
    /// # let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
    /// let mut region = endpoint.register_buffer(vec![0_u8; 64], Exposure::Remote).unwrap();
    /// let view = region.view(0, 64).unwrap();
    /// endpoint.rekey(&mut region).unwrap(); // a new key handed out while the view lives
    /// assert!(view.matches(&[0; 64]));
    /// ```
    pub fn view(&self, offset: usize, len: usize) -> Result<RegionView<'_>, DmaError> {
        if !self.inner.interface.is_host() {
            return Err(DmaError::InvalidArgument(format!(
                "a view was asked of device memory ({:?}), which host code cannot read: move its \
                 bytes with an RMA operation or the device's own copy",
                self.inner.interface
            )));
        }
        self.inner.check_range(offset, len)?;
        Ok(RegionView {
            span: self.span(),
            offset,
            len,
            region: PhantomData,
        })
    }
}

/// Bytes of a [`MemoryRegion`] read where they lie, made by [`MemoryRegion::view`]: each read is
/// a relaxed atomic load of the region's memory, never through a `&[u8]`, so a peer's transfer
/// landing meanwhile changes what a read sees and is never undefined behaviour. When the bytes
/// are still, and why a `&[u8]` cannot be had, is on [`MemoryRegion::view`].
///
/// ```
/// use dma_libfabric::{Configuration, LibfabricEndpoint};
///
/// let configuration = Configuration { rma: true, ..Configuration::default() };
/// let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
/// let region = endpoint.register(64)?;
/// region.write_bytes(0, b"abc")?;
/// let view = region.view(0, 3)?;
/// assert_eq!((3, Some(b'b'), None), (view.len(), view.get(1), view.get(3)));
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
pub struct RegionView<'region> {
    /// The whole region, which fixes which bytes are loaded as words (`shared_bytes`).
    span: shared_bytes::Span,
    offset: usize,
    len: usize,
    region: PhantomData<&'region ()>,
}

impl RegionView<'_> {
    /// How many bytes it covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it covers none.
    pub fn is_empty(&self) -> bool {
        0 == self.len
    }

    /// The address of its first byte, in the registered buffer: for checking that nothing was
    /// copied, or for an `unsafe` read under the application's own proof that nothing writes.
    pub fn as_ptr(&self) -> *const u8 {
        self.span.start.wrapping_add(self.offset).cast_const()
    }

    /// The byte at `at`, or `None` past the end.
    pub fn get(&self, at: usize) -> Option<u8> {
        let mut byte = [0];
        self.load(at, &mut byte).then_some(byte[0])
    }

    /// Whether its bytes are `expected` (false for another length), loaded a chunk at a time.
    pub fn matches(&self, expected: &[u8]) -> bool {
        if expected.len() != self.len {
            return false;
        }
        let mut chunk = [0; CHUNK];
        expected.chunks(CHUNK).enumerate().all(|(index, part)| {
            let seen = &mut chunk[..part.len()];
            self.load(index * CHUNK, seen) && seen == part
        })
    }

    /// Its bytes in order, each aligned word of the region loaded once.
    pub fn bytes(&self) -> ViewBytes<'_> {
        ViewBytes {
            view: self,
            at: 0,
            word: [0; WORD],
            next: 0,
            filled: 0,
        }
    }

    /// Load `out.len()` bytes at `at` of the view; false (nothing loaded) past its end.
    fn load(&self, at: usize, out: &mut [u8]) -> bool {
        match at.checked_add(out.len()) {
            Some(end) if end <= self.len => {}
            _ => return false,
        }
        // SAFETY: `offset + at + out.len() <= offset + len`, inside the region (checked by
        // `view` and above); the region is host memory that lives as long as the view borrows
        // it; `out` is the caller's own `&mut`, which cannot overlap the region (no safe code
        // holds a `&mut` to a region's bytes while it is shared-borrowed). Every Rust access that
        // may race this load is atomic, over the same span: `shared_bytes`' stores, and
        // non-atomic *reads* of a `Local` region (a lent slice, `read_bytes`), which may race a
        // load; `as_mut_slice` needs `&mut` on the region, which the view's borrow excludes. The
        // other writers are the provider's and the kernel's, outside Rust. See `shared_bytes`.
        unsafe { shared_bytes::load(self.span, self.offset + at, out) };
        true
    }
}

impl std::fmt::Debug for RegionView<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RegionView")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// The bytes of a [`RegionView`], in order: [`RegionView::bytes`]. Each aligned word of the
/// region is loaded once, when the iterator reaches it.
///
/// ```
/// use dma_libfabric::{Configuration, LibfabricEndpoint};
///
/// let configuration = Configuration { rma: true, ..Configuration::default() };
/// let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
/// let region = endpoint.register(64)?;
/// region.write_bytes(10, &[1, 2, 3])?;
/// let sum: u32 = region.view(10, 3)?.bytes().map(u32::from).sum();
/// assert_eq!(6, sum);
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
#[derive(Debug)]
pub struct ViewBytes<'view> {
    view: &'view RegionView<'view>,
    /// The view's offset of `word[0]`.
    at: usize,
    word: [u8; WORD],
    /// The next byte of `word` to hand out.
    next: usize,
    /// How many bytes of `word` were loaded.
    filled: usize,
}

impl Iterator for ViewBytes<'_> {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        if self.next == self.filled {
            self.at += self.filled;
            (self.next, self.filled) = (0, 0);
            if self.at >= self.view.len {
                return None;
            }
            // Up to the next word boundary of the region's memory, so each word loads once.
            let address = self.view.as_ptr() as usize + self.at;
            let chunk = (WORD - address % WORD).min(self.view.len - self.at);
            if !self.view.load(self.at, &mut self.word[..chunk]) {
                return None;
            }
            (self.next, self.filled) = (0, chunk);
        }
        let byte = self.word[self.next];
        self.next += 1;
        Some(byte)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.view.len - self.at - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for ViewBytes<'_> {}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking

    use crate::endpoint::memory::tests::endpoint;

    /// Every offset and length of a region at every alignment of its start: the view's bytes,
    /// `get` and `matches` agree with what was written.
    #[test]
    fn a_view_reads_what_was_written_at_every_offset() {
        let endpoint = endpoint();
        let region = endpoint.register(61).expect("registered");
        let data: Vec<u8> = (0..61).map(|at| at as u8 * 3 + 1).collect();
        region.write_bytes(0, &data).expect("fits");
        for offset in 0..61 {
            for len in 0..=61 - offset {
                let view = region.view(offset, len).expect("in range");
                let mut bytes = view.bytes();
                assert_eq!(len, bytes.len());
                let seen: Vec<u8> = bytes.by_ref().collect();
                assert_eq!(
                    (0, None),
                    (bytes.len(), bytes.next()),
                    "done, and stays done"
                );
                assert_eq!(&data[offset..offset + len], &seen[..], "{offset} {len}");
                assert!(view.matches(&data[offset..offset + len]));
                assert_eq!(0 == len, view.matches(&[]));
                assert_eq!(None, view.get(len));
            }
        }
        assert!(region.view(60, 2).is_err(), "past the end");
        assert!(region.view(usize::MAX, 2).is_err(), "overflows");
    }
}
