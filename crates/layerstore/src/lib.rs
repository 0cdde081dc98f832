//! layerstore: verilay as an additional layer store of containers/storage (podman's
//! `additionallayerstores`, as stargz-store serves it). `fs`: the tree the overlay driver
//! reads; `resolve`: each layer's image, bound by the manifest (or a signed referrer),
//! mounted verified and lazily; `served`, `check`: what was served, and whether a binding
//! holds its layer before podman may reuse it.

#![forbid(unsafe_code)]

pub mod check;
pub mod fs;
pub mod resolve;
pub mod served;

pub use fs::StoreFs;
pub use resolve::{Found, Layer, OciResolver, Refused, Resolver, STORE_THREADS};
pub use served::Verdict;
