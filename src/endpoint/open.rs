//! Opening an endpoint: the hints `fi_getinfo` is asked with, what the provider it chose demands
//! and allows, the refusals and size checks made before any libfabric object opens, and the
//! calls that open the fabric, domain, address vector, queues and endpoint.
//!
//! Every check here runs before the first object opens, and a failure part-way through the
//! opening closes what was opened (the [`Handles`] own it) and names the call that failed.

use std::ffi::{CStr, CString};
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::Arc;

#[cfg(doc)] // for the docs' links
use super::RECEIVE_POST_PATIENCE;
use super::handles::Handles;
use super::lookup::describe;
use super::receive::ReceiveSlots;
use super::sends::Sends;
use super::wait::{Source, Waiting};
use super::{LibfabricEndpoint, check, rma};
use crate::av::FabricAv;
use crate::av::fabric as av;
use crate::cache::AddressCache;
use crate::configuration::{Configuration, Provider};
use crate::error::DmaError;
use dma_libfabric_sys as sys;

impl LibfabricEndpoint {
    /// Open an endpoint with the first of `configuration.providers` that gives a
    /// reliable-datagram endpoint, on `node` (or `configuration.bind` when `node` is `None`).
    ///
    /// # Errors
    /// [`DmaError::NoProvider`], naming each provider tried and why it was turned down, when none
    /// works: no such provider here, or one that asks for what the endpoint cannot honour yet
    /// (see the module docs: efa-direct and shm are refused); [`DmaError::Fabric`] when a later
    /// libfabric call fails, or a receive buffer still cannot be posted after
    /// [`RECEIVE_POST_PATIENCE`]; [`DmaError::InvalidArgument`] for a configuration
    /// [`Configuration::validate`] refuses (an empty provider list, a size out of its bounds, a
    /// `cq_size` or `rx_size` below `receive_buffers`), a node with a NUL byte, a `tx_size` or
    /// `rx_size` deeper than the provider accepts (16,384 and 65,536 on tcp;ofi_rxm), more
    /// `receive_buffers` than the provider's receive queue holds (`rx_attr.size`; 2048 on
    /// tcp;ofi_rxm by default), a `receive_size` above its `ep_attr.max_msg_size`, or receive
    /// buffers that cannot be allocated; each names the value and the bound, and each is found
    /// before any libfabric object opens.
    ///
    /// Memory: rxm's own buffer sizes cost about 68 MiB an endpoint, the configuration's about
    /// 5 MiB; a process's first open applies them only if it has one thread, and warns otherwise
    /// (see [`apply_rxm_environment`](Configuration::apply_rxm_environment)).
    ///
    /// ```
    /// use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint};
    ///
    /// let too_many = Configuration { receive_buffers: 1 << 20, ..Configuration::default() };
    /// let Err(DmaError::InvalidArgument(reason)) = LibfabricEndpoint::open(&too_many, None) else {
    ///     panic!("more buffers than the receive queue holds");
    /// };
    /// assert!(reason.contains("1048576"), "{reason}");
    /// ```
    pub fn open(configuration: &Configuration, node: Option<&str>) -> Result<Self, DmaError> {
        configuration.validate()?;
        let node = node.or(configuration.bind.as_deref());
        let node = node
            .map(CString::new)
            .transpose()
            .map_err(|_| DmaError::InvalidArgument("the node has a NUL byte".into()))?;

        let mut tried = Vec::new();
        let mut misfit = None;
        for &provider in &configuration.providers {
            match Self::open_with(configuration, provider, node.as_deref()) {
                Ok(endpoint) => return Ok(endpoint),
                Err(error) => {
                    tracing::debug!(%provider, %error, "provider turned down");
                    tried.push(format!("{provider}: {error}"));
                    if let DmaError::InvalidArgument(reason) = error {
                        misfit.get_or_insert(reason);
                    }
                }
            }
        }
        match misfit {
            // The configuration, not the machine, is what to fix.
            Some(reason) => Err(DmaError::InvalidArgument(reason)),
            None => Err(DmaError::NoProvider {
                tried: tried.join("; "),
            }),
        }
    }

