//! Where an argument may stand in an SSH command template, decided by parsing the template as
//! POSIX `sh` parses it (words, quotes, expansions, operators, redirections, reserved words,
//! here-documents), not by looking at the word before a placeholder. Each argument is sent as one
//! single-quoted word; that is inert only where the word is data. So a placeholder may stand only
//! as a plain argument of a simple command (or a file to redirect to or from), never:
//!
//! * inside quotes, a command substitution, an arithmetic or parameter expansion, a comment or a
//!   here-document, after `\` or `$`, or as a here-document's delimiter or a descriptor to dup;
//! * as the command, or in an assignment before it (`PAGER={x} git log`);
//! * right after a flag that takes code in many programs (`-c`, `-e`, `--eval`, `-exec`, …),
//!   bundled too (`psql -Atc {q}`);
//! * anywhere in a template that runs an interpreter (a shell, `python3`, `perl`, `awk`, `sed`,
//!   …) or a wrapper that runs its arguments as a command (`sudo`, `env`, `timeout`, `xargs`,
//!   `ssh`, `find … -exec`, …), or whose command is computed (`$CMD {x}`) — anywhere in its
//!   pipeline, list or compound command;
//! * in a template with `for`, `case`, `select`, function definitions, `[[`, `((` or `coproc`,
//!   whose words are not plain arguments.
//!
//! * in a template that uses `$'…'` or `$"…"` quoting (read differently by the shells that
//!   `/bin/sh` may be).
//!
//! A placeholder may name a file a command reads or writes (`< {file}`, `>> {file}`,
//! `tee {file}`): the value stays a path, and which paths the agent may choose is the template's
//! meaning — write the path into the template where it should not choose.
//!
//! Anything the parser does not recognise as one of the allowed places is refused. And a value
//! that starts with `-` is refused at call time where the program would read it as an option
//! (`tar -xf a.tar {m}` with `--to-command=…`): [`check`] names those placeholders — a whole
//! word, not after a flag that takes a value, not after `--`.

use super::Segment;

/// Programs that run their arguments (or their input) as code.
const INTERPRETERS: &[&str] = &[
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "mksh",
    "ash",
    "fish",
    "csh",
    "tcsh",
    "rc",
    "busybox",
    "toybox",
    "python",
    "pypy",
    "perl",
    "ruby",
    "irb",
    "node",
    "nodejs",
    "deno",
    "bun",
    "php",
    "lua",
    "luajit",
    "tclsh",
    "wish",
    "expect",
    "awk",
    "gawk",
    "mawk",
    "nawk",
    "sed",
    "gsed",
    "ed",
    "ex",
    "vi",
    "vim",
    "nvim",
    "emacs",
    "gdb",
    "lldb",
    "osascript",
    "pwsh",
    "powershell",
    "r",
    "rscript",
    "julia",
    "jq",
    "make",
    "m4",
    "bc",
    "dc",
    "groovy",
    "scala",
    "kotlin",
    "java",
    "jshell",
    "guile",
    "racket",
    "sbcl",
    "erl",
    "elixir",
    "iex",
    "ghci",
    "runghc",
    "swift",
    "dotnet",
    // Database shells whose positional arguments are statements (`sqlite3 app.db {q}` with
    // `.shell …`, `redis-cli {cmd}`).
    "sqlite",
    "duckdb",
    "redis-cli",
    "valkey-cli",
    "mongo",
    "mongosh",
    "cqlsh",
    "sqlcmd",
];

