//! What `open` asks `fi_getinfo` for, and the asking: the [`Hints`] each provider is offered,
//! the queue depths the configuration sets, and, when nothing is offered, whether a depth past
//! the provider's bound is why ([`size_misfit`]), or whether `FI_HMEM` is ([`hmem_misfit`]).
//!
//! Nothing here opens a libfabric object: every `fi_info` asked for is either handed to the
//! caller (who frees it) or freed here.

use std::ffi::{CStr, CString};
use std::ptr;

use crate::configuration::{Configuration, Provider, SendCompletion};
use crate::endpoint::check;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// What the hints offer a provider: the modes, threading and memory-registration modes the
/// endpoint asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hints {
    /// `fi_info.mode`: what the application is prepared to do for the provider.
    pub(super) mode: u64,
    /// `domain_attr.threading`.
    pub(super) threading: u32,
    /// `domain_attr.mr_mode`.
    pub(super) mr_mode: i32,
    /// `tx_attr.op_flags`: the completion semantics of every transmit.
    pub(super) tx_op_flags: u64,
    /// Secondary capabilities asked for besides `FI_MSG` (and `FI_RMA`, `FI_HMEM` as configured).
    pub(super) caps: u64,
}

impl Hints {
    /// The hints for `provider`: exactly what it asks for where that is known, so `fi_getinfo`
    /// finds it and [`refusal`](super::refusal) can then say what the endpoint cannot honour.
    ///
    /// efa-direct (libfabric 2.6.0, `prov/efa/src/efa_prov_info.c`) requires `FI_CONTEXT2`
    /// (line 475) and `FI_MR_LOCAL` (line 49), and its domain is `FI_THREAD_DOMAIN` (line 45);
    /// hints without them never match it. The receive slots' contexts are `fi_context2`, so
    /// `FI_CONTEXT2` is honoured; the other two are refused at `open`.
    ///
    /// tcp (under rxm, which hands `FI_TRANSMIT_COMPLETE` down to its tcp connections, and
    /// native) is asked for `FI_TRANSMIT_COMPLETE` unless `sends` is
    /// [`SendCompletion::Local`]; tcp implements it as an acknowledgement from the peer's
    /// provider: without it a send completes once it is in the socket, so a peer that stopped
    /// reading absorbed tens of thousands of sends (the kernel's buffers) before completions
    /// stopped, and a send written just before a peer died completed `Ok`. With it, the count of
    /// sends in flight (see `sends`) bounds what a stopped peer holds, and a send to a dead peer
    /// completes with an error. Measured on libfabric 1.17 and 2.6.0.
    ///
    /// tcp (under rxm, and native on 2.x) is asked for `FI_SOURCE`, so a receive's completion
    /// names its sender (see `endpoint::senders`); rxm offers it only when asked
    /// (`rxm_alter_info`, `rxm_init.c`), and native tcp offers it on its shared receive context
    /// (`XNET_SRX_CAPS`, `prov/tcp/src/xnet_attr.c`, 2.6.0).
    pub(super) fn for_provider(provider: Provider, sends: SendCompletion) -> Self {
        let mr_mode = (sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY) as i32;
        match provider {
            Provider::EfaDirect => Self {
                mode: sys::FI_CONTEXT | sys::FI_CONTEXT2,
                threading: sys::FI_THREAD_DOMAIN,
                mr_mode: mr_mode | sys::FI_MR_LOCAL as i32,
                tx_op_flags: 0,
                caps: 0,
            },
            Provider::Tcp | Provider::TcpNative => Self {
                mode: sys::FI_CONTEXT,
                threading: sys::FI_THREAD_SAFE,
                mr_mode,
                tx_op_flags: sends.tx_op_flags(),
                caps: sys::FI_SOURCE,
            },
            _ => Self {
                mode: sys::FI_CONTEXT,
                threading: sys::FI_THREAD_SAFE,
                mr_mode,
                tx_op_flags: 0,
                caps: 0,
            },
        }
    }
}

/// Queue depths to ask `fi_getinfo` for (`tx_attr.size`, `rx_attr.size`); 0 takes the
/// provider's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct QueueSizes {
    tx: usize,
    rx: usize,
}

