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

/// Starts the daemon that `command` makes (given the descriptor number to report on) and
/// follows its setup until the mount on `mountpoint` answers, at most `timeout` per step:
/// the transport it is served over. On failure no daemon, and no mount of its, stays behind.
pub fn start(
    mountpoint: &Path,
    timeout: Duration,
    command: impl FnOnce(i32) -> Command,
) -> anyhow::Result<String> {
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
fn follow(child: &mut Child, pipe: OwnedFd, timeout: Duration) -> anyhow::Result<String> {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut pipe = std::fs::File::from(pipe);
    let mut step = "start".to_string();
    let mut deadline = deadline_after(timeout);
    let mut pending = Vec::new();
    loop {
        while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&pending[..nl]).into_owned();
            pending.drain(..=nl);
            match Message::parse(&line) {
                Message::Step(s) => {
                    step = s;
                    deadline = deadline_after(timeout);
                }
                Message::Ok(transport) => return Ok(transport),
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
