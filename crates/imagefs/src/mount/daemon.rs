//! How a mount's daemon reports its setup to the process that started it, over a pipe:
//! each step before it starts (`step …`), then `ok TRANSPORT` once the mount answers (and
//! how requests reach it) or `error …`.
//! The starter follows the steps, at most a timeout each; a daemon that dies or stalls is
//! killed and whatever it mounted is detached.

use super::{deadline_after, kernel};
use anyhow::{bail, Context};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the daemon reports its setup.
pub enum Report {
    /// The pipe the starter follows (its write end's descriptor number).
    Pipe(i32),
    /// In the foreground: errors go to stderr as the command's own.
    Stderr,
}

/// One line on the pipe.
pub enum Message {
    Step(String),
    /// A step that may take up to this long (a remote image's open: request after
    /// request, each bounded by its own time limit), where a plain step has `--timeout`.
    StepWithin(Duration, String),
    /// How far image `.0` (in the command's order) is trusted, as the starter says it.
    Trust(usize, String),
    /// Something the starter warns its user of.
    Warn(String),
    /// The mount answers, served over this transport.
    Ok(String),
    Error(String),
}

impl Message {
    pub fn parse(line: &str) -> Message {
        match line {
            "ok" => Message::Ok(String::new()),
            l => match l.split_once(' ') {
                Some(("ok", t)) => Message::Ok(t.to_string()),
                Some(("step", s)) => Message::Step(s.to_string()),
                Some(("warn", w)) => Message::Warn(w.to_string()),
                Some(("step-within", t)) => {
                    match t.split_once(' ').map(|(ms, s)| (ms.parse(), s)) {
                        Some((Ok(ms), s)) => {
                            Message::StepWithin(Duration::from_millis(ms), s.into())
                        }
                        _ => Message::Error(format!("the mount daemon said {l:?}")),
                    }
                }
                Some(("trust", t)) => match t.split_once(' ').map(|(i, t)| (i.parse(), t)) {
                    Some((Ok(i), t)) => Message::Trust(i, t.to_string()),
                    _ => Message::Error(format!("the mount daemon said {l:?}")),
                },
                Some(("error", e)) => Message::Error(e.to_string()),
                _ => Message::Error(format!("the mount daemon said {l:?}")),
            },
        }
    }
}

/// The daemon's side of the pipe.
pub struct Reporter(Option<std::fs::File>);

impl Reporter {
    /// Takes the pipe of `report`; a daemon reporting on a pipe starts its own session,
    /// so the caller's terminal closing cannot hang it up.
    #[allow(unsafe_code)] // takes the descriptor the parent handed over
    pub fn open(report: Report) -> anyhow::Result<Reporter> {
        let Report::Pipe(fd) = report else {
            return Ok(Reporter(None));
        };
        // SAFETY: the parent passed this descriptor (its pipe's write end) on the command
        // line for us alone; nothing else in this process owns or closes it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // Not for fusermount3 or anything else we start: the pipe's end must mean ours.
        rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC).context("ready pipe")?;
        let _ = rustix::process::setsid();
        Ok(Reporter(Some(std::fs::File::from(fd))))
    }

    /// Whether errors and log lines go to stderr (no pipe: in the foreground).
    pub fn on_stderr(&self) -> bool {
        self.0.is_none()
    }

    /// Tells the starter that setup step `what` begins (nothing in the foreground).
    pub fn step(&mut self, what: &str) {
        if let Some(f) = &mut self.0 {
            let _ = writeln!(f, "step {what}");
        }
    }

    /// As [`step`](Self::step), for a step that may take up to `budget` rather than the
    /// starter's `--timeout`.
    pub fn step_within(&mut self, what: &str, budget: Duration) {
        if let Some(f) = &mut self.0 {
            let _ = writeln!(f, "step-within {} {what}", budget.as_millis());
        }
    }

    /// Image `image` (in the command's order) is open, trusted as `text` says
    /// ("sha256:… (pinned)"): for the starter to announce, which left it to us.
    pub fn trust(&mut self, image: usize, text: &str) {
        if let Some(f) = &mut self.0 {
            let _ = writeln!(f, "trust {image} {text}");
        }
    }

    /// Something the user should be warned of: on the pipe, for the starter to say (a
    /// daemon has no terminal), or on stderr in the foreground.
    pub fn warn(&mut self, text: &str) {
        match &mut self.0 {
            Some(f) => {
                let _ = writeln!(f, "warn {}", text.replace('\n', " "));
            }
            None => eprintln!("verilay: warning: {}", host::text::one_line(text)),
        }
    }

    /// The mount answers, over `transport`: the starter may return.
    pub fn ready(&mut self, transport: &str) {
        if let Some(mut f) = self.0.take() {
            let _ = writeln!(f, "ok {transport}");
        }
    }

    /// The setup failed with `e`: said on the pipe (exit status 1), or returned.
    pub fn failed(self, e: anyhow::Error) -> anyhow::Result<i32> {
        match self.0 {
            Some(mut f) => {
                let _ = writeln!(f, "error {}", format!("{e:#}").replace('\n', " "));
                Ok(1)
            }
            None => Err(e),
        }
    }
}

