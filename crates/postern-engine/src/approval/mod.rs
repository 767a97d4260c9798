//! What a reviewer is asked and what they may answer (docs/src/design.md, the approval ladder): the approval questions the
//! ladder raises, the retry review, and the [`Approver`] trait behind which the terminal prompt
//! and the desktop dialogs live. Nothing here decides; the engine does, from the journal.

mod presentation;

use presentation::choice;
pub use presentation::*;

use postern_core::{ExecutionId, ExecutionState, SessionId};
use serde::{Deserialize, Serialize};
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

/// What a reviewer is asked (docs/src/design.md, the approval ladder). The ladder decides whether anyone is asked at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ask {
    /// This exact call (bound to its fingerprint): never turns into a session grant.
    PerUse,
    /// The agent run, once.
    SessionAuthorization,
}

/// Raised by the engine when a question is no longer open (the vault was locked, or the time
/// ran out): an approver that is still showing it takes it down.
#[derive(Debug, Clone, Default)]
pub struct Withdrawal(Arc<AtomicBool>);

impl Withdrawal {
    pub fn withdraw(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_withdrawn(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The agent run a session authorization is about, as the kernel described it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentRun {
    pub executable: String,
    /// SHA-256 of the executable, as hashed when the run started.
    pub sha256: String,
    pub pid: Option<i64>,
    /// When the process started, in ms since the Unix epoch (from /proc).
    pub process_started_at: Option<i64>,
    pub transport: String,
    /// The MCP client's own name and version (`clientInfo`): claimed by the client, not proven.
    pub client: Option<String>,
}

/// When a process started, in ms since the Unix epoch, from its start time in clock ticks after
/// boot (as in `/proc/<pid>/stat`) and the boot time in `/proc/stat`: how an [`AgentRun`]'s
/// start is shown, from the ticks its run's record keeps.
pub fn process_started_at_ms(start_ticks: u64) -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let boot_s: i64 = stat.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()?;
    let per_s = rustix::param::clock_ticks_per_second().max(1);
    let after_boot_ms = i64::try_from(start_ticks.checked_mul(1000)? / per_s).ok()?;
    boot_s.checked_mul(1000)?.checked_add(after_boot_ms)
}

/// A question the ladder raised (docs/src/design.md, the approval ladder): never a secret.
#[derive(Debug, Clone, Serialize)]
pub struct AuthorizationRequest {
    pub ask: Ask,
    pub execution_id: ExecutionId,
    pub session: Option<SessionId>,
    pub tool: String,
    pub actor: String,
    /// Who is asking, for a session authorization (and shown with a per-use approval too).
    pub agent: Option<AgentRun>,
    pub method: String,
    pub target: String,
    /// The credential's name (never its value).
    pub credential: Option<String>,
    /// The request body as a reviewer first sees it (secrets masked): whole, or its head and
    /// tail with the size of what is not shown.
    pub body_preview: Option<String>,
    /// The whole body (secrets masked, at most [`BODY_FULL_BYTES`]) when the preview is cut, for
    /// a reviewer who expands it. Not journaled (the preview is).
    #[serde(skip)]
    pub body_full: Option<String>,
    /// How long the reviewer has (then the call is denied, `approval_timed_out`).
    pub timeout_ms: u64,
    /// The same effect asked for by the same actor in an earlier run (a restarted agent's
    /// repeat), as the `accepted` row names it: not a retry, but the reviewer should know.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub earlier_run: Option<EarlierRun>,
    #[serde(skip)]
    pub withdrawn: Withdrawal,
}

/// An earlier execution of the same effect in another run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EarlierRun {
    pub execution_id: String,
    pub state: Option<String>,
    pub accepted_at: i64,
}

/// Default time a reviewer has to answer.
pub const DEFAULT_APPROVAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// A session-authorization answer beyond "this time".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// Allow this agent run.
    Session,
    /// Allow this run, and every later run of the same actor (executable hash) without asking.
    Always,
}

