//! A containerd proxy snapshotter (`[proxy_plugins.verilay]`, `type = "snapshot"`):
//! containerd's overlayfs snapshotter (`store`), with converted layers served from their
//! verilay images (`remote`).
//!
//! - A remote layer is committed with its labels and answered `AlreadyExists`: containerd
//!   fetches no blob of it.
//! - Layer mounts outlive the service.
#![forbid(unsafe_code)]

pub mod cri_auth;
pub mod filter;
pub mod remote;
pub mod store;

pub use remote::{Looked, Remote, Wanted};
pub use store::{Code, Error, RemoteLayer, Store};

use containerd_snapshots::api::types::Mount;
use containerd_snapshots::{tonic, Info, Snapshotter, Usage};
use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

/// Where a snapshotter's log lines go (one line each, no newline).
pub type Logger = Box<dyn Fn(&str) + Send + Sync>;

/// The gRPC service over a [`Store`]: each request runs on a blocking thread (they touch
/// the disk), and each refused one is logged with its reason.
pub struct Service {
    store: Arc<Store>,
    log: Arc<Logger>,
    remote: Option<Arc<dyn Remote>>,
}

impl Service {
    /// The service of `store`, logging to `log`; no remote layers.
    pub fn new(store: Store, log: Logger) -> Service {
        Service {
            store: Arc::new(store),
            log: Arc::new(log),
            remote: None,
        }
    }

    /// Serves converted layers through `remote`. Each layer a snapshot shows that is not
    /// mounted is mounted again in the background (a failure is logged), and before any
    /// snapshot over it is used: requests are not held up by a registry that is down.
    pub fn with_remote(mut self, remote: Arc<dyn Remote>) -> Service {
        let (layers, log, r) = (self.store.remote_layers(), self.log.clone(), remote.clone());
        std::thread::spawn(move || {
            for l in layers {
                if let Err(e) = r.ensure(&l) {
                    log(&format!("layer {}: {e}", l.image));
                }
            }
        });
        self.remote = Some(remote);
        self
    }

    /// Mounts again any remote layer under `key` (itself included) that is not mounted (a
    /// layer's daemon gone, the host rebooted, a detach racing a look-up): an overlay
    /// over an empty directory would show the layers below without it. Without remote
    /// layers (`--no-remote`), one that is not mounted fails the request.
    fn ensure_chain(
        store: &Store,
        remote: Option<&Arc<dyn Remote>>,
        key: &str,
    ) -> Result<(), Error> {
        for l in store.remote_chain(key) {
            let ensured = match remote {
                Some(remote) => remote.ensure(&l),
                None if layerstore::resolve::mounted(&l.dir) == Some(true) => Ok(()),
                None => Err("not mounted, and remote layers are off".to_string()),
            };
            ensured.map_err(|e| Error {
                code: match remote {
                    Some(_) => Code::Unavailable,
                    None => Code::FailedPrecondition,
                },
                message: format!("layer {} under snapshot {}: {e}", l.image, shown(key)),
            })?;
        }
        Ok(())
    }

    /// Prepare of a layer containerd would unpack: served from its verilay image when
    /// `labels` name a converted one (`Some(target)`: committed under the target, to be
    /// answered AlreadyExists), else `None`, with a log line saying why containerd unpacks
    /// it. A registry that cannot be asked fails the Prepare.
    async fn try_remote(
        &self,
        key: &str,
        parent: &str,
        labels: &HashMap<String, String>,
    ) -> Result<Option<String>, tonic::Status> {
        let Some(remote) = self.remote.clone() else {
            return Ok(None);
        };
        let wanted = match Wanted::of(labels, parent) {
            Ok(Some(w)) => w,
            Ok(None) => return Ok(None),
            Err(e) => {
                let e = Error {
                    code: Code::InvalidArgument,
                    message: format!("prepare {}: {e}", shown(key)),
                };
                (self.log)(&e.message);
                return Err(e.into());
            }
        };
        let (key, parent, labels) = (key.to_string(), parent.to_string(), labels.clone());
        let target = wanted.target.clone();
        let what = format!(
            "prepare {} (layer {} of {})",
            shown(&key),
            wanted.layer,
            wanted.reference
        );
        let log = self.log.clone();
        self.call(what, move |store| {
            // Bad requests fail before any registry is asked.
            store.check_prepare(&key, &parent, &labels)?;
            match remote.look_up(&wanted) {
                Err(e) => Err(Error {
                    code: Code::Unavailable,
                    message: e,
                }),
                Ok(Looked::Fallback(why)) => {
                    log(&format!(
                        "layer {} of {}: {why}: containerd pulls and unpacks it",
                        wanted.layer, wanted.reference
                    ));
                    Ok(None)
                }
                Ok(Looked::Mounted(layer)) => {
                    let mut labels = labels;
                    labels.insert(remote::REMOTE_LABEL.into(), "verilay".into());
                    // A mount no snapshot shows (the commit failed) is Cleanup's to detach.
                    let name = remote::snapshot_name(&parent, &wanted.target);
                    store.commit_remote(&name, &parent, labels, layer.clone())?;
                    // A Remove of another snapshot of this layer may have detached it
                    // between the look-up and the commit.
                    remote.ensure(&layer).map_err(|e| Error {
                        code: Code::Unavailable,
                        message: format!("layer {}: {e}", layer.image),
                    })?;
                    log(&format!(
                        "layer {} of {}: served from verilay image {} (not pulled)",
                        wanted.layer, wanted.reference, layer.image
                    ));
                    Ok(Some(target))
                }
            }
        })
        .await
    }

