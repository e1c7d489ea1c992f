//! Memory on every rail: [`RailRegion`] (one buffer, registered in every rail's domain),
//! [`RailRemoteRegion`] (its key on every rail, to advertise) and [`RailSegment`] (a range of
//! it, the local side of a striped transfer).

use std::marker::PhantomData;

use super::MAX_RAILS;
use crate::endpoint::{
    Exposure, MemoryRegion, PooledBuffer, RegionSlice, RemoteRegion, Segment, StableBuffer,
};
use crate::error::DmaError;

/// One buffer registered in every rail's domain: peers reach the same bytes through any rail.
/// Made by [`RailSet::register`](super::RailSet::register) (the rail set's own memory) or
/// [`RailSet::register_buffer`](super::RailSet::register_buffer) (the application's buffer
/// `B`, in place); it borrows the rail set.
///
/// The buffer is rail 0's; the other rails register the same memory under their own keys, and
/// the memory lives until every registration and every operation on any rail is done with it.
#[derive(Debug)]
pub struct RailRegion<'rails, B = PooledBuffer> {
    /// Rail `i`'s registration in slot `i`; rail 0 owns the memory.
    pub(crate) regions: Vec<MemoryRegion<'rails>>,
    /// The rail set, for a region made by
    /// [`register_shared`](super::RailSet::register_shared): declared after `regions`, so the
    /// registrations go before the rail set can. Held for its `Drop`.
    #[allow(dead_code)]
    pub(crate) owner: Option<std::sync::Arc<super::RailSet>>,
    /// The buffer's type, for [`into_buffer`](Self::into_buffer): rail 0's region holds it.
    pub(crate) buffer: PhantomData<fn() -> B>,
}

impl<B> RailRegion<'_, B> {
    /// The region's length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.regions.first().map_or(0, MemoryRegion::len)
    }

    /// Always `false`: an empty region cannot be registered.
    pub fn is_empty(&self) -> bool {
        0 == self.len()
    }

    /// How many rails it is registered on.
    pub fn rails(&self) -> usize {
        self.regions.len()
    }

    /// What a peer needs to reach this region through any rail: one key per rail.
    pub fn remote(&self) -> RailRemoteRegion {
        RailRemoteRegion {
            regions: self.regions.iter().map(MemoryRegion::remote).collect(),
        }
    }

    /// `len` bytes at `offset`, as the local side of [`RailSet::write`](super::RailSet::write)
    /// (the source) or [`RailSet::read`](super::RailSet::read) (the destination).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for an empty segment or one that does not fit the region.
    pub fn segment(&self, offset: usize, len: usize) -> Result<RailSegment<'_>, DmaError> {
        let Some(first) = self.regions.first() else {
            return Err(DmaError::InvalidArgument("a region of no rails".into()));
        };
        first.segment(offset, len)?;
        Ok(RailSegment {
            regions: &self.regions,
            offset,
            len,
        })
    }

    /// Copy `data` into the region at `offset`.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when it does not fit; nothing is copied.
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<(), DmaError> {
        match self.regions.first() {
            Some(region) => region.write_bytes(offset, data),
            None => Err(DmaError::InvalidArgument("a region of no rails".into())),
        }
    }

    /// Copy the region's bytes at `offset` into `out`.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when the range does not fit; nothing is copied.
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<(), DmaError> {
        match self.regions.first() {
            Some(region) => region.read_bytes(offset, out),
            None => Err(DmaError::InvalidArgument("a region of no rails".into())),
        }
    }
}

