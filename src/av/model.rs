//! A model address vector: libfabric's `FI_AV_TABLE` semantics, and efa's address rules, without
//! a device.
//!
//! What the model does (lowest index first, use counts, efa's rules, violations) is on
//! [`ModelAv`], where a test author reads it. Its table sits behind a std mutex even under loom:
//! the model stands for libfabric, which the protocol does not get to model-check.

use super::AvBackend;
use crate::address::AddressFormat;
use crate::error::DmaError;
use std::sync::{Arc, Mutex};

use crate::sync::lock;
use dma_libfabric_sys::{self as sys, fi_addr_t};

/// One call the model AV saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AvEvent {
    /// `fi_av_insert` succeeded.
    Inserted {
        /// The index handed out.
        fi_addr: fi_addr_t,
        /// The address inserted.
        address: Vec<u8>,
    },
    /// `fi_av_remove` succeeded.
    Removed {
        /// The index removed.
        fi_addr: fi_addr_t,
        /// The address it held.
        address: Vec<u8>,
    },
}

#[derive(Debug)]
struct Entry {
    address: Vec<u8>,
    uses: u32,
}

#[derive(Debug)]
struct Table {
    format: AddressFormat,
    address_len: usize,
    capacity: usize,
    slots: Vec<Option<Entry>>,
    inserts: u64,
    removes: u64,
    events: Vec<AvEvent>,
    violations: Vec<String>,
    fail_next_insert: Option<DmaError>,
    fail_next_remove: Option<DmaError>,
    fail_removes: Option<DmaError>,
    panic_on_next_call: bool,
}

/// The model address vector: libfabric's `FI_AV_TABLE` semantics, and efa's address rules,
/// without a device (feature `model`).
///
/// The model hands out the lowest free index first, as `FI_AV_TABLE` does, so a removed index is
/// reused at once and ABA shows up exactly where it would on real hardware. It keeps a use count
/// per address for providers that count duplicate inserts (tcp), and none for efa, where one
/// remove frees an entry however many inserts there were. For the efa format it refuses a second
/// entry for one (GID, QPN), as efa-direct's reverse AV cannot hold one, and it records every
/// breach of the rules (a stale remove, a read past a short address, a grown table) as a
/// *violation* a test can assert is absent. A sealed address (the provider's length plus
/// [`SEAL_LEN`](crate::address::SEAL_LEN)) is inserted by its provider part, as `FabricAv` gives
/// `fi_av_insert` only that, and [`lookup`](Self::lookup) answers that part.
///
/// `ModelAv` is a cheap handle: clones share one table, so a test keeps a clone to inspect what the
/// writer thread did with the one it handed to
/// [`AddressCache::with_backend`](crate::cache::AddressCache::with_backend).
///
/// ```
/// use dma_libfabric::{AddressFormat, AvBackend, ModelAv};
///
/// let mut av = ModelAv::new(AddressFormat::Opaque);
/// let first = av.insert(&[1; 16])?;
/// let second = av.insert(&[2; 16])?;
/// av.remove(first)?;
/// assert_eq!(first, av.insert(&[3; 16])?, "the lowest free index goes first");
/// assert_ne!(first, second);
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ModelAv {
    table: Arc<Mutex<Table>>,
}

impl ModelAv {
    /// A model of `format` with that format's usual address length and a capacity of 4,096.
    pub fn new(format: AddressFormat) -> Self {
        Self::with_layout(format, format.default_len(), 4096)
    }

    /// A model with the given address length and capacity.
    pub fn with_layout(format: AddressFormat, address_len: usize, capacity: usize) -> Self {
        Self {
            table: Arc::new(Mutex::new(Table {
                format,
                address_len,
                capacity,
                slots: Vec::new(),
                inserts: 0,
                removes: 0,
                events: Vec::new(),
                violations: Vec::new(),
                fail_next_insert: None,
                fail_next_remove: None,
                fail_removes: None,
                panic_on_next_call: false,
            })),
        }
    }

    /// The address held at `fi_addr`, if that index is in use.
    pub fn lookup(&self, fi_addr: fi_addr_t) -> Option<Vec<u8>> {
        let table = lock(&self.table);
        let index = usize::try_from(fi_addr).ok()?;
        table
            .slots
            .get(index)?
            .as_ref()
            .map(|entry| entry.address.clone())
    }

    /// How many indexes are in use.
    pub fn len(&self) -> usize {
        lock(&self.table).slots.iter().flatten().count()
    }

    /// Whether no index is in use.
    pub fn is_empty(&self) -> bool {
        0 == self.len()
    }

    /// Successful inserts so far (duplicates included).
    pub fn inserts(&self) -> u64 {
        lock(&self.table).inserts
    }

    /// Successful removes so far.
    pub fn removes(&self) -> u64 {
        lock(&self.table).removes
    }

    /// Every successful call, in order.
    pub fn events(&self) -> Vec<AvEvent> {
        lock(&self.table).events.clone()
    }

    /// Every breach of the AV's rules so far; empty when the cache behaved.
    pub fn violations(&self) -> Vec<String> {
        lock(&self.table).violations.clone()
    }

    /// Make the next insert fail with `error`, as a full or broken provider would.
    pub fn fail_next_insert(&self, error: DmaError) {
        lock(&self.table).fail_next_insert = Some(error);
    }