/// The verdict, journaled with the `authorized` or `denied` row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Authorization {
    pub allowed: bool,
    /// Which rung decided (journaled as `vault_locked`, `approve_every_use`,
    /// `session_authorization`, `allowlist`, `run`).
    pub rung: postern_core::Rung,
    pub by: String,
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<Grant>,
    /// Nobody answered in time.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
}

/// What a reviewer may do with a retry of an execution that is uncertain or undelivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewChoice {
    /// Answer the retry from the record: the stored result, or the state as it stands (waiting
    /// for a dispatched original to finish first).
    ReturnRecordedResult,
    /// Verify through the replay contract (status query, idempotent re-send): offered only where
    /// the contract has a route.
    CheckStatus,
    /// Send it again as a new execution: needs a typed reason, journaled.
    DispatchAnew,
    /// Refuse the retry; the original stays as recorded.
    Deny,
}

impl ReviewChoice {
    pub fn label(self) -> &'static str {
        match self {
            ReviewChoice::ReturnRecordedResult => "return the recorded result",
            ReviewChoice::CheckStatus => "verify the outcome as the replay contract allows (see above)",
            ReviewChoice::DispatchAnew => "dispatch anew (give a reason)",
            ReviewChoice::Deny => "deny this retry",
        }
    }
}

/// One line of the original's timeline, as shown to the reviewer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelineStep {
    pub at: i64,
    pub event: String,
    /// Who decided, why, what was observed (no secrets are ever journaled).
    pub summary: String,
}

/// The retry review (docs/src/design.md, the approval ladder): the *original* record and the choices. The retry itself sent
/// nothing and will send nothing unless the reviewer chooses "dispatch anew".
#[derive(Debug, Clone, Serialize)]
pub struct RetryReviewRequest {
    /// The original execution the retry matched.
    pub execution_id: ExecutionId,
    pub session: Option<SessionId>,
    pub tool: String,
    pub actor: String,
    pub method: String,
    pub target: String,
    pub credential: Option<String>,
    pub replay_contract: String,
    /// The original's state now.
    pub state: ExecutionState,
    pub accepted_at: i64,
    pub authorized_by: Option<String>,
    pub first_dispatched_at: Option<i64>,
    /// What is known about the outcome, in words.
    pub known_outcome: String,
    /// Why Postern did not send the retry again on its own.
    pub why_not_resent: String,
    pub timeline: Vec<TimelineStep>,
    pub choices: Vec<ReviewChoice>,
    pub timeout_ms: u64,
    #[serde(skip)]
    pub withdrawn: Withdrawal,
}

/// The reviewer's answer to a retry review.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "choice")]
pub enum ReviewAnswer {
    ReturnRecordedResult,
    CheckStatus,
    DispatchAnew { reason: String },
    Deny { reason: String },
}

