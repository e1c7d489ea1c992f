//! The bounds of a [`Configuration`]: the crate's own ceilings on the address vector, the
//! completion queues, a receive buffer and the cache's patience, and
//! [`Configuration::validate`], which checks every size against them (and rxm's sizes against
//! theirs) before anything reaches libfabric or the allocator. What only the provider knows is
//! checked by `open` once `fi_getinfo` has answered.

use super::Configuration;
#[cfg(doc)] // for the docs' links
use super::RxmSizing;
use crate::error::DmaError;

impl Configuration {
    /// The most address-vector entries an endpoint may be opened for
    /// ([`av_capacity`](Self::av_capacity)): 2^20, 1,048,576 peers.
    ///
    /// `fi_info` gives no limit for an address vector's size, so this is a ceiling of the
    /// crate's own. Everything sized by the capacity is allocated up front, not as peers arrive:
    /// the cache's index and its lease counters at `open`, and libfabric 1.17's table of
    /// `count` entries (rounded up to a power of two) at the first insert, so an endpoint's
    /// resident memory after its first peer grows with the capacity (figures:
    /// `docs/benchmarks.md`, "Figures moved out of the module docs"); a capacity of
    /// `usize::MAX` panics in the index's allocation, 2^40 aborts on it, and above 2^63
    /// libfabric's power-of-two rounding wraps to 0. A million peers is more than one endpoint
    /// of a data-transfer server addresses on any fabric this crate targets.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, DmaError};
    ///
    /// let too_many = Configuration {
    ///     av_capacity: Configuration::MAX_AV_CAPACITY + 1,
    ///     ..Configuration::default()
    /// };
    /// assert!(matches!(too_many.validate(), Err(DmaError::InvalidArgument(_))));
    /// ```
    pub const MAX_AV_CAPACITY: usize = 1 << 20;

    /// The deepest completion queue an endpoint may ask for ([`cq_size`](Self::cq_size)): 2^22,
    /// 4,194,304 entries.
    ///
    /// `fi_info` gives no limit for a completion queue's depth (`domain_attr.cq_cnt` is how many
    /// queues, not how deep), and libfabric does not check the size it is given: its utility
    /// queue (tcp, rxm, and most software providers) allocates `size` rounded up to a power of
    /// two entries of 48 bytes with no overflow check, so a size above 2^58 wraps that product
    /// and one above 2^63 rounds to 0, and the queue then writes past a small allocation (sizes
    /// of `usize::MAX` and 2^63 + 1 opened an endpoint that later corrupted the heap; 2^60 and
    /// 2^63 crashed). 2^22 is the depth of the deepest hardware queues (ConnectX reports a
    /// `max_cqe` of 2^22 - 1), and costs libfabric's utility queue 192 MiB of address space for
    /// each of the endpoint's two queues, which the kernel backs only as entries are written.
    /// An endpoint never has more completions outstanding than its posted receives
    /// ([`receive_buffers`](Self::receive_buffers), at most the provider's `rx_attr.size`) and
    /// RMA operations ([`MAX_OPERATIONS`](crate::endpoint::MAX_OPERATIONS)) plus failed sends.
    ///
    /// ```
    /// use dma_libfabric::Configuration;
    ///
    /// let deepest = Configuration { cq_size: Configuration::MAX_CQ_SIZE, ..Configuration::default() };
    /// assert_eq!(Ok(()), deepest.validate());
    /// ```
    pub const MAX_CQ_SIZE: usize = 1 << 22;

    /// The largest receive buffer an endpoint may post ([`receive_size`](Self::receive_size)):
    /// 2^30 bytes, 1 GiB, unless the provider's own limit (`ep_attr.max_msg_size`) is lower.
    ///
    /// tcp;ofi_rxm reports a `max_msg_size` of `SIZE_MAX`, so this ceiling is the crate's own.
    /// Every one of the [`receive_buffers`](Self::receive_buffers) is allocated at `open` and
    /// stays posted for the endpoint's life, and [`receive`](crate::endpoint::LibfabricEndpoint::receive)
    /// copies each message into a fresh `Vec`: a message of more than a gibibyte is bulk data,
    /// which belongs to RMA ([`rma`](Self::rma)), not to a two-sided receive. The buffers are
    /// allocated fallibly: memory that cannot be had is an error from `open`, not an abort.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, DmaError};
    ///
    /// let huge = Configuration { receive_size: 1 << 40, ..Configuration::default() };
    /// let Err(DmaError::InvalidArgument(reason)) = huge.validate() else {
    ///     panic!("a receive buffer past the bound");
    /// };
    /// assert!(reason.contains("1099511627776") && reason.contains("1073741824"), "{reason}");
    /// ```
    pub const MAX_RECEIVE_SIZE: usize = 1 << 30;

