//! Paths inside the mount, from the names each filesystem keeps for its objects: the
//! path a measurement names a file by, and how a log line names one.

use crate::measuring;
use crate::stack::Obj;

/// The kernel's PATH_MAX: IMA names a file by `d_absolute_path` into a buffer this big.
const PATH_MAX: usize = 4096;

/// The names from the root (1) down to object `start`, found by walking `up` (an
/// object's parent and name), and whether the walk reached the root. It stops early at an
/// object `up` does not know, or once the names fill PATH_MAX (which also ends a walk
/// around any cycle).
fn names_from_root<N: AsRef<[u8]>>(
    start: u64,
    up: impl Fn(u64) -> Option<(u64, N)>,
) -> (Vec<N>, bool) {
    let mut parts = Vec::new();
    let mut len = 0;
    let mut at = start;
    while at != 1 {
        let Some((parent, name)) = up(at) else {
            break;
        };
        len += name.as_ref().len() + 1;
        parts.push(name);
        if len >= PATH_MAX {
            break;
        }
        at = parent;
    }
    parts.reverse();
    (parts, at == 1)
}

/// The path a measurement names object `start` by: `setup.path` of the names from the
/// root (1) down, found by walking `up` (an object's parent and name). Bounded as the
/// kernel's is: a path `d_absolute_path` cannot fit in PATH_MAX bytes is named as
/// `ima_d_path` names it then, by the object's own name alone (at most NAME_MAX - 1
/// bytes, what its `strscpy` keeps).
pub(crate) fn measured_path<N: AsRef<[u8]>>(
    setup: &measuring::Setup,
    start: u64,
    up: impl Fn(u64) -> Option<(u64, N)>,
) -> Vec<u8> {
    let (parts, _) = names_from_root(start, up);
    let parts: Vec<&[u8]> = parts.iter().map(AsRef::as_ref).collect();
    let own = parts.last().copied().unwrap_or_default();
    let path = setup.path(&parts);
    if path.len() >= PATH_MAX {
        return own[..own.len().min(254)].to_vec();
    }
    path
}

/// How a log line names object `start`: its path inside the mount (`/usr/bin/ls`, from
/// the names `up` gives, as `measured_path` walks them), with `name` appended when given
/// (an entry of directory `start` not yet known), escaped so that it stays one line; and
/// then the image object, if known (`inode 1234`, `inode 1234 of layer 1` in a stack).
/// Without a whole path (an ancestor the mount never learnt, or one past PATH_MAX) the
/// object alone names it.
pub(crate) fn logged_subject<N: AsRef<[u8]>>(
    start: u64,
    name: Option<&[u8]>,
    obj: Option<(Obj, bool)>,
    up: impl Fn(u64) -> Option<(u64, N)>,
) -> String {
    let (parts, whole) = names_from_root(start, up);
    let mut parts: Vec<&[u8]> = parts.iter().map(AsRef::as_ref).collect();
    parts.extend(name);
    let obj = obj.map(|(o, stacked)| match stacked {
        true => format!("inode {} of layer {}", o.nid, o.layer),
        false => format!("inode {}", o.nid),
    });
    if !whole {
        return obj.unwrap_or_else(|| "an object whose path is unknown".into());
    }
    let path = logged_path(&parts);
    match obj {
        Some(o) => format!("{path} ({o})"),
        None => path,
    }
}

/// Names from the root down as a log line shows them: `/a/b`, each escaped so that the
/// line stays one line (`\n`, `\"`, invalid UTF-8 as U+FFFD).
pub(crate) fn logged_path(parts: &[impl AsRef<[u8]>]) -> String {
    let mut path = String::new();
    for p in parts {
        path.push('/');
        path.extend(String::from_utf8_lossy(p.as_ref()).escape_debug());
    }
    if path.is_empty() {
        path.push('/');
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// `up` over a table of (object → parent, name).
    fn subject(
        table: &HashMap<u64, (u64, Vec<u8>)>,
        start: u64,
        name: Option<&[u8]>,
        obj: Option<(Obj, bool)>,
    ) -> String {
        logged_subject(start, name, obj, |at| {
            table.get(&at).map(|(p, n)| (*p, &n[..]))
        })
    }

    #[test]
    fn a_logged_subject_is_the_path_in_the_mount_then_the_object() {
        let table = HashMap::from([
            (10, (1, b"usr".to_vec())),
            (11, (10, b"bin".to_vec())),
            (12, (11, b"ls".to_vec())),
        ]);
        let o = Obj { layer: 1, nid: 42 };
        assert_eq!(
            subject(&table, 12, None, Some((o, false))),
            "/usr/bin/ls (inode 42)"
        );
        assert_eq!(
            subject(&table, 12, None, Some((o, true))),
            "/usr/bin/ls (inode 42 of layer 1)"
        );
        assert_eq!(subject(&table, 11, Some(b"cat"), None), "/usr/bin/cat");
        assert_eq!(subject(&table, 1, None, None), "/");
        assert_eq!(subject(&table, 1, Some(b"etc"), None), "/etc");
    }

    #[test]
    fn an_unknown_ancestor_or_a_loop_falls_back_to_the_object() {
        // 21's parent 20 was never learnt; 30 and 31 are each other's parent.
        let table = HashMap::from([
            (21, (20, b"f".to_vec())),
            (30, (31, b"a".to_vec())),
            (31, (30, b"b".to_vec())),
        ]);
        let o = Obj { layer: 0, nid: 7 };
        assert_eq!(subject(&table, 21, None, Some((o, false))), "inode 7");
        assert_eq!(subject(&table, 30, None, Some((o, false))), "inode 7");
        assert_eq!(
            subject(&table, 21, Some(b"x"), None),
            "an object whose path is unknown"
        );
    }

    #[test]
    fn a_logged_path_stays_one_line() {
        let table = HashMap::from([(10, (1, b"a\nb\"c\xff".to_vec()))]);
        assert_eq!(subject(&table, 10, None, None), "/a\\nb\\\"c\u{fffd}");
    }
}