impl<B> RailRegion<'_, B> {
    /// Rail 0's region, which owns the memory.
    fn primary(&self) -> Result<&MemoryRegion<'_>, DmaError> {
        self.regions
            .first()
            .ok_or_else(|| DmaError::InvalidArgument("a region of no rails".into()))
    }

    /// Whether peers may reach it (on every rail alike).
    pub fn exposure(&self) -> Exposure {
        self.regions
            .first()
            .map_or(Exposure::Remote, MemoryRegion::exposure)
    }

    /// The region's bytes, shared, as [`MemoryRegion::as_slice`]: for an [`Exposure::Local`]
    /// region, while no operation on any rail holds it.
    ///
    /// # Errors
    /// As `MemoryRegion::as_slice`.
    pub fn as_slice(&self) -> Result<RegionSlice<'_>, DmaError> {
        self.primary()?.as_slice()
    }

    /// The region's bytes, to write in place, as [`MemoryRegion::as_mut_slice`]: no segment of
    /// the region (so no operation on any rail) can be taken while the slice lives.
    ///
    /// # Errors
    /// As `MemoryRegion::as_mut_slice`.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8], DmaError> {
        match self.regions.first_mut() {
            Some(primary) => primary.as_mut_slice(),
            None => Err(DmaError::InvalidArgument("a region of no rails".into())),
        }
    }
}

impl<B: StableBuffer> RailRegion<'_, B> {
    /// The buffer back, every rail's registration closed, as [`MemoryRegion::into_buffer`]: for
    /// an [`Exposure::Local`] region that no operation on any rail holds.
    ///
    /// # Errors
    /// The region itself with [`DmaError::Busy`] while an operation on any rail holds it, or
    /// [`DmaError::InvalidArgument`] for a `Remote` region (parked on drop): unchanged, unless
    /// rail 0's own operation was seen done and was not (then it comes back on rail 0 alone,
    /// the other rails' registrations closed).
    #[allow(clippy::result_large_err)] // the region comes back with the error
    pub fn into_buffer(mut self) -> Result<B, (Self, DmaError)> {
        if Exposure::Local != self.exposure() || self.regions.is_empty() {
            return Err((
                self,
                DmaError::InvalidArgument(
                    "a Remote region's buffer may still be reached by a peer: it is parked on drop"
                        .into(),
                ),
            ));
        }
        // Owned, so no segment lives and no operation can start: the holders only go. Rail 0's
        // registration is held by every other rail's, and by its own operations.
        let others = self.regions.len() - 1;
        let idle = self.regions[1..].iter().all(|alias| 0 == alias.in_flight())
            && others == self.regions[0].in_flight();
        if !idle {
            return Err((self, DmaError::Busy));
        }
        let primary = self.regions.swap_remove(0);
        self.regions.clear(); // the other rails' registrations close, releasing rail 0's
        primary
            .retype::<B>()
            .into_buffer()
            .map_err(|(primary, error)| {
                // Another rail's registration is gone now: the region comes back on rail 0 only,
                // which still holds the buffer.
                self.regions.push(primary.erase());
                (self, error)
            })
    }
}

/// A checked range of a [`RailRegion`]: the local side of a striped transfer.
#[derive(Debug, Clone, Copy)]
pub struct RailSegment<'region> {
    regions: &'region [MemoryRegion<'region>],
    offset: usize,
    len: usize,
}

impl<'region> RailSegment<'region> {
    /// Its length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: an empty segment cannot be made.
    pub fn is_empty(&self) -> bool {
        0 == self.len
    }

    /// How many rails its region is registered on.
    pub(crate) fn rails(&self) -> usize {
        self.regions.len()
    }

    /// The bytes `offset..offset + len` of this segment, through rail `rail`'s registration.
    pub(crate) fn on_rail(
        &self,
        rail: usize,
        offset: usize,
        len: usize,
    ) -> Result<Segment<'region>, DmaError> {
        let region = self
            .regions
            .get(rail)
            .ok_or_else(|| DmaError::InvalidArgument(format!("the region has no rail {rail}")))?;
        let start = self.offset.checked_add(offset).ok_or_else(|| {
            DmaError::InvalidArgument(format!("offset {offset} overflows the segment"))
        })?;
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(DmaError::InvalidArgument(format!(
                "{len} bytes at {offset} do not fit a {}-byte segment",
                self.len
            )));
        }
        region.segment(start, len)
    }
}