    async fn call<T: Send + 'static>(
        &self,
        what: String,
        f: impl FnOnce(&Store) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, tonic::Status> {
        let store = self.store.clone();
        let done = tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| tonic::Status::internal(format!("{what}: {e}")))?;
        done.map_err(|e| {
            (self.log)(&format!("{what}: {e}"));
            e.into()
        })
    }
}

/// Keys as log lines show them: bounded, whatever a caller sent.
fn shown(key: &str) -> String {
    let mut s: String = key.chars().take(200).collect();
    if s.len() < key.len() {
        s.push('…');
    }
    format!("{s:?}")
}

#[tonic::async_trait]
impl Snapshotter for Service {
    type Error = tonic::Status;

    async fn stat(&self, key: String) -> Result<Info, Self::Error> {
        self.call(format!("stat {}", shown(&key)), move |s| s.stat(&key))
            .await
    }

    async fn update(
        &self,
        info: Info,
        fieldpaths: Option<Vec<String>>,
    ) -> Result<Info, Self::Error> {
        self.call(format!("update {}", shown(&info.name)), move |s| {
            s.update(info, fieldpaths)
        })
        .await
    }

    async fn usage(&self, key: String) -> Result<Usage, Self::Error> {
        self.call(format!("usage {}", shown(&key)), move |s| s.usage(&key))
            .await
    }

    async fn mounts(&self, key: String) -> Result<Vec<Mount>, Self::Error> {
        let remote = self.remote.clone();
        self.call(format!("mounts {}", shown(&key)), move |s| {
            let mounts = s.mounts(&key)?;
            Service::ensure_chain(s, remote.as_ref(), &key)?;
            Ok(mounts)
        })
        .await
    }

