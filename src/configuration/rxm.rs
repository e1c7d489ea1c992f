//! rxm's buffer sizes ([`RxmSizing`]): what they are, their bounds, when they apply (on
//! `RxmSizing`), and the check of what the process's environment sets.

#[cfg(doc)] // for the docs' links
use super::Configuration;
use super::bounds::within;
use crate::error::DmaError;

/// rxm's buffer sizes, which libfabric reads only from `FI_OFI_RXM_*` environment variables at
/// provider initialisation (below, "When the sizing applies"). `None` leaves rxm's own default.
///
/// Read in libfabric 1.17 and 2.6.0's `prov/rxm/src/rxm_init.c`, and measured with
/// `examples/open_cost`. Over tcp, rxm by default shares one receive context among all of an
/// endpoint's connections, `msg_rx_size` deep, and its bounce-buffer pools grow in chunks of
/// 1,024 buffers of `buffer_size` bytes: those two set what an endpoint costs when it opens.
///
/// ```
/// use dma_libfabric::{Configuration, RxmSizing};
///
/// let sizing = RxmSizing::default();
/// assert_eq!(Some(4096), sizing.buffer_size);
/// let names: Vec<_> = Configuration::default().rxm_environment().into_iter().map(|(name, _)| name).collect();
/// assert!(names.contains(&"FI_OFI_RXM_BUFFER_SIZE"));
/// ```
///
/// # When the sizing applies
///
/// rxm's buffers cannot be chosen per endpoint: rxm reads them from `FI_OFI_RXM_*` environment
/// variables once, when libfabric initialises its providers (the process's first `fi_getinfo`),
/// and every later endpoint of the process uses them. rxm's own defaults (16 KiB bounce buffers,
/// pools of 1,024 of them for each direction) cost each endpoint tens of MB and tens of
/// milliseconds to open. `setenv` is not thread safe, so the library sets them only where that
/// is sound:
///
/// - the process's first open applies its configuration's sizing itself when the process has one
///   thread then (the caller's: no other thread can touch the environment meanwhile);
/// - otherwise it sets nothing, and logs a `warn` with the cost and the remedy: call
///   [`Configuration::apply_rxm_environment`] at the start of `main`, before any thread is
///   spawned and before the first endpoint opens, or set the variables
///   [`Configuration::rxm_environment`] lists in the environment the process is started with (a
///   launcher, a systemd unit).
///
/// A variable already present in the environment wins over the configuration. When the sizing
/// was not applied, [`LibfabricEndpoint::open`](crate::endpoint::LibfabricEndpoint::open) still
/// works, with rxm's defaults (and their cost).
///
/// # Peers of another size
///
/// rxm refuses a connection between processes whose `buffer_size` (its eager limit) differ, and
/// says so only in its own log. A credited endpoint's address says its process's eager limit
/// (in the seal, [`SEAL_LEN`](crate::address::SEAL_LEN)), and resolving a sealed address whose
/// limit differs from this process's answers [`DmaError::InvalidAddress`] at once, naming both
/// limits and the setting, before anything enters the address vector. A bare address (a plain
/// peer's) says nothing; a send to such a peer of another limit answers
/// [`DmaError::WouldBlock`] after its patience, its text naming the setting.
///
/// What the sizing buys: an endpoint that holds a fraction of the resident memory rxm's own sizes
/// cost, and opens several times faster (`examples/open_cost`; the table is in
/// `docs/providers.md`, "Endpoint sizing").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RxmSizing {
    /// `FI_OFI_RXM_BUFFER_SIZE`: the size of each bounce buffer, and so rxm's eager limit
    /// (larger messages go by rendezvous). rxm's default is 16,384; the default here, 4,096,
    /// matches [`Configuration::receive_size`].
    pub buffer_size: Option<usize>,
    /// `FI_OFI_RXM_TX_SIZE`: the transmit queue depth rxm gives when the hints ask for none
    /// (rxm's default 2,048; at most its maximum, 16,384). [`Configuration::tx_size`] asks per
    /// endpoint instead, up to that maximum. Default `None`: rxm's own.
    pub tx_size: Option<usize>,
    /// `FI_OFI_RXM_RX_SIZE`: the receive queue depth rxm gives when the hints ask for none
    /// (rxm's default 2,048; at most its maximum, 65,536). [`Configuration::rx_size`] asks per
    /// endpoint instead, up to that maximum. Default `None`: rxm's own.
    pub rx_size: Option<usize>,
    /// `FI_OFI_RXM_MSG_TX_SIZE`: the transmit depth of each connection rxm opens to a peer
    /// (rxm's default 128). Default `None`: rxm's own.
    pub msg_tx_size: Option<usize>,
    /// `FI_OFI_RXM_MSG_RX_SIZE`: the depth of the shared receive context that rxm over tcp
    /// uses by default for all its connections (rxm's default 4,096), or of each connection's
    /// own receive queue without one (rxm's default 128). The default here is 512: enough
    /// messages in flight for a server, with an eighth of the shared bounce buffers rxm's 4,096
    /// posts (figures: `docs/benchmarks.md`, "Figures moved out of the module docs").
    pub msg_rx_size: Option<usize>,
    /// `FI_OFI_RXM_USE_SRX`: whether connections share one receive context (rxm's default over
    /// tcp). Without it an endpoint opens faster and smaller (figures: `docs/benchmarks.md`,
    /// "Figures moved out of the module docs"), but every connection posts its own `msg_rx_size`
    /// bounce buffers (128 x 4 KiB = 512 KiB a peer), so a server with many peers keeps it.
    /// Default `None`: rxm's own.
    pub use_srx: Option<bool>,
}

