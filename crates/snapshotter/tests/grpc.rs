//! The snapshotter through its gRPC service on a unix socket, as containerd's proxy
//! client calls it: the overlayfs snapshotter's lifecycle, mounts, usage and status codes,
//! bounds on what a caller can store, and a restart on the same root.

use containerd_snapshots::api::snapshots::v1::snapshots_client::SnapshotsClient;
use containerd_snapshots::api::snapshots::v1::*;
use containerd_snapshots::api::types::Mount;
use containerd_snapshots::tonic::{self, transport::Channel, Code};
use snapshotter::remote::{LAYER_LABEL, MANIFEST_LABEL, REMOTE_LABEL, TARGET_LABEL};
use snapshotter::{Looked, Remote, RemoteLayer, Service, Store, Wanted};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A snapshotter serving `root` on a socket in `dir`, and a client of it; the server stops
/// when dropped.
struct Served {
    client: SnapshotsClient<Channel>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), snapshotter::Error>>,
}

impl Served {
    async fn start(root: &Path, socket: &Path) -> Served {
        Served::start_with(root, socket, None).await
    }

    async fn start_with(root: &Path, socket: &Path, remote: Option<Arc<dyn Remote>>) -> Served {
        let store = Store::open(root).unwrap();
        let listener = snapshotter::bind(socket).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut service = Service::new(store, Box::new(|l| eprintln!("snapshotter: {l}")));
        if let Some(r) = remote {
            service = service.with_remote(r);
        }
        let task = tokio::spawn(snapshotter::serve(service, listener, async {
            let _ = stopped.await;
        }));
        let path = socket.to_path_buf();
        let channel = tonic::transport::Endpoint::try_from("http://[::]:0")
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .connect_with_connector(tower::service_fn(move |_| {
                tokio::net::UnixStream::connect(path.clone())
            }))
            .await
            .unwrap();
        Served {
            client: SnapshotsClient::new(channel),
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("the server stops within 10 s")
            .unwrap()
            .unwrap();
    }

    async fn prepare(&mut self, key: &str, parent: &str) -> Result<Vec<Mount>, tonic::Status> {
        self.prepare_labelled(key, parent, HashMap::new()).await
    }

    async fn prepare_labelled(
        &mut self,
        key: &str,
        parent: &str,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Mount>, tonic::Status> {
        let r = self
            .client
            .prepare(PrepareSnapshotRequest {
                snapshotter: "verilay".into(),
                key: key.into(),
                parent: parent.into(),
                labels,
            })
            .await?;
        Ok(r.into_inner().mounts)
    }

    async fn view(&mut self, key: &str, parent: &str) -> Result<Vec<Mount>, tonic::Status> {
        let r = self
            .client
            .view(ViewSnapshotRequest {
                snapshotter: "verilay".into(),
                key: key.into(),
                parent: parent.into(),
                labels: HashMap::new(),
            })
            .await?;
        Ok(r.into_inner().mounts)
    }

    async fn mounts(&mut self, key: &str) -> Result<Vec<Mount>, tonic::Status> {
        let r = self
            .client
            .mounts(MountsRequest {
                snapshotter: "verilay".into(),
                key: key.into(),
            })
            .await?;
        Ok(r.into_inner().mounts)
    }

    async fn commit(&mut self, name: &str, key: &str) -> Result<(), tonic::Status> {
        self.client
            .commit(CommitSnapshotRequest {
                snapshotter: "verilay".into(),
                name: name.into(),
                key: key.into(),
                labels: HashMap::from([("committed".into(), "yes".into())]),
            })
            .await?;
        Ok(())
    }

    async fn remove(&mut self, key: &str) -> Result<(), tonic::Status> {
        self.client
            .remove(RemoveSnapshotRequest {
                snapshotter: "verilay".into(),
                key: key.into(),
            })
            .await?;
        Ok(())
    }

    async fn stat(&mut self, key: &str) -> Result<Info, tonic::Status> {
        let r = self
            .client
            .stat(StatSnapshotRequest {
                snapshotter: "verilay".into(),
                key: key.into(),
            })
            .await?;
        Ok(r.into_inner().info.unwrap())
    }

    async fn update(
        &mut self,
        key: &str,
        labels: &[(&str, &str)],
        paths: &[&str],
    ) -> Result<Info, tonic::Status> {
        let r = self
            .client
            .update(UpdateSnapshotRequest {
                snapshotter: "verilay".into(),
                info: Some(Info {
                    name: key.into(),
                    labels: labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    ..Info::default()
                }),
                update_mask: Some(prost_types::FieldMask {
                    paths: paths.iter().map(|p| p.to_string()).collect(),
                }),
            })
            .await?;
        Ok(r.into_inner().info.unwrap())
    }

    async fn usage(&mut self, key: &str) -> Result<(i64, i64), tonic::Status> {
        let r = self
            .client
            .usage(UsageRequest {
                snapshotter: "verilay".into(),
                key: key.into(),
            })
            .await?
            .into_inner();
        Ok((r.size, r.inodes))
    }

    async fn list(&mut self) -> Vec<Info> {
        self.list_filtered(&[]).await.unwrap()
    }

    async fn list_filtered(&mut self, filters: &[&str]) -> Result<Vec<Info>, tonic::Status> {
        let mut stream = self
            .client
            .list(ListSnapshotsRequest {
                snapshotter: "verilay".into(),
                filters: strings(filters),
            })
            .await?
            .into_inner();
        let mut all = Vec::new();
        while let Some(batch) = stream.message().await? {
            all.extend(batch.info);
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    async fn cleanup(&mut self) {
        self.client
            .cleanup(CleanupRequest {
                snapshotter: "verilay".into(),
            })
            .await
            .unwrap();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn fs(root: &Path, id: u64) -> String {
    root.join(format!("snapshots/{id}/fs"))
        .to_string_lossy()
        .into_owned()
}

fn mount(kind: &str, source: &str, options: &[String]) -> Vec<Mount> {
    vec![Mount {
        r#type: kind.into(),
        source: source.into(),
        target: String::new(),
        options: options.to_vec(),
    }]
}

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

/// What containerd's overlayfs snapshotter adds to every overlay mount on this kernel.
fn index_off() -> Vec<String> {
    if Path::new("/sys/module/overlay/parameters/index").exists() {
        strings(&["index=off"])
    } else {
        vec![]
    }
}

fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let socket = dir.path().join("snap.sock");
    std::fs::create_dir_all(&root).unwrap();
    let root = std::fs::canonicalize(&root).unwrap();
    (dir, root, socket)
}

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    let e = r.expect_err("the request must fail");
    assert!(!e.message().is_empty() && !e.message().contains('\n'));
    e.code()
}

#[test]
fn lifecycle_mounts_and_usage_as_overlayfs() {
    let (_dir, root, socket) = setup();
    runtime().block_on(async {
        let mut s = Served::start(&root, &socket).await;
        // No parent: the snapshot's own directory, bound.
        let a = s.prepare("ns/1/a", "").await.unwrap();
        assert_eq!(a, mount("bind", &fs(&root, 1), &strings(&["rw", "rbind"])));
        assert_eq!(s.mounts("ns/1/a").await.unwrap(), a);
        assert!(root.join("snapshots/1/work").is_dir());
        let v = s.view("ns/1/v", "").await.unwrap();
        assert_eq!(v, mount("bind", &fs(&root, 2), &strings(&["ro", "rbind"])));
        assert!(!root.join("snapshots/2/work").exists());
        // A file with a second link, and a 10000-byte file: three inodes with the root.
        let a_fs = Path::new(&fs(&root, 1)).to_path_buf();
        std::fs::write(a_fs.join("f"), vec![7u8; 10000]).unwrap();
        std::fs::hard_link(a_fs.join("f"), a_fs.join("g")).unwrap();
        std::fs::create_dir(a_fs.join("d")).unwrap();
        let (size, inodes) = s.usage("ns/1/a").await.unwrap();
        assert_eq!(inodes, 3);
        assert!(size >= 10000, "{size}");
        s.commit("ns/1/b", "ns/1/a").await.unwrap();
        assert_eq!(s.usage("ns/1/b").await.unwrap(), (size, inodes));
        assert_eq!(code(s.stat("ns/1/a").await), Code::NotFound);
        let b = s.stat("ns/1/b").await.unwrap();
        assert_eq!(b.kind, 3, "committed");
        assert_eq!(b.labels["committed"], "yes");
        // A committed snapshot has no mounts.
        assert_eq!(code(s.mounts("ns/1/b").await), Code::FailedPrecondition);
        // One parent: overlay for an active snapshot, the parent bound read-only for a view.
        let c = s.prepare("ns/1/c", "ns/1/b").await.unwrap();
        let mut options = index_off();
        options.extend([
            format!("workdir={}", root.join("snapshots/3/work").display()),
            format!("upperdir={}", fs(&root, 3)),
            format!("lowerdir={}", fs(&root, 1)),
        ]);
        assert_eq!(c, mount("overlay", "overlay", &options));
        let v2 = s.view("ns/1/v2", "ns/1/b").await.unwrap();
        assert_eq!(v2, mount("bind", &fs(&root, 1), &strings(&["ro", "rbind"])));
        // Two parents: nearest first.
        s.commit("ns/1/c2", "ns/1/c").await.unwrap();
        let v3 = s.view("ns/1/v3", "ns/1/c2").await.unwrap();
        let mut options = index_off();
        options.push(format!("lowerdir={}:{}", fs(&root, 3), fs(&root, 1)));
        assert_eq!(v3, mount("overlay", "overlay", &options));
        assert_eq!(s.usage("ns/1/v3").await.unwrap(), (0, 0));
        // Parents cannot go while children stand; children can, and their directories go.
        assert_eq!(code(s.remove("ns/1/b").await), Code::FailedPrecondition);
        s.remove("ns/1/v3").await.unwrap();
        assert!(!root.join("snapshots/5").exists());
        s.remove("ns/1/c2").await.unwrap();
        s.remove("ns/1/v2").await.unwrap();
        s.remove("ns/1/b").await.unwrap();
        let names: Vec<String> = s.list().await.into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["ns/1/v"]);
        s.stop().await;
    });
    assert!(!socket.exists() || std::os::unix::net::UnixStream::connect(&socket).is_err());
}

#[test]
fn refusals_carry_containerds_codes() {
    let (_dir, root, socket) = setup();
    runtime().block_on(async {
        let mut s = Served::start(&root, &socket).await;
        assert_eq!(code(s.prepare("", "").await), Code::InvalidArgument);
        assert_eq!(
            code(s.prepare(&"k".repeat(5000), "").await),
            Code::InvalidArgument
        );
        s.prepare("a", "").await.unwrap();
        assert_eq!(code(s.prepare("a", "").await), Code::AlreadyExists);
        assert_eq!(code(s.view("a", "").await), Code::AlreadyExists);
        assert_eq!(code(s.prepare("b", "missing").await), Code::NotFound);
        // A parent must be committed.
        assert_eq!(code(s.prepare("b", "a").await), Code::InvalidArgument);
        assert_eq!(code(s.view("b", "a").await), Code::InvalidArgument);
        assert_eq!(code(s.stat("missing").await), Code::NotFound);
        assert_eq!(code(s.mounts("missing").await), Code::NotFound);
        assert_eq!(code(s.usage("missing").await), Code::NotFound);
        assert_eq!(code(s.remove("missing").await), Code::NotFound);
        assert_eq!(code(s.commit("x", "missing").await), Code::NotFound);
        s.view("v", "").await.unwrap();
        assert_eq!(code(s.commit("x", "v").await), Code::FailedPrecondition);
        s.prepare("a2", "").await.unwrap();
        s.commit("c", "a2").await.unwrap();
        assert_eq!(code(s.commit("c", "a").await), Code::AlreadyExists);
        assert_eq!(code(s.commit("c2", "c").await), Code::FailedPrecondition);
        // Labels as containerd bounds them, and no more of them than the store keeps.
        let big = HashMap::from([("k".to_string(), "v".repeat(4096))]);
        assert_eq!(
            code(s.prepare_labelled("l", "", big).await),
            Code::InvalidArgument
        );
        let fits = HashMap::from([("k".to_string(), "v".repeat(4095))]);
        s.prepare_labelled("l", "", fits).await.unwrap();
        let many = (0..=snapshotter::store::MAX_LABELS)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        assert_eq!(
            code(s.prepare_labelled("m", "", many).await),
            Code::InvalidArgument
        );
        assert_eq!(
            code(s.update("a", &[("x", &"y".repeat(5000))], &[]).await),
            Code::InvalidArgument
        );
        assert_eq!(
            code(s.update("a", &[], &["parent"]).await),
            Code::InvalidArgument
        );
        assert_eq!(code(s.update("missing", &[], &[]).await), Code::NotFound);
        // Nothing refused was stored.
        let names: Vec<String> = s.list().await.into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["a", "c", "l", "v"]);
        s.stop().await;
    });
}

#[test]
fn update_sets_labels_as_fieldpaths_say() {
    let (_dir, root, socket) = setup();
    runtime().block_on(async {
        let mut s = Served::start(&root, &socket).await;
        let labels = HashMap::from([("a".to_string(), "1".to_string()), ("b".into(), "2".into())]);
        s.prepare_labelled("k", "", labels).await.unwrap();
        let before = s.stat("k").await.unwrap();
        // `labels.X`: X set from the request, or removed when the request lacks it.
        let i = s
            .update("k", &[("a", "9"), ("c", "3")], &["labels.a", "labels.b"])
            .await
            .unwrap();
        let want = HashMap::from([("a".to_string(), "9".to_string())]);
        assert_eq!(i.labels, want);
        assert_eq!(s.stat("k").await.unwrap().labels, want);
        let nanos = |t: &Option<prost_types::Timestamp>| {
            let t = t.clone().unwrap();
            t.seconds as i128 * 1_000_000_000 + t.nanos as i128
        };
        assert!(nanos(&i.updated_at) > nanos(&before.updated_at));
        assert_eq!(i.created_at, before.created_at);
        // An empty value is no label.
        let i = s.update("k", &[("a", "")], &["labels.a"]).await.unwrap();
        assert!(i.labels.is_empty(), "{:?}", i.labels);
        // No paths, or `labels`: all of them replaced.
        let i = s.update("k", &[("z", "0")], &[]).await.unwrap();
        assert_eq!(
            i.labels,
            HashMap::from([("z".to_string(), "0".to_string())])
        );
        let i = s.update("k", &[("y", "1")], &["labels"]).await.unwrap();
        assert_eq!(
            i.labels,
            HashMap::from([("y".to_string(), "1".to_string())])
        );
        assert_eq!(i.kind, 2, "still active");
        s.stop().await;
    });
}

#[test]
fn restart_keeps_snapshots_and_cleanup_removes_only_orphans() {
    let (_dir, root, socket) = setup();
    let rt = runtime();
    let before = rt.block_on(async {
        let mut s = Served::start(&root, &socket).await;
        s.prepare("a", "").await.unwrap();
        std::fs::write(Path::new(&fs(&root, 1)).join("f"), b"kept").unwrap();
        s.commit("b", "a").await.unwrap();
        s.prepare("c", "b").await.unwrap();
        s.view("v", "b").await.unwrap();
        s.update("c", &[("l", "1")], &[]).await.unwrap();
        s.prepare("gone", "").await.unwrap();
        s.remove("gone").await.unwrap();
        // One root, one snapshotter.
        let second = Store::open(&root)
            .err()
            .expect("a second store on the root is refused");
        assert!(second.message.contains("in use"), "{second}");
        let listed = s.list().await;
        s.stop().await;
        listed
    });
    // What a crash leaves: directories no snapshot owns.
    std::fs::create_dir_all(root.join("snapshots/99/fs")).unwrap();
    std::fs::create_dir_all(root.join("snapshots/new-7/fs")).unwrap();
    rt.block_on(async {
        let mut s = Served::start(&root, &socket).await;
        assert_eq!(s.list().await, before);
        assert_eq!(
            std::fs::read(Path::new(&fs(&root, 1)).join("f")).unwrap(),
            b"kept"
        );
        s.cleanup().await;
        assert!(!root.join("snapshots/99").exists());
        assert!(!root.join("snapshots/new-7").exists());
        for id in [1, 2, 3] {
            assert!(root.join(format!("snapshots/{id}/fs")).is_dir(), "{id}");
        }
        // A new snapshot takes a new ID, never one a snapshot had.
        let n = s.prepare("n", "").await.unwrap();
        assert_eq!(n[0].source, fs(&root, 5));
        s.stop().await;
    });
}

/// A remote that knows one layer (`sha256:1…`), mounted at `dir`; `sha256:2…` has no
/// conversion, and any other layer's registry is down. Every call is recorded.
struct Fake {
    dir: PathBuf,
    calls: Mutex<Vec<String>>,
}

fn digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

impl Fake {
    fn layer(&self) -> RemoteLayer {
        RemoteLayer {
            image: digest('9'),
            source: format!("oci://127.0.0.1:1/app@{}", digest('8')),
            dir: self.dir.clone(),
        }
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl Remote for Fake {
    fn look_up(&self, w: &Wanted) -> Result<Looked, String> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("look_up {}", w.layer));
        if w.layer == digest('1') {
            Ok(Looked::Mounted(self.layer()))
        } else if w.layer == digest('2') {
            Ok(Looked::Fallback("no conversion".into()))
        } else {
            Err("registry 127.0.0.1:1: connection refused".into())
        }
    }
    fn ensure(&self, l: &RemoteLayer) -> Result<(), String> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("ensure {}", l.image));
        Ok(())
    }
    fn release(&self, l: &RemoteLayer) {
        self.calls
            .lock()
            .unwrap()
            .push(format!("release {}", l.image));
    }
    fn release_all_but(&self, keep: &[RemoteLayer]) {
        self.calls
            .lock()
            .unwrap()
            .push(format!("release all but {}", keep.len()));
    }
}

