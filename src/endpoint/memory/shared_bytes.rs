//! Copies in and out of memory that something outside this process's Rust code may write at the
//! same moment: a peer's transfer landing in an `Exposure::Remote` region (through the kernel's
//! `recv` into the provider's pointer, libfabric's C `memcpy`, or a NIC's DMA), or a stale
//! transfer still moving bytes through a parked buffer.
//!
//! Such a race must not be a data race in Rust's memory model, which a plain `memcpy` through
//! `&[u8]` (or `ptr::copy_nonoverlapping`) would be: both are non-atomic accesses, and a
//! non-atomic access racing a write is undefined behaviour, not only a stale value. So every
//! access here is a relaxed `AtomicU8` load or store of one byte, formed from a raw pointer
//! (`AtomicU8::from_ptr`), and no `&[u8]` or `&mut [u8]` to the shared bytes is ever formed.
//!
//! - Atomic accesses never make a data race with each other, so two of this crate's copies
//!   racing (a `read_bytes` and a `write_bytes` of the same bytes, on two threads) are defined.
//!   Rust also forbids racing atomic accesses of different sizes that partially overlap (unless
//!   both are reads), so every location is always accessed at one size, fixed by the *region*,
//!   never by the copy: the region's aligned machine words (`usize`) are loaded and stored whole
//!   (a copy that covers part of a word loads it whole, or replaces its bytes with a
//!   compare-exchange of the whole word), and only the bytes before its first aligned word and
//!   after its last are accessed one byte at a time. Every caller passes the whole region's start
//!   and length ([`Span`]).
//! - The other writers are not Rust code: the kernel, libfabric's C code and a device are outside
//!   the abstract machine, as a device writing memory-mapped I/O is, and an atomic access is
//!   the most Rust can say about memory that changes underneath it (the same reasoning as the
//!   `atomic_memcpy` RFC, rust-lang/rfcs#3301, for seqlocks). On x86-64 and aarch64 a relaxed
//!   load or store is a plain `mov`/`ldr`/`str`, so the hardware sees an ordinary copy.
//!
//! What a copy sees: each word (or edge byte) is some value it held during the copy; the words
//! are not read all at once, so a copy that races a landing transfer may mix old and new bytes (a
//! torn record). The pattern that never tears is on
//! [`MemoryRegion::read_bytes`](super::MemoryRegion::read_bytes).
//!
//! Cost: the compiler does not merge or vectorise atomic accesses, so these copies move a word at
//! a time, against a vector register for `memcpy`. Regions that this process alone writes
//! (`Exposure::Local`) are copied with `memcpy` under the region's exclusion instead.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// The width of the whole words.
const WORD: usize = std::mem::size_of::<usize>();

/// A whole region: where its bytes start, and how many. Which of its bytes are accessed as
/// words, and which one at a time, depends on these alone.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    /// The first byte.
    pub(super) start: *mut u8,
    /// How many bytes.
    pub(super) len: usize,
}

impl Span {
    /// The offsets of the first aligned word and of the end of the last: bytes in `lo..hi` are
    /// accessed as whole words, the others one at a time.
    fn words(self) -> (usize, usize) {
        let lo = self.start.align_offset(WORD).min(self.len);
        (lo, lo + (self.len - lo) / WORD * WORD)
    }

    /// The byte at `at`.
    ///
    /// # Safety
    /// `at < len`; the span is allocated, valid memory for the call, only ever accessed
    /// atomically from Rust through this module (the module's contract).
    unsafe fn byte<'span>(self, at: usize) -> &'span AtomicU8 {
        // SAFETY: inside the span (the caller's promise); `u8` needs no alignment; every Rust
        // access to it is atomic and one byte wide (edge bytes only, `words`).
        unsafe { AtomicU8::from_ptr(self.start.add(at)) }
    }

    /// The word at `at`, which `words` aligned.
    ///
    /// # Safety
    /// As [`byte`](Self::byte), for `at..at + WORD` inside `lo..hi`.
    unsafe fn word<'span>(self, at: usize) -> &'span AtomicUsize {
        // SAFETY: inside the span and aligned (`words`, and the caller's promise); every Rust
        // access to these bytes is this word's, whole.
        unsafe { AtomicUsize::from_ptr(self.start.add(at).cast()) }
    }
}

/// Copy `out.len()` bytes at `offset` of `span` into `out`, with relaxed atomic loads.
///
/// # Safety
/// `offset + out.len() <= span.len`; the span is allocated, readable memory, valid for the whole
/// call, that `out` does not overlap; every access to it from Rust code that may race this call
/// is this module's, with the same span (the region's), while other writers are outside Rust
/// (the provider, the kernel, a device, another process).
pub(super) unsafe fn load(span: Span, offset: usize, out: &mut [u8]) {
    let (lo, hi) = span.words();
    let end = offset + out.len();
    let mut at = offset;
    while at < end {
        if at < lo || hi <= at {
            // SAFETY: `at < end <= len` (the caller's promise), an edge byte.
            out[at - offset] = unsafe { span.byte(at) }.load(Ordering::Relaxed);
            at += 1;
            continue;
        }
        let word_at = lo + (at - lo) / WORD * WORD;
        // SAFETY: `word_at` is an aligned word inside `lo..hi`.
        let word = unsafe { span.word(word_at) }
            .load(Ordering::Relaxed)
            .to_ne_bytes();
        let (from, to) = (at - word_at, WORD.min(end - word_at));
        out[at - offset..word_at + to - offset].copy_from_slice(&word[from..to]);
        at = word_at + to;
    }
}

