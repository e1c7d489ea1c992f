//! What a registration is of: who may reach its memory ([`Exposure`]) and where the memory
//! lives ([`MemoryInterface`]), and whether a provider can register memory that lives there:
//! device memory only where `fi_getinfo` answered `FI_HMEM`, checked before any registration.

#[cfg(doc)] // for the docs' links
use crate::endpoint::LibfabricEndpoint;
#[cfg(doc)]
use crate::endpoint::memory::MemoryRegion;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// Who may reach a buffer registered with [`LibfabricEndpoint::register_buffer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exposure {
    /// Only this endpoint's own writes and reads, as their local side: no remote access flag,
    /// and no key a peer could use. Lends slices when no operation holds it, and gives the
    /// buffer back ([`MemoryRegion::into_buffer`]).
    Local,
    /// Peers may write into it and read from it with the key in
    /// [`remote`](MemoryRegion::remote): safe code gets only copies and atomic views
    /// ([`MemoryRegion::view`]), and the buffer is parked on drop until the endpoint closes
    /// ([`LibfabricEndpoint::rekey`] renews the key and keeps it instead).
    Remote,
}

/// Where a buffer's bytes live: libfabric's `fi_hmem_iface` and its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum MemoryInterface {
    /// Host memory, registered with `fi_mr_reg`.
    #[default]
    Host,
    /// Host memory registered through libfabric's heterogeneous-memory path (`fi_mr_regattr`
    /// with `FI_HMEM_SYSTEM`): what a device buffer takes, with host memory.
    System,
    /// NVIDIA GPU memory (`FI_HMEM_CUDA`) of CUDA device `device`.
    Cuda {
        /// The CUDA device ordinal.
        device: i32,
    },
    /// AMD GPU memory (`FI_HMEM_ROCR`).
    Rocr,
    /// Intel GPU memory (`FI_HMEM_ZE`) of `device`, as `fi_hmem_ze_device(driver, device)`
    /// encodes it.
    Ze {
        /// The encoded driver and device.
        device: i32,
    },
    /// AWS Trainium/Inferentia memory (`FI_HMEM_NEURON`) of `device`.
    Neuron {
        /// The Neuron device.
        device: i32,
    },
}

impl MemoryInterface {
    /// Whether host code may read and write the bytes ([`Host`](Self::Host),
    /// [`System`](Self::System)).
    pub fn is_host(self) -> bool {
        matches!(self, Self::Host | Self::System)
    }

    /// `fi_mr_attr`'s `iface` and `device` for `fi_mr_regattr`, or `None` for plain `fi_mr_reg`.
    pub(crate) fn hmem(self) -> Option<(sys::fi_hmem_iface, i32)> {
        match self {
            Self::Host => None,
            Self::System => Some((sys::FI_HMEM_SYSTEM, 0)),
            Self::Cuda { device } => Some((sys::FI_HMEM_CUDA, device)),
            Self::Rocr => Some((sys::FI_HMEM_ROCR, 0)),
            Self::Ze { device } => Some((sys::FI_HMEM_ZE, device)),
            Self::Neuron { device } => Some((sys::FI_HMEM_NEURON, device)),
        }
    }

    /// Whether a provider whose `fi_info` answered `caps` can register memory that lives here:
    /// host memory always (through `FI_HMEM_SYSTEM` too), device memory only with `FI_HMEM`.
    ///
    /// # Errors
    /// [`DmaError::Unsupported`] for device memory without `FI_HMEM` in `caps`, naming the
    /// interface, `provider` and the capabilities.
    pub(crate) fn check_offered(self, caps: u64, provider: &str) -> Result<(), DmaError> {
        if self.is_host() || 0 != caps & sys::FI_HMEM {
            return Ok(());
        }
        Err(DmaError::Unsupported(format!(
            "{self:?} memory needs FI_HMEM, and fi_getinfo answered {provider} with caps {caps:#x}, \
             without FI_HMEM ({:#x}): open the endpoint with Configuration::hmem on a provider \
             that offers it, or register host memory",
            sys::FI_HMEM
        )))
    }
}
