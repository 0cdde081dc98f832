//! `verilay push` and `pull` against a real registry: Debian's `docker-registry` (CNCF
//! distribution) started on 127.0.0.1 by each test, with `skopeo` as the independent
//! client that checks what was stored; and mounts of what it holds, alone, stacked with
//! local images, under an upper directory and measuring, against the same local images.

mod common;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

use common::registry::{free_port, http_status, Registry};
use common::*;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

fn prerequisites() -> bool {
    skip_unless(
        have("docker-registry"),
        "needs docker-registry (scripts/setup)",
    ) || skip_unless(have("skopeo"), "needs skopeo (scripts/setup)")
        || skip_unless(have("htpasswd"), "needs htpasswd (apache2-utils)")
}

/// A tree with a few files, an xattr and a symlink, built into `image`; its digest.
fn image_of_tree(base: &Path) -> (PathBuf, PathBuf, String) {
    let src = base.join("src");
    std::fs::create_dir_all(src.join("etc")).unwrap();
    std::fs::write(src.join("etc/os-release"), "ID=verilay\n").unwrap();
    std::fs::write(src.join("big"), vec![7u8; 300_000]).unwrap();
    std::os::unix::fs::symlink("etc/os-release", src.join("link")).unwrap();
    let image = base.join("app.img");
    let out = build(&src, &image, &["--quiet"]);
    let digest = String::from_utf8(out.stdout).unwrap().trim().to_string();
    (src, image, digest)
}

/// `sha256:HEX` of `bytes`, by sha256sum (an independent hasher).
fn sha256_of(bytes: &[u8]) -> String {
    let mut c = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(bytes).unwrap();
    let o = c.wait_with_output().unwrap();
    let out = String::from_utf8(o.stdout).unwrap();
    format!("sha256:{}", out.split(' ').next().unwrap())
}

fn verilay_out(args: &[&str]) -> Output {
    verilay().args(args).output().unwrap()
}

/// Asserts a failed command: exit 1, one line on stderr holding every needle.
fn assert_one_line(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for n in needles {
        assert!(err.contains(n), "expected {n:?} in: {err}");
    }
}

#[test]
fn push_then_pull_by_tag_and_by_digest_gives_back_the_image_skopeo_sees() {
    if prerequisites() {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (src, image, digest) = image_of_tree(t.path());
    let r = reg.reference("apps/demo:1");
    let out = run(verilay()
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(&r));
    let manifest_digest = String::from_utf8(out.stdout).unwrap().trim().to_string();
    // The oracle: skopeo reads the manifest we stored, and copies the artifact whole.
    let raw = run(Command::new("skopeo").args([
        "inspect",
        "--raw",
        "--tls-verify=false",
        &reg.docker("apps/demo:1"),
    ]))
    .stdout;
    let got = sha256_of(&raw);
    assert_eq!(
        got, manifest_digest,
        "push printed another digest than skopeo's"
    );
    let m: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(m["artifactType"], "application/vnd.verilay.image.v1");
    assert_eq!(
        m["annotations"]["dev.verilay.image.digest"],
        digest.as_str()
    );
    let layer = &m["layers"][0];
    assert_eq!(layer["mediaType"], "application/vnd.verilay.image.erofs.v1");
    let oci = t.path().join("oci");
    run(Command::new("skopeo")
        .args([
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            &reg.docker("apps/demo:1"),
        ])
        .arg(format!("oci:{}:x", oci.display())));
    let blob = layer["digest"].as_str().unwrap();
    let copied = oci
        .join("blobs/sha256")
        .join(blob.strip_prefix("sha256:").unwrap());
    assert_eq!(
        std::fs::read(&copied).unwrap(),
        std::fs::read(&image).unwrap(),
        "the stored blob is not the image"
    );
    // Pulled by tag (pinned by the annotation) and by manifest digest: the same bytes.
    let by_tag = t.path().join("by-tag.img");
    run(verilay()
        .args(["pull", "--insecure", "--quiet", &r, "-o"])
        .arg(&by_tag));
    let by_digest = t.path().join("by-digest.img");
    let pinned = reg.reference(&format!("apps/demo@{manifest_digest}"));
    run(verilay()
        .args([
            "pull",
            "--insecure",
            "--quiet",
            &pinned,
            "--digest",
            &digest,
            "-o",
        ])
        .arg(&by_digest));
    for pulled in [&by_tag, &by_digest] {
        assert_eq!(
            std::fs::read(pulled).unwrap(),
            std::fs::read(&image).unwrap()
        );
    }
    // And the pulled image mounts with the kernel's erofs, the tree the source's.
    if is_root() {
        let k = Mount::erofs(&by_tag, &t.path().join("k"));
        assert_diff_clean(&src, &k.dir);
    }
    // A second push of the same image uploads nothing new and names the same manifest.
    let again = run(verilay()
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(&r));
    assert_eq!(
        String::from_utf8(again.stdout).unwrap().trim(),
        manifest_digest
    );
}

#[test]
fn bad_references_and_hostile_answers_get_one_line_and_no_image() {
    if prerequisites() || skip_unless(have("curl"), "needs curl") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (_, image, digest) = image_of_tree(t.path());
    let r = reg.reference("apps/demo:1");
    run(verilay()
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(&r));
    let raw = run(Command::new("skopeo").args([
        "inspect",
        "--raw",
        "--tls-verify=false",
        &reg.docker("apps/demo:1"),
    ]))
    .stdout;
    let m: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    let blob = m["layers"][0]["digest"].as_str().unwrap().to_string();
    // A manifest without the annotation, and one whose blob is not an image (the empty
    // config's bytes, with the annotation).
    let mut bare = m.clone();
    bare["annotations"] = serde_json::json!({});
    bare["layers"][0]["annotations"] = serde_json::json!({});
    reg.put_manifest("apps/demo:bare", &bare.to_string(), OCI_MANIFEST);
    let mut not_image = m.clone();
    not_image["layers"][0]["digest"] = m["config"]["digest"].clone();
    not_image["layers"][0]["size"] = m["config"]["size"].clone();
    reg.put_manifest("apps/demo:notimage", &not_image.to_string(), OCI_MANIFEST);
    let out = t.path().join("out.img");
    let o = out.to_str().unwrap();
    let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
        (
            vec!["oci://nohost.invalid/a:1".into()],
            vec!["nohost.invalid"],
        ),
        (
            vec![reg.reference("apps/demo:2"), "--insecure".into()],
            vec!["MANIFEST_UNKNOWN"],
        ),
        (
            vec![reg.reference("nothing/here:1"), "--insecure".into()],
            vec!["404"],
        ),
        (
            vec![reg.reference("apps/demo:bare"), "--insecure".into()],
            vec!["records no image digest", "--digest"],
        ),
        (
            vec![reg.reference("apps/demo:notimage"), "--insecure".into()],
            vec!["not the pinned verilay image"],
        ),
        (
            vec![
                r.clone(),
                "--insecure".into(),
                "--digest".into(),
                format!("sha256:{}", "0".repeat(64)),
            ],
            vec!["records image digest", &digest],
        ),
        (
            vec![
                format!(
                    "oci://127.0.0.1:{}/apps/demo@sha256:{}",
                    reg.port,
                    "1".repeat(64)
                ),
                "--insecure".into(),
            ],
            vec!["404"],
        ),
        (
            vec!["oci://example.com/a:1".into(), "--insecure".into()],
            vec!["only for a registry on this machine"],
        ),
        (
            vec!["oci://127.0.0.1/Bad:1".into()],
            vec!["not a repository name"],
        ),
    ];
    for (args, needles) in cases {
        let mut full = vec!["pull", "-o", o, "--timeout", "10"];
        full.extend(args.iter().map(String::as_str));
        let res = verilay_out(&full);
        assert_one_line(&res, &needles);
        assert!(!out.exists(), "{args:?} left an image");
        assert_eq!(
            std::fs::read_dir(t.path())
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .ends_with(".partial")
                })
                .count(),
            0,
            "{args:?} left a partial file"
        );
    }
    // A partial file (or link) someone planted beside the output is never written through,
    // and an output that exists survives a failed pull.
    let victim = t.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, t.path().join(".out.img.partial")).unwrap();
    std::fs::write(&out, b"old image").unwrap();
    let res = verilay_out(&[
        "pull",
        "-o",
        o,
        "--insecure",
        &reg.reference("apps/demo:notimage"),
    ]);
    assert_one_line(&res, &["not the pinned verilay image"]);
    assert_eq!(std::fs::read(&out).unwrap(), b"old image");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    run(verilay().args(["pull", "-o", o, "--insecure", "--quiet", &r]));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&out).unwrap().is_file());
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&image).unwrap());
    std::fs::remove_file(&out).unwrap();
    std::fs::remove_file(t.path().join(".out.img.partial")).unwrap();
    // A registry whose storage was tampered with: the bytes fail their digest.
    let stored = reg.blob_file(&blob);
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes[5000] ^= 1;
    std::fs::write(&stored, &bytes).unwrap();
    let res = verilay_out(&["pull", "-o", o, "--insecure", &r]);
    assert_one_line(&res, &["whose digest is", &blob]);
    assert!(!out.exists());
    // A manifest pinned by digest that the registry answers differently is refused too.
    let push_to_digest = verilay_out(&[
        "push",
        "--insecure",
        image.to_str().unwrap(),
        &format!(
            "oci://127.0.0.1:{}/apps/demo@sha256:{}",
            reg.port,
            "2".repeat(64)
        ),
    ]);
    assert_one_line(&push_to_digest, &["push to a tag"]);
}

#[test]
fn basic_auth_comes_from_the_auth_file() {
    if prerequisites() {
        return;
    }
    let reg = Registry::start(true);
    let t = tempfile::tempdir().unwrap();
    let (_, image, _) = image_of_tree(t.path());
    let r = reg.reference("private/app:1");
    let no_file = t.path().join("none.json");
    let denied = verilay()
        .env("REGISTRY_AUTH_FILE", &no_file)
        .env("HOME", t.path())
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(&r)
        .output()
        .unwrap();
    assert_one_line(&denied, &["401", "no credentials"]);
    let wrong = t.path().join("wrong.json");
    std::fs::write(
        &wrong,
        format!(
            r#"{{"auths":{{"127.0.0.1:{}":{{"auth":"dTpiYWQ="}}}}}}"#,
            reg.port
        ),
    )
    .unwrap();
    let refused = verilay()
        .env("REGISTRY_AUTH_FILE", &wrong)
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(&r)
        .output()
        .unwrap();
    assert_one_line(&refused, &["401", "refused"]);
    logged_in_round_trip(t.path(), &reg, &image, "private/app:1");
}

/// With user `u`'s credentials in an auth file (as `podman login` writes them): push, pull
/// back the same bytes, and skopeo, given the same file, sees the artifact.
fn logged_in_round_trip(dir: &Path, reg: &Registry, image: &Path, repo_tag: &str) {
    let good = dir.join("auth.json");
    std::fs::write(
        &good,
        format!(
            r#"{{"auths":{{"127.0.0.1:{}":{{"auth":"dTpzZWNyZXQ="}}}}}}"#,
            reg.port
        ),
    )
    .unwrap();
    let r = reg.reference(repo_tag);
    run(verilay()
        .env("REGISTRY_AUTH_FILE", &good)
        .args(["push", "--insecure", "--quiet"])
        .arg(image)
        .arg(&r));
    let out = dir.join("pulled.img");
    run(verilay()
        .env("REGISTRY_AUTH_FILE", &good)
        .args(["pull", "--insecure", "--quiet", &r, "-o"])
        .arg(&out));
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(image).unwrap());
    run(Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false", "--authfile"])
        .arg(&good)
        .arg(reg.docker(repo_tag)));
}

