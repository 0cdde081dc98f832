//! Mount options (`-o`), as `verilay mount`, mount(8) and fstab give them, parsed into
//! [`MountOptions`]; only that value builds the mount.
//!
//! - Every option is honoured or refused by name; mount(8)'s own (`FOR_MOUNT8`) do nothing.
//! - [`MountOptions::render`] gives a string that parses to the same value.
//! - A comma splits options except inside a double-quoted value; the last of `ro,rw` wins.

#![forbid(unsafe_code)]

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

/// Worker threads a mount may have at most: each is a thread, a cloned /dev/fuse
/// descriptor or an io_uring ring, and 2 MiB of request buffers, and past a few per CPU
/// they only cost (a request holds a worker only while the daemon works on it).
pub const MAX_THREADS: usize = 1024;

/// When the kernel updates access times (one of these, or its default, `relatime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Atime {
    /// `noatime`.
    Never,
    /// `relatime` (also what `atime`, `norelatime` and `nostrictatime` leave).
    Relative,
    /// `strictatime`.
    Strict,
}

/// How FUSE requests reach the daemon (`transport=`): the session's own type.
pub use fusewire::Transport;

/// What serves a mount (`engine=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// `kernel` when the caller is root and the kernel and the mount allow it, else `fuse`.
    Auto,
    /// The kernel's erofs (and overlayfs for stacks) over image files verilay serves and
    /// verifies through a private FUSE mount; root only.
    Kernel,
    /// verilay's own filesystem over FUSE (rootless too).
    Fuse,
}

impl Engine {
    /// Each engine with its name in `engine=`.
    pub const NAMES: [(&'static str, Engine); 3] = [
        ("auto", Engine::Auto),
        ("kernel", Engine::Kernel),
        ("fuse", Engine::Fuse),
    ];

    /// The engine called `name`.
    pub fn parse(name: &str) -> Result<Engine, String> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, e)| *e)
            .ok_or_else(|| format!("{name:?}: not one of auto, kernel, fuse"))
    }

    /// Its name in `engine=`.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, e)| *e == self)
            .map_or("auto", |(n, _)| n)
    }
}

/// A parsed option string. `None` means "not said": the mount gets its default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountOptions {
    /// `ro` (true) or `rw` (false).
    pub read_only: Option<bool>,
    /// `nosuid` (true) or `suid` (false).
    pub nosuid: Option<bool>,
    /// `nodev` (true) or `dev` (false).
    pub nodev: Option<bool>,
    /// `noexec` (true) or `exec` (false).
    pub noexec: Option<bool>,
    /// `sync` (true) or `async` (false).
    pub sync: Option<bool>,
    /// `dirsync`.
    pub dirsync: Option<bool>,
    /// The last of the atime family given.
    pub atime: Option<Atime>,
    /// `nodiratime` (true) or `diratime` (false).
    pub nodiratime: Option<bool>,
    /// `lazytime` (true) or `nolazytime` (false).
    pub lazytime: Option<bool>,
    /// `nosymfollow` (true) or `symfollow` (false).
    pub nosymfollow: Option<bool>,
    /// Other users may use the mount (FUSE allows only the mounting user otherwise).
    pub allow_other: bool,
    /// Root may use the mount too (FUSE's `allow_root`).
    pub allow_root: bool,
    /// `insecure`: remote images over plain HTTP, from a registry on this machine only.
    pub insecure: bool,
    /// `cache=DIR`: where remote images' verified bytes are kept.
    pub cache: Option<PathBuf>,
    /// `nocache`: remote images are kept in memory only.
    pub nocache: bool,
    /// `cache_size=SIZE`: the cache directory's limit, in bytes.
    pub cache_size: Option<u64>,
    /// `prefetch`: fetch the rest of each remote image in the background.
    pub prefetch: bool,
    /// `digest=`: the one image's pinned digest.
    pub digest: Option<String>,
    /// `threads=N`: the mount's worker threads (see [`check_threads`]).
    pub threads: Option<usize>,
    /// `engine=`: what serves the mount.
    pub engine: Option<Engine>,
    /// `transport=`: how FUSE requests reach the daemon.
    pub transport: Option<Transport>,
    /// `poll_us=N`: how long, in µs, a serving thread looks for the next request before
    /// it sleeps (unset: 50 over io_uring, 0 over /dev/fuse).
    pub poll_us: Option<u64>,
    /// `log=FILE`: where the daemon appends its log lines.
    pub log: Option<PathBuf>,
    /// `upper=DIR`: the writable upper directory over the images.
    pub upper: Option<PathBuf>,
    /// `work=DIR`: the upper directory's work directory.
    pub work: Option<PathBuf>,
    /// `policy=FILE`: the measurement policy, in IMA's syntax.
    pub policy: Option<PathBuf>,
    /// `measure_log=DIR`: the directory the measurement list and PCR values are written to.
    pub measure_log: Option<PathBuf>,
    /// `measure_hash=`: the hash of measured file contents (`sha256`, `sha512`, `sha1`).
    pub measure_hash: Option<String>,
    /// `signature_policy=FILE`: the containers-policy.json(5) `oci://` images' manifests
    /// must satisfy (not `policy=`, the measurement policy).
    pub signature_policy: Option<PathBuf>,
    /// `registries_d=DIR`: the containers-registries.d(5) directory saying where
    /// signatures are.
    pub registries_d: Option<PathBuf>,
}

