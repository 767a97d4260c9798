//! The manifest's load-time checks, against good and hostile `tools.toml` files.

use super::*;
use serde_json::json;

const GOOD: &str = r#"
[[tool]]
name = "create_payment"
description = "Create a payment"
method = "post"
url = "http://127.0.0.1:8080/v1/accounts/{account}/payments"
credential = "pay-api"
timeout = "5s"
input_schema = { type = "object", required = ["account", "amount"], properties = { account = { type = "string" }, amount = { type = "integer", minimum = 1 }, currency = { type = "string" } } }
contract = { class = "idempotency_key", idempotency_header = "Idempotency-Key", attach_window = "15m", defaults = { currency = "EUR" } }

[[tool]]
name = "list_payments"
method = "GET"
url = "http://127.0.0.1:8080/v1/payments"
"#;

fn good() -> Manifest {
    Manifest::parse(GOOD, Path::new("tools.toml")).expect("valid manifest")
}

/// The manifest in the ```toml block of `doc` whose first lines, indent removed, begin
/// `[[tool]]` and `name = "{tool}"`, parsed as a user would copy it.
fn documented_manifest(doc: &str, indent: &str, tool: &str) -> Manifest {
    let opening = format!("```toml\n{indent}[[tool]]\n{indent}name = \"{tool}\"");
    let start = doc.find(&opening).expect("the example") + "```toml\n".len();
    let block = &doc[start..start + doc[start..].find("```").expect("its end")];
    let text: String = block.lines().map(|l| format!("{}\n", l.strip_prefix(indent).unwrap_or(l))).collect();
    Manifest::parse(&text, Path::new("tools.toml")).unwrap_or_else(|e| panic!("{e:?}"))
}

/// The README's quick-start tool loads as written (indented in a list item there).
#[test]
fn the_readmes_quick_start_tool_loads() {
    let m = documented_manifest(include_str!("../../../../../README.md"), "   ", "create_issue");
    let tool = m.tool("create_issue").expect("tool");
    assert_eq!(tool.contract.class, ReplayClass::Irreversible);
}

/// The guide's `status_query` example loads as written, with what each answer means.
#[test]
fn the_guides_status_query_example_loads() {
    let m = documented_manifest(include_str!("../../../../../docs/src/guide/tools.md"), "", "settle_invoice");
    let c = &m.tool("settle_invoice").expect("tool").contract;
    assert_eq!((c.class, c.key_retention_ms), (ReplayClass::StatusQuery, Some(24 * 3_600_000)));
    let q = c.status_query.as_ref().expect("status query");
    use postern_core::StatusMeaning::*;
    let state = |s: &str| json!({ "state": s });
    assert_eq!(q.meaning(200, Some(&state("succeeded"))), Done);
    assert_eq!(q.meaning(200, Some(&state("pending"))), InFlight);
    assert_eq!(q.meaning(404, None), NeverReceived);
    assert_eq!(q.meaning(200, Some(&state("failed"))), Inconclusive);
}

#[test]
fn a_get_declared_to_have_effects_needs_a_contract() {
    let text = "\n[[tool]]\nname = \"export\"\nmethod = \"GET\"\nurl = \"https://api.example/export\"\n\
                    reads_have_effects = true\n";
    let errors = Manifest::parse(text, Path::new("t.toml")).unwrap_err();
    assert_eq!(errors[0].line, 2, "{errors:?}");
    assert!(errors[0].message.contains("reads have effects"), "{errors:?}");
    let m = Manifest::parse(
        &format!("{text}contract = {{ class = \"idempotency_key\", idempotency_header = \"Idempotency-Key\" }}\n"),
        Path::new("t.toml"),
    )
    .expect("a declared contract");
    let tool = m.tool("export").expect("tool");
    assert_eq!((tool.contract.class, tool.read_only_by_verb), (ReplayClass::IdempotencyKey, false));
    let m = Manifest::parse(&text.replace("reads_have_effects = true", ""), Path::new("t.toml")).expect("plain");
    assert!(m.tool("export").expect("tool").read_only_by_verb);
}

#[test]
fn a_good_manifest_loads_with_contracts() {
    let m = good();
    let pay = m.tool("create_payment").expect("tool");
    assert_eq!(pay.method, "POST");
    assert_eq!(pay.timeout, Duration::from_secs(5));
    assert_eq!(pay.contract.class, ReplayClass::IdempotencyKey);
    assert_eq!(pay.contract.attach_window, AttachWindow::Millis(15 * 60 * 1000));
    // A GET without a contract is read-only.
    assert_eq!(m.tool("list_payments").expect("tool").contract.class, ReplayClass::ReadOnly);
}