/// A token server for the registry's `auth: token` (the Bearer flow Docker Hub, GHCR and
/// Harbor use): it gives user `u` (password `secret`) a JWT, signed with a key whose
/// self-signed certificate the registry trusts, for the scope asked; anyone else 401.
const TOKEN_SERVER: &str = r#"
import base64, json, subprocess, sys, time, http.server, urllib.parse
key, cert, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
der = subprocess.run(["openssl", "x509", "-in", cert, "-outform", "DER"], capture_output=True, check=True).stdout
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        if self.headers.get("Authorization") != "Basic " + base64.b64encode(b"u:secret").decode():
            self.send_response(401); self.end_headers(); return
        access = []
        for s in q.get("scope", []):
            kind, name, actions = s.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        head = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        claims = {"iss": "test-issuer", "sub": "u", "aud": q["service"][0], "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": str(now), "access": access}
        signing = (b64(json.dumps(head).encode()) + "." + b64(json.dumps(claims).encode())).encode()
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key], input=signing,
                             capture_output=True, check=True).stdout
        body = json.dumps({"token": signing.decode() + "." + b64(sig)}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
class S(http.server.HTTPServer):
    def handle_error(self, *a): pass  # a probe that hangs up is not news
S(("127.0.0.1", port), H).serve_forever()
"#;

/// `script` (Python) run with `args`, once it answers on `port`; killed when dropped.
fn python_server(dir: &Path, script: &str, args: &[&std::ffi::OsStr], port: u16) -> Killed {
    let file = dir.join(format!("server-{port}.py"));
    std::fs::write(&file, script).unwrap();
    let child = Command::new("/usr/bin/python3")
        .arg(&file)
        .args(args)
        .spawn()
        .unwrap();
    let server = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while http_status(port, "/v2/").is_none() {
        assert!(
            Instant::now() < deadline,
            "{} did not start",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn bearer_tokens_come_from_the_registrys_token_server() {
    if prerequisites() || skip_unless(have("openssl"), "needs openssl") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (key, cert) = (t.path().join("key.pem"), t.path().join("cert.pem"));
    run(Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=verilay-test-token"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null()));
    let token_port = free_port();
    let port_arg = token_port.to_string();
    let _tokens = python_server(
        t.path(),
        TOKEN_SERVER,
        &[key.as_os_str(), cert.as_os_str(), port_arg.as_ref()],
        token_port,
    );
    let auth = format!(
        "auth:\n  token:\n    realm: http://127.0.0.1:{token_port}/token\n    service: test-registry\n    issuer: test-issuer\n    rootcertbundle: {}\n",
        cert.display()
    );
    let reg = Registry::start_with(|_| auth);
    let (_, image, _) = image_of_tree(t.path());
    let r = reg.reference("team/app:1");
    let anonymous = verilay()
        .env("REGISTRY_AUTH_FILE", t.path().join("none.json"))
        .env("HOME", t.path())
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(&r)
        .output()
        .unwrap();
    assert_one_line(&anonymous, &["token server", "401", "anonymous"]);
    logged_in_round_trip(t.path(), &reg, &image, "team/app:1");
}

/// A proxy in front of the registry: counts the body bytes it forwards (in `STATE/bytes`),
/// logs each request (`METHOD PATH RANGE` lines in `STATE/requests`) and, while
/// `STATE/flip` exists, flips one byte in every 4 KiB block of each range it
/// forwards (a hostile network or mirror).
const PROXY: &str = r#"
import http.server, os, sys, threading, urllib.error, urllib.request
port, upstream, state = int(sys.argv[1]), sys.argv[2], sys.argv[3]
lock = threading.Lock()
inflight = [0]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def forward(self, head):
        with lock:
            inflight[0] += 1
            with open(state + "/requests", "a") as f:
                # The last field: this request and those in flight when it came.
                f.write(f"{'HEAD' if head else 'GET'} {self.path} {self.headers.get('Range', '-')} {inflight[0]}\n")
        try:
            # "S" in the file: every request waits S seconds first (a long round trip).
            if os.path.exists(state + "/delay"):
                import time; time.sleep(float(open(state + "/delay").read()))
            self.answer(head)
        finally:
            with lock: inflight[0] -= 1
    def answer(self, head):
        req = urllib.request.Request(upstream + self.path, method="HEAD" if head else "GET")
        for k in ("Range", "Accept", "Authorization"):
            if self.headers.get(k): req.add_header(k, self.headers[k])
        try:
            r = urllib.request.urlopen(req); status, headers, body = r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            status, headers, body = e.code, e.headers, e.read()
        if status == 206 and os.path.exists(state + "/flip"):
            # "LO HI" in the file: only image bytes in [LO, HI) are flipped.
            span = open(state + "/flip").read().split()
            lo, hi = (int(span[0]), int(span[1])) if span else (0, 1 << 62)
            start = int(self.headers.get("Range", "bytes=0-").split("=")[1].split("-")[0])
            b = bytearray(body)
            for i in range(100, len(b), 4096):
                if lo <= start + i < hi: b[i] ^= 1
            body = bytes(b)
        if not head:
            with lock:
                f = state + "/bytes"
                n = int(open(f).read()) if os.path.exists(f) else 0
                open(f, "w").write(str(n + len(body)))
        self.send_response(status)
        for k, v in headers.items():
            if k.lower() in ("content-type", "content-range", "docker-content-digest", "www-authenticate"):
                self.send_header(k, v)
        self.send_header("Content-Length", headers.get("Content-Length", "0") if head else str(len(body)))
        self.end_headers()
        if not head: self.wfile.write(body)
    def do_GET(self): self.forward(False)
    def do_HEAD(self): self.forward(True)
class S(http.server.ThreadingHTTPServer):
    def handle_error(self, *a): pass  # a probe that hangs up is not news
S(("127.0.0.1", port), H).serve_forever()
"#;

/// Starts [`PROXY`] in front of `reg`; its port.
fn proxy(reg: &Registry, state: &Path) -> (Killed, u16) {
    let port = free_port();
    let upstream = format!("http://127.0.0.1:{}", reg.port);
    let port_arg = port.to_string();
    let args = [port_arg.as_ref(), upstream.as_ref(), state.as_os_str()];
    (python_server(state, PROXY, &args, port), port)
}

fn fetched(state: &Path) -> u64 {
    std::fs::read_to_string(state.join("bytes"))
        .map(|s| s.trim().parse().unwrap())
        .unwrap_or(0)
}

#[test]
fn a_mount_from_the_registry_fetches_little_and_never_serves_a_flipped_byte() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (src, image, digest) = {
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("etc")).unwrap();
        std::fs::write(src.join("etc/os-release"), "ID=verilay\n").unwrap();
        // 16 MiB no block of which repeats (so no two blocks share a hash).
        let big: Vec<u8> = (0..16u64 << 20)
            .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8 ^ (i >> 12) as u8)
            .collect();
        std::fs::write(src.join("big"), &big).unwrap();
        let image = t.path().join("app.img");
        let out = build(&src, &image, &["--quiet"]);
        (
            src,
            image,
            String::from_utf8(out.stdout).unwrap().trim().to_string(),
        )
    };
    let size = std::fs::metadata(&image).unwrap().len();
    let out = run(verilay()
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(reg.reference("apps/demo:1")));
    let manifest = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let state = t.path().join("proxy");
    std::fs::create_dir_all(&state).unwrap();
    let (_proxy, port) = proxy(&reg, &state);
    let via = |target: &str| format!("oci://127.0.0.1:{port}/apps/demo{target}");
    let m = t.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    let log = t.path().join("log");
    run(verilay()
        .args([
            "mount",
            "--quiet",
            "--insecure",
            &via(":1"),
            "--digest",
            &digest,
        ])
        .arg(&m)
        .arg("--log")
        .arg(&log));
    let _m = Unmount::fuse(&m);
    // A file read right after mounting costs a small part of the image.
    assert_eq!(
        std::fs::read_to_string(m.join("etc/os-release")).unwrap(),
        "ID=verilay\n"
    );
    let first = fetched(&state);
    assert!(
        first * 8 < size,
        "mounting and reading one small file fetched {first} of {size} bytes"
    );
    // `verilay stats` says what the daemon fetched: some of what crossed the proxy (which
    // also carried the manifest).
    let stats = run(verilay().args(["stats", "--json"]).arg(&m));
    let v: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let daemon = v["remote_bytes_fetched"].as_u64().unwrap();
    assert!(
        daemon > 0 && daemon <= first,
        "stats {v} vs {first} through the proxy"
    );
    assert!(v["remote_requests"].as_u64().unwrap() >= 1, "{v}");
    // Flipped bytes on the wire: EIO and a log line, never wrong bytes.
    std::fs::write(state.join("flip"), b"").unwrap();
    let e = std::fs::read(m.join("big")).expect_err("a flipped block was served");
    assert_eq!(e.raw_os_error(), Some(5), "{e}");
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.lines().any(|l| (l.contains(": read of /big (inode ")
            || l.contains("(the data of /big)"))
            && l.contains("integrity error")),
        "no log line naming big for the bad block: {logged}"
    );
    // The FUSE engine names the file read, the kernel engine what the image block holds.
    assert!(
        logged
            .lines()
            .all(|l| l.contains(" of /big ") || l.contains("(the data of /big)")),
        "a log line naming another file: {logged}"
    );
    // The proxy gone honest, the same read fetches the blocks again and succeeds.
    std::fs::remove_file(state.join("flip")).unwrap();
    assert!(
        std::fs::read(m.join("big")).unwrap() == std::fs::read(src.join("big")).unwrap(),
        "the file read back differs"
    );
    assert_diff_clean(&src, &m);
    drop(_m);
    wait_daemon_gone(&m);
    // The manifest named by its digest pins the image by itself.
    run(verilay()
        .args([
            "mount",
            "--quiet",
            "--insecure",
            &via(&format!("@{manifest}")),
        ])
        .arg(&m));
    let _m = Unmount::fuse(&m);
    assert_diff_clean(&src, &m);
}

#[test]
fn a_remote_mount_refuses_what_is_not_pinned_or_not_there() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (_, image, digest) = image_of_tree(t.path());
    run(verilay()
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(reg.reference("apps/demo:1")));
    let m = t.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    let mnt = m.to_str().unwrap();
    let r = reg.reference("apps/demo:1");
    let zero = format!("sha256:{}", "0".repeat(64));
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec![&r, "--insecure"], vec!["pinned only"]),
        (
            vec![&r, "--insecure", "--digest", &zero],
            vec!["pinned", "sha256:0000"],
        ),
        (
            vec!["oci://nohost.invalid/a:1", "--digest", &digest],
            vec!["nohost.invalid"],
        ),
        (vec![&r, "--digest", &digest], vec!["127.0.0.1"]),
        (
            vec!["oci://example.com/a:1", "--insecure", "--digest", &digest],
            vec!["only for a registry on this machine"],
        ),
    ];
    for (args, needles) in cases {
        let mut full = vec!["mount", "--timeout", "10"];
        full.extend(args.iter().copied());
        full.push(mnt);
        let out = verilay_out(&full);
        assert_one_line(&out, &needles);
        assert!(
            std::fs::read_dir(&m).unwrap().next().is_none(),
            "{args:?}: something is mounted"
        );
    }
}

/// A static file server with range support (what nginx or any CDN serves): `GET`/`HEAD`
/// of files under a directory, `Range: bytes=A-B` answered 206.
const STATIC: &str = r#"
import http.server, os, re, sys, time
port, root = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def serve(self, head):
        path = os.path.join(root, self.path.lstrip("/"))
        if not os.path.isfile(path):
            self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers(); return
        size = os.path.getsize(path)
        m = re.match(r"bytes=(\d+)-(\d+)$", self.headers.get("Range", ""))
        start, end = (int(m[1]), min(int(m[2]), size - 1)) if m else (0, size - 1)
        self.send_response(206 if m else 200)
        if m: self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1)); self.end_headers()
        if not head:
            with open(path, "rb") as f:
                f.seek(start); data = f.read(end - start + 1)
            if os.path.exists(os.path.join(root, "slow")):  # a slow-loris: five bytes a second
                for i in range(len(data)):
                    self.wfile.write(data[i:i + 1]); self.wfile.flush(); time.sleep(0.2)
            self.wfile.write(data)
    def do_GET(self): self.serve(False)
    def do_HEAD(self): self.serve(True)
class S(http.server.ThreadingHTTPServer):
    def handle_error(self, *a): pass  # a probe that hangs up is not news
S(("127.0.0.1", port), H).serve_forever()
"#;

/// [`STATIC`] serving `dir`; the URL of its `app.img`.
fn web_server(dir: &Path) -> (Killed, String) {
    let port = free_port();
    let port_arg = port.to_string();
    let server = python_server(dir, STATIC, &[port_arg.as_ref(), dir.as_os_str()], port);
    (server, format!("http://127.0.0.1:{port}/app.img"))
}

