//! `signatures::check` against containers/image 5.23's own verification, the independent
//! oracle: images in a `docker-registry` on 127.0.0.1, signed by containers/image (with
//! keys `generate_key` made) and by `sign` + `attach`, checked under a table of policies
//! and registries.d configurations; every verdict must agree, and must be the one the case
//! expects (so a case that tests nothing shows).
//!
//! The oracles. Debian's skopeo 1.9.3 and podman 4.3.1 are built from a containers/image
//! 5.23.1 with sigstore patched out ("Debian-local change: sigstore disabled": every
//! sigstore signature is rejected, and none can be made), so the signing and verifying
//! oracle is `tests/cimage`: a few lines of Go doing what upstream skopeo 1.9's `copy`
//! does, with upstream containers/image 5.23.1 (from the Go module proxy, built here with
//! the `go` of the machine). Debian's skopeo is asked too: it must agree on every case
//! but those accepted on a signature, which it must refuse for having sigstore disabled
//! (so it still shows that it found the signature where registries.d says to look).

use signatures::{Policy, RegistriesD};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// `docker-registry serve` on 127.0.0.1 with a fresh storage directory, killed when
/// dropped (a copy of crates/verilay/tests/common/registry.rs's, without auth).
struct Registry {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Registry {
    fn start() -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {}/data\n\
                 http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while http_status(port, "/v2/").is_none() {
            assert!(Instant::now() < deadline, "the registry did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry { child, port, dir }
    }

    /// The stored blob file of `digest` (`sha256:HEX`).
    fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir.path().join(format!(
            "data/docker/registry/v2/blobs/sha256/{}/{hex}/data",
            &hex[..2]
        ))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(tool))
            .find(|f| f.is_file())
    })
}

fn require_tools() -> PathBuf {
    for tool in ["docker-registry", "skopeo"] {
        assert!(
            which(tool).is_some(),
            "{tool} is not installed: these tests need docker-registry and skopeo (run scripts/setup as root)"
        );
    }
    // Go is on every machine of this project's kind (/usr/local/go), if not on PATH.
    which("go")
        .or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|g| g.is_file()))
        .expect("go is not installed: the containers/image oracle (tests/cimage) is built with it")
}

/// The containers/image oracle, built once for all tests (Go's build cache makes a
/// rebuild take a second; the first build fetches its modules from the Go module proxy
/// and takes a minute).
fn oracle() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| build_oracle(&require_tools())).clone()
}

fn build_oracle(go: &Path) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cimage");
    run(Command::new(go)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cimage"))
        .args(["build", "-o"])
        .arg(&out)
        // No cgo (so no gpgme or btrfs headers), no containers-storage transport.
        .args([
            "-tags",
            "containers_image_openpgp containers_image_storage_stub exclude_graphdriver_btrfs exclude_graphdriver_devicemapper",
            ".",
        ])
        .env("CGO_ENABLED", "0")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=readonly"));
    out
}

fn sha256(bytes: &[u8]) -> String {
    oci::registry::sha256_digest(bytes)
}

/// A one-file ustar archive.
fn tar_of(name: &str, content: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let fields: [(usize, String); 5] = [
        (100, "0000644\0".into()),
        (108, "0000000\0".into()),
        (116, "0000000\0".into()),
        (124, format!("{:011o}\0", content.len())),
        (136, "00000000000\0".into()),
    ];
    for (at, v) in fields {
        h[at..at + v.len()].copy_from_slice(v.as_bytes());
    }
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| *b as u32).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(content);
    out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
    out
}

