//! The operation engine: one owner of the operations in flight, under every face (the endpoint's
//! calls, a rail set's stripes, the async face's futures).
//!
//! - `slab`: one slot per operation in flight, its lifecycle a [`Stage`](slab::Stage), bounded
//!   by the transmit and completion queues ([`MAX_OPERATIONS`]).
//! - `submit`: the one submit path: the target checked once, one backpressure and patience
//!   policy (the peer's budget, a slot, `-FI_EAGAIN`, each waited for asleep until one
//!   deadline), nothing held after a failure.
//! - `reap`: the one reaper, for the transmit queue and the receive queue's `receive_into`s: each
//!   completion to its own operation, found by its context, once.
//! - `sink`: the one way a completion is delivered: the application's ready queue, a future's
//!   waker, or a party above the endpoint.
//! - `join`: the one join: a transfer in parts (a split gather, a rail set's stripes) completes
//!   once, with its first error.
//! - `completion`: what an operation is and what its completion says.
//!
//! Sends of copied messages keep their own slab (`sends`): they hold bytes, not memory of the
//! application's, and complete into the same transmit queue, which the reaper tells apart by
//! context.

mod completion;
mod join;
mod reap;
mod sink;
mod slab;
mod submit;

pub use self::completion::{Completion, Operation};
pub(crate) use self::join::{Join, JoinPart};
#[cfg(feature = "tokio")]
pub(crate) use self::sink::WakerSink;
pub(crate) use self::sink::{CompletionOwner, Owner, Sink};
pub use self::slab::MAX_OPERATIONS;
pub(in crate::endpoint) use self::slab::Operations;
pub(crate) use self::submit::Posted;
pub(in crate::endpoint) use self::submit::{Submission, Target};
