//! Several images stacked with overlayfs's rules, first = top; pure functions.
//!
//! - A name resolves to the topmost object carrying it; whiteouts hide it below.
//! - Directories merge unless opaque; a non-directory ends the merge; a redirect says where
//!   the layers below keep a directory (docs/FORMAT.md, "Overlayfs markers").
//! - A directory found where its own `..` says it is not is refused ([`Misplaced`]).

use erofs::read::{ByteSource, Error, Image, Inode, Result};
use upper::overlay::{self, Opacity, OPAQUE_XATTR, REDIRECT_XATTR, WHITEOUT_XATTR};

/// One object in one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Obj {
    /// The layer's index, 0 = top.
    pub layer: u16,
    /// The inode number in that layer's image.
    pub nid: u64,
}

/// One layer's directory taking part in a merged directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dir {
    /// The directory.
    pub obj: Obj,
    /// `trusted.overlay.opaque` = `x`: entries may be xattr whiteouts.
    pub xwhiteouts: bool,
    /// The directory of the same layer it was found in (a redirect may have led
    /// elsewhere than the merged parent's); itself for a root, or where not known.
    pub found_in: u64,
}

/// The longest path a chain of redirects may make (PATH_MAX): each lower layer walks it.
const REDIRECTED_PATH_MAX: usize = 4096;

/// What the layers below look for while a name is resolved: its components, from the
/// merged parent's directories, or from each layer's root once a redirect was absolute.
struct Wanted {
    parts: Vec<Vec<u8>>,
    absolute: bool,
    /// An opaque directory or a whiteout on the way ended the merge.
    stop: bool,
}

/// What a name resolves to in the merged tree.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The topmost object carrying the name.
    pub top: Obj,
    /// Its inode.
    pub inode: Inode,
    /// For a directory, every layer's directory merged at this path, top first (so
    /// `chain[0].obj == top`); empty for other objects.
    pub chain: Vec<Dir>,
}

impl Resolved {
    /// A directory made of more than one layer's (overlayfs then reports nlink 1).
    pub fn is_merged(&self) -> bool {
        self.chain.len() > 1
    }
}

/// Images stacked with overlayfs's rules, first = top.
pub struct Stack<S: ByteSource> {
    /// The images, top first.
    pub layers: Vec<Image<S>>,
}

impl<S: ByteSource> Stack<S> {
    /// Whether some layer is read over the network (a remote image), so any read of the
    /// images may wait long.
    pub fn remote(&self) -> bool {
        self.layers.iter().any(|l| l.source().refetches())
    }
}

/// A directory found as `name` in directory `parent` whose own `..` names another
/// directory (`dotdot`; `None`: it has none, or it is the layer's root). The kernel's
/// erofs never reads `..` (the VFS keeps parents), so it would serve such a directory
/// under both names, or refuse a loop with ELOOP; a mount that keeps parents for
/// paths and copy-up would walk the loop forever. `fsck` reports the same problem.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}directory inode {nid} (byte {offset}) is {:?} in directory inode {parent}, but {} \
     (a directory cycle or a directory under two parents): refused",
    layer.map(|l| format!("layer {l}: ")).unwrap_or_default(),
    String::from_utf8_lossy(name),
    dotdot.map_or("it is the root or has no \"..\"".to_string(), |d| format!("its \"..\" names inode {d}"))
)]
pub struct Misplaced {
    /// Named only in a stack of several images.
    pub layer: Option<u16>,
    /// The directory's inode number.
    pub nid: u64,
    /// Byte offset of the directory's inode.
    pub offset: u64,
    /// The directory it was found in.
    pub parent: u64,
    /// The name it was found under.
    pub name: Vec<u8>,
    /// What its own `..` names, if anything.
    pub dotdot: Option<u64>,
}

/// A reader error as one log line: a [`Misplaced`] directory says so itself.
pub fn describe(e: &Error) -> String {
    match misplaced(e) {
        Some(m) => m.to_string(),
        None => e.to_string(),
    }
}

