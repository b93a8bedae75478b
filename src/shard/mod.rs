//! The pure mapping from namespaces to shards: namespace filter and consistent hash ring.
//!
//! No I/O and no async: everything here is a function of the inputs it is given.

mod namespace_filter;
mod ring;
mod selector;

pub use namespace_filter::{NamespaceFilter, Selection};
pub use ring::{ALGORITHM, CELL_BITS, InvalidShards, MAX_FNV_SHARDS, MAX_SHARDS, Placement, Ring, VNODES, fnv1a_64};
pub use selector::{LabelSelector, ParseError};