#[test]
fn an_image_on_a_plain_web_server_mounts_pinned_and_stacks_under_an_upper_directory() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (src, _, digest) = image_of_tree(t.path());
    let (_server, url) = web_server(t.path());
    let m = t.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    // Unpinned, refused; pinned, the tree is the source's.
    let out = verilay_out(&["mount", &url, m.to_str().unwrap()]);
    assert_one_line(&out, &["pinned only"]);
    run(verilay()
        .args(["mount", "--quiet", &url, "--digest", &digest])
        .arg(&m));
    let mounted = Unmount::fuse(&m);
    assert_diff_clean(&src, &m);
    drop(mounted);
    wait_daemon_gone(&m);
    // A local layer on top of the remote one, and a writable upper directory: a copy-up
    // of a remote file lands in the upper directory, whole.
    let top_src = t.path().join("top");
    std::fs::create_dir_all(&top_src).unwrap();
    std::fs::write(top_src.join("added"), "top\n").unwrap();
    let top = t.path().join("top.img");
    let top_digest = String::from_utf8(build(&top_src, &top, &["--quiet"]).stdout).unwrap();
    let (u, w) = (t.path().join("u"), t.path().join("w"));
    std::fs::create_dir_all(&u).unwrap();
    std::fs::create_dir_all(&w).unwrap();
    run(verilay()
        .args(["mount", "--quiet"])
        .arg(&top)
        .args(["--digest", top_digest.trim(), &url, "--digest", &digest])
        .arg("--upper")
        .arg(&u)
        .arg("--work")
        .arg(&w)
        .arg(&m));
    let _m = Unmount::fuse(&m);
    assert_eq!(std::fs::read_to_string(m.join("added")).unwrap(), "top\n");
    assert_eq!(
        std::fs::read_to_string(m.join("etc/os-release")).unwrap(),
        "ID=verilay\n"
    );
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.join("big"))
        .unwrap();
    f.write_all(b"appended").unwrap();
    drop(f);
    let mut want = std::fs::read(src.join("big")).unwrap();
    want.extend_from_slice(b"appended");
    assert_eq!(std::fs::read(u.join("big")).unwrap(), want);
}

#[test]
fn a_registry_that_dies_fails_uncached_reads_at_once_and_serves_again_when_back() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let mut reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // Two files far apart in the image: reading one fetches nothing of the other, even
    // with the growing requests of a sequential reader (at most 4 MiB ahead).
    let file = |seed: u64| -> Vec<u8> {
        (0..4u64 << 20)
            .map(|i| ((i ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
            .collect()
    };
    std::fs::write(src.join("a"), file(1)).unwrap();
    std::fs::write(src.join("a_gap"), [file(3), file(4)].concat()).unwrap();
    std::fs::write(src.join("b"), file(2)).unwrap();
    let image = t.path().join("app.img");
    let digest = String::from_utf8(build(&src, &image, &["--quiet"]).stdout).unwrap();
    run(verilay()
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(reg.reference("apps/demo:1")));
    let m = t.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    run(verilay()
        .args([
            "mount",
            "--quiet",
            "--insecure",
            &reg.reference("apps/demo:1"),
        ])
        .args(["--digest", digest.trim()])
        .arg(&m)
        .arg("--log")
        .arg(t.path().join("log")));
    let _m = Unmount::fuse(&m);
    assert_eq!(std::fs::read(m.join("a")).unwrap(), file(1));
    reg.kill();
    // What was read still is; what was not fails with EIO, soon (no wait for a timeout:
    // the connection is refused).
    assert_eq!(std::fs::read(m.join("a")).unwrap(), file(1));
    let start = Instant::now();
    let e = std::fs::read(m.join("b")).expect_err("read b with the registry gone");
    assert_eq!(e.raw_os_error(), Some(5), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "EIO took {:?}",
        start.elapsed()
    );
    reg.restart();
    assert_eq!(std::fs::read(m.join("b")).unwrap(), file(2));
}

/// One server on every loopback address: 127.0.0.1 redirects to 127.0.0.2, which answers
/// 401 with a Bearer realm on 127.0.0.3; what reaches 127.0.0.3 is logged to `LOG`.
const REDIRECTOR: &str = r#"
import http.server, sys
port, log = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_HEAD(self): self.do_GET()
    def do_GET(self):
        host = self.headers.get("Host", "").split(":")[0]
        if host == "127.0.0.1":
            self.send_response(302); self.send_header("Location", f"http://127.0.0.2:{port}/img")
        elif host == "127.0.0.2":
            self.send_response(401)
            self.send_header("WWW-Authenticate", f'Bearer realm="http://127.0.0.3:{port}/token",service="x"')
        else:
            with open(log, "a") as f: f.write(repr(self.headers.get("Authorization")) + "\n")
            self.send_response(200)
            body = b'{"token":"t"}'
            self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body); return
        self.send_header("Content-Length", "0"); self.end_headers()
class S(http.server.ThreadingHTTPServer):
    def handle_error(self, *a): pass
S(("0.0.0.0", port), H).serve_forever()
"#;

#[test]
fn credentials_never_answer_a_challenge_from_a_host_a_redirect_led_to() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let port = free_port();
    let log = t.path().join("realm.log");
    let port_arg = port.to_string();
    let _server = python_server(
        t.path(),
        REDIRECTOR,
        &[port_arg.as_ref(), log.as_os_str()],
        port,
    );
    let auth = t.path().join("auth.json");
    std::fs::write(
        &auth,
        format!(r#"{{"auths":{{"127.0.0.1:{port}":{{"auth":"dTpzZWNyZXQ="}}}}}}"#),
    )
    .unwrap();
    let m = t.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    let out = verilay()
        .env("REGISTRY_AUTH_FILE", &auth)
        .args(["mount", "--timeout", "10"])
        .arg(format!("http://127.0.0.1:{port}/img"))
        .args(["--digest", &format!("sha256:{}", "0".repeat(64))])
        .arg(&m)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let seen = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !seen.contains("Basic"),
        "the credentials for 127.0.0.1 reached the realm 127.0.0.2 named: {seen}"
    );
}

