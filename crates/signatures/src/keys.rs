//! Sigstore keys as containers/image 5.23 reads them: public keys in PEM (`PUBLIC KEY`,
//! an X.509 SubjectPublicKeyInfo), signatures over SHA-256 of the payload (ECDSA in
//! ASN.1 DER; Ed25519 over the payload itself), and private keys in cosign's encrypted
//! PEM: go-securesystemslib's `encrypted` JSON (scrypt N=32768 r=8 p=1, then NaCl
//! secretbox) around a PKCS#8 DER key.

use base64::Engine as _;
use crypto_secretbox::aead::{Aead as _, KeyInit as _};
use p256::ecdsa::signature::hazmat::{PrehashSigner as _, PrehashVerifier as _};
use pkcs8::{DecodePrivateKey as _, EncodePrivateKey as _, EncodePublicKey as _};
use sha2::{Digest as _, Sha256};

/// Go's `base64.StdEncoding` as `encoding/json` and `encoding/pem` decode it: padding
/// required, stray bits in the last character ignored, line breaks skipped.
pub(crate) fn go_base64(s: &str) -> Result<Vec<u8>, base64::DecodeError> {
    const GO_STD: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireCanonical),
    );
    let clean: Vec<u8> = s.bytes().filter(|b| *b != b'\r' && *b != b'\n').collect();
    GO_STD.decode(clean)
}

/// A PEM block: its type and its bytes.
pub(crate) struct Pem {
    pub kind: String,
    pub bytes: Vec<u8>,
}

/// The first PEM block of `data`, found as Go's `pem.Decode` finds it: a `-----BEGIN
/// TYPE-----` line (at the start or after a newline), optional `Key: value` headers, a
/// base64 body, and `-----END TYPE-----`; text before and after is ignored, and a
/// malformed block is skipped for a later one.
pub(crate) fn pem_decode(data: &[u8]) -> Option<Pem> {
    const BEGIN: &[u8] = b"-----BEGIN ";
    const DASHES: &[u8] = b"-----";
    let mut rest = data;
    loop {
        // The next BEGIN at the start of a line.
        let at = if rest.starts_with(BEGIN) {
            0
        } else {
            find(rest, b"\n-----BEGIN ")? + 1
        };
        rest = &rest[at + BEGIN.len()..];
        let (type_line, after) = line(rest);
        let Some(kind) = type_line.strip_suffix(DASHES) else {
            continue;
        };
        let mut body = after;
        let mut headers = false;
        // Headers: `Key: value` lines before the body.
        loop {
            if body.is_empty() {
                return None;
            }
            let (l, next) = line(body);
            if !l.contains(&b':') {
                break;
            }
            headers = true;
            body = next;
        }
        let end_marker = [b"-----END ", kind, DASHES].concat();
        let (end, trailer_start) = if !headers && body.starts_with(&end_marker[..9]) {
            (0, 0)
        } else {
            match find(body, b"\n-----END ") {
                Some(i) => (i, i + 1),
                None => continue,
            }
        };
        let trailer = &body[trailer_start..];
        if !trailer.starts_with(&end_marker) {
            continue;
        }
        if !line(&trailer[end_marker.len()..]).0.is_empty() {
            continue;
        }
        let b64: Vec<u8> = body[..end]
            .iter()
            .copied()
            .filter(|b| !matches!(b, b' ' | b'\t'))
            .collect();
        let Ok(text) = std::str::from_utf8(&b64) else {
            continue;
        };
        let Ok(bytes) = go_base64(text) else {
            continue;
        };
        return Some(Pem {
            kind: String::from_utf8_lossy(kind).into_owned(),
            bytes,
        });
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Go's `getLine`: the line (without `\r\n`, trailing spaces and tabs) and the rest.
fn line(data: &[u8]) -> (&[u8], &[u8]) {
    let (mut l, rest) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[data.len()..]),
    };
    if let Some(x) = l.strip_suffix(b"\r") {
        l = x;
    }
    while let Some((last, init)) = l.split_last() {
        if *last == b' ' || *last == b'\t' {
            l = init;
        } else {
            break;
        }
    }
    (l, rest)
}

const OID_EC_PUBLIC_KEY: pkcs8::ObjectIdentifier =
    pkcs8::ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const OID_P256: pkcs8::ObjectIdentifier =
    pkcs8::ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
