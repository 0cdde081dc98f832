//! The kernel's own filesystems, mounted: erofs over an image file (a file-backed mount,
//! Linux 6.12+) and a read-only overlayfs over several lower directories.

use anyhow::{bail, Context};
use rustix::mount::{MountFlags, UnmountFlags};
use std::path::Path;

/// Whether the kernel can mount erofs over a regular file: erofs is known (built in or
/// loadable) and the kernel is 6.12 or later, which added file-backed mounts. `Err`
/// says why not.
pub fn file_backed_erofs() -> Result<(), String> {
    let (major, minor) = kernel_version()?;
    if (major, minor) < (6, 12) {
        return Err(format!(
            "Linux {major}.{minor} has no file-backed erofs mounts (6.12+)"
        ));
    }
    if filesystem_known("erofs") {
        return Ok(());
    }
    // mount(2) would load the module itself; asking first lets "no erofs" be said.
    let _ = std::process::Command::new("modprobe")
        .args(["-q", "erofs"])
        .stdin(std::process::Stdio::null())
        .status();
    if filesystem_known("erofs") {
        Ok(())
    } else {
        Err("the kernel has no erofs (modprobe erofs failed)".into())
    }
}

/// The running kernel's major and minor version.
fn kernel_version() -> Result<(u32, u32), String> {
    let uname = rustix::system::uname();
    let release = uname.release().to_string_lossy().into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse::<u32>().ok());
    match (next(), next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(format!("kernel release {release:?}: no version")),
    }
}

/// Whether `/proc/filesystems` lists `name`.
fn filesystem_known(name: &str) -> bool {
    std::fs::read_to_string("/proc/filesystems")
        .is_ok_and(|t| t.lines().any(|l| l.split_whitespace().last() == Some(name)))
}

/// Mounts the erofs image in the regular file `file` on `target`, read-only, with
/// `flags` besides.
pub fn mount_erofs(file: &Path, target: &Path, flags: MountFlags) -> anyhow::Result<()> {
    rustix::mount::mount(file, target, "erofs", flags | MountFlags::RDONLY, "").map_err(|e| match e
    {
        rustix::io::Errno::NOTBLK => anyhow::anyhow!(
            "{}: the kernel refuses a file-backed erofs mount over this file (ENOTBLK)",
            file.display()
        ),
        e => anyhow::anyhow!(
            "mounting erofs from {} on {}: {e}",
            file.display(),
            target.display()
        ),
    })
}

/// Mounts overlayfs on `target` with `flags`: `lowers` (top first) under `upper` (an
/// upper and a work directory, `redirect_dir=on` as verilay's FUSE engine writes
/// renamed directories), or read-only over two or more lowers when there is none.
pub fn mount_overlay(
    lowers: &[&Path],
    upper: Option<(&Path, &Path)>,
    target: &Path,
    flags: MountFlags,
) -> anyhow::Result<()> {
    if lowers.is_empty() || (upper.is_none() && lowers.len() < 2) {
        bail!("a read-only overlay needs at least two lower directories");
    }
    let mut data = String::from("lowerdir=");
    for (i, l) in lowers.iter().enumerate() {
        if i > 0 {
            data.push(':');
        }
        data.push_str(&escape(l)?);
    }
    let flags = match upper {
        Some((u, w)) => {
            data += &format!(
                ",upperdir={},workdir={},redirect_dir=on",
                escape(u)?,
                escape(w)?
            );
            flags
        }
        None => flags | MountFlags::RDONLY,
    };
    rustix::mount::mount("overlay", target, "overlay", flags, data.as_str())
        .with_context(|| format!("mounting overlayfs on {}", target.display()))
}

/// `path` as overlayfs's option string takes it: `\`, `,` and `:` escaped with a
/// backslash (overlayfs unescapes each layer's path); a path that is not UTF-8 is
/// refused.
fn escape(path: &Path) -> anyhow::Result<String> {
    let s = path.to_str().with_context(|| {
        format!(
            "{}: not UTF-8, which overlayfs options cannot hold",
            path.display()
        )
    })?;
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | ':') {
            out.push('\\');
        }
        out.push(c);
    }
    Ok(out)
}

/// Detaches the mount on `target` at once; the kernel frees it when its last user goes.
pub fn detach(target: &Path) -> anyhow::Result<()> {
    rustix::mount::unmount(target, UnmountFlags::DETACH)
        .with_context(|| format!("detaching {}", target.display()))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn the_running_kernel_has_a_version() {
        let (major, _) = super::kernel_version().unwrap();
        assert!(major >= 3);
    }

    #[test]
    fn overlay_paths_are_escaped_and_one_lower_needs_an_upper() {
        let escaped = super::escape(Path::new(r"/a:b,c\d")).unwrap();
        assert_eq!(escaped, r"/a\:b\,c\\d");
        let t = tempfile::tempdir().unwrap();
        let flags = rustix::mount::MountFlags::empty();
        let e = super::mount_overlay(&[t.path()], None, t.path(), flags).unwrap_err();
        assert!(e.to_string().contains("at least two"), "{e}");
    }
}