#[test]
fn a_server_trickling_bytes_fails_a_read_within_the_timeout() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    // A file far from everything a mount reads: 4 MiB with no repeating block.
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let far: Vec<u8> = (0..4u64 << 20)
        .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8 ^ (i >> 12) as u8)
        .collect();
    std::fs::write(src.join("far"), &far).unwrap();
    let image = t.path().join("app.img");
    let out = build(&src, &image, &["--quiet"]);
    let digest = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let (_server, url) = web_server(t.path());
    // The kernel asks for a file's read-ahead a piece at a time: each of those a server
    // that failed a request refuses within two tries of it.
    for engine in ["fuse", "kernel"] {
        let m = t.path().join(format!("m-{engine}"));
        std::fs::create_dir_all(&m).unwrap();
        run(verilay()
            .args([
                "mount",
                "--quiet",
                "--no-cache",
                "--engine",
                engine,
                "--timeout",
                "2",
                &url,
                "--digest",
                &digest,
            ])
            .arg(&m));
        let _m = Unmount::fuse(&m);
        // From now on five bytes a second: a read of what was not fetched is EIO after
        // about three attempts of --timeout each, not the days a whole chunk would take.
        std::fs::write(t.path().join("slow"), b"").unwrap();
        let start = Instant::now();
        let read = std::fs::read(m.join("far"));
        let took = start.elapsed();
        assert_eq!(
            read.as_ref().err().and_then(|e| e.raw_os_error()),
            Some(5),
            "{engine}: a read through a trickle gave {:?}",
            read.as_ref().map(|b| b.len())
        );
        assert!(
            took < Duration::from_secs(15),
            "{engine}: EIO took {took:?}"
        );
        std::fs::remove_file(t.path().join("slow")).unwrap();
        // Back once a request tried after the trickle ends succeeds: the one trying the
        // server as it ended (the others fail at once meanwhile) may take its attempts.
        let back = Instant::now() + Duration::from_secs(3 * 2 + 5);
        let got = loop {
            match std::fs::read(m.join("far")) {
                Ok(b) => break b,
                Err(e) if Instant::now() < back => {
                    assert_eq!(e.raw_os_error(), Some(5), "{engine}: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("{engine}: still failing once the server is back: {e}"),
            }
        };
        assert!(got == far, "{engine}: read back differs");
    }
}

/// A request waiting on the network holds up no other request from the same CPU: over
/// io_uring the kernel queues each CPU's requests apart, and another thread of that queue
/// serves a read of cached blocks while the first waits on a trickle (over /dev/fuse,
/// another worker does). With one thread per queue, the cached read would wait too.
#[test]
fn a_read_waiting_on_the_network_holds_up_no_other_read_from_its_cpu() {
    if prerequisites()
        || skip_unless(is_root(), "needs root (mounts, drop_caches)")
        || skip_unless(have("taskset"), "taskset missing")
    {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let near = unrepeating(1 << 20, 1 << 40);
    std::fs::write(src.join("near"), &near).unwrap();
    std::fs::write(src.join("far"), unrepeating(4 << 20, 2 << 40)).unwrap();
    let image = t.path().join("app.img");
    let out = build(&src, &image, &["--quiet"]);
    let digest = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let (_server, url) = web_server(t.path());
    let (m, cache) = (t.path().join("m"), t.path().join("cache"));
    std::fs::create_dir_all(&m).unwrap();
    // The FUSE engine's own workers and connection are what this measures.
    run(verilay()
        .args([
            "mount",
            "--quiet",
            "--engine",
            "fuse",
            "--timeout",
            "5",
            &url,
            "--digest",
            &digest,
        ])
        .arg("--cache")
        .arg(&cache)
        .arg(&m));
    let _m = Unmount::fuse(&m);
    assert!(std::fs::read(m.join("near")).unwrap() == near);
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    // The FUSE connection's count of requests sent and not yet answered.
    let conn = std::fs::metadata(&m).unwrap().dev() & 0xff;
    let waiting = || {
        std::fs::read_to_string(format!("/sys/fs/fuse/connections/{conn}/waiting"))
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    std::fs::write(t.path().join("slow"), b"").unwrap();
    // One direct 4 KiB read of `far` from CPU 0: one READ, waiting on the trickle. In
    // its middle: a remote image's first blocks come at open, with its head.
    let mut far_reader = Command::new("taskset")
        .args([
            "-c",
            "0",
            "dd",
            "bs=4096",
            "skip=512",
            "count=1",
            "iflag=direct",
            "status=none",
        ])
        .arg(format!("if={}", m.join("far").display()))
        .arg("of=/dev/null")
        .spawn()
        .unwrap();
    let start = Instant::now();
    while waiting() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "the READ never came"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // From the same CPU, `near` again: its blocks are in the cache, no fetch.
    let again = Command::new("taskset")
        .args(["-c", "0", "cat"])
        .arg(m.join("near"))
        .output()
        .unwrap();
    assert!(
        again.status.success() && again.stdout == near,
        "near read back wrong"
    );
    assert!(
        far_reader.try_wait().unwrap().is_none() && waiting() > 0,
        "the read of near waited for the far one"
    );
    // Once the server answers again, the far read completes (a retry).
    std::fs::remove_file(t.path().join("slow")).unwrap();
    assert!(far_reader.wait().unwrap().success(), "far read failed");
}

/// A source tree of a small file and three big ones (`a`, then 8 MiB, then `b`), built
/// and pushed as `repo_tag`; the tree and the image's digest.
fn pushed_tree(base: &Path, reg: &Registry, repo_tag: &str, seed: u64) -> (PathBuf, String) {
    let src = base.join(format!("src{seed}"));
    std::fs::create_dir_all(src.join("etc")).unwrap();
    std::fs::write(src.join("etc/os-release"), format!("ID=verilay{seed}\n")).unwrap();
    std::fs::write(src.join("a"), unrepeating(4 << 20, seed << 40)).unwrap();
    std::fs::write(src.join("a_gap"), unrepeating(8 << 20, (seed + 1) << 40)).unwrap();
    std::fs::write(src.join("b"), unrepeating(4 << 20, (seed + 2) << 40)).unwrap();
    let image = base.join(format!("image{seed}.img"));
    let digest = String::from_utf8(build(&src, &image, &["--quiet"]).stdout).unwrap();
    run(verilay()
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(reg.reference(repo_tag)));
    (src, digest.trim().to_string())
}

/// `verilay stats --json` of a mount.
fn stats(m: &Path) -> serde_json::Value {
    serde_json::from_slice(&run(verilay().args(["stats", "--json"]).arg(m)).stdout).unwrap()
}

/// `verilay cache ls --json` of `cache`.
fn cache_ls(cache: &Path) -> Vec<serde_json::Value> {
    let out = run(verilay()
        .args(["cache", "ls", "--json", "--cache"])
        .arg(cache));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Mounts `reference` pinned to `digest` on `m` with a cache in `cache`, plus `extra`.
fn mount_cached(reference: &str, digest: &str, cache: &Path, m: &Path, extra: &[&str]) -> Unmount {
    std::fs::create_dir_all(m).unwrap();
    run(verilay()
        .args([
            "mount",
            "--quiet",
            "--insecure",
            reference,
            "--digest",
            digest,
        ])
        .arg("--cache")
        .arg(cache)
        .args(extra)
        .arg(m));
    Unmount::fuse(m)
}

/// Kills the daemon of `m` with SIGKILL and detaches the dead mount.
fn kill_9(m: Unmount) {
    let pids = daemons_of(&m.dir);
    assert_eq!(pids.len(), 1, "daemons of {}: {pids:?}", m.dir.display());
    run(Command::new("kill").args(["-9", &pids[0].to_string()]));
    wait_until(Duration::from_secs(20), "the killed daemon to go", || {
        !Path::new(&format!("/proc/{}", pids[0])).exists()
    });
    let dir = m.dir.clone();
    drop(m);
    wait_daemon_gone(&dir);
}

#[test]
fn the_cache_survives_kill_9_is_reused_and_once_complete_is_the_image() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (src, digest) = pushed_tree(t.path(), &reg, "apps/cached:1", 1);
    let state = t.path().join("proxy");
    std::fs::create_dir_all(&state).unwrap();
    let (_proxy, port) = proxy(&reg, &state);
    let reference = format!("oci://127.0.0.1:{port}/apps/cached:1");
    let cache = t.path().join("cache");
    let m = t.path().join("m");
    let log = t.path().join("log");
    let log_arg = format!("--log={}", log.display());

    // A first mount reads `a`, and dies by SIGKILL while a reader goes through `b`.
    let mounted = mount_cached(&reference, &digest, &cache, &m, &[&log_arg]);
    assert_eq!(
        std::fs::read(m.join("a")).unwrap(),
        unrepeating(4 << 20, 1 << 40)
    );
    let held = stats(&m)["cache_bytes_verified"].as_u64().unwrap();
    assert!(
        held >= 4 << 20,
        "cache holds {held} bytes after reading 4 MiB"
    );
    let reader = Command::new("cat")
        .arg(m.join("b"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    kill_9(mounted);
    let _ = Killed(reader);
    wait_daemon_gone(&m);

    // The next mount finds it: reading `a` again costs (nearly) nothing on the wire.
    let before = fetched(&state);
    let mounted = mount_cached(&reference, &digest, &cache, &m, &[&log_arg]);
    assert_eq!(
        std::fs::read(m.join("a")).unwrap(),
        unrepeating(4 << 20, 1 << 40)
    );
    let cost = fetched(&state) - before;
    assert!(
        cost < 64 << 10,
        "remounting and reading a cached 4 MiB file fetched {cost} bytes"
    );
    let served = stats(&m)["cache_bytes_served"].as_u64().unwrap();
    assert!(served >= 4 << 20, "{served} bytes served from the cache");
    assert_eq!(
        std::fs::read(m.join("b")).unwrap(),
        unrepeating(4 << 20, 3 << 40)
    );

    // A cache file changed behind the mount's back: the block fails its check, is
    // fetched again, and the read still gives the right bytes.
    let file = cache.join(format!("{}.img", digest.replace(':', "-")));
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[4096 + 100] ^= 1; // inside `a` (its data starts at block 1)
    std::fs::write(&file, &bytes).unwrap();
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let before = fetched(&state);
    assert_eq!(
        std::fs::read(m.join("a")).unwrap(),
        unrepeating(4 << 20, 1 << 40)
    );
    assert!(
        fetched(&state) > before,
        "the damaged block was not fetched again"
    );
    drop(mounted);
    wait_daemon_gone(&m);

    // --prefetch completes the cache in the background, with progress in stats.
    let mounted = mount_cached(&reference, &digest, &cache, &m, &["--prefetch"]);
    wait_until(Duration::from_secs(60), "the prefetch to finish", || {
        let v = stats(&m);
        v["prefetch_bytes_done"] == v["prefetch_bytes_total"]
            && v["cache_bytes_verified"] == v["remote_image_bytes"]
    });
    let entries = cache_ls(&cache);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["complete"], true, "{entries:?}");
    assert_eq!(entries[0]["in_use"], true, "{entries:?}");
    drop(mounted);
    wait_daemon_gone(&m);
    // The daemon's lock goes with its last descriptor, which the kernel may close a
    // moment after the process has left /proc (an exiting task's files are put late).
    wait_until(Duration::from_secs(10), "the cache to be released", || {
        cache_ls(&cache)[0]["in_use"] == false
    });

    // The complete cache is the image: the kernel mounts it, verilay verifies it.
    run(verilay()
        .args(["verify", "--quiet", "--digest", &digest])
        .arg(&file));
    let k = t.path().join("k");
    std::fs::create_dir_all(&k).unwrap();
    run(Command::new("mount")
        .args(["-t", "erofs", "-o", "ro"])
        .arg(&file)
        .arg(&k));
    let unmount_k = Unmount::kernel(&k);
    assert_diff_clean(&src, &k);
    drop(unmount_k);

    // prune removes what no mount uses.
    run(verilay().args(["cache", "prune", "--cache"]).arg(&cache));
    assert!(cache_ls(&cache).is_empty());
    assert!(!file.exists());
}

#[test]
fn the_cache_keeps_to_its_size_and_refuses_a_directory_others_may_write() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (src1, d1) = pushed_tree(t.path(), &reg, "apps/one:1", 1);
    let (src2, d2) = pushed_tree(t.path(), &reg, "apps/two:1", 7);
    let cache = t.path().join("cache");
    let m = t.path().join("m");
    // Each image (~16 MiB) fits in 20 MiB, two do not: the second mount removes the
    // first, unused, once it needs the room, not before.
    let mount = |repo: &str, digest: &str| {
        mount_cached(
            &reg.reference(repo),
            digest,
            &cache,
            &m,
            &["--cache-size=20M"],
        )
    };
    let mounted = mount("apps/one:1", &d1);
    assert_diff_clean(&src1, &m);
    drop(mounted);
    wait_daemon_gone(&m);
    let mounted = mount("apps/two:1", &d2);
    assert_eq!(
        std::fs::read_to_string(m.join("etc/os-release")).unwrap(),
        "ID=verilay7\n"
    );
    let entries = cache_ls(&cache);
    assert_eq!(
        entries.len(),
        2,
        "pruned before the room was needed: {entries:?}"
    );
    assert_diff_clean(&src2, &m);
    drop(mounted);
    wait_daemon_gone(&m);
    let entries = cache_ls(&cache);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["digest"], d2.as_str());
    // A cache directory that is not there is named, not made, by `ls` and `prune`.
    let typo = t.path().join("cahce");
    for action in ["ls", "prune"] {
        let out = verilay()
            .args(["cache", action, "--cache"])
            .arg(&typo)
            .output()
            .unwrap();
        assert_one_line(&out, &["cache directory", "No such file"]);
    }
    assert!(!typo.exists());
    assert!(
        entries[0]["disk_bytes"].as_u64().unwrap() <= 20 << 20,
        "{entries:?}"
    );
    // A limit smaller than the image: reads work, the cache stops at the limit.
    let small = t.path().join("small");
    let mounted = mount_cached(
        &reg.reference("apps/one:1"),
        &d1,
        &small,
        &m,
        &["--cache-size=1M"],
    );
    assert_diff_clean(&src1, &m);
    let held = stats(&m)["cache_bytes_verified"].as_u64().unwrap();
    assert!(held <= 1 << 20, "a 1 MiB cache holds {held} bytes");
    drop(mounted);
    wait_daemon_gone(&m);

    // A directory another user may write is refused; a link planted in ours is never
    // written through.
    use std::os::unix::fs::PermissionsExt;
    let open = t.path().join("open");
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mount = |cache: &Path| {
        verilay()
            .args([
                "mount",
                "--insecure",
                &reg.reference("apps/one:1"),
                "--digest",
                &d1,
            ])
            .arg("--cache")
            .arg(cache)
            .arg(&m)
            .output()
            .unwrap()
    };
    assert_one_line(&mount(&open), &["cache directory", "writable by you alone"]);
    let planted = t.path().join("planted");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o700)).unwrap();
    let victim = t.path().join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    let stem = d1.replace(':', "-");
    std::os::unix::fs::symlink(&victim, planted.join(format!("{stem}.img"))).unwrap();
    assert_one_line(&mount(&planted), &["cache", &stem]);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(daemons_of(&m).is_empty());
}