    fn open_with(
        configuration: &Configuration,
        provider: Provider,
        node: Option<&CStr>,
    ) -> Result<Self, DmaError> {
        let mut handles = Handles::new();
        let Some(info) =
            getinfo_sized(configuration, provider, node, QueueSizes::of(configuration))?
        else {
            return Err(size_misfit(configuration, provider, node)
                .unwrap_or_else(|| crate::configuration::no_data(provider)));
        };
        handles.info = info;

        // SAFETY: `info` is the non-null list head fi_getinfo returned; its attribute pointers
        // are filled in by the provider for every entry.
        let (description, demands, limits) =
            unsafe { (describe(info), Demands::of(info), Limits::of(info)) };
        if let Some(reason) = limits.misfit(configuration, &description.provider) {
            return Err(DmaError::InvalidArgument(reason));
        }
        if let Some(reason) = refusal(provider, &demands) {
            return Err(DmaError::Unsupported(reason));
        }
        crate::configuration::check_chosen(provider, &description.provider)?;
        // Before any libfabric object opens: memory that cannot be had is an error, not an abort.
        let receives =
            ReceiveSlots::new(configuration.receive_buffers, configuration.receive_size)?;

        // SAFETY: every call below receives objects opened just above and still open (owned by
        // `handles`, which closes them on any early return), out-pointers to fields of
        // `handles`, and attribute structs that live across the call. `info` stays alive until
        // `handles` drops.
        let tx_cq_size = unsafe {
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
            )?;

            // Queues that sleep where the provider offers it (see `wait`); else, or if the
            // provider refuses the wait object after all, queues that are polled.
            let mut cq_attr = sys::fi_cq_attr {
                format: sys::FI_CQ_FORMAT_DATA,
                wait_obj: wait_object(configuration, &description.provider),
                size: configuration.cq_size,
                ..Default::default()
            };
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
            check(
                "fi_cq_open",
                sys::fi_cq_open(
                    handles.domain,
                    &raw mut cq_attr,
                    &raw mut handles.rx_cq,
                    ptr::null_mut(),
                ),
            )?;

            check(
                "fi_endpoint",
                sys::fi_endpoint(handles.domain, info, &raw mut handles.ep, ptr::null_mut()),
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
            check("fi_enable", sys::fi_enable(handles.ep))?;
            (cq_attr.size, cq_attr.wait_obj)
        };
        let (tx_cq_size, wait_obj) = tx_cq_size;
        let cqs = [handles.tx_cq, handles.rx_cq];
        let source = if sys::FI_WAIT_FD == wait_obj {
            // SAFETY: the fabric and both queues are open, with the wait object asked, and stay
            // open for as long as the slab that keeps the source (the slab is dropped after the
            // handles close, and used only while the endpoint lives).
            unsafe { Source::of(handles.fabric, cqs) }
        } else if sys::FI_WAIT_UNSPEC == wait_obj {
            // SAFETY: as for `Source::of` just above.
            Some(unsafe { Source::blocking(handles.fabric, cqs) })
        } else {
            None
        };

        // Unregistered in `Drop`, before `handles` closes the AV.
        let handed_out = av::register(handles.av, configuration.av_capacity);
        // As many sends in flight as the transmit queue and its completion queue hold.
        // SAFETY: `info` is the list head fi_getinfo returned, alive as long as `handles`.
        let tx_size = unsafe { (*(*info).tx_attr).size };
        let sends = Sends::new(
            tx_size.min(tx_cq_size),
            configuration.receive_size,
            configuration.av_capacity,
            Arc::clone(&handed_out),
        )?;
        let mut description = description;
        description.max_send_size = sends.size();
        description.max_sends_in_flight = sends.capacity();
        description.max_sends_in_flight_per_peer = sends.peer_limit();
        // SAFETY: `info` is the list head fi_getinfo returned, alive as long as `handles`.
        let operations = Box::new(unsafe {
            rma::Operations::new(
                info,
                configuration.rma,
                tx_cq_size,
                source,
                sends,
                Arc::clone(&handed_out),
            )
        });
        let backend = FabricAv::new(
            handles.av,
            description.addr_format,
            description.address_len,
            configuration.av_capacity,
            Arc::clone(&handed_out),
        );
        let endpoint = Self {
            peers: ManuallyDrop::new(
                AddressCache::with_backend(backend).with_patience(configuration.cache_patience),
            ),
            handles,
            receives,
            description: Box::new(description),
            handed_out,
            #[cfg(test)]
            failing_posts: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(test)]
            posts_ask_to_retry: std::sync::atomic::AtomicBool::new(false),
            operations,
        };
        for index in 0..endpoint.receives.len() {
            endpoint.post_patiently(index)?;
        }
        tracing::debug!(provider = %endpoint.description.provider, fabric = %endpoint.description.fabric, "endpoint open");
        Ok(endpoint)
    }
}

