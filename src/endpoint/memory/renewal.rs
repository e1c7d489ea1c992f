//! What [`LibfabricEndpoint::rekey`] does to a region (`MemoryRegion::renew`; the method itself is
//! `face`'s): a `Remote` region's memory registered again under a fresh key, the old key
//! revoked, the buffer kept: the bounded way to give a region to peers round after
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
#[cfg(doc)] // for the docs' links
use crate::endpoint::LibfabricEndpoint;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

impl<B> MemoryRegion<'_, B> {
    /// Revoke this region's key and register its memory again in `domain` through `ep`, under
    /// `mr_mode` and a fresh key from `keys`, keeping the buffer: the new [`RemoteRegion`]. What
    /// [`LibfabricEndpoint::rekey`] promises is on it; this is its work once the endpoint has
    /// checked that it does RMA. On an error the region is unchanged, under its old key.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for a region registered in another domain, or an
    /// [`Exposure::Local`] one (it has no key); [`DmaError::Busy`] while anything else holds the
    /// registration (an operation in flight, a rail's registration of the same memory);
    /// [`DmaError::Fabric`] when the new registration fails.
    ///
    /// # Safety
    /// `domain` and `ep` are one endpoint's, open and belonging together, and stay open for as
    /// long as any region registered in `domain` lives (the endpoint's own handles: a region
    /// borrows or holds its endpoint).
    pub(super) unsafe fn renew(
        &mut self,
        domain: *mut sys::fid_domain,
        ep: *mut sys::fid_ep,
        mr_mode: i32,
        keys: &mut dyn FnMut() -> u64,
    ) -> Result<RemoteRegion, DmaError> {
        if self.inner.domain() != domain {
            return Err(DmaError::InvalidArgument(
                "rekey was asked of a region registered by another endpoint: call it on the \
                 endpoint that registered the region"
                    .into(),
            ));
        }
        if Exposure::Remote != self.exposure() {
            return Err(DmaError::InvalidArgument(
                "rekey was asked of a Local region, which has no key (no peer can reach it): \
                 only a Remote region's key can be revoked and renewed"
                    .into(),
            ));
        }
        let Some(registration) = Arc::get_mut(&mut self.inner) else {
            return Err(DmaError::Busy);
        };
        // SAFETY: the region's domain is `domain` (compared above), whose endpoint `ep` is open and
        // stays open while the region lives (the caller's promise); the registration is held by
        // this `&mut` alone (`get_mut`), so no operation passes its descriptor while it closes.
        unsafe { registration.rekey(ep, mr_mode, keys) }?;
        Ok(self.remote())
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
