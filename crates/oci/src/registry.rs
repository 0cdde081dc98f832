//! The distribution spec's HTTP API as verilay needs it: manifests and blobs, pushed and
//! fetched, with registry auth (docs/SECURITY.md section 9).
//!
//! - Credentials go only to the registry and its token server, over TLS or locally; one 401 per
//!   request is answered, from the registry only.
//! - Replies are capped; blobs stream to the caller, which checks them.
//! - Requests are bounded by `--timeout`.

use crate::auth::{self, Challenge, Credentials};
use crate::reference::Reference;
use sha2::{Digest as _, Sha256};
use std::io::Read;
use std::sync::Mutex;
use std::time::Duration;
use ureq::http::{Response, StatusCode};

/// One line saying what failed, naming the registry and what was asked.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Error(pub String);

/// A result whose error is an [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Why a range read failed.
#[derive(Debug, thiserror::Error)]
pub enum RangeError {
    /// The request failed, or its body ended early or ran long: another try may do.
    #[error("{0}")]
    Failed(#[from] Error),
    /// The server answered with other bytes than those asked, as its Content-Range says:
    /// another try would bring the same.
    #[error("{0}")]
    OtherBytes(Error),
}

/// The manifests verilay reads (OCI, and what an index or a docker manifest would be, to
/// name them in an error).
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json";

/// The most of a manifest read (distribution's own limit is 4 MiB).
const MANIFEST_MAX: u64 = 4 << 20;
/// The most of an error body or token answer read.
const SMALL_MAX: u64 = 64 << 10;
/// Idle connections kept per registry host.
const IDLE_PER_HOST: usize = 16;

/// A connection to one registry, for one repository's operations.
pub struct Registry {
    agent: ureq::Agent,
    base: String,
    name: String,
    credentials: Option<Credentials>,
    /// The `Authorization` header that last worked (a token, or Basic).
    authorization: Mutex<Option<String>>,
    timeout: Duration,
}

/// What a request sends.
pub enum Body<'a> {
    /// No body.
    Empty,
    /// These bytes.
    Bytes(&'a [u8]),
    /// A reader of `len` bytes, made afresh for each attempt.
    Reader(u64, &'a dyn Fn() -> std::io::Result<Box<dyn Read + 'a>>),
}

/// Whether plain HTTP may be used with `host`: only on this machine.
pub fn is_local(host: &str) -> bool {
    host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback())
}

impl Registry {
    /// A client for `r`'s registry: HTTPS with the system's roots, or plain HTTP when
    /// `insecure` (refused unless the registry is on this machine). Credentials come from
    /// the auth files (see [`auth::auth_files`]).
    pub fn connect(r: &Reference, insecure: bool, timeout: Duration) -> Result<Registry> {
        if insecure && !is_local(r.host()) {
            return Err(Error(format!(
                "{r}: --insecure (plain HTTP) is only for a registry on this machine, not {}",
                r.host()
            )));
        }
        let scheme = if insecure { "http" } else { "https" };
        Registry::new(&r.registry, format!("{scheme}://{}", r.registry), timeout)
            .map_err(|e| Error(format!("{r}: {e}")))
    }

