//! The read-side commands' image flags (`--digest`, the signature policy), over the
//! `opening` crate, and how they print what they find.

use std::path::Path;

pub use opening::{resolve, Img, ReadOpts};

/// What the image must be: `--digest`, and for `oci://` images the signature policy their
/// manifest must satisfy; shared by every command that reads an image.
#[derive(clap::Args, Clone, Default)]
pub struct Pin {
    /// Refuse the image unless its digest is this (`sha256:HEX`, as `verilay build` and
    /// `fsverity digest` print it).
    #[arg(long, value_name = "ALG:HEX")]
    pub digest: Option<String>,
    #[command(flatten)]
    pub policy: super::registry::Policy,
}

impl Pin {
    /// The pin as `opening` takes it.
    pub fn to_open(&self) -> opening::Pin {
        opening::Pin {
            digest: self.digest.clone(),
            policy: self.policy.files(),
        }
    }
}

/// Opens an image for a read-side command, reaching a remote one as `remote` says; a
/// plain EROFS image only when `allow_plain`.
pub fn open(
    path: &Path,
    pin: &Pin,
    remote: &super::registry::Remote,
    allow_plain: bool,
) -> anyhow::Result<opening::Opened> {
    let opts = ReadOpts {
        insecure: remote.insecure,
        timeout: remote.timeout()?,
        ..ReadOpts::default()
    };
    let opened = opening::open(path, &pin.to_open(), allow_plain, &opts)?;
    opened.say_warnings();
    Ok(opened)
}

/// The verified source alone, without the EROFS image on top (for `verify`, which must
/// be able to name a bad superblock rather than fail to open it).
pub fn open_verified(
    path: &Path,
    pin: &Pin,
) -> anyhow::Result<verity::VerifiedSource<erofs::read::FileSource>> {
    opening::open_verified(path, &pin.to_open())
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
        format!("0x{}", hex::encode(v))
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