/// The [`Misplaced`] directory an error reports, if that is what it is.
pub fn misplaced(e: &Error) -> Option<&Misplaced> {
    match e {
        Error::Io { err, .. } => err.get_ref()?.downcast_ref::<Misplaced>(),
        _ => None,
    }
}

impl<S: ByteSource> Stack<S> {
    /// Layer `layer`'s image (panics if there is none).
    pub fn image(&self, layer: u16) -> &Image<S> {
        &self.layers[usize::from(layer)]
    }

    /// Object `o`'s inode.
    pub fn inode(&self, o: Obj) -> Result<Inode> {
        self.image(o.layer).inode(o.nid)
    }

    /// Checks that `child`, found as `name` in directory `parent` of `layer`, is there:
    /// a directory must not be the layer's root, and its `..` must name `parent`. As an
    /// error it is EIO (the image contradicts itself), with [`Misplaced`] inside.
    pub fn check_placement(
        &self,
        layer: u16,
        parent: u64,
        name: &[u8],
        child: &Inode,
    ) -> Result<()> {
        if !child.is_dir() {
            return Ok(());
        }
        let img = self.image(layer);
        let dotdot = if child.nid == img.root_nid() {
            None
        } else {
            img.lookup(child, b"..")?.map(|e| e.nid)
        };
        if dotdot == Some(parent) {
            return Ok(());
        }
        let m = Misplaced {
            layer: (self.layers.len() > 1).then_some(layer),
            nid: child.nid,
            offset: child.offset(),
            parent,
            name: name.to_vec(),
            dotdot,
        };
        Err(Error::Io {
            offset: m.offset,
            err: std::io::Error::other(m),
        })
    }

    /// [`Stack::check_placement`] for every layer's directory of `r`, listed as `name`
    /// (a merged listing is resolved unchecked), in the directory it was found in.
    pub fn check_resolved(&self, name: &[u8], r: &Resolved) -> Result<()> {
        for (i, d) in r.chain.iter().enumerate() {
            let inode = if i == 0 {
                r.inode.clone()
            } else {
                self.inode(d.obj)?
            };
            self.check_placement(d.obj.layer, d.found_in, name, &inode)?;
        }
        Ok(())
    }

    fn opacity(&self, layer: u16, dir: &Inode) -> Result<Opacity> {
        let value = self.image(layer).getxattr(dir, OPAQUE_XATTR)?;
        Ok(Opacity::of(value.as_deref()))
    }

    /// `dir` as a merge participant (reads its opacity), its parent not known.
    pub fn dir(&self, o: Obj, inode: &Inode) -> Result<Dir> {
        Ok(Dir {
            obj: o,
            xwhiteouts: self.opacity(o.layer, inode)? == Opacity::XWhiteouts,
            found_in: o.nid,
        })
    }

    /// Whether `inode`, an entry of a directory in `layer`, is a whiteout: a character
    /// device 0/0, or (in a directory whose `trusted.overlay.opaque` is `x`,
    /// `parent_xwhiteouts`) an empty file with `trusted.overlay.whiteout`.
    pub fn is_whiteout(&self, layer: u16, parent_xwhiteouts: bool, inode: &Inode) -> Result<bool> {
        if inode.mode & erofs::format::S_IFMT == erofs::format::S_IFCHR {
            return Ok(overlay::is_whiteout(inode.mode.into(), inode.rdev));
        }
        Ok(parent_xwhiteouts
            && inode.is_reg()
            && inode.size == 0
            && self.image(layer).getxattr(inode, WHITEOUT_XATTR)?.is_some())
    }

    /// The root: every layer's root, top first. An opaque root ends nothing: overlayfs
    /// never reads `opaque` on its root ("Root is always merge", `ovl_get_root`), only
    /// the `x` that marks xattr whiteouts.
    pub fn root(&self) -> Result<Resolved> {
        let chain = (0..self.layers.len() as u16)
            .map(|layer| self.root_dir(layer))
            .collect::<Result<Vec<_>>>()?;
        let top = chain[0].obj;
        Ok(Resolved {
            top,
            inode: self.inode(top)?,
            chain,
        })
    }

