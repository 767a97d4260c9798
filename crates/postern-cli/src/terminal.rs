//! The terminal approver (`postern serve --approver terminal`): asks the person at the terminal
//! where `serve` runs — its controlling TTY, which an agent started elsewhere cannot type into —
//! the same questions, with the same information and choices, as the desktop dialogs.
//!
//! Input typed before a question appears is discarded (`tcflush`), so nothing typed ahead — by
//! a person or by anything that can write to the terminal's input — answers a question nobody
//! has read. Between questions the terminal takes three commands: `lock`, `unlock`, `status`.

use postern_engine::approval::{
    Approver, Authorization, AuthorizationRequest, ChangeRequest, Presentation, RetryReviewRequest, ReviewVerdict,
    Withdrawal, pick, when,
};
use postern_engine::engine::Clock;
use postern_vault::Vault;
use std::{
    fs::File,
    io::{Read, Write},
    os::fd::AsFd,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

/// Why the terminal approver cannot start.
#[derive(Debug, thiserror::Error)]
pub enum TerminalError {
    #[error(
        "--approver terminal needs a terminal to ask on, and this process has none ({0}); run `postern serve` in a \
         terminal, or use the desktop app"
    )]
    NoTerminal(std::io::Error),
}

impl postern_core::ErrorCode for TerminalError {
    fn code(&self) -> &'static str {
        "no_terminal"
    }
}

/// Who answered, as journaled.
const BY: &str = "terminal";

/// How long one wait for input lasts before the question's deadline and withdrawal are checked.
const POLL: Duration = Duration::from_millis(100);

pub struct TerminalApprover {
    tty: Mutex<File>,
    vault: Arc<Vault>,
    clock: Clock,
}

impl std::fmt::Debug for TerminalApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalApprover").finish_non_exhaustive()
    }
}

/// How a wait for a line ended.
enum Input {
    Line(String),
    /// The engine withdrew the question (the vault was locked, or its time ran out).
    Withdrawn,
    TimedOut,
}

