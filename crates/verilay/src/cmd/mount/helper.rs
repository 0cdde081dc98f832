//! `mount -t fuse.verilay IMAGE DIR -o OPTS` (and fstab) runs `/sbin/mount.fuse.verilay
//! IMAGE DIR [-sfnv] [-o OPTS] [-t fuse.verilay] [-N NS]` (a link to this binary), as
//! libmount's `exec_helper` does. The options are `verilay mount -o`'s.

use anyhow::{bail, Context};
use std::ffi::OsString;

pub fn mount_helper(args: &[String]) -> anyhow::Result<i32> {
    let mut pos = Vec::new();
    let mut options: Vec<OsString> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => options.push(it.next().context("-o needs options")?.into()),
            // mount(8)'s own flags: fake, no mtab, sloppy, verbose.
            "-f" | "-n" | "-s" | "-v" => {}
            "-t" => {
                let t = it.next().context("-t needs a type")?;
                if t != "fuse.verilay" {
                    bail!("mount.fuse.verilay: type {t:?}: this helper mounts fuse.verilay only");
                }
            }
            "-N" => {
                bail!("mount.fuse.verilay: -N (mounting in another namespace) is not supported")
            }
            s if s.starts_with("-o") => options.push(s[2..].into()),
            s if s.starts_with('-') => bail!("mount.fuse.verilay: unknown flag {s}"),
            s => pos.push(s.to_string()),
        }
    }
    let [image, mountpoint] = pos.as_slice() else {
        bail!(
            "usage: mount.fuse.verilay IMAGE MOUNTPOINT [-o digest=sha256:…,threads=N,log=FILE,…]"
        );
    };
    let a = super::Args {
        paths: vec![image.into(), mountpoint.into()],
        options,
        quiet: true,
        from_mount8: true,
        timeout: std::time::Duration::from_secs(60),
        ..super::Args::default()
    };
    super::run(a)
}