/// What the hints offer a provider: the modes, threading and memory-registration modes the
/// endpoint asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hints {
    /// `fi_info.mode`: what the application is prepared to do for the provider.
    mode: u64,
    /// `domain_attr.threading`.
    threading: u32,
    /// `domain_attr.mr_mode`.
    mr_mode: i32,
    /// `tx_attr.op_flags`: the completion semantics of every transmit.
    tx_op_flags: u64,
    /// Secondary capabilities asked for besides `FI_MSG` (and `FI_RMA`, `FI_HMEM` as configured).
    caps: u64,
}

impl Hints {
    /// The hints for `provider`: exactly what it asks for where that is known, so `fi_getinfo`
    /// finds it and [`refusal`] can then say what the endpoint cannot honour.
    ///
    /// efa-direct (libfabric 2.6.0, `prov/efa/src/efa_prov_info.c`) requires `FI_CONTEXT2`
    /// (line 475) and `FI_MR_LOCAL` (line 49), and its domain is `FI_THREAD_DOMAIN` (line 45);
    /// hints without them never match it. The receive slots' contexts are `fi_context2`, so
    /// `FI_CONTEXT2` is honoured; the other two are refused at `open`.
    ///
    /// tcp (under rxm, which hands `FI_TRANSMIT_COMPLETE` down to its tcp connections, and
    /// native) is asked for `FI_TRANSMIT_COMPLETE`, which tcp implements as an acknowledgement
    /// from the peer's provider: without it a send completes once it is in the socket, so a peer
    /// that stopped reading absorbed tens of thousands of sends (the kernel's buffers) before
    /// completions stopped, and a send written just before a peer died completed `Ok`. With it,
    /// the count of sends in flight (see `sends`) bounds what a stopped peer holds, and a send
    /// to a dead peer completes with an error. Measured on libfabric 1.17 and 2.6.0.
    ///
    /// tcp (under rxm, and native on 2.x) is asked for `FI_SOURCE`, so a receive's completion
    /// names its sender (see `endpoint::senders`); rxm offers it only when asked
    /// (`rxm_alter_info`, `rxm_init.c`), and native tcp offers it on its shared receive context
    /// (`XNET_SRX_CAPS`, `prov/tcp/src/xnet_attr.c`, 2.6.0).
    fn for_provider(provider: Provider) -> Self {
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
                tx_op_flags: u64::from(sys::FI_TRANSMIT_COMPLETE),
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

/// What the provider `fi_getinfo` chose demands of the endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Demands {
    /// `domain_attr.threading`.
    threading: u32,
    /// `domain_attr.mr_mode`.
    mr_mode: i32,
    /// `fi_info.addr_format`.
    addr_format: u32,
}

impl Demands {
    /// What the first entry of `info` demands.
    ///
    /// # Safety
    /// `info` is a non-null `fi_info` returned by `fi_getinfo`.
    unsafe fn of(info: *const sys::fi_info) -> Self {
        // SAFETY: fi_getinfo fills every attribute pointer of each entry it returns.
        unsafe {
            Self {
                threading: (*(*info).domain_attr).threading,
                mr_mode: (*(*info).domain_attr).mr_mode,
                addr_format: (*info).addr_format,
            }
        }
    }
}

/// The provider's limits on what the configuration sizes, as the first entry of an `fi_info`
/// gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Limits {
    /// `rx_attr.size`: the receive queue's depth, and so the most receives posted at once.
    rx_size: usize,
    /// `ep_attr.max_msg_size`: the largest message.
    max_msg_size: usize,
}

