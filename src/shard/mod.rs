//! The pure mapping from namespaces to shards: namespace filter and consistent hash ring.
//!
//! No I/O and no async: everything here is a function of the inputs it is given.

mod names;
mod namespace_filter;
mod ring;
mod selector;

pub use names::{is_dns_label, is_dns_subdomain};
pub use namespace_filter::{NamespaceFilter, Selection};
pub use ring::{
    ALGORITHM, CELL_BITS, InvalidShards, MAX_FNV_SHARDS, MAX_SHARDS, Placement, Ring, VNODES, fnv1a_64, is_fingerprint,
};
pub use selector::{LabelSelector, ParseError};
