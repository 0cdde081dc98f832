//! layerstore: verilay as an additional layer store of containers/storage (podman's
//! `additionallayerstores` in storage.conf, the protocol stargz-store serves). `fs` is
//! the directory tree the overlay driver reads; `resolve` finds each layer's verilay image
//! through the OCI referrers of the image's manifest and mounts it, verified and lazy;
//! `served` records what was served for each layer, and `check` whether an image holds
//! the layer it was bound to, before podman may reuse it for another image.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod check;
pub mod fs;
pub mod resolve;
pub mod served;

pub use fs::StoreFs;
pub use resolve::{Found, Layer, OciResolver, Refused, Resolver, STORE_THREADS};
