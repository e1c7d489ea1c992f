//! One client on every rail: [`RailPinned`] (a pin of every rail's cache), [`RailPeers`] (a
//! [`Peer`] per rail, all from one address set) and [`RailLease`] (a [`Lease`] per rail).

use super::MAX_RAILS;
use super::shape::{Rails, address_for, check_addresses};
use crate::cache::{Lease, Peer, Pinned};
use crate::error::DmaError;

/// A pin of every rail's cache, taken together: every [`RailPeers`] resolved through it stays
/// valid, on every rail, until it is dropped. Made by [`RailSet::pin`](super::RailSet::pin).
///
/// Not `Send`: a pin belongs to the thread that took it.
pub struct RailPinned<'rails> {
    /// Rail `i`'s pin in slot `i`, for `i < count`.
    pins: [Option<Pinned<'rails>>; MAX_RAILS],
    rails: &'rails dyn Rails,
}

/// [`RailPinned`] under its old name, kept one release: every other rail type is `Rail` and the
/// one-rail type it bundles ([`RailLease`] of [`Lease`]s), so a pin of every rail is `RailPinned`.
#[deprecated(since = "0.2.0", note = "renamed to `RailPinned`")]
pub type RailsPinned<'rails> = RailPinned<'rails>;

impl std::fmt::Debug for RailPinned<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RailPinned")
            .field("rails", &self.rails.count())
            .finish_non_exhaustive()
    }
}

impl<'rails> RailPinned<'rails> {
    /// Pin every rail of `rails`, rail 0 first.
    pub(crate) fn new(rails: &'rails dyn Rails) -> Self {
        Self {
            pins: std::array::from_fn(|rail| {
                if rail < rails.shape().count {
                    rails.pin_rail(rail)
                } else {
                    None
                }
            }),
            rails,
        }
    }

    /// How many rails are pinned.
    pub fn len(&self) -> usize {
        self.rails.count()
    }

    /// Always `false`: a rail set has at least one rail.
    pub fn is_empty(&self) -> bool {
        0 == self.rails.count()
    }

    /// `client`'s peer on every rail, from `addresses`, the peer's rail addresses (what its
    /// [`RailSet::local_addresses`](super::RailSet::local_addresses) gave): local rail `i` uses
    /// `addresses[i % addresses.len()]` (see [`RailSet`](super::RailSet)). A miss on a
    /// rail is inserted through that rail's writer, as [`Pinned::resolve`] does.
    ///
    /// All or nothing: either every rail resolved `client` and the peers are returned, or none is
    /// returned.
    ///
    /// # Errors
    /// - [`DmaError::InvalidArgument`] for no addresses or more than
    ///   [`MAX_RAILS`](super::MAX_RAILS), and [`DmaError::InvalidAddress`] for an address of the
    ///   wrong length for the rail that uses it, or all zero bytes: found before any rail is asked
    ///   anything, and nothing changes.
    /// - [`DmaError::WouldBlock`] when a rail's address is a new incarnation of a slot whose old
    ///   one must leave that rail's AV first (as `Pinned::resolve`): every rail's registration is
    ///   queued, and a resolve under a later pin finds them.
    /// - Any other error of a rail ([`DmaError::Capacity`], a failed `fi_av_insert`,
    ///   [`DmaError::Closed`]): `client` is then released on every rail, so it is registered on
    ///   none (peers and leases already handed out stay valid, as a release leaves them).
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv, RailCaches};
    ///
    /// let caches = (0..2).map(|_| AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque)));
    /// let rails = RailCaches::new(caches.collect())?;
    /// let pinned = rails.pin();
    /// let one: [&[u8]; 1] = [&[1; 16]]; // a peer with one rail: both local rails use it
    /// let peers = pinned.resolve(1, &one)?;
    /// assert_eq!((2, 1), (peers.len(), peers.remote_rails()));
    /// let three: [&[u8]; 3] = [&[1; 16], &[2; 16], &[3; 16]];
    /// assert!(pinned.resolve(2, &three).is_ok(), "a peer's extra rail is unused");
    /// let wrong: [&[u8]; 2] = [&[1; 16], &[2; 3]];
    /// assert!(matches!(pinned.resolve(3, &wrong), Err(DmaError::InvalidAddress(_))));
    /// assert!(matches!(pinned.resolve(3, &[]), Err(DmaError::InvalidArgument(_))));
    /// # Ok::<(), DmaError>(())
    /// ```
    pub fn resolve(&self, client: u64, addresses: &[&[u8]]) -> Result<RailPeers<'_>, DmaError> {
        check_addresses(self.rails.shape(), addresses)?;
        let mut peers = RailPeers {
            peers: [Peer::new(0, 0, client); MAX_RAILS],
            len: 0,
            remote: addresses.len(),
        };
        let mut parked = false;
        for (rail, pinned) in self.pins.iter().take(self.rails.count()).enumerate() {
            let answer = match pinned {
                Some(pinned) => pinned.resolve(client, address_for(addresses, rail)),
                None => Err(DmaError::Closed),
            };
            match answer {
                Ok(peer) => {
                    peers.peers[rail] = peer;
                    peers.len += 1;
                }
                // Keep asking the other rails, so every rail's registration is queued.
                Err(DmaError::WouldBlock) => parked = true,
                Err(error) => {
                    self.rails.release_everywhere(client);
                    return Err(error);
                }
            }
        }
        if parked {
            return Err(DmaError::WouldBlock);
        }
        Ok(peers)
    }

    /// A [`Lease`] on every rail's entry of `peers`: a [`RailLease`], which keeps every rail's
    /// entry in its AV after this pin is dropped, until its leases are dropped (a striped
    /// transfer hands each stripe its rail's lease, dropped when that stripe's completion is
    /// read).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for peers of another rail set; nothing is leased.
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv, RailCaches};
    ///
    /// let caches = (0..2).map(|_| AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque)));
    /// let rails = RailCaches::new(caches.collect())?;
    /// let addresses: [&[u8]; 2] = [&[1; 16], &[2; 16]];
    /// let lease = {
    ///     let pinned = rails.pin();
    ///     let peers = pinned.resolve(1, &addresses)?;
    ///     pinned.lease(&peers)? // outlives the pin
    /// };
    /// assert_eq!(1, rails.rail(1).stats().leases);
    /// drop(lease);
    /// assert_eq!(0, rails.rail(1).stats().leases);
    /// # Ok::<(), DmaError>(())
    /// ```
    pub fn lease(&self, peers: &RailPeers<'_>) -> Result<RailLease<'rails>, DmaError> {
        if peers.len != self.rails.count() {
            return Err(DmaError::InvalidArgument(format!(
                "peers of {} rails, for a rail set of {}",
                peers.len,
                self.rails.count()
            )));
        }
        let mut leases = Vec::with_capacity(peers.len);
        for (pinned, peer) in self.pins.iter().zip(&peers.peers[..peers.len]) {
            match pinned {
                Some(pinned) => leases.push(pinned.lease(*peer)?),
                None => return Err(DmaError::Closed),
            }
        }
        Ok(RailLease {
            leases,
            remote: peers.remote,
        })
    }
}