/// Programs that run (part of) their arguments as a command.
const WRAPPERS: &[&str] = &[
    "sudo",
    "sudoedit",
    "doas",
    "su",
    "runuser",
    "pkexec",
    "setpriv",
    "capsh",
    "env",
    "timeout",
    "gtimeout",
    "timelimit",
    "nice",
    "renice",
    "ionice",
    "nohup",
    "time",
    "xargs",
    "parallel",
    "exec",
    "eval",
    "command",
    "builtin",
    "source",
    ".",
    "stdbuf",
    "setsid",
    "chroot",
    "taskset",
    "numactl",
    "chrt",
    "cpulimit",
    "flock",
    "watch",
    "entr",
    "ssh",
    "script",
    "unbuffer",
    "rlwrap",
    "strace",
    "ltrace",
    "valgrind",
    "perf",
    "systemd-run",
    "sg",
    "newgrp",
    "trap",
    "at",
    "batch",
    "crontab",
    "tmux",
    "screen",
    "docker",
    "podman",
    "kubectl",
    "nsenter",
    "unshare",
    "firejail",
    "bwrap",
    "flatpak-spawn",
    "fakeroot",
    "proot",
    "torsocks",
    "proxychains",
    "proxychains4",
    "xvfb-run",
    "dbus-launch",
    "dbus-run-session",
    "sshpass",
    "setarch",
    "linux32",
    "linux64",
    "catchsegv",
    "faketime",
    "daemonize",
    "start-stop-daemon",
    "run-parts",
];

/// Flags after which many programs take code (`sh -c`, `perl -e`, `psql -c`, `mysql -e`,
/// `vim -c`, `gdb -ex`, `find -exec`).
const CODE_FLAGS: &[&str] = &[
    "-c",
    "-e",
    "-ex",
    "-exec",
    "-execdir",
    "-ok",
    "-okdir",
    "--command",
    "--eval",
    "--exec",
    "--execute",
    "--expression",
    "--code",
    "--script",
    "--init-command",
];

/// Reserved words after which a command starts.
const COMMAND_STARTERS: &[&str] = &["if", "then", "else", "elif", "do", "while", "until", "!", "{", "time"];
/// Reserved words that end a compound command.
const COMMAND_ENDERS: &[&str] = &["fi", "done", "}", "esac"];
/// Compound commands whose words are not plain arguments.
const NOT_SIMPLE: &[&str] = &["for", "case", "select", "function", "[[", "((", "coproc", "esac", "in"];

/// Where a placeholder stood, as far as quoting goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Quoting {
    Plain,
    Single,
    Double,
    Backquote,
    Substitution,
    Comment,
    HereDoc,
    AfterBackslash,
    AfterDollar,
}

/// A shell word: its literal text (placeholders left out), whether any of it was quoted or
/// expanded, and its placeholders.
#[derive(Clone, Debug, Default)]
struct Word {
    /// The word's text with quote characters removed (a placeholder contributes nothing).
    text: String,
    quoted: bool,
    /// It holds an unquoted or double-quoted expansion (`$…`, `` `…` ``): what it says is only
    /// known when it runs.
    expands: bool,
    placeholders: Vec<String>,
    /// The literal text before its first placeholder (for `NAME=…` assignments).
    before_placeholder: Option<String>,
}

#[derive(Clone, Debug)]
enum Token {
    Word(Word),
    /// `;` `&` `&&` `|` `||` `;;` `(` `)` `|&` or a newline.
    Operator(String),
    /// `<` `>` `>>` `<<` `<<-` `<<<` `<&` `>&` `<>` `>|` `&>` `&>>`.
    Redirect(String),
}

/// Splits the template into tokens, refusing a placeholder in any quoted, expanded or
/// commented-out place.
/// `value` as one single-quoted `sh` word.
pub fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

fn tokens(segments: &[Segment]) -> Result<(Vec<Token>, bool), String> {
    let mut lexer = Lexer::default();
    for segment in segments {
        match segment {
            Segment::Literal(text) => {
                for c in text.chars() {
                    lexer.push(c);
                }
            }
            Segment::Placeholder(name) => lexer.placeholder(name)?,
        }
    }
    lexer.push('\n');
    if lexer.state != State::Normal || lexer.depth > 0 {
        // An unclosed quote or substitution: the shell would not run it as written.
        return Err("ssh.command has an unclosed quote or substitution".into());
    }
    Ok((lexer.out, lexer.dollar_quote))
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    #[default]
    Normal,
    Single,
    Double,
    Backquote,
}