impl ReviewAnswer {
    pub fn choice(&self) -> ReviewChoice {
        match self {
            ReviewAnswer::ReturnRecordedResult => ReviewChoice::ReturnRecordedResult,
            ReviewAnswer::CheckStatus => ReviewChoice::CheckStatus,
            ReviewAnswer::DispatchAnew { .. } => ReviewChoice::DispatchAnew,
            ReviewAnswer::Deny { .. } => ReviewChoice::Deny,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReviewVerdict {
    #[serde(flatten)]
    pub answer: ReviewAnswer,
    pub by: String,
}

/// Questions open at once for all agents together, whatever the approver could show.
pub const QUESTIONS_IN_ALL: usize = 32;

/// Answers what the ladder asks (per-use approval, session authorization) and, where a person
/// is present, reviews retries of uncertain executions. The desktop app's dialogs and the
/// terminal prompt (`postern serve --approver terminal`) ask a person; [`LockOnlyApprover`]
/// is the headless policy.
pub trait Approver: Send + Sync + std::fmt::Debug {
    fn authorize(&self, request: &AuthorizationRequest) -> Authorization;

    /// Whether `authorize` may wait (for a person, a dialog): then it runs on a blocking thread,
    /// under the approval timeout, and its question and answer are journaled.
    fn may_block(&self) -> bool {
        true
    }

    /// How many questions it can put before its person at once (a terminal: one; windows:
    /// several). The engine opens no more than this, and no more than [`QUESTIONS_IN_ALL`], so
    /// its questions do not wait on one another inside the approver. (A change question from
    /// the control socket is not in the engine's line: on a terminal, it and an approval can
    /// still wait for each other.)
    fn questions_at_once(&self) -> usize {
        QUESTIONS_IN_ALL
    }

    /// Whether a person reviews retries (see [`Approver::review_retry`]). Without one, retries
    /// are decided by the replay contract alone.
    fn reviews_retries(&self) -> bool {
        false
    }

    /// A retry matched an execution that is dispatched, uncertain or undelivered: show the
    /// original record, return the choice. `None` means "no answer" (treated as a timeout).
    fn review_retry(&self, _request: &RetryReviewRequest) -> Option<ReviewVerdict> {
        None
    }

    /// A process outside every agent run asked, over the control socket, for a change that
    /// weakens safety (a weaker contract, approve-every-use off, a server added, a credential
    /// removed, …): its person confirms (`Some(true)`) or refuses (`Some(false)`, also when no
    /// answer comes in time). `None`: no person is attached to ask, and the change goes ahead
    /// (journaled with where it came from).
    fn confirm_change(&self, _request: &ChangeRequest) -> Option<bool> {
        None
    }

    /// Who answers, as `status` and `doctor` say it: `none`, `terminal`, `desktop app`.
    fn kind(&self) -> &'static str {
        "none"
    }

    /// Where a person unlocks the vault of a gateway asking this approver: what `postern vault
    /// unlock` says while the gateway runs (the control socket never unlocks).
    fn where_to_unlock(&self) -> &'static str {
        "this gateway has no approver: stop it (Ctrl-C or SIGTERM) and run `postern vault unlock`, or start it \
         with `postern serve --approver terminal` and type `unlock` there"
    }
}

/// The headless policy when no reviewer runs (`postern serve` without an approver): a per-use
/// approval is denied, because there is no one to ask; an agent run is authorized by policy,
/// journaled as `session_authorized` by `policy:no-reviewer`. (A locked vault and a revoked run
/// are denied by the ladder before any approver is consulted.) Retries are decided by the
/// replay contract.
#[derive(Debug, Default)]
pub struct LockOnlyApprover;

impl Approver for LockOnlyApprover {
    fn may_block(&self) -> bool {
        false
    }

    fn authorize(&self, r: &AuthorizationRequest) -> Authorization {
        match r.ask {
            Ask::PerUse => Authorization {
                allowed: false,
                rung: postern_core::Rung::ApproveEveryUse,
                by: "postern".into(),
                reason: "this credential needs a reviewer's approval and no approver is running".into(),
                grant: None,
                timed_out: false,
            },
            Ask::SessionAuthorization => Authorization {
                allowed: true,
                rung: postern_core::Rung::SessionAuthorization,
                by: "policy:no-reviewer".into(),
                reason: "no reviewer is running; agent runs are authorized by policy".into(),
                grant: Some(Grant::Session),
                timed_out: false,
            },
        }
    }
}

/// Executables that run whatever they are given (interpreters, runtimes, shells) or host other
/// programs (editors whose terminals and extensions run as them): allowlisting one by its hash
/// would allow every script it ever runs.
const GENERAL_PURPOSE: &[&str] = &[
    "node",
    "nodejs",
    "deno",
    "bun",
    "python",
    "python2",
    "python3",
    "pypy",
    "pypy3",
    "ruby",
    "perl",
    "php",
    "java",
    "lua",
    "luajit",
    "Rscript",
    "julia",
    "dotnet",
    "pwsh",
    "powershell",
    "osascript",
    "sh",
    "bash",
    "dash",
    "zsh",
    "fish",
    "ksh",
    "tcsh",
    "csh",
    "busybox",
    "code",
    "code-insiders",
    "codium",
    "cursor",
    "windsurf",
    "zed",
    "vim",
    "nvim",
    "emacs",
    "idea",
    "pycharm",
    "webstorm",
    "electron",
];

/// Is `executable` an interpreter, runtime, shell or editor (see `GENERAL_PURPOSE`)?
pub fn runs_anything(executable: &str) -> bool {
    let name = executable.rsplit('/').next().unwrap_or(executable);
    // python3.12, node20, ruby3.3: the family name followed by a version.
    let family = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    GENERAL_PURPOSE.contains(&name) || GENERAL_PURPOSE.contains(&family)
}

impl AuthorizationRequest {
    /// "Always allow" is offered only for an agent that is a program of its own: never for an
    /// interpreter, runtime, shell or editor, whose hash says nothing about what it runs.
    pub fn offers_always(&self) -> bool {
        self.agent.as_ref().is_some_and(|a| !runs_anything(&a.executable))
    }