/// What a daemon said of its mount once it answers.
#[derive(Debug, Default)]
pub struct Ready {
    /// The transport it is served over.
    pub transport: String,
    /// How far each image it opened is trusted, by its index in the command's order.
    pub trust: std::collections::BTreeMap<usize, String>,
}

/// Starts the daemon that `command` makes (given the descriptor number to report on) and
/// follows its setup until the mount on `mountpoint` answers, at most `timeout` per step.
/// On failure no daemon, and no mount of its, stays behind.
pub fn start(
    mountpoint: &Path,
    timeout: Duration,
    command: impl FnOnce(i32) -> Command,
) -> anyhow::Result<Ready> {
    let (read_end, write_end) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).context("pipe")?;
    // The daemon inherits the write end only.
    rustix::io::fcntl_setfd(&write_end, rustix::io::FdFlags::empty()).context("pipe")?;
    let mut cmd = command(write_end.as_raw_fd());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().context("starting the mount daemon")?;
    drop(write_end);
    let result = follow(&mut child, read_end, timeout);
    if result.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        kernel::detach_leftover(mountpoint);
    }
    result
}

/// Follows the daemon's setup on its pipe: each step it starts (`step …`) resets the
/// clock; `ok` means the mount answers; `error …` or the pipe's end means it failed.
fn follow(child: &mut Child, pipe: OwnedFd, timeout: Duration) -> anyhow::Result<Ready> {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut pipe = std::fs::File::from(pipe);
    let mut step = "start".to_string();
    let mut deadline = deadline_after(timeout);
    let mut pending = Vec::new();
    let mut ready = Ready::default();
    loop {
        while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&pending[..nl]).into_owned();
            pending.drain(..=nl);
            match Message::parse(&line) {
                Message::Step(s) => {
                    step = s;
                    deadline = deadline_after(timeout);
                }
                Message::StepWithin(budget, s) => {
                    step = s;
                    deadline = deadline_after(budget);
                }
                Message::Trust(i, t) => {
                    ready.trust.insert(i, t);
                }
                Message::Warn(w) => eprintln!("verilay: warning: {}", host::text::one_line(&w)),
                Message::Ok(transport) => {
                    ready.transport = transport;
                    return Ok(ready);
                }
                Message::Error(e) => bail!("{e}"),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "the mount daemon (process {}) did not {step} within {:.3} s (--timeout): stopped it",
                child.id(),
                timeout.as_secs_f64()
            );
        }
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        let mut fds = [PollFd::new(&pipe, PollFlags::IN)];
        match poll(&mut fds, ms) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => bail!("waiting for the mount daemon: {e}"),
        }
        if fds[0].revents().is_empty() {
            continue;
        }
        let mut buf = [0u8; 4096];
        let n = pipe
            .read(&mut buf)
            .context("reading from the mount daemon")?;
        if n == 0 {
            let status = child.wait().context("waiting for the mount daemon")?;
            bail!("the mount daemon exited ({status}) while trying to {step}");
        }
        pending.extend_from_slice(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::Message;

    #[test]
    fn the_pipe_carries_steps_trust_warnings_and_the_end() {
        let trust = Message::parse("trust 2 sha256:ab (pinned)");
        assert!(matches!(trust, Message::Trust(2, t) if t == "sha256:ab (pinned)"));
        assert!(
            matches!(Message::parse("warn no room: mounting without a cache"),
            Message::Warn(w) if w == "no room: mounting without a cache")
        );
        assert!(matches!(Message::parse("ok io_uring"), Message::Ok(t) if t == "io_uring"));
        assert!(
            matches!(Message::parse("step-within 1500 open oci://r/a:1"),
            Message::StepWithin(d, s) if d.as_millis() == 1500 && s == "open oci://r/a:1")
        );
        // A trust line without its image's index is the daemon gone wrong.
        for bad in [
            "trust x sha256:ab",
            "trust 3",
            "step-within soon open",
            "hello",
        ] {
            assert!(
                matches!(Message::parse(bad), Message::Error(e) if e.contains("said")),
                "{bad}"
            );
        }
    }
}
