//! What the store served for each layer and what checking each binding found, kept in
//! `STATE/served.json` (docs/FORMAT.md, "The layer store's record"): podman's layers outlive
//! the store.
//!
//! - containers/storage reuses a layer for any later image listing its blob or DiffID, which do
//!   not name a verilay layer's contents: so every binding served is kept and checked
//!   (docs/SECURITY.md section 10).

use oci::conversion::ConvertedLayer;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One verilay image as the store serves it for a layer: what the `info` file tells
/// podman, and the image the `diff` mount pins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// The layer blob's digest, as the binding manifest lists it.
    pub layer: String,
    /// The layer blob's size in bytes, as the binding manifest lists it.
    pub layer_size: u64,
    /// The layer blob's media type, as the binding manifest lists it.
    pub media_type: String,
    /// The DiffID the `info` file gives.
    pub diff_id: String,
    /// The size in bytes of the uncompressed tar, as the `info` file gives it.
    pub tar_size: u64,
    /// The image digest: what the mount pins.
    pub image: String,
    /// The image file's blob digest (`sha256:…` of the file).
    pub image_blob: String,
    /// The image file's size, in bytes.
    pub image_size: u64,
    /// The reference that bound it: its repository holds the image blob (and lists the
    /// layer blob).
    pub reference: String,
}

impl Binding {
    /// The binding `reference` makes of its converted layer `l`.
    pub fn of(reference: &str, l: &ConvertedLayer) -> Binding {
        Binding {
            layer: l.source.digest.clone(),
            layer_size: l.source.size,
            media_type: l.source.media_type.clone(),
            diff_id: l.diff_id.clone(),
            tar_size: l.tar_size,
            image: l.image_digest.clone(),
            image_blob: l.image_blob.clone(),
            image_size: l.image_size,
            reference: reference.to_string(),
        }
    }

    /// Whether `o` gives podman the same layer: the same blob, claims and files (the
    /// reference that bound it aside).
    pub fn same(&self, o: &Binding) -> bool {
        (&self.layer, &self.diff_id, self.tar_size, &self.image)
            == (&o.layer, &o.diff_id, o.tar_size, &o.image)
    }
}

/// What checking a binding's image against its layer blob found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The image holds exactly the layer's files, and the blob has the DiffID and tar
    /// size the binding claims: a layer made of it is the layer, reusable by anyone.
    Holds,
    /// It does not: why (the first difference, by path).
    Differs(String),
}

/// One binding of the record: whether it was served, and what checking it found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The binding.
    #[serde(flatten)]
    pub binding: Binding,
    /// Answered to podman (a layer it may have made); otherwise only checked (a binding
    /// refused before it was served).
    pub served: bool,
    /// What checking it found; `None` until it is checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
}

#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    entries: Vec<Entry>,
}

/// The largest record file read: [`ENTRIES_MAX`] entries take about 3 MiB.
const FILE_MAX: u64 = 16 << 20;
/// The most entries kept. Entries that matter (served and not found to hold their layer)
/// are never dropped; when only those are left, a new layer is not served (podman pulls
/// it the ordinary way).
pub const ENTRIES_MAX: usize = 4096;

/// The bindings served and the verdicts found, as `served.json` keeps them.
#[derive(Debug)]
pub struct Record {
    path: PathBuf,
    entries: Vec<Entry>,
}