#[derive(Default)]
struct Lexer {
    out: Vec<Token>,
    word: Option<Word>,
    state: State,
    escaped: bool,
    /// Depth of `$(`, `${`, `$((` being read.
    depth: u32,
    /// The previous character was an unquoted, unescaped `$`.
    dollar: bool,
    comment: bool,
    /// Operator characters being gathered (`&&`, `>>`, `<<-`, …).
    operator: String,
    /// A here-document: its delimiter is the next word; its body starts at the next newline.
    heredoc_pending: bool,
    /// `<<-`: tabs before the delimiter are stripped (not with `<<`).
    heredoc_strip_tabs: bool,
    heredoc_delimiter: Option<String>,
    /// `$'…'` or `$"…"` quoting was seen.
    dollar_quote: bool,
    in_heredoc: bool,
    heredoc_line: String,
}

impl Lexer {
    fn word(&mut self) -> &mut Word {
        self.word.get_or_insert_with(Word::default)
    }

    fn end_word(&mut self) {
        if let Some(w) = self.word.take() {
            if self.heredoc_pending && self.heredoc_delimiter.is_none() {
                self.heredoc_delimiter = Some(w.text.clone());
            }
            self.out.push(Token::Word(w));
        }
    }

    fn end_operator(&mut self) {
        if self.operator.is_empty() {
            return;
        }
        let op = std::mem::take(&mut self.operator);
        // An `&` or `|` glued to a redirection is part of it (`>&`, `&>`, `>|`).
        let token = match op.as_str() {
            "<" | ">" | ">>" | "<<" | "<<-" | "<<<" | "<&" | ">&" | "<>" | ">|" | "&>" | "&>>" => {
                if op.starts_with("<<") && op != "<<<" {
                    self.heredoc_pending = true;
                    self.heredoc_strip_tabs = op == "<<-";
                    self.heredoc_delimiter = None;
                }
                Token::Redirect(op)
            }
            _ => Token::Operator(op),
        };
        self.out.push(token);
    }