/// An OCI layout at `dir` holding one image (one layer with `content`) tagged `v1`.
fn oci_layout(dir: &Path, content: &[u8]) {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let d = sha256(bytes);
        std::fs::write(blobs.join(d.strip_prefix("sha256:").unwrap()), bytes).unwrap();
        d
    };
    let layer = tar_of("msg", content);
    let layer_digest = put(&layer);
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":["{layer_digest}"]}}}}"#
    );
    let config_digest = put(config.as_bytes());
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_digest}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{layer_digest}","size":{}}}]}}"#,
        config.len(),
        layer.len()
    );
    let manifest_digest = put(manifest.as_bytes());
    std::fs::write(
        dir.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{manifest_digest}","size":{},"annotations":{{"org.opencontainers.image.ref.name":"v1"}}}}]}}"#,
            manifest.len()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

struct Env {
    reg: Registry,
    /// The containers/image oracle.
    cimage: PathBuf,
    work: tempfile::TempDir,
    /// The registries.d that turns sigstore attachments on everywhere.
    on: PathBuf,
    pass: PathBuf,
    /// `key{N}.key` / `key{N}.pub` in `work`.
    keys: Vec<(PathBuf, PathBuf)>,
}

impl Env {
    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.reg.port)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.work.path().join(name)
    }

    /// A copy of `from` to `docker://HOST/to`: by skopeo, or signed with key `sign_with`
    /// (and `--sign-identity`) by the oracle, as upstream skopeo's `copy` signs.
    fn push(&self, from: &str, to: &str, sign_with: Option<usize>, identity: Option<&str>) {
        let mut c = match sign_with {
            None => {
                let mut c = Command::new("skopeo");
                c.args([
                    "copy",
                    "--quiet",
                    "--insecure-policy",
                    "--dest-tls-verify=false",
                ]);
                c
            }
            Some(_) => {
                let mut c = Command::new(&self.cimage);
                c.arg("copy");
                c
            }
        };
        c.arg("--registries.d").arg(&self.on);
        if let Some(k) = sign_with {
            c.arg("--sign-by-sigstore-private-key")
                .arg(&self.keys[k].0)
                .arg("--sign-passphrase-file")
                .arg(&self.pass);
        }
        if let Some(i) = identity {
            c.args(["--sign-identity", i]);
        }
        c.arg(from).arg(format!("docker://{}/{to}", self.host()));
        run(&mut c);
    }

    fn client(&self) -> oci::Registry {
        let r = oci::Reference::parse(&format!("{}/x", self.host())).unwrap();
        oci::Registry::connect(&r, true, Duration::from_secs(20)).unwrap()
    }

    /// The digest of the manifest at `repo:tag`.
    fn digest(&self, repo: &str, tag: &str) -> String {
        let (bytes, _) = self.client().get_manifest(repo, tag).unwrap();
        sha256(&bytes)
    }

    /// containers/image's verdict, and its reason.
    fn cimage_accepts(&self, image: &str, policy: &Path, regd: &Path) -> (bool, String) {
        let out = Command::new(&self.cimage)
            .arg("check")
            .arg("--policy")
            .arg(policy)
            .arg("--registries.d")
            .arg(regd)
            .arg(format!("docker://{image}"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "the oracle failed on {image}: {err}"
        );
        (out.status.success(), err.trim().to_string())
    }

    /// Debian's skopeo's verdict: whether `skopeo copy` of the image passes the policy.
    fn skopeo_accepts(&self, image: &str, policy: &Path, regd: &Path) -> (bool, String) {
        let dest = tempfile::tempdir().unwrap();
        let out = Command::new("skopeo")
            .args([
                "copy",
                "--quiet",
                "--src-tls-verify=false",
                "--remove-signatures",
            ])
            .arg("--policy")
            .arg(policy)
            .arg("--registries.d")
            .arg(regd)
            .arg(format!("docker://{image}"))
            .arg(format!("dir:{}", dest.path().display()))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        (
            out.status.success(),
            err.lines().last().unwrap_or("").to_string(),
        )
    }

    /// Our verdict, for the same image (fetching its manifest's digest as a caller does).
    fn we_accept(
        &self,
        image: &str,
        policy: &Path,
        regd: &Path,
    ) -> Result<signatures::Accepted, String> {
        let policy = Policy::from_file(policy)?;
        let regd = RegistriesD::from_dir(regd)?;
        let reference = oci::Reference::parse(image)?;
        let registry = oci::Registry::connect(&reference, true, Duration::from_secs(20))
            .map_err(|e| e.to_string())?;
        let (bytes, _) = registry
            .get_manifest(&reference.repository, reference.target_str())
            .map_err(|e| e.to_string())?;
        signatures::check(&policy, &regd, &registry, &reference, &sha256(&bytes))
    }
}