#[test]
fn arguments_get_defaults_and_errors_name_the_field() {
    let pay = good();
    let pay = pay.tool("create_payment").expect("tool");
    let args = pay.validate_arguments(&json!({"account": "a/b c", "amount": 5, "_meta": {"p": 1}})).expect("valid");
    assert_eq!(args, json!({"account": "a/b c", "amount": 5, "currency": "EUR"}));
    let err = pay.validate_arguments(&json!({"account": "a", "amount": 0})).unwrap_err();
    assert_eq!(err.field, "/amount");
    assert_eq!(err.code(), "invalid_arguments");
    let err = pay.validate_arguments(&json!({"amount": 3})).unwrap_err();
    assert_eq!(err.field, "/");
    assert!(err.message.contains("account"), "{}", err.message);
    assert!(pay.validate_arguments(&json!([1])).is_err());
    let req = pay.render(&args).expect("render");
    assert_eq!(req.url, "http://127.0.0.1:8080/v1/accounts/a%2Fb%20c/payments");
    assert_eq!(req.body.as_deref(), Some(br#"{"account":"a/b c","amount":5,"currency":"EUR"}"#.as_slice()));
    assert!(req.headers.contains(&("content-type".into(), "application/json".into())));
}

#[test]
fn every_problem_is_reported_with_file_line_and_tool() {
    let text = r#"
[[tool]]
name = "deploy"
method = "POST"
url = "https://deploy.example/v1/releases"

[[tool]]
name = "rotate"
method = "POST"
url = "https://vault.example/rotate"
contract = { class = "idempotency_key" }

[[tool]]
name = "sneaky"
method = "GET"
url = "https://api.example/x"
headers = { Authorization = "Bearer abc" }

[[tool]]
name = "templated"
method = "GET"
url = "https://api.example/items/{id}"
input_schema = { type = "object", properties = { other = { type = "string" } } }
"#;
    let errors = Manifest::parse(text, Path::new("/etc/postern/tools.toml")).unwrap_err();
    let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), 4, "{shown:#?}");
    assert!(shown[0].starts_with("/etc/postern/tools.toml:2: tool \"deploy\": "), "{}", shown[0]);
    assert!(shown[0].contains("can change state (HTTP POST) but declares no replay contract"), "{}", shown[0]);
    assert!(shown[1].starts_with("/etc/postern/tools.toml:7: tool \"rotate\": replay contract: class idempotency_key needs `idempotency_header`"), "{}", shown[1]);
    assert!(
        shown[2].starts_with("/etc/postern/tools.toml:13: tool \"sneaky\": header \"Authorization\" cannot be set"),
        "{}",
        shown[2]
    );
    assert!(shown[3].contains(":19: tool \"templated\": url placeholder {id} is not a property"), "{}", shown[3]);
}

#[test]
fn syntax_errors_and_unknown_keys_point_at_their_line() {
    let errors = Manifest::parse(
        "[[tool]]\nname = \"x\"\nmethod = \"GET\"\nurl = \"http://a/\"\nretries = 3\n",
        Path::new("t.toml"),
    )
    .unwrap_err();
    assert_eq!(errors[0].line, 5, "{}", errors[0]);
    assert!(errors[0].message.contains("retries"), "{}", errors[0]);
    let errors = Manifest::parse("[[tool]\nname = ", Path::new("t.toml")).unwrap_err();
    assert_eq!(errors[0].line, 1, "{}", errors[0]);
    let errors = Manifest::parse("[[tool]]\nname = \"x\"\nmethod = \"GET\"\nurl = \"ftp://a/\"\n", Path::new("t.toml"))
        .unwrap_err();
    assert!(errors[0].message.contains("must be http or https"), "{}", errors[0]);
}

#[test]
fn an_ssh_placeholder_where_quoting_is_unsafe_is_refused_with_its_line() {
    let tool = |command: &str| {
        format!(
            "\n[[tool]]\nname = \"t\"\nssh = {{ host = \"box\", command = {command:?} }}\n\
                 input_schema = {{ type = \"object\", properties = {{ m = {{ type = \"string\" }} }} }}\n\
                 contract = {{ class = \"ssh_marker\" }}\n"
        )
    };
    for bad in ["echo '{m}'", "echo \"{m}\"", "eval {m}", "{m}"] {
        let errors = Manifest::parse(&tool(bad), Path::new("ssh.toml")).unwrap_err();
        let shown = errors[0].to_string();
        assert!(shown.starts_with("ssh.toml:2: tool \"t\": ssh.command placeholder {m}"), "{bad}: {shown}");
    }
    let m = Manifest::parse(&tool("echo {m} {{m}}"), Path::new("ssh.toml")).expect("a bare placeholder");
    let command = m.tool("t").expect("tool").render_ssh(&json!({ "m": "it's {m}" })).expect("render");
    assert_eq!(command, r"echo 'it'\''s {m}' {m}");
    let err = m.tool("t").expect("tool").render_ssh(&json!({ "m": "a\0b" })).unwrap_err();
    assert_eq!((err.field.as_str(), err.code()), ("/m", "invalid_arguments"));
    // Where the program would read a leading `-` as an option, such a value is refused;
    // after `--`, or as a flag's value, it is data.
    let err = m.tool("t").expect("tool").render_ssh(&json!({ "m": "--to-command=sh" })).unwrap_err();
    assert!(err.message.contains("read it as an option"), "{err:?}");
    for safe in ["echo -- {m}", "git commit -m {m}"] {
        let m = Manifest::parse(&tool(safe), Path::new("ssh.toml")).expect("loads");
        let command = m.tool("t").expect("tool").render_ssh(&json!({ "m": "-n" })).expect("data");
        assert!(command.ends_with(" '-n'"), "{command}");
    }
}

#[test]
fn url_placeholders_fill_one_segment_and_never_climb_the_path() {
    let m = good();
    let pay = m.tool("create_payment").expect("tool");
    let url = |account: &str| pay.render(&json!({ "account": account, "amount": 1 })).map(|r| r.url);
    assert_eq!(url("a/b?c#{amount}").unwrap(), "http://127.0.0.1:8080/v1/accounts/a%2Fb%3Fc%23%7Bamount%7D/payments");
    assert_eq!(url("%2F..").unwrap(), "http://127.0.0.1:8080/v1/accounts/%252F../payments");
    for climbing in [".", ".."] {
        let err = url(climbing).unwrap_err();
        assert_eq!(err.field, "/account", "{climbing}");
    }
}
