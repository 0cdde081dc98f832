//! The mount table as `/proc/PID/mountinfo` shows it (proc_pid_mountinfo(5)), parsed in this
//! one place.
//!
//! - Paths (root, mount point, source, option values) come back as bytes with the kernel's
//!   octal escapes undone (`\040` is a space), so any path survives; `procfs` keeps the
//!   escapes and needs UTF-8 lines.
//! - A line that does not parse is left out.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One mount of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The mount's ID.
    pub id: u64,
    /// The ID of the mount it is mounted on.
    pub parent: u64,
    /// Its filesystem's device, `MAJOR:MINOR` as the table writes it.
    pub dev: String,
    /// The directory of its filesystem shown at the mount point.
    pub root: PathBuf,
    /// Where it is mounted.
    pub point: PathBuf,
    /// The filesystem type, with a FUSE subtype (`fuse.verilay`).
    pub fs_type: String,
    /// The filesystem's source as the table gives it: a device, a file, or a word like `none`.
    pub source: PathBuf,
    /// The per-superblock options, escaped as the table writes them (see [`Mount::option`]).
    super_options: Vec<u8>,
}

impl Mount {
    /// The type as the kernel knows the filesystem: a FUSE subtype left out (`fuse` for
    /// `fuse.sshfs`).
    pub fn fs_name(&self) -> &str {
        self.fs_type.split('.').next().unwrap_or(&self.fs_type)
    }

    /// The per-superblock options in order, each with its value (unescaped) if it has one.
    pub fn options(&self) -> impl Iterator<Item = (&OsStr, Option<PathBuf>)> + '_ {
        self.super_options
            .split(|&b| b == b',')
            .filter(|o| !o.is_empty())
            .map(|o| match o.iter().position(|&b| b == b'=') {
                Some(eq) => (OsStr::from_bytes(&o[..eq]), Some(unescape(&o[eq + 1..]))),
                None => (OsStr::from_bytes(o), None),
            })
    }

    /// The value of the per-superblock option `name`, if it is there with one.
    pub fn option(&self, name: &str) -> Option<PathBuf> {
        self.options()
            .find(|(n, _)| *n == OsStr::new(name))
            .and_then(|(_, v)| v)
    }
}

/// The mount table of process `pid`, or of this process with `None`.
pub fn table(pid: Option<u32>) -> std::io::Result<Vec<Mount>> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/mountinfo"),
        None => "/proc/self/mountinfo".to_string(),
    };
    Ok(parse(&std::fs::read(path)?))
}

/// The mounts whose mount point is `point`, bottom first (the last is the one in view).
pub fn at(point: &Path) -> Vec<Mount> {
    table(None)
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.point == point)
        .collect()
}

/// The mounts a mountinfo text lists, in its order.
pub fn parse(text: &[u8]) -> Vec<Mount> {
    text.split(|&b| b == b'\n').filter_map(line).collect()
}

/// One line: `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER`.
fn line(l: &[u8]) -> Option<Mount> {
    let fields: Vec<&[u8]> = l.split(|&b| b == b' ').collect();
    let sep = fields.iter().position(|f| *f == b"-")?;
    if sep < 6 || fields.len() < sep + 4 {
        return None;
    }
    let text = |f: &[u8]| std::str::from_utf8(f).ok().map(str::to_string);
    let number = |f: &[u8]| text(f)?.parse().ok();
    Some(Mount {
        id: number(fields[0])?,
        parent: number(fields[1])?,
        dev: text(fields[2])?,
        root: unescape(fields[3]),
        point: unescape(fields[4]),
        fs_type: String::from_utf8_lossy(fields[sep + 1]).into_owned(),
        source: unescape(fields[sep + 2]),
        super_options: fields[sep + 3].to_vec(),
    })
}

/// A field of the table with its octal escapes (`\040` for a space, …) undone.
pub fn unescape(field: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[u8] = b"22 27 0:21 / /proc rw,relatime shared:12 - proc proc rw\n\
        54 27 0:46 / /tmp/a\\040b/m rw,relatime - overlay none rw,lowerdir=/x\\054y,upperdir=/tmp/u\\012v,workdir=/tmp/w,uuid=null\n\
        60 54 0:50 /sub /tmp/c rw - fuse.verilay /img\\134 rw,user_id=0,group_id=0\n\
        garbage line\n";

    #[test]
    fn lines_parse_with_their_escapes_undone() {
        let t = parse(TABLE);
        assert_eq!(t.len(), 3);
        assert_eq!((t[0].id, t[0].parent, t[0].dev.as_str()), (22, 27, "0:21"));
        assert_eq!(t[1].point, Path::new("/tmp/a b/m"));
        assert_eq!(t[1].option("lowerdir"), Some(PathBuf::from("/x,y")));
        assert_eq!(t[1].option("upperdir"), Some(PathBuf::from("/tmp/u\nv")));
        assert_eq!(t[1].option("uuid"), Some(PathBuf::from("null")));
        assert_eq!(t[1].option("rw"), None);
        assert_eq!(
            (t[2].fs_type.as_str(), t[2].fs_name()),
            ("fuse.verilay", "fuse")
        );
        assert_eq!(t[2].root, Path::new("/sub"));
        assert_eq!(t[2].source, Path::new("/img\\"));
        assert_eq!(t[2].option("user_id"), Some(PathBuf::from("0")));
    }

    #[test]
    fn this_process_table_holds_its_root() {
        assert!(table(None)
            .unwrap()
            .iter()
            .any(|m| m.point == Path::new("/")));
    }
}