impl Default for RxmSizing {
    fn default() -> Self {
        Self {
            buffer_size: Some(4096),
            tx_size: None,
            rx_size: None,
            msg_tx_size: None,
            msg_rx_size: Some(512),
            use_srx: None,
        }
    }
}

impl RxmSizing {
    /// The largest [`buffer_size`](Self::buffer_size): 64 KiB, four times rxm's default. rxm
    /// clamps anything past `INT32_MAX` silently, and its bounce-buffer pools grow in chunks of
    /// 1,024 buffers: 64 MiB a chunk at this size, and a 1 GiB buffer would ask a terabyte.
    /// Larger messages go by rxm's rendezvous protocol anyway.
    pub const MAX_BUFFER_SIZE: usize = 64 << 10;
    /// The largest [`tx_size`](Self::tx_size): rxm's maximum transmit depth (`RXM_TX_SIZE`,
    /// libfabric 1.17 and 2.6.0).
    pub const MAX_TX_SIZE: usize = 16_384;
    /// The largest [`rx_size`](Self::rx_size): rxm's maximum receive depth (`RXM_RX_SIZE`).
    pub const MAX_RX_SIZE: usize = 65_536;
    /// The largest [`msg_tx_size`](Self::msg_tx_size): the transmit depth tcp's connections
    /// offer (`tx_attr.size` of its message endpoint, 1,024 in 2.6.0's `xnet_attr.c`).
    pub const MAX_MSG_TX_SIZE: usize = 1024;
    /// The largest [`msg_rx_size`](Self::msg_rx_size) with a shared receive context (rxm's
    /// default over tcp): the depth of tcp's shared receive context (65,536). Without one
    /// (`use_srx: Some(false)`), each connection's receive queue holds at most
    /// [`MAX_MSG_TX_SIZE`](Self::MAX_MSG_TX_SIZE), 1,024.
    pub const MAX_MSG_RX_SIZE: usize = 65_536;

    /// Check each size against its bound (from 1 to the `MAX_*` constant of its name; `None`
    /// is rxm's default), naming the field, the value and the bound: a size rxm or tcp does not
    /// accept makes `fi_getinfo` find nothing, which `open` could only report as "no provider".
    ///
    /// ```
    /// use dma_libfabric::{Configuration, DmaError, RxmSizing};
    ///
    /// let mut configuration = Configuration::default();
    /// configuration.rxm.msg_rx_size = Some(usize::MAX);
    /// let Err(DmaError::InvalidArgument(reason)) = configuration.validate() else {
    ///     panic!("refused");
    /// };
    /// assert!(reason.contains("rxm.msg_rx_size") && reason.contains(&usize::MAX.to_string()));
    /// assert!(reason.contains(&RxmSizing::MAX_MSG_RX_SIZE.to_string()), "{reason}");
    /// ```
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for the first size out of its bounds.
    pub fn validate(&self) -> Result<(), DmaError> {
        let msg_rx_bound = if Some(false) == self.use_srx {
            (
                Self::MAX_MSG_TX_SIZE,
                "RxmSizing::MAX_MSG_TX_SIZE, without a shared receive context",
            )
        } else {
            (Self::MAX_MSG_RX_SIZE, "RxmSizing::MAX_MSG_RX_SIZE")
        };
        let sizes = [
            (
                "rxm.buffer_size",
                self.buffer_size,
                Self::MAX_BUFFER_SIZE,
                "RxmSizing::MAX_BUFFER_SIZE",
            ),
            (
                "rxm.tx_size",
                self.tx_size,
                Self::MAX_TX_SIZE,
                "RxmSizing::MAX_TX_SIZE",
            ),
            (
                "rxm.rx_size",
                self.rx_size,
                Self::MAX_RX_SIZE,
                "RxmSizing::MAX_RX_SIZE",
            ),
            (
                "rxm.msg_tx_size",
                self.msg_tx_size,
                Self::MAX_MSG_TX_SIZE,
                "RxmSizing::MAX_MSG_TX_SIZE",
            ),
            (
                "rxm.msg_rx_size",
                self.msg_rx_size,
                msg_rx_bound.0,
                msg_rx_bound.1,
            ),
        ];
        for (field, value, high, bound) in sizes {
            if let Some(value) = value {
                within(field, value, 1, high, bound).map_err(|error| match error {
                    DmaError::InvalidArgument(reason) => {
                        DmaError::InvalidArgument(format!("{reason}: None takes rxm's default"))
                    }
                    other => other,
                })?;
            }
        }
        Ok(())
    }