/// `len` bytes no 4 KiB block of which repeats (so no two blocks share a hash), by `seed`.
fn unrepeating(len: u64, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((i ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8 ^ (i >> 12) as u8)
        .collect()
}

/// `verilay push --insecure IMAGE` to `repo_tag` of `reg`; the manifest digest it prints.
fn push(reg: &Registry, image: &Path, repo_tag: &str) -> String {
    let out = run(verilay()
        .args(["push", "--insecure", "--quiet"])
        .arg(image)
        .arg(reg.reference(repo_tag)));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Two layers as an application's image has them, built into `app.img` and `base.img`:
/// app replaces a file of base (and its xattr), adds files, deletes one (a whiteout) and
/// hides a directory's content (an opaque directory). (image, digest) of each, top first.
fn app_over_base(dir: &Path) -> [(PathBuf, String); 2] {
    let (app, base) = (dir.join("app"), dir.join("base"));
    std::fs::create_dir_all(&app).unwrap();
    std::fs::create_dir_all(&base).unwrap();
    sh(&format!(
        "set -e; cd {}
         mkdir -p etc opt/keep var/cache bin
         echo ID=base > etc/os-release; setfattr -n user.origin -v base etc/os-release
         echo keep > opt/keep/k; echo old > var/cache/old; echo gone > gone
         ln -s etc/os-release link; cp /bin/true bin/tool; chmod 4755 bin/tool
         echo owned > owned; chown 1234:2345 owned; chmod 0750 opt
         setfattr -n user.dir -v base opt; touch -d '2001-02-03 04:05:06.123456789' owned",
        base.display()
    ));
    std::fs::write(base.join("big"), unrepeating(2 << 20, 3)).unwrap();
    sh(&format!(
        "set -e; cd {}
         mkdir -p etc var/cache srv
         echo ID=app > etc/os-release; setfattr -n user.origin -v app etc/os-release
         echo new > srv/new; mknod gone c 0 0
         setfattr -n trusted.overlay.opaque -v y var/cache; echo fresh > var/cache/fresh",
        app.display()
    ));
    [app, base].map(|tree| {
        let image = dir.join(format!(
            "{}.img",
            tree.file_name().unwrap().to_string_lossy()
        ));
        let out = build(&tree, &image, &["--quiet"]);
        (
            image,
            String::from_utf8(out.stdout).unwrap().trim().to_string(),
        )
    })
}

/// `verilay mount --quiet --insecure ARGS... MNT` (images, pins, an upper directory...),
/// unmounted when dropped.
fn mount_stack<S: AsRef<std::ffi::OsStr>>(args: &[S], mnt: &Path) -> Unmount {
    std::fs::create_dir_all(mnt).unwrap();
    run(verilay()
        .args(["mount", "--quiet", "--insecure"])
        .args(args)
        .arg(mnt));
    Unmount::fuse(mnt)
}

/// Asserts that two mounts show the same tree: contents, every stat field, `ls -lR`, and
/// xattrs.
fn assert_same_tree(want: &Path, got: &Path) {
    assert_diff_clean(want, got);
    assert_same_stats(want, got);
    assert_eq!(ls_lr(want), ls_lr(got), "ls -lR");
    assert_eq!(xattr_dump(want), xattr_dump(got), "getfattr");
}

/// What app over base adds up to, checked by hand (so that a comparison of two mounts
/// that both show nothing cannot pass).
fn assert_app_over_base(m: &Path) {
    let read = |p: &str| std::fs::read_to_string(m.join(p)).unwrap();
    assert_eq!(read("etc/os-release"), "ID=app\n");
    assert_eq!(read("srv/new"), "new\n");
    assert_eq!(read("opt/keep/k"), "keep\n");
    assert_eq!(read("link"), "ID=app\n");
    assert!(!m.join("gone").exists(), "the whiteout hides gone");
    let cache: Vec<_> = std::fs::read_dir(m.join("var/cache"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(cache, ["fresh"], "the opaque directory hides base's");
    assert!(std::fs::read(m.join("big")).unwrap() == unrepeating(2 << 20, 3));
}

/// Changes made through a writable mount: a new file, bytes patched in the middle of a
/// large file of the bottom layer (a copy-up), a file of the bottom layer deleted, an
/// xattr set on a file of the top layer, a mode changed, a directory made.
const STACK_CHANGES: &str = "set -e
    echo hello > hello
    printf patched | dd of=big bs=1 seek=1048581 conv=notrunc status=none
    rm opt/keep/k; setfattr -n user.note -v set etc/os-release; chmod 0600 owned
    mkdir srv/sub";

/// The merged tree without times (the two runs change it at different moments): `ls`,
/// each file's sha256, xattrs.
/// `ls -lRAn` without times or the directories' `total` block counts (what the upper
/// directory's filesystem allocated: the engines write different overlay xattrs, which
/// can take a block of their own), file contents and xattrs of the tree at `root`.
fn view_without_times(root: &Path) -> String {
    let ls = run(Command::new("ls")
        .args(["-lRAn", "--time-style=+", "."])
        .current_dir(root));
    let ls: Vec<&[u8]> = ls
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.starts_with(b"total "))
        .collect();
    let ls = ls.join(&b'\n');
    let sums = sh(&format!(
        "cd '{}' && find . -type f -print0 | sort -z | xargs -0 sha256sum",
        root.display()
    ));
    format!(
        "{}\n{}\n{:?}",
        String::from_utf8_lossy(&ls),
        String::from_utf8_lossy(&sums.stdout),
        xattr_dump(root)
    )
}

/// An upper directory's entries (type, mode, owner, size, device numbers) and xattrs.
fn upper_entries(upper: &Path) -> String {
    let out = sh(&format!(
        "cd '{}' && find . -mindepth 1 -printf '%P %y %m %U:%G %s\\n' | sort && \
         find . -type c -exec stat -c '%n %t:%T' {{}} + | sort",
        upper.display()
    ));
    format!(
        "{}\n{:?}",
        String::from_utf8_lossy(&out.stdout),
        xattr_dump(upper)
    )
}

#[test]
fn a_stack_of_remote_images_under_an_upper_directory_is_the_stack_of_local_ones() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts, whiteouts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let [(app, _), (base, _)] = app_over_base(t.path());
    let app_ref = reg.reference(&format!("apps/app@{}", push(&reg, &app, "apps/app:2")));
    let base_ref = reg.reference(&format!("apps/base@{}", push(&reg, &base, "apps/base:1")));
    // The same two images, local and remote (pinned by their manifests), each with an
    // empty upper directory of the same mode and times.
    let (ld, rd) = (dirs(t.path(), "local"), dirs(t.path(), "remote"));
    for d in [&ld, &rd] {
        sh(&format!(
            "touch -d '2020-01-01 00:00:00' '{}'",
            d.upper.display()
        ));
    }
    let stack = |top: &std::ffi::OsStr, bottom: &std::ffi::OsStr, d: &Dirs| {
        let (upper, work) = (d.upper.as_os_str(), d.work.as_os_str());
        [
            top,
            bottom,
            "--upper".as_ref(),
            upper,
            "--work".as_ref(),
            work,
        ]
        .map(|s| s.to_os_string())
    };
    // Both on one engine, whose upper directories are compared byte for byte (each
    // engine writes overlay xattrs of its own): the pass's, and in the kernel engine's
    // pass (auto) the kernel engine.
    let engine = match std::env::var("VERILAY_ENGINE").as_deref() {
        Ok("kernel") | Ok("auto") => "kernel",
        _ => "fuse",
    };
    let mut local_args = stack(app.as_os_str(), base.as_os_str(), &ld).to_vec();
    let mut remote_args = stack(app_ref.as_ref(), base_ref.as_ref(), &rd).to_vec();
    for args in [&mut local_args, &mut remote_args] {
        args.extend(["--engine".into(), engine.into()]);
    }
    let (lm, rm) = (t.path().join("lm"), t.path().join("rm"));
    {
        let _l = mount_stack(&local_args, &lm);
        let _r = mount_stack(&remote_args, &rm);
        assert_app_over_base(&rm);
        assert_same_tree(&lm, &rm);
        let v: serde_json::Value =
            serde_json::from_slice(&run(verilay().args(["stats", "--json"]).arg(&rm)).stdout)
                .unwrap();
        assert!(
            v["remote_bytes_fetched"].as_u64().unwrap() > 2 << 20,
            "the remote mount fetched less than big: {v}"
        );
        // The same changes through both.
        for m in [&lm, &rm] {
            sh(&format!("cd '{}' && {STACK_CHANGES}", m.display()));
        }
        assert_eq!(view_without_times(&lm), view_without_times(&rm));
    }
    wait_daemon_gone(&lm);
    wait_daemon_gone(&rm);
    // What landed in the remote mount's upper directory: the copied-up file whole, the
    // new file, a whiteout for the deleted one; the same as the local mount's.
    let u = &rd.upper;
    let mut big = unrepeating(2 << 20, 3);
    big[1048581..1048581 + 7].copy_from_slice(b"patched");
    assert!(
        std::fs::read(u.join("big")).unwrap() == big,
        "the copied-up file in the upper directory is not the patched file whole"
    );
    assert_eq!(std::fs::read_to_string(u.join("hello")).unwrap(), "hello\n");
    assert_eq!(
        std::fs::read_to_string(u.join("etc/os-release")).unwrap(),
        "ID=app\n"
    );
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let k = std::fs::symlink_metadata(u.join("opt/keep/k")).unwrap();
    assert!(
        k.file_type().is_char_device() && k.rdev() == 0,
        "no whiteout for opt/keep/k"
    );
    assert_eq!(upper_entries(&ld.upper), upper_entries(u));
    // The kernel's overlayfs, over the kernel's erofs mounts of the local images, reads
    // the upper directory the remote mount wrote as the remote stack does again.
    let (ka, kb) = (
        Mount::erofs(&app, &t.path().join("ka")),
        Mount::erofs(&base, &t.path().join("kb")),
    );
    let ko = overlay_ro(&[u, &ka.dir, &kb.dir], &t.path().join("ko"));
    let _r = mount_stack(&remote_args, &rm);
    assert_eq!(view_without_times(&ko.dir), view_without_times(&rm));
    assert_eq!(
        std::fs::read_to_string(rm.join("hello")).unwrap(),
        "hello\n"
    );
}

#[test]
fn remote_and_local_layers_stack_together_and_each_remote_layer_is_pinned_on_its_own() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts, whiteouts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let [(app, app_digest), (base, base_digest)] = app_over_base(t.path());
    push(&reg, &app, "apps/app:2");
    let base_manifest = push(&reg, &base, "apps/base:1");
    let (app_tag, base_tag) = (reg.reference("apps/app:2"), reg.reference("apps/base:1"));
    let base_pinned = reg.reference(&format!("apps/base@{base_manifest}"));
    let local = t.path().join("local");
    let _local = mount_stack(&[&app, &base], &local);
    assert_app_over_base(&local);
    let m = t.path().join("m");
    // A remote top by tag over a local bottom, each pinned by --digest; a local top over
    // a remote bottom pinned by its manifest (and the local image, unpinned); two remote
    // layers by tag, each pinned by its own --digest.
    let app_s = app.to_str().unwrap();
    let base_s = base.to_str().unwrap();
    let stacks: [Vec<&str>; 3] = [
        vec![
            &app_tag,
            "--digest",
            &app_digest,
            base_s,
            "--digest",
            &base_digest,
        ],
        vec![app_s, &base_pinned],
        vec![
            &app_tag,
            &base_tag,
            "--digest",
            &app_digest,
            "--digest",
            &base_digest,
        ],
    ];
    for args in &stacks {
        let mounted = mount_stack(args, &m);
        assert_same_tree(&local, &m);
        drop(mounted);
        wait_daemon_gone(&m);
    }
    // Pins go to the layers in order: swapped, or one for two layers, they are refused.
    let mnt = m.to_str().unwrap();
    let cases: [(Vec<&str>, Vec<&str>); 3] = [
        (
            vec![
                &app_tag,
                &base_tag,
                "--digest",
                &base_digest,
                "--digest",
                &app_digest,
            ],
            vec!["apps/app:2", "pinned", &base_digest],
        ),
        (
            vec![&app_tag, &base_tag, "--digest", &app_digest],
            vec!["1 --digest for 2 images"],
        ),
        (
            // The manifest records base's digest: a --digest naming another is refused.
            vec![
                app_s,
                &base_pinned,
                "--digest",
                &app_digest,
                "--digest",
                &app_digest,
            ],
            vec!["records image digest", &base_digest, &app_digest],
        ),
    ];
    for (args, needles) in cases {
        let mut full = vec!["mount", "--insecure", "--timeout", "10"];
        full.extend(args.iter().copied());
        full.push(mnt);
        assert_one_line(&verilay_out(&full), &needles);
        assert!(
            std::fs::read_dir(&m).unwrap().next().is_none(),
            "{args:?}: something is mounted"
        );
    }
}

/// The measurement list's entries after boot_aggregate, sorted: (pcr, template, digest
/// field, path below the mountpoint `mnt`).
fn measured(log: &Path, mnt: &Path) -> Vec<(u32, String, String, String)> {
    let text = std::fs::read_to_string(log.join("ascii_runtime_measurements")).unwrap();
    let mut lines = text.lines();
    assert!(
        lines.next().unwrap().ends_with(" boot_aggregate"),
        "the list starts with boot_aggregate: {text}"
    );
    let prefix = format!("{}/", std::fs::canonicalize(mnt).unwrap().display());
    let mut all: Vec<_> = lines
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = f[4].strip_prefix(&prefix).unwrap_or(f[4]);
            (
                f[0].parse().unwrap(),
                f[2].to_string(),
                f[3].to_string(),
                path.to_string(),
            )
        })
        .collect();
    all.sort();
    all
}

/// Opens, reads and runs files of a measuring mount, in the same order each time.
const MEASURED_OPENS: &str = "set -e
    cat a big owned >/dev/null; ./tool; cat tool >/dev/null
    exec 3<v; exec 3<&-
    echo hello > new; cat new >/dev/null";