/// Why an option string was refused; names the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("mount option {option:?}: {why}")]
pub struct OptionError {
    /// The option as given.
    pub option: String,
    /// Why it was refused.
    pub why: String,
}

fn refuse(option: &[u8], why: impl Into<String>) -> OptionError {
    OptionError {
        option: String::from_utf8_lossy(option).into_owned(),
        why: why.into(),
    }
}

/// The generic flag options: name, the field they set, the value.
type FlagField = fn(&mut MountOptions) -> &mut Option<bool>;
const FLAGS: &[(&str, FlagField, bool)] = &[
    ("ro", |o| &mut o.read_only, true),
    ("rw", |o| &mut o.read_only, false),
    ("nosuid", |o| &mut o.nosuid, true),
    ("suid", |o| &mut o.nosuid, false),
    ("nodev", |o| &mut o.nodev, true),
    ("dev", |o| &mut o.nodev, false),
    ("noexec", |o| &mut o.noexec, true),
    ("exec", |o| &mut o.noexec, false),
    ("sync", |o| &mut o.sync, true),
    ("async", |o| &mut o.sync, false),
    ("dirsync", |o| &mut o.dirsync, true),
    ("nodiratime", |o| &mut o.nodiratime, true),
    ("diratime", |o| &mut o.nodiratime, false),
    ("lazytime", |o| &mut o.lazytime, true),
    ("nolazytime", |o| &mut o.lazytime, false),
    ("nosymfollow", |o| &mut o.nosymfollow, true),
    ("symfollow", |o| &mut o.nosymfollow, false),
];

/// Options for mount(8) itself, or for the record: accepted, nothing to do (so are
/// `user=NAME`, `comment=…`, `x-…` and `X-…`).
const FOR_MOUNT8: &[&str] = &[
    "defaults", "nofail", "auto", "noauto", "user", "nouser", "users", "nousers", "owner",
    "noowner", "group", "nogroup", "_netdev", "nonempty",
];

/// Options a reader might expect to work that verilay refuses, and why.
const REFUSED: &[(&str, &str)] = &[
    (
        "remount",
        "a verilay mount cannot be remounted: unmount and mount again",
    ),
    (
        "bind",
        "bind mounts are made with mount --bind, not by verilay",
    ),
    (
        "rbind",
        "bind mounts are made with mount --bind, not by verilay",
    ),
    ("mand", "mandatory locks are gone from Linux"),
    ("iversion", "FUSE mounts keep no i_version"),
    (
        "auto_unmount",
        "not supported: the daemon unmounts when signalled",
    ),
    (
        "blkdev",
        "verilay mounts images, not block devices (fuseblk)",
    ),
];

impl MountOptions {
    /// Parses one option string (`-o` value). Empty options (`ro,,nosuid`) are skipped.
    pub fn parse(text: &[u8]) -> Result<MountOptions, OptionError> {
        let mut o = MountOptions::default();
        o.apply(text)?;
        Ok(o)
    }

