//! A task's credentials and pending signals as `/proc/PID/status` shows them (proc(5)),
//! read in this one place.
//!
//! What holds: one read into a stack buffer (measured opens ask on their path), only the
//! fields verilay uses parsed; a field missing or unreadable keeps its default (ids
//! `u32::MAX`, no groups, no capabilities, nothing pending), and a task that is gone is
//! an error of kind `NotFound`.

/// What verilay reads of a task's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// Real, effective, saved and filesystem uids (`Uid:`).
    pub uid: [u32; 4],
    /// The same for gids (`Gid:`).
    pub gid: [u32; 4],
    /// Supplementary groups (`Groups:`).
    pub groups: Vec<u32>,
    /// Effective capabilities (`CapEff:`), a bit per capability number.
    pub cap_eff: u64,
    /// Signals pending for the thread and for its process (`SigPnd:`, `ShdPnd:`).
    pub pending: [u64; 2],
}

impl Default for Status {
    fn default() -> Status {
        Status {
            uid: [u32::MAX; 4],
            gid: [u32::MAX; 4],
            groups: Vec::new(),
            cap_eff: 0,
            pending: [0; 2],
        }
    }
}

impl Status {
    /// Whether SIGKILL is pending for the task (it is being killed).
    pub fn being_killed(&self) -> bool {
        const SIGKILL_BIT: u64 = 1 << (9 - 1);
        self.pending.iter().any(|p| p & SIGKILL_BIT != 0)
    }
}

/// The status of task `pid` (a process or a thread).
pub fn of(pid: u32) -> std::io::Result<Status> {
    let mut buf = [0u8; 8192];
    let f = rustix::fs::open(
        format!("/proc/{pid}/status").as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let n = rustix::io::read(&f, &mut buf)?;
    Ok(parse(&buf[..n]))
}

/// The fields of a status text.
pub fn parse(text: &[u8]) -> Status {
    let mut s = Status::default();
    let text = String::from_utf8_lossy(text);
    for line in text.lines() {
        let (key, rest) = line.split_once(':').unwrap_or((line, ""));
        let numbers = || {
            rest.split_whitespace()
                .filter_map(|v| v.parse::<u32>().ok())
        };
        let hex = || u64::from_str_radix(rest.trim(), 16).unwrap_or(0);
        match key {
            "Uid" => fill(&mut s.uid, numbers()),
            "Gid" => fill(&mut s.gid, numbers()),
            "Groups" => s.groups = numbers().collect(),
            "CapEff" => s.cap_eff = hex(),
            "SigPnd" => s.pending[0] = hex(),
            "ShdPnd" => s.pending[1] = hex(),
            _ => {}
        }
    }
    s
}

fn fill(ids: &mut [u32; 4], values: impl Iterator<Item = u32>) {
    for (id, v) in ids.iter_mut().zip(values) {
        *id = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse_and_others_keep_their_defaults() {
        let s = parse(
            b"Name:\tcat\nUid:\t1000\t0\t1000\t0\nGid:\t100\t100\t100\t100\n\
              Groups:\t4 24 1000 \nSigPnd:\t0000000000000100\nShdPnd:\t0\n\
              CapEff:\t00000000000000c0\n",
        );
        assert_eq!((s.uid, s.gid[0]), ([1000, 0, 1000, 0], 100));
        assert_eq!(s.groups, [4, 24, 1000]);
        assert_eq!(s.cap_eff, 0xc0);
        assert!(s.being_killed());
        assert_eq!(parse(b"garbage"), Status::default());
    }

    #[test]
    fn this_process_and_a_gone_one() {
        let me = of(std::process::id()).unwrap();
        assert_eq!(me.uid[0], rustix::process::getuid().as_raw());
        let gone = of(u32::MAX).unwrap_err();
        assert_eq!(gone.kind(), std::io::ErrorKind::NotFound);
    }
}