    fn root_dir(&self, layer: u16) -> Result<Dir> {
        let nid = self.image(layer).root_nid();
        let o = Obj { layer, nid };
        let inode = self.inode(o)?;
        Ok(Dir {
            obj: o,
            xwhiteouts: self.opacity(layer, &inode)? == Opacity::XWhiteouts,
            found_in: nid,
        })
    }

    /// Resolves `name` in the merged directory made of `chain` (top first); `None` when no
    /// layer has it or a whiteout hides it. Every directory taking part is checked to be
    /// in its place ([`Stack::check_placement`]).
    pub fn lookup(&self, chain: &[Dir], name: &[u8]) -> Result<Option<Resolved>> {
        self.resolve(chain, name, true)
    }

    fn resolve(&self, chain: &[Dir], name: &[u8], checked: bool) -> Result<Option<Resolved>> {
        let mut found: Option<Resolved> = None;
        let mut want = Wanted {
            parts: vec![name.to_vec()],
            absolute: false,
            stop: false,
        };
        // The parent's directories, in order, until a redirect is absolute; then every
        // layer below the one that said so, from its root (`poe = roe` in `ovl_lookup`).
        let mut next = 0;
        let mut from_root: Option<u16> = None;
        while !want.stop {
            let start = match from_root {
                None => match chain.get(next) {
                    Some(d) => {
                        next += 1;
                        *d
                    }
                    None => break,
                },
                Some(l) if usize::from(l) < self.layers.len() => {
                    from_root = Some(l + 1);
                    self.root_dir(l)?
                }
                Some(_) => break,
            };
            let layer = start.obj.layer;
            let Some((o, inode, parent)) = self.walk(start, &mut want, checked)? else {
                if want.absolute && from_root.is_none() {
                    from_root = Some(layer + 1);
                }
                continue;
            };
            let is_dir = inode.is_dir();
            match &mut found {
                None if !is_dir => {
                    return Ok(Some(Resolved {
                        top: o,
                        inode,
                        chain: Vec::new(),
                    }))
                }
                // Below a directory, a non-directory ends the merge and is not shown.
                Some(_) if !is_dir => break,
                _ => {}
            }
            if checked {
                let shown = want.parts.last().map_or(name, |p| p.as_slice());
                self.check_placement(layer, parent, shown, &inode)?;
            }
            let opacity = self.opacity(layer, &inode)?;
            let dir = Dir {
                obj: o,
                xwhiteouts: opacity == Opacity::XWhiteouts,
                found_in: parent,
            };
            match &mut found {
                None => {
                    found = Some(Resolved {
                        top: o,
                        inode: inode.clone(),
                        chain: vec![dir],
                    })
                }
                Some(r) => r.chain.push(dir),
            }
            if opacity == Opacity::Opaque {
                break;
            }
            if usize::from(layer) + 1 < self.layers.len() {
                let last = want.parts.len() - 1;
                self.follow_redirect(layer, &inode, last, &mut want)?;
            }
            if want.absolute && from_root.is_none() {
                from_root = Some(layer + 1);
            }
        }
        Ok(found)
    }

    /// Walks `want` from directory `start` in its layer: the object at its end, with the
    /// directory it is in, or `None` where the layer has nothing there. A whiteout,
    /// opaque directory or non-directory on the way sets `want.stop`; a redirect on the
    /// way rewrites `want` for the layers below (`ovl_lookup_layer`).
    fn walk(
        &self,
        start: Dir,
        want: &mut Wanted,
        checked: bool,
    ) -> Result<Option<(Obj, Inode, u64)>> {
        let layer = start.obj.layer;
        let img = self.image(layer);
        let mut dir = img.inode(start.obj.nid)?;
        let mut xwhiteouts = start.xwhiteouts;
        let end = want.parts.len() - 1;
        // Counted from the end: a redirect on the way changes the parts before.
        for from_end in (0..=end).rev() {
            let at = want.parts.len() - 1 - from_end;
            let Some(e) = img.lookup(&dir, &want.parts[at])? else {
                return Ok(None);
            };
            let inode = img.inode(e.nid)?;
            if self.is_whiteout(layer, xwhiteouts, &inode)? {
                want.stop = true;
                return Ok(None);
            }
            let o = Obj { layer, nid: e.nid };
            if from_end == 0 {
                return Ok(Some((o, inode, dir.nid)));
            }
            if !inode.is_dir() {
                want.stop = true;
                return Ok(None);
            }
            if checked {
                self.check_placement(layer, dir.nid, &want.parts[at], &inode)?;
            }
            match self.opacity(layer, &inode)? {
                Opacity::Opaque => want.stop = true,
                o => {
                    xwhiteouts = o == Opacity::XWhiteouts;
                    if usize::from(layer) + 1 < self.layers.len() {
                        self.follow_redirect(layer, &inode, at, want)?;
                    }
                }
            }
            dir = inode;
        }
        Ok(None)
    }