impl QueueSizes {
    /// What `configuration` asks for.
    pub(super) fn of(configuration: &Configuration) -> Self {
        Self {
            tx: configuration.tx_size.unwrap_or(0),
            rx: configuration.rx_size.unwrap_or(0),
        }
    }
}

/// One of an endpoint's two queues whose depth the configuration may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Transmit,
    Receive,
}

impl Queue {
    /// The configuration's depth for this queue, if it asks for one.
    fn asked(self, configuration: &Configuration) -> Option<usize> {
        match self {
            Self::Transmit => configuration.tx_size,
            Self::Receive => configuration.rx_size,
        }
        .filter(|&size| size > 0)
    }

    /// Hints that ask `size` of this queue and the provider's default of the other.
    fn sizes(self, size: usize) -> QueueSizes {
        match self {
            Self::Transmit => QueueSizes { tx: size, rx: 0 },
            Self::Receive => QueueSizes { tx: 0, rx: size },
        }
    }

    /// The configuration field and the `fi_info` attribute.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Self::Transmit => ("tx_size", "tx_attr.size"),
            Self::Receive => ("rx_size", "rx_attr.size"),
        }
    }
}

/// When `fi_getinfo` offered nothing for the configuration's queue depths, whether a depth is
/// why, as an error naming the depth and the provider's bound: the largest depth its
/// `fi_getinfo` accepts, found by bisection (at most 64 calls, on this error path only).
///
/// The provider's bound is not in any `fi_info` it returns: without a size hint rxm reports its
/// default (2,048, or `FI_OFI_RXM_TX_SIZE`/`FI_OFI_RXM_RX_SIZE`), and accepts hints up to its
/// maximum (16,384 for transmits and 65,536 for receives in libfabric 1.17 and 2.6.0, `RXM_TX_SIZE`
/// and `RXM_RX_SIZE`), answering `-FI_ENODATA` past it rather than a shallower queue. `None`
/// when neither depth is why (the provider offers nothing here at all, or offers each depth
/// alone).
pub(super) fn size_misfit(
    configuration: &Configuration,
    provider: Provider,
    node: Option<&CStr>,
) -> Option<DmaError> {
    let offers = |sizes| {
        getinfo_sized(configuration, provider, node, sizes)
            .ok()
            .flatten()
            .is_some_and(|info| {
                // SAFETY: the list fi_getinfo returned, freed once, here; nothing else holds it.
                unsafe { sys::fi_freeinfo(info) };
                true
            })
    };
    for queue in [Queue::Transmit, Queue::Receive] {
        let Some(asked) = queue.asked(configuration) else {
            continue;
        };
        if offers(queue.sizes(asked)) {
            continue;
        }
        if !offers(queue.sizes(0)) {
            return None;
        }
        let (mut accepted, mut refused) = (0, asked);
        while refused - accepted > 1 {
            let middle = accepted + (refused - accepted) / 2;
            if offers(queue.sizes(middle)) {
                accepted = middle;
            } else {
                refused = middle;
            }
        }
        let (field, attribute) = queue.names();
        return Some(DmaError::InvalidArgument(format!(
            "{field} is {asked}, above the bound of {accepted} that {} offers (the deepest \
             {attribute} its fi_getinfo accepts): lower Configuration::{field} to {accepted} or \
             less, or None for the provider's default",
            provider.name()
        )));
    }
    None
}

/// When `fi_getinfo` offered nothing and the configuration asks for `FI_HMEM`, whether
/// `FI_HMEM` is why: the same request without it is offered. The error names `FI_HMEM`, the
/// provider, and what to do; `None` when the request fails without `FI_HMEM` too (or does not
/// ask for it), so something else is why.
pub(super) fn hmem_misfit(
    configuration: &Configuration,
    provider: Provider,
    node: Option<&CStr>,
) -> Option<DmaError> {
    if !configuration.hmem {
        return None;
    }
    let host_only = Configuration {
        hmem: false,
        ..configuration.clone()
    };
    let info = getinfo_sized(&host_only, provider, node, QueueSizes::of(configuration))
        .ok()
        .flatten()?;
    // SAFETY: the list fi_getinfo returned, freed once, here; nothing else holds it.
    unsafe { sys::fi_freeinfo(info) };
    let code = -i64::from(sys::FI_ENODATA);
    Some(DmaError::Fabric {
        call: "fi_getinfo",
        code,
        message: format!(
            "{}: Configuration::hmem asks for FI_HMEM (registering device memory), which {name} \
             does not offer here: fi_getinfo offers {name}'s reliable-datagram endpoint without \
             FI_HMEM, and nothing with it. Set hmem: false to register host memory only, or \
             list a provider that offers FI_HMEM (`fi_info -c FI_HMEM` lists them; efa, verbs \
             and shm do when libfabric is built with CUDA, ROCr, Level Zero or Neuron support)",
            crate::error::strerror(code),
            name = provider.name()
        ),
    })
}