impl TerminalApprover {
    /// Opens the controlling terminal (`/dev/tty`).
    pub fn open(vault: Arc<Vault>, clock: Clock) -> Result<Arc<Self>, TerminalError> {
        let tty = File::options().read(true).write(true).open("/dev/tty").map_err(TerminalError::NoTerminal)?;
        let approver = Arc::new(TerminalApprover { tty: Mutex::new(tty), vault, clock });
        approver.say(
            "Postern asks for approvals on this terminal. Between questions you can type: lock, unlock, status.\n",
        );
        // With TIOCSTI allowed, a process sharing this terminal could type an answer into it.
        if std::fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti").is_ok_and(|v| v.trim() == "1") {
            approver.say(
                "WARNING: this kernel lets processes on this terminal inject input (dev.tty.legacy_tiocsti=1). Run \
                 `postern serve` in a terminal no agent runs in, or set the sysctl to 0.\n",
            );
        }
        Ok(approver)
    }

    /// Serves the between-questions commands until the process ends.
    pub fn spawn_console(self: &Arc<Self>) {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("postern-terminal".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Duration::from_millis(50));
                    let mut tty = me.terminal();
                    if let Ok(Some(line)) = read_line(&mut tty, Instant::now() + POLL) {
                        me.command(&mut tty, line.trim());
                    }
                }
            })
            .ok();
    }

    fn terminal(&self) -> MutexGuard<'_, File> {
        self.tty.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn say(&self, text: &str) {
        let _ = self.terminal().write_all(text.as_bytes());
    }

    fn command(&self, tty: &mut File, command: &str) {
        let now = (self.clock)();
        let reply = match command {
            "" => return,
            "lock" => match self.vault.lock(BY, now) {
                Ok(()) => "vault locked: every action is denied until you type unlock here".to_owned(),
                Err(e) => format!("could not lock: {e}"),
            },
            "unlock" => match self.vault.unlock(BY, now) {
                Ok(()) => "vault unlocked".to_owned(),
                Err(e) => format!("could not unlock: {e}"),
            },
            "status" => match self.vault.is_locked() {
                Ok(true) => "vault LOCKED".to_owned(),
                Ok(false) => "vault unlocked".to_owned(),
                Err(e) => format!("cannot read the vault: {e}"),
            },
            other => format!("unknown command {other:?}; type lock, unlock or status"),
        };
        let _ = writeln!(tty, "postern: {reply}");
    }

    /// Shows `text`, then waits for one of `keys` (a line holding just that letter); `v` shows
    /// `details` (what the rows cut short) and asks again.
    fn choose(
        &self,
        text: &str,
        details: Option<&str>,
        keys: &[(char, &str)],
        timeout_ms: u64,
        withdrawn: &Withdrawal,
    ) -> Option<char> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let mut tty = self.terminal();
        // Nothing typed before the question was shown may answer it.
        let _ = rustix::termios::tcflush(tty.as_fd(), rustix::termios::QueueSelector::IFlush);
        let menu: Vec<String> = keys.iter().map(|(k, label)| format!("[{k}] {label}")).collect();
        let letters: Vec<String> = keys.iter().map(|(k, _)| k.to_string()).collect();
        let view = if details.is_some() { "   ([v] view the whole body)" } else { "" };
        let _ = write!(tty, "\n{text}  {}{view}\nchoice ({})> ", menu.join("   "), letters.join("/"));
        let _ = tty.flush();
        loop {
            match wait_line(&mut tty, deadline, withdrawn) {
                Input::Line(line) => {
                    if let (Some(details), Some(('v', _))) = (details, pick(&line, &[('v', "view")])) {
                        let _ = write!(tty, "{details}\nchoice ({})> ", letters.join("/"));
                        let _ = tty.flush();
                        continue;
                    }
                    if let Some((k, label)) = pick(&line, keys) {
                        let _ = writeln!(tty, "→ {label}");
                        return Some(k);
                    }
                    let _ = write!(tty, "answer {}> ", letters.join(", "));
                    let _ = tty.flush();
                }
                Input::Withdrawn => {
                    let _ =
                        writeln!(tty, "\n(withdrawn: the vault was locked or the time ran out; nothing was approved)");
                    return None;
                }
                Input::TimedOut => {
                    let _ = writeln!(tty, "\n(no answer in time: denied; nothing was approved)");
                    return None;
                }
            }
        }
    }

    /// Asks for a non-empty line (the reason for "dispatch anew").
    fn reason(&self, prompt: &str, timeout_ms: u64, withdrawn: &Withdrawal) -> Option<String> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let mut tty = self.terminal();
        let _ = write!(tty, "{prompt}> ");
        let _ = tty.flush();
        loop {
            match wait_line(&mut tty, deadline, withdrawn) {
                Input::Line(line) if !line.trim().is_empty() => return Some(line.trim().to_owned()),
                Input::Line(_) => {
                    let _ = write!(tty, "a reason is required (it is journaled)> ");
                    let _ = tty.flush();
                }
                Input::Withdrawn | Input::TimedOut => {
                    let _ = writeln!(tty, "\n(no reason given in time: denied; nothing was sent)");
                    return None;
                }
            }
        }
    }
}