    /// Make the next remove fail with `error` and leave its entry in place.
    pub fn fail_next_remove(&self, error: DmaError) {
        lock(&self.table).fail_next_remove = Some(error);
    }

    /// Make every remove fail with `error`, leaving its entry in place, until called with
    /// `None`: a provider whose `fi_av_remove` keeps failing.
    pub fn fail_removes(&self, error: Option<DmaError>) {
        lock(&self.table).fail_removes = error;
    }

    /// Make the next insert or remove panic, to stand for a writer thread that dies.
    pub fn panic_on_next_call(&self) {
        lock(&self.table).panic_on_next_call = true;
    }
}

impl Table {
    fn identity<'a>(&self, address: &'a [u8]) -> &'a [u8] {
        match self.format {
            AddressFormat::Efa => &address[..crate::address::EFA_IDENTITY_LEN.min(address.len())],
            AddressFormat::Opaque => address,
        }
    }

    fn check_panic(&mut self) {
        if std::mem::take(&mut self.panic_on_next_call) {
            // The model stands in for a writer that dies; a test asks for this on purpose.
            #[allow(clippy::panic)]
            {
                panic!("ModelAv: the writer was asked to die");
            }
        }
    }
}

fn invalid(call: &'static str) -> DmaError {
    DmaError::fabric(call, -i64::from(sys::FI_EINVAL))
}

impl AvBackend for ModelAv {
    fn format(&self) -> AddressFormat {
        lock(&self.table).format
    }

    fn address_len(&self) -> usize {
        lock(&self.table).address_len
    }

    fn capacity(&self) -> usize {
        lock(&self.table).capacity
    }

    fn insert(&mut self, address: &[u8]) -> Result<fi_addr_t, DmaError> {
        let mut table = lock(&self.table);
        table.check_panic();
        if let Some(error) = table.fail_next_insert.take() {
            return Err(error);
        }
        // A sealed address (the provider's, then `SEAL_LEN` bytes) is inserted as the real AV
        // is given it: the provider's part, all `fi_av_insert` reads.
        let sealed = table.address_len + crate::address::SEAL_LEN;
        if address.len() != table.address_len && address.len() != sealed {
            let breach = format!(
                "insert of a {}-byte address into a {}-byte AV reads past the buffer",
                address.len(),
                table.address_len
            );
            table.violations.push(breach);
            return Err(invalid("fi_av_insert"));
        }
        let address = &address[..table.address_len];
        if address.iter().all(|&byte| byte == 0) {
            let breach = "insert of an all-zero address, which the cache must refuse first";
            table.violations.push(breach.into());
            return Err(invalid("fi_av_insert"));
        }
        let identity = table.identity(address).to_vec();
        let existing = table.slots.iter().enumerate().find_map(|(index, slot)| {
            slot.as_ref()
                .filter(|entry| table.identity(&entry.address) == identity.as_slice())
                .map(|entry| (index, entry.address == address))
        });
        let index = match existing {
            Some((index, true)) => {
                if let (AddressFormat::Opaque, Some(Some(entry))) =
                    (table.format, table.slots.get_mut(index))
                {
                    entry.uses += 1;
                }
                index
            }
            Some((index, false)) => {
                let breach = format!(
                    "a second entry for one (GID, QPN): index {index} is held by another incarnation"
                );
                table.violations.push(breach);
                return Err(invalid("fi_av_insert"));
            }
            None => {
                let free = table.slots.iter().position(Option::is_none);
                let index = free.unwrap_or(table.slots.len());
                if index >= table.capacity {
                    let breach = format!("the table grew past its capacity of {}", table.capacity);
                    table.violations.push(breach);
                }
                let entry = Some(Entry {
                    address: address.to_vec(),
                    uses: 1,
                });
                match table.slots.get_mut(index) {
                    Some(slot) => *slot = entry,
                    None => table.slots.push(entry),
                }
                index
            }
        };
        let fi_addr = index as fi_addr_t;
        table.inserts += 1;
        table.events.push(AvEvent::Inserted {
            fi_addr,
            address: address.to_vec(),
        });
        Ok(fi_addr)
    }

    fn remove(&mut self, fi_addr: fi_addr_t) -> Result<(), DmaError> {
        let mut table = lock(&self.table);
        table.check_panic();
        if let Some(error) = table.fail_next_remove.take() {
            return Err(error);
        }
        if let Some(error) = &table.fail_removes {
            return Err(error.clone());
        }
        let format = table.format;
        let slot = usize::try_from(fi_addr)
            .ok()
            .and_then(|index| table.slots.get_mut(index))
            .filter(|slot| slot.is_some());
        let Some(slot) = slot else {
            table
                .violations
                .push(format!("remove of index {fi_addr}, which holds nothing"));
            return Err(invalid("fi_av_remove"));
        };
        let mut address = Vec::new();
        if let Some(entry) = slot {
            entry.uses = entry.uses.saturating_sub(1);
            address.clone_from(&entry.address);
            if AddressFormat::Efa == format || 0 == entry.uses {
                *slot = None;
            }
        }
        table.removes += 1;
        table.events.push(AvEvent::Removed { fi_addr, address });
        Ok(())
    }
}
