//! Opening an endpoint, in named steps: ask `fi_getinfo` (with the hints of `getinfo`) and check
//! what the provider it chose demands and allows ([`choose`]: the refusals and size checks made
//! before any libfabric object opens); open the fabric, domain and address vector, the
//! completion queues, and the endpoint, bound and enabled; put the endpoint together; post its
//! receives.
//!
//! Every check here runs before the first object opens, and a failure part-way through the
//! opening closes what was opened (the [`Handles`] own it) and names the call that failed.

mod getinfo;

use std::ffi::{CStr, CString};
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::Arc;

use self::getinfo::{QueueSizes, getinfo_sized, hmem_misfit, size_misfit};
#[cfg(doc)] // for the docs' links
use super::RECEIVE_POST_PATIENCE;
use super::credits::wire::CONTROL_SIZE;
use super::handles::Handles;
use super::lookup::describe;
use super::receive::ReceiveSlots;
use super::sends::Sends;
use super::wait::{Source, Waiting};
use super::{Description, LibfabricEndpoint, check, credits};
use crate::av::FabricAv;
use crate::av::fabric as av;
use crate::cache::AddressCache;
use crate::configuration::{Configuration, PeerProtocol, Provider};
use crate::error::DmaError;
use dma_libfabric_sys as sys;

impl LibfabricEndpoint {
    /// Open an endpoint with the first of `configuration.providers` that gives a
    /// reliable-datagram endpoint, on `node` (or `configuration.bind` when `node` is `None`).
    ///
    /// # Errors
    /// [`DmaError::NoProvider`], naming each provider tried and why it was turned down, when none
    /// works: no such provider here, or one that asks for what the endpoint cannot honour yet
    /// (efa-direct and shm are refused: see [`LibfabricEndpoint`]); [`DmaError::Fabric`] when a later
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
    /// Memory: the configuration's rxm buffer sizes cost an endpoint a fraction of what rxm's own
    /// do (`docs/providers.md`, "Endpoint sizing"); a process's first open applies them only if
    /// it has one thread, and warns otherwise (see
    /// [`apply_rxm_environment`](Configuration::apply_rxm_environment)).
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

    /// Open an endpoint with `provider` alone, step by step: ask `fi_getinfo` and check what it
    /// offers ([`choose`]), open the fabric, domain and address vector, the completion queues and
    /// the endpoint, put the endpoint together ([`Self::assemble`]), and post its receives.
    ///
    /// Every check runs before the first object opens; `handles` owns each object as it opens,
    /// so an error part-way closes exactly what was opened.
    fn open_with(
        configuration: &Configuration,
        provider: Provider,
        node: Option<&CStr>,
    ) -> Result<Self, DmaError> {
        let mut handles = Handles::new();
        let description = choose(&mut handles, configuration, provider, node)?;
        // Before any libfabric object opens: memory that cannot be had is an error, not an abort.
        let receives =
            ReceiveSlots::new(configuration.receive_buffers, configuration.receive_size)?;
        let controls = ReceiveSlots::new(control_receives(configuration), CONTROL_SIZE)?;
        // SAFETY: `choose` left in `handles.info` the non-null list fi_getinfo returned, and
        // nothing is open yet; each step opens, into `handles`, what the next one needs.
        let queues = unsafe {
            open_fabric_domain_and_av(&mut handles, configuration)?;
            let queues =
                open_completion_queues(&mut handles, configuration, &description.provider)?;
            open_endpoint(&mut handles)?;
            queues
        };
        // SAFETY: the three steps above opened every object in `handles`.
        let mut endpoint =
            unsafe { Self::assemble(configuration, handles, description, receives, queues) }?;
        endpoint.controls = controls;
        // rxm refuses connections between processes of other eager limits: the seal says this
        // one's, and the AV refuses a sealed address of another (`av::fabric`).
        let eager_limit = if endpoint.description.provider.ends_with("ofi_rxm") {
            crate::configuration::rxm_eager_limit()
        } else {
            0
        };
        endpoint.handed_out.expect_eager_limit(eager_limit);
        endpoint.credits = endpoint.open_credits(configuration, eager_limit)?;
        endpoint.post_receives()?;
        tracing::debug!(provider = %endpoint.description.provider, fabric = %endpoint.description.fabric, "endpoint open");
        Ok(endpoint)
    }