const OID_P384: pkcs8::ObjectIdentifier = pkcs8::ObjectIdentifier::new_unwrap("1.3.132.0.34");
const OID_ED25519: pkcs8::ObjectIdentifier = pkcs8::ObjectIdentifier::new_unwrap("1.3.101.112");
const OID_RSA: pkcs8::ObjectIdentifier =
    pkcs8::ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

/// A public key signatures are verified with.
#[derive(Debug, Clone)]
pub enum PublicKey {
    /// ECDSA on NIST P-256 (what cosign and [`generate_key`] make).
    P256(p256::ecdsa::VerifyingKey),
    /// ECDSA on NIST P-384 (signatures still over SHA-256, as sigstore makes them).
    P384(p384::ecdsa::VerifyingKey),
    /// Ed25519 (signatures over the payload itself).
    Ed25519(ed25519_dalek::VerifyingKey),
}

impl PublicKey {
    /// A PEM public key as sigstore's `UnmarshalPEMToPublicKey` reads it (the first PEM
    /// block, of type `PUBLIC KEY`): ECDSA P-256 or P-384 (uncompressed points, as Go's
    /// x509 takes them) or Ed25519. RSA and other curves are refused by name.
    pub fn from_pem(pem: &[u8]) -> Result<PublicKey, String> {
        let block = pem_decode(pem).ok_or("PEM decoding failed")?;
        match block.kind.as_str() {
            "PUBLIC KEY" => {}
            "RSA PUBLIC KEY" => return Err("RSA public keys are not supported by verilay".into()),
            other => {
                return Err(format!(
                    "unknown public key PEM type {other:?} (expected \"PUBLIC KEY\")"
                ))
            }
        }
        let spki = spki::SubjectPublicKeyInfoRef::try_from(block.bytes.as_slice())
            .map_err(|e| format!("public key: not an X.509 SubjectPublicKeyInfo: {e}"))?;
        let point = spki
            .subject_public_key
            .as_bytes()
            .ok_or("public key: its bit string is not whole bytes")?;
        let oid = spki.algorithm.oid;
        if oid == OID_EC_PUBLIC_KEY {
            let curve = spki
                .algorithm
                .parameters_oid()
                .map_err(|_| "public key: an EC key without a named curve")?;
            // Go's x509 takes uncompressed points only.
            if point.first() != Some(&4) {
                return Err("public key: not an uncompressed EC point".into());
            }
            if curve == OID_P256 {
                p256::ecdsa::VerifyingKey::from_sec1_bytes(point)
                    .map(PublicKey::P256)
                    .map_err(|_| "public key: not a P-256 point".into())
            } else if curve == OID_P384 {
                p384::ecdsa::VerifyingKey::from_sec1_bytes(point)
                    .map(PublicKey::P384)
                    .map_err(|_| "public key: not a P-384 point".into())
            } else {
                Err(format!("public key: EC curve {curve} is not supported by verilay (P-256 and P-384 are)"))
            }
        } else if oid == OID_ED25519 {
            if spki.algorithm.parameters.is_some() {
                return Err("public key: Ed25519 key encoded with illegal parameters".into());
            }
            let bytes: [u8; 32] = point
                .try_into()
                .map_err(|_| "public key: an Ed25519 key is 32 bytes")?;
            ed25519_dalek::VerifyingKey::from_bytes(&bytes)
                .map(PublicKey::Ed25519)
                .map_err(|_| "public key: not an Ed25519 point".into())
        } else if oid == OID_RSA {
            Err("RSA public keys are not supported by verilay".into())
        } else {
            Err(format!(
                "public key: algorithm {oid} is not supported by verilay"
            ))
        }
    }