    /// Applies another option string on top of these (later options win).
    pub fn apply(&mut self, text: &[u8]) -> Result<(), OptionError> {
        for opt in split(text)? {
            self.apply_one(opt)?;
        }
        Ok(())
    }

    fn apply_one(&mut self, opt: &[u8]) -> Result<(), OptionError> {
        let (key, value) = match opt.iter().position(|&b| b == b'=') {
            Some(i) => (&opt[..i], Some(&opt[i + 1..])),
            None => (opt, None),
        };
        let Ok(key) = std::str::from_utf8(key) else {
            return Err(refuse(opt, "unknown option"));
        };
        let Some(value) = value else {
            return self.apply_word(opt, key);
        };
        if key.starts_with("x-") || key.starts_with("X-") || key == "comment" || key == "user" {
            return Ok(());
        }
        let value = unquote(opt, value)?;
        if value.is_empty() {
            return Err(refuse(opt, "needs a value"));
        }
        let path = || PathBuf::from(OsStr::from_bytes(value));
        match key {
            "digest" => self.digest = Some(text_value(opt, value)?.to_string()),
            "threads" => self.threads = Some(parse_threads(opt, value)?),
            "poll_us" => {
                let n = text_value(opt, value)?
                    .parse()
                    .map_err(|_| refuse(opt, "not a number of microseconds"))?;
                self.poll_us = Some(check_poll_us(n).map_err(|why| refuse(opt, why))?)
            }
            "engine" => {
                let e = Engine::parse(text_value(opt, value)?).map_err(|why| refuse(opt, why))?;
                self.engine = Some(e)
            }
            "transport" => {
                let t =
                    Transport::parse(text_value(opt, value)?).map_err(|why| refuse(opt, why))?;
                self.transport = Some(t)
            }
            "log" => self.log = Some(path()),
            "cache" => self.cache = Some(path()),
            "cache_size" => {
                self.cache_size =
                    Some(parse_size(text_value(opt, value)?).map_err(|why| refuse(opt, why))?)
            }
            "upper" => self.upper = Some(path()),
            "work" => self.work = Some(path()),
            "policy" => self.policy = Some(path()),
            "measure_log" => self.measure_log = Some(path()),
            "signature_policy" => self.signature_policy = Some(path()),
            "registries_d" => self.registries_d = Some(path()),
            "measure_hash" => {
                let name = text_value(opt, value)?;
                if measure::log::HashAlgo::from_name(name).is_none() {
                    return Err(refuse(opt, "not one of sha256, sha512, sha1"));
                }
                self.measure_hash = Some(name.to_string());
            }
            "fd" | "rootmode" | "user_id" | "group_id" | "max_read" | "blksize" | "fsname"
            | "subtype" => return Err(refuse(opt, "set by verilay itself")),
            _ => return Err(refuse(opt, "unknown option")),
        }
        Ok(())
    }

    fn apply_word(&mut self, opt: &[u8], word: &str) -> Result<(), OptionError> {
        if let Some((_, field, value)) = FLAGS.iter().find(|(name, ..)| *name == word) {
            *field(self) = Some(*value);
            return Ok(());
        }
        match word {
            "noatime" => self.atime = Some(Atime::Never),
            "strictatime" => self.atime = Some(Atime::Strict),
            "atime" | "relatime" | "norelatime" | "nostrictatime" => {
                self.atime = Some(Atime::Relative)
            }
            "allow_other" => self.allow_other = true,
            "allow_root" => self.allow_root = true,
            "insecure" => self.insecure = true,
            "nocache" => self.nocache = true,
            "prefetch" => self.prefetch = true,
            "default_permissions" => {}
            w if FOR_MOUNT8.contains(&w) || w.starts_with("x-") || w.starts_with("X-") => {}
            w => {
                let why = REFUSED
                    .iter()
                    .find(|(name, _)| *name == w)
                    .map_or("unknown option", |(_, why)| why);
                return Err(refuse(opt, why));
            }
        }
        Ok(())
    }

