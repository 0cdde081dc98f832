//! Opening images and resolving paths inside them, shared by the read-side commands.

use anyhow::{bail, Context};
use erofs::read::{FileSource, Image, Inode};
use std::path::Path;

pub fn open(path: &Path) -> anyhow::Result<Image<FileSource>> {
    let src = FileSource::open(path).with_context(|| format!("opening {}", path.display()))?;
    Image::open(src).with_context(|| format!("{}", path.display()))
}

/// Resolves an absolute or relative path from the root, one lookup per component
/// (symlinks are not followed: the image's own tree is what is inspected).
pub fn resolve(img: &Image<FileSource>, path: &str) -> anyhow::Result<Inode> {
    let mut inode = img.inode(img.root_nid())?;
    for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if !inode.is_dir() {
            bail!("{path}: a component before {comp:?} is not a directory");
        }
        match img.lookup(&inode, comp.as_bytes())? {
            Some(e) => inode = img.inode(e.nid)?,
            None => bail!("{path}: no such file or directory in the image"),
        }
    }
    Ok(inode)
}

/// `ls -l` style type and permission string.
pub fn mode_string(mode: u16) -> String {
    let t = match mode & 0o170000 {
        0o040000 => 'd',
        0o120000 => 'l',
        0o020000 => 'c',
        0o060000 => 'b',
        0o010000 => 'p',
        0o140000 => 's',
        _ => '-',
    };
    let mut s = String::from(t);
    let bits = [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o040, 'r'),
        (0o020, 'w'),
        (0o010, 'x'),
        (0o004, 'r'),
        (0o002, 'w'),
        (0o001, 'x'),
    ];
    for (i, (bit, c)) in bits.iter().enumerate() {
        let special = match i {
            2 if mode & 0o4000 != 0 => Some(if mode & bit != 0 { 's' } else { 'S' }),
            5 if mode & 0o2000 != 0 => Some(if mode & bit != 0 { 's' } else { 'S' }),
            8 if mode & 0o1000 != 0 => Some(if mode & bit != 0 { 't' } else { 'T' }),
            _ => None,
        };
        s.push(special.unwrap_or(if mode & bit != 0 { *c } else { '-' }));
    }
    s
}

/// Bytes as text when printable, else hex (like getfattr's `0x` form).
pub fn show_bytes(v: &[u8]) -> String {
    if !v.is_empty() && v.iter().all(|&b| (0x20..0x7f).contains(&b)) {
        format!("{:?}", String::from_utf8_lossy(v))
    } else {
        let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
        format!("0x{hex}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn modes() {
        assert_eq!(super::mode_string(0o104755), "-rwsr-xr-x");
        assert_eq!(super::mode_string(0o041777), "drwxrwxrwt");
        assert_eq!(super::mode_string(0o020600), "crw-------");
    }
}
