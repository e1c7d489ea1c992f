//! [`LibfabricEndpoint::rekey`]: a `Remote` region's memory registered again under a fresh key,
//! the old key revoked, the buffer kept: the bounded way to give a region to peers round after
//! round, where dropping and registering a new buffer parks each old one until the endpoint
//! closes (the bound, and why it cannot be lower, on [`MemoryRegion`], "Parking").
//!
//! The new registration is opened before the old one is closed, so an error leaves the region
//! as it was (old key still valid). `&mut` on the region, and the registration held alone (no
//! operation in flight, no rail's registration sharing it), mean nothing of this endpoint is
//! using the old descriptor while it closes; a [`RegionView`](super::RegionView) borrows the
//! region, so no rekey happens while one lives.

use std::sync::Arc;

use super::registration::Exposure;
use super::{MemoryRegion, RemoteRegion};
use crate::endpoint::LibfabricEndpoint;
use crate::error::DmaError;

impl LibfabricEndpoint {
    /// Revoke `region`'s key and register its memory again under a fresh one, keeping the
    /// buffer: the new [`RemoteRegion`] to advertise. For an [`Exposure::Remote`] region of this
    /// endpoint that no operation holds.
    ///
    /// # What it promises
    ///
    /// - **Nothing is parked, nothing is allocated**: the buffer stays the region's. A server
    ///   that hands a region to a peer per round and rekeys it between rounds stays flat
    ///   (10,000 rounds of a 4 KiB buffer: `parked_memory` 0, the heap +0 B,
    ///   `tests/parking_bounded.rs`), where dropping each region and registering a new buffer
    ///   parks every old one until the endpoint closes (4 KiB a round; see [`MemoryRegion`],
    ///   "Parking", for why that cannot be freed sooner).
    /// - **The old key admits no new transfer**: once `rekey` returns, a peer's write or read
    ///   under it is refused by the provider (on tcp the target also drops that connection, so
    ///   the peer's write completes with an error, and its later posts may find it gone). A
    ///   transfer the provider admitted *before* (its header arrived under the old key) may
    ///   still move bytes into or out of the buffer: the region gives safe code only atomic accesses ([`read_bytes`](
    ///   MemoryRegion::read_bytes), [`view`](MemoryRegion::view)), so that is a torn record, never
    ///   undefined behaviour. A peer whose write's notification (or whose own "done" message) has
    ///   been read has no such transfer.
    /// - **The new key is fresh** (random, as [`register`](Self::register)'s), so a peer that
    ///   kept the old descriptor cannot reach the region under the new one.
    ///
    /// # Errors
    /// [`DmaError::Busy`] while an operation of this endpoint holds the region (try again once
    /// its completion has been read) or a rail set's registration shares it;
    /// [`DmaError::InvalidArgument`] for an [`Exposure::Local`] region (it has no key) or a region
    /// of another endpoint; [`DmaError::Fabric`] when `fi_mr_reg` (or `fi_mr_bind`,
    /// `fi_mr_enable`) fails: the region is then unchanged, under its old key.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let mut region = endpoint.register_buffer(vec![0_u8; 4096], Exposure::Remote)?;
    /// let first = region.remote(); // advertised to a peer for one round
    /// let second = endpoint.rekey(&mut region)?; // the round is over: `first` is revoked
    /// assert_ne!(first.key, second.key);
    /// assert_eq!(second, region.remote());
    /// assert_eq!(0, endpoint.parked_memory(), "the buffer stayed the region's");
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn rekey<B>(&self, region: &mut MemoryRegion<'_, B>) -> Result<RemoteRegion, DmaError> {
        self.check_rma()?;
        if region.inner.domain() != self.handles.domain {
            return Err(DmaError::InvalidArgument(
                "rekey was asked of a region registered by another endpoint: call it on the \
                 endpoint that registered the region"
                    .into(),
            ));
        }
        if Exposure::Remote != region.exposure() {
            return Err(DmaError::InvalidArgument(
                "rekey was asked of a Local region, which has no key (no peer can reach it): \
                 only a Remote region's key can be revoked and renewed"
                    .into(),
            ));
        }
        let Some(registration) = Arc::get_mut(&mut region.inner) else {
            return Err(DmaError::Busy);
        };
        // SAFETY: the region's domain is this endpoint's (compared above, both alive: the region
        // borrows or holds its endpoint, and `self` is borrowed), so it and `self.handles.ep` are
        // open and belong together, and stay open while the region lives (`register`'s
        // argument); the registration is held by this `&mut` alone (`get_mut`), so no operation
        // passes its descriptor while it closes.
        unsafe {
            registration.rekey(self.handles.ep, self.mr_mode(), &mut || {
                self.operations.keys.draw()
            })
        }?;
        Ok(region.remote())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking

    use super::*;
    use crate::endpoint::memory::tests::endpoint;

    /// `Busy` while an operation holds the region, `InvalidArgument` for a `Local` region and
    /// for another endpoint's; the region keeps its key on each.
    #[test]
    fn rekey_refuses_a_held_local_or_foreign_region() {
        let endpoint = endpoint();
        let other = super::super::tests::endpoint();
        let mut region = endpoint.register(64).expect("registered");
        let key = region.remote().key;
        let hold = region
            .inner
            .hold(crate::endpoint::deadline::Deadline::after(
                std::time::Duration::ZERO,
            ))
            .expect("held");
        assert!(matches!(endpoint.rekey(&mut region), Err(DmaError::Busy)));
        drop(hold);
        assert!(matches!(
            other.rekey(&mut region),
            Err(DmaError::InvalidArgument(_))
        ));
        assert_eq!(key, region.remote().key, "unchanged");
        assert_ne!(key, endpoint.rekey(&mut region).expect("idle").key);

        let mut local = endpoint
            .register_buffer(vec![0_u8; 64], Exposure::Local)
            .expect("registered");
        assert!(matches!(
            endpoint.rekey(&mut local),
            Err(DmaError::InvalidArgument(_))
        ));
    }
}