    /// Check every size this configuration gives against its bounds, before anything reaches
    /// libfabric or the allocator; [`LibfabricEndpoint::open`](crate::endpoint::LibfabricEndpoint::open)
    /// calls it first. What only the provider knows (its `tx_attr.size`, `rx_attr.size` and
    /// `ep_attr.max_msg_size`) is checked by `open` once `fi_getinfo` has answered.
    ///
    /// The bounds: at least one provider; `av_capacity` from 1 to
    /// [`MAX_AV_CAPACITY`](Self::MAX_AV_CAPACITY); `receive_buffers` at least 1, and at most
    /// `cq_size` and `rx_size` (every posted receive may complete before the queue is read);
    /// `receive_size` from 1 to [`MAX_RECEIVE_SIZE`](Self::MAX_RECEIVE_SIZE); `cq_size` at most
    /// [`MAX_CQ_SIZE`](Self::MAX_CQ_SIZE); and rxm's sizes ([`RxmSizing::validate`]).
    ///
    /// ```
    /// use dma_libfabric::{Configuration, DmaError};
    ///
    /// assert_eq!(Ok(()), Configuration::default().validate());
    /// let huge = Configuration { cq_size: usize::MAX, ..Configuration::default() };
    /// let Err(DmaError::InvalidArgument(reason)) = huge.validate() else {
    ///     panic!("a queue deeper than the bound");
    /// };
    /// assert!(reason.contains(&usize::MAX.to_string()), "{reason}");
    /// assert!(reason.contains(&Configuration::MAX_CQ_SIZE.to_string()), "{reason}");
    /// ```
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] naming the first value out of bounds, the value and the
    /// bound.
    pub fn validate(&self) -> Result<(), DmaError> {
        if self.providers.is_empty() {
            return Err(DmaError::InvalidArgument("no providers configured".into()));
        }
        within(
            "av_capacity",
            self.av_capacity,
            1,
            Self::MAX_AV_CAPACITY,
            "Configuration::MAX_AV_CAPACITY",
        )?;
        within(
            "cq_size",
            self.cq_size,
            1,
            Self::MAX_CQ_SIZE,
            "Configuration::MAX_CQ_SIZE",
        )?;
        within(
            "receive_size",
            self.receive_size,
            1,
            Self::MAX_RECEIVE_SIZE,
            "Configuration::MAX_RECEIVE_SIZE",
        )?;
        if 0 == self.receive_buffers {
            return Err(DmaError::InvalidArgument(
                "receive_buffers is 0, below the bound of 1: an endpoint keeps at least one \
                 receive posted"
                    .into(),
            ));
        }
        if self.cq_size < self.receive_buffers
            || self.rx_size.is_some_and(|size| size < self.receive_buffers)
        {
            return Err(DmaError::InvalidArgument(format!(
                "receive_buffers is {}, and the queues must hold every posted receive: \
                 cq_size is {} and rx_size {:?}; raise them to at least {} (rx_size: None \
                 takes the provider's own depth)",
                self.receive_buffers, self.cq_size, self.rx_size, self.receive_buffers
            )));
        }
        if 0 == self.max_operations_per_peer {
            return Err(DmaError::InvalidArgument(
                "max_operations_per_peer is 0, below the bound of 1: a peer with no budget could \
                 never be sent to"
                    .into(),
            ));
        }
        if self.cache_patience > Self::MAX_CACHE_PATIENCE {
            return Err(DmaError::InvalidArgument(format!(
                "cache_patience is {:?}, above the bound of {:?} \
                 (Configuration::MAX_CACHE_PATIENCE)",
                self.cache_patience,
                Self::MAX_CACHE_PATIENCE
            )));
        }
        self.receive_window.validate()?;
        if self.receive_memory_limit < self.receive_window.cost() {
            return Err(DmaError::InvalidArgument(format!(
                "receive_memory_limit is {} bytes, below the {} one receive_window costs \
                 (ReceiveWindow::cost): no peer could be granted a whole window",
                self.receive_memory_limit,
                self.receive_window.cost()
            )));
        }
        self.rxm.validate()
    }

    /// The longest [`cache_patience`](Self::cache_patience) may be: an hour. A wait longer than
    /// that is a hung server, not a patient one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, DmaError};
    ///
    /// let endless = Configuration { cache_patience: Duration::MAX, ..Configuration::default() };
    /// assert!(matches!(endless.validate(), Err(DmaError::InvalidArgument(_))));
    /// ```
    pub const MAX_CACHE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3600);
}