    /// A client for `base` (`SCHEME://HOST[:PORT]`), with the credentials filed under
    /// `name` (`HOST[:PORT]`).
    fn new(name: &str, base: String, timeout: Duration) -> Result<Registry> {
        let credentials = auth::lookup(name).map_err(Error)?;
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::PlatformVerifier)
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(timeout))
            .timeout_recv_response(Some(timeout))
            .timeout_per_read(Some(timeout))
            .timeout_per_write(Some(timeout))
            // A remote image's readers and readahead fetch at once, each on a connection
            // of its own: kept for the next range rather than closed (ureq keeps 3).
            .max_idle_connections_per_host(IDLE_PER_HOST)
            .max_idle_connections(4 * IDLE_PER_HOST)
            .tls_config(tls)
            .user_agent(concat!("verilay/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Registry {
            agent,
            base,
            name: name.to_string(),
            credentials,
            authorization: Mutex::new(None),
            timeout,
        })
    }

    /// Sends a request, answering one auth challenge (401) and trying again. A bodiless
    /// request is bounded as a whole (twice the timeout), so a server trickling bytes
    /// cannot hold a reader forever; an upload is bounded per read and write.
    pub fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &Body<'_>,
    ) -> Result<Response<ureq::Body>> {
        self.send_bounded(method, url, headers, body, true)
    }

    /// A bodiless request whose answer (a whole blob) may rightly take long: bounded per
    /// read only.
    fn send_streamed(&self, method: &str, url: &str) -> Result<Response<ureq::Body>> {
        self.send_bounded(method, url, &[], &Body::Empty, false)
    }

    fn send_bounded(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &Body<'_>,
        whole: bool,
    ) -> Result<Response<ureq::Body>> {
        let mut challenged = false;
        loop {
            let auth = self.authorization.lock().unwrap().clone();
            let resp = self.attempt(method, url, headers, body, auth.as_deref(), whole)?;
            if resp.status() != StatusCode::UNAUTHORIZED || challenged {
                return Ok(resp);
            }
            challenged = true;
            // A challenge from another host (one a redirect led to) is not answered:
            // it would name a token server of its choosing for our credentials.
            if !self.is_ours(&ureq::ResponseExt::get_uri(&resp).to_string()) {
                return Ok(resp);
            }
            let challenge = resp
                .headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .and_then(auth::parse_challenge);
            let header = match challenge {
                Some(Challenge::Basic) => match &self.credentials {
                    Some(c) if keeps_secrets(url) => c.basic(),
                    _ => return Ok(resp),
                },
                Some(Challenge::Bearer {
                    realm,
                    service,
                    scope,
                }) => format!(
                    "Bearer {}",
                    self.token(&realm, service.as_deref(), scope.as_deref())?
                ),
                None => return Ok(resp),
            };
            *self.authorization.lock().unwrap() = Some(header);
        }
    }

    fn attempt(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &Body<'_>,
        auth: Option<&str>,
        whole: bool,
    ) -> Result<Response<ureq::Body>> {
        let mut req = ureq::http::Request::builder().method(method).uri(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        // Credentials go to the registry alone, not to a host an answer points at
        // (an upload's Location, a blob's redirect).
        if let Some(a) = auth.filter(|_| self.is_ours(url) && keeps_secrets(url)) {
            req = req.header("Authorization", a);
        }
        let failed = |e: &dyn std::fmt::Display| {
            Error(format!("registry {}: {method} {url}: {e}", self.name))
        };
        let result = match body {
            Body::Empty => {
                let req = req.body(()).map_err(|e| failed(&e))?;
                let req = if whole {
                    self.agent
                        .configure_request(req)
                        .timeout_global(Some(self.timeout * 2))
                        .build()
                } else {
                    req
                };
                self.agent.run(req)
            }
            Body::Bytes(b) => {
                let req = req
                    .header("Content-Length", b.len().to_string())
                    .body(*b)
                    .map_err(|e| failed(&e))?;
                self.agent.run(req)
            }
            Body::Reader(len, open) => {
                // Paced as a download is: a registry reading an upload a byte at a time
                // cannot hold a push past its bound either.
                let mut r = Paced::new(open().map_err(|e| failed(&e))?, self.timeout);
                let req = req
                    .header("Content-Length", len.to_string())
                    .body(ureq::SendBody::from_reader(&mut r))
                    .map_err(|e| failed(&e))?;
                self.agent.run(req)
            }
        };
        result.map_err(|e| failed(&reachability(e)))
    }

    /// A Bearer token from the registry's token server (with Basic credentials when the
    /// auth files have some).
    fn token(&self, realm: &str, service: Option<&str>, scope: Option<&str>) -> Result<String> {
        let mut url = realm.to_string();
        let mut sep = if url.contains('?') { '&' } else { '?' };
        for (k, v) in [("service", service), ("scope", scope)] {
            if let Some(v) = v {
                url.push(sep);
                url.push_str(k);
                url.push('=');
                url.push_str(&percent_encode(v));
                sep = '&';
            }
        }
        // Plain HTTP only for a token server on this machine, of a registry reached so
        // (`--insecure`): credentials travel over TLS or over loopback, never the network.
        let plain_ok = url.starts_with("http://") && self.base.starts_with("http://");
        if !(url.starts_with("https://") || (plain_ok && keeps_secrets(&url))) {
            return Err(Error(format!(
                "registry {}: token server {realm:?} is neither https nor on this machine",
                self.name
            )));
        }
        let basic = self.credentials.as_ref().map(|c| c.basic());
        let mut req = ureq::http::Request::builder().method("GET").uri(&url);
        if let Some(b) = &basic {
            req = req.header("Authorization", b);
        }
        let req = req
            .body(())
            .map_err(|e| Error(format!("token server {realm}: {e}")))?;
        // Bounded as a whole: a token server trickling its answer cannot hold a mount.
        let req = self
            .agent
            .configure_request(req)
            .timeout_global(Some(self.timeout * 2))
            .build();
        let mut resp = self
            .agent
            .run(req)
            .map_err(|e| Error(format!("token server {realm}: {}", reachability(e))))?;
        if !resp.status().is_success() {
            let what = if basic.is_some() {
                "the credentials from the auth file were refused"
            } else {
                "anonymous access refused; log in (auth.json or ~/.docker/config.json)"
            };
            return Err(Error(format!(
                "token server {realm}: {} ({what})",
                resp.status()
            )));
        }
        let text = resp
            .body_mut()
            .with_config()
            .limit(SMALL_MAX)
            .read_to_string()
            .map_err(|e| Error(format!("token server {realm}: answer: {e}")))?;
        token_of_answer(&text).map_err(|e| Error(format!("token server {realm}: {e}")))
    }

    /// Whether `url` is on this registry (scheme, host and port).
    fn is_ours(&self, url: &str) -> bool {
        url.strip_prefix(&self.base)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    fn url(&self, repo: &str, rest: &str) -> String {
        format!("{}/v2/{repo}/{rest}", self.base)
    }

    /// Whether the repository has the blob.
    pub fn has_blob(&self, repo: &str, digest: &str) -> Result<bool> {
        let url = self.url(repo, &format!("blobs/{digest}"));
        let resp = self.send("HEAD", &url, &[], &Body::Empty)?;
        match resp.status() {
            s if s.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(self.refused("HEAD", &url, resp)),
        }
    }

    /// Uploads a blob of `len` bytes (one monolithic PUT), unless the repository has it.
    pub fn push_blob(&self, repo: &str, digest: &str, body: &Body<'_>) -> Result<()> {
        if self.has_blob(repo, digest)? {
            return Ok(());
        }
        let start = self.url(repo, "blobs/uploads/");
        let resp = self.send("POST", &start, &[], &Body::Empty)?;
        if resp.status() != StatusCode::ACCEPTED {
            return Err(self.refused("POST", &start, resp));
        }
        let location = resp
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| Error(format!("registry {}: upload without a Location", self.name)))?;
        let mut url = if location.starts_with("http://") || location.starts_with("https://") {
            location.to_string()
        } else {
            format!("{}{location}", self.base)
        };
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&format!("digest={}", percent_encode(digest)));
        let resp = self.send(
            "PUT",
            &url,
            &[("Content-Type", "application/octet-stream")],
            body,
        )?;
        if resp.status() != StatusCode::CREATED {
            return Err(self.refused("PUT", &url, resp));
        }
        Ok(())
    }

    /// Stores a manifest under `tag`; returns its digest.
    pub fn put_manifest(
        &self,
        repo: &str,
        tag: &str,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<String> {
        Ok(self
            .put_manifest_noting_subject(repo, tag, bytes, media_type)?
            .0)
    }

    /// [`Registry::put_manifest`], and whether the registry took the manifest's subject
    /// (it answered with `OCI-Subject`, as registries with the referrers API do).
    pub fn put_manifest_noting_subject(
        &self,
        repo: &str,
        tag: &str,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<(String, bool)> {
        let url = self.url(repo, &format!("manifests/{tag}"));
        let resp = self.send(
            "PUT",
            &url,
            &[("Content-Type", media_type)],
            &Body::Bytes(bytes),
        )?;
        if resp.status() != StatusCode::CREATED {
            return Err(self.refused("PUT", &url, resp));
        }
        let took_subject = resp.headers().contains_key("oci-subject");
        Ok((sha256_digest(bytes), took_subject))
    }

    /// `SCHEME://HOST[:PORT]`.
    pub(crate) fn base_url(&self) -> &str {
        &self.base
    }

    /// [`Registry::get_manifest`], or `None` if the registry has no such manifest (404).
    pub fn get_manifest_if_any(
        &self,
        repo: &str,
        target: &str,
    ) -> Result<Option<(Vec<u8>, String)>> {
        self.fetch_manifest(repo, target, true)
    }

    /// A manifest and its media type.
    pub fn get_manifest(&self, repo: &str, target: &str) -> Result<(Vec<u8>, String)> {
        self.fetch_manifest(repo, target, false)?.ok_or_else(|| {
            Error(format!(
                "registry {}: no manifest {repo}:{target}",
                self.name
            ))
        })
    }

    fn fetch_manifest(
        &self,
        repo: &str,
        target: &str,
        missing_ok: bool,
    ) -> Result<Option<(Vec<u8>, String)>> {
        let url = self.url(repo, &format!("manifests/{target}"));
        let mut resp = self.send("GET", &url, &[("Accept", MANIFEST_ACCEPT)], &Body::Empty)?;
        if missing_ok && resp.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !resp.status().is_success() {
            return Err(self.refused("GET", &url, resp));
        }
        let media_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(MANIFEST_MAX)
            .read_to_vec()
            .map_err(|e| Error(format!("registry {}: GET {url}: {e}", self.name)))?;
        Ok(Some((bytes, media_type)))
    }

    /// A blob's bytes, as a reader (the caller checks them against the digest).
    pub fn get_blob(&self, repo: &str, digest: &str) -> Result<Box<dyn Read + Send>> {
        let url = self.url(repo, &format!("blobs/{digest}"));
        let resp = self.send_streamed("GET", &url)?;
        if !resp.status().is_success() {
            return Err(self.refused("GET", &url, resp));
        }
        Ok(Box::new(Paced::new(
            resp.into_body().into_reader(),
            self.timeout,
        )))
    }

    /// A client for a plain URL (`http(s)://HOST[:PORT]/PATH`) of an image file: the same
    /// transport and auth flows, with no repository. Plain HTTP is the URL's own choice.
    pub fn for_url(url: &str, timeout: Duration) -> Result<Registry> {
        let (scheme, rest) = url
            .split_once("://")
            .filter(|(s, _)| *s == "http" || *s == "https")
            .ok_or_else(|| Error(format!("{url}: not an http(s) URL")))?;
        let host = rest.split('/').next().unwrap_or("");
        if !crate::reference::valid_host(host) {
            return Err(Error(format!("{url}: {host:?} is not a host[:port]")));
        }
        Registry::new(host, format!("{scheme}://{host}"), timeout)
            .map_err(|e| Error(format!("{url}: {e}")))
    }

    /// The URL of a blob of `repo`.
    pub fn blob_url(&self, repo: &str, digest: &str) -> String {
        self.url(repo, &format!("blobs/{digest}"))
    }

    /// The size of what `url` serves (a HEAD's Content-Length).
    pub fn size_of(&self, url: &str) -> Result<u64> {
        let resp = self.send("HEAD", url, &[], &Body::Empty)?;
        if !resp.status().is_success() {
            return Err(self.refused("HEAD", url, resp));
        }
        resp.headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error(format!("{url}: the server gives no Content-Length")))
    }

    /// Bytes `offset..offset + len` of what `url` serves, by a range request, handed to
    /// `read` as they arrive: `read` must take exactly `len` bytes, or fail (a body that
    /// ends early reads as `UnexpectedEof`, see [`short_body`]). A body longer than asked
    /// is the server's error, found after.
    pub fn get_range_into(
        &self,
        url: &str,
        offset: u64,
        len: u64,
        read: &mut dyn FnMut(&mut dyn Read) -> std::io::Result<()>,
    ) -> std::result::Result<(), RangeError> {
        let range = format!("bytes={}-{}", offset, offset + len - 1);
        let mut resp = self.send("GET", url, &[("Range", &range)], &Body::Empty)?;
        let whole = match resp.status() {
            StatusCode::PARTIAL_CONTENT => false,
            StatusCode::OK if offset == 0 => true,
            s if s.is_success() => {
                return Err(Error(format!(
                    "{url}: the server answers a range request with {s}: it must serve ranges"
                ))
                .into())
            }
            _ => return Err(self.refused("GET", url, resp).into()),
        };
        let failed = |e: &dyn std::fmt::Display| Error(format!("{url}: bytes {offset}+{len}: {e}"));
        // Bytes other than the range's would fail their hash above us, after a request's
        // worth of reading: a reply that names other bytes is refused here. (One without a
        // Content-Range is taken: its bytes are still hashed.)
        if let (false, Some(v)) = (whole, resp.headers().get("content-range")) {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
            if content_range_start(&v) != Some(offset) {
                return Err(RangeError::OtherBytes(failed(&format!(
                    "the server answered with Content-Range {v:?}, not the bytes asked"
                ))));
            }
        }
        if whole {
            // The whole file for a range at its start: its first `len` bytes will do.
            let mut body = resp.body_mut().as_reader().take(len);
            return Ok(read(&mut body).map_err(|e| failed(&e))?);
        }
        // One byte past `len` is allowed in, to see a longer body; reading to the body's
        // end returns the connection to the pool for the next range.
        let mut body = resp.body_mut().with_config().limit(len + 1).reader();
        read(&mut body).map_err(|e| failed(&e))?;
        let mut more = [0u8; 1];
        match body.read(&mut more) {
            Ok(0) => Ok(()),
            Ok(_) => Err(failed(&"the server sent more than asked").into()),
            Err(e) => Err(failed(&e).into()),
        }
    }

    /// An error for an answer that was not the one expected: the status and the
    /// registry's own error code and message, if it sent them.
    fn refused(&self, method: &str, url: &str, mut resp: Response<ureq::Body>) -> Error {
        let status = resp.status();
        let text = resp
            .body_mut()
            .with_config()
            .limit(SMALL_MAX)
            .read_to_string()
            .unwrap_or_default();
        let detail = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| {
                let e = v.get("errors")?.get(0)?.clone();
                Some(format!(
                    "{} {}",
                    e.get("code")?.as_str()?,
                    e.get("message").and_then(|m| m.as_str()).unwrap_or("")
                ))
            })
            .unwrap_or_default();
        let hint = match status {
            StatusCode::UNAUTHORIZED if self.credentials.is_none() => {
                " (no credentials for this registry in $REGISTRY_AUTH_FILE, containers' auth.json or ~/.docker/config.json)"
            }
            StatusCode::UNAUTHORIZED => " (the credentials from the auth file were refused)",
            _ => "",
        };
        let path = url.strip_prefix(&self.base).unwrap_or(url);
        Error(format!(
            "registry {}: {method} {path}: {status}{}{hint}",
            self.name,
            if detail.trim().is_empty() {
                String::new()
            } else {
                format!(": {}", detail.trim())
            }
        ))
    }
}

