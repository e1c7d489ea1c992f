//! The libfabric objects of an endpoint, opened in order into its [`Handles`]: the fabric, the
//! domain and the address vector, the completion queues (with the wait object the provider
//! offers, else polled), and the endpoint, bound to them and enabled. Each object is owned by
//! the handles from the moment it opens, so an error part-way closes exactly what was opened.

use std::ptr;

use crate::configuration::Configuration;
use crate::endpoint::check;
use crate::endpoint::handles::Handles;
use crate::endpoint::wait::{Source, Waiting};
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// Open the fabric, the domain and the address vector (a table of `av_capacity` entries) into
/// `handles`.
///
/// # Safety
/// `handles.info` is the non-null list `fi_getinfo` returned, and nothing in `handles` is open.
pub(super) unsafe fn open_fabric_domain_and_av(
    handles: &mut Handles,
    configuration: &Configuration,
) -> Result<(), DmaError> {
    let info = handles.info;
    // SAFETY: `info` is the list the caller promises, alive until `handles` drops; each call
    // receives objects opened just above (owned by `handles`, which closes them on any early
    // return), out-pointers to fields of `handles`, and attribute structs that live across it.
    unsafe {
        check(
            "fi_fabric",
            sys::fi_fabric(
                (*info).fabric_attr,
                &raw mut handles.fabric,
                ptr::null_mut(),
            ),
        )?;
        check(
            "fi_domain",
            sys::fi_domain(
                handles.fabric,
                info,
                &raw mut handles.domain,
                ptr::null_mut(),
            ),
        )?;
        let mut av_attr = sys::fi_av_attr {
            type_: sys::FI_AV_TABLE,
            count: configuration.av_capacity,
            ..Default::default()
        };
        check(
            "fi_av_open",
            sys::fi_av_open(
                handles.domain,
                &raw mut av_attr,
                &raw mut handles.av,
                ptr::null_mut(),
            ),
        )
    }
}

/// The completion queues as they were opened: their depth (the provider may round the asked
/// `cq_size` up) and the wait object they have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CompletionQueues {
    /// `fi_cq_attr.size` after the queues opened.
    pub(super) size: usize,
    /// `fi_cq_attr.wait_obj`: `FI_WAIT_NONE` when the queues are polled.
    pub(super) wait_obj: sys::fi_wait_obj,
}

/// Open the transmit and receive completion queues into `handles`: queues that sleep where the
/// provider offers it (see `wait`); else, or if the provider refuses the wait object after all,
/// queues that are polled.
///
/// # Safety
/// `handles.domain` is open ([`open_fabric_domain_and_av`]), and no queue is open yet.
pub(super) unsafe fn open_completion_queues(
    handles: &mut Handles,
    configuration: &Configuration,
    provider: &str,
) -> Result<CompletionQueues, DmaError> {
    let mut cq_attr = sys::fi_cq_attr {
        format: sys::FI_CQ_FORMAT_DATA,
        wait_obj: wait_object(configuration, provider),
        size: configuration.cq_size,
        ..Default::default()
    };
    // SAFETY: the domain is open (the caller promises it) and owned by `handles`, which closes
    // any queue opened here on an early return; the out-pointers are fields of `handles`, and
    // `cq_attr` lives across every call.
    unsafe {
        if sys::FI_WAIT_NONE != cq_attr.wait_obj {
            let code = sys::fi_cq_open(
                handles.domain,
                &raw mut cq_attr,
                &raw mut handles.tx_cq,
                ptr::null_mut(),
            );
            if 0 != code {
                tracing::debug!(
                    code,
                    "the wait object was refused: the queues will be polled"
                );
                handles.tx_cq = ptr::null_mut();
                cq_attr.wait_obj = sys::FI_WAIT_NONE;
            }
        }
        if handles.tx_cq.is_null() {
            check(
                "fi_cq_open",
                sys::fi_cq_open(
                    handles.domain,
                    &raw mut cq_attr,
                    &raw mut handles.tx_cq,
                    ptr::null_mut(),
                ),
            )?;
        }
        // The receive queue's entries carry the tag: the credit protocol's version, kind and
        // sender (plain endpoints read a zero tag).
        cq_attr.format = sys::FI_CQ_FORMAT_TAGGED;
        check(
            "fi_cq_open",
            sys::fi_cq_open(
                handles.domain,
                &raw mut cq_attr,
                &raw mut handles.rx_cq,
                ptr::null_mut(),
            ),
        )?;
    }
    Ok(CompletionQueues {
        size: cq_attr.size,
        wait_obj: cq_attr.wait_obj,
    })
}

/// Open the endpoint into `handles`, bind it to the address vector and to its transmit and
/// receive completion queues, and enable it.
///
/// # Safety
/// `handles.info` is the list `fi_getinfo` returned, and the domain, the address vector and both
/// completion queues are open ([`open_fabric_domain_and_av`], [`open_completion_queues`]).
pub(super) unsafe fn open_endpoint(handles: &mut Handles) -> Result<(), DmaError> {
    // SAFETY: every object passed is open (the caller promises it) and owned by `handles`, which
    // closes the endpoint opened here on an early return; `fid` is the first member of each
    // object, so `&raw mut (*x).fid` is the object's fid.
    unsafe {
        check(
            "fi_endpoint",
            sys::fi_endpoint(
                handles.domain,
                handles.info,
                &raw mut handles.ep,
                ptr::null_mut(),
            ),
        )?;
        check(
            "fi_ep_bind",
            sys::fi_ep_bind(handles.ep, &raw mut (*handles.av).fid, 0),
        )?;
        check(
            "fi_ep_bind",
            sys::fi_ep_bind(
                handles.ep,
                &raw mut (*handles.tx_cq).fid,
                sys::FI_TRANSMIT.into(),
            ),
        )?;
        check(
            "fi_ep_bind",
            sys::fi_ep_bind(
                handles.ep,
                &raw mut (*handles.rx_cq).fid,
                sys::FI_RECV.into(),
            ),
        )?;
        check("fi_enable", sys::fi_enable(handles.ep))
    }
}

/// How the endpoint waits for its completion queues with wait object `wait_obj`: a file
/// descriptor to poll (`FI_WAIT_FD`), a thread that blocks in `fi_cq_sread` (`FI_WAIT_UNSPEC`),
/// or nothing (`None`: polled).
///
/// # Safety
/// The fabric and both completion queues in `handles` are open, with `wait_obj` asked, and stay
/// open for as long as the returned source is used.
pub(super) unsafe fn wait_source(handles: &Handles, wait_obj: sys::fi_wait_obj) -> Option<Source> {
    let cqs = [handles.tx_cq, handles.rx_cq];
    if sys::FI_WAIT_FD == wait_obj {
        // SAFETY: the caller promises what `Source::of` requires.
        unsafe { Source::of(handles.fabric, cqs) }
    } else if sys::FI_WAIT_UNSPEC == wait_obj {
        // SAFETY: as for `Source::of` just above.
        Some(unsafe { Source::blocking(handles.fabric, cqs) })
    } else {
        None
    }
}

/// The wait object the completion queues are opened with: the provider's choice of
/// [`Waiting`] (`wait`, which says why each provider waits as it does), logged at debug level.
fn wait_object(configuration: &Configuration, provider: &str) -> sys::fi_wait_obj {
    let waiting = Waiting::choose(
        provider,
        crate::configuration::runtime_version(),
        configuration.busy_poll,
    );
    if let Waiting::Polling(reason) = waiting {
        tracing::debug!(provider, reason, "the completion queues will be polled");
    }
    waiting.wait_object()
}
