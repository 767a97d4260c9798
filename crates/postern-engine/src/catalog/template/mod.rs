//! Tool templates (a URL, an SSH command) parsed once at manifest load and rendered in one pass
//! over the template, never over substituted text: an argument that contains `{other}` stays
//! that text. For SSH commands, a placeholder must stand where a single-quoted word is one inert
//! word of data: `shell` parses the command as `sh` would and refuses every other place at
//! load.

mod shell;
pub use shell::shell_quote;

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
    /// anywhere but as a plain argument of a simple command that runs no interpreter or wrapper
    /// (see `shell`), with why. Otherwise names the placeholders whose value may not start
    /// with `-` (the program would read it as an option).
    pub fn check_shell_positions(&self) -> Result<std::collections::BTreeSet<String>, String> {
        shell::check(&self.segments)
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
            "echo $(( {m} + 1 ))",
            "cat <<EOF\n{m}\nEOF",
            "cat <<{m}\nx\n",
            "eval {m}",
            "sh -c {m}",
            "{m} --help",
            "cd /srv && {m}",
            "echo a; {m}",
            "sudo {m} x",
            "ls | xargs {m}",
            "/bin/bash -c {m}",
            "python3 -c {m}",
            // Found in review: each turns an argument into code on the host.
            "bash -lc {x}",
            "bash --login -c {x}",
            "sh -e -c {x}",
            "sudo -u deploy {x}",
            "env LANG=C {x}",
            "timeout 30 {x}",
            "nice -n 10 {x}",
            "if {x}; then echo y; fi",
            "while {x}; do sleep 1; done",
            "xargs -0 {x}",
            "su deploy -c {x}",
            "perl -E {x}",
            "python3 -Ic {x}",
            "find . -exec {x} +",
            // And the rest of the family.
            "printf %s {x} | sh",
            "echo {x} && bash -c 'ls'",
            "PAGER={x} git log",
            "$CMD {x}",
            "psql -c {x}",
            "psql -c{x}",
            "node --eval={x}",
            "find . -name {x} -exec rm {{}} +",
            "for f in {x}; do rm \"$f\"; done",
            "case {x} in a) echo a;; esac",
            "f() {{ echo {x}; }}",
            "echo {x} # {y}",
            "echo {x} >&{fd}",
            "echo 'unclosed {x}",
            "/usr/bin/python3.11 script.py {x}",
            "awk -f prog.awk {x}",
            "ssh other-host cat {x}",
            // Found in the second review.
            "psql -Atc {q}",
            "mysql -Ne {q}",
            "sqlite3 app.db {q}",
            "redis-cli {x}",
            "cat >/tmp/m <<EOF\nhi\n\tEOF\nlogger {msg}",
            "echo $'\\' {x} \\''",
            "echo $\"a\" {x}",
            "printf $'%s\\n' {x}",
        ] {
            assert!(Template::parse(bad).check_shell_positions().is_err(), "{bad:?}");
        }
        for good in [
            "echo {m}",
            "printf %s {x} >> f",
            "printf '%s\\n' {m} >> {file}",
            "cat <<-EOF\n\thi\n\tEOF\nlogger {msg}",
            "cat <<EOF\nhi\nEOF\nlogger {msg}",
            "sort < {file}",
            "git commit -m {m} --author={who}",
            "echo \"quoted\" {m} 'and' {n}",
            "grep -F -- {pattern} <<< {text}",
            "cut -d ' ' -f 1 {file}",
            "grep -c -- {pattern} {file}",
            "cd /srv && ls -la {dir} | sort | head -n 20",
            "test -n {m} && echo yes || echo no",
            "{{ echo {m}; echo done; }} > out.log 2>&1",
            "tar -czf {archive} -C /srv data",
            "find /srv -name {pattern} -type f",
        ] {
            assert!(
                Template::parse(good).check_shell_positions().is_ok(),
                "{good:?}: {:?}",
                Template::parse(good).check_shell_positions()
            );
        }
        let why = Template::parse("timeout 30 {x}").check_shell_positions().unwrap_err();
        assert!(why.contains("`timeout`") && why.contains("runs its arguments as a command"), "{why}");
    }

    #[test]
    fn placeholders_where_a_dash_would_be_an_option_are_named() {
        let exposed =
            |t: &str| -> Vec<String> { Template::parse(t).check_shell_positions().unwrap().into_iter().collect() };
        assert_eq!(exposed("tar -xf a.tar {m}"), ["m"]);
        assert_eq!(exposed("echo {m} | grep -c -- {p} {file}"), ["m"]);
        assert_eq!(exposed("git commit -m {m} --author={who}"), Vec::<String>::new());
        assert_eq!(exposed("find /srv -name {pattern} -type f"), Vec::<String>::new());
        assert_eq!(exposed("cp {src} /tmp; cp -- {a} {b}"), ["src"]);
    }

    /// `sh -c` of a rendered command receives each argument as exactly one word, whatever it
    /// holds (a shell word cannot hold NUL: such arguments are refused before rendering).
    fn words_seen_by_sh(template: &str, values: &[String]) -> Vec<String> {
        let t = Template::parse(template);
        t.check_shell_positions().expect("a safe template");
        let mut next = values.iter();
        let command: Result<String, ()> = t.render(|_| Ok(shell_quote(next.next().map_or("", String::as_str))));
        let out = std::process::Command::new("sh").arg("-c").arg(command.unwrap()).output().expect("sh runs");
        let text = String::from_utf8(out.stdout).expect("utf-8");
        text.split('\0').filter(|w| !w.is_empty()).map(str::to_owned).collect()
    }

    /// A command that runs code: an interpreter or a wrapper, by name or by path, with options.
    fn runner() -> impl Strategy<Value = String> {
        let names = prop_oneof![proptest::sample::select(vec![
            "sh",
            "bash",
            "dash",
            "zsh",
            "python3",
            "python3.12",
            "perl",
            "ruby",
            "node",
            "php",
            "awk",
            "sed",
            "sudo",
            "doas",
            "su",
            "env",
            "timeout",
            "nice",
            "nohup",
            "xargs",
            "exec",
            "eval",
            "command",
            "setsid",
            "stdbuf",
            "chroot",
            "flock",
            "watch",
            "ssh",
            "docker",
            "kubectl",
            "strace",
            "script",
        ]),];
        (
            names,
            proptest::option::of("/(usr/)?(local/)?bin/"),
            proptest::collection::vec("-{1,2}[a-z]{1,6}( [0-9a-z]{1,4})?", 0..3),
        )
            .prop_map(|(name, dir, options)| format!("{}{name} {}", dir.unwrap_or_default(), options.join(" ")))
    }

    /// Where a runner can stand: alone, after a list operator, in a pipeline, inside a compound
    /// command, after another wrapper.
    fn hostile_template() -> impl Strategy<Value = String> {
        (runner(), runner(), 0u8..6).prop_map(|(a, b, shape)| match shape {
            0 => format!("{a} {{x}}"),
            1 => format!("cd /srv && {a} {{x}}"),
            2 => format!("printf %s {{x}} | {a}"),
            3 => format!("if true; then {a} {{x}}; fi"),
            4 => format!("{b} {a} {{x}}"),
            _ => format!("echo {{x}}; {a} -c 'true'"),
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// However interpreters and wrappers are spelled, nested, piped into or chained, a
        /// template that runs one with an argument in it is refused.
        #[test]
        fn a_template_that_runs_an_interpreter_or_a_wrapper_is_refused(template in hostile_template()) {
            prop_assert!(Template::parse(&template).check_shell_positions().is_err(), "{template:?}");
        }

        /// The checker never panics on any template, and refuses every one whose placeholder a
        /// quote, an expansion or a here-document would swallow.
        #[test]
        fn any_template_is_checked_without_panicking(template in any::<String>(), quote in "[\"'`]|\\$\\(|<<E\n") {
            let _ = Template::parse(&template).check_shell_positions();
            let swallowed = format!("echo {quote}{{x}}");
            prop_assert!(Template::parse(&swallowed).check_shell_positions().is_err(), "{swallowed:?}");
        }

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