/// `fi_getinfo` for a reliable-datagram, table-AV endpoint of `provider`, with the
/// [`Hints`] it asks for and queue depths `sizes`; `None` when it offers nothing
/// (`-FI_ENODATA`).
pub(super) fn getinfo_sized(
    configuration: &Configuration,
    provider: Provider,
    node: Option<&CStr>,
    sizes: QueueSizes,
) -> Result<Option<*mut sys::fi_info>, DmaError> {
    // SAFETY: fi_allocinfo returns a zeroed info with its attribute structs allocated, or null.
    let hints = unsafe { sys::fi_allocinfo() };
    if hints.is_null() {
        return Err(DmaError::fabric("fi_allocinfo", -(sys::FI_ENOMEM as i64)));
    }
    let mut info = ptr::null_mut();
    let name = CString::new(provider.name())
        .map_err(|_| DmaError::InvalidArgument("provider name".into()))?;
    let fabric = provider
        .fabric()
        .map(CString::new)
        .transpose()
        .map_err(|_| DmaError::InvalidArgument("fabric name".into()))?;
    let wanted = Hints::for_provider(provider, configuration.send_completion);
    // SAFETY: `hints` is a fresh info whose attribute pointers fi_allocinfo filled in; the names
    // are copied onto the C heap by the shim (fi_freeinfo frees them); fi_getinfo writes one list
    // head into `info`; `hints` is freed once, after the call.
    let code = unsafe {
        (*hints).caps = u64::from(sys::FI_MSG) | wanted.caps;
        if crate::configuration::PeerProtocol::Credited == configuration.peer_protocol {
            // The credit protocol's messages are tagged (see `endpoint::credits::wire`).
            (*hints).caps |= u64::from(sys::FI_TAGGED);
        }
        (*hints).mode = wanted.mode;
        (*(*hints).ep_attr).type_ = sys::FI_EP_RDM;
        (*(*hints).domain_attr).threading = wanted.threading;
        (*(*hints).domain_attr).av_type = sys::FI_AV_TABLE;
        (*(*hints).domain_attr).mr_mode = wanted.mr_mode;
        (*(*hints).tx_attr).size = sizes.tx;
        (*(*hints).rx_attr).size = sizes.rx;
        (*(*hints).tx_attr).op_flags = wanted.tx_op_flags;
        if configuration.rma {
            // RMA: registered memory honours FI_MR_ENDPOINT too (see `memory`); FI_MR_LOCAL is
            // not offered, because receive buffers are not registered.
            (*hints).caps |= u64::from(sys::FI_RMA);
            (*(*hints).domain_attr).mr_mode |= sys::FI_MR_ENDPOINT as i32;
        }
        if configuration.hmem {
            // Device memory, registered through fi_mr_regattr (see `buffer`).
            (*hints).caps |= sys::FI_HMEM;
        }
        let mut code = sys::dmafab_set_provider_name(hints, name.as_ptr());
        if 0 == code {
            if let Some(fabric) = &fabric {
                code = sys::dmafab_set_fabric_name(hints, fabric.as_ptr());
            }
        }
        if 0 == code {
            crate::configuration::before_getinfo(configuration);
            let flags = if node.is_some() { sys::FI_SOURCE } else { 0 };
            code = sys::fi_getinfo(
                sys::dmafab_version(),
                node.map_or(ptr::null(), CStr::as_ptr),
                ptr::null(),
                flags,
                hints,
                &raw mut info,
            );
        }
        sys::fi_freeinfo(hints);
        code
    };
    if code == -(sys::FI_ENODATA as i32) {
        return Ok(None);
    }
    check("fi_getinfo", code)?;
    if info.is_null() {
        return Err(DmaError::fabric("fi_getinfo", -(sys::FI_ENODATA as i64)));
    }
    Ok(Some(info))
}