/// ureq's error in words a user acts on.
/// The token a token server's answer (JSON, read within bounds) gives: `token`, else
/// `access_token`.
pub fn token_of_answer(text: &str) -> std::result::Result<String, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("answer is not JSON: {e}"))?;
    v.get("token")
        .or_else(|| v.get("access_token"))
        .and_then(|t| t.as_str())
        .map(str::to_string)
        .ok_or_else(|| "no token in its answer".to_string())
}

/// Whether credentials sent to `url` stay secret: over TLS, or over plain HTTP to this
/// machine (the `--insecure` registry, and its token server) only.
fn keeps_secrets(url: &str) -> bool {
    if url.starts_with("https://") {
        return true;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host_port = rest.split(['/', '?', '#']).next().unwrap_or("");
    // Userinfo (`http://127.0.0.1:1@evil/`): the host is after the `@`, wherever a naive
    // split finds one; such a URL is never ours to trust.
    if host_port.contains('@') {
        return false;
    }
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host_port.rsplit_once(':').map_or(host_port, |(h, _)| h),
    };
    is_local(host)
}

/// Bytes a streamed body must bring in every period of `--timeout`: a server trickling
/// a blob (a byte a second passes every per-read bound) is cut off within one period,
/// so a whole fetch takes at most one period per this many bytes.
pub const MIN_BYTES_PER_PERIOD: u64 = 64 << 10;