    /// What the process's environment sets (the sizes libfabric reads when it initialises),
    /// checked against the bounds: the reason a size there is refused, naming the variable and
    /// its value, if one is. For `open`'s error when `fi_getinfo` finds nothing.
    pub(crate) fn environment_misfit() -> Option<String> {
        let read = |name: &str| std::env::var(name).ok();
        let mut sizing = Self::provider_defaults();
        let fields: [(&str, &mut Option<usize>); 5] = [
            ("FI_OFI_RXM_BUFFER_SIZE", &mut sizing.buffer_size),
            ("FI_OFI_RXM_TX_SIZE", &mut sizing.tx_size),
            ("FI_OFI_RXM_RX_SIZE", &mut sizing.rx_size),
            ("FI_OFI_RXM_MSG_TX_SIZE", &mut sizing.msg_tx_size),
            ("FI_OFI_RXM_MSG_RX_SIZE", &mut sizing.msg_rx_size),
        ];
        for (name, field) in fields {
            if let Some(text) = read(name) {
                match text.trim().parse::<usize>() {
                    // 0 is rxm's default too.
                    Ok(0) => {}
                    Ok(value) => *field = Some(value),
                    Err(_) => {
                        return Some(format!("the environment sets {name}={text}, not a size"));
                    }
                }
            }
        }
        sizing.use_srx =
            read("FI_OFI_RXM_USE_SRX").map(|text| !matches!(text.trim(), "0" | "false" | "no"));
        let Err(DmaError::InvalidArgument(reason)) = sizing.validate() else {
            return None;
        };
        // Name the variable the process was started with, not the configuration's field.
        let reason = [
            ("rxm.buffer_size", "FI_OFI_RXM_BUFFER_SIZE"),
            ("rxm.tx_size", "FI_OFI_RXM_TX_SIZE"),
            ("rxm.rx_size", "FI_OFI_RXM_RX_SIZE"),
            ("rxm.msg_tx_size", "FI_OFI_RXM_MSG_TX_SIZE"),
            ("rxm.msg_rx_size", "FI_OFI_RXM_MSG_RX_SIZE"),
        ]
        .into_iter()
        .fold(reason, |reason, (field, variable)| {
            reason.replace(field, variable)
        })
        .replace("None takes rxm's default", "unset it for rxm's default");
        Some(format!("the environment is out of bounds: {reason}"))
    }

    /// rxm's eager limit as rxm reads it from this process's environment at its initialisation
    /// (`FI_OFI_RXM_BUFFER_SIZE`, rxm's default 16,384 when unset), or 0 where this cannot say
    /// what rxm makes of the text (not a decimal size from 256 to `i32::MAX`: rxm's `strtol`
    /// takes hex and signs, and clamps small and large values).
    pub(crate) fn eager_limit_in_environment() -> u32 {
        Self::eager_limit_of(std::env::var_os("FI_OFI_RXM_BUFFER_SIZE").as_deref())
    }

    /// [`eager_limit_in_environment`](Self::eager_limit_in_environment) of a variable that
    /// holds `variable`.
    fn eager_limit_of(variable: Option<&std::ffi::OsStr>) -> u32 {
        /// rxm's `rxm_buffer_size` when the variable is unset (libfabric 1.17 and 2.6.0).
        const RXM_DEFAULT_BUFFER_SIZE: u32 = 16_384;
        let Some(variable) = variable else {
            return RXM_DEFAULT_BUFFER_SIZE;
        };
        variable
            .to_str()
            .and_then(|text| text.trim().parse::<u32>().ok())
            .filter(|limit| (256..=i32::MAX.unsigned_abs()).contains(limit))
            .unwrap_or(0)
    }

    /// rxm's own defaults: no variable set.
    pub fn provider_defaults() -> Self {
        Self {
            buffer_size: None,
            tx_size: None,
            rx_size: None,
            msg_tx_size: None,
            msg_rx_size: None,
            use_srx: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RxmSizing;
    use std::ffi::OsStr;

    #[test]
    fn the_eager_limit_is_read_as_rxm_reads_it_or_not_at_all() {
        let of = |text: &str| RxmSizing::eager_limit_of(Some(OsStr::new(text)));
        assert_eq!(16_384, RxmSizing::eager_limit_of(None), "rxm's default");
        assert_eq!(4096, of("4096"));
        assert_eq!(4096, of(" 4096\n"));
        assert_eq!(2_147_483_647, of("2147483647"));
        // What rxm's strtol reads otherwise, or clamps: not known here.
        for unknown in [
            "0",
            "255",
            "0x1000",
            "-1",
            "2147483648",
            "4294967296",
            "",
            "4 KiB",
        ] {
            assert_eq!(0, of(unknown), "{unknown:?}");
        }
    }
}
