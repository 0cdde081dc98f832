//! layerstore: verilay as an additional layer store of containers/storage (podman's
//! `additionallayerstores` in storage.conf, the protocol stargz-store serves). `fs` is
//! the directory tree the overlay driver reads; `resolve` finds each layer's verilay image
//! through the OCI referrers of the image's manifest and mounts it, verified and lazy.

pub mod fs;
pub mod resolve;

pub use fs::StoreFs;
pub use resolve::{Layer, OciResolver, Resolver, STORE_THREADS};
