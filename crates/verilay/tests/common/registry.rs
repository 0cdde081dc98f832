//! A `docker-registry` (CNCF distribution, Debian's) on 127.0.0.1 for the tests that talk
//! to a registry.

use super::{run, sh};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A `docker-registry` on 127.0.0.1, stopped when dropped.
pub struct Registry {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Registry {
    /// A registry storing in a fresh directory; with `htpasswd`, Basic auth for user `u`
    /// with password `secret`.
    pub fn start(htpasswd: bool) -> Registry {
        Registry::start_with(|dir| {
            if !htpasswd {
                return String::new();
            }
            let file = dir.join("htpasswd");
            sh(&format!(
                "htpasswd -Bbc '{}' u secret 2>/dev/null",
                file.display()
            ));
            format!(
                "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                file.display()
            )
        })
    }

    /// A registry whose configuration ends with what `auth` makes (an `auth:` section,
    /// or nothing) in the registry's own directory.
    pub fn start_with(auth: impl FnOnce(&Path) -> String) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let auth = auth(dir.path());
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {}/data\n\
                 http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n{auth}",
                dir.path().display()
            ),
        )
        .unwrap();
        let child = Registry::serve(dir.path(), port);
        Registry { child, port, dir }
    }

    /// `docker-registry serve` of the configuration in `dir`, once it answers.
    pub fn serve(dir: &Path, port: u16) -> Child {
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("log")).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while http_status(port, "/v2/").is_none() {
            assert!(Instant::now() < deadline, "the registry did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        child
    }

    /// Kills the registry (as a crash would) until [`Registry::restart`].
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The same registry again, on the same port and storage.
    pub fn restart(&mut self) {
        self.child = Registry::serve(self.dir.path(), self.port);
    }

    pub fn reference(&self, repo_tag: &str) -> String {
        format!("oci://127.0.0.1:{}/{repo_tag}", self.port)
    }

    pub fn docker(&self, repo_tag: &str) -> String {
        format!("docker://127.0.0.1:{}/{repo_tag}", self.port)
    }

    /// PUTs `body` as the manifest `repo:tag` (or `repo:DIGEST`), of `content_type`: what
    /// a hostile or foreign pusher stores.
    pub fn put_manifest(&self, repo_tag: &str, body: &str, content_type: &str) {
        let (repo, tag) = repo_tag.split_once(':').unwrap();
        run(Command::new("curl").args([
            "-sf",
            "-X",
            "PUT",
            "-H",
            &format!("Content-Type: {content_type}"),
            "--data-binary",
            body,
            &format!("http://127.0.0.1:{}/v2/{repo}/manifests/{tag}", self.port),
        ]));
    }

    /// The stored blob file of `digest` (`sha256:HEX`) in the registry's storage.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
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

/// The status code of `GET PATH` on 127.0.0.1:`port`, if it answers.
pub fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