/// A blob's body (fetched, or read for an upload), failing with `TimedOut` once a period
/// of `timeout` brings fewer than [`MIN_BYTES_PER_PERIOD`] bytes.
struct Paced<R> {
    inner: R,
    timeout: Duration,
    since: std::time::Instant,
    got: u64,
}

impl<R> Paced<R> {
    fn new(inner: R, timeout: Duration) -> Paced<R> {
        Paced {
            inner,
            timeout,
            since: std::time::Instant::now(),
            got: 0,
        }
    }
}

impl<R: Read> Read for Paced<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.got += n as u64;
        if n > 0 && self.since.elapsed() >= self.timeout {
            if self.got < MIN_BYTES_PER_PERIOD {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the server sent {} bytes in {:.0} s, fewer than {MIN_BYTES_PER_PERIOD} per --timeout",
                        self.got,
                        self.since.elapsed().as_secs_f64()
                    ),
                ));
            }
            self.since = std::time::Instant::now();
            self.got = 0;
        }
        Ok(n)
    }
}

fn reachability(e: ureq::Error) -> String {
    match e {
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::Io(io) => format!("{io}"),
        ureq::Error::Timeout(t) => format!("timed out ({t})"),
        other => other.to_string(),
    }
}

/// `sha256:HEX` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Percent-encodes a query value (RFC 3986 unreserved characters pass).
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The first byte a single range's `Content-Range: bytes A-B/N` (or `A-B/*`) names; `None`
/// if it is not one such range.
fn content_range_start(v: &str) -> Option<u64> {
    let (unit, range) = v.trim().split_once(' ')?;
    if !unit.eq_ignore_ascii_case("bytes") {
        return None;
    }
    let (a, rest) = range.trim_start().split_once('-')?;
    let (b, total) = rest.split_once('/')?;
    let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
    let total_ok = total == "*" || total.parse::<u64>().is_ok_and(|n| b < n);
    (a <= b && total_ok).then_some(a)
}