    /// Whether `signature` (raw bytes) signs `payload`: ECDSA over SHA-256 of it (ASN.1
    /// DER, either S), Ed25519 over the payload itself, as sigstore's verifiers check.
    pub fn verify(&self, payload: &[u8], signature: &[u8]) -> Result<(), String> {
        let digest = Sha256::digest(payload);
        let bad = "cryptographic signature verification failed";
        match self {
            PublicKey::P256(k) => {
                let sig = p256::ecdsa::Signature::from_der(signature)
                    .map_err(|_| format!("{bad}: not an ASN.1 DER ECDSA signature"))?;
                k.verify_prehash(&digest, &sig)
                    .map_err(|_| format!("{bad}: invalid signature"))
            }
            PublicKey::P384(k) => {
                let sig = p384::ecdsa::Signature::from_der(signature)
                    .map_err(|_| format!("{bad}: not an ASN.1 DER ECDSA signature"))?;
                k.verify_prehash(&digest, &sig)
                    .map_err(|_| format!("{bad}: invalid signature"))
            }
            PublicKey::Ed25519(k) => {
                let sig = ed25519_dalek::Signature::from_slice(signature)
                    .map_err(|_| format!("{bad}: not an Ed25519 signature"))?;
                // Go's `ed25519.Verify` is RFC 8032's cofactorless check with a canonical
                // S: dalek's `verify` (`verify_strict` would also refuse weak keys).
                ed25519_dalek::Verifier::verify(k, payload, &sig)
                    .map_err(|_| format!("{bad}: invalid signature"))
            }
        }
    }

    /// The key as PEM (`PUBLIC KEY`).
    pub fn to_pem(&self) -> Vec<u8> {
        let der = match self {
            PublicKey::P256(k) => k.to_public_key_der(),
            PublicKey::P384(k) => k.to_public_key_der(),
            PublicKey::Ed25519(k) => k.to_public_key_der(),
        }
        .expect("a valid key encodes");
        pem_encode("PUBLIC KEY", der.as_bytes())
    }
}

/// `-----BEGIN KIND-----`, the base64 in lines of 64, `-----END KIND-----`.
pub(crate) fn pem_encode(kind: &str, der: &[u8]) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {kind}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {kind}-----\n"));
    out.into_bytes()
}

/// A private key signatures are made with.
pub(crate) enum PrivateKey {
    P256(p256::ecdsa::SigningKey),
    P384(p384::ecdsa::SigningKey),
    Ed25519(ed25519_dalek::SigningKey),
}

impl PrivateKey {
    /// The signature c/image would make: ECDSA over SHA-256 (DER), or Ed25519.
    pub(crate) fn sign(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        let digest = Sha256::digest(payload);
        match self {
            PrivateKey::P256(k) => {
                let sig: p256::ecdsa::Signature = k
                    .sign_prehash(&digest)
                    .map_err(|e| format!("signing: {e}"))?;
                Ok(sig.to_der().as_bytes().to_vec())
            }
            PrivateKey::P384(k) => {
                let sig: p384::ecdsa::Signature = k
                    .sign_prehash(&digest)
                    .map_err(|e| format!("signing: {e}"))?;
                Ok(sig.to_der().as_bytes().to_vec())
            }
            PrivateKey::Ed25519(k) => {
                use ed25519_dalek::Signer as _;
                Ok(k.sign(payload).to_bytes().to_vec())
            }
        }
    }

    fn from_pkcs8(der: &[u8]) -> Result<PrivateKey, String> {
        let info = pkcs8::PrivateKeyInfo::try_from(der)
            .map_err(|e| format!("parsing private key: not PKCS#8: {e}"))?;
        let oid = info.algorithm.oid;
        if oid == OID_EC_PUBLIC_KEY {
            let curve = info
                .algorithm
                .parameters_oid()
                .map_err(|_| "parsing private key: an EC key without a named curve")?;
            if curve == OID_P256 {
                p256::ecdsa::SigningKey::from_pkcs8_der(der)
                    .map(PrivateKey::P256)
                    .map_err(|e| format!("parsing private key: {e}"))
            } else if curve == OID_P384 {
                p384::ecdsa::SigningKey::from_pkcs8_der(der)
                    .map(PrivateKey::P384)
                    .map_err(|e| format!("parsing private key: {e}"))
            } else {
                Err(format!("private key: EC curve {curve} is not supported by verilay (P-256 and P-384 are)"))
            }
        } else if oid == OID_ED25519 {
            ed25519_dalek::SigningKey::from_pkcs8_der(der)
                .map(PrivateKey::Ed25519)
                .map_err(|e| format!("parsing private key: {e}"))
        } else if oid == OID_RSA {
            Err("RSA private keys are not supported by verilay".into())
        } else {
            Err(format!(
                "private key: algorithm {oid} is not supported by verilay"
            ))
        }
    }
}