    /// The options as one string that [`MountOptions::parse`] reads back as `self`.
    pub fn render(&self) -> OsString {
        let mut out: Vec<Vec<u8>> = Vec::new();
        for (name, field, value) in FLAGS {
            let mut copy = self.clone();
            if *field(&mut copy) == Some(*value) {
                out.push(name.as_bytes().to_vec());
            }
        }
        match self.atime {
            Some(Atime::Never) => out.push(b"noatime".to_vec()),
            Some(Atime::Relative) => out.push(b"relatime".to_vec()),
            Some(Atime::Strict) => out.push(b"strictatime".to_vec()),
            None => {}
        }
        if self.allow_other {
            out.push(b"allow_other".to_vec());
        }
        if self.allow_root {
            out.push(b"allow_root".to_vec());
        }
        for (on, word) in [
            (self.insecure, "insecure"),
            (self.nocache, "nocache"),
            (self.prefetch, "prefetch"),
        ] {
            if on {
                out.push(word.as_bytes().to_vec());
            }
        }
        let mut value = |key: &str, v: &[u8]| {
            let mut o = format!("{key}=").into_bytes();
            // A value is quoted when it holds a comma (parsing refuses quotes inside one).
            if v.contains(&b',') {
                o.push(b'"');
                o.extend_from_slice(v);
                o.push(b'"');
            } else {
                o.extend_from_slice(v);
            }
            out.push(o);
        };
        if let Some(d) = &self.digest {
            value("digest", d.as_bytes());
        }
        if let Some(t) = self.threads {
            value("threads", t.to_string().as_bytes());
        }
        if let Some(e) = self.engine {
            value("engine", e.name().as_bytes());
        }
        if let Some(t) = self.transport {
            value("transport", t.name().as_bytes());
        }
        if let Some(n) = self.poll_us {
            value("poll_us", n.to_string().as_bytes());
        }
        if let Some(n) = self.cache_size {
            value("cache_size", n.to_string().as_bytes());
        }
        for (key, p) in [
            ("log", &self.log),
            ("cache", &self.cache),
            ("upper", &self.upper),
            ("work", &self.work),
            ("policy", &self.policy),
            ("measure_log", &self.measure_log),
            ("signature_policy", &self.signature_policy),
            ("registries_d", &self.registries_d),
        ] {
            if let Some(p) = p {
                value(key, p.as_os_str().as_bytes());
            }
        }
        if let Some(h) = &self.measure_hash {
            value("measure_hash", h.as_bytes());
        }
        OsString::from_vec(out.join(&b','))
    }
}

/// Splits at commas outside double quotes; refuses an unclosed quote.
fn split(text: &[u8]) -> Result<Vec<&[u8]>, OptionError> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut quoted = false;
    for (i, &b) in text.iter().enumerate() {
        match b {
            b'"' => quoted = !quoted,
            b',' if !quoted => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if quoted {
        return Err(refuse(&text[start..], "unclosed double quote"));
    }
    parts.push(&text[start..]);
    Ok(parts.into_iter().filter(|p| !p.is_empty()).collect())
}

/// A value without its surrounding quotes; a quote anywhere else is refused.
fn unquote<'a>(opt: &[u8], value: &'a [u8]) -> Result<&'a [u8], OptionError> {
    let inner = match value {
        [b'"', inner @ .., b'"'] => inner,
        v => v,
    };
    if inner.contains(&b'"') {
        return Err(refuse(
            opt,
            "a double quote may only enclose the whole value",
        ));
    }
    Ok(inner)
}

fn text_value<'a>(opt: &[u8], value: &'a [u8]) -> Result<&'a str, OptionError> {
    std::str::from_utf8(value).map_err(|_| refuse(opt, "not UTF-8 text"))
}

fn parse_threads(opt: &[u8], value: &[u8]) -> Result<usize, OptionError> {
    let n: usize = text_value(opt, value)?
        .parse()
        .map_err(|_| refuse(opt, "not a number"))?;
    check_threads(n).map_err(|why| refuse(opt, why))
}

/// A size in bytes: a number, optionally with K, M, G or T (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        Some(b'T' | b't') => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{s:?} is not a size (bytes, or a number with K, M, G or T)"))
}