impl Record {
    /// The record at `path` (none yet: empty). One that cannot be read is an error, never
    /// an empty record: what it named may still be in podman's storage.
    pub fn open(path: &Path) -> Result<Record, String> {
        let what = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        // A regular file of at most FILE_MAX bytes, opened without waiting (a FIFO there
        // would hold the store's start forever).
        let bytes = match verity::source::read_input(path, FILE_MAX) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Record::empty(path));
            }
            Err(e) => return Err(what(&e)),
        };
        let file: File = serde_json::from_slice(&bytes).map_err(|e| what(&e))?;
        if file.version != 1 || file.entries.len() > ENTRIES_MAX {
            return Err(what(&format!(
                "version {} with {} entries: not a record this store writes",
                file.version,
                file.entries.len()
            )));
        }
        Ok(Record {
            path: path.to_path_buf(),
            entries: file.entries,
        })
    }

    /// An empty record, to be saved at `path`.
    pub fn empty(path: &Path) -> Record {
        Record {
            path: path.to_path_buf(),
            entries: Vec::new(),
        }
    }

    /// Written whole to a new file, synced, and renamed over the old one: a crash leaves
    /// one or the other, and a link planted there is replaced, not followed.
    fn save(&self) -> Result<(), String> {
        use std::io::Write;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let what = |e: &dyn std::fmt::Display| format!("{}: {e}", self.path.display());
        let bytes = serde_json::to_vec(&File {
            version: 1,
            entries: self.entries.clone(),
        })
        .map_err(|e| what(&e))?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| what(&e))?;
        tmp.write_all(&bytes).map_err(|e| what(&e))?;
        tmp.as_file().sync_all().map_err(|e| what(&e))?;
        tmp.persist(&self.path).map_err(|e| what(&e))?;
        Ok(())
    }

    /// The bindings served that podman may reuse for layer `digest` of an image whose
    /// DiffIDs for it are `diff_ids`: those of the same blob, and those claiming one of
    /// those DiffIDs (a layer made of them has the same ID wherever the parents match).
    pub fn relevant(&self, digest: &str, diff_ids: &[String]) -> Vec<Entry> {
        self.entries
            .iter()
            .filter(|e| e.served)
            .filter(|e| e.binding.layer == digest || diff_ids.contains(&e.binding.diff_id))
            .cloned()
            .collect()
    }

    /// Whether nothing was served yet.
    pub fn is_empty(&self) -> bool {
        !self.entries.iter().any(|e| e.served)
    }

    /// Whether a binding served has not been found to hold its layer: one that an image
    /// whose DiffIDs are unknown might reuse.
    pub fn unchecked(&self) -> bool {
        self.entries
            .iter()
            .any(|e| e.served && e.verdict != Some(Verdict::Holds))
    }

    /// What checking a binding that gives podman the same layer as `b` found, if it was
    /// checked.
    pub fn verdict(&self, b: &Binding) -> Option<Verdict> {
        self.entries
            .iter()
            .find(|e| e.binding.same(b))
            .and_then(|e| e.verdict.clone())
    }

    /// Whether a binding that gives podman the same layer as `b` was served.
    pub fn is_served(&self, b: &Binding) -> bool {
        self.entries.iter().any(|e| e.served && e.binding.same(b))
    }

    /// Keeps `verdict` for `b` (served or not).
    pub fn set_verdict(&mut self, b: &Binding, verdict: Verdict) -> Result<(), String> {
        match self.entries.iter_mut().find(|e| e.binding.same(b)) {
            Some(e) => e.verdict = Some(verdict),
            None => {
                if !self.make_room() {
                    return Err(format!(
                        "{}: full of layers served and not found to hold their files",
                        self.path.display()
                    ));
                }
                self.entries.push(Entry {
                    binding: b.clone(),
                    served: false,
                    verdict: Some(verdict),
                });
            }
        }
        self.save()
    }

    /// Records `b` as served, before podman learns of it. False when the record is full
    /// of entries it must keep: then `b` must not be served.
    pub fn serve(&mut self, b: &Binding) -> Result<bool, String> {
        match self.entries.iter_mut().find(|e| e.binding.same(b)) {
            Some(e) if e.served => return Ok(true),
            Some(e) => e.served = true,
            None => {
                if !self.make_room() {
                    return Ok(false);
                }
                self.entries.push(Entry {
                    binding: b.clone(),
                    served: true,
                    verdict: None,
                });
            }
        }
        self.save().map(|()| true)
    }

    /// Room for one more entry: the oldest that can go is dropped if the record is full.
    /// A binding found to hold its layer, or never served, can go: a layer made of it is
    /// the layer, or there is none. Others stay.
    fn make_room(&mut self) -> bool {
        if self.entries.len() < ENTRIES_MAX {
            return true;
        }
        let spare = |e: &Entry| !e.served || e.verdict == Some(Verdict::Holds);
        match self.entries.iter().position(spare) {
            Some(i) => {
                self.entries.remove(i);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(layer: char, image: char, diff_id: char) -> Binding {
        let h = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        Binding {
            layer: h(layer),
            layer_size: 10,
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
            diff_id: h(diff_id),
            tar_size: 20,
            image: h(image),
            image_blob: h('f'),
            image_size: 30,
            reference: "127.0.0.1:5000/app@sha256:0".into(),
        }
    }

    /// A FIFO, an oversized or a garbled record is refused at once, naming the file,
    /// never taken for an empty record.
    #[test]
    fn a_record_that_is_not_one_is_refused_at_once() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("served.json");
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        let e = Record::open(&path).unwrap_err();
        assert!(
            e.contains("served.json") && e.contains("not a regular file"),
            "{e}"
        );
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, vec![b' '; FILE_MAX as usize + 1]).unwrap();
        let e = Record::open(&path).unwrap_err();
        assert!(e.contains("served.json"), "{e}");
        std::fs::write(&path, b"{\"version\": 1, \"entries\": [").unwrap();
        assert!(Record::open(&path).is_err());
    }

    #[test]
    fn what_was_served_and_found_outlives_the_store_within_bounds() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("served.json");
        let mut r = Record::open(&path).unwrap();
        let (x, y, z) = (
            binding('1', 'a', '7'),
            binding('1', 'b', '7'),
            binding('2', 'c', '7'),
        );
        assert!(r.serve(&x).unwrap());
        assert!(r.serve(&z).unwrap());
        r.set_verdict(&y, Verdict::Differs("/etc/msg: contents".into()))
            .unwrap();
        let r = Record::open(&path).unwrap();
        // The same blob, or the same DiffID under another blob; a checked, unserved
        // binding is no layer podman holds.
        assert_eq!(r.relevant(&x.layer, &[]).len(), 1);
        assert_eq!(
            r.relevant(
                &binding('3', 'a', '8').layer,
                std::slice::from_ref(&x.diff_id)
            )
            .len(),
            2
        );
        assert_eq!(
            r.verdict(&y),
            Some(Verdict::Differs("/etc/msg: contents".into()))
        );
        assert!(r.is_served(&x) && !r.is_served(&y));
        assert!(r.unchecked());
        // The reference is no part of what podman gets.
        let mut x2 = x.clone();
        x2.reference = "elsewhere/x@sha256:1".into();
        assert!(r.is_served(&x2));

        // Full: entries that can go make room, the others never.
        let mut r = Record::empty(&path);
        for i in 0..ENTRIES_MAX {
            let mut b = binding('1', 'a', '7');
            b.image = format!("sha256:{i:064x}");
            r.entries.push(Entry {
                binding: b,
                served: true,
                verdict: None,
            });
        }
        assert!(!r.serve(&binding('9', '9', '9')).unwrap());
        let mut first = binding('1', 'a', '7');
        first.image = format!("sha256:{:064x}", 0);
        r.set_verdict(&first, Verdict::Holds).unwrap();
        assert!(r.serve(&binding('9', '9', '9')).unwrap());
        assert!(!r.is_served(&first));
        assert_eq!(Record::open(&path).unwrap().entries.len(), ENTRIES_MAX);

        // A record that cannot be read is an error, not an empty record.
        std::fs::write(&path, b"{").unwrap();
        assert!(Record::open(&path).is_err());
        std::fs::write(&path, vec![b' '; FILE_MAX as usize + 1]).unwrap();
        assert!(Record::open(&path).unwrap_err().contains("larger than"));
    }
}