/// `Ok` when `low <= value <= high`, else an error naming the field, its value and the bound
/// it crossed (`high` under the name `bound`).
pub(super) fn within(
    field: &str,
    value: usize,
    low: usize,
    high: usize,
    bound: &str,
) -> Result<(), DmaError> {
    if value < low {
        return Err(DmaError::InvalidArgument(format!(
            "{field} is {value}, below the bound of {low}"
        )));
    }
    if value > high {
        return Err(DmaError::InvalidArgument(format!(
            "{field} is {value}, above the bound of {high} ({bound})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

    use super::*;
    use crate::configuration::RxmSizing;

    /// `configuration` is accepted: a value at its bound is taken.
    fn accepted(configuration: Configuration) {
        assert_eq!(Ok(()), configuration.validate());
    }

    /// `configuration` is refused for `value`, past `bound`, with a reason naming both.
    fn refused(configuration: Configuration, value: usize, bound: usize) {
        match configuration.validate() {
            Err(DmaError::InvalidArgument(reason)) => {
                assert!(
                    reason.contains(&format!("is {value},")),
                    "{value} in {reason}"
                );
                assert!(
                    reason.contains(&format!("bound of {bound}")),
                    "{bound} in {reason}"
                );
            }
            other => panic!("expected InvalidArgument for {value}, got {other:?}"),
        }
    }

    /// Each of the endpoint's sizes refuses the value past its bound (above and below), naming
    /// both, and takes the value at it.
    #[test]
    fn every_endpoint_size_is_checked_against_its_bounds() {
        let base = Configuration::default;
        accepted(Configuration {
            av_capacity: Configuration::MAX_AV_CAPACITY,
            ..base()
        });
        refused(
            Configuration {
                av_capacity: Configuration::MAX_AV_CAPACITY + 1,
                ..base()
            },
            Configuration::MAX_AV_CAPACITY + 1,
            Configuration::MAX_AV_CAPACITY,
        );
        refused(
            Configuration {
                av_capacity: 0,
                ..base()
            },
            0,
            1,
        );
        accepted(Configuration {
            cq_size: Configuration::MAX_CQ_SIZE,
            ..base()
        });
        refused(
            Configuration {
                cq_size: usize::MAX,
                ..base()
            },
            usize::MAX,
            Configuration::MAX_CQ_SIZE,
        );
        accepted(Configuration {
            receive_size: Configuration::MAX_RECEIVE_SIZE,
            ..base()
        });
        refused(
            Configuration {
                receive_size: Configuration::MAX_RECEIVE_SIZE + 1,
                ..base()
            },
            Configuration::MAX_RECEIVE_SIZE + 1,
            Configuration::MAX_RECEIVE_SIZE,
        );
        refused(
            Configuration {
                receive_size: 0,
                ..base()
            },
            0,
            1,
        );
        refused(
            Configuration {
                receive_buffers: 0,
                ..base()
            },
            0,
            1,
        );
    }

    #[test]
    fn an_empty_provider_list_is_refused() {
        assert!(matches!(
            Configuration {
                providers: Vec::new(),
                ..Configuration::default()
            }
            .validate(),
            Err(DmaError::InvalidArgument(_))
        ));
    }

    /// Each of rxm's sizes refuses the value past its bound, naming both (`msg_rx_size` without
    /// the shared receive context is bound by `msg_tx_size`'s bound), and all take the value at
    /// their bound at once.
    #[test]
    fn every_rxm_size_is_checked_against_its_bounds() {
        let rxm = |sizing: RxmSizing| Configuration {
            rxm: sizing,
            ..Configuration::default()
        };
        let none = RxmSizing::provider_defaults;
        for (sizing, value, bound) in [
            (
                RxmSizing {
                    buffer_size: Some(usize::MAX),
                    ..none()
                },
                usize::MAX,
                RxmSizing::MAX_BUFFER_SIZE,
            ),
            (
                RxmSizing {
                    tx_size: Some(RxmSizing::MAX_TX_SIZE + 1),
                    ..none()
                },
                RxmSizing::MAX_TX_SIZE + 1,
                RxmSizing::MAX_TX_SIZE,
            ),
            (
                RxmSizing {
                    rx_size: Some(usize::MAX),
                    ..none()
                },
                usize::MAX,
                RxmSizing::MAX_RX_SIZE,
            ),
            (
                RxmSizing {
                    msg_tx_size: Some(1025),
                    ..none()
                },
                1025,
                RxmSizing::MAX_MSG_TX_SIZE,
            ),
            (
                RxmSizing {
                    msg_rx_size: Some(usize::MAX),
                    ..none()
                },
                usize::MAX,
                RxmSizing::MAX_MSG_RX_SIZE,
            ),
            (
                RxmSizing {
                    msg_rx_size: Some(2048),
                    use_srx: Some(false),
                    ..none()
                },
                2048,
                RxmSizing::MAX_MSG_TX_SIZE,
            ),
            (
                RxmSizing {
                    msg_tx_size: Some(0),
                    ..none()
                },
                0,
                1,
            ),
        ] {
            refused(rxm(sizing), value, bound);
        }
        accepted(rxm(RxmSizing {
            buffer_size: Some(RxmSizing::MAX_BUFFER_SIZE),
            tx_size: Some(RxmSizing::MAX_TX_SIZE),
            rx_size: Some(RxmSizing::MAX_RX_SIZE),
            msg_tx_size: Some(RxmSizing::MAX_MSG_TX_SIZE),
            msg_rx_size: Some(RxmSizing::MAX_MSG_RX_SIZE),
            use_srx: None,
        }));
    }

    #[test]
    fn more_receive_buffers_than_the_completion_queue_holds_are_refused() {
        assert!(matches!(
            Configuration { receive_buffers: 513, ..Configuration::default() }.validate(),
            Err(DmaError::InvalidArgument(reason)) if reason.contains("513") && reason.contains("cq_size is 512")
        ));
    }
}