    fn push(&mut self, c: char) {
        if self.in_heredoc {
            if c == '\n' {
                let line = std::mem::take(&mut self.heredoc_line);
                let delimiter = self.heredoc_delimiter.clone().unwrap_or_default();
                let line = if self.heredoc_strip_tabs { line.trim_start_matches('\t') } else { line.as_str() };
                if line == delimiter {
                    self.in_heredoc = false;
                    self.heredoc_pending = false;
                    self.heredoc_delimiter = None;
                }
            } else {
                self.heredoc_line.push(c);
            }
            return;
        }
        if self.comment {
            if c == '\n' {
                self.comment = false;
                self.newline();
            }
            return;
        }
        let dollar = std::mem::take(&mut self.dollar);
        if self.escaped {
            self.escaped = false;
            if !(self.state == State::Normal && c == '\n') {
                self.word().text.push(c);
                self.word().quoted = true;
            }
            return;
        }
        if self.depth > 0 {
            // Inside `$(…)`, `${…}`, `$((…))`: only its end matters here (quotes inside it are
            // the substitution's own).
            self.word().expands = true;
            match c {
                '(' | '{' => self.depth += 1,
                ')' | '}' => self.depth -= 1,
                _ => {}
            }
            return;
        }
        match self.state {
            State::Single => {
                if c == '\'' {
                    self.state = State::Normal;
                } else {
                    self.word().text.push(c);
                }
                return;
            }
            State::Double => {
                match c {
                    '"' => self.state = State::Normal,
                    '\\' => self.escaped = true,
                    '`' => {
                        self.state = State::Backquote;
                        self.word().expands = true;
                    }
                    '$' => {
                        self.dollar = true;
                        self.word().expands = true;
                    }
                    '(' | '{' if dollar => self.depth = 1,
                    c => self.word().text.push(c),
                }
                return;
            }
            State::Backquote => {
                match c {
                    '`' => self.state = State::Normal,
                    '\\' => self.escaped = true,
                    _ => {}
                }
                return;
            }
            State::Normal => {}
        }
        if dollar && matches!(c, '(' | '{') {
            self.depth = 1;
            return;
        }
        if dollar && matches!(c, '\'' | '"') {
            self.dollar_quote = true;
        }
        match c {
            ';' | '&' | '|' | '(' | ')' | '<' | '>' => {
                self.end_word();
                // `>&` and `<&` continue a redirection; `&&`, `||`, `;;`, `>>`, `<<` continue an
                // operator; `((` starts an arithmetic command (refused by the parser).
                let continues = matches!(
                    (self.operator.as_str(), c),
                    ("", _)
                        | ("&", '&' | '>')
                        | ("|", '|' | '&')
                        | (";", ';')
                        | ("(", '(')
                        | (")", ')')
                        | (">", '>' | '&' | '|')
                        | ("<", '<' | '&' | '>')
                        | ("<<", '<' | '-')
                        | ("&>", '>')
                );
                if !continues {
                    self.end_operator();
                }
                self.operator.push(c);
            }
            '-' if self.operator == "<<" => self.operator.push('-'),
            '\n' => {
                self.end_word();
                self.end_operator();
                self.newline();
            }
            c if c.is_whitespace() => {
                self.end_word();
                self.end_operator();
            }
            c => {
                self.end_operator();
                if c == '#' && self.word.is_none() {
                    self.comment = true;
                    return;
                }
                match c {
                    '\'' => {
                        self.state = State::Single;
                        self.word().quoted = true;
                    }
                    '"' => {
                        self.state = State::Double;
                        self.word().quoted = true;
                    }
                    '`' => {
                        self.state = State::Backquote;
                        self.word().expands = true;
                    }
                    '\\' => self.escaped = true,
                    '$' => {
                        self.dollar = true;
                        self.word().expands = true;
                    }
                    c => self.word().text.push(c),
                }
            }
        }
    }

    fn newline(&mut self) {
        self.out.push(Token::Operator("\n".into()));
        if self.heredoc_pending && self.heredoc_delimiter.is_some() {
            self.in_heredoc = true;
        }
    }

    fn placeholder(&mut self, name: &str) -> Result<(), String> {
        let quoting = if self.in_heredoc {
            Quoting::HereDoc
        } else if self.comment {
            Quoting::Comment
        } else if self.escaped {
            Quoting::AfterBackslash
        } else if self.dollar {
            Quoting::AfterDollar
        } else if self.depth > 0 {
            Quoting::Substitution
        } else {
            match self.state {
                State::Single => Quoting::Single,
                State::Double => Quoting::Double,
                State::Backquote => Quoting::Backquote,
                State::Normal => Quoting::Plain,
            }
        };
        let problem = match quoting {
            Quoting::Plain => None,
            Quoting::Single => Some("stands inside single quotes"),
            Quoting::Double => Some("stands inside double quotes"),
            Quoting::Backquote => Some("stands inside backquotes"),
            Quoting::Substitution => Some("stands inside a command substitution or an expansion"),
            Quoting::Comment => Some("stands in a comment"),
            Quoting::HereDoc => Some("stands in a here-document, where quotes are text"),
            Quoting::AfterBackslash => Some("follows a backslash, which would escape its quote"),
            Quoting::AfterDollar => Some("follows `$`, which would change its quoting"),
        };
        if let Some(problem) = problem {
            return Err(format!(
                "ssh.command placeholder {{{name}}} {problem}: write it as a bare word (Postern quotes the value as \
                 one shell word)"
            ));
        }
        self.end_operator();
        let word = self.word();
        if word.before_placeholder.is_none() {
            word.before_placeholder = Some(word.text.clone());
        }
        word.placeholders.push(name.to_owned());
        Ok(())
    }
}

