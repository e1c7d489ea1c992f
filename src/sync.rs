//! The synchronisation primitives the cache is built from: std's, or loom's under `--cfg dma_loom`,
//! so the loom models check the code that ships rather than a copy of it.
//!
//! crossbeam-epoch switches itself to loom under `--cfg crossbeam_loom` (with its `loom`
//! feature), which the loom suite sets beside `dma_loom`.

#[cfg(not(dma_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(dma_loom))]
pub(crate) use std::sync::mpsc;
#[cfg(not(dma_loom))]
pub(crate) use std::sync::{Arc, Mutex, Weak};
#[cfg(not(dma_loom))]
pub(crate) use std::thread;

#[cfg(dma_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(dma_loom)]
pub(crate) use loom::sync::mpsc;
#[cfg(dma_loom)]
pub(crate) use loom::sync::{Arc, Mutex};
#[cfg(dma_loom)]
pub(crate) use loom::thread;
#[cfg(dma_loom)]
pub(crate) use std::sync::Weak;

/// Lock `mutex`, carrying on through poisoning: every critical section here leaves its data
/// consistent before anything in it can panic.
#[cfg_attr(not(any(test, feature = "model")), allow(dead_code))]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> impl std::ops::DerefMut<Target = T> + '_ {
    #[cfg(not(dma_loom))]
    {
        mutex
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(dma_loom)]
    {
        mutex
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
