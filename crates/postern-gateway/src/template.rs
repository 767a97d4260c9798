//! Tool templates (a URL, an SSH command) parsed once at manifest load and rendered in one pass
//! over the template, never over substituted text: an argument that contains `{other}` stays
//! that text. For SSH commands, a placeholder must stand where a single-quoted word is exactly
//! one shell word holding the argument; templates that would let an argument break out are
//! refused at load.

/// One piece of a template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    Literal(String),
    /// `{name}`: replaced by the argument `name`.
    Placeholder(String),
}

/// A parsed template: `{name}` is a placeholder (`name`: a letter or `_`, then letters, digits,
/// `_` or `-`); `{{` and `}}` are literal braces; any other brace is literal text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    segments: Vec<Segment>,
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Template {
    pub fn parse(source: &str) -> Template {
        let mut segments = Vec::new();
        let mut literal = String::new();
        let mut rest = source;
        while let Some(i) = rest.find(['{', '}']) {
            literal.push_str(&rest[..i]);
            rest = &rest[i..];
            if let Some(after) = rest.strip_prefix("{{").or_else(|| rest.strip_prefix("}}")) {
                literal.push(rest.as_bytes()[0] as char);
                rest = after;
                continue;
            }
            let name = rest.strip_prefix('{').and_then(|r| r.split_once('}')).map(|(name, _)| name);
            match name.filter(|n| is_name(n)) {
                Some(name) => {
                    if !literal.is_empty() {
                        segments.push(Segment::Literal(std::mem::take(&mut literal)));
                    }
                    segments.push(Segment::Placeholder(name.to_owned()));
                    rest = &rest[name.len() + 2..];
                }
                None => {
                    literal.push(rest.as_bytes()[0] as char);
                    rest = &rest[1..];
                }
            }
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            segments.push(Segment::Literal(literal));
        }
        Template { segments }
    }

    /// A template without placeholders (a URL an agent gave, used as it is).
    pub fn literal(text: &str) -> Template {
        Template { segments: vec![Segment::Literal(text.to_owned())] }
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The placeholders' names, in order (a name may repeat).
    pub fn placeholders(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Placeholder(name) => Some(name.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// The text with each placeholder replaced by `value(name)`, in one pass over the template.
    pub fn render<E>(&self, mut value: impl FnMut(&str) -> Result<String, E>) -> Result<String, E> {
        let mut out = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => out.push_str(text),
                Segment::Placeholder(name) => out.push_str(&value(name)?),
            }
        }
        Ok(out)
    }

    /// For an SSH command (each argument becomes one single-quoted word): refuses a placeholder
    /// that stands inside quotes, backquotes or a here-document, right after `\` or `$`, or as
    /// the code of `eval` / `-c` — where a quoted argument would not be one inert word.
    pub fn check_shell_positions(&self) -> Result<(), String> {
        let mut lexer = ShellLexer::default();
        let mut previous_words: Vec<String> = Vec::new();
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => {
                    for c in text.chars() {
                        lexer.push(c);
                    }
                    previous_words = text.split_whitespace().map(str::to_owned).collect();
                }
                Segment::Placeholder(name) => {
                    let problem = match lexer.state {
                        Quote::Single => Some("stands inside single quotes"),
                        Quote::Double => Some("stands inside double quotes"),
                        Quote::Backtick => Some("stands inside backquotes"),
                        Quote::None if lexer.heredoc => Some("stands in a here-document, where quotes are text"),
                        Quote::None if lexer.escaped => Some("follows a backslash, which would escape its quote"),
                        Quote::None if lexer.last == Some('$') => Some("follows `$`, which would change its quoting"),
                        Quote::None => None,
                    };
                    if let Some(problem) = problem {
                        return Err(format!(
                            "ssh.command placeholder {{{name}}} {problem}: write it as a bare word \
                             (Postern quotes the value as one shell word)"
                        ));
                    }
                    let glued_to_word = lexer.last.is_some_and(|c| !c.is_whitespace());
                    let runs_it = !glued_to_word && runs_next_word(&previous_words);
                    if lexer.command_start || runs_it {
                        return Err(format!(
                            "ssh.command placeholder {{{name}}} stands where a command goes{}: the argument would \
                             choose what runs; an argument must stay data",
                            if runs_it {
                                format!(" (after `{}`)", previous_words.last().map_or("", String::as_str))
                            } else {
                                String::new()
                            }
                        ));
                    }
                    // The value is one quoted word: to the lexer, an ordinary word character.
                    lexer.push('x');
                    previous_words.clear();
                }
            }
        }
        Ok(())
    }
}

/// Words after which the next word is run as a command or as code.
const RUNNERS: &[&str] = &[
    "eval", "exec", "xargs", "sudo", "doas", "env", "nohup", "nice", "time", "command", "builtin", "then", "do",
    "else", "!", "source", ".",
];

/// Interpreters whose `-c` / `-e` takes code.
const INTERPRETERS: &[&str] =
    &["sh", "bash", "dash", "zsh", "ksh", "fish", "python", "python3", "perl", "ruby", "node", "php", "awk"];