impl Limits {
    /// What the first entry of `info` allows.
    ///
    /// # Safety
    /// `info` is a non-null `fi_info` returned by `fi_getinfo`.
    unsafe fn of(info: *const sys::fi_info) -> Self {
        // SAFETY: fi_getinfo fills every attribute pointer of each entry it returns.
        unsafe {
            Self {
                rx_size: (*(*info).rx_attr).size,
                max_msg_size: (*(*info).ep_attr).max_msg_size,
            }
        }
    }

    /// What of `configuration` does not fit these limits of `provider`, naming the value and the
    /// limit, if anything.
    fn misfit(&self, configuration: &Configuration, provider: &str) -> Option<String> {
        if configuration.receive_buffers > self.rx_size {
            return Some(format!(
                "receive_buffers is {}, and {provider} posts at most {} receives (rx_attr.size): \
                 lower Configuration::receive_buffers to {} or less",
                configuration.receive_buffers, self.rx_size, self.rx_size
            ));
        }
        if configuration.receive_size > self.max_msg_size {
            return Some(format!(
                "receive_size is {}, above the bound of {} that {provider} offers \
                 (ep_attr.max_msg_size): lower Configuration::receive_size to {} or less",
                configuration.receive_size, self.max_msg_size, self.max_msg_size
            ));
        }
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

/// Why the endpoint refuses `provider` with these demands, if it does: what it cannot honour
/// yet, rather than pretend to.
fn refusal(provider: Provider, demands: &Demands) -> Option<String> {
    let mut reasons = Vec::new();
    if sys::FI_THREAD_SAFE != demands.threading {
        reasons.push(format!(
            "its domain is threading model {} (FI_THREAD_DOMAIN is {}), not FI_THREAD_SAFE: that \
             leaves serialising every call on the domain to the application, and this endpoint is \
             Sync, many threads post on it at once, and its cache's writer thread calls \
             fi_av_insert and fi_av_remove meanwhile, with no domain lock",
            demands.threading,
            sys::FI_THREAD_DOMAIN
        ));
    }
    if 0 != demands.mr_mode & sys::FI_MR_LOCAL as i32 {
        reasons.push(
            "it requires FI_MR_LOCAL (every posted buffer registered, with its descriptor), and \
             this crate's copying send and receive slots are not registered, so they have no \
             descriptors"
                .to_string(),
        );
    }
    if Provider::Udp == provider {
        reasons.push(
            "it does not report truncation: a message longer than the receive buffer arrives cut \
             short as a successful completion of the buffer's length (measured on libfabric 1.17 \
             and 2.6.0: 32 bytes into a 16-byte buffer completed as 16), and its max_msg_size is \
             SIZE_MAX, so no receive buffer can be sized to hold every message"
                .to_string(),
        );
    }
    if sys::FI_ADDR_STR == demands.addr_format {
        reasons.push(
            "its addresses are FI_ADDR_STR strings, of varying length, which fi_av_insert reads \
             up to their NUL byte: the cache checks every address against one fixed length, \
             which cannot keep that read inside the caller's buffer"
                .to_string(),
        );
    }
    (!reasons.is_empty()).then(|| format!("{provider} is refused: {}", reasons.join("; and ")))
}

/// Queue depths to ask `fi_getinfo` for (`tx_attr.size`, `rx_attr.size`); 0 takes the
/// provider's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QueueSizes {
    tx: usize,
    rx: usize,
}

impl QueueSizes {
    /// What `configuration` asks for.
    fn of(configuration: &Configuration) -> Self {
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
fn size_misfit(
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

/// `fi_getinfo` for a reliable-datagram, table-AV endpoint of `provider`, with the
/// [`Hints`] it asks for and queue depths `sizes`; `None` when it offers nothing
/// (`-FI_ENODATA`).
fn getinfo_sized(
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
    let wanted = Hints::for_provider(provider);
    // SAFETY: `hints` is a fresh info whose attribute pointers fi_allocinfo filled in; the names
    // are copied onto the C heap by the shim (fi_freeinfo frees them); fi_getinfo writes one list
    // head into `info`; `hints` is freed once, after the call.
    let code = unsafe {
        (*hints).caps = u64::from(sys::FI_MSG) | wanted.caps;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

    use super::*;

    /// What efa-direct demands (libfabric 2.6.0 `prov/efa/src/efa_prov_info.c`), which no device
    /// here can show: the hints ask for it, and `open` refuses it, naming it and why.
    #[test]
    fn efa_direct_is_asked_for_what_it_requires_and_refused_with_reasons() {
        let hints = Hints::for_provider(Provider::EfaDirect);
        assert_eq!(sys::FI_CONTEXT2, hints.mode & sys::FI_CONTEXT2);
        assert_eq!(
            sys::FI_MR_LOCAL as i32,
            hints.mr_mode & sys::FI_MR_LOCAL as i32
        );
        assert_eq!(sys::FI_THREAD_DOMAIN, hints.threading);

        let efa_direct = Demands {
            threading: sys::FI_THREAD_DOMAIN,
            mr_mode: (sys::FI_MR_LOCAL | sys::FI_MR_ALLOCATED) as i32,
            addr_format: sys::FI_ADDR_EFA,
        };
        let reason = refusal(Provider::EfaDirect, &efa_direct).expect("refused");
        for needle in ["efa-direct", "FI_MR_LOCAL", "FI_THREAD_SAFE", "Sync"] {
            assert!(reason.contains(needle), "{needle} in {reason}");
        }
    }

    /// A receive buffer larger than the provider's largest message (`ep_attr.max_msg_size`; tcp's
    /// is `SIZE_MAX`, so this is shown here rather than on tcp) is refused, naming both numbers,
    /// as are more buffers than its receive queue holds.
    #[test]
    fn sizes_past_the_providers_limits_are_refused_naming_them() {
        let limits = Limits {
            rx_size: 2048,
            max_msg_size: 8192,
        };
        let fits = Configuration {
            receive_size: 8192,
            receive_buffers: 2048,
            ..Configuration::default()
        };
        assert_eq!(None, limits.misfit(&fits, "efa"));
        let too_large = Configuration {
            receive_size: 8193,
            ..fits.clone()
        };
        let reason = limits.misfit(&too_large, "efa").expect("refused");
        for needle in ["8193", "8192", "max_msg_size", "efa"] {
            assert!(reason.contains(needle), "{needle} in {reason}");
        }
        let too_many = Configuration {
            receive_buffers: 2049,
            ..fits
        };
        let reason = limits.misfit(&too_many, "efa").expect("refused");
        for needle in ["2049", "2048", "rx_attr.size"] {
            assert!(reason.contains(needle), "{needle} in {reason}");
        }
    }

    #[test]
    fn tcp_is_asked_for_thread_safety_and_not_refused() {
        let hints = Hints::for_provider(Provider::Tcp);
        assert_eq!(sys::FI_THREAD_SAFE, hints.threading);
        assert_eq!(0, hints.mr_mode & sys::FI_MR_LOCAL as i32);
        let tcp = Demands {
            threading: sys::FI_THREAD_SAFE,
            mr_mode: 0,
            addr_format: sys::FI_SOCKADDR_IN,
        };
        assert_eq!(None, refusal(Provider::Tcp, &tcp));
    }
}