/// The longest a serving thread may look for the next request before sleeping, in µs.
pub const MAX_POLL_US: u64 = 10_000;

/// Whether `n` µs is a time a serving thread may look for the next request (0: never).
pub fn check_poll_us(n: u64) -> Result<u64, String> {
    match n {
        n if n > MAX_POLL_US => Err(format!(
            "{n} µs: at most {MAX_POLL_US} (a thread looking for requests keeps its CPU \
             busy, yielding it to anyone who wants it)"
        )),
        n => Ok(n),
    }
}

/// Whether `n` worker threads is a number a mount can have (see [`MAX_THREADS`]).
pub fn check_threads(n: usize) -> Result<usize, String> {
    match n {
        0 => Err("at least 1 worker thread is needed".into()),
        n if n > MAX_THREADS => Err(format!(
            "{n} worker threads: at most {MAX_THREADS} (each is a thread, a /dev/fuse \
             descriptor or an io_uring ring, and 2 MiB of request buffers)"
        )),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<MountOptions, OptionError> {
        MountOptions::parse(s.as_bytes())
    }

    #[test]
    fn generic_flags_are_parsed_and_the_last_one_wins() {
        let o = parse("ro,nosuid,nodev,noexec,rw,exec,noatime,strictatime,dirsync").unwrap();
        assert_eq!(o.read_only, Some(false));
        assert_eq!(o.nosuid, Some(true));
        assert_eq!(o.nodev, Some(true));
        assert_eq!(o.noexec, Some(false));
        assert_eq!(o.atime, Some(Atime::Strict));
        assert_eq!(o.dirsync, Some(true));
        assert_eq!(o.sync, None);
    }

    #[test]
    fn what_mount8_adds_is_accepted_and_changes_nothing() {
        let o = parse("defaults,nofail,_netdev,user=alice,users,x-systemd.automount,comment=x,auto,noauto,nonempty").unwrap();
        assert_eq!(o, MountOptions::default());
    }

    #[test]
    fn unknown_and_reserved_options_are_refused_by_name() {
        for bad in [
            "nosuidx",
            "fd=3",
            "rootmode=40000",
            "user_id=0",
            "max_read=1",
            "remount",
            "threads=0",
            "threads=1025",
            "threads=-1",
            "poll_us=10001",
            "poll_us=-1",
            "poll_us=5ms",
            "log=",
            "log=a\"b",
            "log=\"a",
            "measure_hash=md5",
            "transport=fast",
            "engine=fast",
            "transport=",
        ] {
            let e = parse(&format!("ro,{bad}")).unwrap_err();
            assert!(
                e.to_string().contains(bad.split('=').next().unwrap()),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn values_with_commas_are_quoted_and_round_trip() {
        let o = parse(
            "log=\"/a,b\",threads=3,digest=sha256:00,upper=/u,work=/w,transport=uring,poll_us=0,engine=kernel",
        )
        .unwrap();
        assert_eq!(o.log, Some(PathBuf::from("/a,b")));
        assert_eq!(o.transport, Some(Transport::Uring));
        assert_eq!(o.engine, Some(Engine::Kernel));
        assert_eq!(o.poll_us, Some(0));
        let again = MountOptions::parse(o.render().as_bytes()).unwrap();
        assert_eq!(again, o);
    }

    #[test]
    fn cache_options_round_trip_and_sizes_are_checked() {
        let o = parse(
            "cache=/c,cache_size=2G,prefetch,insecure,signature_policy=/p.json,registries_d=\"/r,d\"",
        )
        .unwrap();
        assert_eq!(o.signature_policy, Some(PathBuf::from("/p.json")));
        assert_eq!(o.registries_d, Some(PathBuf::from("/r,d")));
        assert_eq!(o.cache_size, Some(2 << 30));
        assert!(o.prefetch && !o.nocache);
        assert_eq!(MountOptions::parse(o.render().as_bytes()).unwrap(), o);
        assert!(parse("nocache").unwrap().nocache);
        for bad in [
            "cache_size=",
            "cache_size=1X",
            "cache_size=99999999999T",
            "cache_size=-1",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