    pub fn presentation(&self) -> Presentation {
        let mut rows: Vec<(String, String)> = Vec::new();
        let mut row = |label: &str, value: String| rows.push((label.to_owned(), value));
        let (title, intro, choices) = match self.ask {
            Ask::SessionAuthorization => (
                "authorize an agent run",
                Some("A new agent run wants to act through Postern.".to_owned()),
                if self.offers_always() {
                    vec![
                        choice('s', "allow this session"),
                        PresentedChoice {
                            needs_confirmation: true,
                            ..choice('a', "always allow this agent (this executable hash)")
                        },
                        choice('d', "deny"),
                    ]
                } else {
                    vec![choice('s', "allow this session"), choice('d', "deny")]
                },
            ),
            Ask::PerUse => {
                ("approve this call", None, vec![choice('y', "approve this call only"), choice('d', "deny")])
            }
        };
        let call = format!("{} {}", self.method, self.target);
        if self.ask == Ask::PerUse {
            row("tool", self.tool.clone());
            row("request", call.clone());
            row("credential", self.credential.clone().unwrap_or_else(|| "(none)".into()));
            if let Some(body) = &self.body_preview {
                row("body", body.clone());
            }
        }
        match &self.agent {
            Some(a) => {
                row("agent", a.executable.clone());
                if runs_anything(&a.executable) {
                    row(
                        "note",
                        "this is an interpreter, runtime, shell or editor: it runs whatever script it is given, \
                         so \"always allow\" is not offered (its hash would allow all of them)"
                            .into(),
                    );
                }
                if !a.sha256.is_empty() {
                    row("sha256", a.sha256.clone());
                }
                match a.pid {
                    Some(pid) => {
                        let started =
                            a.process_started_at.map_or_else(String::new, |t| format!(", started {}", when(t)));
                        row("pid", format!("{pid}{started}"));
                    }
                    None => row(
                        "process",
                        "unidentified: the kernel could not name the calling process (a relay, a container, \
                         another user); only the token is known, and its run lasts while it keeps calling"
                            .into(),
                    ),
                }
                row("transport", a.transport.clone());
                if let Some(client) = &a.client {
                    row("client", format!("{client} (as the client names itself)"));
                }
            }
            None => row("agent", self.actor.clone()),
        }
        if self.ask == Ask::SessionAuthorization {
            row("first call", format!("{}: {call}", self.tool));
            if let Some(c) = &self.credential {
                row("credential", c.clone());
            }
        }
        if let Some(e) = &self.earlier_run {
            row(
                "earlier run",
                format!(
                    "a matching call by an earlier run: {}, state {}, accepted {}",
                    e.execution_id,
                    e.state.as_deref().unwrap_or("unknown"),
                    when(e.accepted_at)
                ),
            );
        }
        row("execution", self.execution_id.to_string());
        Presentation { title: title.into(), intro, rows, timeline: vec![], choices, details: self.body_full.clone() }
            .visible()
    }
}

impl AuthorizationRequest {
    /// The verdict for the key a reviewer chose from [`AuthorizationRequest::presentation`]
    /// (`None`: no answer — timed out, unless the question was withdrawn).
    pub fn verdict(&self, key: Option<char>, by: &str) -> Authorization {
        let (allowed, grant, reason) = match (self.ask, key) {
            (Ask::SessionAuthorization, Some('s')) => (true, Some(Grant::Session), "allowed this session"),
            (Ask::SessionAuthorization, Some('a')) if self.offers_always() => {
                (true, Some(Grant::Always), "always allow this agent")
            }
            (Ask::PerUse, Some('y')) => (true, None, "approved this call"),
            (_, Some(_)) => (false, None, "denied by the reviewer"),
            (_, None) => (false, None, "not answered"),
        };
        Authorization {
            allowed,
            rung: match self.ask {
                Ask::SessionAuthorization => postern_core::Rung::SessionAuthorization,
                Ask::PerUse => postern_core::Rung::ApproveEveryUse,
            },
            by: by.to_owned(),
            reason: reason.into(),
            grant,
            timed_out: key.is_none() && !self.withdrawn.is_withdrawn(),
        }
    }
}

impl RetryReviewRequest {
    /// The answer for the key a reviewer chose; `None` for "dispatch anew" without a reason (ask
    /// for one) or a key that was not offered.
    pub fn answer(&self, key: char, reason: Option<&str>) -> Option<ReviewAnswer> {
        let reason = reason.map(str::trim).filter(|r| !r.is_empty());
        let offered = |c: ReviewChoice| self.choices.contains(&c);
        match key {
            'r' if offered(ReviewChoice::ReturnRecordedResult) => Some(ReviewAnswer::ReturnRecordedResult),
            'c' if offered(ReviewChoice::CheckStatus) => Some(ReviewAnswer::CheckStatus),
            'n' if offered(ReviewChoice::DispatchAnew) => {
                reason.map(|r| ReviewAnswer::DispatchAnew { reason: r.to_owned() })
            }
            'd' => Some(ReviewAnswer::Deny { reason: reason.unwrap_or("denied by the reviewer").to_owned() }),
            _ => None,
        }
    }

