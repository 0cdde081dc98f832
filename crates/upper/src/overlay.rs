//! overlayfs's vocabulary, in one place: the markers it reads in a lower layer or an upper
//! directory (whiteouts, opaque directories, redirects), and how an OCI layer tarball
//! writes the same markers. The tar reader, the image stack and the upper directory all
//! take them from here.

/// The most layers a stack takes (overlayfs's limit too).
pub const MAX_LAYERS: usize = 500;

/// overlayfs's private namespace in a lower layer (an image): markers there are always
/// `trusted.overlay.*`, whoever mounts.
pub const PRIVATE_XATTR_PREFIX: &[u8] = b"trusted.overlay.";
/// A directory's opacity marker in a lower layer (see [`Opacity`]).
pub const OPAQUE_XATTR: &[u8] = b"trusted.overlay.opaque";
/// The value that makes a directory opaque.
pub const OPAQUE: &[u8] = b"y";
/// Where a directory's lower contents are, in a lower layer: a name in its parent's
/// lower directories, or a path from the lower layers' roots when it starts with `/`.
pub const REDIRECT_XATTR: &[u8] = b"trusted.overlay.redirect";
/// Marks an xattr whiteout: an empty regular file in a directory whose opacity is `x`.
pub const WHITEOUT_XATTR: &[u8] = b"trusted.overlay.whiteout";
/// A whiteout device's numbers: a character device 0/0.
pub const WHITEOUT_DEVICE: (u32, u32) = (0, 0);

/// An OCI layer tarball's whiteout: `.wh.NAME` deletes NAME of the layers below.
pub const TAR_WHITEOUT_PREFIX: &[u8] = b".wh.";
/// An OCI layer tarball's opaque marker: its directory hides the layers below.
pub const TAR_OPAQUE_MARKER: &[u8] = b".wh..wh..opq";

/// The longest absolute redirect overlayfs writes (its `redirect_max` parameter's default).
pub const REDIRECT_MAX: usize = 256;

const S_IFMT: u32 = 0o170000;
const S_IFCHR: u32 = 0o020000;

/// The namespace a mount keeps its markers in: `trusted.overlay.` as root,
/// `user.overlay.` when mounted by an ordinary user (overlayfs's `userxattr`). A mount
/// reads markers in its own namespace only, as overlayfs does: a root mount must not take
/// orders from `user.*` xattrs that any file owner can set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace {
    /// `trusted.overlay.*`: a mount made by root.
    Trusted,
    /// `user.overlay.*`: a mount made by an ordinary user.
    User,
}

impl Namespace {
    /// The namespace of a mount made by this process.
    pub fn of_this_process() -> Namespace {
        if rustix::process::geteuid().is_root() {
            Namespace::Trusted
        } else {
            Namespace::User
        }
    }

    /// The namespace's prefix: `trusted.overlay.` or `user.overlay.`.
    pub fn prefix(self) -> &'static str {
        match self {
            Namespace::Trusted => "trusted.overlay.",
            Namespace::User => "user.overlay.",
        }
    }

    /// A directory's opacity marker (see [`Opacity`]).
    pub fn opaque(self) -> &'static str {
        match self {
            Namespace::Trusted => "trusted.overlay.opaque",
            Namespace::User => "user.overlay.opaque",
        }
    }

    /// Where a directory moved away from its lower contents names them (`redirect_dir`).
    pub fn redirect(self) -> &'static str {
        match self {
            Namespace::Trusted => "trusted.overlay.redirect",
            Namespace::User => "user.overlay.redirect",
        }
    }

    /// verilay's own marker: the image id a copied-up regular file keeps, kept in
    /// overlayfs's namespace so that it is hidden as overlayfs hides its own.
    pub fn origin(self) -> &'static str {
        match self {
            Namespace::Trusted => "trusted.overlay.verilay.origin",
            Namespace::User => "user.overlay.verilay.origin",
        }
    }
}

/// How a directory's opacity marker reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opacity {
    /// No marker, or one of another value: the directory merges with those below.
    None,
    /// `y`: nothing below it merges.
    Opaque,
    /// `x`: not opaque, but its entries may be xattr whiteouts.
    XWhiteouts,
}

impl Opacity {
    /// The opacity a marker's value (or its absence) stands for.
    pub fn of(value: Option<&[u8]>) -> Opacity {
        match value {
            Some(b"y") => Opacity::Opaque,
            Some(b"x") => Opacity::XWhiteouts,
            _ => Opacity::None,
        }
    }
}

/// Whether an object of this mode and device is a whiteout: a character device 0/0.
pub fn is_whiteout(mode: u32, rdev: (u32, u32)) -> bool {
    mode & S_IFMT == S_IFCHR && rdev == WHITEOUT_DEVICE
}

/// Whether overlayfs follows a redirect: a relative one is one name, an absolute one has
/// no empty part; and no part is `.` or `..`, which could make a directory merge with its
/// own ancestor, or longer than a name may be.
pub fn valid_redirect(to: &[u8]) -> bool {
    // A name longer than NAME_MAX fails overlayfs's lookup (ENAMETOOLONG).
    let bad = |part: &[u8]| part.is_empty() || part == b"." || part == b".." || part.len() > 255;
    match to.strip_prefix(b"/") {
        None => !to.contains(&b'/') && !bad(to),
        Some(path) => !path.split(|&b| b == b'/').any(bad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_overlayfs_follows() {
        for ok in [&b"a"[..], b"/a", b"/a/b", b".a"] {
            assert!(valid_redirect(ok), "{ok:?}");
        }
        for bad in [
            &b""[..],
            b"a/b",
            b".",
            b"..",
            b"/",
            b"/a//b",
            b"/a/../b",
            b"/a/",
        ] {
            assert!(!valid_redirect(bad), "{bad:?}");
        }
        let long = [b'n'; 256];
        assert!(!valid_redirect(&long));
        assert!(valid_redirect(&long[..255]));
    }

    #[test]
    fn a_whiteout_is_a_character_device_0_0() {
        assert!(is_whiteout(0o020000, (0, 0)));
        assert!(!is_whiteout(0o020000, (0, 1)));
        assert!(!is_whiteout(0o060000, (0, 0)));
        assert!(!is_whiteout(0o100644, (0, 0)));
    }
}
