//! What happens at the process's first `fi_getinfo` through this crate, when libfabric
//! initialises its providers and rxm reads its `FI_OFI_RXM_*` variables once for the whole
//! process: the configuration's rxm sizing is applied where that is sound
//! ([`before_getinfo`]), and the eager limit rxm then reads is recorded ([`rxm_eager_limit`]).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::{Configuration, RxmSizing};

/// Set once this process has called `fi_getinfo` through this crate: from then on rxm has read
/// its environment variables and setting them no longer changes anything.
static LIBFABRIC_INITIALISED: AtomicBool = AtomicBool::new(false);

/// rxm's eager limit in this process, as its first `fi_getinfo` left it (see
/// [`rxm_eager_limit`]); 0 until then, or where it cannot be known.
static RXM_EAGER_LIMIT: AtomicU32 = AtomicU32::new(0);

/// rxm's eager limit in this process (its bounce-buffer size, `FI_OFI_RXM_BUFFER_SIZE`): what
/// the environment held when this crate's first `fi_getinfo` initialised libfabric, which is
/// when rxm reads it. 0 before that, or where the text is not one this crate reads as rxm does.
/// It is wrong only if something else in the process initialised libfabric first and the
/// environment changed in between.
pub(crate) fn rxm_eager_limit() -> u32 {
    RXM_EAGER_LIMIT.load(Ordering::Acquire)
}

/// Called before every `fi_getinfo` of this crate, with the configuration it serves. The first
/// call of the process applies `configuration`'s rxm sizing itself when that is safe, and says
/// what it costs when it is not:
/// - when this process has one thread, the caller's, no other thread can read or write the
///   environment meanwhile (a thread is only made by a running thread), so setting the
///   `FI_OFI_RXM_*` variables the environment does not hold is sound, and rxm reads them in the
///   `fi_getinfo` that follows, and an endpoint costs a fraction of what rxm's defaults cost
///   (`docs/providers.md`, "Endpoint sizing");
/// - otherwise nothing is set, and a warning says what rxm's own defaults cost and how to apply
///   the sizing ([`Configuration::apply_rxm_environment`] at the start of `main`).
///
/// Later calls only record that libfabric has read its variables. Returns whether this call
/// applied the sizing.
pub(crate) fn before_getinfo(configuration: &Configuration) -> bool {
    if LIBFABRIC_INITIALISED.swap(true, Ordering::AcqRel) {
        return false;
    }
    let applied = apply_sizing_once(configuration);
    RXM_EAGER_LIMIT.store(RxmSizing::eager_limit_in_environment(), Ordering::Release);
    applied
}

/// [`before_getinfo`]'s first call: apply `configuration`'s rxm sizing if that is sound, and
/// say what not applying it costs otherwise. Returns whether it applied it.
fn apply_sizing_once(configuration: &Configuration) -> bool {
    let missing: Vec<(&'static str, String)> = configuration
        .rxm_environment()
        .into_iter()
        .filter(|(name, _)| std::env::var_os(name).is_none())
        .collect();
    if missing.is_empty() {
        return false;
    }
    match threads_in_this_process() {
        Some(1) => {
            for (name, value) in &missing {
                // SAFETY: this process has one thread, this one (counted just above; only a
                // running thread can start another, and this one is here), so nothing else
                // reads or writes the environment during the call.
                unsafe { std::env::set_var(name, value) };
            }
            tracing::debug!(
                variables = ?missing,
                "applied rxm's sizing before libfabric's initialisation (one thread in the process)"
            );
            true
        }
        threads => {
            tracing::warn!(
                threads = ?threads,
                unset = ?missing,
                "rxm's sizing was not applied: the process has other threads, so the crate \
                 cannot set FI_OFI_RXM_* safely, and rxm's own defaults cost about 68 MiB per \
                 endpoint on libfabric 1.17 (132 MiB on 2.6.0) against about 5 MiB; call \
                 `unsafe {{ configuration.apply_rxm_environment() }}` at the start of main, \
                 or set the variables in the environment"
            );
            false
        }
    }
}

/// How many threads this process has, from `/proc/self/task`; `None` where that cannot be read.
fn threads_in_this_process() -> Option<usize> {
    std::fs::read_dir("/proc/self/task")
        .ok()
        .map(|tasks| tasks.filter(Result::is_ok).count())
}

/// Whether this process has called `fi_getinfo` through this crate: rxm has read its variables.
pub(super) fn libfabric_initialised() -> bool {
    LIBFABRIC_INITIALISED.load(Ordering::Acquire)
}