/// The labels CRI puts on a layer's Prepare.
fn layer_labels(target: char, layer: char) -> HashMap<String, String> {
    [
        (TARGET_LABEL, digest(target)),
        (
            "containerd.io/snapshot/cri.image-ref",
            "127.0.0.1:1/app:v1".to_string(),
        ),
        (MANIFEST_LABEL, digest('c')),
        (LAYER_LABEL, digest(layer)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// A layer named by CRI's labels: committed under its target as a remote layer (answer
/// AlreadyExists), found by the filter containerd lists with, the lower layer of its
/// children (mounted again first), released once removed; one with no conversion is an
/// ordinary snapshot; bad requests fail before any look-up, and a registry that is down
/// fails the Prepare with `unavailable`, leaving nothing behind.
#[test]
fn remote_layers_by_their_labels() {
    let (_dir, root, socket) = setup();
    // Where the layer store's resolver mounts image `9…`.
    let fake = Arc::new(Fake {
        dir: snapshotter::store::remote_layer_dir(&root, &digest('9')),
        calls: Mutex::default(),
    });
    std::fs::create_dir_all(&fake.dir).unwrap();
    let layer = snapshotter::remote::snapshot_name("", &digest('a'));
    runtime().block_on(async {
        let mut s = Served::start_with(&root, &socket, Some(fake.clone())).await;
        // Refused before any look-up: a malformed label, a missing or active parent, a
        // label too long.
        let mut bad = layer_labels('a', '1');
        bad.insert(LAYER_LABEL.into(), "sha256:nothex".into());
        let e = s.prepare_labelled("ns/1/x", "", bad).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains(LAYER_LABEL), "{e}");
        let e = s
            .prepare_labelled("ns/1/x", "ns/0/none", layer_labels('a', '1'))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e}");
        s.prepare("ns/1/active", "").await.unwrap();
        let e = s
            .prepare_labelled("ns/1/x", "ns/1/active", layer_labels('a', '1'))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        let mut long = layer_labels('a', '1');
        long.insert("k".into(), "v".repeat(5000));
        assert_eq!(
            code(s.prepare_labelled("ns/1/x", "", long).await),
            Code::InvalidArgument
        );
        assert_eq!(fake.calls(), Vec::<String>::new());

        // The registry is down: unavailable, saying why, and nothing made.
        let e = s
            .prepare_labelled("ns/1/x", "", layer_labels('a', '3'))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unavailable);
        assert!(e.message().contains("connection refused"), "{e}");
        let names: Vec<String> = s.list().await.into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["ns/1/active"]);
        let dirs = std::fs::read_dir(root.join("snapshots")).unwrap().count();
        assert_eq!(dirs, 1);

        // Converted: committed under the target, AlreadyExists, found as containerd looks.
        let e = s
            .prepare_labelled("ns/1/extract-1", "", layer_labels('a', '1'))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e}");
        let found = s
            .list_filtered(&[&format!(
                "labels.\"{TARGET_LABEL}\"=={},parent==\"\"",
                digest('a')
            )])
            .await
            .unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].name, layer);
        assert!(layer.ends_with(&format!("/{}", digest('a'))), "{layer}");
        assert_eq!(found[0].kind, 3); // committed
        assert_eq!(found[0].labels[REMOTE_LABEL], "verilay");
        assert_eq!(found[0].labels[LAYER_LABEL], digest('1'));
        let none = s
            .list_filtered(&[&format!(
                "labels.\"{TARGET_LABEL}\"=={},parent==x",
                digest('a')
            )])
            .await
            .unwrap();
        assert!(none.is_empty());
        assert_eq!(
            code(s.list_filtered(&["labels.\"x"]).await),
            Code::InvalidArgument
        );
        // A child's lower layer is the layer's mount, mounted again first.
        let child = s.prepare("ns/1/c", &layer).await.unwrap();
        assert!(
            child[0]
                .options
                .contains(&format!("lowerdir={}", fake.dir.display())),
            "{child:?}"
        );
        // No conversion: an ordinary snapshot containerd unpacks into.
        let m = s
            .prepare_labelled("ns/1/extract-2", &layer, layer_labels('b', '2'))
            .await
            .unwrap();
        assert_eq!(m[0].r#type, "overlay");
        assert_eq!(
            fake.calls(),
            [
                format!("look_up {}", digest('3')),
                format!("look_up {}", digest('1')),
                format!("ensure {}", digest('9')),
                format!("ensure {}", digest('9')),
                format!("look_up {}", digest('2')),
                format!("ensure {}", digest('9')),
            ]
        );
        // The same chain over another parent (another namespace's layers below) is a
        // snapshot of its own, which containerd's filter finds by that parent.
        s.commit("ns/2/p", "ns/1/active").await.unwrap();
        let e = s
            .prepare_labelled("ns/2/extract-3", "ns/2/p", layer_labels('a', '1'))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e}");
        let over_p = s
            .list_filtered(&[&format!(
                "labels.\"{TARGET_LABEL}\"=={},parent==\"ns/2/p\"",
                digest('a')
            )])
            .await
            .unwrap();
        assert_eq!(over_p.len(), 1, "{over_p:?}");
        assert_ne!(over_p[0].name, layer);
        s.remove(&over_p[0].name).await.unwrap();
        s.remove("ns/2/p").await.unwrap();
        // Released once no snapshot shows it; Cleanup keeps what is shown.
        s.remove("ns/1/extract-2").await.unwrap();
        s.remove("ns/1/c").await.unwrap();
        s.cleanup().await;
        assert_eq!(fake.calls().last().unwrap(), "release all but 1");
        // Without remote layers, a snapshot over a layer that is not mounted is refused,
        // never an overlay without it.
        s.stop().await;
        let mut s = Served::start(&root, &socket).await;
        let e = s.prepare("ns/1/c2", &layer).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
        assert!(e.message().contains("not mounted"), "{e}");
        s.stop().await;
        let mut s = Served::start_with(&root, &socket, Some(fake.clone())).await;
        s.remove(&layer).await.unwrap();
        assert_eq!(
            fake.calls().last().unwrap(),
            &format!("release {}", digest('9'))
        );
        s.stop().await;
    });
    // A record naming another directory (a hand-edited file) stops the store at open.
    let meta = root.join("metadata.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["snapshots"]["x"] = serde_json::json!({
        "id": 0, "kind": "committed", "parent": "", "labels": {},
        "created": {"secs_since_epoch": 0, "nanos_since_epoch": 0},
        "updated": {"secs_since_epoch": 0, "nanos_since_epoch": 0},
        "size": 0, "inodes": 0,
        "remote": {"image": digest('9'), "source": "oci://r/x@sha256:0", "dir": "/etc"}
    });
    std::fs::write(&meta, serde_json::to_vec(&v).unwrap()).unwrap();
    let e = Store::open(&root).err().expect("refused");
    assert!(e.message.contains("not this root's"), "{e}");
}

/// The layer store's resolver against a registry that is not there: the Prepare fails
/// with `unavailable` naming it, within the request timeout.
#[test]
fn a_registry_that_is_down_fails_the_prepare() {
    let (dir, root, socket) = setup();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let mut resolver = layerstore::OciResolver::new(state, "/bin/false".into());
    resolver.insecure = true;
    resolver.timeout = Duration::from_secs(2);
    let remote = Arc::new(snapshotter::remote::OciLayers {
        resolver,
        check_first: false,
    });
    runtime().block_on(async {
        let mut s = Served::start_with(&root, &socket, Some(remote)).await;
        let started = std::time::Instant::now();
        let e = s
            .prepare_labelled("ns/1/x", "", layer_labels('a', '1'))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e}");
        assert!(e.message().contains("127.0.0.1:1"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(s.list().await.is_empty());
        s.stop().await;
    });
}