/// A client's peer on every rail, resolved together from one address set, valid while the
/// [`RailPinned`] it came from lives.
///
/// ```compile_fail
/// use dma_libfabric::{AddressCache, AddressFormat, ModelAv, RailCaches};
///
/// let rails = RailCaches::new(vec![AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque))]).unwrap();
/// let addresses: [&[u8]; 1] = [&[1; 16]];
/// let pinned = rails.pin();
/// let peers = pinned.resolve(1, &addresses).unwrap();
/// drop(pinned);
/// let _ = peers.rail(0); // peers cannot outlive their pin
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RailPeers<'pin> {
    peers: [Peer<'pin>; MAX_RAILS],
    len: usize,
    /// How many rails the peer advertised.
    remote: usize,
}

impl<'pin> RailPeers<'pin> {
    /// The peer on local rail `rail`.
    ///
    /// # Panics
    /// If `rail >= len()`, as slice indexing does.
    pub fn rail(&self, rail: usize) -> Peer<'pin> {
        self.peers[..self.len][rail]
    }

    /// How many local rails: one peer each.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`.
    pub fn is_empty(&self) -> bool {
        0 == self.len
    }

    /// How many rails the peer advertised (local rail `i` uses the peer's rail
    /// `i % remote_rails()`).
    pub fn remote_rails(&self) -> usize {
        self.remote
    }
}

/// A [`Lease`] on a client's entry on every rail: while it lives (or, once handed to
/// [`RailSet::write`](super::RailSet::write) or [`read`](super::RailSet::read), while each
/// stripe's completion is unread), every rail's entry stays in its AV, mapping to the address it
/// was resolved for.
///
/// `Send`: a completion thread may drop it.
#[derive(Debug)]
pub struct RailLease<'rails> {
    pub(crate) leases: Vec<Lease<'rails>>,
    pub(crate) remote: usize,
}

impl<'rails> RailLease<'rails> {
    /// The lease on local rail `rail`.
    ///
    /// # Panics
    /// If `rail >= len()`, as slice indexing does.
    pub fn rail(&self, rail: usize) -> &Lease<'rails> {
        &self.leases[rail]
    }

    /// How many local rails: one lease each.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Always `false`.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// How many rails the peer advertised.
    pub fn remote_rails(&self) -> usize {
        self.remote
    }
}