/// Is the word after `words` (the blank-separated words just before it) run as code?
fn runs_next_word(words: &[String]) -> bool {
    let base = |w: &str| w.rsplit('/').next().unwrap_or(w).to_owned();
    match words {
        [.., last] if RUNNERS.contains(&last.as_str()) => true,
        [.., interpreter, flag] if matches!(flag.as_str(), "-c" | "-e") => {
            INTERPRETERS.contains(&base(interpreter).as_str())
        }
        _ => false,
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Quote {
    #[default]
    None,
    Single,
    Double,
    Backtick,
}

/// Just enough of POSIX `sh` lexing to know whether a position is quoted, or where a command
/// name goes.
#[derive(Debug)]
struct ShellLexer {
    state: Quote,
    escaped: bool,
    /// Only blanks since the start or since `;`, `&`, `|`, `(` or a newline.
    command_start: bool,
    /// A `<<` was seen: what follows (on later lines) is a here-document body.
    heredoc: bool,
    /// Unquoted `<` in a row just before.
    less_than: u8,
    last: Option<char>,
}

impl Default for ShellLexer {
    fn default() -> Self {
        ShellLexer { state: Quote::None, escaped: false, command_start: true, heredoc: false, less_than: 0, last: None }
    }
}

impl ShellLexer {
    fn push(&mut self, c: char) {
        self.last = Some(c);
        if self.escaped {
            self.escaped = false;
            return;
        }
        if self.state == Quote::None {
            // `<<` starts a here-document (`<<<`, a here-string, takes one word).
            if c == '<' {
                self.less_than = self.less_than.saturating_add(1);
            } else {
                self.heredoc |= self.less_than == 2;
                self.less_than = 0;
            }
            match c {
                ';' | '&' | '|' | '(' | '\n' => self.command_start = true,
                c if c.is_whitespace() => {}
                _ => self.command_start = false,
            }
        }
        match (self.state, c) {
            (Quote::None | Quote::Double | Quote::Backtick, '\\') => self.escaped = true,
            (Quote::None, '\'') => self.state = Quote::Single,
            (Quote::None, '"') => self.state = Quote::Double,
            (Quote::None, '`') => self.state = Quote::Backtick,
            (Quote::Single, '\'') | (Quote::Double, '"') | (Quote::Backtick, '`') => self.state = Quote::None,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn placeholders_braces_and_escapes() {
        let t = Template::parse("a {x} {{y}} {not a name} {} }{ {z-1}");
        assert_eq!(t.placeholders().collect::<Vec<_>>(), ["x", "z-1"]);
        let out: Result<String, ()> = t.render(|n| Ok(format!("<{n}>")));
        assert_eq!(out.unwrap(), "a <x> {y} {not a name} {} }{ <z-1>");
    }

    #[test]
    fn a_value_is_never_expanded_again() {
        let t = Template::parse("{a} {b}");
        let out: Result<String, ()> = t.render(|n| Ok(if n == "a" { "{b}".into() } else { "B".into() }));
        assert_eq!(out.unwrap(), "{b} B");
    }

    #[test]
    fn unsafe_shell_positions_are_refused() {
        for bad in [
            "echo \"{m}\"",
            "echo '{m}'",
            "echo `{m}`",
            "echo \\{m}",
            "echo ${m}",
            "echo $({m})x \"$(echo {m})\"",
            "cat <<EOF\n{m}\nEOF",
            "eval {m}",
            "sh -c {m}",
            "{m} --help",
            "cd /srv && {m}",
            "echo a; {m}",
            "sudo {m} x",
            "ls | xargs {m}",
            "/bin/bash -c {m}",
            "python3 -c {m}",
        ] {
            assert!(Template::parse(bad).check_shell_positions().is_err(), "{bad:?}");
        }
        for good in [
            "echo {m}",
            "printf '%s\\n' {m} >> {file}",
            "git commit -m {m} --author={who}",
            "echo \"quoted\" {m} 'and' {n}",
            "grep -e {pattern} <<< {text}",
            "awk '{{print $1}}' {file}",
            "grep -c {pattern} {file}",
        ] {
            assert!(Template::parse(good).check_shell_positions().is_ok(), "{good:?}");
        }
    }

    /// `sh -c` of a rendered command receives each argument as exactly one word, whatever it
    /// holds (a shell word cannot hold NUL: such arguments are refused before rendering).
    fn words_seen_by_sh(template: &str, values: &[String]) -> Vec<String> {
        let t = Template::parse(template);
        t.check_shell_positions().expect("a safe template");
        let mut next = values.iter();
        let command: Result<String, ()> =
            t.render(|_| Ok(crate::ssh::shell_quote(next.next().map_or("", String::as_str))));
        let out = std::process::Command::new("sh").arg("-c").arg(command.unwrap()).output().expect("sh runs");
        let text = String::from_utf8(out.stdout).expect("utf-8");
        text.split('\0').filter(|w| !w.is_empty()).map(str::to_owned).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn sh_receives_each_argument_as_one_word(
            a in "[^\\x00]{1,40}",
            b in "(['\"`$(){};&|<>\\\\\n !*?~#]|\\{b\\}|\\$\\(id\\)|[a-z]){1,30}",
        ) {
            let words = words_seen_by_sh("printf '%s\\0' {a} {b}", &[a.clone(), b.clone()]);
            prop_assert_eq!(words, vec![a, b]);
        }
    }
}