/// The JSON of a `sigstoreSigned` requirement for key `k`, with a signedIdentity.
fn sig(env: &Env, k: usize, identity: Option<&str>) -> String {
    let key = env.keys[k].1.display();
    match identity {
        Some(i) => format!(r#"{{"type":"sigstoreSigned","keyPath":"{key}","signedIdentity":{i}}}"#),
        None => format!(r#"{{"type":"sigstoreSigned","keyPath":"{key}"}}"#),
    }
}

const INSECURE: &str = r#"{"type":"insecureAcceptAnything"}"#;
const REJECT: &str = r#"{"type":"reject"}"#;

/// What a case expects both to say.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Want {
    /// Accepted on a verified signature.
    Signed,
    /// Accepted without one.
    Unsigned,
    /// Refused.
    Refused,
}

/// Policies c/image refuses to read are refused by `Policy` too, and those it reads are
/// read, but for GPG's `signedBy` where verilay would evaluate it (refused by design).
#[test]
fn policy_parsing_agrees_with_containers_image() {
    let cimage = oracle();
    let dir = tempfile::tempdir().unwrap();
    let r = r#"{"type":"reject"}"#;
    let sig = |rest: &str| format!(r#"{{"default":[{{"type":"sigstoreSigned"{rest}}}]}}"#);
    let si = |identity: &str| sig(&format!(r#","keyPath":"/k","signedIdentity":{identity}"#));
    let in_other = |req: &str| {
        format!(r#"{{"default":[{r}],"transports":{{"docker-daemon":{{"":[{req}]}}}}}}"#)
    };
    let gpg = r#"{"type":"signedBy","keyType":"GPGKeys","keyPath":"/k"}"#;
    let refused_by_both = [
        String::new(),
        "[]".into(),
        "{}".into(),
        r#"{"default":[]}"#.into(),
        r#"{"default":null}"#.into(),
        format!(r#"{{"default":[{r}],"extra":1}}"#),
        format!(r#"{{"default":[{r}],"default":[{r}]}}"#),
        format!(r#"{{"default":[{r}]}} x"#),
        r#"{"default":[{"type":"rejectt"}]}"#.into(),
        r#"{"default":[{"type":"reject","x":1}]}"#.into(),
        r#"{"default":[{}]}"#.into(),
        r#"{"default":["reject"]}"#.into(),
        format!(r#"{{"default":[{r}],"transports":null}}"#),
        format!(r#"{{"default":[{r}],"transports":{{"docker":{{"a":[]}}}}}}"#),
        format!(r#"{{"default":[{r}],"transports":{{"docker":{{"a":[{r}],"a":[{r}]}}}}}}"#),
        sig(""),
        sig(r#","keyPath":"/a","keyData":"""#),
        sig(r#","keyPath":1"#),
        sig(r#","keyData":"!!""#),
        sig(r#","keyPath":"/a","keyPaths":["/b"]"#),
        sig(r#","keyPath":"/a","fulcio":{}"#),
        sig(r#","keyPath":"/a","rekorPublicKeyPath":"/r""#),
        si("null"),
        si(r#"{"type":"matchExact","x":1}"#),
        si(r#"{"type":"exactReference","dockerReference":"a.io/x"}"#),
        si(r#"{"type":"exactReference"}"#),
        si(r#"{"type":"exactRepository","dockerRepository":"A"}"#),
        si(r#"{"type":"remapIdentity","prefix":"a.io/","signedPrefix":"b.io"}"#),
        si(r#"{"type":"remapIdentity","prefix":"a.io"}"#),
        si(r#"{"type":"nope"}"#),
        r#"{"default":[{"type":"signedBaseLayer"}]}"#.into(),
        in_other(r#"{"type":"signedBy","keyType":"nope","keyPath":"/k"}"#),
        in_other(r#"{"type":"signedBy","keyType":"GPGKeys"}"#),
        in_other(r#"{"type":"signedBy","keyType":"GPGKeys","keyPath":"/k","keyData":"AA=="}"#),
    ];
    let read_by_both = [
        sig(r#","keyPath":null"#),
        sig(r#","keyData":null"#),
        sig(r#","keyData":"""#),
        si(r#"{"type":"exactReference","dockerReference":"busybox:1"}"#),
        si(r#"{"type":"remapIdentity","prefix":"a.io","signedPrefix":"b.io/x/y"}"#),
        in_other(gpg),
        format!(r#"{{"default":[{r}],"transports":{{"no-such-transport":{{"anything":[{r}]}}}}}}"#),
        format!(
            r#"{{"default":[{r}],"transports":{{"docker":{{"":[{r}],"*":[{r}],"not a reference":[{r}]}}}}}}"#
        ),
        format!(
            r#"{{"default":[{r},{{"type":"signedBaseLayer","baseLayerIdentity":{{"type":"matchRepository"}}}}]}}"#
        ),
    ];
    let refused_by_verilay = [
        format!(r#"{{"default":[{gpg}]}}"#),
        format!(r#"{{"default":[{r}],"transports":{{"docker":{{"a.io":[{gpg}]}}}}}}"#),
    ];
    let mut failures = Vec::new();
    let groups: [(&[String], bool, bool); 3] = [
        (&refused_by_both, false, false),
        (&read_by_both, true, true),
        (&refused_by_verilay, true, false),
    ];
    for (i, (texts, c_image_reads, we_read)) in groups.iter().enumerate() {
        for (j, text) in texts.iter().enumerate() {
            let file = dir.path().join(format!("p{i}-{j}.json"));
            std::fs::write(&file, text).unwrap();
            let out = Command::new(&cimage)
                .arg("parse-policy")
                .arg(&file)
                .output()
                .unwrap();
            assert!(matches!(out.status.code(), Some(0 | 1)), "{out:?}");
            let theirs = out.status.success();
            let ours = Policy::from_file(&file);
            if theirs != *c_image_reads || ours.is_ok() != *we_read {
                failures.push(format!(
                    "{text}: c/image {} ({}); Policy {ours:?}",
                    if theirs { "reads it" } else { "refuses it" },
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            if let Err(e) = &ours {
                assert!(
                    !e.contains('\n') && e.contains(&file.display().to_string()),
                    "{e}"
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "disagreements:\n{}",
        failures.join("\n")
    );
}

#[test]
fn check_agrees_with_containers_image_on_every_policy() {
    let started = Instant::now();
    let cimage = oracle();
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let on = work.path().join("regd-on");
    std::fs::create_dir(&on).unwrap();
    std::fs::write(
        on.join("default.yaml"),
        "default-docker:\n  use-sigstore-attachments: true\n",
    )
    .unwrap();
    let pass = work.path().join("pass");
    std::fs::write(&pass, "correct horse").unwrap();
    // Keys 0-2: ECDSA P-256 from generate_key; 3: P-384; 4: Ed25519 (both encrypted by
    // encrypt_private_key).
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..3)
        .map(|_| signatures::generate_key(b"correct horse").unwrap())
        .collect();
    {
        use p384::pkcs8::EncodePrivateKey as _;
        let p384 = p384::ecdsa::SigningKey::from_slice(&[0x42; 48]).unwrap();
        let ed = ed25519_dalek::SigningKey::from_bytes(&[0x42; 32]);
        for (der, public) in [
            (
                p384.to_pkcs8_der().unwrap(),
                signatures::PublicKey::P384(*p384.verifying_key()),
            ),
            (
                ed.to_pkcs8_der().unwrap(),
                signatures::PublicKey::Ed25519(ed.verifying_key()),
            ),
        ] {
            let private =
                signatures::encrypt_private_key(der.as_bytes(), b"correct horse").unwrap();
            pairs.push((private, public.to_pem()));
        }
    }
    let mut keys = Vec::new();
    for (k, (private, public)) in pairs.iter().enumerate() {
        let (kp, pp) = (
            work.path().join(format!("key{k}.key")),
            work.path().join(format!("key{k}.pub")),
        );
        std::fs::write(&kp, private).unwrap();
        std::fs::write(&pp, public).unwrap();
        keys.push((kp, pp));
    }
    let env = Env {
        reg,
        cimage,
        work,
        on,
        pass,
        keys,
    };
    let host = env.host();

    // The images: A (one layer) and B (another), each pushed where a case needs it.
    let (a, b) = (env.path("layout-a"), env.path("layout-b"));
    oci_layout(&a, b"image A\n");
    oci_layout(&b, b"image B\n");
    let a = format!("oci:{}:v1", a.display());
    let b = format!("oci:{}:v1", b.display());
    // Signed with key 0; v2 is the same manifest (so the same signatures) under another
    // tag.
    env.push(&a, "app:v1", Some(0), None);
    env.push(&a, "app:v2", None, None);
    let digest_a = env.digest("app", "v1");
    // Signed as app:v1 but stored under mirror/app (a mirror: remapIdentity's case).
    env.push(
        &a,
        "mirror/app:v1",
        Some(0),
        Some(&format!("{host}/app:v1")),
    );
    env.push(&a, "unsigned:v1", None, None);
    // A signature whose payload is tampered with in the registry's storage.
    env.push(&a, "tampered:v1", Some(0), None);
    {
        let (m, _) = env
            .client()
            .get_manifest("tampered", &format!("{}.sig", digest_a.replace(':', "-")))
            .unwrap();
        let m: serde_json::Value = serde_json::from_slice(&m).unwrap();
        let layer = m["layers"][0]["digest"].as_str().unwrap().to_string();
        let file = env.reg.blob_file(&layer);
        let mut payload = std::fs::read(&file).unwrap();
        let text = String::from_utf8(payload.clone()).unwrap();
        let at = text.rfind("}}").unwrap() - 1;
        payload[at] = if payload[at] == b'0' { b'1' } else { b'0' };
        std::fs::write(&file, payload).unwrap();
    }
    // B's signature (for B's digest) moved onto A's attachment tag.
    env.push(&b, "otherdigest:b", Some(0), None);
    env.push(&a, "otherdigest:v1", None, None);
    {
        let c = env.client();
        let digest_b = env.digest("otherdigest", "b");
        let (m, mt) = c
            .get_manifest(
                "otherdigest",
                &format!("{}.sig", digest_b.replace(':', "-")),
            )
            .unwrap();
        c.put_manifest(
            "otherdigest",
            &format!("{}.sig", digest_a.replace(':', "-")),
            &m,
            &mt,
        )
        .unwrap();
    }
    // Signed by `sign` + `attach` (key 0), on a manifest skopeo pushed unsigned.
    let attach = |repo: &str, key: usize, identity: &str| {
        let private = std::fs::read(&env.keys[key].0).unwrap();
        let (payload, signature) =
            signatures::sign(&private, b"correct horse", identity, &digest_a).unwrap();
        signatures::attach(&env.client(), repo, &digest_a, &payload, &signature).unwrap();
        (payload, signature)
    };
    env.push(&a, "ours:v1", None, None);
    attach("ours", 0, &format!("{host}/ours:v1"));
    // c/image's signature (key 0), then ours (key 1) added to its attachment manifest.
    env.push(&a, "multi:v1", Some(0), None);
    let (payload, signature) = attach("multi", 1, &format!("{host}/multi:v1"));
    // The same signature again: not added twice.
    signatures::attach(&env.client(), "multi", &digest_a, &payload, &signature).unwrap();
    // Ours (key 1) first, then c/image's (key 0) added to our attachment manifest.
    env.push(&a, "extended:v1", None, None);
    attach("extended", 1, &format!("{host}/extended:v1"));
    env.push(&a, "extended:v1", Some(0), None);
    // P-384 and Ed25519: signed by us, and by c/image.
    env.push(&a, "p384:v1", None, None);
    attach("p384", 3, &format!("{host}/p384:v1"));
    env.push(&a, "p384c:v1", Some(3), None);
    env.push(&a, "ed25519:v1", None, None);
    attach("ed25519", 4, &format!("{host}/ed25519:v1"));
    env.push(&a, "ed25519c:v1", Some(4), None);

    // The registries.d configurations beside `on`.
    let off = env.path("regd-off");
    std::fs::create_dir(&off).unwrap();
    let repo_off = env.path("regd-repo-off");
    std::fs::create_dir(&repo_off).unwrap();
    std::fs::write(
        repo_off.join("a.yaml"),
        format!("default-docker:\n  use-sigstore-attachments: true\ndocker:\n  {host}/app:\n    use-sigstore-attachments: false\n"),
    )
    .unwrap();
    let host_on = env.path("regd-host-on");
    std::fs::create_dir(&host_on).unwrap();
    std::fs::write(
        host_on.join("a.yaml"),
        format!("docker:\n  {host}:\n    use-sigstore-attachments: true\n    lookaside: file:///nowhere\n"),
    )
    .unwrap();
    // As ghodss/yaml reads it: keys matched ignoring case, YAML 1.1's `yes` a boolean;
    // files not named *.yaml ignored; a namespace without the setting defers.
    let yaml11 = env.path("regd-yaml11");
    std::fs::create_dir(&yaml11).unwrap();
    std::fs::write(
        yaml11.join("a.yaml"),
        format!("Default-Docker:\n  USE-SIGSTORE-ATTACHMENTS: yes\ndocker:\n  {host}/app:\n    sigstore: file:///nowhere\n"),
    )
    .unwrap();
    std::fs::write(yaml11.join("b.yml"), "default-docker: [not read]\n").unwrap();

    let policy = |default: &[&str], docker: &[(&str, &[&str])]| -> String {
        let scopes: Vec<String> = docker
            .iter()
            .map(|(s, r)| format!("{s:?}:[{}]", r.join(",")))
            .collect();
        format!(
            r#"{{"default":[{}],"transports":{{"docker":{{{}}},"docker-daemon":{{"":[{INSECURE}]}}}}}}"#,
            default.join(","),
            scopes.join(",")
        )
    };
    let d = |reqs: &[&str]| policy(reqs, &[]);
    let g0 = sig(&env, 0, None);
    let g1 = sig(&env, 1, None);
    let g2 = sig(&env, 2, None);
    let g3 = sig(&env, 3, None);
    let g4 = sig(&env, 4, None);
    let si = |ty: &str| sig(&env, 0, Some(&format!(r#"{{"type":"{ty}"}}"#)));
    let si_kv = |ty: &str, k: &str, v: &str| {
        sig(&env, 0, Some(&format!(r#"{{"type":"{ty}","{k}":"{v}"}}"#)))
    };
    let key_data = {
        use base64::Engine as _;
        let pem = std::fs::read(&env.keys[0].1).unwrap();
        format!(
            r#"{{"type":"sigstoreSigned","keyData":"{}"}}"#,
            base64::engine::general_purpose::STANDARD.encode(pem)
        )
    };
    let app = |t: &str| format!("{host}/app{t}");
    let at_a = format!("@{digest_a}");
    let missing_key = r#"{"type":"sigstoreSigned","keyPath":"/nonexistent/key.pub"}"#.to_string();

    // (what, image, policy, registries.d, expected)
    let cases: Vec<(&str, String, String, &Path, Want)> = vec![
        ("good key", app(":v1"), d(&[&g0]), &env.on, Want::Signed),
        ("wrong key", app(":v1"), d(&[&g1]), &env.on, Want::Refused),
        ("reject", app(":v1"), d(&[REJECT]), &env.on, Want::Refused),
        (
            "insecureAcceptAnything",
            app(":v1"),
            d(&[INSECURE]),
            &env.on,
            Want::Unsigned,
        ),
        (
            "keyData",
            app(":v1"),
            d(&[&key_data]),
            &env.on,
            Want::Signed,
        ),
        (
            "missing key file",
            app(":v1"),
            d(&[&missing_key]),
            &env.on,
            Want::Refused,
        ),
        (
            "signedBaseLayer",
            app(":v1"),
            d(&[r#"{"type":"signedBaseLayer","baseLayerIdentity":{"type":"matchRepository"}}"#]),
            &env.on,
            Want::Refused,
        ),
        (
            "unknown field",
            app(":v1"),
            d(&[r#"{"type":"insecureAcceptAnything","extra":1}"#]),
            &env.on,
            Want::Refused,
        ),
        (
            "matchExact, tag",
            app(":v1"),
            d(&[&si("matchExact")]),
            &env.on,
            Want::Signed,
        ),
        (
            "matchExact, by digest",
            app(&at_a),
            d(&[&si("matchExact")]),
            &env.on,
            Want::Refused,
        ),
        (
            "matchRepoDigestOrExact, by digest",
            app(&at_a),
            d(&[&si("matchRepoDigestOrExact")]),
            &env.on,
            Want::Signed,
        ),
        (
            "matchRepoDigestOrExact, other tag",
            app(":v2"),
            d(&[&si("matchRepoDigestOrExact")]),
            &env.on,
            Want::Refused,
        ),
        (
            "matchRepository, other tag",
            app(":v2"),
            d(&[&si("matchRepository")]),
            &env.on,
            Want::Signed,
        ),
        (
            "exactReference, the signed one",
            app(":v2"),
            d(&[&si_kv("exactReference", "dockerReference", &app(":v1"))]),
            &env.on,
            Want::Signed,
        ),
        (
            "exactReference, another",
            app(":v1"),
            d(&[&si_kv("exactReference", "dockerReference", &app(":v2"))]),
            &env.on,
            Want::Refused,
        ),
        (
            "exactRepository, the signed one",
            app(":v2"),
            d(&[&si_kv("exactRepository", "dockerRepository", &app(""))]),
            &env.on,
            Want::Signed,
        ),
        (
            "exactRepository, another",
            app(":v1"),
            d(&[&si_kv(
                "exactRepository",
                "dockerRepository",
                &format!("{host}/other"),
            )]),
            &env.on,
            Want::Refused,
        ),
        (
            "remapIdentity, a mirror",
            format!("{host}/mirror/app:v1"),
            d(&[&sig(
                &env,
                0,
                Some(&format!(
                    r#"{{"type":"remapIdentity","prefix":"{host}/mirror","signedPrefix":"{host}"}}"#
                )),
            )]),
            &env.on,
            Want::Signed,
        ),
        (
            "mirror without remapIdentity",
            format!("{host}/mirror/app:v1"),
            d(&[&g0]),
            &env.on,
            Want::Refused,
        ),
        (
            "identity under another host name",
            format!("localhost:{}/app:v1", env.reg.port),
            d(&[&g0]),
            &env.on,
            Want::Refused,
        ),
        (
            "a scope that does not match",
            app(":v1"),
            policy(&[REJECT], &[(&format!("{host}/other"), &[INSECURE])]),
            &env.on,
            Want::Refused,
        ),
        (
            "the repository's scope",
            app(":v1"),
            policy(&[REJECT], &[(&app(""), &[&g0])]),
            &env.on,
            Want::Signed,
        ),
        (
            "the registry's scope (host:port)",
            app(":v1"),
            policy(&[REJECT], &[(&host, &[INSECURE])]),
            &env.on,
            Want::Unsigned,
        ),
        (
            "the host without its port is no scope",
            app(":v1"),
            policy(&[REJECT], &[("127.0.0.1", &[INSECURE])]),
            &env.on,
            Want::Refused,
        ),
        (
            "a wildcard scope *.0.1",
            app(":v1"),
            policy(&[REJECT], &[("*.0.1", &[&g0])]),
            &env.on,
            Want::Signed,
        ),
        (
            "the transport's \"\" scope",
            app(":v1"),
            policy(&[REJECT], &[("", &[&g0])]),
            &env.on,
            Want::Signed,
        ),
        (
            "the exact reference's scope first",
            app(":v1"),
            policy(
                &[INSECURE],
                &[(&app(":v1"), &[REJECT]), (&app(""), &[INSECURE])],
            ),
            &env.on,
            Want::Refused,
        ),
        (
            "... and not for another tag",
            app(":v2"),
            policy(
                &[REJECT],
                &[(&app(":v1"), &[REJECT]), (&app(""), &[INSECURE])],
            ),
            &env.on,
            Want::Unsigned,
        ),
        (
            "use-sigstore-attachments off",
            app(":v1"),
            d(&[&g0]),
            &off,
            Want::Refused,
        ),
        (
            "attachments off for the repository",
            app(":v1"),
            d(&[&g0]),
            &repo_off,
            Want::Refused,
        ),
        (
            "attachments on for the registry only",
            app(":v1"),
            d(&[&g0]),
            &host_on,
            Want::Signed,
        ),
        (
            "registries.d in other case, `yes`",
            app(":v1"),
            d(&[&g0]),
            &yaml11,
            Want::Signed,
        ),
        (
            "a signature for another digest",
            format!("{host}/otherdigest:v1"),
            d(&[&si("matchRepository")]),
            &env.on,
            Want::Refused,
        ),
        (
            "a tampered payload",
            format!("{host}/tampered:v1"),
            d(&[&g0]),
            &env.on,
            Want::Refused,
        ),
        (
            "no signature",
            format!("{host}/unsigned:v1"),
            d(&[&g0]),
            &env.on,
            Want::Refused,
        ),
        (
            "no signature, insecureAcceptAnything",
            format!("{host}/unsigned:v1"),
            d(&[INSECURE]),
            &env.on,
            Want::Unsigned,
        ),
        (
            "AND: insecure, then signed",
            app(":v1"),
            d(&[INSECURE, &g0]),
            &env.on,
            Want::Signed,
        ),
        (
            "AND: signed, then reject",
            app(":v1"),
            d(&[&g0, REJECT]),
            &env.on,
            Want::Refused,
        ),
        (
            "AND: two keys, one signed",
            app(":v1"),
            d(&[&g0, &g1]),
            &env.on,
            Want::Refused,
        ),
        (
            "sign+attach, right key",
            format!("{host}/ours:v1"),
            d(&[&g0]),
            &env.on,
            Want::Signed,
        ),
        (
            "sign+attach, wrong key",
            format!("{host}/ours:v1"),
            d(&[&g1]),
            &env.on,
            Want::Refused,
        ),
        (
            "sign+attach, not on",
            format!("{host}/ours:v1"),
            d(&[&g0]),
            &off,
            Want::Refused,
        ),
        (
            "c/image's then ours: c/image's key",
            format!("{host}/multi:v1"),
            d(&[&g0]),
            &env.on,
            Want::Signed,
        ),
        (
            "c/image's then ours: our key",
            format!("{host}/multi:v1"),
            d(&[&g1]),
            &env.on,
            Want::Signed,
        ),
        (
            "c/image's then ours: both keys",
            format!("{host}/multi:v1"),
            d(&[&g0, &g1]),
            &env.on,
            Want::Signed,
        ),
        (
            "c/image's then ours: a third key",
            format!("{host}/multi:v1"),
            d(&[&g2]),
            &env.on,
            Want::Refused,
        ),
        (
            "ours then c/image's: our key",
            format!("{host}/extended:v1"),
            d(&[&g1]),
            &env.on,
            Want::Signed,
        ),
        (
            "ours then c/image's: c/image's key",
            format!("{host}/extended:v1"),
            d(&[&g0]),
            &env.on,
            Want::Signed,
        ),
        (
            "P-384, signed by sign",
            format!("{host}/p384:v1"),
            d(&[&g3]),
            &env.on,
            Want::Signed,
        ),
        (
            "P-384, signed by c/image",
            format!("{host}/p384c:v1"),
            d(&[&g3]),
            &env.on,
            Want::Signed,
        ),
        (
            "P-384, another key",
            format!("{host}/p384c:v1"),
            d(&[&g0]),
            &env.on,
            Want::Refused,
        ),
        (
            "Ed25519, signed by sign",
            format!("{host}/ed25519:v1"),
            d(&[&g4]),
            &env.on,
            Want::Signed,
        ),
        (
            "Ed25519, signed by c/image",
            format!("{host}/ed25519c:v1"),
            d(&[&g4]),
            &env.on,
            Want::Signed,
        ),
        (
            "Ed25519, another key",
            format!("{host}/ed25519c:v1"),
            d(&[&g3]),
            &env.on,
            Want::Refused,
        ),
    ];

    let mut failures = Vec::new();
    println!(
        "{:<42} {:<8} {:<8} {:<8} expected",
        "case", "c/image", "check", "skopeo"
    );
    for (i, (what, image, text, regd, want)) in cases.iter().enumerate() {
        let file = env.path(&format!("policy-{i}.json"));
        std::fs::write(&file, text).unwrap();
        let (theirs, their_why) = env.cimage_accepts(image, &file, regd);
        let (debian, debian_why) = env.skopeo_accepts(image, &file, regd);
        let ours = env.we_accept(&format!("oci://{image}"), &file, regd);
        let ours_want = match &ours {
            Ok(a) if a.signed => Want::Signed,
            Ok(_) => Want::Unsigned,
            Err(_) => Want::Refused,
        };
        let word = |accepted: bool| if accepted { "accepts" } else { "refuses" };
        println!(
            "{what:<42} {:<8} {:<8} {:<8} {want:?}",
            word(theirs),
            word(ours.is_ok()),
            word(debian)
        );
        if theirs != ours.is_ok() || ours_want != *want || theirs != (*want != Want::Refused) {
            failures.push(format!(
                "{what} ({image}): c/image {} ({their_why}); check {ours:?}; expected {want:?}",
                word(theirs)
            ));
        }
        // Debian's skopeo rejects every sigstore signature it finds, and only those.
        let debian_ok = if ours_want == Want::Signed {
            !debian && debian_why.contains("Debian-local change: sigstore disabled")
        } else {
            debian == ours.is_ok()
        };
        if !debian_ok {
            failures.push(format!(
                "{what} ({image}): Debian's skopeo {} ({debian_why}); check {ours:?}",
                word(debian)
            ));
        }
        if let Err(e) = &ours {
            assert!(!e.contains('\n'), "{what}: a one-line error: {e}");
        }
    }
    // The tampered case is refused for the tampering, not for something else.
    let at = cases
        .iter()
        .position(|c| c.0 == "a tampered payload")
        .unwrap();
    let tampered = env.we_accept(
        &format!("oci://{host}/tampered:v1"),
        &env.path(&format!("policy-{at}.json")),
        &env.on,
    );
    assert!(
        tampered
            .as_ref()
            .is_err_and(|e| e.contains("the registry sent other bytes")),
        "{tampered:?}"
    );
    assert!(
        failures.is_empty(),
        "disagreements:\n{}",
        failures.join("\n")
    );
    // The duplicate attach left one signature of ours in multi's manifest.
    let (m, _) = env
        .client()
        .get_manifest("multi", &format!("{}.sig", digest_a.replace(':', "-")))
        .unwrap();
    let m: serde_json::Value = serde_json::from_slice(&m).unwrap();
    assert_eq!(m["layers"].as_array().unwrap().len(), 2, "{m}");
    println!("took {:?}", started.elapsed());
}