#[test]
fn a_measuring_mount_of_a_remote_image_logs_what_one_of_the_local_image_logs() {
    if prerequisites()
        || skip_unless(is_root(), "needs root (mounts)")
        || skip_unless(have("evmctl"), "needs evmctl (ima-evm-utils)")
        || skip_unless(have("fsverity"), "needs fsverity")
    {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), "alpha\n").unwrap();
    let big = unrepeating((1 << 20) + 12345, 5);
    std::fs::write(src.join("big"), &big).unwrap();
    std::fs::write(src.join("owned"), "owned by 1234\n").unwrap();
    std::fs::write(src.join("v"), unrepeating(100_000, 6)).unwrap();
    std::fs::copy("/bin/true", src.join("tool")).unwrap();
    sh(&format!(
        "cd '{0}' && chown 1234 owned && chown 4321 v && chmod 0755 tool",
        src.display()
    ));
    let image = t.path().join("app.img");
    build(&src, &image, &["--quiet"]);
    let remote = reg.reference(&format!("apps/app@{}", push(&reg, &image, "apps/app:1")));
    let info = run(verilay().args(["inspect", "--json"]).arg(&image)).stdout;
    let uuid = serde_json::from_slice::<serde_json::Value>(&info).unwrap()["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    // By the image's uuid (so the remote layer must report the local image's), by owner
    // and by hook; verity digests for what 4321 owns; anything else opened to read only,
    // as in the upper directory (its write-only creation is not).
    let policy = t.path().join("policy");
    std::fs::write(
        &policy,
        format!(
            "dont_measure fowner=1234\n\
             measure func=BPRM_CHECK pcr=11\n\
             measure func=FILE_CHECK fowner=4321 digest_type=verity template=ima-ngv2 pcr=13\n\
             measure func=FILE_CHECK mask=MAY_READ fsuuid={uuid} pcr=12\n\
             measure func=FILE_CHECK mask=MAY_READ pcr=14\n"
        ),
    )
    .unwrap();
    let mut lists = Vec::new();
    for (name, layer) in [("local", image.as_os_str()), ("remote", remote.as_ref())] {
        let (log, mnt, d) = (
            t.path().join(format!("{name}-log")),
            t.path().join(format!("{name}-m")),
            dirs(t.path(), name),
        );
        let args: Vec<&std::ffi::OsStr> = vec![
            layer,
            "--upper".as_ref(),
            d.upper.as_ref(),
            "--work".as_ref(),
            d.work.as_ref(),
            "--policy".as_ref(),
            policy.as_ref(),
            "--measure-log".as_ref(),
            log.as_ref(),
        ];
        let mounted = mount_stack(&args, &mnt);
        sh(&format!("cd '{}' && {MEASURED_OPENS}", mnt.display()));
        let v: serde_json::Value =
            serde_json::from_slice(&run(verilay().args(["stats", "--json"]).arg(&mnt)).stdout)
                .unwrap();
        assert_eq!(v["layers"][0]["fsuuid"], uuid.as_str(), "{name}: {v}");
        if name == "remote" {
            assert!(
                v["remote_bytes_fetched"].as_u64().unwrap() > big.len() as u64,
                "the remote mount fetched less than big: {v}"
            );
        }
        drop(mounted);
        wait_daemon_gone(&mnt);
        assert!(evmctl_accepts(&log), "evmctl rejects the {name} list");
        lists.push(measured(&log, &mnt));
    }
    // Each file's digest, by independent tools: sha256sum, and fsverity for v.
    let verity = run(Command::new("fsverity").arg("digest").arg(src.join("v"))).stdout;
    let verity = String::from_utf8(verity).unwrap();
    let tool = std::fs::read(src.join("tool")).unwrap();
    let mut want: Vec<(u32, String, String, String)> = vec![
        (12, "ima-ng".into(), sha256_of(b"alpha\n"), "a".into()),
        (12, "ima-ng".into(), sha256_of(&big), "big".into()),
        (11, "ima-ng".into(), sha256_of(&tool), "tool".into()),
        (12, "ima-ng".into(), sha256_of(&tool), "tool".into()),
        (
            13,
            "ima-ngv2".into(),
            format!("verity:{}", verity.split_whitespace().next().unwrap()),
            "v".into(),
        ),
        (14, "ima-ng".into(), sha256_of(b"hello\n"), "new".into()),
    ];
    want.sort();
    assert_eq!(lists[0], want, "the local image's list");
    assert_eq!(lists[1], lists[0], "the remote image's list differs");
}

#[test]
fn a_failed_fetch_fails_one_measured_open_or_copy_up_and_the_next_try_succeeds() {
    if prerequisites()
        || skip_unless(is_root(), "needs root (mounts)")
        || skip_unless(have("evmctl"), "needs evmctl (ima-evm-utils)")
    {
        return;
    }
    let mut reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // Files far apart in the image (8 MiB between them, more than a sequential reader's
    // readahead reaches): hashing or copying one fetches nothing of another.
    let (a, b, c) = (
        unrepeating(4 << 20, 1),
        unrepeating(4 << 20, 2),
        unrepeating(4 << 20, 3),
    );
    let gap = unrepeating(8 << 20, 4);
    for (name, bytes) in [
        ("a", &a),
        ("a_gap", &gap),
        ("b", &b),
        ("b_gap", &gap),
        ("c", &c),
    ] {
        std::fs::write(src.join(name), bytes).unwrap();
    }
    let image = t.path().join("app.img");
    build(&src, &image, &["--quiet"]);
    let manifest = push(&reg, &image, "apps/app:1");
    let state = t.path().join("proxy");
    std::fs::create_dir_all(&state).unwrap();
    let (_proxy, port) = proxy(&reg, &state);
    let policy = t.path().join("policy");
    std::fs::write(&policy, "measure func=FILE_CHECK mask=MAY_READ\n").unwrap();
    let (log, mlog, m) = (
        t.path().join("log"),
        t.path().join("mlog"),
        t.path().join("m"),
    );
    let d = dirs(t.path(), "rw");
    let remote = format!("oci://127.0.0.1:{port}/apps/app@{manifest}");
    let args: Vec<&std::ffi::OsStr> = vec![
        remote.as_ref(),
        "--policy".as_ref(),
        policy.as_ref(),
        "--measure-log".as_ref(),
        mlog.as_ref(),
        "--log".as_ref(),
        log.as_ref(),
        "--upper".as_ref(),
        d.upper.as_ref(),
        "--work".as_ref(),
        d.work.as_ref(),
    ];
    let mounted = mount_stack(&args, &m);
    let eio = |r: std::io::Result<std::fs::File>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(5), "{what}: {e}");
    };
    // Flipped bytes on the wire: the measured open fails, with a log line, and the next
    // one (the network honest again) succeeds: what the failed hash fetched is not kept.
    std::fs::write(state.join("flip"), b"").unwrap();
    eio(
        std::fs::File::open(m.join("a")),
        "a measured open of flipped bytes",
    );
    assert!(
        std::fs::read_to_string(&log).unwrap().contains("/a: "),
        "no log line naming a"
    );
    std::fs::remove_file(state.join("flip")).unwrap();
    assert!(
        std::fs::read(m.join("a")).unwrap() == a,
        "a read back differs"
    );
    // The same for a copy-up, which leaves nothing half copied in the upper directory.
    std::fs::write(state.join("flip"), b"").unwrap();
    let append = || std::fs::OpenOptions::new().append(true).open(m.join("c"));
    eio(append(), "a copy-up of flipped bytes");
    assert!(!d.upper.join("c").exists(), "a failed copy-up left c");
    std::fs::remove_file(state.join("flip")).unwrap();
    append().unwrap().write_all(b"appended").unwrap();
    // The registry gone: a measured open of what was never fetched fails; back, it works.
    reg.kill();
    eio(
        std::fs::File::open(m.join("b")),
        "a measured open, registry gone",
    );
    reg.restart();
    assert!(
        std::fs::read(m.join("b")).unwrap() == b,
        "b read back differs"
    );
    drop(mounted);
    wait_daemon_gone(&m);
    let mut c_after = c.clone();
    c_after.extend_from_slice(b"appended");
    assert!(
        std::fs::read(d.upper.join("c")).unwrap() == c_after,
        "the copied-up c in the upper directory is not c whole, appended"
    );
    // The list holds each file once, with its right digest, and nothing of the failures.
    assert!(evmctl_accepts(&mlog), "evmctl rejects the list");
    let want = vec![
        (10, "ima-ng".to_string(), sha256_of(&a), "a".to_string()),
        (10, "ima-ng".to_string(), sha256_of(&b), "b".to_string()),
    ];
    assert_eq!(measured(&mlog, &m), want);
}

/// The cache entry files (`.img`, `.map`) of `digest` in `cache`.
fn entry_files(cache: &Path, digest: &str) -> (PathBuf, PathBuf) {
    let stem = digest.replace(':', "-");
    (
        cache.join(format!("{stem}.img")),
        cache.join(format!("{stem}.map")),
    )
}

#[test]
fn the_cache_refetches_a_damaged_descriptor_trailer_or_padding_instead_of_refusing_to_mount() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    // 1 KiB EROFS blocks: the data ends inside a 4 KiB unit, so zeros pad it to the tree.
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), unrepeating(1 << 20, 31 << 40)).unwrap();
    std::fs::write(src.join("small"), "hello\n").unwrap();
    let image = t.path().join("app.img");
    let digest = String::from_utf8(build(&src, &image, &["--quiet", "-b", "1024"]).stdout)
        .unwrap()
        .trim()
        .to_string();
    let bytes = std::fs::read(&image).unwrap();
    let len = bytes.len();
    let data_size = u64::from_le_bytes(bytes[len - 48..len - 40].try_into().unwrap()) as usize;
    assert!(
        !data_size.is_multiple_of(4096),
        "no padding after {data_size} bytes"
    );
    let reference = reg.reference("apps/padded:1");
    run(verilay()
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(&reference));
    let cache = t.path().join("cache");
    let m = t.path().join("m");
    let mounted = mount_cached(&reference, &digest, &cache, &m, &["--prefetch"]);
    wait_until(Duration::from_secs(60), "the prefetch to finish", || {
        let v = stats(&m);
        v["cache_bytes_verified"] == v["remote_image_bytes"]
    });
    drop(mounted);
    wait_daemon_gone(&m);
    let (file, _) = entry_files(&cache, &digest);
    assert!(
        std::fs::read(&file).unwrap() == bytes,
        "the complete cache is the image"
    );
    // What a power cut leaves (the record on disk, not the data: zeros), or another
    // process's writes: the record still marks the units, their bytes are wrong.
    let flipped = [bytes[len - 300] ^ 1];
    let damages: [(&str, usize, &[u8]); 3] = [
        ("a descriptor byte", len - 300, &flipped),
        ("the tail zeroed", len - 320, &[0; 320]),
        ("a padding byte", data_size + 10, &[1]),
    ];
    for (what, at, damage) in damages {
        let mut cached = std::fs::read(&file).unwrap();
        cached[at..at + damage.len()].copy_from_slice(damage);
        std::fs::write(&file, &cached).unwrap();
        let out = verilay()
            .args([
                "mount",
                "--quiet",
                "--insecure",
                &reference,
                "--digest",
                &digest,
            ])
            .arg("--cache")
            .arg(&cache)
            .arg(&m)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{what} in the cache file: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mounted = Unmount::fuse(&m);
        assert_diff_clean(&src, &m);
        drop(mounted);
        wait_daemon_gone(&m);
    }
}

#[test]
fn a_server_lying_about_the_length_neither_wipes_nor_prunes_the_cache() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (_, d1) = pushed_tree(t.path(), &reg, "apps/one:1", 21);
    let (_, d2) = pushed_tree(t.path(), &reg, "apps/two:1", 23);
    let cache = t.path().join("cache");
    let m = t.path().join("m");
    // Two entries: image two's, unused, and image one's with its file `a`.
    for (repo, digest, file) in [
        ("apps/two:1", &d2, "etc/os-release"),
        ("apps/one:1", &d1, "a"),
    ] {
        let mounted = mount_cached(&reg.reference(repo), digest, &cache, &m, &[]);
        std::fs::read(m.join(file)).unwrap();
        drop(mounted);
        wait_daemon_gone(&m);
    }
    let before = cache_ls(&cache);
    assert_eq!(before.len(), 2, "{before:?}");
    let summary = |entries: &[serde_json::Value]| -> Vec<String> {
        entries
            .iter()
            .map(|e| format!("{} {}/{}", e["digest"], e["cached_bytes"], e["image_bytes"]))
            .collect()
    };
    // A web server with image one's bytes, pinned right, but a length of its own: longer
    // by some garbage, then a sparse 8 TiB (which a size limit of 10G cannot hold).
    let www = t.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let (_server, url) = web_server(&www);
    let mut bytes = std::fs::read(t.path().join("image21.img")).unwrap();
    bytes.extend_from_slice(&unrepeating(1 << 20, 5 << 40));
    std::fs::write(www.join("app.img"), &bytes).unwrap();
    for len in [None, Some(8u64 << 40)] {
        if let Some(len) = len {
            std::fs::File::options()
                .write(true)
                .open(www.join("app.img"))
                .unwrap()
                .set_len(len)
                .unwrap();
        }
        let out = verilay()
            .args(["mount", "--timeout", "10", &url, "--digest", &d1, "--cache"])
            .arg(&cache)
            .arg(&m)
            .output()
            .unwrap();
        assert_one_line(&out, &["app.img"]);
        assert!(daemons_of(&m).is_empty());
        assert_eq!(
            summary(&cache_ls(&cache)),
            summary(&before),
            "a {len:?}-byte answer changed the cache"
        );
    }
}