    pub fn presentation(&self) -> Presentation {
        let mut rows: Vec<(String, String)> = Vec::new();
        let mut row = |label: &str, value: String| rows.push((label.to_owned(), value));
        row(
            "original",
            format!("{} (tool {}, replay contract {})", self.execution_id, self.tool, self.replay_contract),
        );
        row("request", format!("{} {}", self.method, self.target));
        if let Some(c) = &self.credential {
            row("credential", c.clone());
        }
        row("agent", self.actor.clone());
        row("state", self.state.as_str().to_owned());
        row("accepted", when(self.accepted_at));
        if let Some(by) = &self.authorized_by {
            row("authorized", format!("by {by}"));
        }
        if let Some(at) = self.first_dispatched_at {
            row("dispatched", when(at));
        }
        row("outcome", self.known_outcome.clone());
        row("not re-sent", self.why_not_resent.clone());
        let choices = self
            .choices
            .iter()
            .map(|c| {
                let key = match c {
                    ReviewChoice::ReturnRecordedResult => 'r',
                    ReviewChoice::CheckStatus => 'c',
                    ReviewChoice::DispatchAnew => 'n',
                    ReviewChoice::Deny => 'd',
                };
                PresentedChoice {
                    key,
                    label: c.label().to_owned(),
                    needs_reason: *c == ReviewChoice::DispatchAnew,
                    needs_confirmation: false,
                }
            })
            .collect();
        Presentation {
            title: "review a retry".into(),
            intro: Some(format!(
                "The agent repeated a call that matches execution {} on record. Nothing has been sent for the retry.",
                self.execution_id
            )),
            rows,
            timeline: self.timeline.clone(),
            choices,
            details: None,
        }
        .visible()
    }
}

/// A change to what Postern trusts, asked for over the control socket by a process outside
/// every agent run, put to the approver's person before it is made.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeRequest {
    /// The control operation (`servers.contract`, `vault.remove`, …).
    pub op: String,
    /// What would change, in words.
    pub change: String,
    /// Why that weakens safety.
    pub weakens: String,
    /// The requesting process and its ancestry, one per line (`pid 4242 /usr/bin/bash`).
    pub from: Vec<String>,
    pub timeout_ms: u64,
    #[serde(skip)]
    pub withdrawn: Withdrawal,
}

