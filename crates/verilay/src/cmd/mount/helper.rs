//! `mount -t fuse.verilay IMAGE DIR -o OPTS` (and fstab) runs `/sbin/mount.fuse.verilay
//! IMAGE DIR [-sfnv] [-o OPTS] [-t fuse.verilay] [-N NS]` (a link to this binary), as
//! libmount's `exec_helper` does: the image and the directory always first. The options
//! are `verilay mount -o`'s; `-f` (fake) checks everything and mounts nothing, `-v`
//! says what was mounted.

use anyhow::{bail, Context};
use std::ffi::OsString;

pub fn mount_helper(args: &[String]) -> anyhow::Result<i32> {
    let usage =
        "usage: mount.fuse.verilay IMAGE MOUNTPOINT [-fnsv] [-o digest=sha256:…,threads=N,log=FILE,…]";
    // libmount passes the source and the target first, whatever they look like: an image
    // named `-oallow_other` is an image.
    let [image, mountpoint, rest @ ..] = args else {
        bail!("{usage}");
    };
    let mut options: Vec<OsString> = Vec::new();
    let (mut fake, mut verbose) = (false, false);
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => options.push(it.next().context("-o needs options")?.into()),
            // mount(8)'s own flags: fake (check, mount nothing), verbose; no mtab is
            // written anyway (-n); sloppy (-s) does not make an option verilay would
            // refuse acceptable: it is still refused by name.
            "-f" => fake = true,
            "-v" => verbose = true,
            "-n" | "-s" => {}
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
            s => bail!("mount.fuse.verilay: {s:?}: one image and one mountpoint only ({usage})"),
        }
    }
    let a = super::Args {
        paths: vec![image.into(), mountpoint.into()],
        options,
        quiet: !verbose,
        from_mount8: true,
        fake,
        timeout: std::time::Duration::from_secs(60),
        ..super::Args::default()
    };
    super::run(a)
}