#[test]
fn a_full_cache_filesystem_mounts_without_caching() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (src, digest) = pushed_tree(t.path(), &reg, "apps/full:1", 41);
    let cache = t.path().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    run(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k,mode=700", "tmpfs"])
        .arg(&cache));
    let _tmpfs = Unmount::kernel(&cache);
    // Filled to the last byte.
    let fill = std::fs::File::create(cache.join("fill")).unwrap();
    let mut w = std::io::BufWriter::new(fill);
    while w.write_all(&[0u8; 4096]).and_then(|_| w.flush()).is_ok() {}
    drop(w);
    let m = t.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    let out = verilay()
        .args([
            "mount",
            "--insecure",
            &reg.reference("apps/full:1"),
            "--digest",
            &digest,
        ])
        .arg("--cache")
        .arg(&cache)
        .arg(&m)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let _m = Unmount::fuse(&m);
    assert!(err.contains("without a cache"), "{err}");
    assert_diff_clean(&src, &m);
}

#[test]
fn a_read_next_to_cached_bytes_fetches_a_chunk_not_a_run() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (_, digest) = pushed_tree(t.path(), &reg, "apps/next:1", 51);
    let reference = reg.reference("apps/next:1");
    let cache = t.path().join("cache");
    let m = t.path().join("m");
    let mounted = mount_cached(&reference, &digest, &cache, &m, &[]);
    assert_eq!(
        std::fs::read(m.join("a")).unwrap(),
        unrepeating(4 << 20, 51 << 40)
    );
    drop(mounted);
    wait_daemon_gone(&m);
    // A later mount: `a` is in the cache, 4 KiB of the file after it are read. The
    // cached chunks behind say nothing about this reader: one chunk, not a 4 MiB run.
    let _mounted = mount_cached(&reference, &digest, &cache, &m, &[]);
    let before = stats(&m)["remote_bytes_fetched"].as_u64().unwrap();
    let mut head = [0u8; 4096];
    std::fs::File::open(m.join("a_gap"))
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    assert_eq!(head[..], unrepeating(4096, 52 << 40)[..]);
    let cost = stats(&m)["remote_bytes_fetched"].as_u64().unwrap() - before;
    assert!(
        cost <= 1 << 20,
        "reading 4 KiB next to cached bytes fetched {cost} bytes"
    );
}

/// Bytes the server keeps sending wrong: the prefetch passes over them (a read of them is
/// EIO) and completes the rest, instead of trying the same step again forever.
#[test]
fn a_prefetch_passes_over_bytes_the_server_keeps_wrong() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let (a, b) = (unrepeating(4 << 20, 1), unrepeating(4 << 20, 2));
    std::fs::write(src.join("a"), &a).unwrap();
    std::fs::write(src.join("b"), &b).unwrap();
    let image = t.path().join("app.img");
    let digest = String::from_utf8(build(&src, &image, &["--quiet"]).stdout).unwrap();
    let bytes = std::fs::read(&image).unwrap();
    let at = bytes
        .windows(64)
        .position(|w| w == &b[..64])
        .expect("b's data in the image");
    run(verilay()
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(reg.reference("apps/wrong:1")));
    let state = t.path().join("proxy");
    std::fs::create_dir_all(&state).unwrap();
    let (_proxy, port) = proxy(&reg, &state);
    // The second MiB of b, wrong on every fetch.
    std::fs::write(
        state.join("flip"),
        format!("{} {}", at + (1 << 20), at + (2 << 20)),
    )
    .unwrap();
    let reference = format!("oci://127.0.0.1:{port}/apps/wrong:1");
    let m = t.path().join("m");
    let cache = t.path().join("cache");
    let _mounted = mount_cached(&reference, digest.trim(), &cache, &m, &["--prefetch"]);
    wait_until(Duration::from_secs(60), "the prefetch to finish", || {
        let v = stats(&m);
        v["prefetch_bytes_done"] == v["prefetch_bytes_total"]
    });
    assert!(stats(&m)["prefetch_failures"].as_u64().unwrap() >= 1);
    assert!(
        std::fs::read(m.join("a")).unwrap() == a,
        "a read back differs"
    );
    let e = std::fs::read(m.join("b")).expect_err("b's wrong bytes were served");
    assert_eq!(e.raw_os_error(), Some(5), "{e}");
}

/// The prefetch's steps reach the cache around the page cache (`O_DIRECT`): once it is
/// done, util-linux's fincore finds little of the entry in memory, and the entry is the
/// image (`verify` against the pinned digest). On both engines (the kernel engine's daemon
/// fetches and stores as the FUSE engine's does).
#[test]
fn the_prefetch_stores_around_the_page_cache() {
    if prerequisites()
        || skip_unless(is_root(), "needs root (mounts)")
        || skip_unless(have("fincore"), "needs fincore (util-linux-extra)")
    {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (_, digest) = pushed_tree(t.path(), &reg, "apps/around:1", 23);
    // On the disk the build is on: /tmp may be a tmpfs, whose files are the page cache.
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let m = t.path().join("m");
    for engine in ["fuse", "kernel"] {
        let cache = disk.path().join(format!("cache-{engine}"));
        let mounted = mount_cached(
            &reg.reference("apps/around:1"),
            &digest,
            &cache,
            &m,
            &["--prefetch", "--engine", engine],
        );
        assert_eq!(stats(&m)["engine"], engine);
        wait_until(Duration::from_secs(60), "the prefetch to finish", || {
            let v = stats(&m);
            v["prefetch_bytes_done"] == v["prefetch_bytes_total"]
                && v["cache_bytes_verified"] == v["remote_image_bytes"]
        });
        let file = cache.join(format!("{}.img", digest.replace(':', "-")));
        let out = run(Command::new("fincore")
            .args(["--bytes", "--noheadings", "--output", "RES,SIZE"])
            .arg(&file));
        let text = String::from_utf8(out.stdout).unwrap();
        let [resident, size]: [u64; 2] = text
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect::<Vec<_>>()
            .try_into()
            .unwrap();
        assert!(size > 16 << 20, "{engine}: {text}");
        // What the mount itself read (superblock, root, the tree) went through memory.
        assert!(
            resident < size / 8,
            "{engine}: {resident} of the entry's {size} bytes are in the page cache"
        );
        drop(mounted);
        wait_daemon_gone(&m);
        run(verilay()
            .args(["verify", "--quiet", "--digest", &digest])
            .arg(&file));
    }
}

/// Whether the daemon of `m` still runs its prefetch thread.
fn prefetching(m: &Path) -> bool {
    daemons_of(m).iter().any(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks.flatten().any(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "prefetch")
                })
            })
            .unwrap_or(false)
    })
}

#[test]
fn a_prefetch_stops_when_the_cache_is_full() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (_, digest) = pushed_tree(t.path(), &reg, "apps/limit:1", 61);
    let reference = reg.reference("apps/limit:1");
    let m = t.path().join("m");
    for limit in ["--cache-size=0", "--cache-size=1M"] {
        let cache = t.path().join(format!("cache{limit}"));
        let mounted = mount_cached(&reference, &digest, &cache, &m, &["--prefetch", limit]);
        wait_until(Duration::from_secs(60), "the prefetch to stop", || {
            !prefetching(&m)
        });
        let v = stats(&m);
        let fetched = v["remote_bytes_fetched"].as_u64().unwrap();
        let image = v["remote_image_bytes"].as_u64().unwrap();
        assert!(
            fetched < image / 2,
            "{limit}: the prefetch fetched {fetched} of {image} bytes it could not keep"
        );
        drop(mounted);
        wait_daemon_gone(&m);
    }
}