impl ChangeRequest {
    pub fn presentation(&self) -> Presentation {
        let mut rows = vec![
            ("change".to_owned(), self.change.clone()),
            ("weakens".to_owned(), self.weakens.clone()),
            ("operation".to_owned(), self.op.clone()),
        ];
        for (i, line) in self.from.iter().enumerate() {
            rows.push((if i == 0 { "asked by" } else { "  under" }.to_owned(), line.clone()));
        }
        Presentation {
            title: "confirm a change".into(),
            intro: Some(
                "A process of your user asked Postern, over its control socket, for a change that weakens safety. \
                 Confirm it only if you asked for it yourself."
                    .into(),
            ),
            rows,
            timeline: vec![],
            choices: vec![choice('c', "confirm the change"), choice('r', "refuse it")],
            details: None,
        }
        .visible()
    }

    /// The answer for the key chosen (`None`: no answer in time — refused).
    pub fn verdict(&self, key: Option<char>) -> bool {
        key == Some('c')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_preview_masks_secret_arguments_and_is_never_cut_silently() {
        let key = postern_core::FingerprintKey::from_bytes([7; 32]);
        let mut secrets = crate::catalog::redaction::CallSecrets::default();
        secrets.add("approval_code", &serde_json::json!("CANARY-7731"), &key);
        let (shown, full) = body_preview(br#"{"amount":5,"approval_code":"CANARY-7731"}"#, &secrets, 200);
        assert!(shown.starts_with(r#"{"amount":5,"approval_code":"SECRET(approval_code:"#), "{shown}");
        assert!(!shown.contains("CANARY-7731") && full.is_none());
        let none = crate::catalog::redaction::CallSecrets::default();
        let long = format!("{}{}{}", "é".repeat(100), "x".repeat(1000), "TAIL-MATTERS");
        let (cut, full) = body_preview(long.as_bytes(), &none, 60);
        assert!(cut.starts_with("éééééééééééééééééééé"), "{cut}");
        assert!(cut.contains("bytes not shown") && cut.ends_with("TAIL-MATTERS"), "the tail is shown: {cut}");
        assert_eq!(full.as_deref(), Some(long.as_str()), "the whole body is there to expand");
        assert_eq!(body_preview(&[0xff, 0xfe, 0], &none, 10).0, "(3 bytes of binary data)");
    }

    #[test]
    fn what_a_reviewer_sees_cannot_be_rewritten_by_the_agent() {
        let hostile = "safe\r\u{1b}[2K\u{1b}[1Aagent       /usr/bin/trusted\n\u{202e}txt.exe\u{200b}\u{9b}31m";
        let shown = visible(hostile);
        assert!(!shown.chars().any(|c| c.is_control() || ('\u{200b}'..='\u{206f}').contains(&c)), "{shown:?}");
        assert_eq!(
            shown,
            "safe\\r\\u{1b}[2K\\u{1b}[1Aagent       /usr/bin/trusted\\n\\u{202e}txt.exe\\u{200b}\\u{9b}31m"
        );
        assert_eq!(visible(&format!("a{}b", " ".repeat(300))), "a␠×300b");
    }

    #[test]
    fn a_hostile_client_name_or_command_reaches_no_approver_raw() {
        let request = AuthorizationRequest {
            ask: Ask::SessionAuthorization,
            execution_id: "act_01M8PM1HTYABR0ZCD5R1RHETB7".parse().expect("id"),
            session: None,
            tool: "deploy".into(),
            actor: "process:/usr/bin/node@sha256:ab".into(),
            agent: Some(AgentRun {
                executable: "/usr/bin/node".into(),
                sha256: "ab".into(),
                pid: Some(7),
                process_started_at: None,
                transport: "stdio".into(),
                client: Some("claude\r\u{1b}[2Kagent        /usr/bin/trusted".into()),
            }),
            method: "POST".into(),
            target: "https://x.example/\u{202e}gpj.exe".into(),
            credential: None,
            body_preview: None,
            body_full: None,
            timeout_ms: 1000,
            earlier_run: None,
            withdrawn: Withdrawal::default(),
        };
        let shown = request.presentation();
        for (label, value) in &shown.rows {
            assert!(!value.chars().any(|c| c.is_control() || c == '\u{202e}'), "{label}: {value:?}");
        }
        let client = &shown.rows.iter().find(|(l, _)| l == "client").expect("client").1;
        assert!(client.starts_with("claude\\r\\u{1b}[2Kagent␠×8/usr/bin/trusted"), "{client}");
        assert!(shown.choices.iter().all(|c| c.key != 'a'), "node runs anything: no 'always'");
        assert!(shown.rows.iter().any(|(l, v)| l == "note" && v.contains("interpreter")), "{:?}", shown.rows);
        assert!(!request.verdict(Some('a'), "t").allowed, "an 'a' that was not offered grants nothing");
        let own = AuthorizationRequest {
            agent: request.agent.clone().map(|a| AgentRun { executable: "/opt/agent/bin/claude".into(), ..a }),
            ..request.clone()
        };
        // A token agent the kernel could not name: the question says so instead of a pid.
        let relayed = AuthorizationRequest {
            actor: "agent:relayed".into(),
            agent: request.agent.clone().map(|a| AgentRun { pid: None, transport: "streamable_http".into(), ..a }),
            ..request.clone()
        };
        // A restarted agent's repeat: the reviewer is told of the earlier execution.
        let repeat = AuthorizationRequest {
            earlier_run: Some(EarlierRun {
                execution_id: "act_01M8PM1HTYABR0ZCD5R1RHETB6".into(),
                state: Some("completed_result_not_delivered".into()),
                accepted_at: 0,
            }),
            ..request.clone()
        };
        let earlier = repeat.presentation().rows.into_iter().find(|(l, _)| l == "earlier run").expect("shown").1;
        assert!(
            earlier.starts_with("a matching call by an earlier run: act_01M8PM1HTYABR0ZCD5R1RHETB6, state completed_result_not_delivered"),
            "{earlier}"
        );
        let rows = relayed.presentation().rows;
        assert!(rows.iter().any(|(l, v)| l == "process" && v.starts_with("unidentified")), "{rows:?}");
        assert!(!rows.iter().any(|(l, _)| l == "pid"), "{rows:?}");
        let always = own.presentation().choices.into_iter().find(|c| c.key == 'a').expect("always for a program");
        assert!(always.needs_confirmation, "a permanent answer needs a second step");
        for runtime in
            ["/usr/bin/node", "/usr/local/bin/python3.12", "/usr/bin/bash", "/snap/bin/code", "/usr/bin/nvim"]
        {
            assert!(runs_anything(runtime), "{runtime}");
        }
        for program in ["/opt/agent/bin/claude", "/usr/local/bin/aider-rs", "/usr/bin/goose", "/usr/bin/codex"] {
            assert!(!runs_anything(program), "{program}");
        }
    }

    // The terminal approver's key picking.

    use proptest::prelude::*;

    const KEYS: [(char, &str); 3] = [('a', "allow once"), ('s', "allow for this run"), ('d', "deny")];

    #[test]
    fn only_a_line_holding_one_key_answers() {
        assert_eq!(pick("a\n", &KEYS), Some(('a', "allow once")));
        assert_eq!(pick("  D \r\n", &KEYS), Some(('d', "deny")));
        for line in ["", "\n", "allow", "as", "a\ns\n", "x", "aa", "a d"] {
            assert_eq!(pick(line, &KEYS), None, "{line:?}");
        }
    }

    proptest! {
        /// Whatever arrives on the terminal (type-ahead, pasted text, escape sequences, invalid
        /// UTF-8 decoded lossily), it answers only if, trimmed, it is exactly one key.
        #[test]
        fn hostile_input_answers_only_when_it_is_exactly_a_key(line in "\\PC{0,40}|[asdASD \t\r\n\u{1b}\\[]{0,6}") {
            let expected = KEYS.iter().find(|(k, _)| line.trim().to_ascii_lowercase() == k.to_string()).copied();
            prop_assert_eq!(pick(&line, &KEYS), expected);
        }
    }
}
