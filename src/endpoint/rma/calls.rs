//! The four RMA calls, written once: `rma_calls!` gives a type that moves memory to and from a
//! peer its `write`, `write_within`, `read` and `read_within`, every one a call of the type's own
//! `transfer` with one [`RmaCall`], generic over where the segment goes.
//! [`LibfabricEndpoint`](crate::endpoint::LibfabricEndpoint) posts the call as one operation, and
//! [`RailSet`](crate::rails::RailSet) stripes it across its rails, each stripe posted by the
//! endpoint's same path. What differs between them (the lease, the local memory, the remote region,
//! and the docs) is what each passes in; what the calls do with it (which operation, which timeout)
//! is here alone.
//!
//! Macros, not a trait with default methods: the calls stay inherent methods, which callers use
//! with no trait in scope, and rustdoc shows them on each type as before.

use std::time::Duration;

use crate::endpoint::engine::Operation;

/// One RMA call, as `rma_calls!` hands it to a type's `transfer`: generic over the lease (`L`),
/// the local memory (`S`) and the remote region (`R`) of the layer it is made on.
pub(crate) struct RmaCall<L, S, R> {
    /// [`Operation::Write`] or [`Operation::Read`].
    pub(crate) operation: Operation,
    /// What holds the peer's address-vector entries until the completion has been read.
    pub(crate) lease: L,
    /// The local memory: the source of a write, the destination of a read.
    pub(crate) local: S,
    /// The peer's memory: the target of a write, the source of a read.
    pub(crate) remote: R,
    /// The id the completion carries.
    pub(crate) id: u64,
    /// How long a post retries backpressure.
    pub(crate) timeout: Duration,
}

impl<L, S, R> RmaCall<L, S, R> {
    /// The same call, its lease turned into what the next layer down takes.
    pub(crate) fn map_lease<M>(self, map: impl FnOnce(L) -> M) -> RmaCall<M, S, R> {
        RmaCall {
            operation: self.operation,
            lease: map(self.lease),
            local: self.local,
            remote: self.remote,
            id: self.id,
            timeout: self.timeout,
        }
    }
}

/// The four RMA calls of a type with a method
/// `fn transfer(&self, call: RmaCall<$lease, $local, $remote>) -> Result<(), DmaError>`:
///
/// - `write(lease, source, target, id)` and `read(lease, destination, source, id)`, which retry
///   backpressure for `$patience`;
/// - `write_within` and `read_within`, the same with the caller's `timeout`.
///
/// Each takes the docs written above its name in the invocation.
macro_rules! rma_calls {
    (
        lease: $lease:ty, local: $local:ty, remote: $remote:ty, patience: $patience:expr;
        $(#[$write:meta])* fn write;
        $(#[$write_within:meta])* fn write_within;
        $(#[$read:meta])* fn read;
        $(#[$read_within:meta])* fn read_within;
    ) => {
        rma_calls!(@pair $lease, $local, $remote, $patience; Write,
            [$(#[$write])*] write(source, target), [$(#[$write_within])*] write_within);
        rma_calls!(@pair $lease, $local, $remote, $patience; Read,
            [$(#[$read])*] read(destination, source), [$(#[$read_within])*] read_within);
    };
    // One operation's pair: `$name` with the patience, `$within` with the caller's timeout.
    (
        @pair $lease:ty, $local:ty, $remote:ty, $patience:expr; $operation:ident,
        [$(#[$doc:meta])*] $name:ident($local_name:ident, $remote_name:ident),
        [$(#[$within_doc:meta])*] $within:ident
    ) => {
        $(#[$doc])*
        pub fn $name(
            &self,
            lease: $lease,
            $local_name: $local,
            $remote_name: $remote,
            id: u64,
        ) -> Result<(), $crate::error::DmaError> {
            self.$within(lease, $local_name, $remote_name, id, $patience)
        }

        $(#[$within_doc])*
        pub fn $within(
            &self,
            lease: $lease,
            $local_name: $local,
            $remote_name: $remote,
            id: u64,
            timeout: ::std::time::Duration,
        ) -> Result<(), $crate::error::DmaError> {
            self.transfer($crate::endpoint::RmaCall {
                operation: $crate::endpoint::Operation::$operation,
                lease,
                local: $local_name,
                remote: $remote_name,
                id,
                timeout,
            })
        }
    };
}
pub(crate) use rma_calls;