/// The PEM type c/image 5.23 (skopeo 1.9, podman 4.3) reads and cosign wrote before
/// 2.0; newer tools write `ENCRYPTED SIGSTORE PRIVATE KEY`, read here as well.
pub(crate) const COSIGN_PRIVATE_KEY: &str = "ENCRYPTED COSIGN PRIVATE KEY";
const SIGSTORE_PRIVATE_KEY: &str = "ENCRYPTED SIGSTORE PRIVATE KEY";

// go-securesystemslib's `encrypted` parameters.
const SCRYPT_LOG_N: u8 = 15; // N = 32768
const SCRYPT_R: u32 = 8;
const SCRYPT_P: u32 = 1;
const SALT_LEN: usize = 32;
const NONCE_LEN: usize = 24;

#[derive(serde::Deserialize)]
struct Encrypted {
    kdf: Kdf,
    cipher: Cipher,
    ciphertext: String,
}

#[derive(serde::Deserialize)]
struct Kdf {
    name: String,
    params: KdfParams,
    salt: String,
}

#[derive(serde::Deserialize)]
#[allow(non_snake_case)]
struct KdfParams {
    N: i64,
    r: i64,
    p: i64,
}

#[derive(serde::Deserialize)]
struct Cipher {
    name: String,
    nonce: String,
}

/// Decrypts an encrypted cosign/sigstore private key.
pub(crate) fn load_private_key(pem: &[u8], passphrase: &[u8]) -> Result<PrivateKey, String> {
    let block = pem_decode(pem).ok_or("private key: invalid PEM block")?;
    if block.kind != COSIGN_PRIVATE_KEY && block.kind != SIGSTORE_PRIVATE_KEY {
        return Err(format!(
            "private key: unsupported PEM type {:?}",
            block.kind
        ));
    }
    let e: Encrypted = serde_json::from_slice(&block.bytes)
        .map_err(|e| format!("private key: not the encrypted key format: {e}"))?;
    if e.kdf.name != "scrypt" {
        return Err(format!("private key: unknown kdf name {:?}", e.kdf.name));
    }
    if e.cipher.name != "nacl/secretbox" {
        return Err(format!(
            "private key: unknown cipher name {:?}",
            e.cipher.name
        ));
    }
    if (e.kdf.params.N, e.kdf.params.r, e.kdf.params.p)
        != (1 << SCRYPT_LOG_N, SCRYPT_R as i64, SCRYPT_P as i64)
    {
        return Err("private key: unexpected kdf parameters".into());
    }
    let b64 = |s: &str, what: &str| {
        go_base64(s).map_err(|_| format!("private key: {what} is not base64"))
    };
    let salt = b64(&e.kdf.salt, "salt")?;
    let nonce = b64(&e.cipher.nonce, "nonce")?;
    let ciphertext = b64(&e.ciphertext, "ciphertext")?;
    if nonce.len() != NONCE_LEN {
        return Err("private key: incorrect nonce size".into());
    }
    let key = box_key(passphrase, &salt)?;
    let plain = crypto_secretbox::XSalsa20Poly1305::new(&key.into())
        .decrypt(nonce.as_slice().into(), ciphertext.as_slice())
        .map_err(|_| "private key: decryption failed (a wrong passphrase?)")?;
    PrivateKey::from_pkcs8(&plain)
}

fn box_key(passphrase: &[u8], salt: &[u8]) -> Result<[u8; 32], String> {
    let params = scrypt::Params::new(SCRYPT_LOG_N, SCRYPT_R, SCRYPT_P, 32)
        .map_err(|e| format!("scrypt: {e}"))?;
    let mut key = [0u8; 32];
    scrypt::scrypt(passphrase, salt, &params, &mut key).map_err(|e| format!("scrypt: {e}"))?;
    Ok(key)
}