/// What a peer needs to reach a [`RailRegion`] through any of its rails: address, key and length
/// per rail. Advertised with [`to_bytes`](Self::to_bytes), read back with
/// [`from_bytes`](Self::from_bytes).
///
/// ```
/// use dma_libfabric::{DmaError, RailRemoteRegion, RemoteRegion};
///
/// let region = RemoteRegion { address: 0x1000, key: 7, len: 64 };
/// let remote = RailRemoteRegion::new(vec![region, RemoteRegion { key: 8, ..region }])?;
/// let bytes = remote.to_bytes();
/// assert_eq!(remote, RailRemoteRegion::from_bytes(&bytes)?);
/// assert!(RailRemoteRegion::from_bytes(&bytes[..bytes.len() - 1]).is_err());
/// # Ok::<(), DmaError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RailRemoteRegion {
    regions: Vec<RemoteRegion>,
}

impl RailRemoteRegion {
    /// The length of the count that leads [`to_bytes`](Self::to_bytes).
    const COUNT_LEN: usize = 4;

    /// A region reached through `regions`, the peer's rail 0 first.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for no regions, more than [`MAX_RAILS`](super::MAX_RAILS),
    /// or regions of different lengths (one buffer has one length).
    pub fn new(regions: Vec<RemoteRegion>) -> Result<Self, DmaError> {
        if regions.is_empty() || regions.len() > MAX_RAILS {
            return Err(DmaError::InvalidArgument(format!(
                "a remote region is reached through 1 to {MAX_RAILS} rails, not {}",
                regions.len()
            )));
        }
        if regions.iter().any(|region| region.len != regions[0].len) {
            return Err(DmaError::InvalidArgument(
                "a remote region's rails give different lengths".into(),
            ));
        }
        Ok(Self { regions })
    }

    /// How many rails it is reached through.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// Always `false`.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The region's length in bytes.
    pub fn region_len(&self) -> u64 {
        self.regions.first().map_or(0, |region| region.len)
    }

    /// The region as the peer's rail `rail` reaches it.
    ///
    /// # Panics
    /// If `rail >= len()`, as slice indexing does.
    pub fn rail(&self, rail: usize) -> RemoteRegion {
        self.regions[rail]
    }

    /// `len` bytes at `offset`, on every rail.
    ///
    /// # Errors
    /// As [`RemoteRegion::slice`].
    pub fn slice(&self, offset: u64, len: u64) -> Result<Self, DmaError> {
        Ok(Self {
            regions: self
                .regions
                .iter()
                .map(|region| region.slice(offset, len))
                .collect::<Result<_, _>>()?,
        })
    }

    /// The little-endian layout: a `u32` count of rails, then each rail's
    /// [`RemoteRegion::to_bytes`].
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes =
            Vec::with_capacity(Self::COUNT_LEN + self.regions.len() * RemoteRegion::ENCODED_LEN);
        bytes.extend_from_slice(&(self.regions.len() as u32).to_le_bytes());
        for region in &self.regions {
            bytes.extend_from_slice(&region.to_bytes());
        }
        bytes
    }

    /// Parse [`to_bytes`](Self::to_bytes)'s layout.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for a length other than the count says, a count of 0 or
    /// above [`MAX_RAILS`](super::MAX_RAILS), a rail [`RemoteRegion::from_bytes`] refuses, or
    /// rails of different lengths.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DmaError> {
        let count = bytes
            .get(..Self::COUNT_LEN)
            .and_then(|count| <[u8; 4]>::try_from(count).ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| {
                DmaError::InvalidArgument(format!(
                    "a rail remote region is at least {} bytes, not {}",
                    Self::COUNT_LEN,
                    bytes.len()
                ))
            })? as usize;
        if 0 == count || count > MAX_RAILS {
            return Err(DmaError::InvalidArgument(format!(
                "a rail remote region names 1 to {MAX_RAILS} rails, not {count}"
            )));
        }
        let expected = Self::COUNT_LEN + count * RemoteRegion::ENCODED_LEN;
        if bytes.len() != expected {
            return Err(DmaError::InvalidArgument(format!(
                "a rail remote region of {count} rails is {expected} bytes, not {}",
                bytes.len()
            )));
        }
        let regions = bytes[Self::COUNT_LEN..]
            .chunks_exact(RemoteRegion::ENCODED_LEN)
            .map(RemoteRegion::from_bytes)
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(regions)
    }
}