    async fn prepare(
        &self,
        key: String,
        parent: String,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Mount>, Self::Error> {
        if let Some(target) = self.try_remote(&key, &parent, &labels).await? {
            return Err(tonic::Status::already_exists(format!(
                "target snapshot {target:?}: already exists (a verilay layer)"
            )));
        }
        let remote = self.remote.clone();
        self.call(format!("prepare {}", shown(&key)), move |s| {
            Service::ensure_chain(s, remote.as_ref(), &parent)?;
            s.create(true, &key, &parent, labels)
        })
        .await
    }

    async fn view(
        &self,
        key: String,
        parent: String,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Mount>, Self::Error> {
        let remote = self.remote.clone();
        self.call(format!("view {}", shown(&key)), move |s| {
            Service::ensure_chain(s, remote.as_ref(), &parent)?;
            s.create(false, &key, &parent, labels)
        })
        .await
    }

    async fn commit(
        &self,
        name: String,
        key: String,
        labels: HashMap<String, String>,
    ) -> Result<(), Self::Error> {
        self.call(format!("commit {}", shown(&key)), move |s| {
            s.commit(&name, &key, labels)
        })
        .await
    }

    async fn remove(&self, key: String) -> Result<(), Self::Error> {
        let remote = self.remote.clone();
        self.call(format!("remove {}", shown(&key)), move |s| {
            s.remove(&key, &|layer| {
                if let Some(remote) = &remote {
                    remote.release(layer);
                }
            })
        })
        .await
    }

    async fn clear(&self) -> Result<(), Self::Error> {
        let remote = self.remote.clone();
        self.call("cleanup".into(), move |s| {
            s.cleanup(&|shown| {
                if let Some(remote) = &remote {
                    remote.release_all_but(shown);
                }
            })
        })
        .await
    }

    type InfoStream = tokio_stream::Iter<std::vec::IntoIter<Result<Info, Self::Error>>>;

    async fn list(
        &self,
        _snapshotter: String,
        filters: Vec<String>,
    ) -> Result<Self::InfoStream, Self::Error> {
        let all = self.call("list".into(), move |s| s.list(&filters)).await?;
        Ok(tokio_stream::iter(
            all.into_iter().map(Ok).collect::<Vec<_>>(),
        ))
    }
}

/// Binds the unix socket `socket` (mode 0600: containerd runs as root, and no one else
/// may ask for snapshots). A socket file left by a snapshotter that died is replaced; one
/// that a live process answers on is refused.
pub fn bind(socket: &Path) -> Result<std::os::unix::net::UnixListener, Error> {
    let fail = |what: &str, e: &dyn std::fmt::Display| Error {
        code: Code::Internal,
        message: format!("socket {}: {what}: {e}", socket.display()),
    };
    if let Ok(st) = std::fs::symlink_metadata(socket) {
        use std::os::unix::fs::FileTypeExt;
        if !st.file_type().is_socket() {
            return Err(fail("exists", &"not a socket"));
        }
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Err(fail("in use", &"another process answers on it"));
        }
        std::fs::remove_file(socket).map_err(|e| fail("removing the stale socket", &e))?;
    }
    if let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| fail("making its directory", &e))?;
    }
    // Made 0600 from the start: between bind and chmod, a socket made under the umask
    // would let another user connect.
    let umask = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = std::os::unix::net::UnixListener::bind(socket);
    rustix::process::umask(umask);
    let listener = bound.map_err(|e| fail("binding", &e))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| fail("setting its mode", &e))?;
    }
    listener
        .set_nonblocking(true)
        .map_err(|e| fail("binding", &e))?;
    Ok(listener)
}

/// Serves `service` on `listener` (from [`bind`]) until `shutdown` completes. Must run
/// within a tokio runtime with I/O enabled.
pub async fn serve(
    service: Service,
    listener: std::os::unix::net::UnixListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let fail = |e: &dyn std::fmt::Display| Error {
        code: Code::Internal,
        message: format!("serving snapshots: {e}"),
    };
    let listener = tokio::net::UnixListener::from_std(listener).map_err(|e| fail(&e))?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tonic::transport::Server::builder()
        .add_service(containerd_snapshots::server(Arc::new(service)))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| fail(&e))
}

/// Serves `store` (with remote layers from `remote`, mounted again where they are not) on
/// `socket` until SIGTERM or SIGINT, then removes the socket; `ready` is called once the
/// socket accepts connections.
pub fn run(
    store: Store,
    socket: &Path,
    log: Logger,
    remote: Option<Arc<dyn Remote>>,
    ready: impl FnOnce(),
) -> Result<(), Error> {
    let internal = |what: &str, e: &dyn std::fmt::Display| Error {
        code: Code::Internal,
        message: format!("{what}: {e}"),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| internal("starting the runtime", &e))?;
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term =
            signal(SignalKind::terminate()).map_err(|e| internal("handling SIGTERM", &e))?;
        let mut int =
            signal(SignalKind::interrupt()).map_err(|e| internal("handling SIGINT", &e))?;
        let listener = bind(socket)?;
        // Ours from here: removed however serving ends (and not before, when the socket
        // is another snapshotter's).
        struct Remove<'a>(&'a Path);
        impl Drop for Remove<'_> {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(self.0);
            }
        }
        let _remove = Remove(socket);
        let log = Arc::new(log);
        let mut service = Service {
            store: Arc::new(store),
            log: log.clone(),
            remote: None,
        };
        if let Some(remote) = remote {
            service = service.with_remote(remote);
        }
        ready();
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => log("SIGTERM: stopping"),
                _ = int.recv() => log("SIGINT: stopping"),
            }
        };
        serve(service, listener, shutdown).await
    })
}