/// A new ECDSA P-256 key pair: the private key encrypted with `passphrase` as cosign
/// does (PEM `ENCRYPTED COSIGN PRIVATE KEY`, which skopeo 1.9 and podman 4.3 read), and
/// the public key (PEM `PUBLIC KEY`).
pub fn generate_key(passphrase: &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut seed = [0u8; 32];
    let secret = loop {
        getrandom::getrandom(&mut seed).map_err(|e| format!("random bytes: {e}"))?;
        // A random 32 bytes is a valid scalar but with negligible probability.
        if let Ok(k) = p256::ecdsa::SigningKey::from_slice(&seed) {
            break k;
        }
    };
    let der = secret
        .to_pkcs8_der()
        .map_err(|e| format!("encoding the private key: {e}"))?;
    let private = encrypt_private_key(der.as_bytes(), passphrase)?;
    Ok((private, PublicKey::P256(*secret.verifying_key()).to_pem()))
}

/// A PKCS#8 DER private key (ECDSA P-256 or P-384, or Ed25519) encrypted with
/// `passphrase` in cosign's format (PEM `ENCRYPTED COSIGN PRIVATE KEY`: scrypt N=32768
/// r=8 p=1 with a random salt, then NaCl secretbox with a random nonce).
pub fn encrypt_private_key(pkcs8_der: &[u8], passphrase: &[u8]) -> Result<Vec<u8>, String> {
    PrivateKey::from_pkcs8(pkcs8_der)?;
    let mut salt = [0u8; SALT_LEN];
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::getrandom(&mut salt).map_err(|e| format!("random bytes: {e}"))?;
    getrandom::getrandom(&mut nonce).map_err(|e| format!("random bytes: {e}"))?;
    let key = box_key(passphrase, &salt)?;
    let ciphertext = crypto_secretbox::XSalsa20Poly1305::new(&key.into())
        .encrypt(&nonce.into(), pkcs8_der)
        .map_err(|_| "encrypting the private key failed")?;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    // go-securesystemslib's field order and spelling.
    let json = format!(
        r#"{{"kdf":{{"name":"scrypt","params":{{"N":{},"r":{SCRYPT_R},"p":{SCRYPT_P}}},"salt":"{}"}},"cipher":{{"name":"nacl/secretbox","nonce":"{}"}},"ciphertext":"{}"}}"#,
        1u32 << SCRYPT_LOG_N,
        b64(&salt),
        b64(&nonce),
        b64(&ciphertext)
    );
    Ok(pem_encode(COSIGN_PRIVATE_KEY, json.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_is_found_as_go_finds_it() {
        let der = b"\x01\x02\x03";
        let mut text = b"junk before\n".to_vec();
        text.extend(b"-----BEGIN BROKEN-----\nno end\n");
        text.extend(pem_encode("X", der));
        text.extend(b"after");
        let p = pem_decode(&text).unwrap();
        assert_eq!((p.kind.as_str(), p.bytes.as_slice()), ("X", &der[..]));
        let with_headers = b"-----BEGIN X-----\nProc-Type: 4\n\nAQID\n-----END X-----\n";
        assert_eq!(pem_decode(with_headers).unwrap().bytes, der);
        assert!(pem_decode(b"-----BEGIN X-----\nAQID\n-----END Y-----\n").is_none());
        assert!(pem_decode(b"-----BEGIN X-----\nAQID\n-----END X----- junk\n").is_none());
        assert!(pem_decode(b"x-----BEGIN X-----\nAQID\n-----END X-----\n").is_none());
        assert!(pem_decode(b"").is_none());
        assert!(pem_decode(b"-----BEGIN X-----").is_none());
    }

    #[test]
    fn every_supported_key_signs_and_verifies() {
        let payload = b"{\"critical\":{}}";
        let p256k = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
        let p384k = p384::ecdsa::SigningKey::from_slice(&[7u8; 48]).unwrap();
        let edk = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
        let pairs = [
            (
                PrivateKey::P256(p256k.clone()),
                PublicKey::P256(*p256k.verifying_key()),
            ),
            (
                PrivateKey::P384(p384k.clone()),
                PublicKey::P384(*p384k.verifying_key()),
            ),
            (
                PrivateKey::Ed25519(edk.clone()),
                PublicKey::Ed25519(edk.verifying_key()),
            ),
        ];
        for (private, public) in &pairs {
            let public = PublicKey::from_pem(&public.to_pem()).unwrap();
            let sig = private.sign(payload).unwrap();
            public.verify(payload, &sig).unwrap();
            assert!(public.verify(b"other", &sig).is_err());
            let mut bad = sig.clone();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            assert!(public.verify(payload, &bad).is_err());
            assert!(public.verify(payload, &[]).is_err());
        }
        // A P-256 signature over SHA-256 made independently of `sign` (the prehash).
        let sig: p256::ecdsa::Signature = {
            use p256::ecdsa::signature::Signer as _;
            p256k.sign(payload)
        };
        pairs[0].1.verify(payload, sig.to_der().as_bytes()).unwrap();
    }

    #[test]
    fn public_keys_go_refuses_are_refused() {
        let k = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
        let compressed = k.verifying_key().to_encoded_point(true);
        let spki = spki::SubjectPublicKeyInfoOwned {
            algorithm: spki::AlgorithmIdentifierOwned {
                oid: OID_EC_PUBLIC_KEY,
                parameters: Some((&OID_P256).into()),
            },
            subject_public_key: spki::der::asn1::BitString::from_bytes(compressed.as_bytes())
                .unwrap(),
        };
        let der = spki::der::Encode::to_der(&spki).unwrap();
        let err = PublicKey::from_pem(&pem_encode("PUBLIC KEY", &der)).unwrap_err();
        assert!(err.contains("uncompressed"), "{err}");
        let good = PublicKey::P256(*k.verifying_key()).to_pem();
        let text = String::from_utf8(good).unwrap();
        assert!(
            PublicKey::from_pem(text.replace("PUBLIC KEY", "EC PUBLIC KEY").as_bytes()).is_err()
        );
        assert!(
            PublicKey::from_pem(text.replace("PUBLIC KEY", "RSA PUBLIC KEY").as_bytes())
                .unwrap_err()
                .contains("RSA")
        );
        assert!(PublicKey::from_pem(b"garbage").is_err());
        let mut long = spki::der::Encode::to_der(
            &spki::SubjectPublicKeyInfoRef::try_from(
                pem_decode(text.as_bytes()).unwrap().bytes.as_slice(),
            )
            .unwrap(),
        )
        .unwrap();
        long.push(0);
        assert!(
            PublicKey::from_pem(&pem_encode("PUBLIC KEY", &long)).is_err(),
            "trailing data"
        );
    }

    #[test]
    fn generated_keys_decrypt_with_their_passphrase_only() {
        let (private, public) = generate_key(b"pass").unwrap();
        assert!(private.starts_with(b"-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----\n"));
        let k = load_private_key(&private, b"pass").unwrap();
        let public = PublicKey::from_pem(&public).unwrap();
        public.verify(b"x", &k.sign(b"x").unwrap()).unwrap();
        let err = load_private_key(&private, b"wrong").err().unwrap();
        assert!(err.contains("decryption failed"), "{err}");
        let renamed = String::from_utf8(private.clone())
            .unwrap()
            .replace("COSIGN", "SIGSTORE");
        assert!(load_private_key(renamed.as_bytes(), b"pass").is_ok());
        let other = String::from_utf8(private)
            .unwrap()
            .replace("COSIGN", "OTHER");
        assert!(load_private_key(other.as_bytes(), b"pass")
            .err()
            .unwrap()
            .contains("unsupported PEM type"));
        for junk in [&b""[..], b"-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----\ne30=\n-----END ENCRYPTED COSIGN PRIVATE KEY-----\n"] {
            assert!(load_private_key(junk, b"pass").is_err());
        }
        // Well-formed around a ciphertext shorter than secretbox's tag; other parameters.
        let nonce = base64::engine::general_purpose::STANDARD.encode([0u8; NONCE_LEN]);
        let json = |n: u32, ct: &str| {
            format!(
                r#"{{"kdf":{{"name":"scrypt","params":{{"N":{n},"r":8,"p":1}},"salt":"AAAA"}},"cipher":{{"name":"nacl/secretbox","nonce":"{nonce}"}},"ciphertext":"{ct}"}}"#
            )
        };
        for (text, want) in [
            (json(32768, "AAAA"), "decryption failed"),
            (json(32768, ""), "decryption failed"),
            (json(16384, "AAAA"), "unexpected kdf parameters"),
        ] {
            let pem = pem_encode(COSIGN_PRIVATE_KEY, text.as_bytes());
            let err = load_private_key(&pem, b"pass").err().unwrap();
            assert!(err.contains(want), "{err}");
        }
    }
}
