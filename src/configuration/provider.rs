//! Which libfabric providers there are: [`Provider`], the names `fi_getinfo` knows them by, what
//! the runtime libfabric is ([`runtime_version`]) and has compiled in ([`compiled_providers`]),
//! and the errors `open` gives when a provider offers nothing ([`no_data`]) or something other
//! than it promises ([`check_chosen`]).
//!
//! Every `fi_info` list asked for here is freed here; nothing here opens a libfabric object.

use std::ffi::CStr;
use std::ptr;

use super::{Configuration, RxmSizing, before_getinfo};
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// A libfabric provider, by the name `fi_getinfo` knows it.
///
/// ```
/// use dma_libfabric::Provider;
///
/// assert_eq!("tcp;ofi_rxm", Provider::Tcp.name());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// TCP sockets under the RxM utility provider, which makes them reliable datagrams. Works on
    /// any host, loopback included.
    Tcp,
    /// libfabric 2.x's native tcp reliable-datagram endpoint (provider `tcp` alone, no RxM).
    /// libfabric 1.x's tcp has no RDM endpoint, so there this provider is turned down.
    TcpNative,
    /// AWS Elastic Fabric Adapter.
    Efa,
    /// AWS EFA's direct path (libfabric 2.x: fabric `efa-direct` of provider `efa`).
    EfaDirect,
    /// InfiniBand / RoCE verbs under RxM.
    Verbs,
    /// Shared memory, for peers on one host.
    Shm,
    /// The legacy sockets provider.
    Sockets,
    /// UDP under the RxD utility provider.
    Udp,
}

impl Provider {
    /// The provider name handed to `fi_getinfo` (`fabric_attr.prov_name`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp;ofi_rxm",
            Self::TcpNative => "tcp",
            Self::Efa | Self::EfaDirect => "efa",
            Self::Verbs => "verbs;ofi_rxm",
            Self::Shm => "shm",
            Self::Sockets => "sockets",
            Self::Udp => "udp;ofi_rxd",
        }
    }

    /// The fabric name to ask for, where the provider offers several.
    pub fn fabric(self) -> Option<&'static str> {
        match self {
            Self::EfaDirect => Some("efa-direct"),
            _ => None,
        }
    }
}

impl std::fmt::Display for Provider {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.fabric() {
            Some(fabric) => write!(formatter, "{} ({fabric})", self.name()),
            None => formatter.write_str(self.name()),
        }
    }
}

/// The runtime libfabric's API version as `(major, minor)`: `fi_version()` of the library this
/// process loaded, which may differ from the headers it was built against.
///
/// ```
/// let (major, _minor) = dma_libfabric::runtime_version();
/// assert!(major >= 1);
/// ```
pub fn runtime_version() -> (u32, u32) {
    // SAFETY: fi_version takes nothing, touches no state and returns a number.
    let version = unsafe { sys::fi_version() };
    (version >> 16, version & 0xffff)
}

/// The providers compiled into the runtime libfabric, core and utility providers alike, by
/// the names `fi_getinfo` knows (`efa`, `tcp`, `ofi_rxm`, ...): what `fi_info -l` lists. A
/// provider listed here may still offer no endpoint on this host (efa without a device).
///
/// ```
/// let providers = dma_libfabric::compiled_providers()?;
/// assert!(providers.iter().any(|name| name == "tcp"));
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
///
/// # Errors
/// [`DmaError::Fabric`] when `fi_getinfo` fails.
pub fn compiled_providers() -> Result<Vec<String>, DmaError> {
    before_getinfo(&Configuration::default());
    let mut info: *mut sys::fi_info = ptr::null_mut();
    // SAFETY: no node, service or hints; fi_getinfo writes one list head into `info`, freed
    // below. FI_PROV_ATTR_ONLY asks for one entry per provider with its fabric attributes.
    let code = unsafe {
        sys::fi_getinfo(
            sys::dmafab_version(),
            ptr::null(),
            ptr::null(),
            sys::FI_PROV_ATTR_ONLY,
            ptr::null(),
            &raw mut info,
        )
    };
    if 0 != code {
        return Err(DmaError::fabric("fi_getinfo", code.into()));
    }
    let mut names = Vec::new();
    let mut entry = info;
    while !entry.is_null() {
        // SAFETY: every entry of the list fi_getinfo returned is valid until fi_freeinfo; its
        // fabric_attr and prov_name are null or valid, the name NUL-terminated.
        unsafe {
            let fabric = (*entry).fabric_attr;
            if !fabric.is_null() && !(*fabric).prov_name.is_null() {
                let name = CStr::from_ptr((*fabric).prov_name).to_string_lossy();
                if !names.iter().any(|known| *known == name) {
                    names.push(name.into_owned());
                }
            }
            entry = (*entry).next;
        }
    }
    // SAFETY: the list fi_getinfo returned, freed once, after its last use above.
    unsafe { sys::fi_freeinfo(info) };
    Ok(names)
}

/// Turn down what `fi_getinfo` chose when it is not what `provider` promises: asked for `tcp`
/// alone, libfabric 1.x layers rxm over it by itself, since its tcp has no reliable-datagram
/// endpoint of its own.
pub(crate) fn check_chosen(provider: Provider, chosen: &str) -> Result<(), DmaError> {
    if provider == Provider::TcpNative && chosen != provider.name() {
        let (major, minor) = runtime_version();
        return Err(DmaError::Fabric {
            call: "fi_getinfo",
            code: -i64::from(sys::FI_ENODATA),
            message: format!(
                "libfabric {major}.{minor}'s tcp has no reliable-datagram endpoint of its own \
                 (fi_getinfo offered {chosen}): use Provider::Tcp"
            ),
        });
    }
    Ok(())
}

/// The error for a `fi_getinfo` of `provider` that found nothing (`-FI_ENODATA`), saying why as
/// far as libfabric lets us see: a provider that is not compiled in, or one that is but offers
/// no matching endpoint here (no device, or no reliable-datagram endpoint in this version).
pub(crate) fn no_data(provider: Provider) -> DmaError {
    let code = -i64::from(sys::FI_ENODATA);
    let (major, minor) = runtime_version();
    let compiled = compiled_providers().unwrap_or_default();
    let missing: Vec<&str> = provider
        .name()
        .split(';')
        .filter(|name| !compiled.iter().any(|known| known == name))
        .collect();
    let why = if !missing.is_empty() {
        format!(
            "{} not compiled into this libfabric {major}.{minor} (fi_info -l lists {})",
            missing.join(" and "),
            compiled.join(" ")
        )
    } else {
        let rxm = matches!(provider, Provider::Tcp | Provider::Verbs)
            .then(RxmSizing::environment_misfit)
            .flatten()
            .map(|reason| format!(" ({reason})"));
        let hint = match provider {
            Provider::Efa | Provider::EfaDirect => " (no efa device on this host?)",
            Provider::TcpNative if major < 2 => {
                " (libfabric 1.x's tcp has no reliable-datagram endpoint: use Provider::Tcp)"
            }
            _ => rxm.as_deref().unwrap_or(""),
        };
        format!(
            "{} is compiled into libfabric {major}.{minor} but offers no thread-safe \
             reliable-datagram endpoint here{hint}",
            provider.name()
        )
    };
    DmaError::Fabric {
        call: "fi_getinfo",
        code,
        message: format!("{}: {why}", crate::error::strerror(code)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

    use super::*;

    #[test]
    fn the_runtime_version_is_at_least_the_oldest_supported() {
        let (major, minor) = runtime_version();
        assert!((major, minor) >= (1, 17), "{major}.{minor}");
    }
}