/// Copy `data` to `offset` of `span`, with relaxed atomic stores (and, for a word `data` covers
/// only in part, a compare-exchange of the whole word that replaces just those bytes).
///
/// # Safety
/// As [`load`], for writable memory that `data` does not overlap.
pub(super) unsafe fn store(span: Span, offset: usize, data: &[u8]) {
    let (lo, hi) = span.words();
    let end = offset + data.len();
    let mut at = offset;
    while at < end {
        if at < lo || hi <= at {
            // SAFETY: `at < end <= len` (the caller's promise), an edge byte.
            unsafe { span.byte(at) }.store(data[at - offset], Ordering::Relaxed);
            at += 1;
            continue;
        }
        let word_at = lo + (at - lo) / WORD * WORD;
        let (from, to) = (at - word_at, WORD.min(end - word_at));
        let part = &data[at - offset..word_at + to - offset];
        // SAFETY: `word_at` is an aligned word inside `lo..hi`.
        let word = unsafe { span.word(word_at) };
        if WORD == part.len() {
            let mut whole = [0; WORD];
            whole.copy_from_slice(part);
            word.store(usize::from_ne_bytes(whole), Ordering::Relaxed);
        } else {
            // The other bytes of the word keep whatever they hold, even if a transfer writes
            // them meanwhile: the exchange retries until it replaced exactly the word it read.
            let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |current| {
                let mut bytes = current.to_ne_bytes();
                bytes[from..to].copy_from_slice(part);
                Some(usize::from_ne_bytes(bytes))
            });
        }
        at = word_at + to;
    }
}

/// Set `len` bytes at `offset` of `span` to 0, as [`store`] would.
///
/// # Safety
/// As [`store`], for `offset + len <= span.len`.
pub(super) unsafe fn zero(span: Span, offset: usize, len: usize) {
    const ZEROES: [u8; 4096] = [0; 4096];
    let mut done = 0;
    while done < len {
        let chunk = ZEROES.len().min(len - done);
        // SAFETY: inside the span (the caller's promise); `ZEROES` is a constant, not the span.
        unsafe { store(span, offset + done, &ZEROES[..chunk]) };
        done += chunk;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every offset and length inside a region that starts at every alignment: what is stored
    /// is what is loaded, and nothing outside the range changes.
    #[test]
    fn copies_round_trip_at_every_alignment_and_length() {
        let mut backing = vec![0xff_u8; 64];
        for shift in 0..WORD {
            let span = Span {
                // SAFETY: `shift < 8 < 64`.
                start: unsafe { backing.as_mut_ptr().add(shift) },
                len: 40,
            };
            for offset in 0..40 {
                for len in 0..=40 - offset {
                    let data: Vec<u8> = (0..len).map(|at| (at * 7 + offset) as u8 | 1).collect();
                    // SAFETY: the range is inside the span, inside the Vec; nothing races.
                    unsafe { zero(span, 0, 40) };
                    // SAFETY: as above.
                    unsafe { store(span, offset, &data) };
                    let mut whole = vec![0xee; 40];
                    // SAFETY: as above.
                    unsafe { load(span, 0, &mut whole) };
                    let mut expected = vec![0; 40];
                    expected[offset..offset + len].copy_from_slice(&data);
                    assert_eq!(expected, whole, "shift {shift}, offset {offset}, len {len}");
                    let mut part = vec![0xee; len];
                    // SAFETY: as above.
                    unsafe { load(span, offset, &mut part) };
                    assert_eq!(data, part);
                }
            }
        }
        assert_eq!(0xff, backing[63], "past every span: untouched");
    }

    /// A load racing stores (another thread's copies) sees each aligned word whole: every word
    /// of every copy is one of the two patterns, never a mix inside it. Fails if the words are
    /// split into smaller accesses.
    #[test]
    fn racing_copies_never_tear_a_word() {
        const WORDS: usize = 64;
        let mut backing = vec![0_usize; WORDS];
        let span = Span {
            start: backing.as_mut_ptr().cast(),
            len: WORDS * WORD,
        };
        /// The span's pointer, sent to the writer thread.
        struct Shared(Span);
        // SAFETY: the span is only touched through this module's atomic accesses while shared.
        unsafe impl Send for Shared {}
        // SAFETY: as for `Send`.
        unsafe impl Sync for Shared {}
        impl Shared {
            fn span(&self) -> Span {
                self.0
            }
        }
        let shared = Shared(span);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let patterns = [vec![0xaa_u8; WORDS * WORD], vec![0x55_u8; WORDS * WORD]];
                let mut round = 0;
                while !stop.load(Ordering::Acquire) {
                    // SAFETY: the whole span, inside `backing`, which outlives the scope; the
                    // only other access is the loads below, atomic and of the same span.
                    unsafe { store(shared.span(), 0, &patterns[round % 2]) };
                    round += 1;
                }
            });
            /// Stops the writer when the reader is done, or fails (a panic), so the scope ends.
            struct StopOnDrop<'flag>(&'flag std::sync::atomic::AtomicBool);
            impl Drop for StopOnDrop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Release);
                }
            }
            let _stop = StopOnDrop(&stop);
            let mut out = vec![0_u8; WORDS * WORD];
            for _ in 0..20_000 {
                // SAFETY: as for the stores.
                unsafe { load(shared.span(), 0, &mut out) };
                for word in out.chunks(WORD) {
                    assert!(
                        word.iter().all(|&byte| byte == word[0]),
                        "a torn word: {word:?}"
                    );
                }
            }
        });
    }
}