    /// Put the endpoint together around its open objects: the completion queues' wait source,
    /// the send slots (as many as the transmit queue and its completion queue hold), the RMA
    /// operations, and the address cache over the address vector.
    ///
    /// # Safety
    /// `handles` holds the list `fi_getinfo` returned and every object open, as
    /// [`open_fabric_domain_and_av`], [`open_completion_queues`] (which returned `queues`) and
    /// [`open_endpoint`] leave them.
    unsafe fn assemble(
        configuration: &Configuration,
        handles: Handles,
        mut description: Description,
        receives: ReceiveSlots,
        queues: CompletionQueues,
    ) -> Result<Self, DmaError> {
        let info = handles.info;
        // SAFETY: the fabric and both queues are open, with the wait object asked, and stay
        // open for as long as the slab that keeps the source (the slab is dropped after the
        // handles close, and used only while the endpoint lives).
        let source = unsafe { wait_source(&handles, queues.wait_obj) };
        // Unregistered in `Drop`, before `handles` closes the AV.
        let handed_out = av::register(handles.av, configuration.av_capacity);
        // As many sends in flight as the transmit queue and its completion queue hold.
        // SAFETY: `info` is the list head fi_getinfo returned, alive as long as `handles`.
        let tx_size = unsafe { (*(*info).tx_attr).size };
        let sends = Sends::new(
            tx_size.min(queues.size),
            configuration.receive_size,
            configuration.av_capacity,
            configuration.max_operations_per_peer,
            Arc::clone(&handed_out),
        )?;
        description.max_send_size = sends.size();
        description.max_sends_in_flight = sends.capacity();
        description.max_sends_in_flight_per_peer = sends.peer_limit();
        description.max_operations_per_peer = sends.budget.limit();
        // SAFETY: `info` is the list head fi_getinfo returned, alive as long as `handles`.
        let mut operations = Box::new(unsafe {
            super::engine::Operations::new(
                info,
                configuration.rma,
                queues.size,
                source,
                sends,
                Arc::clone(&handed_out),
            )
        });
        operations.write_flags = configuration.write_completion.flags();
        let backend = FabricAv::new(
            handles.av,
            description.addr_format,
            description.address_len,
            configuration.av_capacity,
            Arc::clone(&handed_out),
        );
        Ok(Self {
            peers: ManuallyDrop::new(
                AddressCache::with_backend(backend).with_patience(configuration.cache_patience),
            ),
            handles,
            receives,
            controls: ReceiveSlots::new(0, 0)?,
            credits: None,
            description: Box::new(description),
            handed_out,
            #[cfg(test)]
            failing_posts: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(test)]
            posts_ask_to_retry: std::sync::atomic::AtomicBool::new(false),
            operations,
        })
    }

    /// Post every receive slot, each retried with progress for at most [`POST_PATIENCE`].
    fn post_receives(&self) -> Result<(), DmaError> {
        for index in 0..self.receives.len() {
            self.post_patiently(index)?;
        }
        for index in 0..self.controls.len() {
            self.post_control(index)?;
        }
        Ok(())
    }

    /// The credit protocol's state for a credited endpoint (a fresh secret, the endpoint's own
    /// address for its introductions, sealed with the secret and `eager_limit`, the process's
    /// rxm eager limit or 0), `None` for a plain one.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for an address longer than an introduction carries;
    /// what [`local_address`](Self::local_address) answers.
    fn open_credits(
        &self,
        configuration: &Configuration,
        eager_limit: u32,
    ) -> Result<Option<Box<credits::Credits>>, DmaError> {
        if PeerProtocol::Plain == configuration.peer_protocol {
            return Ok(None);
        }
        let secret = fresh_secret();
        let seal = crate::address::Seal {
            secret,
            eager_limit,
        };
        let address = crate::address::seal(&self.provider_name()?, seal);
        if address.len() > credits::wire::MAX_ADDRESS {
            return Err(DmaError::InvalidArgument(format!(
                "the provider's addresses are {} bytes, longer than the {} an introduction of \
                 the credit protocol carries: open with PeerProtocol::Plain",
                address.len(),
                credits::wire::MAX_ADDRESS
            )));
        }
        Ok(Some(Box::new(credits::Credits::new(
            secret & crate::address::SEALED_SECRET_MASK,
            address,
            configuration.receive_window,
            configuration.receive_memory_limit,
            configuration.cq_size,
        ))))
    }
}

/// How many control receives `configuration` keeps posted besides its receive buffers.
fn control_receives(configuration: &Configuration) -> usize {
    match configuration.peer_protocol {
        PeerProtocol::Credited => credits::CONTROL_RECEIVES,
        PeerProtocol::Plain => 0,
    }
}

/// A secret for a new endpoint: `std`'s `RandomState` (keys drawn from the operating system's
/// random source) hashing the time and the process, so two endpoints, in one process or two,
/// draw different ones.
fn fresh_secret() -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    std::time::SystemTime::now().hash(&mut hasher);
    std::process::id().hash(&mut hasher);
    hasher.finish()
}

