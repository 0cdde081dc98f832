//! A hostile layer tarball (plain, gzip or zstd) must give an error or a tree, never a
//! panic, hang or unbounded allocation; a tree it gives must build into an image (the
//! importer refuses what the image cannot hold, so the builder never has to).
#![no_main]

use erofs::builder::{build_tree, BuildOptions, Silent};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("tar_layer_fuzz.{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    if let Ok((tree, _)) = tarlayer::read_from(data, "fuzz", &dir, 64 << 20, &|_| {}) {
        let opts = BuildOptions {
            verity: false,
            ..Default::default()
        };
        if let Err(e) = build_tree(&tree, &opts, &dir.join("img"), &Silent) {
            panic!("a tree the importer accepted does not build: {e}");
        }
    }
});
