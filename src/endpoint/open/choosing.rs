//! Choosing a provider, before any libfabric object opens: `fi_getinfo` asked (with
//! `getinfo`'s hints), then what the provider it chose demands ([`Demands`]) and allows
//! ([`Limits`]) checked against the configuration. A provider this endpoint cannot honour is
//! refused with its reasons ([`refusal`]), a size past a provider's limit names the value and the
//! limit, and on every refusal the only thing held is the `fi_getinfo` list, which the handles
//! free.

use std::ffi::CStr;

use super::getinfo::{QueueSizes, getinfo_sized, hmem_misfit, size_misfit};
use crate::configuration::{Configuration, PeerProtocol, Provider};
use crate::endpoint::Description;
use crate::endpoint::credits;
use crate::endpoint::handles::Handles;
use crate::endpoint::lookup::describe;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// How many control receives `configuration` keeps posted besides its receive buffers.
pub(super) fn control_receives(configuration: &Configuration) -> usize {
    match configuration.peer_protocol {
        PeerProtocol::Credited => credits::CONTROL_RECEIVES,
        PeerProtocol::Plain => 0,
    }
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
pub(super) fn choose(
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

    use super::super::getinfo::Hints;
    use super::*;
    use crate::configuration::SendCompletion;

    /// What efa-direct demands (libfabric 2.6.0 `prov/efa/src/efa_prov_info.c`), which no device
    /// here can show: the hints ask for it, and `open` refuses it, naming it and why.
    #[test]
    fn efa_direct_is_asked_for_what_it_requires_and_refused_with_reasons() {
        let hints = Hints::for_provider(Provider::EfaDirect, SendCompletion::default());
        assert_eq!(
            0, hints.tx_op_flags,
            "efa is asked for no acknowledgement, whatever the configuration"
        );
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
        let hints = Hints::for_provider(Provider::Tcp, SendCompletion::default());
        for provider in [Provider::Tcp, Provider::TcpNative] {
            let acknowledged = Hints::for_provider(provider, SendCompletion::Acknowledged);
            let local = Hints::for_provider(provider, SendCompletion::Local);
            assert_eq!(
                u64::from(sys::FI_TRANSMIT_COMPLETE),
                acknowledged.tx_op_flags
            );
            assert_eq!(0, local.tx_op_flags);
        }
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