/// One simple command as the parser saw it.
#[derive(Debug, Default)]
struct Simple {
    /// The command word (None until one is seen).
    name: Option<Word>,
    args: Vec<Word>,
}

/// The program a command word names, as compared with the lists: its last path component, lower
/// case, without a version suffix (`python3.11` → `python`, `/usr/bin/perl5.36` → `perl`).
fn program(word: &str) -> String {
    let base = word.rsplit('/').next().unwrap_or(word).to_ascii_lowercase();
    let trimmed = base.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '-');
    if trimmed.is_empty() { base } else { trimmed.to_owned() }
}

/// Is this a flag after which many programs take code: one of [`CODE_FLAGS`], or a bundle of
/// short flags that ends in `c` or `e` (`-Atc`, `-Ne`: the value goes to the last one)? A
/// bundle is told from a one-dash long option (`find -name`, `-type`) by being at most three
/// letters or holding a capital.
fn code_flag(flag: &str) -> bool {
    CODE_FLAGS.contains(&flag)
        || flag.strip_prefix('-').is_some_and(|letters| {
            letters.len() > 1
                && letters.chars().all(|c| c.is_ascii_alphabetic())
                && (letters.len() <= 3 || letters.chars().any(|c| c.is_ascii_uppercase()))
                && letters.ends_with(['c', 'e'])
        })
}

