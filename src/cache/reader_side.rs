//! A cache's reader side: what every reader of it needs, whatever the backend ([`ReaderSide`]),
//! and how a reader's miss reaches the writer: checked first (a bad address is an error before
//! any request is queued), then queued in the writer's bounded inbox, one request a miss or one
//! a chunk of [`BATCH`] misses. A call that would wait for the writer is refused on the writer's
//! own thread, where it would wait for ever.

use std::time::Duration;

#[cfg(doc)] // for the docs' links
use super::Peer;
use super::epoch::Epochs;
use super::inbox::Inbox;
use super::reply;
use super::stored::StoredAddress;
use super::writer::{BATCH, Reply, Request, SharedState, on_writer_of};
use crate::address::AddressFormat;
use crate::error::DmaError;
use crate::sync::{Arc, mpsc};
use dma_libfabric_sys::fi_addr_t;

/// What a reader needs, whatever the backend.
pub(super) struct ReaderSide {
    /// Unique among the caches of this process, so a [`Peer`] can be checked against the cache
    /// (and so the endpoint) it came from.
    pub(super) id: u64,
    pub(super) shared: Arc<SharedState>,
    pub(super) epochs: Epochs,
    /// The writer's inbox: bounded, so a flood of queued misses waits instead of growing memory.
    pub(super) requests: Inbox,
    pub(super) format: AddressFormat,
    pub(super) address_len: usize,
    /// The identity's length for every address of `address_len` bytes; `None` if the format
    /// refuses that length (then every resolve is an `InvalidAddress`).
    pub(super) identity_len: Option<usize>,
    /// The same for every sealed address (`address_len` bytes and a seal).
    pub(super) sealed_identity_len: Option<usize>,
    /// The longest any call waits (see `blocking`).
    pub(super) patience: Duration,
}

/// The error for `call`, which may wait for a parked incarnation, made by a thread that holds a
/// pin of the cache, which that incarnation would wait for: `instead` says what to use.
pub(super) fn pinned_here(call: &str, instead: &str) -> DmaError {
    DmaError::InvalidArgument(format!(
        "{call} called by a thread that holds a Pinned of this cache, which a parked incarnation \
         would wait for: use {instead}"
    ))
}

/// The error for a call that would wait for the writer, made on the writer's own thread.
pub(super) fn on_writer_thread(call: &str) -> DmaError {
    DmaError::InvalidArgument(format!(
        "{call} was called by the thread that holds the address cache's writer role (the writer \
         thread, or a caller serving its miss: from a tracing subscriber or an AvBackend?), where \
         waiting for the writer would wait for ever"
    ))
}

impl ReaderSide {
    /// Send the writer a miss, waiting for room in its inbox.
    pub(super) fn ask(&self, client: u64, address: &[u8], reply: Reply) -> Result<(), DmaError> {
        let address = self.stored(address)?;
        if on_writer_of(self.id) {
            return Err(on_writer_thread("a resolve or lease that missed"));
        }
        self.requests
            .send_and_serve(Request::Resolve {
                client,
                address,
                reply,
            })
            .map_err(|_| DmaError::Closed)
    }

    /// Send the writer `misses` in chunks of at most [`BATCH`], all before waiting (so the writer
    /// goes from one chunk to the next without a hand-off), then take its one answer a chunk:
    /// each entry's result, in the order of `misses`. The writer applies requests in order, and
    /// one channel carries every chunk's answer, so they arrive in order.
    pub(super) fn ask_chunks(
        &self,
        misses: &[(u64, StoredAddress)],
    ) -> Vec<Result<fi_addr_t, DmaError>> {
        let refused = |error: DmaError| misses.iter().map(|_| Err(error.clone())).collect();
        if on_writer_of(self.id) {
            return refused(on_writer_thread("resolve_all or lease_all"));
        }
        let (reply, answers) = mpsc::channel();
        let mut sent = 0;
        for chunk in misses.chunks(BATCH) {
            // The chunk's misses count against the inbox's bound (see `budget`).
            self.shared.chunk_misses.take(chunk.len());
            let request = Request::ResolveChunk {
                requests: chunk.to_vec(),
                reply: reply.clone(),
            };
            // Served at once if the role is free, so a sender of more misses than the budget
            // holds never waits on its own queued chunks.
            if self.requests.send_and_serve(request).is_err() {
                self.shared.chunk_misses.give_back(chunk.len());
                break;
            }
            sent += chunk.len();
        }
        drop(reply);
        let mut results = Vec::with_capacity(misses.len());
        while results.len() < sent {
            // Polling, serving what is queued whenever the role is free, as a miss's waiter does:
            // a holder descheduled after its round does not keep these chunks waiting.
            // (Under loom, no caller serves: a plain wait, as the models expect.)
            let waiting = self.requests.waiting();
            let answer = match waiting.writer {
                Some(_) => reply::recv_adaptive(&answers, waiting),
                None => answers.recv(),
            };
            match answer {
                Ok(chunk) => results.extend(chunk),
                Err(_) => break,
            }
        }
        // Whatever was not sent or not answered: the writer has stopped.
        results.resize_with(misses.len(), || Err(DmaError::Closed));
        results
    }

    /// `address`, checked, as a request carries it: inline, so a miss allocates no key. Only a
    /// miss gets here, so this is where an all-zero address is refused (a hit never finds one:
    /// the writer's own check keeps it out of the index).
    pub(super) fn stored(&self, address: &[u8]) -> Result<StoredAddress, DmaError> {
        let identity_len = self.identity_len(address)?;
        crate::address::refuse_unset(&address[..self.address_len.min(address.len())])?;
        crate::address::secret_of(address, self.address_len)?;
        Ok(StoredAddress::new(address, identity_len))
    }

    /// How many leading bytes of `address` are its identity, once it is checked: the length the
    /// format gives for every address of the right length, worked out once per cache, so a hit
    /// costs one length comparison. A wrong length (or a layout the format refuses) takes the
    /// format's own check, for its error.
    #[inline]
    pub(super) fn identity_len(&self, address: &[u8]) -> Result<usize, DmaError> {
        match (self.identity_len, self.sealed_identity_len) {
            (Some(identity_len), _) if address.len() == self.address_len => Ok(identity_len),
            (_, Some(identity_len))
                if address.len() == self.address_len + crate::address::SEAL_LEN =>
            {
                Ok(identity_len)
            }
            _ => self.format.identity_len(address, self.address_len),
        }
    }
}