#[test]
fn an_ordinary_user_whose_home_is_not_there_mounts_without_a_cache() {
    if prerequisites() || lacks_test_user() || skip_unless(is_root(), "needs root (runuser)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (_, digest) = pushed_tree(t.path(), &reg, "apps/nohome:1", 71);
    let base = t.path().join("user");
    std::fs::create_dir_all(base.join("m")).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_verilay"), base.join("verilay")).unwrap();
    sh(&format!(
        "chmod 755 '{}' && chown -R verilaytest '{}'",
        t.path().display(),
        base.display()
    ));
    // As for `nobody` and many service accounts: no cache directory was asked for, and
    // the default one (~/.cache/verilay) cannot be made.
    let out = as_test_user(
        &base,
        &format!(
            "env -u VERILAY_CACHE -u XDG_CACHE_HOME HOME=/nonexistent ./verilay mount \
             --insecure {} --digest {digest} m",
            reg.reference("apps/nohome:1")
        ),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let _m = Unmount::fuse(&base.join("m"));
    assert!(err.contains("without a cache"), "{err}");
    let read = as_test_user(&base, "cat m/etc/os-release");
    assert_eq!(String::from_utf8_lossy(&read.stdout), "ID=verilay71\n");
}

/// `dd` of `count` blocks of `bs` bytes from `file` at block `skip`, with O_DIRECT (every
/// read reaches the daemon as asked, none from the page cache).
fn dd_direct(file: &Path, bs: u64, skip: u64, count: u64) {
    sh(&format!(
        "dd if='{}' of=/dev/null bs={bs} skip={skip} count={count} iflag=direct status=none",
        file.display()
    ));
}

/// A sequential reader's runs go on past blocks a sparse reader fetched before it (one
/// request costs a registry as much as megabytes of body), while sparse reads fetch only
/// what they read. `VERILAY_FETCH_EXACT=1` fetches just the 4 KiB blocks read, one
/// request each: never more than the real policy for the same reads.
#[test]
fn sequential_runs_span_blocks_already_here_and_exact_mode_fetches_only_blocks_read() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (src, digest) = pushed_tree(t.path(), &reg, "runs/tree:1", 7);
    let reference = reg.reference("runs/tree:1");
    let m = t.path().join("m");
    let file = m.join("a_gap"); // 8 MiB
    let mut fetched = Vec::new();
    for (cache, exact) in [("c1", "0"), ("c2", "1")] {
        std::fs::create_dir_all(&m).unwrap();
        run(verilay()
            .env("VERILAY_FETCH_EXACT", exact)
            // O_DIRECT reads, which the FUSE engine passes on one by one (file-backed
            // erofs refuses O_DIRECT).
            .args([
                "mount",
                "--quiet",
                "--engine",
                "fuse",
                "--insecure",
                &reference,
                "--digest",
                &digest,
            ])
            .arg("--cache")
            .arg(t.path().join(cache))
            .arg(&m));
        let mnt = Unmount::fuse(&m);
        let count = |k: &str| stats(&m)[k].as_u64().unwrap();
        let (r0, b0) = (count("remote_requests"), count("remote_bytes_fetched"));
        // One 4 KiB block of every 128 KiB: 64 sparse reads, one block each.
        for k in 0..64 {
            dd_direct(&file, 4096, k * 32, 1);
        }
        let (r1, b1) = (count("remote_requests"), count("remote_bytes_fetched"));
        assert_eq!(
            (r1 - r0, b1 - b0),
            (64, 64 * 4096),
            "sparse reads (exact={exact})"
        );
        // Then the whole file in order, 128 KiB at a time: one run per 128 KiB if a run
        // stopped at each block already here; a few growing runs if it spans them.
        dd_direct(&file, 128 << 10, 0, 64);
        let (r2, b2) = (count("remote_requests"), count("remote_bytes_fetched"));
        let (sequential, bytes) = (r2 - r1, b2 - b1);
        if exact == "1" {
            assert_eq!((sequential, bytes), (2048 - 64, (2048 - 64) * 4096));
        } else {
            assert!(
                sequential <= 16,
                "reading 8 MiB in order after 64 sparse reads took {sequential} requests"
            );
        }
        fetched.push(bytes);
        let out = Command::new("cmp")
            .arg(src.join("a_gap"))
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        drop(mnt);
    }
    assert!(
        fetched[1] <= fetched[0],
        "exact mode fetched {} bytes, more than the real policy's {}",
        fetched[1],
        fetched[0]
    );
}

/// A compressed image (LZ4HC, 64 KiB clusters) mounted from the registry: a file read
/// fetches its clusters, not the image, and the whole tree reads back as its source; a
/// cluster flipped in the registry's storage is an EIO, never bytes.
#[test]
fn a_compressed_image_mounts_from_the_registry_fetching_what_is_read() {
    if prerequisites() || skip_unless(is_root(), "needs root (mount(2) of FUSE)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("text")).unwrap();
    for i in 0..40 {
        let body: String = (0..20_000)
            .map(|n| format!("line {n} of file {i}\n"))
            .collect();
        std::fs::write(src.join(format!("text/f{i}")), body).unwrap();
    }
    std::fs::write(src.join("random"), unrepeating(1 << 20, 7)).unwrap();
    let image = t.path().join("z.img");
    let digest =
        String::from_utf8(build(&src, &image, &["--quiet", "-z", "lz4hc", "-C", "65536"]).stdout)
            .unwrap()
            .trim()
            .to_string();
    let manifest = push(&reg, &image, "z:1");
    let at = format!("{}@{manifest}", reg.reference("z"));
    let m = mount_stack(
        &["--no-cache", "--digest", &digest, &at],
        &t.path().join("m"),
    );
    let before = stats(&m.dir)["remote_bytes_fetched"].as_u64().unwrap();
    let one = std::fs::read(m.dir.join("text/f3")).unwrap();
    assert_eq!(one, std::fs::read(src.join("text/f3")).unwrap());
    let cost = stats(&m.dir)["remote_bytes_fetched"].as_u64().unwrap() - before;
    let size = std::fs::metadata(&image).unwrap().len();
    assert!(
        cost < size / 4,
        "one file fetched {cost} of the {size}-byte image"
    );
    assert_diff_clean(&src, &m.dir);
    drop(m);

    // A byte flipped at 60% of the EROFS part in the registry's storage (the blob is the
    // image file: compressed clusters of the text files): on a fresh mount every file
    // reads back as its source or fails with EIO, and some file fails.
    let info = run(verilay().args(["inspect", "--json"]).arg(&image));
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let erofs_bytes = info["erofs_bytes"].as_u64().unwrap();
    let blob = reg.blob_file(&sha256_of(&std::fs::read(&image).unwrap()));
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[(erofs_bytes * 6 / 10) as usize] ^= 0x40;
    std::fs::write(&blob, bytes).unwrap();
    let m = mount_stack(
        &["--no-cache", "--digest", &digest, &at],
        &t.path().join("m2"),
    );
    let mut failed = 0;
    for e in std::fs::read_dir(src.join("text")).unwrap() {
        let name = e.unwrap().file_name();
        match std::fs::read(m.dir.join("text").join(&name)) {
            Ok(got) => assert_eq!(got, std::fs::read(src.join("text").join(&name)).unwrap()),
            Err(e) => {
                let eio = rustix::io::Errno::IO.raw_os_error();
                assert_eq!(e.raw_os_error(), Some(eio), "{name:?}: {e}");
                failed += 1;
            }
        }
    }
    assert!(failed > 0, "the flipped byte was never read");
}

/// A program's pages fault in scattered order, each a round trip to the registry: the
/// first read of an executable's start (as exec and the dynamic loader read it) fetches
/// all of it (up to 16 MiB), on whichever engine serves the mount, and serves the verified
/// bytes. Other reads are as before: a page in the middle of a data file or of another
/// executable fetches far less than the file.
#[test]
fn the_first_read_of_a_remote_executable_fetches_it_whole() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let (prog, data) = (unrepeating(6 << 20, 7 << 40), unrepeating(6 << 20, 9 << 40));
    std::fs::write(src.join("prog"), &prog).unwrap();
    std::fs::write(src.join("prog2"), &data).unwrap();
    std::fs::write(src.join("data"), &data).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for p in ["prog", "prog2"] {
        std::fs::set_permissions(src.join(p), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let image = t.path().join("image.img");
    let digest = String::from_utf8(build(&src, &image, &["--quiet"]).stdout).unwrap();
    push(&reg, &image, "apps/exec:1");
    let m = t.path().join("m");
    let _m = mount_cached(
        &reg.reference("apps/exec:1"),
        digest.trim(),
        &t.path().join("cache"),
        &m,
        &[],
    );
    let fetched = || stats(&m)["remote_bytes_fetched"].as_u64().unwrap();
    // One page of a file: the bytes, and what reading it fetched.
    let page = |name: &str, at: usize| -> (Vec<u8>, u64) {
        use std::io::{Read, Seek};
        let before = fetched();
        let mut f = std::fs::File::open(m.join(name)).unwrap();
        f.seek(std::io::SeekFrom::Start(at as u64)).unwrap();
        let mut buf = vec![0u8; 4096];
        f.read_exact(&mut buf).unwrap();
        (buf, fetched() - before)
    };
    let mid = 3 << 20;
    for name in ["data", "prog2"] {
        let (got, cost) = page(name, mid);
        assert_eq!(got, data[mid..mid + 4096]);
        assert!(
            cost < 4 << 20,
            "a page in the middle of {name} fetched {cost} bytes"
        );
    }
    let (got, cost) = page("prog", 0);
    assert_eq!(got, prog[..4096]);
    assert!(
        cost >= 6 << 20,
        "the first page of a program fetched {cost} bytes"
    );
    // All of it is there now: reading it whole does not fetch it again. (The kernel
    // engine's read-ahead on the image file may run on past its end, into the bytes of
    // the file after it: less than the program.) The window the first read scheduled
    // past the program's end (the files after it) is let finish first: its bytes are
    // not the program's.
    let mut last = fetched();
    wait_until(Duration::from_secs(30), "the readahead to end", || {
        std::thread::sleep(Duration::from_millis(500));
        let now = fetched();
        std::mem::replace(&mut last, now) == now
    });
    let before = fetched();
    assert_eq!(std::fs::read(m.join("prog")).unwrap(), prog);
    let again = fetched() - before;
    assert!(
        again < 6 << 20,
        "reading the program again fetched {again} bytes"
    );
}

/// Mounting a remote image asks the registry for each thing once: the manifest, the tail,
/// the tree, the head (fetched while the tree comes): `verilay mount` leaves the remote
/// image to its daemon, and the tail checked before the cache opens is not fetched again.
/// On both engines (the kernel engine's daemon opens the image as the FUSE engine's does).
#[test]
fn a_remote_mount_asks_the_registry_for_each_thing_once() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let (_src, digest) = pushed_tree(t.path(), &reg, "apps/once:1", 21);
    let state = t.path().join("proxy");
    std::fs::create_dir_all(&state).unwrap();
    let (_proxy, port) = proxy(&reg, &state);
    let m = t.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    for engine in ["fuse", "kernel"] {
        let cache = t.path().join(format!("cache-{engine}"));
        let _ = std::fs::remove_file(state.join("requests"));
        let out = run(verilay()
            .args(["mount", "--insecure", "--engine", engine])
            .arg(format!("oci://127.0.0.1:{port}/apps/once:1"))
            .args(["--digest", &digest, "--cache"])
            .arg(&cache)
            .arg(&m));
        let _m = Unmount::fuse(&m);
        // The daemon said how far it trusts the image, for `verilay mount` to announce.
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains(&format!("digest {digest} (pinned)")),
            "{engine}: {said}"
        );
        let requests = std::fs::read_to_string(state.join("requests")).unwrap();
        let manifests = requests
            .lines()
            .filter(|l| l.contains("/manifests/"))
            .count();
        assert_eq!(manifests, 1, "{engine}: {requests}");
        // No byte fetched twice (the head may come in one request or, the readahead thread
        // late, two).
        let mut ranges: Vec<(u64, u64)> = requests
            .lines()
            .filter_map(|l| l.split(' ').nth(2)?.strip_prefix("bytes="))
            .map(|r| {
                let (a, b) = r.split_once('-').unwrap();
                (a.parse().unwrap(), b.parse().unwrap())
            })
            .collect();
        ranges.sort_unstable();
        assert!(
            ranges.windows(2).all(|w| w[0].1 < w[1].0),
            "{engine}: bytes fetched twice: {requests}"
        );
        assert!(
            ranges.first().is_some_and(|r| r.0 == 0),
            "{engine}: {requests}"
        );
        drop(_m);
        wait_daemon_gone(&m);
    }
}

/// At open, a remote image's tree (1/128 of it) and the data's last block before it (the
/// file-digest table's footer, read next) come in pieces on several connections at once,
/// the image's head beside them: over a long round trip the mount waits for one round of
/// them, not for each in turn.
#[test]
fn a_remote_mount_fetches_its_tree_in_pieces_at_once() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), unrepeating(96 << 20, 7 << 40)).unwrap();
    let image = t.path().join("app.img");
    let digest = String::from_utf8(build(&src, &image, &["--quiet"]).stdout).unwrap();
    run(verilay()
        .args(["push", "--insecure", "--quiet"])
        .arg(&image)
        .arg(reg.reference("apps/tree:1")));
    let state = t.path().join("proxy");
    std::fs::create_dir_all(&state).unwrap();
    let (_proxy, port) = proxy(&reg, &state);
    std::fs::write(state.join("delay"), "0.3").unwrap();
    let m = t.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    let size = std::fs::metadata(&image).unwrap().len();
    // On both engines: the kernel engine's daemon opens the image as the FUSE engine's does.
    for engine in ["fuse", "kernel"] {
        let _ = std::fs::remove_file(state.join("requests"));
        run(verilay()
            .args(["mount", "--quiet", "--insecure", "--engine", engine])
            .arg(format!("oci://127.0.0.1:{port}/apps/tree:1"))
            .args(["--digest", digest.trim(), "--cache"])
            // A cache of its own: the other engine's would hold the tree already.
            .arg(t.path().join(format!("cache-{engine}")))
            .arg(&m));
        let mounted = Unmount::fuse(&m);
        let requests = std::fs::read_to_string(state.join("requests")).unwrap();
        let ranges: Vec<(u64, u64, u64)> = requests
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                let (a, b) = f.get(2)?.strip_prefix("bytes=")?.split_once('-')?;
                Some((a.parse().ok()?, b.parse().ok()?, f.get(3)?.parse().ok()?))
            })
            .collect();
        // Past the file's 96 MiB: the data's last blocks and the tree, before the
        // descriptor and trailer (the last 320 bytes, fetched first on their own).
        let tree = |r: &(u64, u64, u64)| r.0 >= 96 << 20 && r.1 < size - 320;
        let pieces = ranges.iter().filter(|r| tree(r)).count();
        let together = ranges.iter().map(|r| r.2).max().unwrap_or(0);
        assert!(
            pieces >= 3 && together >= 3,
            "{engine}: {pieces} requests for the tree, at most {together} in flight:\n{requests}"
        );
        drop(mounted);
        wait_daemon_gone(&m);
    }
}

/// The prefetch's threads hash at nice 10 (`remote::prefetch::NICE`): below readers, and
/// not starved by every other busy task as at 19.
#[test]
fn the_prefetch_runs_at_a_low_cpu_priority() {
    if prerequisites() || skip_unless(is_root(), "needs root (mounts)") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // Large enough that its prefetch is still under way when the mount returns.
    std::fs::write(src.join("f"), unrepeating(256 << 20, 5 << 40)).unwrap();
    let image = t.path().join("app.img");
    let digest = String::from_utf8(build(&src, &image, &["--quiet"]).stdout).unwrap();
    let (_server, url) = web_server(t.path());
    let (m, cache) = (t.path().join("m"), t.path().join("cache"));
    std::fs::create_dir_all(&m).unwrap();
    run(verilay()
        .args([
            "mount",
            "--quiet",
            "--engine",
            "fuse",
            "--prefetch",
            "--timeout",
            "5",
        ])
        .args([url.as_str(), "--digest", digest.trim(), "--cache"])
        .arg(&cache)
        .arg(&m));
    let mounted = Unmount::fuse(&m);
    // The server trickles from now on: the prefetch waits on its next steps.
    std::fs::write(t.path().join("slow"), b"").unwrap();
    let nices = || -> Vec<i64> {
        daemons_of(&m)
            .iter()
            .flat_map(|pid| {
                std::fs::read_dir(format!("/proc/{pid}/task"))
                    .unwrap()
                    .flatten()
            })
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "prefetch")
            })
            .filter_map(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
                // After the command's closing parenthesis: field 19 is the nice value.
                let rest = &stat[stat.rfind(')')? + 2..];
                rest.split(' ').nth(16)?.parse().ok()
            })
            .collect()
    };
    wait_until(Duration::from_secs(20), "the prefetch threads", || {
        !nices().is_empty()
    });
    let seen = nices();
    assert!(
        seen.iter().all(|&n| n == 10),
        "prefetch threads' nice values: {seen:?}"
    );
    std::fs::remove_file(t.path().join("slow")).unwrap();
    drop(mounted);
}