/// The check itself (see the module's documentation): the names of the placeholders that stand
/// where a value starting with `-` would be read as an option, or why the template is refused.
pub(super) fn check(segments: &[Segment]) -> Result<std::collections::BTreeSet<String>, String> {
    let first_placeholder = segments.iter().find_map(|s| match s {
        Segment::Placeholder(name) => Some(name.clone()),
        Segment::Literal(_) => None,
    });
    let (tokens, dollar_quote) = tokens(segments)?;
    let mut exposed = std::collections::BTreeSet::new();
    let Some(first) = first_placeholder else { return Ok(exposed) };
    let refuse = |name: &str, why: String| Err(format!("ssh.command placeholder {{{name}}} {why}"));
    if dollar_quote {
        return refuse(
            &first,
            "is in a template that uses `$'…'` or `$\"…\"` quoting, which the shells `/bin/sh` may be read \
             differently: write plain quotes"
                .into(),
        );
    }
    let mut commands: Vec<Simple> = Vec::new();
    let mut current = Simple::default();
    let mut at_command = true;
    let mut redirect: Option<String> = None;
    let mut previous_arg: Option<String> = None;
    // `--` was seen in this simple command: what follows is never an option.
    let mut options_ended = false;
    for token in tokens {
        match token {
            Token::Operator(op) => {
                if redirect.is_some() {
                    return Err(format!("ssh.command has a redirection without its file (before `{op}`)"));
                }
                if op == "((" || (op == "(" && current.name.is_some() && current.args.is_empty()) {
                    return refuse(
                        &first,
                        "is in a template with an arithmetic command or a function definition: \
                                          only plain arguments of simple commands may hold arguments"
                            .into(),
                    );
                }
                commands.push(std::mem::take(&mut current));
                at_command = true;
                previous_arg = None;
                options_ended = false;
            }
            Token::Redirect(op) => redirect = Some(op),
            Token::Word(word) => {
                if let Some(op) = redirect.take() {
                    if let Some(name) = word.placeholders.first() {
                        if matches!(op.as_str(), "<<" | "<<-") {
                            return refuse(name, "is a here-document's delimiter".into());
                        }
                        if matches!(op.as_str(), "<&" | ">&") {
                            return refuse(name, format!("follows `{op}`, where it would name a descriptor"));
                        }
                    }
                    continue;
                }
                let literal = !word.quoted && !word.expands && word.placeholders.is_empty();
                if at_command {
                    let assignment = word.before_placeholder.as_deref().unwrap_or(&word.text);
                    if let Some((name, _)) = assignment.split_once('=')
                        && !name.is_empty()
                        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        && !name.starts_with(|c: char| c.is_ascii_digit())
                    {
                        if let Some(p) = word.placeholders.first() {
                            return refuse(
                                p,
                                format!(
                                    "is assigned to {name} before the command: an environment variable can \
                                                      change what the command does"
                                ),
                            );
                        }
                        continue;
                    }
                    if literal && NOT_SIMPLE.contains(&word.text.as_str()) {
                        return refuse(
                            &first,
                            format!(
                                "is in a template with `{}`: only plain arguments of simple commands may hold arguments",
                                word.text
                            ),
                        );
                    }
                    if literal && COMMAND_STARTERS.contains(&word.text.as_str()) {
                        continue;
                    }
                    if literal && COMMAND_ENDERS.contains(&word.text.as_str()) {
                        at_command = false;
                        continue;
                    }
                    if let Some(p) = word.placeholders.first() {
                        return refuse(
                            p,
                            "stands where a command goes: the argument would choose what runs; an argument \
                                          must stay data"
                                .into(),
                        );
                    }
                    at_command = false;
                    current.name = Some(word);
                    continue;
                }
                // `-c {x}`, and glued: `-c{x}`, `--eval={x}`.
                let glued =
                    word.before_placeholder.as_deref().filter(|p| !p.is_empty()).map(|p| p.trim_end_matches('='));
                let flag = match glued {
                    Some(prefix) if code_flag(prefix) => Some(prefix.to_owned()),
                    Some(_) => None,
                    None => previous_arg.clone(),
                };
                if let (Some(p), Some(flag)) = (word.placeholders.first(), &flag)
                    && code_flag(flag)
                {
                    return refuse(
                        p,
                        format!(
                            "follows `{flag}`, after which many programs take code (`sh -c`, `perl -e`, `psql -c`, \
                             `find -exec`): put another option or `--` between them if this program takes data there"
                        ),
                    );
                }
                // A whole word (nothing before the placeholder), not a flag's value, before any
                // `--`: a value starting with `-` would be an option there.
                let after_flag = previous_arg.as_deref().is_some_and(|a| a.starts_with('-') && a.len() > 1);
                if let Some(p) = word.placeholders.first()
                    && word.before_placeholder.as_deref() == Some("")
                    && !after_flag
                    && !options_ended
                {
                    exposed.insert(p.clone());
                }
                if literal && word.text == "--" {
                    options_ended = true;
                }
                previous_arg = literal.then(|| word.text.clone());
                current.args.push(word);
            }
        }
    }
    commands.push(current);
    // The whole list, pipeline or compound command: no part of it may run code the template
    // does not spell out.
    for command in &commands {
        let Some(name) = &command.name else { continue };
        let shown = if name.text.is_empty() { "(computed)".to_owned() } else { name.text.clone() };
        if name.expands {
            return refuse(&first, format!("is in a template whose command `{shown}` is computed when it runs"));
        }
        let program = program(&name.text);
        if INTERPRETERS.contains(&program.as_str()) {
            return refuse(
                &first,
                format!("is in a template that runs `{shown}`, an interpreter: an argument could become code"),
            );
        }
        if WRAPPERS.contains(&program.as_str()) {
            return refuse(
                &first,
                format!("is in a template that runs `{shown}`, which runs its arguments as a command"),
            );
        }
        if let Some(flag) =
            command.args.iter().find(|a| matches!(a.text.as_str(), "-exec" | "-execdir" | "-ok" | "-okdir"))
        {
            return refuse(&first, format!("is in a template whose `{}` runs a command", flag.text));
        }
    }
    Ok(exposed)
}