impl Approver for TerminalApprover {
    fn kind(&self) -> &'static str {
        "terminal"
    }

    fn where_to_unlock(&self) -> &'static str {
        "type `unlock` at the terminal running `postern serve --approver terminal`"
    }

    fn authorize(&self, r: &AuthorizationRequest) -> Authorization {
        let shown = r.presentation();
        let keys: Vec<(char, &str)> = shown.choices.iter().map(|c| (c.key, c.label.as_str())).collect();
        let started = Instant::now();
        let mut picked =
            self.choose(&text(&shown, r.timeout_ms), shown.details.as_deref(), &keys, r.timeout_ms, &r.withdrawn);
        // A permanent answer takes a second, deliberate step (and type-ahead is flushed again).
        if let Some(choice) = shown.choices.iter().find(|c| Some(c.key) == picked && c.needs_confirmation) {
            let left = r.timeout_ms.saturating_sub(started.elapsed().as_millis() as u64);
            let confirm = [('y', "yes, this is permanent"), ('n', "no, go back and deny")];
            let question = format!("Confirm: {}? It lasts until you remove it.", choice.label);
            picked = match self.choose(&question, None, &confirm, left, &r.withdrawn) {
                Some('y') => picked,
                Some(_) => Some('d'),
                None => None,
            };
        }
        r.verdict(picked, BY)
    }

    fn confirm_change(&self, r: &ChangeRequest) -> Option<bool> {
        let shown = r.presentation();
        let keys: Vec<(char, &str)> = shown.choices.iter().map(|c| (c.key, c.label.as_str())).collect();
        let key = self.choose(&text(&shown, r.timeout_ms), None, &keys, r.timeout_ms, &r.withdrawn);
        Some(r.verdict(key))
    }

    /// One terminal, one question at a time (the others wait in the engine's line, their time
    /// not yet running).
    fn questions_at_once(&self) -> usize {
        1
    }

    fn reviews_retries(&self) -> bool {
        true
    }

    fn review_retry(&self, r: &RetryReviewRequest) -> Option<ReviewVerdict> {
        let shown = r.presentation();
        let keys: Vec<(char, &str)> = shown.choices.iter().map(|c| (c.key, c.label.as_str())).collect();
        let started = Instant::now();
        let key = self.choose(&text(&shown, r.timeout_ms), None, &keys, r.timeout_ms, &r.withdrawn)?;
        let answer = match r.answer(key, None) {
            Some(answer) => answer,
            None => {
                let left = r.timeout_ms.saturating_sub(started.elapsed().as_millis() as u64);
                let reason = self.reason("reason for sending it again (journaled)", left, &r.withdrawn)?;
                r.answer(key, Some(&reason))?
            }
        };
        Some(ReviewVerdict { answer, by: BY.into() })
    }
}

/// Waits for a line until `deadline`, checking `withdrawn` between polls.
fn wait_line(tty: &mut File, deadline: Instant, withdrawn: &Withdrawal) -> Input {
    loop {
        if withdrawn.is_withdrawn() {
            return Input::Withdrawn;
        }
        let now = Instant::now();
        if now >= deadline {
            return Input::TimedOut;
        }
        match read_line(tty, (now + POLL).min(deadline)) {
            Ok(Some(line)) => return Input::Line(line),
            Ok(None) => {}
            // The terminal is gone: nobody can answer.
            Err(_) => return Input::TimedOut,
        }
    }
}

/// One line, if one is typed before `until` (the terminal is in canonical mode: a read returns
/// a whole line).
fn read_line(tty: &mut File, until: Instant) -> std::io::Result<Option<String>> {
    let wait = until.saturating_duration_since(Instant::now());
    let timeout = rustix::event::Timespec { tv_sec: wait.as_secs() as i64, tv_nsec: i64::from(wait.subsec_nanos()) };
    let mut fds = [rustix::event::PollFd::new(&*tty, rustix::event::PollFlags::IN)];
    if rustix::event::poll(&mut fds, Some(&timeout))? == 0 {
        return Ok(None);
    }
    if fds[0].revents().intersects(rustix::event::PollFlags::HUP | rustix::event::PollFlags::ERR) {
        return Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the terminal hung up"));
    }
    let mut buf = [0u8; 1024];
    let n = tty.read(&mut buf)?;
    if n == 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the terminal closed"));
    }
    Ok(Some(String::from_utf8_lossy(&buf[..n]).into_owned()))
}

/// The presentation as terminal text: a header, the rows aligned, the timeline.
fn text(p: &Presentation, timeout_ms: u64) -> String {
    let mut out = format!("== Postern: {} ==  (answer within {} s)\n", p.title, timeout_ms / 1000);
    if let Some(intro) = &p.intro {
        out.push_str(&format!("  {intro}\n"));
    }
    for (label, value) in &p.rows {
        out.push_str(&format!("  {label:<12} {value}\n"));
    }
    if !p.timeline.is_empty() {
        out.push_str("  timeline\n");
        for step in &p.timeline {
            out.push_str(&format!("    {}  {:<24} {}\n", when(step.at), step.event, step.summary));
        }
    }
    out
}