/// What a range read says of a body that ended after `got` bytes.
pub fn short_body(got: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("the server sent {got}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_names_one_range_of_a_known_or_unknown_length() {
        for (v, start) in [
            ("bytes 0-99/100", Some(0)),
            ("bytes 4096-8191/*", Some(4096)),
            (" bytes 7-7/8 ", Some(7)),
            ("Bytes 8-9/10", Some(8)),
            ("bytes 5-4/100", None),
            ("bytes 0-100/100", None),
            ("bytes */100", None),
            ("bytes 0-99", None),
            ("items 0-99/100", None),
            ("bytes -1-99/100", None),
            ("", None),
        ] {
            assert_eq!(content_range_start(v), start, "{v:?}");
        }
    }

    #[test]
    fn credentials_travel_over_tls_or_loopback_only() {
        for (url, ok) in [
            ("https://registry.example/v2/", true),
            ("http://127.0.0.1:5000/v2/", true),
            ("http://localhost/token", true),
            ("http://[::1]:8080/x", true),
            ("http://registry.example/v2/", false),
            ("http://10.0.0.1:5000/v2/", false),
            ("http://127.0.0.1.example/x", false),
            ("http://[::2]/x", false),
            ("ftp://127.0.0.1/x", false),
            ("http://127.0.0.1:1@evil.example/token", false),
            ("http://localhost:x@evil.example/", false),
            ("http://[::1]:1@evil.example/", false),
            ("http://u@127.0.0.1/", false),
        ] {
            assert_eq!(keeps_secrets(url), ok, "{url}");
        }
    }

    #[test]
    fn a_trickling_body_is_cut_off_within_a_period() {
        /// A byte per read, each after 20 ms.
        struct Trickle;
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                std::thread::sleep(Duration::from_millis(20));
                buf[0] = 1;
                Ok(1)
            }
        }
        let start = std::time::Instant::now();
        let mut p = Paced::new(Trickle, Duration::from_millis(200));
        let err = std::io::copy(&mut p, &mut std::io::sink()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(start.elapsed() < Duration::from_secs(1));
        // A steady body (8 KiB each 5 ms: 2.5 times the floor) passes whole over many
        // periods.
        struct Steady(u32);
        impl Read for Steady {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.0 == 0 {
                    return Ok(0);
                }
                self.0 -= 1;
                std::thread::sleep(Duration::from_millis(5));
                let n = buf.len().min(8 << 10);
                buf[..n].fill(7);
                Ok(n)
            }
        }
        let mut p = Paced::new(Steady(100), Duration::from_millis(100));
        assert_eq!(
            std::io::copy(&mut p, &mut std::io::sink()).unwrap(),
            100 << 13
        );
    }
}