    /// Rewrites `want` by directory `dir`'s redirect, if it has one: part `at` becomes
    /// the redirect's name, or everything up to it the redirect's path (which also
    /// undoes a stop: `ovl_check_redirect`). A redirect overlayfs refuses is an error.
    fn follow_redirect(&self, layer: u16, dir: &Inode, at: usize, want: &mut Wanted) -> Result<()> {
        let Some(to) = self.image(layer).getxattr(dir, REDIRECT_XATTR)? else {
            return Ok(());
        };
        let refuse = |why: &str| Error::Io {
            offset: dir.offset(),
            err: std::io::Error::other(format!(
                "layer {layer}: directory inode {}: redirect {:?} {why}: refused",
                dir.nid,
                String::from_utf8_lossy(&to)
            )),
        };
        if !overlay::valid_redirect(&to) {
            return Err(refuse("is not one overlayfs follows"));
        }
        let rest = want.parts.split_off(at + 1);
        match to.strip_prefix(b"/") {
            Some(path) => {
                want.parts = path.split(|&b| b == b'/').map(<[u8]>::to_vec).collect();
                want.absolute = true;
                want.stop = false;
            }
            None => want.parts[at] = to.clone(),
        }
        want.parts.extend(rest);
        let len: usize = want.parts.iter().map(|p| p.len() + 1).sum();
        if len > REDIRECTED_PATH_MAX {
            return Err(refuse("makes a path longer than 4096 bytes"));
        }
        Ok(())
    }

    /// The merged directory's entries (without `.` and `..`), each resolved: the top layer's
    /// names in its order, then each lower layer's names not seen above. Unchecked, so one
    /// misplaced directory does not hide its siblings: whoever hands an entry's directory
    /// to the kernel checks it first ([`Stack::check_resolved`]).
    pub fn list(&self, chain: &[Dir]) -> Result<Vec<(Vec<u8>, Resolved)>> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (i, d) in chain.iter().enumerate() {
            let img = self.image(d.obj.layer);
            let dir = img.inode(d.obj.nid)?;
            for e in img.readdir(&dir, 0)? {
                let e = e?;
                if e.name == b"." || e.name == b".." || !seen.insert(e.name.clone()) {
                    continue;
                }
                // First met in this layer: layers above do not have it.
                if let Some(r) = self.resolve(&chain[i..], &e.name, false)? {
                    out.push((e.name, r));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod misplaced_tests {
    use super::Misplaced;

    #[test]
    fn a_misplaced_directory_says_where_it_is_and_what_its_dotdot_names() {
        let m = |layer, dotdot| {
            Misplaced {
                layer,
                nid: 40,
                offset: 1280,
                parent: 36,
                name: b"d".to_vec(),
                dotdot,
            }
            .to_string()
        };
        assert_eq!(
            m(Some(1), Some(7)),
            "layer 1: directory inode 40 (byte 1280) is \"d\" in directory inode 36, but its \
             \"..\" names inode 7 (a directory cycle or a directory under two parents): refused"
        );
        assert_eq!(
            m(None, None),
            "directory inode 40 (byte 1280) is \"d\" in directory inode 36, but it is the root \
             or has no \"..\" (a directory cycle or a directory under two parents): refused"
        );
    }
}