/// Ask `fi_getinfo` for `provider` and check what it offers against `configuration`, before any
/// libfabric object opens: the list it returns goes into `handles.info` (freed with `handles` on
/// any error), and the chosen provider's description comes back.
///
/// # Errors
/// [`DmaError::InvalidArgument`] for a size past the provider's bounds;
/// [`DmaError::Fabric`] (`fi_getinfo`, `-FI_ENODATA`) naming `FI_HMEM` and the provider when
/// only `Configuration::hmem` keeps it from offering an endpoint; what `configuration::no_data` says when nothing is
/// offered otherwise; [`DmaError::Unsupported`] for a
/// provider the endpoint refuses ([`refusal`]); what `configuration::check_chosen` says of the
/// provider `fi_getinfo` chose.
fn choose(
    handles: &mut Handles,
    configuration: &Configuration,
    provider: Provider,
    node: Option<&CStr>,
) -> Result<Description, DmaError> {
    let Some(info) = getinfo_sized(configuration, provider, node, QueueSizes::of(configuration))?
    else {
        return Err(size_misfit(configuration, provider, node)
            .or_else(|| hmem_misfit(configuration, provider, node))
            .unwrap_or_else(|| crate::configuration::no_data(provider)));
    };
    handles.info = info;
    // SAFETY: `info` is the non-null list head fi_getinfo returned; its attribute pointers are
    // filled in by the provider for every entry.
    let (description, demands, limits) =
        unsafe { (describe(info), Demands::of(info), Limits::of(info)) };
    if let Some(reason) = limits.misfit(configuration, &description.provider) {
        return Err(DmaError::InvalidArgument(reason));
    }
    if let Some(reason) = refusal(provider, &demands) {
        return Err(DmaError::Unsupported(reason));
    }
    crate::configuration::check_chosen(provider, &description.provider)?;
    Ok(description)
}

/// Open the fabric, the domain and the address vector (a table of `av_capacity` entries) into
/// `handles`.
///
/// # Safety
/// `handles.info` is the non-null list `fi_getinfo` returned, and nothing in `handles` is open.
unsafe fn open_fabric_domain_and_av(
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
struct CompletionQueues {
    /// `fi_cq_attr.size` after the queues opened.
    size: usize,
    /// `fi_cq_attr.wait_obj`: `FI_WAIT_NONE` when the queues are polled.
    wait_obj: sys::fi_wait_obj,
}

/// Open the transmit and receive completion queues into `handles`: queues that sleep where the
/// provider offers it (see `wait`); else, or if the provider refuses the wait object after all,
/// queues that are polled.
///
/// # Safety
/// `handles.domain` is open ([`open_fabric_domain_and_av`]), and no queue is open yet.
unsafe fn open_completion_queues(
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
unsafe fn open_endpoint(handles: &mut Handles) -> Result<(), DmaError> {
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
unsafe fn wait_source(handles: &Handles, wait_obj: sys::fi_wait_obj) -> Option<Source> {
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
        let controls = control_receives(configuration);
        if configuration.receive_buffers + controls > self.rx_size {
            return Some(format!(
                "receive_buffers is {}, and {provider} posts at most {} receives (rx_attr.size), \
                 {controls} of them the credit protocol's: lower \
                 Configuration::receive_buffers to {} or less",
                configuration.receive_buffers,
                self.rx_size,
                self.rx_size.saturating_sub(controls)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

    use super::getinfo::Hints;
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
            peer_protocol: PeerProtocol::Plain,
            ..Configuration::default()
        };
        assert_eq!(None, limits.misfit(&fits, "efa"));
        // A credited endpoint keeps its control receives posted besides.
        let credited = Configuration {
            peer_protocol: PeerProtocol::Credited,
            ..fits.clone()
        };
        let reason = limits.misfit(&credited, "efa").expect("refused");
        assert!(reason.contains("2040 or less"), "{reason}");
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

    /// `choose` makes its checks before any object opens: what it accepts opens nothing, and
    /// what it refuses leaves only the `fi_getinfo` list in the handles, which free it.
    #[test]
    fn choosing_a_provider_opens_nothing() {
        let nothing_open = |handles: &Handles| {
            [
                handles.fabric.is_null(),
                handles.domain.is_null(),
                handles.av.is_null(),
                handles.tx_cq.is_null(),
                handles.rx_cq.is_null(),
                handles.ep.is_null(),
            ] == [true; 6]
        };
        let node = Some(c"127.0.0.1");
        let mut handles = Handles::new();
        let description = choose(&mut handles, &Configuration::default(), Provider::Tcp, node)
            .expect("tcp is offered on 127.0.0.1");
        assert_eq!("tcp;ofi_rxm", description.provider);
        assert!(!handles.info.is_null());
        assert!(nothing_open(&handles));

        let too_many = Configuration {
            receive_buffers: 1 << 16,
            ..Configuration::default()
        };
        let mut handles = Handles::new();
        let Err(DmaError::InvalidArgument(reason)) =
            choose(&mut handles, &too_many, Provider::Tcp, node)
        else {
            panic!("more receive buffers than rx_attr.size");
        };
        assert!(reason.contains("65536"), "{reason}");
        assert!(!handles.info.is_null(), "the list is the handles' to free");
        assert!(nothing_open(&handles));
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
