//! The pure mapping from namespaces to shards: namespace filter and consistent hash ring.
//!
//! No I/O and no async: everything here is a function of the inputs it is given.

mod namespace_filter;
mod ring;
mod selector;

pub use namespace_filter::{NamespaceFilter, Selection};
pub use ring::{ALGORITHM, InvalidShards, MAX_SHARDS, Ring, VNODES};
pub use selector::{LabelSelector, ParseError};
