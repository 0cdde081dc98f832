//! What a registry hands over (manifests, indexes, conversion and bound manifests,
//! referrers indexes, token answers, signature payloads) and the signature policy files
//! that judge it: every input is parsed by every reader, which must refuse or accept it
//! without panicking or allocating beyond its size; what binds must bind again the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oci::conversion;

fuzz_target!(|data: &[u8]| {
    for media_type in ["", oci::image::OCI_INDEX, oci::image::DOCKER_MANIFEST] {
        let _ = oci::image::parse(data, media_type);
        let _ = oci::artifact::image_of(data, media_type);
    }
    let _ = conversion::subject_of(data);
    let _ = conversion::layers_of(data);
    if let Ok(layers) = conversion::bound_layers(data) {
        // A manifest that binds every one of its layers binds to itself again: the
        // annotations read are the ones written.
        if let Ok(bound) = conversion::bind(data, &layers) {
            assert_eq!(conversion::bound_layers(&bound).as_ref(), Ok(&layers));
        }
    }
    let _ = conversion::bind_index(data, &[]);
    let _ = serde_json::from_slice::<oci::image::Index>(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = oci::registry::token_of_answer(text);
    }
    let _ = signatures::Payload::parse(data);
    let _ = signatures::Policy::from_bytes(data, "fuzz");
    let _ = signatures::RegistriesD::from_yaml(data);
});
