//! The filesystem identity each layer reports to the policy (fsmagic, fsname, fsuuid).

use measure::log::HashAlgo;
use measure::policy::FsIdentity;
use std::io;

/// The EROFS superblock magic, which image layers report as their fsmagic.
pub const EROFS_MAGIC: u64 = 0xE0F5_E1E2;

/// The identity an image layer reports: the EROFS magic, `erofs`, and the image's uuid
/// (or, for an image built without one, the first 16 bytes of its `digest`, so it is
/// never zero).
pub fn image_identity(uuid: [u8; 16], digest: &[u8]) -> FsIdentity {
    let mut id = uuid;
    if uuid == [0; 16] {
        let n = digest.len().min(16);
        id[..n].copy_from_slice(&digest[..n]);
    }
    FsIdentity {
        magic: EROFS_MAGIC,
        name: "erofs".into(),
        uuid: id,
    }
}

/// The identity of the host filesystem holding `dir`: its magic (statfs), its type's name
/// as the kernel knows it (`fuse.sshfs` is `fuse`), and its uuid (FS_IOC_GETFSUUID); a
/// filesystem without a uuid gets one derived from its magic and device number, so it is
/// never zero (and stable while the device is).
pub fn host_identity(dir: rustix::fd::BorrowedFd<'_>) -> io::Result<FsIdentity> {
    let sfs = rustix::fs::fstatfs(dir)?;
    let magic = sfs.f_type as u64;
    let st = rustix::fs::fstat(dir)?;
    let name = fs_type_name(dir).unwrap_or_else(|| format!("0x{magic:x}"));
    let uuid = match fs_uuid(dir) {
        Some(u) if u != [0; 16] => u,
        _ => {
            let mut h = HashAlgo::Sha256.hasher();
            h.update(b"verilay host filesystem\0");
            h.update(&magic.to_le_bytes());
            h.update(&st.st_dev.to_le_bytes());
            let d = h.finish();
            let mut u = [0u8; 16];
            u.copy_from_slice(&d[..16]);
            u
        }
    };
    Ok(FsIdentity { magic, name, uuid })
}

/// The filesystem type of the mount holding `dir`, from /proc/self/mountinfo.
fn fs_type_name(dir: rustix::fd::BorrowedFd<'_>) -> Option<String> {
    let sx = rustix::fs::statx(
        dir,
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::MNT_ID,
    )
    .ok()?;
    let table = host::mountinfo::table(None).ok()?;
    let mount = table.iter().find(|m| m.id == sx.stx_mnt_id)?;
    // A FUSE filesystem's subtype is not part of the kernel's name for it.
    Some(mount.fs_name().to_string())
}

/// The filesystem's uuid as the kernel holds it (`FS_IOC_GETFSUUID`, Linux 6.5+).
#[allow(unsafe_code)] // ioctl(FS_IOC_GETFSUUID), a syscall
fn fs_uuid(dir: rustix::fd::BorrowedFd<'_>) -> Option<[u8; 16]> {
    use rustix::fd::AsRawFd;
    // struct fsuuid2 { __u8 len; __u8 uuid[16]; }; _IOR(0x15, 0, struct fsuuid2)
    const FS_IOC_GETFSUUID: libc::c_ulong = 0x8011_1500;
    let mut buf = [0u8; 17];
    // SAFETY: the ioctl writes at most size_of::<fsuuid2>() = 17 bytes into `buf`, which
    // is that large, and `dir` is a valid descriptor for the duration of the call.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), FS_IOC_GETFSUUID, buf.as_mut_ptr()) };
    if r != 0 || buf[0] as usize > 16 {
        return None;
    }
    let mut u = [0u8; 16];
    u[..buf[0] as usize].copy_from_slice(&buf[1..1 + buf[0] as usize]);
    Some(u)
}
